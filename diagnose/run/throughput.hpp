// The throughput a Trainer run logged, read as the Trainer computes it, and held against the GPU.
//
// The final summary (train_samples_per_second, train_steps_per_second, train_runtime) is the
// planned run over the time the run took: transformers' speed_metrics divides max_steps' samples
// by train_runtime, so a run that stopped early (EarlyStoppingCallback, should_training_stop)
// overstates both by max_steps / global_step (the real Whisper run of ../shared/trainer-logs: 1500
// of 10990 steps, 12.3 samples/s logged, 1.68 real). Corrected here, and said.
//
// total_flos is the Trainer's own count of the model FLOPs it ran (floating_point_ops: 6 x the
// non-embedding parameters x the main input's elements per step, summed over the processes), so
// total_flos / train_runtime is the job's model FLOP rate without knowing the model or the sequence;
// over the GPU's datasheet peak for the run's dtype (--gpu, or the device) and the job's GPUs it is
// the MFU. The processes: --world-size, training_args.bin's distributed_state, else inferred from the
// logged samples per step over the per-device batch and the accumulation (a bound where the
// accumulation is unknown: MFU is then an upper bound, enough to say it is low). A count no GPU could
// reach is not model FLOPs (a model whose main input is audio features or pixels: the Trainer counts
// their elements as tokens) and is said so, not used.
#pragma once

#include <cstdint>   // std::int64_t
#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

#include "diagnose/config.hpp"        // ModelDims
#include "readers/trainer_state.hpp"  // TrainerState
#include "readers/training_args.hpp"  // TrainingArgs

namespace sb::diagnose {

// MFU under this on the GPU named is a finding: tuned training reaches 38-43% (Llama 3 405B, bf16 on
// H100: the Llama 3 paper's Table 4), PaLM 46.2% (its Table 3); a fine-tune at a quarter of the peak
// or less leaves half its throughput to a cause the logs cannot name (a trace can).
inline constexpr double kLowMfuPct = 25.0;

struct GpuPeak {
  std::string id, name;  // the expected file's hardware.id and name ("h100-sxm", "NVIDIA H100 SXM 80GB")
  std::string dtype;     // the run's dtype the peak is for ("bf16")
  std::string dtype_source;
  double tflops = 0;     // dense datasheet peak, TFLOP/s
  std::string source;    // the expected file's source for it
};

// The expected file of a GPU by a name a user gives ("h100", "H200", "a100-sxm-80gb", "NVIDIA H100 80GB
// HBM3"): its id's prefix, its name, or a string its match names. "" when none; UsageError when the
// name fits several (naming them).
std::string find_gpu_file(const std::string& name);

struct ThroughputOptions {
  std::string gpu;             // --gpu (or the device diagnose runs on, when a GPU)
  std::string gpu_from;        // where gpu came from ("--gpu", "--device sim:h100")
  std::int64_t world_size = 0;  // --world-size; 0: not given
};

struct ThroughputReading {
  bool present = false;
  double samples_per_s = 0, steps_per_s = 0, runtime_s = 0;  // corrected where the log overstates
  double logged_samples_per_s = 0, logged_steps_per_s = 0;
  bool stopped_early = false;
  std::optional<std::int64_t> global_batch;  // samples per optimizer step (the summary's)
  std::optional<std::int64_t> world;         // the job's processes, when known
  std::int64_t world_max = 0;                // else at most this many (0: no bound)
  std::string world_source;
  std::optional<double> model_tflops;  // the job's model FLOP rate (the Trainer's count), TFLOP/s
  std::string flops_note;              // why there is none, or what the count includes
  std::optional<double> tokens_per_s;  // from total_flos over 6 N (the model's dims)
  std::string tokens_source;
  std::optional<GpuPeak> gpu;
  std::optional<double> mfu_pct;  // per GPU; an upper bound when mfu_is_bound
  bool mfu_is_bound = false;
  std::optional<double> mfu_min_pct;  // with world_max GPUs
  std::vector<std::string> notes;     // corrections and inferences, said in the reading
  std::vector<std::string> caveats;
};

// `dims` the model's (the run's config.json, or the HF cache's for an adapter's base), null when not
// read; `adapters` true for a PEFT run (its frozen base computes no weight gradients: the Trainer's
// 6N overstates the work); `saved_dtype` config.json's torch_dtype ("" none).
// `axolotl` the run's Axolotl config (its model card), null when none: its accumulation and micro batch
// where training_args.bin is absent, its precision for the peak.
ThroughputReading read_throughput(const TrainerState& s, const TrainingArgs* args, const ModelDims* dims,
                                  bool adapters, const std::string& saved_dtype, const ThroughputOptions& o,
                                  const TrainConfig* axolotl = nullptr);

// HF's num_parameters(exclude_embeddings=True) as the dims give it, weights only (biases and norms
// left out, a few percent): every layer's attention and MLP (all experts), and an untied LM head.
double hf_counted_params(const ModelDims& d);

}  // namespace sb::diagnose
