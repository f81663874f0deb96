// What one dataloader epoch observed, and the figures derived from it.
//
// The scenario's run_point is configure -> timed window -> derive: the timed
// window only records (device events turned into seconds, the loader's load
// records, the utilization samples); derive_epoch turns a record into the
// point's metrics with no device and no clock, so the busy-fraction and
// queueing-model maths are unit-tested on recorded timelines
// (tests/unit/test_loader.cpp).
#pragma once

#include <cstdint>  // std::int64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include "harness/result.hpp"               // Point
#include "harness/timeline.hpp"             // Timeline
#include "workloads/loader.hpp"  // LoadRecord

namespace sb::loader {

// One training step on the device, seconds from the window's start.
struct StepTimes {
  std::int64_t step = 0;
  double h2d_begin = 0, h2d_end = 0, compute_end = 0;
};

// A train-loop wait for its next batch, seconds from the window's start.
struct WaitTimes {
  std::int64_t step = 0;
  double begin = 0, end = 0;
};

struct EpochRecord {
  std::vector<StepTimes> steps;
  std::vector<WaitTimes> waits;
  std::vector<LoadRecord> loads;
  double first_batch_s = 0;  // when the first batch arrived
  double wall_s = 0;         // the window's end
  std::int64_t skipped_samples = 0;
  std::vector<double> util;  // utilization samples after the first batch, 0..1
  std::string util_source;
  int util_period_ms = 0;
};

// What derive_epoch needs besides the record: the point's shape.
struct EpochShape {
  int workers = 0;
  int batch = 1;
  std::size_t batch_bytes = 0;
  bool pinned = true;
  bool simulated = false;
  int loader_cpus = 0;  // CPUs left to the loader (0: no limit): the model counts them
};

// The point's metrics (busy_pct, predicted_pct, model_error_pts,
// sampled_util_pct, load_ms, train_ms, wait_ms, samples_per_s,
// first_batch_ms, h2d_gbs) and info (pattern, sparkline, bottleneck,
// step_ms_achieved, wall_s, steps, skipped_samples, idle times, util series).
// Fills *timeline with the spans (for --trace) when given.
Point derive_epoch(const EpochRecord& rec, const EpochShape& shape, Timeline* timeline = nullptr);

}  // namespace sb::loader
