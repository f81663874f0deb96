// The Device interface: one view over `cpu`, `cuda:N` and `sim:<gpu>` (a roofline of the
// expected numbers, spent as timed waits: kernels/sim).
// Scenarios talk only to this header; no CUDA or oneDNN header is included here.
//
// A device has one in-order stream. Operations are enqueued on it and return at
// once; record() puts a timing event on the stream; synchronize() waits, with a
// deadline, for everything enqueued so far. On `cpu` the stream is a dedicated
// compute thread, so the device's busy time is real time spent computing.
#pragma once

#include <chrono>       // std::chrono::milliseconds
#include <cstddef>      // std::size_t
#include <cstdint>      // std::int64_t, std::uint64_t
#include <functional>   // std::function
#include <memory>       // std::unique_ptr, std::shared_ptr
#include <optional>     // std::optional
#include <span>         // std::span
#include <string>       // std::string
#include <vector>       // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json: device properties

#include "harness/dtype.hpp"   // DType
#include "harness/errors.hpp"  // UnsupportedError
#include "harness/names.hpp"  // NameTable: to_string, parse and choices from one table

namespace sb {

class KinetoTrace;

class TrainOps;  // harness/train_ops.hpp

enum class DeviceKind { cpu, cuda, sim };
inline constexpr NameTable<DeviceKind, 3> kDeviceKindNames{
    {{{DeviceKind::cpu, "cpu"}, {DeviceKind::cuda, "cuda"}, {DeviceKind::sim, "sim"}}}};
inline std::string_view to_string(DeviceKind v) { return kDeviceKindNames.name(v); }
inline std::optional<DeviceKind> parse_device_kind(std::string_view s) { return kDeviceKindNames.parse(s); }

// What a user names on the command line: "cpu", "cuda:0", "sim:h100", "auto".
struct DeviceSpec {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  std::string sim;         // sim:<gpu>: an expected-file id or its unique prefix ("h100")
  bool automatic = false;  // "auto": cuda:0 if a GPU answers, else cpu
  std::string str() const;
};
// Throws UsageError naming the accepted forms.
DeviceSpec parse_device_spec(const std::string& text);

struct DeviceInfo {
  std::string id;    // "cpu", "cuda:0"
  DeviceKind kind = DeviceKind::cpu;
  std::string name;  // "NVIDIA H200", or the CPU model string
  bool simulated = false;
  nlohmann::ordered_json props = nlohmann::ordered_json::object();  // SMs, clocks, memory, ...
};

enum class MemKind { device, host_pinned, host_pageable };

// Owned memory; released by the device that made it. Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(void* data, std::size_t bytes, MemKind kind, std::function<void(void*)> release)
      : data_(data), bytes_(bytes), kind_(kind), release_(std::move(release)) {}
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    Buffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (data_ && release_) release_(data_);
  }
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  MemKind kind() const { return kind_; }

 private:
  void swap(Buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(kind_, o.kind_);
    std::swap(release_, o.release_);
  }
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  MemKind kind_ = MemKind::host_pageable;
  std::function<void(void*)> release_;
};

