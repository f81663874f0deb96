#include "watch/analysis.hpp"

#include <algorithm>  // std::max, std::sort, std::find
#include <cmath>      // std::floor

#include <fmt/format.h>  // fmt::format

#include "kernels/nvml/nvml_abi.hpp"  // the clock event reason bits

namespace sb::watch {

using json = nlohmann::ordered_json;

namespace {
constexpr double kLoadedUtil = 0.5;      // "under load": utilization.gpu >= 50%
constexpr double kClockLowFrac = 0.9;    // clocks below 90% of their max under load: throttled
constexpr std::size_t kMaxSeries = 3600;  // points in the report's series (then 2 s, 4 s, ... each)
constexpr std::size_t kMaxRuns = 2000;

// The clock event reasons watch names, and what each points at (analysis.hpp:
// ThrottleCause). NVML's HW slowdown (0x8) is its own cause: temperature, the
// power brake or a power draw too high, which the bit alone does not tell.
struct ReasonName {
  unsigned long long bit;
  const char* name;
  ThrottleCause cause;
};
constexpr ReasonName kReasonNames[] = {
    {nvml_abi::kReasonSwPowerCap, "sw_power_cap", ThrottleCause::power_cap},
    {nvml_abi::kReasonHwSlowdown, "hw_slowdown", ThrottleCause::hw_slowdown},
    {nvml_abi::kReasonSwThermal, "sw_thermal", ThrottleCause::heat},
    {nvml_abi::kReasonHwThermal, "hw_thermal", ThrottleCause::heat},
    {nvml_abi::kReasonHwPowerBrake, "hw_power_brake", ThrottleCause::power_brake}};
}  // namespace

std::vector<std::string> throttle_reason_names(std::uint64_t bits) {
  std::vector<std::string> out;
  for (const auto& r : kReasonNames)
    if (bits & r.bit) out.push_back(r.name);
  return out;
}

std::optional<ThrottleCause> throttle_reason_cause(const std::string& name) {
  for (const auto& r : kReasonNames)
    if (name == r.name) return r.cause;
  return std::nullopt;
}

std::vector<ThrottleCause> throttle_causes(std::uint64_t bits) {
  // NVML sets HW slowdown with HW thermal (0x48) or HW power brake (0x88) when
  // one of those is the reason: then that one is the cause, not all three.
  if (bits & (nvml_abi::kReasonHwThermal | nvml_abi::kReasonHwPowerBrake)) bits &= ~nvml_abi::kReasonHwSlowdown;
  std::vector<ThrottleCause> out;
  for (const auto& r : kReasonNames)
    if ((bits & r.bit) && std::find(out.begin(), out.end(), r.cause) == out.end()) out.push_back(r.cause);
  return out;
}

std::string throttle_advice(const std::vector<ThrottleCause>& causes) {
  std::vector<ThrottleCause> sorted = causes;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::string out;
  for (ThrottleCause c : sorted) {
    out += out.empty() ? "" : "; ";
    switch (c) {
      case ThrottleCause::heat: out += "check cooling (a thermal slowdown: the GPU ran too hot)"; break;
      case ThrottleCause::power_cap:
        out += "check the power limit (a software power cap is a setting: nvidia-smi -pl)";
        break;
      case ThrottleCause::power_brake:
        out += "check the power supply: the external power brake was asserted (HW power brake: the server's power "
               "supply or its power management held the GPU back)";
        break;
      case ThrottleCause::hw_slowdown:
        out += "HW slowdown, which NVML sets for a temperature too high, the external power brake asserted, or a "
               "power draw too high (fast trigger protection), and briefly at a clock (PState) change: check cooling, "
               "the power supply and the power draw against the limit";
        break;
    }
  }
  return out.empty() ? "check the clocks" : out;
}

Reading GpuTracker::read(const telemetry::Sample& s, bool proc_held) const {
  Reading r;
  r.t_s = s.t_s;
  if (s.util_pct) {
    r.has_util = true;
    r.util = std::clamp(*s.util_pct / 100.0, 0.0, 1.0);
  }
  r.held = proc_held || (s.mem_used_mib && *s.mem_used_mib >= opt_.held_mib);
  const bool loaded = r.has_util && r.util >= kLoadedUtil;
  // Throttling is a busy GPU held back: an idle one's reasons (power cap at a
  // low limit, say) cost nothing. Application clocks set below the maximum
  // (nvidia-smi -ac) are a choice, not a throttle.
  if (s.clock_event_reasons && loaded) r.throttle_bits = *s.clock_event_reasons & nvml_abi::kThrottleReasons;
  const bool app_clocks = s.clock_event_reasons && (*s.clock_event_reasons & nvml_abi::kReasonAppClocks);
  r.clocks_low = loaded && !app_clocks && s.sm_clock_mhz && s.sm_clock_max_mhz && *s.sm_clock_max_mhz > 0 &&
                 *s.sm_clock_mhz < kClockLowFrac * *s.sm_clock_max_mhz;
  r.throttled = r.throttle_bits != 0 || r.clocks_low;
  return r;
}

void GpuTracker::merge_series() {  // halves the series' resolution
  std::vector<Bucket> merged;
  for (std::size_t i = 0; i < series_.size(); i += 2) {
    Bucket m = series_[i];
    m.t0 = double(merged.size()) * bucket_s_ * 2;
    if (i + 1 < series_.size()) {
      const Bucket& o = series_[i + 1];
      m.util += o.util, m.n += o.n, m.sm_active += o.sm_active, m.n_sm += o.n_sm;
      m.power += o.power, m.n_power += o.n_power, m.clock += o.clock, m.n_clock += o.n_clock;
      m.mem = std::max(m.mem, o.mem), m.n_mem += o.n_mem;
    }
    merged.push_back(m);
  }
  series_ = std::move(merged);
  bucket_s_ *= 2;
}

bool GpuTracker::add(const telemetry::Sample& s_in, const std::vector<unsigned>* processes,
                     const std::vector<double>* process_mib) {
  telemetry::Sample s = s_in;
  if (n_ > 0 && s.t_s < t_prev_) s.t_s = t_prev_;  // a clock step back: no negative durations
  bool proc_held = false;
  if (process_mib)
    for (double m : *process_mib) proc_held |= m != 0;  // -1 (hidden) counts: a process is there
  const Reading r = read(s, proc_held);
  const double t = s.t_s;
  if (n_ == 0) {
    t_first_ = t;
    window_start_ = t;
  } else {
    // The previous sample's state holds until this one.
    const double dt = t - t_prev_;
    if (prev_loaded_) loaded_s_ += dt;
    if (prev_throttled_) throttled_s_ += dt;
    if (prev_clocks_low_) clocks_low_s_ += dt;
    for (const auto& name : throttle_reason_names(prev_bits_)) reason_s_[name] += dt;
    for (const ThrottleCause c : throttle_causes(prev_bits_)) cause_s_[c] += dt;
  }
  prev_loaded_ = r.has_util && r.util >= kLoadedUtil;
  prev_throttled_ = r.throttled;
  prev_clocks_low_ = r.clocks_low;
  prev_bits_ = r.throttle_bits;
  // the summary windows this sample closes
  const double w = opt_.summary_window_s;
  while (w > 0 && t >= window_start_ + w) {
    close_window(window_start_ + w);
    // a gap in a log: the windows after the last sample are empty, skipped at once
    // (not one by one: a clock jump of years would be billions of them)
    if (t >= window_start_ + w && (recent_.empty() || recent_.back().s.t_s < window_start_))
      window_start_ += std::floor((t - window_start_) / w) * w;
  }
  ++n_;
  t_prev_ = t_last_ = t;
  recent_.push_back({s, r});
  const double keep = std::max(opt_.window_s, opt_.summary_window_s) + 1e-9;
  while (!recent_.empty() && recent_.front().s.t_s < t - keep) recent_.pop_front();

  // means and the series
  if (r.has_util) {
    util_sum_ += r.util;
    ++util_n_;
  }
  if (s.sm_active) {
    sm_active_sum_ += *s.sm_active;
    ++sm_active_n_;
  }
  if (s.tensor_active) {
    tensor_sum_ += *s.tensor_active;
    ++tensor_n_;
  }
  if (s.power_w) {
    power_sum_ += *s.power_w;
    ++power_n_;
  }
  if (s.mem_used_mib) {
    mem_max_ = std::max(mem_max_, *s.mem_used_mib);
    ++mem_n_;
  }
  const double rel = t - t_first_;
  // coarser buckets first when this sample lies far past the series' end
  while (rel / bucket_s_ >= double(2 * kMaxSeries)) merge_series();
  const std::size_t bi = std::size_t(std::floor(rel / bucket_s_));
  while (series_.size() <= bi) series_.push_back({double(series_.size()) * bucket_s_});
  Bucket& b = series_[bi];
  if (r.has_util) {
    b.util += r.util;
    ++b.n;
  }
  if (s.sm_active) {
    b.sm_active += *s.sm_active;
    ++b.n_sm;
  }
  if (s.power_w) {
    b.power += *s.power_w;
    ++b.n_power;
  }
  if (s.sm_clock_mhz) {
    b.clock += *s.sm_clock_mhz;
    ++b.n_clock;
  }
  if (s.mem_used_mib) {
    b.mem = std::max(b.mem, *s.mem_used_mib);
    ++b.n_mem;
  }
  if (series_.size() > kMaxSeries) merge_series();

  // stuck: utilization 0 with memory held, for stuck_after_s
  if (r.has_util && r.util == 0 && r.held) {
    if (zero_since_ < 0) zero_since_ = t;
    if (!alarm_raised_ && t - zero_since_ >= opt_.stuck_after_s) {
      alarm_raised_ = true;
      StuckEpisode e;
      e.start_s = zero_since_ - t_first_;
      e.alarm_s = t - t_first_;
      e.mem_used_mib = s.mem_used_mib.value_or(0);
      if (processes) e.pids = *processes;
      episodes_.push_back(std::move(e));
      settle_pending();  // the windows that waited on this run: their zero part is stuck
      return true;
    }
  } else {
    if (alarm_raised_) episodes_.back().end_s = t - t_first_;
    alarm_raised_ = false;
    zero_since_ = -1;
    settle_pending();  // not stuck: the windows that waited are named as they were
  }
  return false;
}

double GpuTracker::stuck_for_s() const { return zero_since_ < 0 ? 0 : t_last_ - zero_since_; }

Pattern GpuTracker::classify_span(const std::deque<Entry>& xs, double from_s, bool alarm) const {
  if (alarm) return Pattern::stuck;
  std::vector<double> u;
  double sm = 0;
  std::size_t n_sm = 0;
  for (const Entry& e : xs) {
    if (e.s.t_s < from_s) continue;
    if (e.r.has_util) u.push_back(e.r.util);
    if (e.s.sm_active) {
      sm += *e.s.sm_active;
      ++n_sm;
    }
  }
  Pattern p = classify(u);
  // utilization.gpu counts a period busy when any kernel ran, so a GPU kept
  // busy with small kernels reads 100%: DCGM's SM active tells it apart.
  if (p == Pattern::healthy && n_sm * 2 >= u.size() && n_sm > 0 && sm / double(n_sm) < opt_.sm_active_low)
    p = Pattern::steady_low;
  return p;
}

void GpuTracker::close_window(double end_s) {
  Window w{window_start_, end_s, {}, 0, zero_since_};
  const bool pending = zero_since_ >= 0 && !alarm_raised_;
  for (const Entry& e : recent_) {
    if (e.s.t_s < w.start || e.s.t_s >= end_s) continue;
    if (pending && e.s.t_s >= zero_since_) ++w.zeros;  // all utilization 0 by definition
    else w.entries.push_back(e);
  }
  window_start_ = end_s;
  // a zero run still pending: the window waits until it is stuck or not
  if (pending) {
    pending_.push_back(std::move(w));
    return;
  }
  settle_pending();
  settle(w);
}

void GpuTracker::settle_pending() {
  for (Window& p : pending_) settle(p);
  pending_.clear();
}

void GpuTracker::settle(Window& w) {
  // the part of the window inside stuck episodes counts as stuck; the rest is
  // named from the samples outside them
  double stuck = 0;
  auto in_episode = [&](double t) {
    for (const StuckEpisode& e : episodes_) {
      const double a = e.start_s + t_first_, b = e.end_s < 0 ? 1e300 : e.end_s + t_first_;
      if (t >= a && t < b) return true;
    }
    return false;
  };
  for (const StuckEpisode& e : episodes_) {
    const double a = std::max(w.start, e.start_s + t_first_);
    const double b = std::min(w.end, e.end_s < 0 ? 1e300 : e.end_s + t_first_);
    if (b > a) stuck += b - a;
  }
  std::deque<Entry> rest;
  for (const Entry& e : w.entries)
    if (!in_episode(e.s.t_s)) rest.push_back(e);
  // the zero run's samples: stuck when an episode covers them, else utilization 0
  const bool zeros_stuck = w.zeros > 0 && in_episode(std::max(w.start, w.zeros_from));
  if (!zeros_stuck)
    for (std::size_t i = 0; i < w.zeros; ++i) {
      Entry z;
      z.r.has_util = true;
      z.r.held = true;
      z.s.t_s = w.end;  // inside the window for classify_span
      z.s.util_pct = 0;
      rest.push_back(z);
    }
  const double span = w.end - w.start;
  bool any = false;
  for (const Entry& e : rest) any |= e.r.has_util;
  Pattern label = Pattern::stuck;
  if (any) {
    const Pattern p = classify_span(rest, w.start, false);
    pattern_s_[p] += std::max(0.0, span - stuck);
    if (stuck < span / 2) label = p;
  } else if (stuck <= 0) {
    return;  // no sample in this window (a gap in a log)
  }
  if (stuck > 0) pattern_s_[Pattern::stuck] += any ? stuck : span;
  add_run(w.start - t_first_, w.end - t_first_, label);
}

void GpuTracker::add_run(double start, double end, Pattern p) {
  if (!runs_.empty() && runs_.back().p == p && std::abs(runs_.back().end - start) < 1e-9) {
    runs_.back().end = end;
    return;
  }
  runs_.push_back({start, end, p});
  if (runs_.size() <= kMaxRuns) return;
  std::vector<Run> merged;  // pairs into one, the longer one's pattern
  for (std::size_t i = 0; i < runs_.size(); i += 2) {
    Run m = runs_[i];
    if (i + 1 < runs_.size()) {
      const Run& o = runs_[i + 1];
      if (o.end - o.start > m.end - m.start) m.p = o.p;
      m.end = o.end;
    }
    if (!merged.empty() && merged.back().p == m.p) merged.back().end = m.end;
    else merged.push_back(m);
  }
  runs_ = std::move(merged);
}

void GpuTracker::finish() {
  if (n_ == 0) return;
  if (t_last_ > window_start_) {
    close_window(t_last_);
  } else if (pattern_s_.empty() && pending_.empty()) {
    // a single sample (or all at one time): its pattern, for no time
    std::deque<Entry> in(recent_.begin(), recent_.end());
    add_run(0, 0, classify_span(in, t_last_, alarm_raised_));
  }
  settle_pending();
}

Pattern GpuTracker::pattern() const { return classify_span(recent_, t_last_ - opt_.window_s, alarm_raised_); }

std::string GpuTracker::pattern_evidence() const {
  double sum = 0, sm = 0;
  std::size_t n = 0, low = 0, high = 0, n_sm = 0;
  for (const Entry& e : recent_) {
    if (e.s.t_s < t_last_ - opt_.window_s) continue;
    if (e.r.has_util) {
      sum += e.r.util;
      low += e.r.util <= 0.2;
      high += e.r.util >= 0.8;
      ++n;
    }
    if (e.s.sm_active) {
      sm += *e.s.sm_active;
      ++n_sm;
    }
  }
  if (alarm_raised_)
    return fmt::format("utilization 0 with {:.1f} GiB held for {:.0f} s", episodes_.back().mem_used_mib / 1024,
                       stuck_for_s());
  if (n == 0) return "no utilization sample";
  std::string e = fmt::format("mean {:.0f}%, {:.0f}% of samples near idle, {:.0f}% near full", 100 * sum / n,
                              100.0 * low / n, 100.0 * high / n);
  if (n_sm) e += fmt::format(", SM active {:.0f}%", 100 * sm / n_sm);
  return e;
}

std::string GpuTracker::suggestion(Pattern p) {
  // diagnose's order: utilization, loader, dtype, padding, attention, batch, memory.
  switch (p) {
    case Pattern::spiky:
      return "a slow host dataloader: raise dataloader_num_workers (up to the free cores), with "
             "dataloader_pin_memory: true; dataloader_prefetch_factor (PyTorch's default is 2) helps only once the "
             "workers keep up on average (stallbench run dataloader)";
    case Pattern::steady_low:
      return "fp32 where bf16 would do, or a batch too small (launch-bound): bf16: true first, then a larger "
             "micro_batch_size (stallbench diagnose --config your.yml measures both)";
    case Pattern::stuck:
      return "stuck: no kernel runs while memory is held: a hang (a collective waiting on a rank, a dead "
             "dataloader worker): dump the stacks (py-spy dump --pid PID), PyTorch's Flight Recorder, then "
             "stallbench analyze-hang";
    case Pattern::idle: return "idle: nothing runs on this GPU";
    case Pattern::healthy: return "healthy: the GPU is kept busy";
  }
  return "";
}

std::vector<double> GpuTracker::recent_util(std::size_t width) const {
  std::vector<double> out;
  if (recent_.empty() || width == 0) return out;
  // the last window_s, or all there is when the watch is younger
  const double end = t_last_, start = std::max(end - opt_.window_s, t_first_);
  const double slice = std::max(end - start, 1e-9) / double(width);
  std::size_t j = 0;
  while (j < recent_.size() && recent_[j].s.t_s < start) ++j;
  double last = -1;
  for (std::size_t c = 0; c < width; ++c) {
    const double until = c + 1 == width ? end + 1 : start + slice * double(c + 1);
    double lo = 2, hi = -1;
    for (; j < recent_.size() && recent_[j].s.t_s < until; ++j)
      if (recent_[j].r.has_util) {
        lo = std::min(lo, recent_[j].r.util);
        hi = std::max(hi, recent_[j].r.util);
      }
    if (hi >= 0) last = c % 2 == 0 ? lo : hi;
    if (last >= 0) out.push_back(last);  // no sample in this slice: the last value holds
  }
  return out;
}

double GpuTracker::share_s(Pattern p) const {
  const auto it = pattern_s_.find(p);
  return it == pattern_s_.end() ? 0 : it->second;
}

json GpuTracker::summary() const {
  json j;
  j["gpu"] = gpu_;
  j["samples"] = n_;
  j["duration_s"] = duration_s();
  double total = 0;
  for (const auto& [p, s] : pattern_s_) total += s;
  json share = json::object();
  for (const auto& [p, name] : kPatternNames.entries)
    share[std::string(name)] = total > 0 ? 100 * share_s(p) / total : 0.0;
  j["pattern_share_pct"] = share;
  json windows = json::array();
  for (const Run& r : runs_) windows.push_back({{"t_s", r.start}, {"end_s", r.end}, {"pattern", to_string(r.p)}});
  j["windows"] = windows;
  j["window_s"] = opt_.summary_window_s;
  j["mean_util_pct"] = 100 * mean_util();
  if (sm_active_n_) j["mean_sm_active"] = sm_active_sum_ / sm_active_n_;
  if (tensor_n_) j["mean_tensor_active"] = tensor_sum_ / tensor_n_;
  if (power_n_) j["mean_power_w"] = power_sum_ / power_n_;
  // No memory reading (a dcgmi log without FBUSD): absent, not 0 MiB.
  if (mem_n_) j["max_mem_used_mib"] = mem_max_;
  j["loaded_s"] = loaded_s_;
  j["throttled_s"] = throttled_s_;
  j["clocks_low_s"] = clocks_low_s_;
  j["throttle_reasons_s"] = json(reason_s_);
  json eps = json::array();
  for (const auto& e : episodes_)
    eps.push_back({{"start_s", e.start_s},
                   {"alarm_s", e.alarm_s},
                   {"end_s", e.end_s},
                   {"mem_used_mib", e.mem_used_mib},
                   {"pids", e.pids},
                   {"on_stuck_rc", e.on_stuck_rc}});
  j["stuck_episodes"] = eps;
  json ser{{"bucket_s", bucket_s_}};
  json t = json::array(), u = json::array(), sm = json::array(), pw = json::array(), ck = json::array(),
       mem = json::array();
  bool has_sm = false, has_pw = false, has_ck = false, has_mem = false;
  for (const Bucket& b : series_) {
    if (b.n == 0) continue;
    t.push_back(b.t0);
    u.push_back(100 * b.util / b.n);
    sm.push_back(b.n_sm ? json(b.sm_active / b.n_sm) : json(nullptr));
    pw.push_back(b.n_power ? json(b.power / b.n_power) : json(nullptr));
    ck.push_back(b.n_clock ? json(b.clock / b.n_clock) : json(nullptr));
    mem.push_back(b.n_mem ? json(b.mem) : json(nullptr));
    has_sm |= b.n_sm > 0, has_pw |= b.n_power > 0, has_ck |= b.n_clock > 0, has_mem |= b.n_mem > 0;
  }
  ser["t_s"] = t;
  ser["util_pct"] = u;
  if (has_sm) ser["sm_active"] = sm;
  if (has_pw) ser["power_w"] = pw;
  if (has_ck) ser["sm_clock_mhz"] = ck;
  if (has_mem) ser["mem_used_mib"] = mem;
  j["series"] = ser;
  return j;
}

}  // namespace sb::watch
