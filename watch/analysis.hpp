// What `stallbench watch` makes of a GPU's telemetry, live or recorded: the
// utilization pattern (harness/sampler.hpp's rule, the one the dataloader
// scenario uses), the stuck alarm, throttling, and the summary over the whole
// watch. Pure: samples in, state out; no clock, no NVML, so the tests drive it
// with recorded series and it gives the same answer for a live job and a log.
#pragma once

#include <cstdint>  // std::uint64_t
#include <deque>    // std::deque
#include <map>      // std::map
#include <optional> // std::optional
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/sampler.hpp"    // Pattern, classify
#include "readers/telemetry.hpp"  // telemetry::Sample

namespace sb::watch {

struct Options {
  double window_s = 60;          // the live pattern: over the last window_s
  double summary_window_s = 10;  // the pattern over time: consecutive windows of this length
  double stuck_after_s = 60;     // utilization 0 with memory held this long: stuck
  double held_mib = 1024;        // memory held: at least this much used (a CUDA context alone is ~0.5 GiB)
  double sm_active_low = 0.5;    // DCGM SM active under this while utilization.gpu is healthy: steady-low
};

// The condition of one sample. "memory held" is memory used >= held_mib, or
// any compute process holding memory when NVML lists processes.
struct Reading {
  double t_s = 0;
  double util = 0;  // utilization.gpu as a fraction (0 when the sample has none)
  bool has_util = false;
  bool held = false;
  bool throttled = false;           // a throttle reason set, or clocks under 90% of max under load
  std::uint64_t throttle_bits = 0;  // the reasons of kThrottleReasons that were set
  bool clocks_low = false;          // SM clock < 90% of its max with utilization >= 50%
};

// What a throttle reason points at: heat (cooling), a power cap (the power
// limit), the power brake (the power supply asserted it), or NVML's HW
// slowdown (0x8), which is set for any of a temperature too high, the external
// power brake asserted, or a power draw too high (fast trigger protection), and
// may show during a clock (PState) change: the bit alone does not say which.
enum class ThrottleCause { heat, power_cap, power_brake, hw_slowdown };

struct StuckEpisode {
  double start_s = 0, end_s = -1;  // end -1: still stuck when the watch ended
  double alarm_s = 0;              // when the alarm was raised (start + stuck_after)
  double mem_used_mib = 0;
  std::vector<unsigned> pids;  // processes on the GPU at the alarm
  int on_stuck_rc = -1000;     // --on-stuck's exit code (-1000: not run; -1: killed at its deadline)
};

class GpuTracker {
 public:
  GpuTracker(int gpu, Options opt) : gpu_(gpu), opt_(opt) {}

  // Adds a sample (time must not go back more than a second: a log's clock
  // step; later samples are clamped to the last time). processes: the pids
  // NVML lists (nullptr: not known). Returns true when this sample raised the
  // stuck alarm (once per episode).
  bool add(const telemetry::Sample& s, const std::vector<unsigned>* processes = nullptr,
           const std::vector<double>* process_mib = nullptr);
  // Ends the watch: closes the last summary window.
  void finish();

  // The pattern over the last window_s (stuck while an alarm is raised).
  Pattern pattern() const;
  // Why pattern() is what it is, in a few words ("mean 43%, 31% of samples near idle ...").
  std::string pattern_evidence() const;
  // What to do about it, in diagnose's words and order.
  static std::string suggestion(Pattern p);
  bool stuck_now() const { return alarm_raised_; }
  double stuck_for_s() const;  // how long utilization has been 0 with memory held (0 when not)
  const std::vector<StuckEpisode>& stuck_episodes() const { return episodes_; }
  // The episode an alarm is raised for, by index (a pointer would dangle when
  // a later episode grows the vector); -1 when not stuck now.
  int open_episode() const { return alarm_raised_ && !episodes_.empty() ? int(episodes_.size()) - 1 : -1; }
  void set_on_stuck_rc(std::size_t episode, int rc) { episodes_.at(episode).on_stuck_rc = rc; }

  // The utilization of the last window_s in `width` equal slices, for the
  // sparkline: the lowest sample of a slice in even columns, the highest in odd
  // ones, so that a spread inside a slice (a loader's stalls between bursts)
  // shows as a zigzag instead of being averaged or aliased away.
  std::vector<double> recent_util(std::size_t width) const;
  const telemetry::Sample* last() const { return recent_.empty() ? nullptr : &recent_.back().s; }

