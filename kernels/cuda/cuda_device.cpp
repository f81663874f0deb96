// The `cuda:N` device: one non-blocking stream per device, GEMMs through
// cuBLASLt, operand preparation through the kernels in fill.cu.
//
// Runtime API only: this file never calls the driver API (cu*) and the
// library never links -lcuda, so a machine without a driver still runs the
// binary and reports why no GPU is usable.
#include "kernels/cuda/cuda_backend.hpp"

#include <algorithm>    // std::min
#include <chrono>       // std::chrono::steady_clock
#include <cstdint>      // std::int32_t, std::uint32_t, std::uint64_t
#include <cstdlib>      // std::malloc, std::free
#include <memory>       // std::unique_ptr, std::make_shared
#include <optional>     // std::optional
#include <string>       // std::string
#include <thread>       // std::this_thread::sleep_for
#include <type_traits>  // std::remove_pointer_t
#include <vector>       // std::vector

#include <cublasLt.h>      // cublasLt*: handle, descriptors, heuristic, matmul
#include <cuda_runtime.h>  // cudaMalloc, cudaStream*, cudaEvent*, device queries
#include <fmt/format.h>    // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::ordered_json: props, versions

#ifdef STALLBENCH_HAVE_CUDNN
#include <cudnn_graph.h>  // cudnnGetVersion
#endif
#ifdef STALLBENCH_HAVE_NCCL
#include <nccl.h>  // ncclGetVersion
#endif

#include "harness/errors.hpp"             // OutOfMemory, HangError, UsageError, ...
#include "kernels/cuda/detail/check.hpp"  // SB_CUDA_CHECK, SB_CUBLAS_CHECK
#include "kernels/cuda/fill.cuh"          // fill_uniform, convert_from_fp32, convert_to_fp32

namespace sb {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

// cuBLASLt heuristics on Hopper assume a 32 MiB workspace (NVIDIA's guidance
// for sm_90); smaller ones rule out some split-K and stream-K kernels.
constexpr std::size_t kWorkspaceBytes = 32ull << 20;

// Bound for the waits the interface gives no timeout to: make_gemm, upload and
// download_c are setup and checking steps, never timed, and a healthy GPU
// finishes them in milliseconds.
constexpr milliseconds kSetupTimeout = 60s;

std::string device_id(int index) { return fmt::format("cuda:{}", index); }

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 5) {
    bytes /= 1024.0;
    ++u;
  }
  return fmt::format("{:.1f} {}", bytes, units[u]);
}

