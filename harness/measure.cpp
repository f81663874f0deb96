#include "harness/measure.hpp"

#include <algorithm>  // std::max, std::clamp
#include <cmath>      // std::ceil
#include <vector>     // std::vector

namespace sb {

MeasureConfig quick_measure_config() {
  MeasureConfig c;
  c.warmup = 1;
  c.min_trials = 3;
  c.max_trials = 20;
  c.max_noise = 0.05;
  c.budget_s = 0.2;
  c.min_trial_ms = 0.5;
  return c;
}

MeasureConfig with_min_trials(MeasureConfig cfg, int trials) {
  cfg.min_trials = trials;
  cfg.max_trials = std::max(cfg.max_trials, trials);
  return cfg;
}

namespace {
double time_batch(Device& dev, const std::function<void()>& op, int reps,
                  const MeasureConfig& cfg) {
  EventPtr start = dev.record();
  for (int i = 0; i < reps; ++i) op();
  EventPtr stop = dev.record();
  dev.synchronize(cfg.sync_timeout);
  return dev.elapsed_ms(start, stop);
}
}  // namespace

Measurement measure(Device& dev, const std::function<void()>& enqueue_one,
                    const MeasureConfig& cfg) {
  Measurement m;
  for (int i = 0; i < cfg.warmup; ++i) enqueue_one();
  dev.synchronize(cfg.sync_timeout);

  // Calibrate: one op timed alone decides how many ops make a trial, so that
  // event resolution and launch gaps stay small next to the trial.
  const double one = time_batch(dev, enqueue_one, 1, cfg);
  if (one > 0 && one < cfg.min_trial_ms)
    m.reps_per_trial = std::clamp(int(std::ceil(cfg.min_trial_ms / one - 1e-9)), 1, 1 << 16);

  std::vector<double> per_op;
  per_op.reserve(64);
  double spent_ms = 0;
  m.stop = "max_trials";
  while (int(per_op.size()) < cfg.max_trials) {
    const double ms = time_batch(dev, enqueue_one, m.reps_per_trial, cfg);
    spent_ms += ms;
    per_op.push_back(ms / m.reps_per_trial);
    if (int(per_op.size()) < cfg.min_trials) continue;
    if (summarize(per_op).stdrel < cfg.max_noise) {
      m.converged = true;
      m.stop = "noise";
      break;
    }
    if (spent_ms / 1e3 >= cfg.budget_s) {
      m.stop = "budget";
      break;
    }
  }
  m.ms = summarize(per_op);
  m.spent_s = spent_ms / 1e3;
  return m;
}

}  // namespace sb