// C[M,N] = A[M,K] * W[N,K]^T, all row-major: the layout of nn.Linear
// (y = x W^T). In cuBLAS's column-major terms this is the "TN" GEMM that fp8
// requires. FLOPs = 2*M*N*K (one multiply and one add per term).
struct GemmShape {
  std::int64_t m = 0, n = 0, k = 0;
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

// A GEMM prepared on a device: operands allocated, filled and (on cpu) the
// weights reordered once. enqueue() is the only thing a timed region calls.
class GemmOp {
 public:
  virtual ~GemmOp() = default;
  virtual GemmShape shape() const = 0;
  virtual DType dtype() const = 0;
  // The element type of C (e.g. bf16 on cuda, fp32 on cpu for a bf16 GEMM).
  virtual DType c_dtype() const = 0;
  // The implementation that actually runs, e.g. "brg:avx512_core_amx_bf16"
  // (oneDNN) or "cublasLt algo 21 tile 128x256" (cuBLASLt).
  virtual std::string impl() const = 0;
  // Enqueue one GEMM on the device stream.
  virtual void enqueue() = 0;
  // Replace A (m*k values) and W (n*k values) with host fp32 data, converted
  // to the op's dtype by the device. Synchronous. For correctness checks.
  virtual void upload(std::span<const float> a, std::span<const float> w) = 0;
  // Copy C (m*n values) back as fp32, after synchronize(). For correctness checks.
  virtual void download_c(std::span<float> c) = 0;
  // False on a simulated device, which spends the GEMM's time but computes
  // nothing: there is no result to check.
  virtual bool computes() const { return true; }
};

// What a utilization probe reads: the device as a user sees it in nvidia-smi.
struct UtilSample {
  double util = 0;  // fraction of the last period the device was busy, 0..1
  std::optional<double> sm_clock_mhz;
  std::optional<double> power_w;
  std::optional<std::uint64_t> clock_event_reasons;  // NVML clock-event (throttle) bitmask
  // Fraction of the period the device's stream waited for work (cpu: its
  // thread blocked on an empty queue); unknown where nothing reports it.
  std::optional<double> waiting;
};

class UtilProbe {
 public:
  virtual ~UtilProbe() = default;
  // Busy fraction since the previous call (NVML: its own sample window).
  virtual UtilSample sample() = 0;
  // "nvml" or "compute-thread busy time": where the numbers come from.
  virtual std::string source() const = 0;
  // How often sampling is meaningful (NVML updates slower than 10 ms).
  virtual std::chrono::milliseconds period() const = 0;
};

// Attention. Q, K, V, O are [B, H, S, D] row-major (the layout of
// torch's scaled_dot_product_attention); varlen packs sequences of different
// lengths back to back: [1, H, total, D] with cu_seqlens = {0, s0, s0+s1, ...}
// (FlashAttention's convention), and no token attends across a boundary.
// FLOPs, the convention of docs/DESIGN.md: forward 4*B*H*S^2*D (QK^T and PV, 2 each),
// halved for causal; forward+backward 3.5x forward (flash recomputes S).
// naive: the eager path op by op, a fresh tensor per op (what a model's
// "eager" attention runs); naive-prealloc: the same GEMMs with the S x S
// buffers allocated once and the elementwise steps fused into one softmax
// pass (the fastest a materialising implementation gets).
enum class AttnImpl { naive, naive_prealloc, flash, cudnn };
inline constexpr NameTable<AttnImpl, 4> kAttnImplNames{{{{AttnImpl::naive, "naive"}, {AttnImpl::naive_prealloc, "naive-prealloc"}, {AttnImpl::flash, "flash"}, {AttnImpl::cudnn, "cudnn"}}}};
inline std::string_view to_string(AttnImpl v) { return kAttnImplNames.name(v); }
inline std::optional<AttnImpl> parse_attn_impl(std::string_view s) { return kAttnImplNames.parse(s); }

struct AttnShape {
  std::int64_t batch = 1, heads = 1, seq = 128, head_dim = 64;
  bool causal = false;
  std::vector<std::int32_t> cu_seqlens;  // varlen when non-empty: batch must be 1, seq = cu_seqlens.back()
  double scale = 0;                      // softmax scale; 0 = 1/sqrt(head_dim)
  // The op will run a backward: it plans and allocates the backward's buffers
  // too. false: the forward alone (as under torch.no_grad()), so a forward-only
  // point's memory, and where it runs out, are the forward's; an implementation
  // that plans by it refuses backward() (cpu, cuda naive).
  bool backward = true;
  bool varlen() const { return !cu_seqlens.empty(); }
  double fwd_flops() const;  // summed per sequence for varlen
};

// See Device::make_stream_pool. Destroying it synchronizes and frees the pool.
class StreamPool {
 public:
  virtual ~StreamPool() = default;
  virtual void* malloc(std::size_t bytes) = 0;  // throws OutOfMemory with the bytes asked
  virtual void free(void* p) = 0;               // stream-ordered
  virtual std::size_t reserved_high() const = 0;  // the most the pool held from the device
  virtual std::size_t used_high() const = 0;      // the most allocated from it at once
  virtual std::string impl() const = 0;
};

class AttentionOp {
 public:
  virtual ~AttentionOp() = default;
  virtual AttnShape shape() const = 0;
  virtual AttnImpl impl() const = 0;
  virtual DType dtype() const = 0;
  virtual std::string impl_detail() const = 0;  // e.g. "oneDNN matmul + softmax", "cuDNN SDPA 9.x"
  // Bytes this implementation allocates beyond Q, K, V, O, dO, dQ, dK, dV
  // (naive: S and P; flash: the log-sum-exp and tiles).
  virtual std::size_t workspace_bytes() const = 0;
  virtual void forward() = 0;   // enqueue O = softmax(scale * Q K^T [+ mask]) V
  virtual void backward() = 0;  // enqueue dQ, dK, dV from dO (after a forward)
  // Host fp32 data in the layouts above, converted to the dtype. Synchronous.
  virtual void upload(std::span<const float> q, std::span<const float> k, std::span<const float> v,
                      std::span<const float> d_o) = 0;
  // After synchronize(): O, and dQ, dK, dV (empty spans skip a tensor).
  virtual void download(std::span<float> o, std::span<float> dq, std::span<float> dk, std::span<float> dv) = 0;
  virtual bool computes() const { return true; }
};

// How a measurement treats the device's cache and the host's launch cost
// (harness/measure). Each figure records the mode that produced it.
//   warm:   ops back to back on the same operands: a small GEMM's operands
//           stay in L2, and a short op may be bound by the host's launches.
//   cold:   the device's last-level cache is flushed before each op, outside
//           its timed interval (nvbench's cold measurement, llm.c's habit).
//   hidden: a trial's ops are enqueued behind a gate that holds the stream
//           (nvbench's blocking kernel), so they run back to back on the
//           device whatever the host's launch cost: device time alone.
enum class TimingMode { warm, cold, hidden };
inline constexpr NameTable<TimingMode, 3> kTimingModeNames{{{{TimingMode::warm, "warm"}, {TimingMode::cold, "cold"}, {TimingMode::hidden, "hidden"}}}};
inline std::string_view to_string(TimingMode v) { return kTimingModeNames.name(v); }
inline std::optional<TimingMode> parse_timing_mode(std::string_view s) { return kTimingModeNames.parse(s); }

// A hold on a device's stream: work enqueued after it starts only once
// release() is called or the gate's deadline passes (then expired() is true
// after the stream has drained, and the trial it guarded is not valid).
class StreamGate {
 public:
  virtual ~StreamGate() = default;
  virtual void release() = 0;
  virtual bool expired() const = 0;
};

// An opaque timing event on the device stream.
class Event {
 public:
  virtual ~Event() = default;
};
using EventPtr = std::shared_ptr<Event>;

class Device {
 public:
  virtual ~Device() = default;
  virtual const DeviceInfo& info() const = 0;

