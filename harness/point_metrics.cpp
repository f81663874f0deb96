#include "harness/point_metrics.hpp"

#include "harness/sampler.hpp"  // classify
#include "harness/stats.hpp"  // rate_from_ms

namespace sb {

void add_time_and_rate(Point& p, const Measurement& m, double flops, const std::string& op,
                       const std::string& formula) {
  p.add({"ms", m.ms.median, "ms", Direction::lower, m.ms, "median time of " + op});
  if (flops > 0) {
    const Stats tf = rate_from_ms(m.ms, flops);  // TFLOP/s per trial
    p.add({"tflops", tf.median, "TFLOP/s", Direction::higher, tf, formula + " / median time"});
  }
}

nlohmann::ordered_json measurement_info(const Measurement& m) {
  nlohmann::ordered_json t{{"mode", to_string(m.mode)}};
  if (m.mode == TimingMode::cold) t["flush_bytes"] = m.flush_bytes;
  if (m.mode == TimingMode::hidden) t["note"] = "ops enqueued behind a held stream: device time without launch gaps";
  return {{"reps_per_trial", m.reps_per_trial}, {"trials", m.ms.n}, {"stop", m.stop}, {"timing", t}};
}

void against_baseline(Result& r, const std::function<std::string(const Point&)>& key,
                      const std::function<bool(const Point&)>& is_baseline,
                      const std::function<void(Point&, const Point&)>& fn) {
  std::map<std::string, std::size_t> base;  // index: points may be added to while iterating
  for (std::size_t i = 0; i < r.points.size(); ++i)
    if (r.points[i].status == Status::ok && is_baseline(r.points[i])) base.emplace(key(r.points[i]), i);
  for (auto& p : r.points) {
    if (p.status != Status::ok || is_baseline(p)) continue;
    auto it = base.find(key(p));
    if (it != base.end()) fn(p, r.points[it->second]);
  }
}

namespace {
std::string param_text(const nlohmann::ordered_json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }
}  // namespace

std::set<std::string> varying_params(const Result& r, std::initializer_list<const char*> but) {
  std::map<std::string, std::set<std::string>> seen;
  for (const Point& p : r.points)
    for (const auto& [k, v] : p.params.items()) seen[k].insert(param_text(v));
  for (const char* b : but) seen.erase(b);
  std::set<std::string> out;
  for (const auto& [k, values] : seen)
    if (values.size() > 1) out.insert(k);
  return out;
}

std::string workload_key(const Point& p, std::initializer_list<const char*> but) {
  nlohmann::ordered_json k = p.params;
  for (const char* b : but) k.erase(b);
  return k.dump();
}

std::string params_label(const Point& p, const std::set<std::string>& names) {
  std::string out;
  for (const auto& [k, v] : p.params.items())
    if (names.count(k)) out += (out.empty() ? "" : " ") + k + "=" + param_text(v);
  return out;
}

namespace {
constexpr std::size_t kLeastPatternSamples = 5;
constexpr const char* kBusyBasis = "busy % (under 5 samples: no shape)";
}  // namespace

nlohmann::ordered_json pattern_info(std::span<const double> util, double busy_frac) {
  const bool sampled = util.size() >= kLeastPatternSamples;
  const Pattern pat = sampled ? classify(util) : busy_frac >= 0.9 ? Pattern::healthy : Pattern::steady_low;
  return {{"pattern", std::string(to_string(pat))}, {"pattern_basis", sampled ? "sampled utilization" : kBusyBasis}};
}

std::string pattern_text(const Point& p) {
  return p.info.value("pattern", std::string()) +
         (p.info.value("pattern_basis", std::string()) == kBusyBasis ? ", by busy % alone" : "");
}

}  // namespace sb
