// The `cuda:N` device: one non-blocking stream per device, GEMMs through
// cuBLASLt (cuda_gemm.cpp), attention through cuBLAS + softmax kernels
// (attention_naive.cpp) and cuDNN SDPA (cudnn_sdpa.cpp), utilization through
// NVML (nvml_probe.cpp), host phases as NVTX ranges. Every cudaMalloc goes
// through allocate(), whose ledger gives memory_stats() and enforces
// set_memory_limit().
//
// Runtime API only: this file never calls the driver API (cu*) and the
// library never links -lcuda, so a machine without a driver still runs the
// binary and reports why no GPU is usable.
#include "kernels/cuda/cuda_backend.hpp"

#include <algorithm>  // std::min
#include <atomic>     // std::atomic_thread_fence
#include <chrono>     // std::chrono::steady_clock
#include <cstdint>    // std::uint64_t
#include <cstdlib>    // std::malloc, std::free
#include <memory>     // std::unique_ptr, std::make_shared, std::shared_ptr
#include <mutex>      // std::mutex, std::lock_guard
#include <optional>   // std::optional
#include <string>     // std::string
#include <thread>     // std::this_thread::sleep_for
#include <vector>     // std::vector

#include <cublasLt.h>         // cublasLtCreate, cublasLtGetVersion
#include <cublas_v2.h>        // cublasCreate, cublasSetStream, cublasSetWorkspace: naive attention's GEMMs
#include <cuda_runtime.h>     // cudaMalloc, cudaStream*, cudaEvent*, device queries
#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::ordered_json: props, versions
#include <nvtx3/nvToolsExt.h>  // nvtxRangePushA, nvtxRangePop (NVTX3: header-only, nothing to link)

#ifdef STALLBENCH_HAVE_CUDNN
#include <cudnn_graph.h>  // cudnnGetVersion
#endif
#ifdef STALLBENCH_HAVE_NCCL
#include <nccl.h>  // ncclGetVersion
#endif

#include "harness/errors.hpp"                  // OutOfMemory, HangError, UsageError, ...
#include "harness/attention_check.hpp"         // check_attention_size
#include "harness/gemm_check.hpp"              // gpu_gemm_shape_problem
#include "harness/host_memory.hpp"             // reserve_host_memory: host buffers
#include "harness/memory_ledger.hpp"           // MemoryLedger: cudaMalloc's account
#include "harness/units.hpp"                 // format_bytes
#include "kernels/cuda/detail/check.hpp"       // SB_CUDA_CHECK, SB_CUBLAS_CHECK
#include "kernels/cuda/detail/cuda_gemm.hpp"   // make_cublaslt_gemm, Owned handles, kSetupTimeout
#include "kernels/cuda/detail/cudnn_sdpa.hpp"  // make_naive_attention, make_cudnn_attention, AttnContext
#include "kernels/cuda/gate.cuh"               // launch_stream_gate
#include "kernels/cuda/nvml_probe.hpp"         // NvmlGpu
#include "harness/kineto_trace.hpp"            // KinetoTrace: --trace
#ifdef STALLBENCH_HAVE_CUPTI
#include "kernels/cuda/cupti_trace.hpp"  // CuptiTrace: --trace's kernels, copies and launches
#endif
#include "kernels/cuda/train_kernels.cuh"      // make_cuda_train_ops
#include "harness/train_ops.hpp"               // TrainOps

