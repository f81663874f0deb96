// Per-op submit/launch overhead: what every op pays before any compute, the
// fixed cost that dominates the batch scenario's micro batches. Each
// benchmark submits N empty items (N = 1, 16, 256, 4096) per iteration.
//
// cpu: the cpu device's stream, a ComputeStream (one thread running
// std::function items in order), measured directly:
//   cpu/enqueue    host time of N enqueue() calls (the submit cost the host
//                  sees); the synchronize that follows is not timed
//   cpu/roundtrip  N enqueues then synchronize: the stream's cost per item
//                  as the device sees it (queue, wake-up, completion)
//   cpu/replay     one item that calls N empty std::functions in a loop:
//                  what a captured "graph" replay costs per node on cpu
//                  (node_loop_ns: the loop alone, inside the item)
// cuda (built with CUDA and a GPU present; otherwise not registered, with a
// line on stderr saying why), an empty <<<1, 1>>> kernel:
//   cuda/launch_host    host time around N launches, no sync in the timing
//   cuda/launch_device  CUDA-event time of N launches back to back after a
//                       sync (where a launch costs the host more than the GPU
//                       takes to run it, this is the host's launch rate)
//   cuda/graph          the N launches captured into a CUDA graph, replayed
//                       with one cudaGraphLaunch: event time per node
//                       (host_ns_per_item: the cudaGraphLaunch call / N)
// Time is manual: the host's steady clock on cpu and for the host-side CUDA
// figures, CUDA events for the device-side ones. Counters: items_per_s (N per
// iteration over that time) and ns_per_item (iteration time / N, averaged).
// Smoke test: `meson test --suite bench-smoke` runs cpu/ with a tiny min time.
#include <chrono>      // std::chrono::steady_clock
#include <cstdint>     // std::int64_t
#include <cstdio>      // std::fprintf
#include <exception>   // std::exception
#include <functional>  // std::function
#include <string>      // std::string
#include <vector>      // std::vector

#include <benchmark/benchmark.h>  // benchmark::State, RegisterBenchmark, Counter

#include "bench/bench_run.hpp"                    // run_selected_benchmarks
#include "kernels/cpu/detail/compute_stream.hpp"  // ComputeStream: the cpu device's stream

#ifdef STALLBENCH_HAVE_CUDA
#include <cuda_runtime.h>  // cudaStream_t, cudaEvent_t, cudaGraph_t

#include "bench/launch_kernels.cuh"        // launch_empty
#include "kernels/cuda/detail/check.hpp"  // SB_CUDA_CHECK: throws sb::Error naming the call
#endif

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kTimeout = std::chrono::minutes(1);

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// sum_ns_per_item: the sum over iterations of (iteration time / N).
void report(benchmark::State& st, std::int64_t n, double sum_ns_per_item) {
  st.counters["items_per_s"] = benchmark::Counter(double(n) * double(st.iterations()), benchmark::Counter::kIsRate);
  st.counters["ns_per_item"] = benchmark::Counter(sum_ns_per_item, benchmark::Counter::kAvgIterations);
}

// ---- cpu: ComputeStream ----

void cpu_enqueue(benchmark::State& st) {
  const std::int64_t n = st.range(0);
  sb::cpu::ComputeStream cs("cpu");
  st.SetLabel("host time of N enqueues of an empty item");
  double sum = 0;
  try {
    for (auto _ : st) {
      const auto t0 = Clock::now();
      for (std::int64_t i = 0; i < n; ++i) cs.enqueue("empty", [] {});
      const double s = seconds_since(t0);
      cs.synchronize(kTimeout);  // not timed: the next iteration starts on an idle stream
      st.SetIterationTime(s);
      sum += s * 1e9 / double(n);
    }
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
    return;
  }
  report(st, n, sum);
}

void cpu_roundtrip(benchmark::State& st) {
  const std::int64_t n = st.range(0);
  sb::cpu::ComputeStream cs("cpu");
  st.SetLabel("N empty items enqueued, then synchronize");
  double sum = 0;
  try {
    for (auto _ : st) {
      const auto t0 = Clock::now();
      for (std::int64_t i = 0; i < n; ++i) cs.enqueue("empty", [] {});
      cs.synchronize(kTimeout);
      const double s = seconds_since(t0);
      st.SetIterationTime(s);
      sum += s * 1e9 / double(n);
    }
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
    return;
  }
  report(st, n, sum);
}

void cpu_replay(benchmark::State& st) {
  const std::int64_t n = st.range(0);
  sb::cpu::ComputeStream cs("cpu");
  st.SetLabel("one item calling N empty functions, then synchronize");
  const std::vector<std::function<void()>> nodes(std::size_t(n), [] {});
  double sum = 0, loop_sum = 0;
  try {
    for (auto _ : st) {
      double loop_s = 0;  // written by the stream thread; read after synchronize (its lock orders them)
      const auto t0 = Clock::now();
      cs.enqueue("graph replay", [&nodes, &loop_s] {
        const auto l0 = Clock::now();
        for (const auto& f : nodes) f();
        loop_s = seconds_since(l0);
      });
      cs.synchronize(kTimeout);
      const double s = seconds_since(t0);
      st.SetIterationTime(s);
      sum += s * 1e9 / double(n);
      loop_sum += loop_s * 1e9 / double(n);
    }
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
    return;
  }
  report(st, n, sum);
  st.counters["node_loop_ns"] = benchmark::Counter(loop_sum, benchmark::Counter::kAvgIterations);
}

// ---- cuda: empty kernel launches and a CUDA graph of them ----
#ifdef STALLBENCH_HAVE_CUDA

