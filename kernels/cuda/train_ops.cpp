// The cuda device's training ops (harness/train_ops.hpp): GEMMs through
// cuBLAS's cublasGemmEx on the caller's tensors, everything else through the
// kernels of train_kernels.cu. All work is enqueued on the device's stream;
// only upload and download wait (through the device's synchronize, with a
// deadline). Every tensor, the cuBLAS workspace and the loss partials are
// allocated through the device, so its memory ledger sees them and a memory
// cap makes them throw OutOfMemory.
#include <chrono>    // std::chrono::milliseconds
#include <climits>   // INT_MAX
#include <cmath>     // std::pow
#include <cstdint>   // std::int64_t, std::uint16_t
#include <limits>    // std::numeric_limits
#include <memory>    // std::unique_ptr, std::make_unique
#include <span>      // std::span
#include <string>    // std::string
#include <utility>   // std::move
#include <vector>    // std::vector

#include <cublas_v2.h>     // cublasGemmEx, cublasCreate, cublasSetStream, cublasSetWorkspace
#include <cuda_runtime.h>  // cudaMemcpyAsync, cudaMemsetAsync, cudaSetDevice
#include <fmt/format.h>    // fmt::format

#include "harness/device.hpp"                 // Device, Buffer, MemKind
#include "harness/dtype.hpp"                  // DType, storage_bytes, float_to_bf16_bits, ...
#include "harness/errors.hpp"                 // Error, OutOfMemory, UnsupportedError
#include "harness/train_ops.hpp"              // TrainOps, DTensor, Act
#include "kernels/cuda/detail/check.hpp"      // SB_CUDA_CHECK, SB_CUBLAS_CHECK
#include "kernels/cuda/detail/cuda_gemm.hpp"  // GemmContext, Owned, kSetupTimeout
#include "kernels/cuda/train_kernels.cuh"     // the kernels, make_cuda_train_ops

namespace sb::cuda_detail {
namespace {

using CublasHandle = Owned<cublasHandle_t, &cublasDestroy>;

// cuBLAS's workspace, set explicitly so it comes through allocate() and the
// ledger counts it: 32 MiB, NVIDIA's guidance for Hopper (as the device
// gives cuBLASLt and naive attention's handle).
constexpr std::size_t kWorkspaceBytes = 32ull << 20;

bool train_dtype(DType d) { return d == DType::fp32 || d == DType::bf16 || d == DType::fp16; }

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::fp32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::fp16: return CUDA_R_16F;
    default: break;
  }
  throw UnsupportedError(fmt::format("cuda train ops run in fp32, bf16 or fp16, not {}", to_string(d)));
}

cuda_kernels::TrainAct train_act(Act a) {
  switch (a) {
    case Act::none: return cuda_kernels::TrainAct::none;
    case Act::relu: return cuda_kernels::TrainAct::relu;
    case Act::gelu: return cuda_kernels::TrainAct::gelu;
    case Act::sigmoid: return cuda_kernels::TrainAct::sigmoid;
    case Act::tanh: return cuda_kernels::TrainAct::tanh;
  }
  throw Error(ErrorKind::runtime, "cuda train ops: unknown activation");
}