  // Why this device cannot run a GEMM of this dtype, or nullopt if it can.
  virtual std::optional<std::string> gemm_unsupported(DType) const = 0;
  // Allocates and fills operands from seed (uniform in [-1, 1]).
  // Throws OutOfMemory, UnsupportedError.
  virtual std::unique_ptr<GemmOp> make_gemm(GemmShape, DType, std::uint64_t seed) = 0;

  // Why this device has no such attention, or nullopt if it has.
  virtual std::optional<std::string> attention_unsupported(AttnImpl, DType) const {
    return std::string("this device has no attention operations");
  }
  // Allocates Q, K, V, O, dO, dQ, dK, dV and the workspace, filled from seed.
  // Throws OutOfMemory naming the bytes needed, UnsupportedError.
  virtual std::unique_ptr<AttentionOp> make_attention(const AttnShape&, AttnImpl, DType, std::uint64_t /*seed*/) {
    throw UnsupportedError("this device has no attention operations");
  }

  // The ops a training step is built from (harness/train_ops.hpp), working
  // on tensors allocated through this device. Throws UnsupportedError where
  // the device has none.
  virtual std::unique_ptr<TrainOps> make_train_ops() {
    throw UnsupportedError("this device has no training ops");
  }

  // Device memory in use and its high-water mark, and an optional cap that
  // makes larger allocations fail with OutOfMemory (a smaller device).
  struct MemoryStats {
    std::size_t in_use = 0, peak = 0, limit = 0;  // limit 0 = none
    std::string source;                            // "allocator" or "cudaMemGetInfo"
    // what the driver says is free to allocate now (cuda: cudaMemGetInfo's
    // free, net of the context, the libraries and other processes); 0: unknown
    std::size_t driver_free = 0;
  };
  virtual MemoryStats memory_stats() const { return {}; }
  // A stream-ordered pool of the device's memory (cuda: a cudaMemPool used
  // through cudaMallocFromPoolAsync / cudaFreeAsync on the device's stream,
  // release threshold unlimited, as PyTorch's cudaMallocAsync backend keeps
  // it), capped at max_bytes (0: the driver's default); nullptr where the
  // device has none. For the memory scenario's comparison with the caching
  // allocator: the same mallocs and frees, what the pool reserved at its peak.
  virtual std::unique_ptr<StreamPool> make_stream_pool(std::size_t /*max_bytes*/) { return nullptr; }
  virtual void reset_peak_memory() {}
  virtual void set_memory_limit(std::size_t /*bytes, 0 = none*/) {}

