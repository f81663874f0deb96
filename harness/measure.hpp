// Timing of one enqueued operation on a device: warm-up, then trials until the
// relative noise is under a threshold or the time budget is spent (nvbench's
// stdrel criterion). Device time comes from the device's events (cuda events
// on GPU, the compute thread's clock on cpu).
#pragma once

#include <chrono>      // std::chrono::milliseconds
#include <functional>  // std::function
#include <string>      // std::string

#include "harness/device.hpp"  // Device
#include "harness/stats.hpp"   // Stats

namespace sb {

struct MeasureConfig {
  int warmup = 2;             // untimed calls before anything is measured
  int min_trials = 10;        // trials always taken
  int max_trials = 1000;      // trials never exceeded
  double max_noise = 0.02;    // stop once stdrel of trial times is below this
  double budget_s = 2.0;      // stop once this much device time is spent in trials
  double min_trial_ms = 1.0;  // ops are batched so one trial lasts at least this
  std::chrono::milliseconds sync_timeout{120000};  // deadline of every wait
  TimingMode mode = TimingMode::warm;              // cache and launch treatment (device.hpp)
  // Called after each trial, outside its timing: tells the watchdog that
  // a long measurement is progress, not a hang (the CLI sets it).
  std::function<void()> heartbeat;
};

// Ops per timed trial at most, per mode: cold times each op alone between its
// own events; hidden enqueues a whole trial behind a held stream, which must
// stay well inside a GPU's queue of pending launches (about a thousand).
inline constexpr int kMaxRepsWarm = 1 << 16;
inline constexpr int kMaxRepsCold = 256;
inline constexpr int kMaxRepsHidden = 256;

// The --quick profile: smoke-test sized, not for publishing.
MeasureConfig quick_measure_config();

// cfg with at least `trials` timed trials (a scenario's `trials` parameter).
MeasureConfig with_min_trials(MeasureConfig cfg, int trials);

struct Measurement {
  Stats ms;               // per-op milliseconds over trials
  int reps_per_trial = 1; // ops enqueued back to back inside one timed trial
  double spent_s = 0;     // device time spent in timed trials
  bool converged = false; // noise fell under max_noise
  std::string stop;       // "noise", "budget" or "max_trials"
  TimingMode mode = TimingMode::warm;
  std::size_t flush_bytes = 0;  // cold: bytes written before each op to evict the cache
};

// Times enqueue_one (which must only enqueue work on dev's stream) in
// cfg.mode. Throws HangError if a wait passes cfg.sync_timeout,
// UnsupportedError if the device cannot time in that mode.
Measurement measure(Device& dev, const std::function<void()>& enqueue_one,
                    const MeasureConfig& cfg);

}  // namespace sb
