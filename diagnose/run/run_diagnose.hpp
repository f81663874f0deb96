// `diagnose DIR` (or --run DIR): a training run read from what its trainer wrote, nothing measured.
// DIR is an output directory or a checkpoint-N/ inside one (or a trainer_state.json, training_args.bin
// or event file itself). Read:
//   - the curves: trainer_state.json (the directory's own, else its newest checkpoint-N/'s), else the
//     TensorBoard event files under the directory (events.out.tfevents.*, in it or two levels down:
//     runs/<name>/, as TensorBoardCallback writes them; a checkpoint's parent's runs/ too), through the
//     numerics detectors (curves.hpp); the final summary gives the logged throughput;
//   - training_args.bin beside them (the state's directory, DIR, or DIR's parent): the run's
//     settings with their sources in meta.run.training_args, the findings they prove
//     (run_settings.hpp), and the schedule, precision and NaN filter the curves' readings use; a file
//     that is damaged or names a global outside the allow-list is exit 2;
//   - adapter_config.json (PEFT: what the run trains) and config.json's torch_dtype (the dtype the
//     model was saved in), where present.
// Not read (said in meta.run.not_read): the rest of config.json, the Axolotl config, profiler traces.
// The result has the shape of diagnose --config's and --trace's (one point per check, findings), so
// the same report, HTML and JSON serve all three.
#pragma once

#include <string>  // std::string

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/result.hpp"  // Result

namespace sb::diagnose {

// True when `path` is a directory holding trainer_state.json (itself or in a checkpoint-N/),
// training_args.bin or event files, or is one of those files: what `diagnose PATH` then reads as a run.
bool looks_like_run(const std::string& path);

// Reads and diagnoses the run at `path`. UsageError (exit 2) when it holds none of those files, or
// one of them is damaged (or not what its name says).
Result diagnose_run(const std::string& path, const nlohmann::ordered_json& meta);

}  // namespace sb::diagnose
