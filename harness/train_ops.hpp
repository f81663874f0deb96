// Training ops: what a training step needs from a device beyond a fixed
// GEMM — GEMMs on tensors the caller owns (with transposes and beta, the
// three GEMMs of a Linear's forward and backward), the elementwise steps
// between them, the loss, reductions the detectors read, and the optimizer.
// The numerics, batch and memory scenarios build their steps from these, so
// one step runs on cpu, cuda and sim unchanged.
//
// Everything is enqueued on the device's one stream (Device::record and
// synchronize time and wait for it) and returns at once, except upload and
// download, which are synchronous. Tensors are row-major.
//
// Mixed precision follows torch.autocast: master weights, optimizer state
// and the loss in fp32; GEMM inputs and outputs, activations and their
// gradients in the compute dtype (bf16, fp16), products accumulated in fp32
// and rounded once to the output's dtype (round to nearest even). A value a
// dtype cannot hold is what that dtype makes of it: fp16 overflows to inf
// past 65504 and flushes below its smallest subnormal (2^-24) to zero, which
// is what the numerics scenario measures.
#pragma once

#include <cstddef>  // std::size_t
#include <cstdint>  // std::int64_t
#include <memory>   // std::unique_ptr
#include <span>     // std::span
#include <string>   // std::string

#include "harness/device.hpp"  // Buffer, Device
#include "harness/dtype.hpp"   // DType
#include "harness/errors.hpp"  // UnsupportedError
#include "harness/names.hpp"   // NameTable

namespace sb {

// Device memory holding `numel` elements of `dtype` (fp32, bf16 or fp16).
struct DTensor {
  Buffer buf;
  DType dtype = DType::fp32;
  std::int64_t numel = 0;
  void* data() const { return buf.data(); }
  std::size_t bytes() const { return std::size_t(numel) * std::size_t(storage_bytes(dtype)); }
};

enum class Act { none, relu, gelu, sigmoid, tanh };
inline constexpr NameTable<Act, 5> kActNames{
    {{{Act::none, "none"}, {Act::relu, "relu"}, {Act::gelu, "gelu"}, {Act::sigmoid, "sigmoid"}, {Act::tanh, "tanh"}}}};
inline std::string_view to_string(Act v) { return kActNames.name(v); }

// What stats() writes for one tensor: four fp32 values at out[slot*4 ...].
// sumsq: sum of squares of the finite values (a norm squared);
// nonfinite: count of NaN and +-inf; zero: count of exact zeros;
// tiny: count of nonzero values below fp16's smallest normal, 2^-14 (fp16
// keeps them only as subnormals, with fewer bits, and flushes below 2^-24).
struct TensorStats {
  double sumsq = 0, nonfinite = 0, zero = 0, tiny = 0;
};
inline constexpr int kStatsPerTensor = 4;

// A captured sequence of ops: a CUDA graph on cuda; on cpu the ops' work
// items gathered into one stream item. replay() enqueues the whole sequence
// as one submission, on the same tensors and with the same scalars it was
// captured with (a CUDA graph's semantics).
class TrainGraph {
 public:
  virtual ~TrainGraph() = default;
  virtual void replay() = 0;
  virtual std::size_t nodes() const = 0;
};

class TrainOps {
 public:
  virtual ~TrainOps() = default;
  // What runs, e.g. "oneDNN 2.6 f32 matmul (bf16 emulated: inputs rounded) + C++ loops".
  virtual std::string impl() const = 0;
  // False on a simulated device: time is spent, nothing is computed.
  virtual bool computes() const { return true; }
  // How each dtype's GEMM is done here ("native", or how it is emulated).
  virtual std::string gemm_impl(DType) const = 0;

  // Allocates `numel` elements, zero-filled (the zeroing is enqueued).
  // Throws OutOfMemory naming `what`.
  virtual DTensor alloc(std::int64_t numel, DType dtype, const std::string& what) = 0;
  // Host fp32 values into a tensor (rounded to its dtype); synchronous.
  virtual void upload(DTensor& t, std::span<const float> host) = 0;
  // A tensor's values as fp32; waits for the stream first (deadline: the
  // device's synchronize with `timeout_ms`), then copies.
  virtual void download(const DTensor& t, std::span<float> host, std::int64_t timeout_ms = 60000) = 0;

  // The workspace a gemm of this shape and dtype needs beyond its operands
  // (the implementation's scratch: cpu's fp32 product and widened operands,
  // oneDNN's scratchpad); 0 where the device keeps none of its own.
  virtual std::size_t gemm_workspace_bytes(bool /*ta*/, bool /*tb*/, std::int64_t /*m*/, std::int64_t /*n*/,
                                           std::int64_t /*k*/, DType /*t*/) {
    return 0;
  }
  // Allocates that workspace now, at least `bytes` (kept, grown, never
  // shrunk), as a framework allocates its cuBLAS workspace before the first
  // step, so a step allocates nothing while it runs. Throws OutOfMemory.
  virtual void reserve_gemm_workspace(std::size_t /*bytes*/) {}

