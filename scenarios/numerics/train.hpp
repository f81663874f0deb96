// One real training run of the numerics MLP with its detectors: the loop
// (data, step, checks, loss scaling, clipping, optimizer) and what each
// detector saw, step by step.
//
// Detectors, all computed from one read of the step's stats per step:
// - per-step finite check: any NaN/inf in this step's gradients (dW, db);
// - locator: where a non-finite value first appeared — the lowest layer whose
//   output is non-finite (forward order), else the highest layer whose
//   gradient is (backward order);
// - loss-only end-of-epoch check (the common callback): fires at the last
//   step of the epoch in which the loss went non-finite;
// - divergence: loss non-finite, or above 10x the first step's loss;
// - plateau: the mean loss of the last `window` steps improved on the
//   window before by less than `plateau_tol` (relative), above the target;
// - early stopping: eval loss every `eval_every` steps; stop after
//   `patience` evals without an improvement of more than `min_delta`.
#pragma once

#include <cstdint>  // std::uint64_t
#include <functional>  // std::function
#include <string>   // std::string
#include <vector>   // std::vector

#include "harness/train_ops.hpp"         // TrainOps
#include "scenarios/numerics/mlp.hpp"    // MlpConfig, Injection

namespace sb::numerics {

enum class Optimizer { sgd, adamw };

struct TrainSpec {
  MlpConfig model;
  Optimizer optimizer = Optimizer::adamw;
  double lr = 1e-3, weight_decay = 0.0;
  double clip = 0;               // clip by global norm; 0 = off
  bool loss_scaling = false;     // dynamic, torch.cuda.amp.GradScaler's rules
  double init_scale = 65536.0;   // 2^16
  int growth_interval = 2000;    // clean steps before the scale doubles
  bool skip_nonfinite = false;   // skip an update whose gradients are not finite
  Injection inject;
  int max_steps = 600;
  int epoch_steps = 100;         // the loss-only check runs at the end of each epoch
  double target_loss = 0.05;     // absolute; <= 0: no target
  int plateau_window = 100;      // 0 = off
  double plateau_tol = 0.01;
  int eval_every = 0;            // 0 = no early stopping
  int patience = 10;             // evals
  double min_delta = 0.0;
  double label_noise = 0.0;      // std of noise added to regression targets
  double target_scale = 1.0;     // regression targets' std (the teacher's output is normalised to it)
  // The loss is multiplied by this before the backward: 1/N when a trainer
  // divides it by N accumulated micro-batches (HF Trainer divides by
  // gradient_accumulation_steps), or a mean over N times more tokens. The
  // gradients are N times smaller; the update (Adam) is not.
  double loss_mult = 1.0;
  int dataset_batches = 16;
  std::uint64_t seed = 1;
};

struct Location {
  int step = -1, layer = -1;
  std::string where;  // "activation" or "gradient"
};

struct TrainRecord {
  std::vector<double> loss;                      // per step
  std::vector<double> grad_norm;                 // global, unscaled, per step (NaN when not finite)
  std::vector<std::vector<double>> layer_norm;   // [layer][step]: ||dW_l|| unscaled
  std::vector<double> zero_frac, tiny_frac;      // per layer: mean fraction of dW values 0 / below 2^-14
  std::vector<double> loss_scale;                // per step, the scale it ran at (1 when not scaling)
  double next_scale = 1;                         // after the last step's update: GradScaler.get_scale()
  std::string outcome;                           // target, nan, diverged, stalled, stopped, max-steps
  int outcome_step = -1;
  int target_step = -1;
  Location first_nonfinite;
  int grad_check_step = -1;   // per-step finite check fires
  int loss_nan_step = -1;     // first step whose loss is not finite
  int epoch_check_step = -1;  // the loss-only end-of-epoch check fires
  int skipped_steps = 0;
  int diverged_step = -1;
  int plateau_step = -1;
  double est_steps_to_target = -1;  // at the plateau's rate; < 0 unknown, inf: never
  int best_step = -1, stop_step = -1;
  double best_eval = 0, stop_eval = 0;
  double initial_loss = 0, final_loss = 0, best_loss = 0;
  // timing (device time from events; medians over steps)
  double step_ms = 0, check_ms = 0, locate_ms = 0, wall_step_ms = 0;
  int steps = 0;
};

// Runs the training; `progress` is called every 50 steps with the step.
// Throws HangError (a device wait past `timeout_ms`), OutOfMemory.
TrainRecord train(TrainOps& ops, Device& dev, const TrainSpec& spec, std::int64_t timeout_ms,
                  const std::function<void(int)>& progress = [](int) {});

// The teacher task's data: inputs uniform in [-1, 1), targets from a fixed
// random 2-layer tanh network (regression: its outputs normalised to unit
// std, then times target_scale, plus label noise; classification: their
// argmax). Host fp32; `batches` batches of model.batch rows.
struct Dataset {
  std::vector<float> x, y;
  std::int64_t rows = 0;
};
// The teacher network comes from teacher_seed, the inputs (and noise) from
// data_seed: a held-out set shares the teacher and not the inputs.
Dataset make_dataset(const TrainSpec& spec, int batches, std::uint64_t teacher_seed, std::uint64_t data_seed);

}  // namespace sb::numerics