  // The host CPUs the device's own compute runs on, so that a host loader
  // can keep off them. The cpu device pins its compute thread (and its
  // OpenMP team) to the first `threads` CPUs this process may use and
  // returns them; threads <= 0 gives it every CPU again (returned too).
  // Devices that compute elsewhere (cuda, sim) use no host CPU for it:
  // they return an empty list.
  virtual std::vector<int> reserve_host_cpus(int /*threads*/) { return {}; }
  // Of the CPUs the last reserve_host_cpus returned, those another stallbench
  // process had claimed for its compute first (cpu: CpuClaims): figures timed
  // on them contend with that process. Empty where none (or none used).
  virtual std::vector<int> shared_host_cpus() const { return {}; }

  // Throws OutOfMemory when the allocation fails.
  virtual Buffer allocate(std::size_t bytes, MemKind kind) = 0;
  // Enqueue a copy of bytes from a host buffer to a device buffer.
  virtual void copy_h2d(Buffer& dst, const Buffer& src, std::size_t bytes) = 0;
  // The same from host memory the caller owns (a loader's staging slot);
  // src_kind says whether it is pinned. It must stay valid until the copy
  // has completed (wait_event on an event recorded after it).
  void copy_h2d_from(Buffer& dst, const void* src, std::size_t bytes, MemKind src_kind) {
    const Buffer view(const_cast<void*>(src), bytes, src_kind, nullptr);  // not owned: never freed
    copy_h2d(dst, view, bytes);
  }

  // Enqueue a flush of the device's last-level cache (cold timing): writes a
  // buffer larger than the cache, made on first use. Returns the bytes it
  // writes; 0 when the device has no cache to flush (sim's roofline).
  virtual std::size_t flush_cache() { return 0; }
  // Hold the stream until the gate is released or `deadline` passes (hidden
  // timing). Throws UnsupportedError where the device cannot.
  virtual std::unique_ptr<StreamGate> hold_stream(std::chrono::milliseconds /*deadline*/) {
    throw UnsupportedError("this device cannot hold its stream (timing=hidden)");
  }

  virtual EventPtr record() = 0;
  // Milliseconds between two recorded events; both must have completed.
  virtual double elapsed_ms(const EventPtr& start, const EventPtr& stop) = 0;
  // Wait for all enqueued work; throws HangError naming the device and the
  // timeout when the stream makes no progress in time.
  virtual void synchronize(std::chrono::milliseconds timeout) = 0;
  // Wait until one recorded event has completed (work before it is done);
  // throws HangError on timeout. Lets a host reuse a staging buffer.
  virtual void wait_event(const EventPtr& e, std::chrono::milliseconds timeout) = 0;

  // The utilization a user would see; nullptr when the device has no probe.
  virtual std::unique_ptr<UtilProbe> utilization_probe() = 0;

  // Name a host phase for profilers (NVTX ranges on cuda, so Nsight Systems
  // shows it); a no-op where no profiler listens.
  virtual void range_push(const char* /*name*/) {}
  virtual void range_pop() {}
  // --trace: record this device's work, ranges and memory into t (a Kineto
  // trace, harness/kineto_trace.hpp); null stops. Devices that cannot time
  // their kernels (cuda: that needs CUPTI) record nothing but their ranges.
  virtual void set_trace(KinetoTrace* /*t*/) {}
};

// A family of devices (cpu, cuda) that the CLI can list and open.
struct Backend {
  std::string name;  // "cpu", "cuda"
  // Devices found; empty with unavailable() set when the backend has none.
  std::function<std::vector<DeviceInfo>()> list;
  // Why no device of this backend can be used (e.g. "cudaErrorNoDevice"), or "".
  std::function<std::string()> unavailable;
  // Opens device index; throws UsageError for an index that does not exist.
  std::function<std::unique_ptr<Device>(int index)> open;
  // Library versions this backend reports (runtime, driver, cuBLAS, oneDNN, ...).
  std::function<nlohmann::ordered_json()> versions;
};

}  // namespace sb