namespace sb {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

std::string device_id(int index) { return fmt::format("cuda:{}", index); }

// "13.0" from CUDA's 1000*major + 10*minor.
std::string cuda_version_string(int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); }
// "13.1.0" from the 10000*major + 100*minor + patch that cuBLAS, cuDNN 9 and
// NCCL >= 2.9 use.
std::string mmp_version_string(std::uint64_t v) {
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

using cuda_detail::LtHandle;
using cuda_detail::Stream;
using CublasHandle = cuda_detail::Owned<cublasHandle_t, &cublasDestroy>;

// cuBLAS's workspace for naive attention's GEMMs: 32 MiB, NVIDIA's guidance
// for Hopper (as cuda_gemm.cpp gives cuBLASLt). Set explicitly so it comes
// through allocate() and the ledger counts it.
constexpr std::size_t kCublasWorkspaceBytes = 32ull << 20;


// Device count, or why there is none. cudaGetDeviceCount is the first runtime
// call, so with no driver this is where cudaErrorInsufficientDriver (or
// cudaErrorNoDevice) shows up.
struct Probe {
  int count = 0;
  cudaError_t error = cudaSuccess;
};
Probe probe() {
  Probe p;
  p.error = cudaGetDeviceCount(&p.count);
  if (p.error != cudaSuccess) {
    p.count = 0;
    (void)cudaGetLastError();  // handled here: keep it out of later launch checks
  }
  return p;
}

DeviceInfo query_info(int index) {
  cudaDeviceProp prop{};
  SB_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  // CUDA 13 removed clockRate and memoryClockRate from cudaDeviceProp; the
  // attributes remain.
  int sm_clock_khz = 0, mem_clock_khz = 0;
  SB_CUDA_CHECK(cudaDeviceGetAttribute(&sm_clock_khz, cudaDevAttrClockRate, index));
  SB_CUDA_CHECK(cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, index));
  char pci[32] = {};
  SB_CUDA_CHECK(cudaDeviceGetPCIBusId(pci, int(sizeof(pci)), index));

  DeviceInfo info;
  info.id = device_id(index);
  info.kind = DeviceKind::cuda;
  info.name = prop.name;
  auto& p = info.props;
  p["compute_capability"] = fmt::format("{}.{}", prop.major, prop.minor);
  p["sm_count"] = prop.multiProcessorCount;
  p["memory_bytes"] = std::uint64_t(prop.totalGlobalMem);
  p["memory_bus_width_bits"] = prop.memoryBusWidth;
  p["l2_bytes"] = prop.l2CacheSize;
  p["sm_clock_khz"] = sm_clock_khz;
  p["memory_clock_khz"] = mem_clock_khz;
  p["pci_bus_id"] = std::string(pci);
  return info;
}

// Events are made once and reused (cudaEventCreate is not free, and a cold
// or hidden trial records hundreds): an event returns to its device's pool
// when the last EventPtr to it goes.
struct EventPool {
  std::mutex mu;
  std::vector<cudaEvent_t> free;
  ~EventPool() {
    for (cudaEvent_t e : free) (void)cudaEventDestroy(e);
  }
};

class CudaEvent final : public Event {
 public:
  CudaEvent(cudaEvent_t e, std::shared_ptr<EventPool> pool) : event(e), pool_(std::move(pool)) {}
  ~CudaEvent() override {
    const std::lock_guard<std::mutex> lock(pool_->mu);
    pool_->free.push_back(event);
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t event;

 private:
  std::shared_ptr<EventPool> pool_;
};

// timing=hidden: the gate kernel (gate.cu) on the device's stream, released
// by raising a counter in mapped pinned memory that the device owns.
class CudaGate final : public StreamGate {
 public:
  CudaGate(volatile std::uint64_t* release, const volatile std::uint64_t* timed_out, std::uint64_t ticket)
      : release_(release), timed_out_(timed_out), ticket_(ticket) {}
  ~CudaGate() override { release(); }  // never leave the stream held
  CudaGate(const CudaGate&) = delete;
  CudaGate& operator=(const CudaGate&) = delete;
  void release() override {
    if (released_) return;
    released_ = true;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (*release_ < ticket_) *release_ = ticket_;  // monotonic: earlier gates stay released
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  // Read after the stream has drained past the gate.
  bool expired() const override { return *timed_out_ >= ticket_; }

 private:
  volatile std::uint64_t* release_;
  const volatile std::uint64_t* timed_out_;
  std::uint64_t ticket_;
  bool released_ = false;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int index) : index_(index), info_(query_info(index)) {
    ledger_ = std::make_shared<MemoryLedger>(info_.id);
    bind();
    SB_CUDA_CHECK(cudaDeviceGetAttribute(&cc_major_, cudaDevAttrComputeCapabilityMajor, index));
    SB_CUDA_CHECK(cudaDeviceGetAttribute(&cc_minor_, cudaDevAttrComputeCapabilityMinor, index));
    // Non-blocking: the stream does not serialize with the legacy default
    // stream, so library calls elsewhere cannot stall what is timed here.
    cudaStream_t s = nullptr;
    SB_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    stream_.reset(s);
    cublasLtHandle_t h = nullptr;
    SB_CUBLAS_CHECK(cublasLtCreate(&h));
    lt_.reset(h);
    // NVML is optional: without it (no driver library, a container without
    // NVML, a MIG instance) the device works and has no utilization probe.
    std::string why;
    nvml_ = NvmlGpu::open(info_.props["pci_bus_id"].get<std::string>(), why);
    info_.props["nvml"] = nvml_ ? nvml_->describe() : nlohmann::ordered_json{{"status", "unavailable"}, {"reason", why}};
  }

