// Pieces shared by the devices whose stream is a ComputeStream (cpu, sim):
// events stamped by the stream thread, and a utilization probe that reads
// the thread's busy time the way NVML reports a GPU's (busy fraction of the
// last period).
#pragma once

#include <algorithm>           // std::clamp
#include <chrono>              // std::chrono
#include <condition_variable>  // std::condition_variable
#include <cstddef>             // std::size_t
#include <memory>              // std::make_shared
#include <mutex>               // std::mutex

#include "harness/device.hpp"                     // Event, UtilProbe
#include "harness/errors.hpp"                     // Error
#include "harness/kineto_trace.hpp"               // KinetoTrace
#include "harness/memory_ledger.hpp"              // MemoryLedger
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

// timing=hidden on a ComputeStream: a work item that waits until release()
// or the deadline, so the items enqueued behind it run back to back.
class StreamHold final : public StreamGate {
 public:
  StreamHold(ComputeStream& cs, std::chrono::milliseconds deadline) : st_(std::make_shared<State>()) {
    cs.enqueue("gate", [st = st_, until = std::chrono::steady_clock::now() + deadline] {
      std::unique_lock<std::mutex> lk(st->mu);
      if (!st->cv.wait_until(lk, until, [&] { return st->released; })) st->expired = true;
    });
  }
  ~StreamHold() override { release(); }  // never leave a stream held
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;
  void release() override {
    {
      std::lock_guard<std::mutex> lk(st_->mu);
      st_->released = true;
    }
    st_->cv.notify_all();
  }
  bool expired() const override {
    std::lock_guard<std::mutex> lk(st_->mu);
    return st_->expired;
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool released = false, expired = false;
  };
  std::shared_ptr<State> st_;  // shared with the work item, which may outlive the gate
};

// The size of the largest CPU cache this process's first CPU sees (sysfs
// cache/index*/size), or fallback when it cannot be read.
std::size_t last_level_cache_bytes(std::size_t fallback = 32u << 20);

// --trace on a ComputeStream device (cpu, sim): the stream records its items,
// the ledger its bytes in use, and the host's ranges go to the trace.
class StreamTrace {
 public:
  void attach(KinetoTrace* t, ComputeStream& cs, MemoryLedger& ledger, const DeviceInfo& info, std::string note) {
    t_ = t;
    cs.set_trace(t);
    ledger.set_trace(t);
    if (t) t->set_device(info.name, std::int64_t(ledger.stats({}).limit), 0, std::move(note));
  }
  void push(const char* name) {
    if (t_) t_->push(name);
  }
  void pop() {
    if (t_) t_->pop();
  }

 private:
  KinetoTrace* t_ = nullptr;
};

class StreamBusyProbe : public UtilProbe {
 public:
  explicit StreamBusyProbe(const ComputeStream& cs)
      : cs_(cs), last_busy_(cs.busy_time()), last_wait_(cs.wait_time()), last_t_(std::chrono::steady_clock::now()) {}
  UtilSample sample() override {
    const auto busy = cs_.busy_time();
    const auto wait = cs_.wait_time();
    const auto t = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(t - last_t_).count();
    const double db = std::chrono::duration<double>(busy - last_busy_).count();
    const double dw = std::chrono::duration<double>(wait - last_wait_).count();
    last_busy_ = busy;
    last_wait_ = wait;
    last_t_ = t;
    UtilSample s;
    s.util = dt > 0 ? std::clamp(db / dt, 0.0, 1.0) : 0.0;
    s.waiting = dt > 0 ? std::clamp(dw / dt, 0.0, 1.0) : 0.0;
    return s;
  }
  std::string source() const override { return "compute-thread busy time"; }
  std::chrono::milliseconds period() const override { return std::chrono::milliseconds(10); }

 private:
  const ComputeStream& cs_;
  std::chrono::nanoseconds last_busy_, last_wait_;
  std::chrono::steady_clock::time_point last_t_;
};

}  // namespace sb::cpu
