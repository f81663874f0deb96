#include "kernels/cuda/softmax.cuh"

#include <cmath>  // INFINITY

#include <cuda_bf16.h>  // __nv_bfloat16, __float2bfloat16_rn
#include <cuda_fp16.h>  // __half, __float2half_rn

#include "harness/errors.hpp"             // Error
#include "kernels/cuda/detail/check.hpp"  // SB_CUDA_CHECK_LAUNCH
#include "kernels/cuda/detail/block_reduce.cuh"  // block_reduce, Max, Sum

namespace sb::cuda_kernels {
namespace {

// 256 threads: a row of 128 to 32k scores takes 1 to 128 strided passes.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ inline float load(float x) { return x; }
__device__ inline float load(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float load(__half x) { return __half2float(x); }

template <class T> __device__ T store(float x);
template <> __device__ inline float store<float>(float x) { return x; }
template <> __device__ inline __nv_bfloat16 store<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ inline __half store<__half>(float x) { return __float2half_rn(x); }

using detail::Max;
using detail::Sum;
// The block-wide reduction (detail/block_reduce.cuh) over this file's blocks of kThreads.
template <class Op>
__device__ float block_reduce(float v, Op op, float* scratch /* kWarps + 1 */) {
  return detail::block_reduce<kThreads>(v, op, scratch);
}

// Three passes over the row (max, sum of exponentials, write): simple, and
// the row stays in L2 between them. expf, not __expf: this is the reference
// path, not the fast one.
template <class T>
__global__ void __launch_bounds__(kThreads) softmax_forward_kernel(const float* s, T* p, int cols, bool causal) {
  __shared__ float scratch[kWarps + 1];
  const std::int64_t row = blockIdx.x;
  const float* in = s + row * cols;
  T* out = p + row * cols;
  const int valid = causal ? int(row % cols) + 1 : cols;

  float m = -INFINITY;
  for (int j = threadIdx.x; j < valid; j += kThreads) m = fmaxf(m, in[j]);
  m = block_reduce(m, Max{}, scratch);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < valid; j += kThreads) sum += expf(in[j] - m);
  sum = block_reduce(sum, Sum{}, scratch);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < cols; j += kThreads) out[j] = store<T>(j < valid ? expf(in[j] - m) * inv : 0.0f);
}

template <class T>
__global__ void __launch_bounds__(kThreads) softmax_backward_kernel(const T* p, const float* dp, T* ds, int cols) {
  __shared__ float scratch[kWarps + 1];
  const std::int64_t row = blockIdx.x;
  const T* prow = p + row * cols;
  const float* dprow = dp + row * cols;
  T* out = ds + row * cols;

  float dot = 0.0f;
  for (int j = threadIdx.x; j < cols; j += kThreads) dot += load(prow[j]) * dprow[j];
  dot = block_reduce(dot, Sum{}, scratch);
  for (int j = threadIdx.x; j < cols; j += kThreads) out[j] = store<T>(load(prow[j]) * (dprow[j] - dot));
}

// One block per row: gridDim.x allows 2^31 - 1 rows, far beyond any S x S
// buffer that fits in memory.
void check_grid(std::int64_t rows, int cols) {
  if (rows <= 0 || cols <= 0 || rows > 0x7fffffffLL)
    throw Error(ErrorKind::runtime, "softmax: " + std::to_string(rows) + " rows of " + std::to_string(cols) +
                                        " columns is outside one block per row");
}

template <class T>
void launch_forward(const float* s, void* p, std::int64_t rows, int cols, bool causal, cudaStream_t stream) {
  softmax_forward_kernel<T><<<unsigned(rows), kThreads, 0, stream>>>(s, static_cast<T*>(p), cols, causal);
  SB_CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_backward(const void* p, const float* dp, void* ds, std::int64_t rows, int cols, cudaStream_t stream) {
  softmax_backward_kernel<T>
      <<<unsigned(rows), kThreads, 0, stream>>>(static_cast<const T*>(p), dp, static_cast<T*>(ds), cols);
  SB_CUDA_CHECK_LAUNCH();
}

[[noreturn]] void bad_dtype(DType d) {
  throw Error(ErrorKind::runtime,
              std::string("softmax: no kernel for ") + std::string(to_string(d)) + " (fp32, bf16, fp16 only)");
}

}  // namespace

void softmax_rows_forward(const float* s, void* p, DType p_dtype, std::int64_t rows, int cols, bool causal,
                          cudaStream_t stream) {
  check_grid(rows, cols);
  switch (p_dtype) {
    case DType::fp32: return launch_forward<float>(s, p, rows, cols, causal, stream);
    case DType::bf16: return launch_forward<__nv_bfloat16>(s, p, rows, cols, causal, stream);
    case DType::fp16: return launch_forward<__half>(s, p, rows, cols, causal, stream);
    default: bad_dtype(p_dtype);
  }
}

void softmax_rows_backward(const void* p, const float* dp, void* ds, DType dtype, std::int64_t rows, int cols,
                           cudaStream_t stream) {
  check_grid(rows, cols);
  switch (dtype) {
    case DType::fp32: return launch_backward<float>(p, dp, ds, rows, cols, stream);
    case DType::bf16: return launch_backward<__nv_bfloat16>(p, dp, ds, rows, cols, stream);
    case DType::fp16: return launch_backward<__half>(p, dp, ds, rows, cols, stream);
    default: bad_dtype(dtype);
  }
}

}  // namespace sb::cuda_kernels