  const DeviceInfo& info() const override { return info_; }

  std::optional<std::string> gemm_unsupported(DType dtype) const override {
    const int cc = cc_major_ * 10 + cc_minor_;
    // Below sm_80 cuBLAS silently runs a "tf32" GEMM in plain fp32, which
    // would mislabel the measurement.
    if (dtype == DType::tf32 && cc < 80)
      return fmt::format("tf32 tensor cores need compute capability 8.0 or newer ({} is {}.{})",
                         info_.id, cc_major_, cc_minor_);
    if (dtype == DType::fp8_e4m3 && cc < 90)
      return fmt::format(
          "fp8_e4m3 GEMM needs compute capability 9.0 or newer ({} is {}.{})", info_.id,
          cc_major_, cc_minor_);
    return std::nullopt;
  }

  std::unique_ptr<GemmOp> make_gemm(GemmShape shape, DType dtype, std::uint64_t seed) override;

  std::optional<std::string> attention_unsupported(AttnImpl impl, DType dtype) const override {
    switch (impl) {
      case AttnImpl::naive:
      case AttnImpl::naive_prealloc:
        if (dtype == DType::fp32 || dtype == DType::bf16 || dtype == DType::fp16) return std::nullopt;
        return fmt::format("naive attention on {} runs in fp32, bf16 or fp16, not {}", info_.id, to_string(dtype));
      case AttnImpl::flash:
        return std::string("no hand-written flash attention on cuda: the fused kernel here is cuDNN SDPA (cudnn)");
      case AttnImpl::cudnn:
#ifdef STALLBENCH_HAVE_CUDNN
        if (dtype == DType::fp32 || dtype == DType::tf32) return std::string("cuDNN has no fp32 SDPA");
        if (dtype == DType::fp8_e4m3)
          return std::string("fp8 SDPA (with descale and amax tensors) is not implemented here");
        if (cc_major_ < 8)
          return fmt::format("cuDNN SDPA needs compute capability 8.0 or newer ({} is {}.{})", info_.id, cc_major_,
                             cc_minor_);
        return std::nullopt;
#else
        return std::string("built without cudnn-frontend (pip install nvidia-cudnn-frontend, reconfigure)");
#endif
    }
    return std::string("unknown attention implementation");
  }

  std::unique_ptr<AttentionOp> make_attention(const AttnShape& shape, AttnImpl impl, DType dtype,
                                              std::uint64_t seed) override;

  // cuBLAS GEMMs and the kernels of train_kernels.cu (train_ops.cpp).
  std::unique_ptr<TrainOps> make_train_ops() override {
    return cuda_detail::make_cuda_train_ops({this, index_, stream(), lt(), info_.id});
  }