// "13.0" from CUDA's 1000*major + 10*minor.
std::string cuda_version_string(int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); }
// "13.1.0" from the 10000*major + 100*minor + patch that cuBLAS, cuDNN 9 and
// NCCL >= 2.9 use.
std::string mmp_version_string(std::uint64_t v) {
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

// RAII for the cuBLASLt handle and descriptors (all pointer typedefs).
template <auto Destroy>
struct Destroyer {
  template <class P>
  void operator()(P p) const noexcept {
    (void)Destroy(p);  // nothing useful to do with a failed destroy
  }
};
template <class Handle, auto Destroy>
using Owned = std::unique_ptr<std::remove_pointer_t<Handle>, Destroyer<Destroy>>;
using LtHandle = Owned<cublasLtHandle_t, &cublasLtDestroy>;
using MatmulDesc = Owned<cublasLtMatmulDesc_t, &cublasLtMatmulDescDestroy>;
using MatrixLayout = Owned<cublasLtMatrixLayout_t, &cublasLtMatrixLayoutDestroy>;
using MatmulPref = Owned<cublasLtMatmulPreference_t, &cublasLtMatmulPreferenceDestroy>;
using Stream = Owned<cudaStream_t, &cudaStreamDestroy>;

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

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(cudaEvent_t e) : event(e) {}
  ~CudaEvent() override { (void)cudaEventDestroy(event); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t event;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int index) : index_(index), info_(query_info(index)) {
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

  Buffer allocate(std::size_t bytes, MemKind kind) override {
    void* p = nullptr;
    switch (kind) {
      case MemKind::device: {
        bind();
        const cudaError_t s = cudaMalloc(&p, bytes);
        if (s != cudaSuccess) fail_alloc(s, "cudaMalloc", bytes, kind);
        const int index = index_;
        return Buffer(p, bytes, kind, [index](void* q) {
          // cudaFree needs no particular current device under unified
          // addressing, but binding keeps the release correct if that changes;
          // the caller's device is restored.
          int prev = 0;
          const bool restore = cudaGetDevice(&prev) == cudaSuccess && prev != index;
          if (restore) (void)cudaSetDevice(index);
          (void)cudaFree(q);
          if (restore) (void)cudaSetDevice(prev);
        });
      }
      case MemKind::host_pinned: {
        bind();
        const cudaError_t s = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
        if (s != cudaSuccess) fail_alloc(s, "cudaHostAlloc", bytes, kind);
        return Buffer(p, bytes, kind, [](void* q) { (void)cudaFreeHost(q); });
      }
      case MemKind::host_pageable: {
        p = std::malloc(bytes == 0 ? 1 : bytes);
        if (p == nullptr)
          throw OutOfMemory(fmt::format("{}: out of memory: malloc of {} bytes ({}) failed",
                                        info_.id, bytes, human_bytes(double(bytes))));
        return Buffer(p, bytes, kind, [](void* q) { std::free(q); });
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

  EventPtr record() override {
    bind();
    cudaEvent_t e = nullptr;
    SB_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));  // timing enabled
    auto event = std::make_shared<CudaEvent>(e);
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
    const auto deadline = steady_clock::now() + timeout;
    // Start with short naps so a quick op returns within microseconds, and
    // back off to 1 ms so a long wait costs no CPU worth measuring.
    auto nap = std::chrono::microseconds(20);
    for (;;) {
      const cudaError_t s = cudaStreamQuery(stream());
      if (s == cudaSuccess) return;
      if (s != cudaErrorNotReady)
        throw_call_failure(cuda_detail::cuda_kind(s), "CUDA", "cudaStreamQuery(stream)",
                           cuda_detail::cuda_name(s), __FILE__, __LINE__);
      if (steady_clock::now() >= deadline)
        throw HangError(fmt::format(
            "{}: stream made no progress within {:g} s (work enqueued on the device stream "
            "has not completed; a kernel or collective may be stuck)",
            info_.id, double(timeout.count()) / 1000.0));
      std::this_thread::sleep_for(nap);
      nap = std::min<std::chrono::microseconds>(nap * 2, 1ms);
    }
  }

  // For the ops this device makes.
  void bind() const { SB_CUDA_CHECK(cudaSetDevice(index_)); }
  cudaStream_t stream() const { return stream_.get(); }
  cublasLtHandle_t lt() const { return lt_.get(); }
  const std::string& id() const { return info_.id; }

 private:
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
        where = fmt::format("device has {} free of {}", human_bytes(double(free)),
                            human_bytes(double(total)));
      else
        where = "device free memory unknown";
      (void)cudaGetLastError();
    }
    throw OutOfMemory(fmt::format("{}: out of memory: {} of {} bytes ({}) -> {}; {}", info_.id,
                                  call, bytes, human_bytes(double(bytes)),
                                  cuda_detail::cuda_name(s), where));
  }

  int index_;
  DeviceInfo info_;
  int cc_major_ = 0, cc_minor_ = 0;
  Stream stream_;
  LtHandle lt_;
};

// cuBLASLt types per dtype. The scale type (alpha, beta, fp8 scales) is fp32
// throughout; accumulation is fp32 (tf32 rounds the tensor-core inputs).
struct LtTypes {
  cublasComputeType_t compute;
  cudaDataType_t ab;  // A and B (our W and A)
  cudaDataType_t cd;  // C and D
};
LtTypes lt_types(DType d) {
  switch (d) {
    case DType::fp32: return {CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F};
    case DType::tf32: return {CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, CUDA_R_32F};
    case DType::bf16: return {CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_16BF};
    case DType::fp16: return {CUBLAS_COMPUTE_32F, CUDA_R_16F, CUDA_R_16F};
    case DType::fp8_e4m3: return {CUBLAS_COMPUTE_32F, CUDA_R_8F_E4M3, CUDA_R_16BF};
  }
  throw Error(ErrorKind::runtime, "cuda: unknown dtype");
}
DType c_dtype_of(DType d) {
  switch (d) {
    case DType::fp32:
    case DType::tf32: return DType::fp32;
    case DType::fp16: return DType::fp16;
    case DType::bf16:
    case DType::fp8_e4m3: return DType::bf16;
  }
  return DType::fp32;
}

MatrixLayout make_layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols,
                         std::int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  SB_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&l, type, std::uint64_t(rows), std::uint64_t(cols), ld));
  return MatrixLayout(l);
}

template <class T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  SB_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

