#include "kernels/cuda/train_kernels.cuh"

#include <algorithm>  // std::min
#include <cmath>      // INFINITY
#include <string>     // std::string

#include <cuda_bf16.h>  // __nv_bfloat16, __float2bfloat16_rn, __bfloat162float
#include <cuda_fp16.h>  // __half, __float2half_rn, __half2float

#include "harness/errors.hpp"             // Error
#include "kernels/cuda/detail/check.hpp"  // SB_CUDA_CHECK, SB_CUDA_CHECK_LAUNCH
#include "kernels/cuda/detail/block_reduce.cuh"  // block_reduce, Max, Sum

namespace sb::cuda_kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Grid-stride loops: enough blocks to fill any GPU several times over.
constexpr std::int64_t kMaxBlocks = 4096;

int blocks_for(std::int64_t count, std::int64_t max_blocks = kMaxBlocks) {
  return int(std::min<std::int64_t>((count + kThreads - 1) / kThreads, max_blocks));
}
// Kernels that give one block to a row at a time (rows strided over blocks).
int row_blocks(std::int64_t rows, std::int64_t max_blocks = kMaxBlocks) {
  return int(std::min<std::int64_t>(rows, max_blocks));
}

// ---- typed access: every tensor is (pointer, dtype), read and written as fp32 ----

__device__ inline float ld(const void* p, DType d, std::int64_t i) {
  switch (d) {
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::fp16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Round to nearest even; fp16 overflows to inf and flushes below 2^-24 to 0.
__device__ inline void st(void* p, DType d, std::int64_t i, float x) {
  switch (d) {
    case DType::bf16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x); return;
    case DType::fp16: static_cast<__half*>(p)[i] = __float2half_rn(x); return;
    default: static_cast<float*>(p)[i] = x; return;
  }
}

// x as the dtype stores it (what a later read of a stored value returns).
__device__ inline float rounded(DType d, float x) {
  switch (d) {
    case DType::bf16: return __bfloat162float(__float2bfloat16_rn(x));
    case DType::fp16: return __half2float(__float2half_rn(x));
    default: return x;
  }
}

__device__ inline std::int64_t first_index() { return std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline std::int64_t grid_stride() { return std::int64_t(gridDim.x) * blockDim.x; }

// ---- activations: the tanh approximation of gelu, as torch's approximate='tanh' ----

constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluKappa = 0.044715f;

__device__ inline float act_forward(TrainAct a, float x) {
  switch (a) {
    case TrainAct::none: return x;
    case TrainAct::relu: return (x > 0.0f || isnan(x)) ? x : 0.0f;  // NaN propagates, as torch.relu
    case TrainAct::gelu: return 0.5f * x * (1.0f + tanhf(kGeluBeta * (x + kGeluKappa * x * x * x)));
    case TrainAct::sigmoid: return 1.0f / (1.0f + expf(-x));
    case TrainAct::tanh: return tanhf(x);
  }
  return x;
}

// dy * act'(z). relu selects (torch's threshold_backward): dy where z > 0,
// else 0, so an inf dy on the flat side gives 0, not NaN.
__device__ inline float act_grad(TrainAct a, float dy, float z) {
  switch (a) {
    case TrainAct::none: return dy;
    case TrainAct::relu: return z > 0.0f ? dy : 0.0f;
    case TrainAct::gelu: {
      const float t = tanhf(kGeluBeta * (z + kGeluKappa * z * z * z));
      const float left = 0.5f * (1.0f + t);
      const float right = 0.5f * z * (1.0f - t * t) * kGeluBeta * (1.0f + 3.0f * kGeluKappa * z * z);
      return dy * (left + right);
    }
    case TrainAct::sigmoid: {
      const float s = 1.0f / (1.0f + expf(-z));
      return dy * s * (1.0f - s);
    }
    case TrainAct::tanh: {
      const float t = tanhf(z);
      return dy * (1.0f - t * t);
    }
  }
  return dy;
}

// ---- block reductions ----

using detail::Max;
using detail::Sum;
// The block-wide reduction (detail/block_reduce.cuh) over this file's blocks of kThreads.
template <class Op>
__device__ float block_reduce(float v, Op op, float* scratch /* kWarps + 1 */) {
  return detail::block_reduce<kThreads>(v, op, scratch);
}

// ---- kernels ----

__global__ void __launch_bounds__(kThreads)
    cast_kernel(const void* src, DType sd, void* dst, DType dd, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) st(dst, dd, i, ld(src, sd, i));
}

__global__ void __launch_bounds__(kThreads)
    bias_act_kernel(void* z, DType zd, const void* bias, DType bd, TrainAct act, const void* res, DType rd, void* y,
                    DType yd, std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    float zv = ld(z, zd, i);
    if (bias != nullptr) {
      zv = rounded(zd, zv + ld(bias, bd, i % cols));
      st(z, zd, i, zv);
    }
    float yv = act_forward(act, zv);
    if (res != nullptr) yv += ld(res, rd, i);
    st(y, yd, i, yv);
  }
}

