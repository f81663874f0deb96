// Pieces shared by the devices whose stream is a ComputeStream (cpu, sim):
// events stamped by the stream thread, and a utilization probe that reads
// the thread's busy time the way NVML reports a GPU's (busy fraction of the
// last period).
#pragma once

#include <algorithm>  // std::clamp
#include <chrono>  // std::chrono
#include <memory>  // std::make_shared

#include "harness/device.hpp"                     // Event, UtilProbe
#include "harness/errors.hpp"                     // Error
#include "kernels/cpu/detail/compute_stream.hpp"  // ComputeStream

namespace sb::cpu {

struct StreamEvent : Event {
  std::uint64_t seq = 0;
  std::chrono::steady_clock::time_point t{};
};

inline EventPtr record_event(ComputeStream& cs) {
  auto e = std::make_shared<StreamEvent>();
  e->seq = cs.enqueue("event", [raw = e.get()] { raw->t = std::chrono::steady_clock::now(); });
  return e;
}

inline const StreamEvent& as_stream_event(const EventPtr& e) {
  const auto* x = dynamic_cast<const StreamEvent*>(e.get());
  if (!x) throw Error(ErrorKind::runtime, "event of another device");
  return *x;
}

inline double stream_elapsed_ms(const EventPtr& a, const EventPtr& b) {
  return std::chrono::duration<double, std::milli>(as_stream_event(b).t - as_stream_event(a).t).count();
}

class StreamBusyProbe : public UtilProbe {
 public:
  explicit StreamBusyProbe(const ComputeStream& cs)
      : cs_(cs), last_busy_(cs.busy_time()), last_t_(std::chrono::steady_clock::now()) {}
  UtilSample sample() override {
    const auto busy = cs_.busy_time();
    const auto t = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(t - last_t_).count();
    const double db = std::chrono::duration<double>(busy - last_busy_).count();
    last_busy_ = busy;
    last_t_ = t;
    UtilSample s;
    s.util = dt > 0 ? std::clamp(db / dt, 0.0, 1.0) : 0.0;
    return s;
  }
  std::string source() const override { return "compute-thread busy time"; }
  std::chrono::milliseconds period() const override { return std::chrono::milliseconds(10); }

 private:
  const ComputeStream& cs_;
  std::chrono::nanoseconds last_busy_;
  std::chrono::steady_clock::time_point last_t_;
};

}  // namespace sb::cpu