// C[M,N] = A[M,K] * W[N,K]^T, row-major. cuBLAS is column-major, where the
// same memory reads as C^T[N,M] = W[N,K] * A^T[K,M]: cuBLAS's A is our W
// stored K x N (ld K) with op T, its B is our A stored K x M (ld K) with op N,
// and D is N x M (ld N). So m=N, n=M, k=K: the "TN" form fp8 requires.
class CudaGemm final : public GemmOp {
 public:
  CudaGemm(CudaDevice& dev, GemmShape shape, DType dtype, std::uint64_t seed)
      : dev_(dev), shape_(shape), dtype_(dtype) {
    const std::int64_t m = shape.m, n = shape.n, k = shape.k;
    const LtTypes t = lt_types(dtype);
    const auto esize = std::size_t(storage_bytes(dtype));
    const auto csize = std::size_t(storage_bytes(c_dtype_of(dtype)));
    dev_.bind();
    a_ = dev_.allocate(std::size_t(m * k) * esize, MemKind::device);
    w_ = dev_.allocate(std::size_t(n * k) * esize, MemKind::device);
    c_ = dev_.allocate(std::size_t(m * n) * csize, MemKind::device);
    workspace_ = dev_.allocate(kWorkspaceBytes, MemKind::device);

    // A from seed stream 2*seed, W from 2*seed+1: distinct, and a host
    // reference can rebuild either with cuda_kernels::uniform_value.
    cuda_kernels::fill_uniform(a_.data(), dtype, m * k, 2 * seed, dev_.stream());
    cuda_kernels::fill_uniform(w_.data(), dtype, n * k, 2 * seed + 1, dev_.stream());
    SB_CUDA_CHECK(cudaMemsetAsync(c_.data(), 0, c_.bytes(), dev_.stream()));

    cublasLtMatmulDesc_t desc = nullptr;
    SB_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, t.compute, CUDA_R_32F));
    desc_.reset(desc);
    set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, std::int32_t(CUBLAS_OP_T));
    set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, std::int32_t(CUBLAS_OP_N));
    set_desc(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, std::int32_t(CUBLASLT_POINTER_MODE_HOST));
    if (dtype == DType::fp8_e4m3) {
      // fp8 needs per-tensor dequantization scales on the device; 1.0 keeps
      // the product equal to the stored values' product.
      scales_ = dev_.allocate(2 * sizeof(float), MemKind::device);
      const float ones[2] = {1.0f, 1.0f};
      // Pageable source: the call returns once `ones` has been staged.
      SB_CUDA_CHECK(cudaMemcpyAsync(scales_.data(), ones, sizeof(ones), cudaMemcpyHostToDevice,
                                    dev_.stream()));
      const void* a_scale = static_cast<const float*>(scales_.data());
      const void* b_scale = static_cast<const float*>(scales_.data()) + 1;
      set_desc(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale);
      set_desc(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale);
    }
    w_layout_ = make_layout(t.ab, k, n, k);
    a_layout_ = make_layout(t.ab, k, m, k);
    c_layout_ = make_layout(t.cd, n, m, n);

    choose_algo();
    // Fill errors surface here, in setup, rather than in the first timed GEMM.
    dev_.synchronize(kSetupTimeout);
  }

  GemmShape shape() const override { return shape_; }
  DType dtype() const override { return dtype_; }
  DType c_dtype() const override { return c_dtype_of(dtype_); }
  std::string impl() const override { return impl_; }

  void enqueue() override {
    dev_.bind();
    const float alpha = 1.0f, beta = 0.0f;  // host scalars (POINTER_MODE_HOST)
    // C is passed as both C and D; with beta = 0 it is only written.
    SB_CUBLAS_CHECK(cublasLtMatmul(dev_.lt(), desc_.get(), &alpha, w_.data(), w_layout_.get(),
                                   a_.data(), a_layout_.get(), &beta, c_.data(), c_layout_.get(),
                                   c_.data(), c_layout_.get(), &algo_, workspace_.data(),
                                   workspace_.bytes(), dev_.stream()));
  }

  void upload(std::span<const float> a, std::span<const float> w) override {
    const std::int64_t m = shape_.m, n = shape_.n, k = shape_.k;
    check_size("upload: a", a.size(), m * k);
    check_size("upload: w", w.size(), n * k);
    dev_.bind();
    float* scratch = ensure_scratch();
    // One operand at a time through the fp32 scratch; the stream orders the
    // copy, the conversion and the next copy.
    SB_CUDA_CHECK(cudaMemcpyAsync(scratch, a.data(), a.size_bytes(), cudaMemcpyHostToDevice,
                                  dev_.stream()));
    cuda_kernels::convert_from_fp32(a_.data(), dtype_, scratch, m * k, dev_.stream());
    SB_CUDA_CHECK(cudaMemcpyAsync(scratch, w.data(), w.size_bytes(), cudaMemcpyHostToDevice,
                                  dev_.stream()));
    cuda_kernels::convert_from_fp32(w_.data(), dtype_, scratch, n * k, dev_.stream());
    dev_.synchronize(kSetupTimeout);
  }

  void download_c(std::span<float> c) override {
    const std::int64_t m = shape_.m, n = shape_.n;
    check_size("download_c", c.size(), m * n);
    dev_.bind();
    float* scratch = ensure_scratch();
    cuda_kernels::convert_to_fp32(scratch, c_.data(), c_dtype(), m * n, dev_.stream());
    SB_CUDA_CHECK(cudaMemcpyAsync(c.data(), scratch, c.size_bytes(), cudaMemcpyDeviceToHost,
                                  dev_.stream()));
    dev_.synchronize(kSetupTimeout);
  }

 private:
  void check_size(const char* what, std::size_t got, std::int64_t want) const {
    if (std::int64_t(got) != want)
      throw Error(ErrorKind::runtime,
                  fmt::format("{}: {} has {} values, the {}x{}x{} GEMM needs {}", dev_.id(), what,
                              got, shape_.m, shape_.n, shape_.k, want));
  }

  // The fp32 staging area for upload/download, made on first use so a timed
  // GEMM never pays its memory.
  float* ensure_scratch() {
    if (scratch_.data() == nullptr) {
      const std::int64_t count =
          std::max({shape_.m * shape_.k, shape_.n * shape_.k, shape_.m * shape_.n});
      scratch_ = dev_.allocate(std::size_t(count) * sizeof(float), MemKind::device);
    }
    return static_cast<float*>(scratch_.data());
  }

  void choose_algo() {
    cublasLtMatmulPreference_t pref_raw = nullptr;
    SB_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_raw));
    const MatmulPref pref(pref_raw);
    const std::uint64_t max_ws = kWorkspaceBytes;
    SB_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof(max_ws)));

    const std::string no_algo = fmt::format(
        "{}: cuBLASLt has no algorithm for a {} GEMM of M={} N={} K={}{}", dev_.id(),
        to_string(dtype_), shape_.m, shape_.n, shape_.k,
        dtype_ == DType::fp8_e4m3 ? " (fp8 needs N and K to be multiples of 16)" : "");
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    try {
      SB_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(dev_.lt(), desc_.get(), w_layout_.get(),
                                                     a_layout_.get(), c_layout_.get(),
                                                     c_layout_.get(), pref_raw, 1, &result,
                                                     &count));
    } catch (const UnsupportedError& e) {
      throw UnsupportedError(no_algo + ": " + e.what());
    }
    if (count < 1 || result.state != CUBLAS_STATUS_SUCCESS) throw UnsupportedError(no_algo);
    algo_ = result.algo;

    std::int32_t algo_id = 0, splitk = 0;
    std::uint32_t tile = 0, stages = 0;
    SB_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_ID,
                                                         &algo_id, sizeof(algo_id), nullptr));
    SB_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_TILE_ID,
                                                         &tile, sizeof(tile), nullptr));
    SB_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_STAGES_ID,
                                                         &stages, sizeof(stages), nullptr));
    SB_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(
        &algo_, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), nullptr));
    // Tile and stages are cublasLtMatmulTile_t / cublasLtMatmulStages_t enum
    // values (see cublasLt.h), reported as numbers.
    impl_ = fmt::format("cublasLt algo {} tile {} stages {} splitK {}", algo_id, tile, stages,
                        splitk);
  }

  CudaDevice& dev_;  // outlives the op
  GemmShape shape_;
  DType dtype_;
  Buffer a_, w_, c_, workspace_, scales_, scratch_;
  MatmulDesc desc_;
  MatrixLayout w_layout_, a_layout_, c_layout_;
  cublasLtMatmulAlgo_t algo_{};
  std::string impl_;
};

std::unique_ptr<GemmOp> CudaDevice::make_gemm(GemmShape shape, DType dtype, std::uint64_t seed) {
  if (auto why = gemm_unsupported(dtype)) throw UnsupportedError(*why);
  if (shape.m <= 0 || shape.n <= 0 || shape.k <= 0)
    throw Error(ErrorKind::runtime, fmt::format("{}: GEMM shape M={} N={} K={} is not positive",
                                                info_.id, shape.m, shape.n, shape.k));
  return std::make_unique<CudaGemm>(*this, shape, dtype, seed);
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