__global__ void __launch_bounds__(kThreads) act_backward_kernel(const void* dy, DType dyd, const void* z, DType zd,
                                                                 TrainAct act, void* dz, DType dzd, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride())
    st(dz, dzd, i, act_grad(act, ld(dy, dyd, i), ld(z, zd, i)));
}

__global__ void __launch_bounds__(kThreads)
    bias_grad_kernel(const void* dz, DType dzd, void* db, DType dbd, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t j = first_index(); j < cols; j += grid_stride()) {
    float acc = 0.0f;
    for (std::int64_t r = 0; r < rows; ++r) acc += ld(dz, dzd, r * cols + j);
    st(db, dbd, j, acc);
  }
}

__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(const void* x, DType xd, void* y, DType yd, float* rstd,
                                                            std::int64_t rows, std::int64_t cols, float eps) {
  __shared__ float scratch[kWarps + 1];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::int64_t base = r * cols;
    float ss = 0.0f;
    for (std::int64_t j = threadIdx.x; j < cols; j += kThreads) {
      const float v = ld(x, xd, base + j);
      ss += v * v;
    }
    ss = block_reduce(ss, Sum{}, scratch);
    const float inv = 1.0f / sqrtf(ss / float(cols) + eps);
    if (threadIdx.x == 0) rstd[r] = inv;
    for (std::int64_t j = threadIdx.x; j < cols; j += kThreads) st(y, yd, base + j, ld(x, xd, base + j) * inv);
  }
}

__global__ void __launch_bounds__(kThreads)
    rmsnorm_backward_kernel(const void* dy, DType dyd, const void* y, DType yd, const float* rstd, void* dx, DType dxd,
                            std::int64_t rows, std::int64_t cols) {
  __shared__ float scratch[kWarps + 1];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::int64_t base = r * cols;
    float dot = 0.0f;
    for (std::int64_t j = threadIdx.x; j < cols; j += kThreads) dot += ld(dy, dyd, base + j) * ld(y, yd, base + j);
    dot = block_reduce(dot, Sum{}, scratch) / float(cols);
    const float inv = rstd[r];
    for (std::int64_t j = threadIdx.x; j < cols; j += kThreads)
      st(dx, dxd, base + j, inv * (ld(dy, dyd, base + j) - ld(y, yd, base + j) * dot));
  }
}

