#include "harness/timeline.hpp"

#include <algorithm>  // std::sort, std::max, std::min
#include <map>        // std::map

namespace sb {

using json = nlohmann::ordered_json;

double union_length(std::vector<std::pair<double, double>> v) {
  std::sort(v.begin(), v.end());
  double total = 0, cur0 = 0, cur1 = 0;
  bool open = false;
  for (const auto& [a, b] : v) {
    if (b <= a) continue;
    if (!open || a > cur1) {
      if (open) total += cur1 - cur0;
      cur0 = a;
      cur1 = b;
      open = true;
    } else {
      cur1 = std::max(cur1, b);
    }
  }
  if (open) total += cur1 - cur0;
  return total;
}

namespace {
bool device_busy(Phase p) { return p == Phase::h2d || p == Phase::compute || p == Phase::collective; }

// Gaps of the device's busy intervals inside [begin, end].
std::vector<std::pair<double, double>> device_gaps(const std::vector<Span>& spans, double begin, double end) {
  std::vector<std::pair<double, double>> busy;
  for (const auto& s : spans)
    if (s.lane == "device" && device_busy(s.phase) && s.t1 > begin && s.t0 < end)
      busy.emplace_back(std::max(begin, s.t0), std::min(end, s.t1));
  std::sort(busy.begin(), busy.end());
  std::vector<std::pair<double, double>> gaps;
  double at = begin;
  const double wall = end;
  for (const auto& [a, b] : busy) {
    if (a > at) gaps.emplace_back(at, a);
    at = std::max(at, b);
  }
  if (at < wall) gaps.emplace_back(at, wall);
  return gaps;
}
}  // namespace

TimelineSummary Timeline::summarize(double begin, double end) const {
  TimelineSummary s;
  const double wall = end - begin;
  s.wall_s = wall;
  std::vector<std::pair<double, double>> busy, waits;
  for (const auto& sp : spans_) {
    const double a = std::max(begin, sp.t0), b = std::min(end, sp.t1);
    if (b <= a) continue;
    if (sp.lane == "device" && device_busy(sp.phase)) busy.emplace_back(a, b);
    if (sp.phase == Phase::wait) waits.emplace_back(a, b);
  }
  s.busy_s = union_length(busy);
  s.busy_fraction = wall > 0 ? s.busy_s / wall : 0;
  // Idle time that overlaps a host wait-for-batch is the loader's fault.
  for (const auto& [g0, g1] : device_gaps(spans_, begin, end)) {
    std::vector<std::pair<double, double>> overlap;
    for (const auto& [w0, w1] : waits) {
      const double a = std::max(g0, w0), b = std::min(g1, w1);
      if (b > a) overlap.emplace_back(a, b);
    }
    const double host = union_length(overlap);
    s.idle_host_wait_s += host;
    s.idle_other_s += (g1 - g0) - host;
  }
  return s;
}

json chrome_trace(const std::vector<TraceProcess>& processes) {
  json events = json::array();
  int pid = 0;
  for (const auto& p : processes) {
    ++pid;
    events.push_back(json{{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", p.name}}}});
    // Stable thread ids: device first, then the train loop, then workers in name order.
    std::map<std::string, int> tids;
    auto tid_of = [&](const std::string& lane) {
      auto it = tids.find(lane);
      if (it != tids.end()) return it->second;
      const int id = lane == "device" ? 1 : lane == "train loop" ? 2 : 10 + int(tids.size());
      tids[lane] = id;
      events.push_back(json{{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", id}, {"args", {{"name", lane}}}});
      events.push_back(json{{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", id},
                            {"args", {{"sort_index", id}}}});
      return id;
    };
    tid_of("device");
    tid_of("train loop");
    auto slice = [&](const std::string& lane, Phase ph, double t0, double t1, long step) {
      json e{{"name", to_string(ph)}, {"cat", to_string(ph)}, {"ph", "X"}, {"pid", pid}, {"tid", tid_of(lane)},
             {"ts", t0 * 1e6}, {"dur", std::max(0.0, t1 - t0) * 1e6}};
      if (step >= 0) e["args"] = json{{"step", step}};
      events.push_back(std::move(e));
    };
    std::vector<Span> sorted = p.timeline.spans();
    std::sort(sorted.begin(), sorted.end(), [](const Span& a, const Span& b) { return a.lane < b.lane; });
    for (const auto& s : sorted) slice(s.lane, s.phase, s.t0, s.t1, s.step);
    for (const auto& [g0, g1] : device_gaps(p.timeline.spans(), 0, p.wall_s)) slice("device", Phase::idle, g0, g1, -1);
  }
  return json{{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

}  // namespace sb