  // The ledger's figures; the source also gives the driver's view
  // (cudaMemGetInfo), which includes what libraries and the context hold
  // outside allocate().
  MemoryStats memory_stats() const override {
    bind();
    std::size_t free = 0, total = 0;
    const cudaError_t s = cudaMemGetInfo(&free, &total);
    std::string source =
        s == cudaSuccess
            ? fmt::format("allocator (cudaMalloc through {}); cudaMemGetInfo: {} free of {}", info_.id,
                          format_bytes(double(free)), format_bytes(double(total)))
            : fmt::format("allocator (cudaMalloc through {}); cudaMemGetInfo: {}", info_.id, cudaGetErrorName(s));
    (void)cudaGetLastError();
    MemoryStats m = ledger_->stats(std::move(source));
    if (s == cudaSuccess) m.driver_free = free;
    return m;
  }
  // A cudaMemPool on this device, used on its stream (cudaMallocAsync's
  // allocator, as PyTorch's backend:cudaMallocAsync uses the device's pool).
  // Outside the ledger: the memory scenario caps it by max_bytes instead.
  class CudaStreamPool : public StreamPool {
   public:
    CudaStreamPool(int index, cudaStream_t stream, std::size_t max_bytes) : index_(index), stream_(stream) {
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.handleTypes = cudaMemHandleTypeNone;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = index;
      props.maxSize = max_bytes;
      SB_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
      std::uint64_t keep = ~std::uint64_t(0);  // never trim at synchronization
      const cudaError_t s = cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep);
      if (s != cudaSuccess) {  // the destructor does not run for a constructor that throws
        (void)cudaMemPoolDestroy(pool_);
        SB_CUDA_CHECK(s);
      }
    }
    ~CudaStreamPool() override {
      // Polled with a deadline, not cudaStreamSynchronize: a stream wedged by a hung kernel would hold the
      // process here for ever. Past the deadline the pool is left to the context's teardown.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      cudaError_t q = cudaStreamQuery(stream_);
      while (q == cudaErrorNotReady && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        q = cudaStreamQuery(stream_);
      }
      if (q != cudaErrorNotReady) (void)cudaMemPoolDestroy(pool_);
      (void)cudaGetLastError();
    }
    void* malloc(std::size_t bytes) override {
      void* p = nullptr;
      const cudaError_t s = cudaMallocFromPoolAsync(&p, bytes, pool_, stream_);
      if (s == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        throw OutOfMemory(fmt::format("cuda:{}: out of memory: cudaMallocFromPoolAsync of {} bytes ({}) failed; the "
                                      "pool holds {}",
                                      index_, bytes, format_bytes(double(bytes)), format_bytes(double(reserved_or_zero()))));
      }
      SB_CUDA_CHECK(s);
      return p;
    }
    void free(void* p) override { SB_CUDA_CHECK(cudaFreeAsync(p, stream_)); }
    std::size_t reserved_high() const override { return attr(cudaMemPoolAttrReservedMemHigh); }
    std::size_t used_high() const override { return attr(cudaMemPoolAttrUsedMemHigh); }
    std::string impl() const override { return "cudaMemPool (cudaMallocFromPoolAsync / cudaFreeAsync)"; }

