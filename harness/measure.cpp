#include "harness/measure.hpp"

#include <algorithm>  // std::max, std::clamp
#include <cmath>      // std::ceil
#include <vector>     // std::vector

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // Error

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

// The time of `reps` ops in one trial, milliseconds of device time.
double time_trial(Device& dev, const std::function<void()>& op, int reps, const MeasureConfig& cfg,
                  std::vector<EventPtr>& events) {
  switch (cfg.mode) {
    case TimingMode::warm: {
      const EventPtr start = dev.record();
      for (int i = 0; i < reps; ++i) op();
      const EventPtr stop = dev.record();
      dev.synchronize(cfg.sync_timeout);
      return dev.elapsed_ms(start, stop);
    }
    case TimingMode::cold: {
      // Each op between its own events, the flush outside them.
      events.clear();
      for (int i = 0; i < reps; ++i) {
        dev.flush_cache();
        events.push_back(dev.record());
        op();
        events.push_back(dev.record());
      }
      dev.synchronize(cfg.sync_timeout);
      double ms = 0;
      for (std::size_t i = 0; i + 1 < events.size(); i += 2) ms += dev.elapsed_ms(events[i], events[i + 1]);
      return ms;
    }
    case TimingMode::hidden: {
      auto gate = dev.hold_stream(cfg.sync_timeout);
      const EventPtr start = dev.record();
      for (int i = 0; i < reps; ++i) op();
      const EventPtr stop = dev.record();
      gate->release();
      dev.synchronize(cfg.sync_timeout);
      if (gate->expired())
        throw Error(ErrorKind::runtime,
                    fmt::format("{}: the stream gate's deadline ({} ms) passed before {} ops were enqueued; "
                                "the trial would include launch gaps",
                                dev.info().id, cfg.sync_timeout.count(), reps));
      return dev.elapsed_ms(start, stop);
    }
  }
  throw Error(ErrorKind::runtime, "unknown timing mode");
}

int max_reps(TimingMode m) {
  switch (m) {
    case TimingMode::warm: return kMaxRepsWarm;
    case TimingMode::cold: return kMaxRepsCold;
    case TimingMode::hidden: return kMaxRepsHidden;
  }
  return 1;
}

}  // namespace

Measurement measure(Device& dev, const std::function<void()>& enqueue_one,
                    const MeasureConfig& cfg) {
  Measurement m;
  m.mode = cfg.mode;
  std::vector<EventPtr> events;
  events.reserve(2 * std::size_t(max_reps(cfg.mode)));
  for (int i = 0; i < cfg.warmup; ++i) enqueue_one();
  dev.synchronize(cfg.sync_timeout);
  if (cfg.mode == TimingMode::cold) {
    m.flush_bytes = dev.flush_cache();  // also makes the flush buffer before anything is timed
    dev.synchronize(cfg.sync_timeout);
  }

  // Calibrate: ops timed alone decide how many ops make a trial, so that event resolution and
  // launch gaps stay small next to the trial. The least of up to three, while they add up to
  // under 50 ms: one sample preempted by another process (7.9 ms for a 0.35 ms GEMM on a loaded
  // 2-core machine) made every trial a single op, under min_trial_ms, and the figure a
  // scheduler's time slice. An op of 50 ms or more is timed once.
  double one = time_trial(dev, enqueue_one, 1, cfg, events);
  double calibration_ms = one;
  for (int i = 1; i < 3 && calibration_ms < std::max(50.0, 3 * cfg.min_trial_ms); ++i) {
    const double again = time_trial(dev, enqueue_one, 1, cfg, events);
    calibration_ms += again;
    if (again > 0) one = std::min(one, again);
  }
  if (one > 0 && one < cfg.min_trial_ms)
    m.reps_per_trial = std::clamp(int(std::ceil(cfg.min_trial_ms / one - 1e-9)), 1, max_reps(cfg.mode));

  std::vector<double> per_op;
  per_op.reserve(64);
  double spent_ms = 0;
  m.stop = "max_trials";
  while (int(per_op.size()) < cfg.max_trials) {
    const double ms = time_trial(dev, enqueue_one, m.reps_per_trial, cfg, events);
    spent_ms += ms;
    per_op.push_back(ms / m.reps_per_trial);
    if (cfg.heartbeat) cfg.heartbeat();
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