// Each block's sum of (y - t)^2 into partials[blockIdx.x]; dy written.
__global__ void __launch_bounds__(kThreads)
    mse_kernel(const void* y, DType yd, const void* t, DType td, void* dy, DType dyd, std::int64_t n, float coef,
               float* partials) {
  __shared__ float scratch[kWarps + 1];
  float acc = 0.0f;
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const float d = ld(y, yd, i) - ld(t, td, i);
    acc += d * d;
    st(dy, dyd, i, coef * d);
  }
  acc = block_reduce(acc, Sum{}, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Rows strided over blocks; each block adds its rows' losses in row order
// into partials[blockIdx.x].
__global__ void __launch_bounds__(kThreads)
    xent_kernel(const void* logits, DType xd, const void* labels, DType lbd, void* dlogits, DType gd,
                std::int64_t rows, std::int64_t classes, float scale, float* partials) {
  __shared__ float scratch[kWarps + 1];
  float block_loss = 0.0f;  // meaningful in thread 0
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::int64_t base = r * classes;
    const float lab = ld(labels, lbd, r);
    const bool valid = lab >= 0.0f && lab < float(classes) && floorf(lab) == lab;
    const std::int64_t label = valid ? std::int64_t(lab) : -1;
    // The label's logit, read (by the thread that uses it) before the
    // reductions' barriers, behind which dlogits may overwrite the row.
    const float picked = threadIdx.x == 0 && valid ? ld(logits, xd, base + label) : NAN;

    float m = -INFINITY;
    for (std::int64_t j = threadIdx.x; j < classes; j += kThreads) m = fmaxf(m, ld(logits, xd, base + j));
    m = block_reduce(m, Max{}, scratch);
    float sum = 0.0f;
    for (std::int64_t j = threadIdx.x; j < classes; j += kThreads) sum += expf(ld(logits, xd, base + j) - m);
    sum = block_reduce(sum, Sum{}, scratch);
    if (threadIdx.x == 0) block_loss += m + logf(sum) - picked;
    const float inv = 1.0f / sum;
    for (std::int64_t j = threadIdx.x; j < classes; j += kThreads) {
      const float p = expf(ld(logits, xd, base + j) - m) * inv;
      st(dlogits, gd, base + j, scale * (p - (j == label ? 1.0f : 0.0f)) / float(rows));
    }
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = block_loss;
}

// loss[0] = (sum of partials[0..count), in a fixed order) / divisor.
__global__ void __launch_bounds__(kThreads)
    finalize_mean_kernel(const float* partials, int count, double divisor, void* loss, DType lossd) {
  __shared__ float scratch[kWarps + 1];
  float acc = 0.0f;
  for (int i = int(threadIdx.x); i < count; i += kThreads) acc += partials[i];
  acc = block_reduce(acc, Sum{}, scratch);
  if (threadIdx.x == 0) st(loss, lossd, 0, float(double(acc) / divisor));
}

__global__ void __launch_bounds__(kThreads) stats_kernel(const void* t, DType d, std::int64_t n, float* out) {
  __shared__ float scratch[kWarps + 1];
  constexpr float kSmallestNormalFp16 = 0x1p-14f;
  float sumsq = 0.0f, nonfinite = 0.0f, zero = 0.0f, tiny = 0.0f;
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const float v = ld(t, d, i);
    if (!isfinite(v)) {
      nonfinite += 1.0f;
    } else {
      sumsq += v * v;
      if (v == 0.0f)
        zero += 1.0f;
      else if (fabsf(v) < kSmallestNormalFp16)
        tiny += 1.0f;
    }
  }
  sumsq = block_reduce(sumsq, Sum{}, scratch);
  nonfinite = block_reduce(nonfinite, Sum{}, scratch);
  zero = block_reduce(zero, Sum{}, scratch);
  tiny = block_reduce(tiny, Sum{}, scratch);
  if (threadIdx.x == 0) {
    atomicAdd(out + 0, sumsq);
    atomicAdd(out + 1, nonfinite);
    atomicAdd(out + 2, zero);
    atomicAdd(out + 3, tiny);
  }
}

__global__ void poke_kernel(void* t, DType d, std::int64_t index, float value) { st(t, d, index, value); }

__global__ void __launch_bounds__(kThreads)
    sgd_kernel(float* p, const void* g, DType gd, std::int64_t n, float lr, float wd, float grad_scale) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const float gv = ld(g, gd, i) * grad_scale;
    p[i] -= lr * (wd * p[i] + gv);
  }
}

__global__ void __launch_bounds__(kThreads)
    adamw_kernel(float* p, const void* g, DType gd, float* m, float* v, std::int64_t n, float lr, float beta1,
                 float beta2, float eps, float wd, float bc1, float bc2, float grad_scale) {
  const float step_size = lr / bc1;
  const float bc2_sqrt = sqrtf(bc2);
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const float gv = ld(g, gd, i) * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * gv;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gv * gv;
    m[i] = mi;
    v[i] = vi;
    const float pi = p[i] * (1.0f - lr * wd);
    p[i] = pi - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
  }
}