   private:
    // for an out-of-memory message only: a failed read must not replace the out-of-memory
    std::size_t reserved_or_zero() const {
      std::uint64_t v = 0;
      if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &v) != cudaSuccess) (void)cudaGetLastError();
      return std::size_t(v);
    }
    // A figure that is published: a failed read is an error (the memory scenario records it beside the
    // pool's figures), never a 0 that would read as a pool holding nothing.
    std::size_t attr(cudaMemPoolAttr a) const {
      std::uint64_t v = 0;
      SB_CUDA_CHECK(cudaMemPoolGetAttribute(pool_, a, &v));
      return std::size_t(v);
    }
    int index_;
    cudaStream_t stream_;
    cudaMemPool_t pool_ = nullptr;
  };
  std::unique_ptr<StreamPool> make_stream_pool(std::size_t max_bytes) override {
    bind();
    int supported = 0;
    if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, index_) != cudaSuccess || !supported) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return std::make_unique<CudaStreamPool>(index_, stream(), max_bytes);
  }
  void reset_peak_memory() override { ledger_->reset_peak(); }
  void set_memory_limit(std::size_t bytes) override { ledger_->set_limit(bytes); }

  Buffer allocate(std::size_t bytes, MemKind kind) override {
    void* p = nullptr;
    switch (kind) {
      case MemKind::device: {
        bind();
        ledger_->book(bytes, fmt::format("cudaMalloc of {} bytes", bytes));
        const cudaError_t s = cudaMalloc(&p, bytes);
        if (s != cudaSuccess) {
          ledger_->release(bytes);
          fail_alloc(s, "cudaMalloc", bytes, kind);
        }
        const int index = index_;
        return Buffer(p, bytes, kind, [index, bytes, ledger = ledger_](void* q) {
          // cudaFree needs no particular current device under unified
          // addressing, but binding keeps the release correct if that changes;
          // the caller's device is restored.
          int prev = 0;
          const bool restore = cudaGetDevice(&prev) == cudaSuccess && prev != index;
          if (restore) (void)cudaSetDevice(index);
          (void)cudaFree(q);
          if (restore) (void)cudaSetDevice(prev);
          ledger->release(bytes);
        });
      }
      case MemKind::host_pinned: {
        bind();
        auto host = std::make_shared<HostReservation>(
            reserve_host_memory(bytes, fmt::format("{}: a pinned host buffer", info_.id)));
        const cudaError_t s = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
        if (s != cudaSuccess) fail_alloc(s, "cudaHostAlloc", bytes, kind);
        return Buffer(p, bytes, kind, [host](void* q) { (void)cudaFreeHost(q); });
      }
      case MemKind::host_pageable: {
        auto host = std::make_shared<HostReservation>(
            reserve_host_memory(bytes, fmt::format("{}: a pageable host buffer", info_.id)));
        p = std::malloc(bytes == 0 ? 1 : bytes);
        if (p == nullptr)
          throw OutOfMemory(fmt::format("{}: out of memory: malloc of {} bytes ({}) failed",
                                        info_.id, bytes, format_bytes(double(bytes))));
        return Buffer(p, bytes, kind, [host](void* q) { std::free(q); });
      }
    }
    throw Error(ErrorKind::runtime, fmt::format("{}: allocate: unknown MemKind", info_.id));
  }

  void copy_h2d(Buffer& dst, const Buffer& src, std::size_t bytes) override {
    if (dst.kind() != MemKind::device || src.kind() == MemKind::device)
      throw Error(ErrorKind::runtime,
                  fmt::format("{}: copy_h2d needs a host source and a device destination",
                              info_.id));
    if (bytes > dst.bytes() || bytes > src.bytes())
      throw Error(ErrorKind::runtime,
                  fmt::format("{}: copy_h2d of {} bytes exceeds a buffer (src {}, dst {})",
                              info_.id, bytes, src.bytes(), dst.bytes()));
    bind();
    // From pageable memory the runtime stages through its own pinned buffer
    // and returns only once staged: the host-blocking copy that pinned memory
    // avoids, which is what the dataloader scenario measures.
    SB_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyHostToDevice,
                                  stream()));
  }

  // timing=cold: a memset of twice the L2 over a buffer made on first use
  // (nvbench flushes with one L2-sized memset; twice leaves no doubt).
  std::size_t flush_cache() override {
    bind();
    if (flush_buf_.data() == nullptr) {
      int l2 = 0;
      SB_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, index_));
      flush_buf_ = allocate(2 * std::size_t(l2 > 0 ? l2 : 64 << 20), MemKind::device);
    }
    ++flush_value_;
    SB_CUDA_CHECK(cudaMemsetAsync(flush_buf_.data(), flush_value_ & 0xff, flush_buf_.bytes(), stream()));
    return flush_buf_.bytes();
  }

  std::unique_ptr<StreamGate> hold_stream(milliseconds deadline) override {
    bind();
    if (gate_mem_.data() == nullptr) {
      // Two counters, zeroed: [0] release (host writes), [1] timed_out (device writes).
      void* p = nullptr;
      SB_CUDA_CHECK(cudaHostAlloc(&p, 2 * sizeof(std::uint64_t), cudaHostAllocMapped));
      gate_mem_ = Buffer(p, 2 * sizeof(std::uint64_t), MemKind::host_pinned, [](void* q) { (void)cudaFreeHost(q); });
      auto* c = static_cast<volatile std::uint64_t*>(p);
      c[0] = 0;
      c[1] = 0;
      SB_CUDA_CHECK(cudaHostGetDevicePointer(&gate_dev_, p, 0));
    }
    auto* host = static_cast<volatile std::uint64_t*>(gate_mem_.data());
    auto* dev = static_cast<std::uint64_t*>(gate_dev_);
    const std::uint64_t ticket = ++gate_ticket_;
    cuda_kernels::launch_stream_gate(dev, dev + 1, ticket,
                                     std::uint64_t(std::chrono::nanoseconds(deadline).count()), stream());
    return std::make_unique<CudaGate>(host, host + 1, ticket);
  }

  EventPtr record() override {
    bind();
    cudaEvent_t e = nullptr;
    {
      const std::lock_guard<std::mutex> lock(events_->mu);
      if (!events_->free.empty()) {
        e = events_->free.back();
        events_->free.pop_back();
      }
    }
    if (e == nullptr) SB_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));  // timing enabled
    auto event = std::make_shared<CudaEvent>(e, events_);
    SB_CUDA_CHECK(cudaEventRecord(event->event, stream()));
    return event;
  }

  double elapsed_ms(const EventPtr& start, const EventPtr& stop) override {
    const auto* a = dynamic_cast<const CudaEvent*>(start.get());
    const auto* b = dynamic_cast<const CudaEvent*>(stop.get());
    if (a == nullptr || b == nullptr)
      throw Error(ErrorKind::runtime,
                  fmt::format("{}: elapsed_ms: events were not recorded by a cuda device",
                              info_.id));
    float ms = 0;  // resolution about 0.5 us
    SB_CUDA_CHECK(cudaEventElapsedTime(&ms, a->event, b->event));
    return double(ms);
  }

  // Polls instead of cudaStreamSynchronize, which would block forever on a
  // kernel or collective that never finishes; stallbench must always return.
  void synchronize(milliseconds timeout) override {
    bind();
    poll_until_done([this] { return cudaStreamQuery(stream()); }, "cudaStreamQuery(stream)", timeout,
                    "stream made no progress", "work enqueued on the device stream has not completed");
  }

  // Polls cudaEventQuery for the same reason (cudaEventSynchronize cannot time out).
  void wait_event(const EventPtr& e, milliseconds timeout) override {
    const auto* ce = dynamic_cast<const CudaEvent*>(e.get());
    if (ce == nullptr)
      throw Error(ErrorKind::runtime,
                  fmt::format("{}: wait_event: the event was not recorded by a cuda device", info_.id));
    bind();
    const cudaEvent_t ev = ce->event;
    poll_until_done([ev] { return cudaEventQuery(ev); }, "cudaEventQuery(event)", timeout,
                    "event not reached", "work enqueued before the event has not completed");
  }

  // NVML's view, as nvidia-smi shows it; nullptr when NVML is unavailable
  // (props["nvml"] says why).
  std::unique_ptr<UtilProbe> utilization_probe() override { return NvmlGpu::probe(nvml_); }

  // NVTX ranges nest per thread; Nsight Systems shows them on the host
  // timeline. With no tool attached each call returns at once.
  void range_push(const char* name) override {
    nvtxRangePushA(name);
    if (trace_) trace_->push(name);
  }
  void range_pop() override {
    nvtxRangePop();
    if (trace_) trace_->pop();
  }

  // --trace: host ranges and the ledger's bytes here; the GPU's kernels, copies, memsets and the
  // runtime calls that launched them from CUPTI (kernels/cuda/cupti_trace.cpp). Null flushes
  // CUPTI's buffers into the trace and stops. Compiled, never run on a GPU.
  void set_trace(KinetoTrace* t) override {
#ifdef STALLBENCH_HAVE_CUPTI
    cupti_.reset();
#endif
    trace_ = t;
    ledger_->set_trace(t);
    if (!t) return;
    std::string note = "a cuda device: kernels, copies, memsets and runtime calls from CUPTI's activity API";
#ifdef STALLBENCH_HAVE_CUPTI
    std::string why;
    bind();
    cupti_ = CuptiTrace::start(*t, why);
    if (!cupti_) note = "a cuda device: host ranges and memory only, no GPU events: " + why;
#else
    note = "a cuda device: host ranges and memory only (built without CUPTI's headers): no GPU events";
#endif
    t->set_device(info_.name, std::int64_t(info_.props.value("memory_bytes", std::uint64_t(0))), cc_major_, note);
  }

  void bind() const { SB_CUDA_CHECK(cudaSetDevice(index_)); }
  cudaStream_t stream() const { return stream_.get(); }
  cublasLtHandle_t lt() const { return lt_.get(); }

 private:
  // Polls query() until it returns cudaSuccess; cudaErrorNotReady means not
  // yet, anything else is a failure. Starts with short naps so a quick op
  // returns within microseconds, and backs off to 1 ms so a long wait costs
  // no CPU worth measuring.
  template <class Query>
  void poll_until_done(Query query, const char* call, milliseconds timeout, const char* what,
                       const char* detail) const {
    const auto deadline = steady_clock::now() + timeout;
    auto nap = std::chrono::microseconds(20);
    for (;;) {
      const cudaError_t s = query();
      if (s == cudaSuccess) return;
      if (s != cudaErrorNotReady)
        throw_call_failure(cuda_detail::cuda_kind(s), "CUDA", call, cuda_detail::cuda_name(s), __FILE__,
                           __LINE__);
      if (steady_clock::now() >= deadline)
        throw HangError(fmt::format("{}: {} within {:g} s ({}; a kernel or collective may be stuck)", info_.id,
                                    what, double(timeout.count()) / 1000.0, detail));
      std::this_thread::sleep_for(nap);
      nap = std::min<std::chrono::microseconds>(nap * 2, 1ms);
    }
  }


  cuda_detail::AttnContext attn_context() { return {this, index_, stream(), info_.id}; }

  // Made on first use, so a run without attention pays neither the handle
  // nor its workspace.
  cublasHandle_t cublas() {
    const std::lock_guard<std::mutex> lock(lazy_mu_);
    if (!cublas_) {
      bind();
      cublasHandle_t h = nullptr;
      SB_CUBLAS_CHECK(cublasCreate(&h));
      CublasHandle owned(h);
      // cublasSetStream resets the workspace to cuBLAS's own pool, so the
      // stream comes first and our workspace after it.
      SB_CUBLAS_CHECK(cublasSetStream(h, stream()));
      cublas_workspace_ = allocate(kCublasWorkspaceBytes, MemKind::device);
      SB_CUBLAS_CHECK(cublasSetWorkspace(h, cublas_workspace_.data(), cublas_workspace_.bytes()));
      cublas_ = std::move(owned);
    }
    return cublas_.get();
  }

