// What a run's own settings say (training_args.bin, read by readers/training_args; the model's
// torch_dtype from the config.json the Trainer saved beside it): the facts the config-side checks of
// `diagnose CONFIG` would use, stated as the run had them, each with its source.
//
// Only what the settings prove becomes a finding, each labelled with how its gain is known:
//   - dtype: bf16 and fp16 both False, so no mixed precision; fp32 throughout when config.json says
//     float32 (else "unless the model was loaded in half precision", which the args do not record).
//     Its gain on a GPU with bf16 is assumed (the GPU the run used is not recorded); the precision
//     scenario measures it.
//   - loader: dataloader_num_workers 0, so every batch is loaded in the training process between
//     steps. Whether that costs anything depends on a sample's load cost, which no file records:
//     assumed, with how to measure it.
//   - recompute: gradient checkpointing on, so each step runs the forward twice: about 1.33x a step's
//     compute (modelled: the forward is a third of forward + backward), a cost only where the model
//     would fit without it.
#pragma once

#include <string>  // std::string
#include <vector>  // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "diagnose/run/curves.hpp"    // CurveFinding
#include "readers/training_args.hpp"  // TrainingArgs

namespace sb::diagnose {

// The model's dtype as the saved config.json records it ("float32", "bfloat16"; "" unknown).
struct SavedModel {
  std::string file;
  std::string torch_dtype;
};

// meta.run.training_args: the file, the class, each field read with its value and source.
nlohmann::ordered_json training_args_json(const TrainingArgs& a);

// The settings point's one line ("bf16, batch 8 x 4 accumulated on 1 process, 4 workers pinned, ...").
std::string settings_reading(const TrainingArgs& a, const SavedModel& m);

// The findings the settings prove (see the top of this file); `device` names the device in the
// reproduce commands.
std::vector<CurveFinding> settings_findings(const TrainingArgs& a, const SavedModel& m, const std::string& device);

}  // namespace sb::diagnose
