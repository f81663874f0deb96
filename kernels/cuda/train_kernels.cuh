// The elementwise and reduction kernels of the cuda device's training ops
// (train_ops.cpp, the sb::TrainOps of harness/train_ops.hpp), and the
// factory cuda_device.cpp calls to make those ops.
//
// Every tensor argument is a raw device pointer with its dtype: fp32, bf16 or
// fp16 (the launchers throw for any other). Values are read as fp32, computed
// in fp32 and rounded once to the destination's dtype (round to nearest
// even: fp16 overflows to inf and flushes below 2^-24 as the hardware
// conversion does). Kernels are plain grid-stride loops, or one block per row
// where a row is reduced; nothing is tuned. Every launch is checked and
// enqueued on the given stream; nothing here synchronizes. Sizes are checked
// by the caller (train_ops.cpp); counts of 0 launch nothing.
//
// Only files under kernels/cuda include this; it brings in cuda_runtime.h.
#pragma once

#include <cstdint>  // std::int64_t
#include <memory>   // std::unique_ptr

#include <cuda_runtime.h>  // cudaStream_t

#include "harness/dtype.hpp"  // DType

namespace sb {
class TrainOps;  // harness/train_ops.hpp
namespace cuda_detail {
struct GemmContext;  // kernels/cuda/detail/cuda_gemm.hpp
// The cuda device's TrainOps (train_ops.cpp): its own cuBLAS handle bound to
// ctx.stream, with a workspace allocated through ctx.device. ctx.device must
// outlive the ops. Throws OutOfMemory.
std::unique_ptr<TrainOps> make_cuda_train_ops(const GemmContext& ctx);
}  // namespace cuda_detail
}  // namespace sb

namespace sb::cuda_kernels {

// Activation codes, the order of sb::Act (harness/train_ops.hpp, which this
// header does not include): none, relu, gelu (tanh approximation), sigmoid, tanh.
enum class TrainAct : int { none = 0, relu = 1, gelu = 2, sigmoid = 3, tanh = 4 };

// Blocks the reductions write their partial sums from: reduce_partials'
// scratch must hold this many fp32 values.
inline constexpr int kTrainPartials = 1024;

// dst[i] = src[i] converted, i < n. Same dtype: a device-to-device copy.
void train_cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n, cudaStream_t stream);

// Over [rows, cols]: z += bias[j] (z rewritten, rounded to its dtype, only
// when bias is non-null), y = act(z) (+ residual), rounded once to y's dtype.
// act is read from the stored (rounded) z, as the backward reads it.
void train_bias_act(void* z, DType z_dtype, const void* bias, DType bias_dtype, TrainAct act, const void* residual,
                    DType residual_dtype, void* y, DType y_dtype, std::int64_t rows, std::int64_t cols,
                    cudaStream_t stream);

// dz[i] = dy[i] * act'(z[i]).
void train_act_backward(const void* dy, DType dy_dtype, const void* z, DType z_dtype, TrainAct act, void* dz,
                        DType dz_dtype, std::int64_t n, cudaStream_t stream);

// db[j] = sum over r of dz[r, j], accumulated in fp32 (one thread per column,
// rows in order: deterministic).
void train_bias_grad(const void* dz, DType dz_dtype, void* db, DType db_dtype, std::int64_t rows, std::int64_t cols,
                     cudaStream_t stream);

// One block per row: rstd[r] = 1 / sqrt(mean(x^2) + eps) (fp32), y = x * rstd.
void train_rmsnorm(const void* x, DType x_dtype, void* y, DType y_dtype, float* rstd, std::int64_t rows,
                   std::int64_t cols, float eps, cudaStream_t stream);
// One block per row: dx = rstd * (dy - y * mean(dy * y)).
void train_rmsnorm_backward(const void* dy, DType dy_dtype, const void* y, DType y_dtype, const float* rstd,
                            void* dx, DType dx_dtype, std::int64_t rows, std::int64_t cols, cudaStream_t stream);

// dy = scale * 2 (y - t) / n (dy may be y: each element is read before it
// is written); the per-block sums of (y - t)^2 go to partials, then one block
// adds them in order: loss[0] = sum / n. Deterministic.
void train_mse_loss(const void* y, DType y_dtype, const void* target, DType target_dtype, void* loss,
                    DType loss_dtype, void* dy, DType dy_dtype, std::int64_t n, float scale, float* partials,
                    cudaStream_t stream);

// Per row (blocks stride over rows): m = max, lse = m + log(sum exp(x - m)),
// row loss = lse - x[label]; dlogits = scale * (softmax - onehot) / rows
// (dlogits may be logits). Labels are class indices held as fp32; one outside
// [0, classes) makes that row's loss NaN and its onehot empty. Per-block
// sums go to partials, then loss[0] = sum / rows. Deterministic.
void train_xent_loss(const void* logits, DType logits_dtype, const void* labels, DType labels_dtype, void* loss,
                     DType loss_dtype, void* dlogits, DType dlogits_dtype, std::int64_t rows, std::int64_t classes,
                     float scale, float* partials, cudaStream_t stream);

// out[0..3] (fp32) = sumsq of the finite values, count of NaN/inf, count of
// exact zeros, count of nonzero |v| < 2^-14, over t's first n values. out is
// zeroed here (cudaMemsetAsync), then each block adds its sums with atomicAdd.
void train_stats(const void* t, DType dtype, std::int64_t n, float* out, cudaStream_t stream);

// t[index] = value, rounded to t's dtype.
void train_poke(void* t, DType dtype, std::int64_t index, float value, cudaStream_t stream);

// p -= lr * (weight_decay * p + grad_scale * g): SGD whose decoupled weight
// decay (p -= lr * wd * p) equals the coupled one, both from the old p.
void train_sgd(float* p, const void* g, DType g_dtype, std::int64_t n, float lr, float weight_decay,
               float grad_scale, cudaStream_t stream);

// torch.optim.AdamW: g *= grad_scale; p *= 1 - lr * wd; m = b1 m + (1 - b1) g;
// v = b2 v + (1 - b2) g^2; p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),
// with bc1 = 1 - b1^step, bc2 = 1 - b2^step computed by the caller.
void train_adamw(float* p, const void* g, DType g_dtype, float* m, float* v, std::int64_t n, float lr, float beta1,
                 float beta2, float eps, float weight_decay, float bc1, float bc2, float grad_scale,
                 cudaStream_t stream);

}  // namespace sb::cuda_kernels
