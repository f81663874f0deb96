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
//   - adapter_config.json (PEFT: what the run trains) and config.json: its torch_dtype (the dtype the
//     model was saved in) and its dims (as --model-config reads them; else the adapter's base model's
//     in the Hugging Face cache), where present;
//   - the final summary's throughput, corrected where the Trainer overstates it (an early stop), its
//     FLOP count as the job's model FLOP rate and, on the GPU named, the MFU (throughput.hpp);
//   - the profiler traces under it, as diagnose --trace reads them.
// Not read (said in meta.run.not_read): the Axolotl config.
// The result has the shape of diagnose --config's and --trace's (one point per check, findings), so
// the same report, HTML and JSON serve all three.
#pragma once

#include <cstdint>  // std::int64_t
#include <string>  // std::string

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/result.hpp"  // Result

namespace sb::diagnose {

// True when `path` is a directory holding trainer_state.json (itself or in a checkpoint-N/),
// training_args.bin or event files, or is one of those files: what `diagnose PATH` then reads as a run.
bool looks_like_run(const std::string& path);

// Reads and diagnoses the run at `path`. UsageError (exit 2) when it holds none of those files, or
// one of them is damaged (or not what its name says).
// The GPU the run's throughput is held against (--gpu; else the device of meta, when a GPU) and the
// job's processes (--world-size; 0 reads or infers them).
struct RunOptions {
  std::string gpu, gpu_from = "--gpu";
  std::int64_t world_size = 0;
};
Result diagnose_run(const std::string& path, const nlohmann::ordered_json& meta, const RunOptions& opt = {});

}  // namespace sb::diagnose
