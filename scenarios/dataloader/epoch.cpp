#include "scenarios/dataloader/epoch.hpp"

#include <algorithm>  // std::max
#include <numeric>    // std::accumulate

#include <fmt/format.h>  // fmt::format

#include "harness/sampler.hpp"  // classify, sparkline

namespace sb::loader {

Point derive_epoch(const EpochRecord& rec, const EpochShape& shape, Timeline* timeline) {
  Timeline tl;
  for (const auto& w : rec.waits) tl.add({"train loop", Phase::wait, w.begin, w.end, w.step});
  double h2d_s = 0, train_s = 0;
  for (const auto& s : rec.steps) {
    tl.add({"device", Phase::h2d, s.h2d_begin, s.h2d_end, s.step});
    tl.add({"device", Phase::compute, s.h2d_end, s.compute_end, s.step});
    h2d_s += s.h2d_end - s.h2d_begin;
    train_s += s.compute_end - s.h2d_begin;
  }
  double load_s = 0, load_cpu_s = 0;
  for (const auto& r : rec.loads) {
    tl.add({r.worker < 0 ? "train loop" : fmt::format("worker {}", r.worker), Phase::load, r.t0_s, r.t1_s, r.batch});
    load_s += r.t1_s - r.t0_s;
    load_cpu_s += r.cpu_s;
  }
  const int steps_done = int(rec.steps.size());
  const auto n = double(std::max(1, steps_done));
  const double n_loads = double(std::max<std::size_t>(1, rec.loads.size()));
  const double T = train_s / n, Lb = load_s / n_loads;
  // Two views of the loader's supply. From wall time (predicted_pct): each
  // worker's measured load time already includes sharing cores with the
  // other workers and anything else on the machine, so every worker counts.
  // From CPU time (predicted_own_cpus_pct): what the loader would supply
  // with its CPUs to itself, min(workers, loader CPUs) loading at once. A
  // measurement well under the second says something else takes the
  // loader's CPUs. Records without CPU time (0) fall back to wall time.
  const double Lc = load_cpu_s > 0 ? load_cpu_s / n_loads : Lb;
  // The measured window opens when the first batch arrives: the loader's
  // start-up (first_batch_ms) is reported on its own, not mixed into the
  // steady state a user sees in nvidia-smi.
  const TimelineSummary sum = tl.summarize(rec.first_batch_s, rec.wall_s);
  const double predicted = predicted_busy(shape.workers, T, Lb);
  const double predicted_own = predicted_busy(shape.workers, T, Lc, shape.loader_cpus);
  const double util_mean =
      rec.util.empty() ? 0 : std::accumulate(rec.util.begin(), rec.util.end(), 0.0) / double(rec.util.size());
  const Pattern pattern = classify(rec.util, steps_done > 0);

  Point p;
  p.add({"busy_pct", 100 * sum.busy_fraction, "%", Direction::higher, std::nullopt,
         "union of device busy intervals / wall time"});
  p.add({"predicted_pct", 100 * predicted, "%", Direction::none, std::nullopt,
         "queueing model min(1, max(1,workers) * train / load)"});
  p.add({"predicted_own_cpus_pct", 100 * predicted_own, "%", Direction::none, std::nullopt,
         "the model with the loader's CPUs to itself: min(1, min(max(1,workers), loader CPUs) * train / load CPU time)",
         false});
  p.add({"model_error_pts", 100 * (sum.busy_fraction - predicted), "pts", Direction::none, std::nullopt,
         "measured busy minus predicted", false});
  if (!rec.util.empty())
    p.add({"sampled_util_pct", 100 * util_mean, "%", Direction::higher, std::nullopt,
           fmt::format("mean of {} samples every {} ms ({})", rec.util.size(), rec.util_period_ms, rec.util_source)});
  p.add({"load_ms", Lb * 1e3, "ms", Direction::lower, std::nullopt, "load time per batch (one worker, wall)"});
  p.add({"load_cpu_ms", Lc * 1e3, "ms", Direction::lower, std::nullopt,
         "CPU time per batch load: its cost on a core of its own", false});
  p.add({"train_ms", T * 1e3, "ms", Direction::lower, std::nullopt, "device time per step: H2D + compute"});
  p.add({"wait_ms", 1e3 * sum.idle_host_wait_s / n, "ms", Direction::lower, std::nullopt,
         "device idle per step while the loop waited for a batch", false});
  p.add({"samples_per_s", double(std::max(0, steps_done - 1)) * shape.batch / std::max(sum.wall_s, 1e-9),
         "samples/s", Direction::higher, std::nullopt, "after the first batch"});
  p.add({"first_batch_ms", rec.first_batch_s * 1e3, "ms", Direction::lower, std::nullopt,
         "loader start-up: time until the first batch arrived", false});
  if (h2d_s > 0)
    p.add({"h2d_gbs", double(shape.batch_bytes) * n / h2d_s / 1e9, "GB/s", Direction::higher, std::nullopt,
           fmt::format("{} host memory, {} per copy", shape.pinned ? "pinned" : "pageable", shape.batch_bytes)});
  p.info = nlohmann::ordered_json{{"pattern", to_string(pattern)},
                                  {"sparkline", sparkline(rec.util)},
                                  {"bottleneck", bottleneck(shape.workers, T, Lb)},
                                  {"step_ms_achieved", T * 1e3},
                                  {"wall_s", rec.wall_s},
                                  {"steps", steps_done},
                                  {"skipped_samples", rec.skipped_samples},
                                  {"idle_host_wait_s", sum.idle_host_wait_s},
                                  {"idle_other_s", sum.idle_other_s},
                                  {"util_source", rec.util_source},
                                  {"util_series", rec.util}};
  if (shape.simulated) p.info["note"] = "simulated device: its step times are modelled, not measured";
  if (timeline) *timeline = std::move(tl);
  return p;
}

}  // namespace sb::loader