  // C[m,n] = alpha * op(A) op(B) + beta * C, op(A) [m,k], op(B) [k,n].
  // A is stored [m,k] (ta false) or [k,m] (ta true); B [k,n] or [n,k] (tb).
  // A and B share a dtype; C is fp32 or that dtype. beta is 0 or 1.
  // A Linear y = x W^T: gemm(false, true, B, out, in, 1, x, W, 0, y);
  // dx = dy W: gemm(false, false, B, in, out, 1, dy, W, 0, dx);
  // dW = dy^T x: gemm(true, false, out, in, B, 1, dy, x, 0, dW).
  virtual void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const DTensor& a,
                    const DTensor& b, float beta, DTensor& c) = 0;

  // dst = src converted to dst's dtype (a copy when they match); n elements.
  virtual void cast(const DTensor& src, DTensor& dst, std::int64_t n) = 0;

  // Per row r, column j of [rows, cols]:
  //   z[r,j] += bias[j] (z fp32 or the compute dtype, kept: the backward reads it);
  //   y[r,j]  = act(z[r,j]) (+ residual[r,j] when residual is non-null).
  // bias may be null (no bias). gelu is the tanh approximation.
  virtual void bias_act(DTensor& z, const DTensor* bias, Act act, const DTensor* residual, DTensor& y,
                        std::int64_t rows, std::int64_t cols) = 0;
  // dz = dy * act'(z), from bias_act's kept z.
  virtual void act_backward(const DTensor& dy, const DTensor& z, Act act, DTensor& dz, std::int64_t n) = 0;
  // db[j] = sum over rows of dz[r,j] (accumulated in fp32, stored in db's dtype).
  virtual void bias_grad(const DTensor& dz, DTensor& db, std::int64_t rows, std::int64_t cols) = 0;

  // RMSNorm without a learned scale, per row: y = x / sqrt(mean(x^2) + eps);
  // rstd[r] (fp32) kept for the backward:
  // dx = rstd * (dy - y * mean(dy * y)).
  virtual void rmsnorm(const DTensor& x, DTensor& y, DTensor& rstd, std::int64_t rows, std::int64_t cols,
                       float eps) = 0;
  virtual void rmsnorm_backward(const DTensor& dy, const DTensor& y, const DTensor& rstd, DTensor& dx,
                                std::int64_t rows, std::int64_t cols) = 0;

  // Mean squared error over n values: loss[0] (fp32) = mean((y - t)^2);
  // dy = scale * 2 (y - t) / n, in dy's dtype (scale: the loss scale).
  virtual void mse_loss(const DTensor& y, const DTensor& target, DTensor& loss, DTensor& dy, std::int64_t n,
                        float scale) = 0;
  // Softmax cross-entropy over [rows, classes] logits and class indices held
  // as fp32 in labels[rows]: loss[0] = mean over rows of -log softmax[label];
  // dlogits = scale * (softmax - onehot) / rows.
  virtual void xent_loss(const DTensor& logits, const DTensor& labels, DTensor& loss, DTensor& dlogits,
                         std::int64_t rows, std::int64_t classes, float scale) = 0;

  // The four TensorStats of t's first n values into out (fp32) at slot*4.
  virtual void stats(const DTensor& t, std::int64_t n, DTensor& out, std::int64_t slot) = 0;
  // The same for several tensors at slots first_slot, first_slot+1, ...: one
  // pass where the device can (torch's foreach non-finite check).
  virtual void stats_many(std::span<const DTensor* const> ts, std::span<const std::int64_t> ns, DTensor& out,
                          std::int64_t first_slot) {
    for (std::size_t k = 0; k < ts.size() && k < ns.size(); ++k)
      stats(*ts[k], ns[k], out, first_slot + std::int64_t(k));
  }
  // t = 0 (optimizer.zero_grad before an accumulation window).
  virtual void zero(DTensor& t) = 0;

  // Between begin_capture() and end_capture() ops are recorded, not run
  // (cudaStreamBeginCapture; on cpu, gathered). alloc, upload and download
  // are not allowed while capturing. Throws UnsupportedError where the
  // device cannot capture.
  virtual void begin_capture() { throw UnsupportedError("this device cannot capture training ops"); }
  virtual std::unique_ptr<TrainGraph> end_capture() {
    throw UnsupportedError("this device cannot capture training ops");
  }

  // t[index] = value (fault injection).
  virtual void poke(DTensor& t, std::int64_t index, float value) = 0;

  // Optimizer steps over n parameters; p, m, v fp32; g in any dtype,
  // multiplied by grad_scale first (1 / loss scale, times a clipping
  // coefficient). Decoupled weight decay (AdamW: p -= lr * wd * p).
  virtual void sgd(DTensor& p, const DTensor& g, std::int64_t n, float lr, float weight_decay, float grad_scale) = 0;
  virtual void adamw(DTensor& p, const DTensor& g, DTensor& m, DTensor& v, std::int64_t n, float lr, float beta1,
                     float beta2, float eps, float weight_decay, int step, float grad_scale) = 0;
};

// Reads slot's TensorStats from a downloaded stats buffer.
inline TensorStats read_stats(std::span<const float> host, std::int64_t slot) {
  const std::size_t i = std::size_t(slot) * kStatsPerTensor;
  return {host[i], host[i + 1], host[i + 2], host[i + 3]};
}

}  // namespace sb