#ifdef STALLBENCH_HAVE_CUDNN
  std::shared_ptr<cuda_detail::CudnnSdpa> cudnn() {
    const std::lock_guard<std::mutex> lock(lazy_mu_);
    if (!cudnn_) cudnn_ = cuda_detail::make_cudnn_sdpa(attn_context());
    return cudnn_;
  }
#endif

  [[noreturn]] void fail_alloc(cudaError_t s, const char* call, std::size_t bytes,
                               MemKind kind) const {
    (void)cudaGetLastError();  // handled here: keep it out of later launch checks
    if (s != cudaErrorMemoryAllocation)
      throw_call_failure(cuda_detail::cuda_kind(s), "CUDA", call, cuda_detail::cuda_name(s),
                         __FILE__, __LINE__);
    std::string where = "pinned host memory";
    if (kind == MemKind::device) {
      std::size_t free = 0, total = 0;
      if (cudaMemGetInfo(&free, &total) == cudaSuccess)
        where = fmt::format("device has {} free of {}", format_bytes(double(free)),
                            format_bytes(double(total)));
      else
        where = "device free memory unknown";
      (void)cudaGetLastError();
    }
    throw OutOfMemory(fmt::format("{}: out of memory: {} of {} bytes ({}) -> {}; {}", info_.id,
                                  call, bytes, format_bytes(double(bytes)),
                                  cuda_detail::cuda_name(s), where));
  }

  // Declared in the order they may be destroyed last-to-first: the
  // libraries' handles go before the stream they are bound to, and the ledger
  // (shared with every Buffer's release) outlives them all.
  // What this device has allocated and not yet released; shared with every
  // Buffer's release, so a buffer that outlives its device settles its account.
  std::shared_ptr<MemoryLedger> ledger_;
  int index_;
  DeviceInfo info_;
  int cc_major_ = 0, cc_minor_ = 0;
  Stream stream_;
  LtHandle lt_;
  std::shared_ptr<NvmlGpu> nvml_;  // nullptr when NVML is unavailable
  KinetoTrace* trace_ = nullptr;   // --trace, when asked