// ---- host checks ----

void check_dtype(DType d, const char* op, const char* what) {
  if (d == DType::fp32 || d == DType::bf16 || d == DType::fp16) return;
  throw Error(ErrorKind::runtime, std::string("cuda train op ") + op + ": " + what + " is " +
                                      std::string(to_string(d)) + " (fp32, bf16 or fp16 only)");
}

}  // namespace

void train_cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n, cudaStream_t stream) {
  check_dtype(src_dtype, "cast", "src");
  check_dtype(dst_dtype, "cast", "dst");
  if (n <= 0) return;
  if (src_dtype == dst_dtype) {
    if (src != dst)
      SB_CUDA_CHECK(cudaMemcpyAsync(dst, src, std::size_t(n) * std::size_t(storage_bytes(src_dtype)),
                                    cudaMemcpyDeviceToDevice, stream));
    return;
  }
  cast_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, src_dtype, dst, dst_dtype, n);
  SB_CUDA_CHECK_LAUNCH();
}

void train_bias_act(void* z, DType z_dtype, const void* bias, DType bias_dtype, TrainAct act, const void* residual,
                    DType residual_dtype, void* y, DType y_dtype, std::int64_t rows, std::int64_t cols,
                    cudaStream_t stream) {
  check_dtype(z_dtype, "bias_act", "z");
  if (bias != nullptr) check_dtype(bias_dtype, "bias_act", "bias");
  if (residual != nullptr) check_dtype(residual_dtype, "bias_act", "residual");
  check_dtype(y_dtype, "bias_act", "y");
  if (rows <= 0 || cols <= 0) return;
  bias_act_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(z, z_dtype, bias, bias_dtype, act, residual,
                                                                     residual_dtype, y, y_dtype, rows, cols);
  SB_CUDA_CHECK_LAUNCH();
}

void train_act_backward(const void* dy, DType dy_dtype, const void* z, DType z_dtype, TrainAct act, void* dz,
                        DType dz_dtype, std::int64_t n, cudaStream_t stream) {
  check_dtype(dy_dtype, "act_backward", "dy");
  check_dtype(z_dtype, "act_backward", "z");
  check_dtype(dz_dtype, "act_backward", "dz");
  if (n <= 0) return;
  act_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dy, dy_dtype, z, z_dtype, act, dz, dz_dtype, n);
  SB_CUDA_CHECK_LAUNCH();
}

void train_bias_grad(const void* dz, DType dz_dtype, void* db, DType db_dtype, std::int64_t rows, std::int64_t cols,
                     cudaStream_t stream) {
  check_dtype(dz_dtype, "bias_grad", "dz");
  check_dtype(db_dtype, "bias_grad", "db");
  if (cols <= 0) return;
  if (rows <= 0) {  // a sum over no rows
    SB_CUDA_CHECK(cudaMemsetAsync(db, 0, std::size_t(cols) * std::size_t(storage_bytes(db_dtype)), stream));
    return;
  }
  bias_grad_kernel<<<blocks_for(cols), kThreads, 0, stream>>>(dz, dz_dtype, db, db_dtype, rows, cols);
  SB_CUDA_CHECK_LAUNCH();
}

void train_rmsnorm(const void* x, DType x_dtype, void* y, DType y_dtype, float* rstd, std::int64_t rows,
                   std::int64_t cols, float eps, cudaStream_t stream) {
  check_dtype(x_dtype, "rmsnorm", "x");
  check_dtype(y_dtype, "rmsnorm", "y");
  if (rows <= 0 || cols <= 0) return;
  rmsnorm_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(x, x_dtype, y, y_dtype, rstd, rows, cols, eps);
  SB_CUDA_CHECK_LAUNCH();
}

void train_rmsnorm_backward(const void* dy, DType dy_dtype, const void* y, DType y_dtype, const float* rstd,
                            void* dx, DType dx_dtype, std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  check_dtype(dy_dtype, "rmsnorm_backward", "dy");
  check_dtype(y_dtype, "rmsnorm_backward", "y");
  check_dtype(dx_dtype, "rmsnorm_backward", "dx");
  if (rows <= 0 || cols <= 0) return;
  rmsnorm_backward_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(dy, dy_dtype, y, y_dtype, rstd, dx, dx_dtype,
                                                                      rows, cols);
  SB_CUDA_CHECK_LAUNCH();
}

