// Per-step phase records on one clock (seconds from the window's start), and
// what they add up to: device busy fraction and the idle breakdown (after
// Holistic Trace Analysis: idle while the host waited for data vs other).
//
// Busy fraction = |union of device-busy intervals| / wall time of the window.
#pragma once

#include <string>  // std::string
#include <vector>  // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json
#include "harness/names.hpp"  // NameTable: to_string, parse and choices from one table

namespace sb {

enum class Phase { load, wait, h2d, compute, collective, idle };
inline constexpr NameTable<Phase, 6> kPhaseNames{{{{Phase::load, "load"}, {Phase::wait, "wait"}, {Phase::h2d, "h2d"}, {Phase::compute, "compute"}, {Phase::collective, "collective"}, {Phase::idle, "idle"}}}};
inline std::string_view to_string(Phase v) { return kPhaseNames.name(v); }

// One interval on one lane. Lanes: "device", "train loop", "worker 0", ...
struct Span {
  std::string lane;
  Phase phase = Phase::compute;
  double t0 = 0, t1 = 0;  // seconds from the window's start
  long step = -1;         // training step (batch index), -1 if none
};

struct TimelineSummary {
  double wall_s = 0;
  double busy_s = 0;          // union of device h2d/compute/collective spans
  double busy_fraction = 0;   // busy_s / wall_s
  double idle_host_wait_s = 0;  // device idle while the train loop waited for a batch
  double idle_other_s = 0;      // the rest of the device's idle time
};

class Timeline {
 public:
  void add(Span s) { spans_.push_back(std::move(s)); }
  const std::vector<Span>& spans() const { return spans_; }
  // Over [begin, end]: spans are clipped to the window (a scenario may start
  // it after a warm-up, e.g. once the first batch has arrived).
  TimelineSummary summarize(double begin, double end) const;
  TimelineSummary summarize(double wall_s) const { return summarize(0, wall_s); }

 private:
  std::vector<Span> spans_;
};

// Merges intervals and returns their total length (overlaps counted once).
double union_length(std::vector<std::pair<double, double>> intervals);

// Chrome trace-event JSON (opens in Perfetto and chrome://tracing): one
// process per sweep point, one thread (lane) per worker, the train loop and
// the device; device gaps become "idle" slices.
struct TraceProcess {
  std::string name;  // "workers=2 prefetch=2"
  Timeline timeline;
  double wall_s = 0;
};
nlohmann::ordered_json chrome_trace(const std::vector<TraceProcess>& processes);

}  // namespace sb
