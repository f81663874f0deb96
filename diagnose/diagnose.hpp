// diagnose: the standard troubleshooting order of a slow fine-tuning job,
// run on the user's own config (diagnose/config.hpp), each check
// measured on this device by the scenario that reproduces its cause, at the
// user's shapes:
//   1. utilization: their step (the batch scenario's decoder step at their
//      micro batch, sequence length, hidden size and dtype): steady-low,
//      spiky or healthy;
//   2. loader: their workers and pinning against the recommended (dataloader);
//   3. dtype: fp32 against bf16 (fp16 without bf16) at their MLP GEMM (precision);
//   4. padding: their lengths at their sequence_len, padded against packed (packing);
//   5. attention: eager against fused at their sequence length (attention);
//   6. batch: micro batch sweep from theirs, the knee (batch);
//   7. memory: does their config fit the device (the footprint model at full
//      depth, vocabulary included; not measured).
// Each check that finds its cause gives a finding: the evidence, the
// measured gain of the fix, the config line, and the `stallbench run ...`
// that reproduces the figure. Findings are ranked by measured gain.
//
// On a CPU a 7B-sized layer cannot run inside the budget: the measured shape
// is reduced (hidden and intermediate to at most 256 and 1024 / the ratio
// kept, sequence length to at most 256, micro batch kept) and every figure
// says so. Gains measured at a reduced shape are this device's at that
// shape, not a prediction for the user's GPU.
#pragma once

#include <cstdint>     // std::uint64_t
#include <functional>  // std::function
#include <optional>    // std::optional
#include <string>      // std::string

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/result.hpp"            // Result
#include "harness/scenario.hpp"          // RunContext
#include "diagnose/config.hpp"  // TrainConfig
#include "diagnose/footprint.hpp"  // FullDepthFootprint, full_depth_footprint
#include "workloads/batch_limit.hpp"  // BatchLimit, batch_limit

namespace sb::batch {
struct DecoderConfig;
}

namespace sb::diagnose {

struct Options {
  TrainConfig cfg;
  std::string lengths_path;  // --lengths FILE, passed to the packing check as @FILE
  bool quick = false;
  // Seconds the applied check's runs of their training loop may take in all: their timed steps per run
  // are set from it (the rest of the checks take what their scenarios take).
  double budget_s = 120;
  std::optional<double> observed_tokens_per_s;  // what the user's logs say
  // Progress lines for stderr: which check, how long so far and left.
  std::function<void(const std::string&)> say = [](const std::string&) {};
};

// The shape the checks run at on this device (reduced on a CPU).
struct MeasuredShape {
  std::int64_t micro_batch = 1, seq = 2048, hidden = 4096, intermediate = 11008, heads = 32;
  std::int64_t kv_heads = 32;  // K/V heads (grouped-query attention): the model's share of the heads kept
  // the step's MLP width (batch::DecoderConfig::d_ff): the model's (ModelDims::step_ffn) at this hidden
  std::int64_t ffn = 16512;
  bool gated = true;
  bool reduced = false;
  std::string note;
};
MeasuredShape measured_shape(const TrainConfig& cfg, const DeviceInfo& dev);

// The pad_to_multiple_of their loop pads at (the train scenario's pad_multiple): the collator's `multiple`
// where the loop reads their lengths (a file) or runs the padding check's sequence; where generated lengths
// are drawn at a reduced sequence (loop_seq of part_seq), the multiple scaled as they are, at least 16
// (each padded length is a decoder step warmed once a run) and at most `multiple`.
std::int64_t loop_pad_multiple(std::int64_t multiple, bool lengths_from_file, std::int64_t part_seq,
                               std::int64_t loop_seq);


// What limits a micro batch (the batch scenario's, workloads/batch_limit.hpp).
using batch::BatchLimit;
using batch::batch_limit;
// Runs every check; the Result's scenario is "diagnose", one point per
// check, findings ranked by measured gain (largest first).
Result run(RunContext& ctx, const Options& opt, const nlohmann::ordered_json& meta);


}  // namespace sb::diagnose
