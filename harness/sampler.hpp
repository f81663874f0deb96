// A background thread that samples a device's utilization the way a user
// sees it (NVML on GPU; the stream thread's busy time on cpu and sim), and the
// rule that names the pattern of the series.
#pragma once

#include <chrono>              // std::chrono
#include <condition_variable>  // std::condition_variable
#include <memory>              // std::unique_ptr
#include <mutex>               // std::mutex
#include <span>                // std::span
#include <string>              // std::string
#include <thread>              // std::thread
#include <vector>              // std::vector

#include "harness/device.hpp"  // UtilProbe, UtilSample
#include "harness/names.hpp"  // NameTable: to_string, parse and choices from one table

namespace sb {

struct TimedSample {
  double t_s = 0;  // from the sampler's start
  UtilSample s;
};

class Sampler {
 public:
  // period 0: the probe's own period.
  explicit Sampler(std::unique_ptr<UtilProbe> probe, std::chrono::milliseconds period = {});
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;
  void start();
  void stop();  // idempotent; joins the thread
  std::vector<TimedSample> series() const;
  std::string source() const { return source_; }
  // Why sampling stopped before stop() (a probe error), or "".
  std::string error() const {
    std::lock_guard lk(mu_);
    return error_;
  }
  std::chrono::milliseconds period() const { return period_; }

 private:
  void loop();
  std::unique_ptr<UtilProbe> probe_;
  std::string source_;
  std::chrono::milliseconds period_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<TimedSample> series_;
  std::string error_;  // why sampling stopped early, if it did
  std::thread thread_;
};

// The pattern a utilization series shows. The rule, on samples u in [0, 1]:
//   idle        mean < 5%
//   healthy     mean >= 90%
//   spiky       >= 15% of samples near idle (u <= 20%) and >= 15% near full
//               (u >= 80%): alternating starvation and bursts, the loader's
//               signature in nvidia-smi
//   steady-low  anything else under 90%: flat and low, the signature of a
//               small batch, the wrong dtype or launch overhead
//   stuck       the caller saw no step complete in the window (a hang)
enum class Pattern { healthy, spiky, steady_low, idle, stuck };
inline constexpr NameTable<Pattern, 5> kPatternNames{{{{Pattern::healthy, "healthy"}, {Pattern::spiky, "spiky"}, {Pattern::steady_low, "steady-low"}, {Pattern::idle, "idle"}, {Pattern::stuck, "stuck"}}}};
inline std::string_view to_string(Pattern v) { return kPatternNames.name(v); }
Pattern classify(std::span<const double> util, bool progressed = true);

// One line of block characters (▁..█), at most width wide: a longer series
// shows its middle `width` samples unaveraged, so spikes stay visible.
std::string sparkline(std::span<const double> util, std::size_t width = 60);

}  // namespace sb