// "13.1.0" from cuBLAS's 10000*major + 100*minor + patch.
std::string cublas_version(cublasHandle_t h) {
  int v = 0;
  if (cublasGetVersion(h, &v) != CUBLAS_STATUS_SUCCESS) return "unknown";
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

class CudaTrainOps final : public TrainOps {
 public:
  explicit CudaTrainOps(const GemmContext& ctx) : ctx_(ctx) {
    bind();
    cublasHandle_t h = nullptr;
    SB_CUBLAS_CHECK(cublasCreate(&h));
    CublasHandle owned(h);
    // cublasSetStream resets the workspace to cuBLAS's own pool, so the
    // stream comes first and the workspace after it.
    SB_CUBLAS_CHECK(cublasSetStream(h, ctx_.stream));
    workspace_ = ctx_.device->allocate(kWorkspaceBytes, MemKind::device);
    SB_CUBLAS_CHECK(cublasSetWorkspace(h, workspace_.data(), workspace_.bytes()));
    // Products accumulate in fp32 and are rounded once to C's dtype: no
    // reduced-precision split-K reduction in a bf16/fp16 C. CUBLAS_COMPUTE_32F
    // (below) keeps fp32 GEMMs off TF32.
    SB_CUBLAS_CHECK(cublasSetMathMode(
        h, cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    cublas_ = std::move(owned);
    partials_ = ctx_.device->allocate(std::size_t(cuda_kernels::kTrainPartials) * sizeof(float), MemKind::device);
    impl_ = fmt::format("cuBLAS {} cublasGemmEx (CUBLAS_COMPUTE_32F) + CUDA kernels (train_kernels.cu)",
                        cublas_version(h));
  }

  std::string impl() const override { return impl_; }

  std::string gemm_impl(DType d) const override {
    switch (d) {
      case DType::fp32: return "native: cublasGemmEx fp32, CUBLAS_COMPUTE_32F (no TF32)";
      case DType::bf16: return "native: cublasGemmEx bf16 inputs, fp32 accumulation (tensor cores)";
      case DType::fp16: return "native: cublasGemmEx fp16 inputs, fp32 accumulation (tensor cores)";
      default: break;
    }
    return fmt::format("unsupported: cuda train ops have no {} GEMM", to_string(d));
  }

  DTensor alloc(std::int64_t numel, DType dtype, const std::string& what) override {
    if (!train_dtype(dtype))
      throw UnsupportedError(fmt::format("{}: train op tensor {}: {} is not fp32, bf16 or fp16", ctx_.id, what,
                                         to_string(dtype)));
    if (numel < 0)
      throw Error(ErrorKind::runtime, fmt::format("{}: train op tensor {}: {} elements", ctx_.id, what, numel));
    const auto esize = std::size_t(storage_bytes(dtype));
    if (std::uint64_t(numel) > std::numeric_limits<std::size_t>::max() / esize)
      throw OutOfMemory(fmt::format("{}: out of memory: train op tensor {}: {} {} elements, beyond any device",
                                    ctx_.id, what, numel, to_string(dtype)));
    const std::size_t bytes = std::size_t(numel) * esize;
    bind();
    DTensor t;
    try {
      t.buf = ctx_.device->allocate(bytes, MemKind::device);
    } catch (const OutOfMemory& e) {
      throw OutOfMemory(fmt::format("{}: train op tensor {} ({} {} elements, {} bytes): {}", ctx_.id, what, numel,
                                    to_string(dtype), bytes, e.what()));
    }
    t.dtype = dtype;
    t.numel = numel;
    if (bytes > 0) SB_CUDA_CHECK(cudaMemsetAsync(t.data(), 0, bytes, ctx_.stream));
    return t;
  }

  void upload(DTensor& t, std::span<const float> host) override {
    check_tensor(t, "upload", "t");
    if (std::int64_t(host.size()) > t.numel)
      throw Error(ErrorKind::runtime, fmt::format("{}: train op upload: {} values into a tensor of {}", ctx_.id,
                                                  host.size(), t.numel));
    if (host.empty()) return;
    bind();
    if (t.dtype == DType::fp32) {
      SB_CUDA_CHECK(cudaMemcpyAsync(t.data(), host.data(), host.size_bytes(), cudaMemcpyHostToDevice, ctx_.stream));
      ctx_.device->synchronize(kSetupTimeout);
      return;
    }
    // Rounded on the host (round to nearest even, harness/dtype.cpp); the
    // staging vector must outlive the copy, hence the wait before return.
    std::vector<std::uint16_t> bits(host.size());
    for (std::size_t i = 0; i < host.size(); ++i)
      bits[i] = t.dtype == DType::bf16 ? float_to_bf16_bits(host[i]) : float_to_fp16_bits(host[i]);
    SB_CUDA_CHECK(cudaMemcpyAsync(t.data(), bits.data(), bits.size() * sizeof(std::uint16_t), cudaMemcpyHostToDevice,
                                  ctx_.stream));
    ctx_.device->synchronize(kSetupTimeout);
  }

  void download(const DTensor& t, std::span<float> host, std::int64_t timeout_ms) override {
    check_tensor(t, "download", "t");
    if (std::int64_t(host.size()) > t.numel)
      throw Error(ErrorKind::runtime, fmt::format("{}: train op download: {} values from a tensor of {}", ctx_.id,
                                                  host.size(), t.numel));
    const std::chrono::milliseconds timeout(timeout_ms);
    // The deadline applies to the work enqueued so far (a hung kernel throws
    // HangError here), then to the copy itself.
    ctx_.device->synchronize(timeout);
    if (host.empty()) return;
    bind();
    if (t.dtype == DType::fp32) {
      SB_CUDA_CHECK(cudaMemcpyAsync(host.data(), t.data(), host.size_bytes(), cudaMemcpyDeviceToHost, ctx_.stream));
      ctx_.device->synchronize(timeout);
      return;
    }
    std::vector<std::uint16_t> bits(host.size());
    SB_CUDA_CHECK(cudaMemcpyAsync(bits.data(), t.data(), bits.size() * sizeof(std::uint16_t), cudaMemcpyDeviceToHost,
                                  ctx_.stream));
    ctx_.device->synchronize(timeout);
    for (std::size_t i = 0; i < host.size(); ++i)
      host[i] = t.dtype == DType::bf16 ? bf16_bits_to_float(bits[i]) : fp16_bits_to_float(bits[i]);
  }

  // Row-major C[m,n] is column-major C^T [n x m] (ld n), and
  // C^T = op(B)^T op(A)^T: cuBLAS's first operand is our B, its second our A.
  //   B stored [k,n] (tb false) reads column-major as B^T [n x k], ld n: op N;
  //   B stored [n,k] (tb true) reads as op(B) [k x n], ld k: op T gives op(B)^T.
  //   A stored [m,k] (ta false) reads as A^T [k x m], ld k: op N;
  //   A stored [k,m] (ta true) reads as op(A) [m x k], ld m: op T gives op(A)^T.
  void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const DTensor& a,
            const DTensor& b, float beta, DTensor& c) override {
    check_tensor(a, "gemm", "A");
    check_tensor(b, "gemm", "B");
    check_tensor(c, "gemm", "C");
    if (a.dtype != b.dtype)
      throw Error(ErrorKind::runtime, fmt::format("{}: train op gemm: A is {} and B is {} (one dtype for both)",
                                                  ctx_.id, to_string(a.dtype), to_string(b.dtype)));
    if (c.dtype != DType::fp32 && c.dtype != a.dtype)
      throw Error(ErrorKind::runtime, fmt::format("{}: train op gemm: C is {} for {} inputs (fp32 or {} only)",
                                                  ctx_.id, to_string(c.dtype), to_string(a.dtype),
                                                  to_string(a.dtype)));
    if (m < 0 || n < 0 || k < 0)
      throw Error(ErrorKind::runtime, fmt::format("{}: train op gemm: m={} n={} k={}", ctx_.id, m, n, k));
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX)
      throw UnsupportedError(
          fmt::format("{}: train op gemm: m={} n={} k={} exceed cuBLAS's int sizes", ctx_.id, m, n, k));
    need(a, m * k, "gemm", "A");
    need(b, k * n, "gemm", "B");
    need(c, m * n, "gemm", "C");
    if (m == 0 || n == 0) return;
    bind();
    if (k == 0) {  // an empty sum: C = beta * C
      if (beta == 0.0f) {
        SB_CUDA_CHECK(cudaMemsetAsync(c.data(), 0, std::size_t(m * n) * esize(c), ctx_.stream));
      } else if (beta != 1.0f) {
        throw Error(ErrorKind::runtime, fmt::format("{}: train op gemm: k=0 with beta {} (0 or 1)", ctx_.id, beta));
      }
      return;
    }
    const cudaDataType_t ab = cuda_type(a.dtype), ct = cuda_type(c.dtype);
    SB_CUBLAS_CHECK(cublasGemmEx(cublas_.get(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 int(n), int(m), int(k), &alpha, b.data(), ab, int(tb ? k : n), a.data(), ab,
                                 int(ta ? m : k), &beta, c.data(), ct, int(n), CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
  }

  void cast(const DTensor& src, DTensor& dst, std::int64_t n) override {
    check_tensor(src, "cast", "src");
    check_tensor(dst, "cast", "dst");
    check_count(n, "cast");
    need(src, n, "cast", "src");
    need(dst, n, "cast", "dst");
    bind();
    cuda_kernels::train_cast(src.data(), src.dtype, dst.data(), dst.dtype, n, ctx_.stream);
  }

  void bias_act(DTensor& z, const DTensor* bias, Act act, const DTensor* residual, DTensor& y, std::int64_t rows,
                std::int64_t cols) override {
    check_rows(rows, cols, "bias_act");
    check_tensor(z, "bias_act", "z");
    check_tensor(y, "bias_act", "y");
    need(z, rows * cols, "bias_act", "z");
    need(y, rows * cols, "bias_act", "y");
    if (bias != nullptr) {
      check_tensor(*bias, "bias_act", "bias");
      need(*bias, cols, "bias_act", "bias");
    }
    if (residual != nullptr) {
      check_tensor(*residual, "bias_act", "residual");
      need(*residual, rows * cols, "bias_act", "residual");
    }
    bind();
    cuda_kernels::train_bias_act(z.data(), z.dtype, bias ? bias->data() : nullptr, bias ? bias->dtype : DType::fp32,
                                 train_act(act), residual ? residual->data() : nullptr,
                                 residual ? residual->dtype : DType::fp32, y.data(), y.dtype, rows, cols,
                                 ctx_.stream);
  }

  void act_backward(const DTensor& dy, const DTensor& z, Act act, DTensor& dz, std::int64_t n) override {
    check_count(n, "act_backward");
    check_tensor(dy, "act_backward", "dy");
    check_tensor(z, "act_backward", "z");
    check_tensor(dz, "act_backward", "dz");
    need(dy, n, "act_backward", "dy");
    need(z, n, "act_backward", "z");
    need(dz, n, "act_backward", "dz");
    bind();
    cuda_kernels::train_act_backward(dy.data(), dy.dtype, z.data(), z.dtype, train_act(act), dz.data(), dz.dtype, n,
                                     ctx_.stream);
  }

  void bias_grad(const DTensor& dz, DTensor& db, std::int64_t rows, std::int64_t cols) override {
    check_rows(rows, cols, "bias_grad");
    check_tensor(dz, "bias_grad", "dz");
    check_tensor(db, "bias_grad", "db");
    need(dz, rows * cols, "bias_grad", "dz");
    need(db, cols, "bias_grad", "db");
    bind();
    cuda_kernels::train_bias_grad(dz.data(), dz.dtype, db.data(), db.dtype, rows, cols, ctx_.stream);
  }

  void rmsnorm(const DTensor& x, DTensor& y, DTensor& rstd, std::int64_t rows, std::int64_t cols,
               float eps) override {
    check_rows(rows, cols, "rmsnorm");
    check_tensor(x, "rmsnorm", "x");
    check_tensor(y, "rmsnorm", "y");
    check_fp32(rstd, "rmsnorm", "rstd");
    need(x, rows * cols, "rmsnorm", "x");
    need(y, rows * cols, "rmsnorm", "y");
    need(rstd, rows, "rmsnorm", "rstd");
    bind();
    cuda_kernels::train_rmsnorm(x.data(), x.dtype, y.data(), y.dtype, static_cast<float*>(rstd.data()), rows, cols,
                                eps, ctx_.stream);
  }

  void rmsnorm_backward(const DTensor& dy, const DTensor& y, const DTensor& rstd, DTensor& dx, std::int64_t rows,
                        std::int64_t cols) override {
    check_rows(rows, cols, "rmsnorm_backward");
    check_tensor(dy, "rmsnorm_backward", "dy");
    check_tensor(y, "rmsnorm_backward", "y");
    check_fp32(rstd, "rmsnorm_backward", "rstd");
    check_tensor(dx, "rmsnorm_backward", "dx");
    need(dy, rows * cols, "rmsnorm_backward", "dy");
    need(y, rows * cols, "rmsnorm_backward", "y");
    need(rstd, rows, "rmsnorm_backward", "rstd");
    need(dx, rows * cols, "rmsnorm_backward", "dx");
    bind();
    cuda_kernels::train_rmsnorm_backward(dy.data(), dy.dtype, y.data(), y.dtype,
                                         static_cast<const float*>(rstd.data()), dx.data(), dx.dtype, rows, cols,
                                         ctx_.stream);
  }

  void mse_loss(const DTensor& y, const DTensor& target, DTensor& loss, DTensor& dy, std::int64_t n,
                float scale) override {
    check_count(n, "mse_loss");
    check_tensor(y, "mse_loss", "y");
    check_tensor(target, "mse_loss", "target");
    check_tensor(loss, "mse_loss", "loss");
    check_tensor(dy, "mse_loss", "dy");
    need(y, n, "mse_loss", "y");
    need(target, n, "mse_loss", "target");
    need(loss, 1, "mse_loss", "loss");
    need(dy, n, "mse_loss", "dy");
    bind();
    cuda_kernels::train_mse_loss(y.data(), y.dtype, target.data(), target.dtype, loss.data(), loss.dtype, dy.data(),
                                 dy.dtype, n, scale, partials(), ctx_.stream);
  }

  void xent_loss(const DTensor& logits, const DTensor& labels, DTensor& loss, DTensor& dlogits, std::int64_t rows,
                 std::int64_t classes, float scale) override {
    check_rows(rows, classes, "xent_loss");
    check_tensor(logits, "xent_loss", "logits");
    check_tensor(labels, "xent_loss", "labels");
    check_tensor(loss, "xent_loss", "loss");
    check_tensor(dlogits, "xent_loss", "dlogits");
    need(logits, rows * classes, "xent_loss", "logits");
    need(labels, rows, "xent_loss", "labels");
    need(loss, 1, "xent_loss", "loss");
    need(dlogits, rows * classes, "xent_loss", "dlogits");
    bind();
    cuda_kernels::train_xent_loss(logits.data(), logits.dtype, labels.data(), labels.dtype, loss.data(), loss.dtype,
                                  dlogits.data(), dlogits.dtype, rows, classes, scale, partials(), ctx_.stream);
  }

  void stats(const DTensor& t, std::int64_t n, DTensor& out, std::int64_t slot) override {
    check_count(n, "stats");
    check_tensor(t, "stats", "t");
    check_fp32(out, "stats", "out");
    if (slot < 0) throw Error(ErrorKind::runtime, fmt::format("{}: train op stats: slot {}", ctx_.id, slot));
    need(t, n, "stats", "t");
    need(out, (slot + 1) * kStatsPerTensor, "stats", "out");
    bind();
    cuda_kernels::train_stats(t.data(), t.dtype, n, static_cast<float*>(out.data()) + slot * kStatsPerTensor,
                              ctx_.stream);
  }

  void zero(DTensor& t) override {
    check_tensor(t, "zero", "t");
    bind();
    if (t.bytes() > 0) SB_CUDA_CHECK(cudaMemsetAsync(t.data(), 0, t.bytes(), ctx_.stream));
  }

  // CUDA graphs: the stream's work between begin and end is captured, not
  // run (cuBLAS is capturable with its workspace set, which it is here).
  void begin_capture() override {
    bind();
    SB_CUDA_CHECK(cudaStreamBeginCapture(ctx_.stream, cudaStreamCaptureModeThreadLocal));
  }
  std::unique_ptr<TrainGraph> end_capture() override {
    bind();
    cudaGraph_t g = nullptr;
    SB_CUDA_CHECK(cudaStreamEndCapture(ctx_.stream, &g));
    std::size_t n = 0;
    cudaGraphExec_t ex = nullptr;
    const cudaError_t e1 = cudaGraphGetNodes(g, nullptr, &n);
    const cudaError_t e2 = e1 == cudaSuccess ? cudaGraphInstantiate(&ex, g, 0) : e1;
    if (e2 != cudaSuccess) {
      cudaGraphDestroy(g);
      SB_CUDA_CHECK(e2);
    }
    return std::make_unique<Graph>(g, ex, n, ctx_.stream, ctx_.index);
  }

  void poke(DTensor& t, std::int64_t index, float value) override {
    check_tensor(t, "poke", "t");
    if (index < 0 || index >= t.numel)
      throw Error(ErrorKind::runtime,
                  fmt::format("{}: train op poke: index {} outside a tensor of {}", ctx_.id, index, t.numel));
    bind();
    cuda_kernels::train_poke(t.data(), t.dtype, index, value, ctx_.stream);
  }

  void sgd(DTensor& p, const DTensor& g, std::int64_t n, float lr, float weight_decay, float grad_scale) override {
    check_count(n, "sgd");
    check_fp32(p, "sgd", "p");
    check_tensor(g, "sgd", "g");
    need(p, n, "sgd", "p");
    need(g, n, "sgd", "g");
    bind();
    cuda_kernels::train_sgd(static_cast<float*>(p.data()), g.data(), g.dtype, n, lr, weight_decay, grad_scale,
                            ctx_.stream);
  }

  void adamw(DTensor& p, const DTensor& g, DTensor& m, DTensor& v, std::int64_t n, float lr, float beta1,
             float beta2, float eps, float weight_decay, int step, float grad_scale) override {
    check_count(n, "adamw");
    check_fp32(p, "adamw", "p");
    check_tensor(g, "adamw", "g");
    check_fp32(m, "adamw", "m");
    check_fp32(v, "adamw", "v");
    if (step < 1)
      throw Error(ErrorKind::runtime,
                  fmt::format("{}: train op adamw: step {} (the first step is 1: bias correction 1 - beta^step)",
                              ctx_.id, step));
    need(p, n, "adamw", "p");
    need(g, n, "adamw", "g");
    need(m, n, "adamw", "m");
    need(v, n, "adamw", "v");
    const float bc1 = float(1.0 - std::pow(double(beta1), step));
    const float bc2 = float(1.0 - std::pow(double(beta2), step));
    bind();
    cuda_kernels::train_adamw(static_cast<float*>(p.data()), g.data(), g.dtype, static_cast<float*>(m.data()),
                              static_cast<float*>(v.data()), n, lr, beta1, beta2, eps, weight_decay, bc1, bc2,
                              grad_scale, ctx_.stream);
  }

 private:
  class Graph final : public TrainGraph {
   public:
    Graph(cudaGraph_t g, cudaGraphExec_t ex, std::size_t n, cudaStream_t s, int index)
        : g_(g), ex_(ex), n_(n), s_(s), index_(index) {}
    ~Graph() override {
      cudaGraphExecDestroy(ex_);  // no throw in a destructor; errors here leave nothing to undo
      cudaGraphDestroy(g_);
    }
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;
    void replay() override {
      SB_CUDA_CHECK(cudaSetDevice(index_));
      SB_CUDA_CHECK(cudaGraphLaunch(ex_, s_));
    }
    std::size_t nodes() const override { return n_; }

   private:
    cudaGraph_t g_;
    cudaGraphExec_t ex_;
    std::size_t n_;
    cudaStream_t s_;
    int index_;
  };

  void bind() const { SB_CUDA_CHECK(cudaSetDevice(ctx_.index)); }
  float* partials() const { return static_cast<float*>(partials_.data()); }
  static std::size_t esize(const DTensor& t) { return std::size_t(storage_bytes(t.dtype)); }

  // A tensor this device can work on: one of the three dtypes, with memory
  // behind it unless it is empty.
  void check_tensor(const DTensor& t, const char* op, const char* what) const {
    if (!train_dtype(t.dtype))
      throw UnsupportedError(fmt::format("{}: train op {}: {} is {} (fp32, bf16 or fp16 only)", ctx_.id, op, what,
                                         to_string(t.dtype)));
    if (t.numel < 0 || (t.numel > 0 && t.data() == nullptr) || t.buf.bytes() < t.bytes())
      throw Error(ErrorKind::runtime, fmt::format("{}: train op {}: {} has {} elements and {} bytes of memory",
                                                  ctx_.id, op, what, t.numel, t.buf.bytes()));
    if (t.numel > 0 && t.buf.kind() != MemKind::device)
      throw Error(ErrorKind::runtime,
                  fmt::format("{}: train op {}: {} is not device memory (allocate it with alloc)", ctx_.id, op, what));
  }
  void check_fp32(const DTensor& t, const char* op, const char* what) const {
    check_tensor(t, op, what);
    if (t.dtype != DType::fp32)
      throw Error(ErrorKind::runtime,
                  fmt::format("{}: train op {}: {} is {}, not fp32", ctx_.id, op, what, to_string(t.dtype)));
  }
  void need(const DTensor& t, std::int64_t count, const char* op, const char* what) const {
    if (t.numel < count)
      throw Error(ErrorKind::runtime, fmt::format("{}: train op {}: {} has {} elements, the op reads or writes {}",
                                                  ctx_.id, op, what, t.numel, count));
  }
  void check_count(std::int64_t n, const char* op) const {
    if (n < 0) throw Error(ErrorKind::runtime, fmt::format("{}: train op {}: n = {}", ctx_.id, op, n));
  }
  void check_rows(std::int64_t rows, std::int64_t cols, const char* op) const {
    if (rows < 0 || cols < 0 || (cols > 0 && rows > std::numeric_limits<std::int64_t>::max() / cols))
      throw Error(ErrorKind::runtime, fmt::format("{}: train op {}: rows={} cols={}", ctx_.id, op, rows, cols));
  }

  GemmContext ctx_;
  // Declared so the handle goes before the workspace it was given.
  Buffer workspace_;
  CublasHandle cublas_;
  Buffer partials_;  // per-block sums of the losses (kTrainPartials fp32), reused on the one stream
  std::string impl_;
};

}  // namespace

std::unique_ptr<TrainOps> make_cuda_train_ops(const GemmContext& ctx) { return std::make_unique<CudaTrainOps>(ctx); }

}  // namespace sb::cuda_detail