#ifdef STALLBENCH_HAVE_CUPTI
  std::unique_ptr<CuptiTrace> cupti_;
#endif
  std::mutex lazy_mu_;             // guards the lazily made handles below
  Buffer cublas_workspace_;
  CublasHandle cublas_;
  std::shared_ptr<EventPool> events_ = std::make_shared<EventPool>();  // outlived by events still held
  Buffer flush_buf_;                // timing=cold's memset target, made on first use
  unsigned flush_value_ = 0;        // a new byte each flush, so no memset is ever a no-op
  Buffer gate_mem_;                 // timing=hidden's counters (mapped pinned), made on first use
  void* gate_dev_ = nullptr;        // their device view
  std::uint64_t gate_ticket_ = 0;   // the last gate's ticket
#ifdef STALLBENCH_HAVE_CUDNN
  std::shared_ptr<cuda_detail::CudnnSdpa> cudnn_;  // ops share it, so it lives as long as the last of them
#endif
};

std::unique_ptr<GemmOp> CudaDevice::make_gemm(GemmShape shape, DType dtype, std::uint64_t seed) {
  if (auto why = gemm_unsupported(dtype)) throw UnsupportedError(*why);
  if (shape.m <= 0 || shape.n <= 0 || shape.k <= 0)
    throw Error(ErrorKind::runtime, fmt::format("{}: GEMM shape M={} N={} K={} is not positive",
                                                info_.id, shape.m, shape.n, shape.k));
  if (auto why = gpu_gemm_shape_problem(dtype, shape)) throw UnsupportedError(info_.id + ": " + *why);
  const cuda_detail::GemmContext ctx{this, index_, stream(), lt(), info_.id};
  return cuda_detail::make_cublaslt_gemm(ctx, shape, dtype, seed);
}