void train_mse_loss(const void* y, DType y_dtype, const void* target, DType target_dtype, void* loss,
                    DType loss_dtype, void* dy, DType dy_dtype, std::int64_t n, float scale, float* partials,
                    cudaStream_t stream) {
  check_dtype(y_dtype, "mse_loss", "y");
  check_dtype(target_dtype, "mse_loss", "target");
  check_dtype(loss_dtype, "mse_loss", "loss");
  check_dtype(dy_dtype, "mse_loss", "dy");
  if (n <= 0) return;
  const int blocks = blocks_for(n, kTrainPartials);
  const float coef = float(2.0 * double(scale) / double(n));
  mse_kernel<<<blocks, kThreads, 0, stream>>>(y, y_dtype, target, target_dtype, dy, dy_dtype, n, coef, partials);
  SB_CUDA_CHECK_LAUNCH();
  finalize_mean_kernel<<<1, kThreads, 0, stream>>>(partials, blocks, double(n), loss, loss_dtype);
  SB_CUDA_CHECK_LAUNCH();
}

void train_xent_loss(const void* logits, DType logits_dtype, const void* labels, DType labels_dtype, void* loss,
                     DType loss_dtype, void* dlogits, DType dlogits_dtype, std::int64_t rows, std::int64_t classes,
                     float scale, float* partials, cudaStream_t stream) {
  check_dtype(logits_dtype, "xent_loss", "logits");
  check_dtype(labels_dtype, "xent_loss", "labels");
  check_dtype(loss_dtype, "xent_loss", "loss");
  check_dtype(dlogits_dtype, "xent_loss", "dlogits");
  if (rows <= 0 || classes <= 0) return;
  const int blocks = row_blocks(rows, kTrainPartials);
  xent_kernel<<<blocks, kThreads, 0, stream>>>(logits, logits_dtype, labels, labels_dtype, dlogits, dlogits_dtype,
                                               rows, classes, scale, partials);
  SB_CUDA_CHECK_LAUNCH();
  finalize_mean_kernel<<<1, kThreads, 0, stream>>>(partials, blocks, double(rows), loss, loss_dtype);
  SB_CUDA_CHECK_LAUNCH();
}

void train_stats(const void* t, DType dtype, std::int64_t n, float* out, cudaStream_t stream) {
  check_dtype(dtype, "stats", "t");
  SB_CUDA_CHECK(cudaMemsetAsync(out, 0, 4 * sizeof(float), stream));
  if (n <= 0) return;
  stats_kernel<<<blocks_for(n), kThreads, 0, stream>>>(t, dtype, n, out);
  SB_CUDA_CHECK_LAUNCH();
}

void train_poke(void* t, DType dtype, std::int64_t index, float value, cudaStream_t stream) {
  check_dtype(dtype, "poke", "t");
  poke_kernel<<<1, 1, 0, stream>>>(t, dtype, index, value);
  SB_CUDA_CHECK_LAUNCH();
}

void train_sgd(float* p, const void* g, DType g_dtype, std::int64_t n, float lr, float weight_decay,
               float grad_scale, cudaStream_t stream) {
  check_dtype(g_dtype, "sgd", "g");
  if (n <= 0) return;
  sgd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, g, g_dtype, n, lr, weight_decay, grad_scale);
  SB_CUDA_CHECK_LAUNCH();
}

void train_adamw(float* p, const void* g, DType g_dtype, float* m, float* v, std::int64_t n, float lr, float beta1,
                 float beta2, float eps, float weight_decay, float bc1, float bc2, float grad_scale,
                 cudaStream_t stream) {
  check_dtype(g_dtype, "adamw", "g");
  if (n <= 0) return;
  adamw_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, g, g_dtype, m, v, n, lr, beta1, beta2, eps, weight_decay,
                                                       bc1, bc2, grad_scale);
  SB_CUDA_CHECK_LAUNCH();
}

}  // namespace sb::cuda_kernels