  // The summary: share of time in each pattern, throttling, stuck episodes,
  // the series at about 1 s per point (mean utilization, SM active, power,
  // SM clock, memory) for the report.
  nlohmann::ordered_json summary() const;
  double duration_s() const { return n_ == 0 ? 0 : t_last_ - t_first_; }
  std::size_t samples() const { return n_; }
  int gpu() const { return gpu_; }
  double share_s(Pattern p) const;
  double throttled_s() const { return throttled_s_; }
  double clocks_low_s() const { return clocks_low_s_; }
  const std::map<std::string, double>& throttle_reason_s() const { return reason_s_; }
  const std::map<ThrottleCause, double>& throttle_cause_s() const { return cause_s_; }
  double mean_util() const { return util_n_ ? util_sum_ / util_n_ : 0; }
  // Samples with a utilization reading (a log of only N/A or [Not Supported] values has none).
  double util_samples() const { return util_n_; }
  // Samples with a memory-used reading. None (a dcgmi log without FBUSD): memory
  // is held only when NVML lists a process, which a log does not, so a log's
  // stuck alarm cannot fire.
  std::size_t mem_samples() const { return mem_n_; }
  std::optional<double> max_mem_used_mib() const { return mem_n_ ? std::optional<double>(mem_max_) : std::nullopt; }

 private:
  struct Entry {
    telemetry::Sample s;
    Reading r;
  };
  Reading read(const telemetry::Sample& s, bool proc_held) const;
  Pattern classify_span(const std::deque<Entry>& xs, double from_s, bool alarm) const;
  void close_window(double end_s);
  // A closed window's samples, kept while a run of zero utilization with
  // memory held is pending (it may become a stuck episode, whose time is then
  // counted as stuck, not as idle or spiky).
  struct Window {
    double start = 0, end = 0;
    std::deque<Entry> entries;  // pending: only those before the zero run
    std::size_t zeros = 0;      // pending: the zero run's samples in it (utilization 0, not kept)
    double zeros_from = 0;      // pending: when that zero run started
  };
  void settle(Window& w);  // adds a window's time to the shares, the episodes known
  void settle_pending();
  void merge_series();

  int gpu_;
  Options opt_;
  std::deque<Entry> recent_;     // the last max(window_s, summary_window_s) seconds
  std::size_t n_ = 0;
  double t_first_ = 0, t_last_ = 0, t_prev_ = 0;
  // stuck
  double zero_since_ = -1;
  bool alarm_raised_ = false;
  std::vector<StuckEpisode> episodes_;
  // the summary windows
  double window_start_ = 0;
  std::vector<Window> pending_;
  std::map<Pattern, double> pattern_s_;
  // The pattern over time as runs of equal windows (start, end, pattern);
  // past kMaxRuns, neighbouring runs merge (the longer one's pattern).
  struct Run {
    double start = 0, end = 0;
    Pattern p = Pattern::idle;
  };
  std::vector<Run> runs_;
  void add_run(double start, double end, Pattern p);
  // throttling: seconds (each sample counts the time to the next)
  double throttled_s_ = 0, clocks_low_s_ = 0, loaded_s_ = 0;
  std::map<std::string, double> reason_s_;
  std::map<ThrottleCause, double> cause_s_;
  bool prev_throttled_ = false, prev_clocks_low_ = false, prev_loaded_ = false;
  std::uint64_t prev_bits_ = 0;
  // means
  double util_sum_ = 0, util_n_ = 0, sm_active_sum_ = 0, sm_active_n_ = 0, tensor_sum_ = 0, tensor_n_ = 0;
  double mem_max_ = 0, power_sum_ = 0, power_n_ = 0;
  std::size_t mem_n_ = 0;
  // the series at ~1 s per point
  struct Bucket {
    double t0 = 0, util = 0, sm_active = 0, power = 0, clock = 0, mem = 0;
    int n = 0, n_sm = 0, n_power = 0, n_clock = 0, n_mem = 0;
  };
  std::vector<Bucket> series_;
  double bucket_s_ = 1;
};

// The names of the throttle reasons set in bits ("sw_power_cap", "hw_slowdown", ...).
std::vector<std::string> throttle_reason_names(std::uint64_t bits);
// What a throttle reason points at (ThrottleCause, above the tracker).
std::optional<ThrottleCause> throttle_reason_cause(const std::string& name);
// The causes of one sample's reasons: HW slowdown counts as its own cause only
// when neither HW thermal (0x40: heat) nor HW power brake (0x80) beside it
// says which it is.
std::vector<ThrottleCause> throttle_causes(std::uint64_t bits);
// What to check for the causes seen ("check the clocks" for none: the SM clock
// was low without a reason).
std::string throttle_advice(const std::vector<ThrottleCause>& causes);

}  // namespace sb::watch