// Why no CUDA device can be used, or "" when device 0 answers.
std::string cuda_unavailable() {
  int count = 0;
  const cudaError_t s = cudaGetDeviceCount(&count);
  if (s != cudaSuccess) {
    cudaGetLastError();  // clear it
    return std::string(cudaGetErrorName(s)) + ": " + cudaGetErrorString(s);
  }
  return count > 0 ? "" : "no CUDA device";
}

// What one CUDA benchmark holds, released however it ends (destroy errors are
// ignored: there is nothing left to report them to).
struct CudaRig {
  cudaStream_t stream = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;

  void open() {
    SB_CUDA_CHECK(cudaSetDevice(0));
    SB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));  // capturable (not legacy default)
    SB_CUDA_CHECK(cudaEventCreate(&e0));
    SB_CUDA_CHECK(cudaEventCreate(&e1));
  }
  ~CudaRig() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (e1) cudaEventDestroy(e1);
    if (e0) cudaEventDestroy(e0);
    if (stream) cudaStreamDestroy(stream);
  }
  void launch(std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) sb::bench_kernels::launch_empty(stream);
  }
  // The first launch error since the last check (launch_empty leaves it pending).
  static void check_launches() { SB_CUDA_CHECK(cudaGetLastError()); }
  void sync() { SB_CUDA_CHECK(cudaStreamSynchronize(stream)); }
  double event_seconds() {
    SB_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    SB_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return double(ms) / 1e3;
  }
};

void cuda_launch_host(benchmark::State& st) {
  const std::int64_t n = st.range(0);
  st.SetLabel("host time of N empty-kernel launches, no sync");
  double sum = 0;
  try {
    CudaRig rig;
    rig.open();
    rig.launch(n);  // warm: lazy module loading happens on the first launch
    CudaRig::check_launches();
    rig.sync();
    for (auto _ : st) {
      const auto t0 = Clock::now();
      rig.launch(n);
      const double s = seconds_since(t0);
      CudaRig::check_launches();
      rig.sync();  // not timed: the next iteration starts on an idle stream
      st.SetIterationTime(s);
      sum += s * 1e9 / double(n);
    }
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
    return;
  }
  report(st, n, sum);
}

void cuda_launch_device(benchmark::State& st) {
  const std::int64_t n = st.range(0);
  st.SetLabel("event time of N empty kernels back to back");
  double sum = 0;
  try {
    CudaRig rig;
    rig.open();
    rig.launch(n);
    CudaRig::check_launches();
    rig.sync();
    for (auto _ : st) {
      SB_CUDA_CHECK(cudaEventRecord(rig.e0, rig.stream));
      rig.launch(n);
      SB_CUDA_CHECK(cudaEventRecord(rig.e1, rig.stream));
      CudaRig::check_launches();
      const double s = rig.event_seconds();  // e1 done: the stream is idle again
      st.SetIterationTime(s);
      sum += s * 1e9 / double(n);
    }
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
    return;
  }
  report(st, n, sum);
}

void cuda_graph(benchmark::State& st) {
  const std::int64_t n = st.range(0);
  st.SetLabel("CUDA graph of N empty kernels, one cudaGraphLaunch");
  double sum = 0, host_sum = 0;
  try {
    CudaRig rig;
    rig.open();
    rig.launch(1);  // load the module outside the capture
    CudaRig::check_launches();
    rig.sync();
    SB_CUDA_CHECK(cudaStreamBeginCapture(rig.stream, cudaStreamCaptureModeThreadLocal));
    rig.launch(n);
    SB_CUDA_CHECK(cudaStreamEndCapture(rig.stream, &rig.graph));
    CudaRig::check_launches();
    SB_CUDA_CHECK(cudaGraphInstantiate(&rig.exec, rig.graph, 0));
    SB_CUDA_CHECK(cudaGraphUpload(rig.exec, rig.stream));
    SB_CUDA_CHECK(cudaGraphLaunch(rig.exec, rig.stream));  // warm
    rig.sync();
    for (auto _ : st) {
      SB_CUDA_CHECK(cudaEventRecord(rig.e0, rig.stream));
      const auto t0 = Clock::now();
      const cudaError_t launched = cudaGraphLaunch(rig.exec, rig.stream);
      const double host_s = seconds_since(t0);
      SB_CUDA_CHECK(launched);
      SB_CUDA_CHECK(cudaEventRecord(rig.e1, rig.stream));
      const double s = rig.event_seconds();
      st.SetIterationTime(s);
      sum += s * 1e9 / double(n);
      host_sum += host_s * 1e9 / double(n);
    }
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
    return;
  }
  report(st, n, sum);
  st.counters["host_ns_per_item"] = benchmark::Counter(host_sum, benchmark::Counter::kAvgIterations);
}

#endif  // STALLBENCH_HAVE_CUDA

void add(const char* name, void (*fn)(benchmark::State&)) {
  benchmark::RegisterBenchmark(name, fn)
      ->ArgName("N")->Arg(1)->Arg(16)->Arg(256)->Arg(4096)
      ->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  add("cpu/enqueue", cpu_enqueue);
  add("cpu/roundtrip", cpu_roundtrip);
  add("cpu/replay", cpu_replay);
#ifdef STALLBENCH_HAVE_CUDA
  if (const std::string why = cuda_unavailable(); !why.empty()) {
    std::fprintf(stderr, "launch_bench: cuda not measured (%s); the cuda/ benchmarks are not registered\n",
                 why.c_str());
  } else {
    add("cuda/launch_host", cuda_launch_host);
    add("cuda/launch_device", cuda_launch_device);
    add("cuda/graph", cuda_graph);
  }
#else
  std::fprintf(stderr, "launch_bench: cuda not measured (built without CUDA)\n");
#endif
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  return sb::run_selected_benchmarks();
}
