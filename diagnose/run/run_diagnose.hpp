// `diagnose DIR` (or --run DIR): a training run read from what its trainer wrote, nothing measured.
// DIR is an output directory or a checkpoint-N/ inside one (or the trainer_state.json itself):
// trainer_state.json's curves go through the numerics detectors (curves.hpp) and its final summary
// gives the logged throughput. The result has the shape of diagnose --config's and --trace's (one
// point per check, findings), so the same report, HTML and JSON serve all three.
//
// Found and read: trainer_state.json (the directory's own, else its newest checkpoint-N/'s). Not yet
// read (said in the report): training_args.bin, adapter_config.json, the model's config.json and
// the Axolotl config beside it, TensorBoard event files, profiler traces in the directory.
#pragma once

#include <string>  // std::string

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/result.hpp"  // Result

namespace sb::diagnose {

// True when `path` is a directory holding trainer_state.json (itself or in a checkpoint-N/), or a
// trainer_state.json file: what `diagnose PATH` then reads as a run.
bool looks_like_run(const std::string& path);

// Reads and diagnoses the run at `path`. UsageError (exit 2) when it holds no trainer_state.json or
// the file is not one.
Result diagnose_run(const std::string& path, const nlohmann::ordered_json& meta);

}  // namespace sb::diagnose
