// What `--trace FILE` writes: the run as a PyTorch profiler (Kineto) trace,
// the format users already open in Perfetto, TensorBoard or Holistic Trace
// Analysis, and the one `stallbench diagnose --trace` reads back. So a
// scenario's injected cause, captured and fed back, can be checked to be
// named as that cause.
//
// Where the events come from:
//   the device's stream (cpu: the compute thread; sim: the timed waits): one
//     "cuda_runtime" launch call on the host thread that enqueued the work
//     (cudaLaunchKernel, cudaMemcpyAsync, cudaMemsetAsync) and one GPU event
//     ("kernel", "gpu_memcpy", "gpu_memset") on stream 7 of device 0 with the
//     same correlation id, timed when the stream ran it. A work item may mark
//     phases (stream_mark): each phase is its own kernel (the naive
//     attention's GEMM, softmax, GEMM);
//   the host's ranges (Device::range_push/pop): names as PyTorch writes them
//     ("ProfilerStep#N" a user_annotation; "enumerate(DataLoader)#..." and
//     "aten::..." cpu_ops);
//   the device's allocator: "[memory]" instant events with Total Allocated
//     and Total Reserved, as profile_memory=True records them.
// deviceProperties carries the device's name and capacity (totalGlobalMem).
// A cpu device is written as device 0 of the trace (its compute thread plays
// the GPU), and the trace says so in its "stallbench" field.
//
// Times: µs on the host's steady clock, offset to the Unix epoch at the
// recorder's start (Kineto writes absolute µs).
#pragma once

#include <atomic>   // std::atomic
#include <chrono>   // std::chrono
#include <cstdint>  // std::int64_t
#include <mutex>    // std::mutex
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

namespace sb {

class KinetoTrace {
 public:
  enum class Kind : std::uint8_t { kernel, memcpy, memset, runtime, cpu_op, user_annotation };
  struct Ev {
    Kind kind;
    std::string name;
    double ts = 0, dur = 0;
    std::int64_t tid = 0, correlation = -1, bytes = -1;  // tid: a device event's stream
    std::int64_t device = 0;
  };

  KinetoTrace();
  double now_us() const;          // on the trace's clock
  // A device whose clock runs ahead of the wall clock (sim: modelled time not waited out) puts its device
  // intervals on that clock; host events then follow it: now_us() adds *ns (nanoseconds) when set.
  void follow_offset(const std::atomic<std::int64_t>* ns) { follow_ = ns; }
  double at_us(std::chrono::steady_clock::time_point t) const;  // a steady_clock time on it
  std::int64_t next_correlation();  // 1, 2, ...
  static std::int64_t this_tid();   // the calling thread's id (gettid)

  // A host event (runtime call, cpu_op, user_annotation) on the calling thread.
  void host(Kind kind, std::string name, double ts, double dur, std::int64_t correlation = -1);
  // The same on a given thread (a tracer's record of another thread's call).
  void host_on(Kind kind, std::string name, double ts, double dur, std::int64_t tid, std::int64_t correlation);
  // A device event, on stream 7 of device 0 unless told.
  void device(Kind kind, std::string name, double ts, double dur, std::int64_t correlation, std::int64_t bytes = -1,
              std::int64_t stream = 7, std::int64_t device = 0);
  // A [memory] sample of the device's allocator, with the limit in force
  // when it is not the device's capacity (written as the sample's "Limit",
  // which PyTorch does not write: a stallbench run's points may each run
  // under a limit of their own).
  void memory(double ts, std::int64_t allocated, std::int64_t reserved, std::int64_t limit = 0);
  // Host ranges, per thread: push at now, pop closes the innermost.
  void push(std::string name);
  void pop();

  // The device as deviceProperties gives it; and what stallbench says of it.
  void set_device(std::string name, std::int64_t total_bytes, int compute_major, std::string note);
  // The device's capacity changed (a memory limit set for a point):
  // deviceProperties says the largest one set (a trace has one capacity per
  // device; the points under a smaller limit show as further from it).
  void set_capacity(std::int64_t total_bytes);

  std::size_t size() const;
  nlohmann::ordered_json to_json() const;

 private:
  mutable std::mutex mu_;
  std::vector<Ev> events_;
  struct Mem {
    double ts;
    std::int64_t allocated, reserved, limit;
  };
  std::vector<Mem> memory_;
  struct Open {
    std::int64_t tid;
    std::string name;
    double ts;
  };
  std::vector<Open> open_;  // ranges pushed, not popped
  std::atomic<std::int64_t> correlation_{0};
  std::int64_t pid_ = 0;
  double epoch_offset_us_ = 0;
  const std::atomic<std::int64_t>* follow_ = nullptr;
  std::string device_name_ = "device", note_;
  std::int64_t total_bytes_ = 0;
  int compute_major_ = 0;
};

// The category PyTorch gives a host range of this name: "ProfilerStep#N",
// "enumerate(DataLoader)#..." (the DataLoader's Python record_function, a
// USER_SCOPE range) and other annotations are user_annotation; "aten::..."
// are cpu_op.
KinetoTrace::Kind range_kind(const std::string& name);

}  // namespace sb