std::unique_ptr<AttentionOp> CudaDevice::make_attention(const AttnShape& shape, AttnImpl impl, DType dtype,
                                                       std::uint64_t seed) {
  if (auto why = attention_unsupported(impl, dtype)) throw UnsupportedError(*why);
  check_attention_size(shape);  // OutOfMemory naming the bytes, before any size arithmetic can wrap
  switch (impl) {
    case AttnImpl::naive:
    case AttnImpl::naive_prealloc:
      return cuda_detail::make_naive_attention(attn_context(), cublas(), shape, impl, dtype, seed);
    case AttnImpl::cudnn:
#ifdef STALLBENCH_HAVE_CUDNN
      return cuda_detail::make_cudnn_attention(attn_context(), cudnn(), shape, dtype, seed);
#else
      break;  // attention_unsupported has said why
#endif
    case AttnImpl::flash: break;
  }
  throw UnsupportedError(fmt::format("{}: no {} attention", info_.id, to_string(impl)));
}

nlohmann::ordered_json cuda_versions() {
  // C APIs only, none of which needs a GPU or a driver: safe on any machine.
  nlohmann::ordered_json v = nlohmann::ordered_json::object();
  int rt = 0;
  const cudaError_t rs = cudaRuntimeGetVersion(&rt);
  v["cuda_runtime"] = rs == cudaSuccess ? cuda_version_string(rt) : cudaGetErrorName(rs);
  int drv = 0;
  const cudaError_t ds = cudaDriverGetVersion(&drv);
  if (ds != cudaSuccess)
    v["cuda_driver"] = cudaGetErrorName(ds);
  else
    v["cuda_driver"] = drv == 0 ? std::string("none") : cuda_version_string(drv);  // 0: no driver
  (void)cudaGetLastError();
  v["cublasLt"] = mmp_version_string(cublasLtGetVersion());
#ifdef STALLBENCH_HAVE_CUDNN
  v["cudnn"] = mmp_version_string(cudnnGetVersion());
  v["cudnn_frontend"] = cuda_detail::cudnn_frontend_version();
#endif
#ifdef STALLBENCH_HAVE_NCCL
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess)
    v["nccl"] = mmp_version_string(std::uint64_t(nccl));
  else
    v["nccl"] = "unknown";
#endif
  return v;
}

}  // namespace

Backend make_cuda_backend() {
  Backend b;
  b.name = "cuda";
  b.list = [] {
    std::vector<DeviceInfo> out;
    const Probe p = probe();
    for (int i = 0; i < p.count; ++i) out.push_back(query_info(i));
    return out;
  };
  b.unavailable = []() -> std::string {
    const Probe p = probe();
    if (p.error != cudaSuccess) return fmt::format("no CUDA device: {}", cudaGetErrorName(p.error));
    if (p.count == 0) return "no CUDA device: 0 devices";
    return "";
  };
  b.open = [](int index) -> std::unique_ptr<Device> {
    const Probe p = probe();
    if (index < 0 || index >= p.count) {
      const std::string why =
          p.error != cudaSuccess ? std::string(cudaGetErrorName(p.error))
          : p.count == 0         ? std::string("no device visible")
                                 : fmt::format("valid: cuda:0 to cuda:{}", p.count - 1);
      throw UsageError(
          fmt::format("no device cuda:{}: {} CUDA devices found ({})", index, p.count, why));
    }
    return std::make_unique<CudaDevice>(index);
  };
  b.versions = [] { return cuda_versions(); };
  return b;
}

}  // namespace sb
