// The numerics of a real run, read from the curves its trainer logged (readers/trainer_state): the
// detectors the numerics scenario reproduces (NaN and Inf, divergence, exploding and vanishing
// gradients, a plateau at a low learning rate, training past its best and early stopping), run on
// the user's own loss, grad_norm and learning_rate. Two steps, kept apart as HTA does: read the
// curve's figures (CurveFigures), then decide from them (analyze_curves). Each finding names the
// real step and the numbers, says whether it was measured (read from the log) or assumed, and gives
// the `stallbench run numerics` that reproduces it.
//
// Definitions (what the figures mean):
//   - a bad step: a training log whose loss or grad_norm is NaN or infinite. The Trainer's
//     logging_nan_inf_filter (on by default) keeps non-finite losses out of the logged average, so a
//     run that is NaN from its first step can log "loss": 0.0 beside a NaN grad_norm; grad_norm is the
//     evidence there.
//   - divergence: the first of two consecutive logs whose loss is over 3x the lowest loss logged
//     before them (one noisy log is not divergence; a loss at or under 0 is no baseline), unless the
//     run recovered: under 5 logs over 3x and the loss back under 1.5x its lowest at the end.
//   - exploding gradients: a finite grad_norm over 1e3 (clipping at 1.0 is the Trainer's default;
//     healthy fine-tunes log norms of 0.1 to 20).
//   - vanishing gradients: every logged grad_norm under 1e-6 (or, without grad_norm, every loss 0).
//   - plateau: over the second half of the run the loss (median of the first and of the last
//     quarter of that half) moved less than 2% while above 0.05; the learning rate beside it says
//     whether a low rate is a likely cause (peak under 2e-5: assumed, not measured).
//   - past the best: the best evaluation (best_global_step / best_model_checkpoint) is at least 3
//     evaluations before the last step; with EarlyStoppingCallback's counter at its patience, the
//     callback stopped the run.
#pragma once

#include <cstdint>   // std::int64_t
#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>   // std::vector

#include "readers/trainer_state.hpp"  // TrainerState
#include "readers/training_args.hpp"  // TrainingArgs

namespace sb::diagnose {

struct CurveFinding {
  std::string kind;       // "nan", "divergence", "exploding", "vanishing", "plateau", "past_best", "early_stopping"
  std::string cause;      // the cause as the numerics scenario names it
  std::int64_t step = -1;  // the real step it starts at
  std::string summary;    // one short line: what, where, the numbers
  std::vector<std::string> evidence;  // the figures under it
  std::string change;     // the line to change
  std::string reproduce;  // stallbench run numerics ...
  std::string basis;      // "measured" (read from the log) or "assumed" (a judgement beside the figures)
};

// The run's logged throughput (the final summary: samples/s, steps/s, runtime), with its caveats.
struct LoggedThroughput {
  bool present = false;
  double samples_per_s = 0, steps_per_s = 0, runtime_s = 0;
  std::vector<std::string> caveats;  // "resumed: ...", "a checkpoint's file has no summary"
};

// What the run's directory says beside the log, which sharpens a reading: adapter_config.json (PEFT
// adapters are trained, not the whole model: a plateau's learning rate), training_args.bin (the
// configured learning rate, scheduler and warm-up a plateau sits in; fp16 or bf16 for skipped steps;
// logging_nan_inf_filter for a NaN that the logged loss hides).
struct CurveContext {
  bool adapters = false;
  std::string adapter_text;  // "LORA r=16 on q_proj, v_proj", for the evidence
  const TrainingArgs* args = nullptr;  // the run's training_args.bin, where read
};

// The learning rate transformers' scheduler `args.lr_scheduler_type` gives at `step` of `total` steps
// (linear, cosine, constant, constant_with_warmup; warm-up from warmup_steps, else warmup_ratio; a
// warmup_steps under 1 is a ratio, as transformers 5 reads it); nullopt for another scheduler or
// without a learning rate or a length.
std::optional<double> scheduled_lr(const TrainingArgs& args, std::int64_t total, std::int64_t step);
std::int64_t warmup_of(const TrainingArgs& args, std::int64_t total);

std::vector<CurveFinding> analyze_curves(const TrainerState& s, const CurveContext& ctx = {});
LoggedThroughput logged_throughput(const TrainerState& s);

}  // namespace sb::diagnose
