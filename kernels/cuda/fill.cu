#include "kernels/cuda/fill.cuh"

#include <algorithm>  // std::min

#include <cuda_bf16.h>  // __nv_bfloat16, __float2bfloat16_rn
#include <cuda_fp16.h>  // __half, __float2half_rn
#include <cuda_fp8.h>   // __nv_fp8_e4m3

#include "kernels/cuda/detail/check.hpp"  // SB_CUDA_CHECK_LAUNCH

namespace sb::cuda_kernels {

namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any GPU several times over; the grid-stride loop
// covers the rest, so very large counts need no larger grid.
constexpr std::int64_t kMaxBlocks = 4096;

int blocks_for(std::int64_t count) {
  return int(std::min<std::int64_t>((count + kThreads - 1) / kThreads, kMaxBlocks));
}

// splitmix64's finalizer: a bijective mix, so distinct (seed, index) pairs
// map to well spread 64-bit values.
__host__ __device__ inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [-1, 1): the top 24 bits give a float in [0, 1) exactly, so the
// device and host computations agree bit for bit.
__host__ __device__ inline float uniform_at(std::uint64_t seed, std::int64_t i) {
  const std::uint64_t key = mix64(seed + 0x9e3779b97f4a7c15ull);
  const std::uint64_t bits = mix64(key + std::uint64_t(i) * 0x9e3779b97f4a7c15ull);
  const float u01 = float(bits >> 40) * (1.0f / 16777216.0f);  // 2^-24
  return 2.0f * u01 - 1.0f;
}

// The stored type of each dtype (tf32 is stored as fp32), and fp32 <-> T with
// round to nearest even (fp8: saturate to the largest finite, +-448).
template <DType D> struct Storage;
template <> struct Storage<DType::fp32> {
  using T = float;
  __device__ static T from(float x) { return x; }
  __device__ static float to(T x) { return x; }
};
template <> struct Storage<DType::tf32> : Storage<DType::fp32> {};
template <> struct Storage<DType::bf16> {
  using T = __nv_bfloat16;
  __device__ static T from(float x) { return __float2bfloat16_rn(x); }
  __device__ static float to(T x) { return __bfloat162float(x); }
};
template <> struct Storage<DType::fp16> {
  using T = __half;
  __device__ static T from(float x) { return __float2half_rn(x); }
  __device__ static float to(T x) { return __half2float(x); }
};
template <> struct Storage<DType::fp8_e4m3> {
  using T = __nv_fp8_e4m3;
  __device__ static T from(float x) { return T(x); }  // RNE, __NV_SATFINITE
  __device__ static float to(T x) { return float(x); }
};

template <DType D>
__global__ void fill_kernel(typename Storage<D>::T* dst, std::int64_t count, std::uint64_t seed) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride)
    dst[i] = Storage<D>::from(uniform_at(seed, i));
}

template <DType D>
__global__ void from_fp32_kernel(typename Storage<D>::T* dst, const float* src,
                                 std::int64_t count) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride)
    dst[i] = Storage<D>::from(src[i]);
}

template <DType D>
__global__ void to_fp32_kernel(float* dst, const typename Storage<D>::T* src,
                               std::int64_t count) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride)
    dst[i] = Storage<D>::to(src[i]);
}

template <DType D>
void launch_fill(void* dst, std::int64_t count, std::uint64_t seed, cudaStream_t stream) {
  using T = typename Storage<D>::T;
  fill_kernel<D><<<blocks_for(count), kThreads, 0, stream>>>(static_cast<T*>(dst), count, seed);
  SB_CUDA_CHECK_LAUNCH();
}

template <DType D>
void launch_from_fp32(void* dst, const float* src, std::int64_t count, cudaStream_t stream) {
  using T = typename Storage<D>::T;
  from_fp32_kernel<D><<<blocks_for(count), kThreads, 0, stream>>>(static_cast<T*>(dst), src,
                                                                   count);
  SB_CUDA_CHECK_LAUNCH();
}

template <DType D>
void launch_to_fp32(float* dst, const void* src, std::int64_t count, cudaStream_t stream) {
  using T = typename Storage<D>::T;
  to_fp32_kernel<D><<<blocks_for(count), kThreads, 0, stream>>>(dst, static_cast<const T*>(src),
                                                                 count);
  SB_CUDA_CHECK_LAUNCH();
}

}  // namespace

float uniform_value(std::uint64_t seed, std::int64_t index) { return uniform_at(seed, index); }

void fill_uniform(void* dst, DType dtype, std::int64_t count, std::uint64_t seed,
                  cudaStream_t stream) {
  if (count <= 0) return;  // a zero-block launch is an error, and there is nothing to do
  switch (dtype) {
    case DType::fp32:
    case DType::tf32: return launch_fill<DType::fp32>(dst, count, seed, stream);
    case DType::bf16: return launch_fill<DType::bf16>(dst, count, seed, stream);
    case DType::fp16: return launch_fill<DType::fp16>(dst, count, seed, stream);
    case DType::fp8_e4m3: return launch_fill<DType::fp8_e4m3>(dst, count, seed, stream);
  }
}

void convert_from_fp32(void* dst, DType dtype, const float* src, std::int64_t count,
                       cudaStream_t stream) {
  if (count <= 0) return;
  switch (dtype) {
    case DType::fp32:
    case DType::tf32:
      // Same storage: a device-to-device copy. tf32 rounding happens inside
      // the tensor-core GEMM, not in memory.
      SB_CUDA_CHECK(cudaMemcpyAsync(dst, src, std::size_t(count) * sizeof(float),
                                    cudaMemcpyDeviceToDevice, stream));
      return;
    case DType::bf16: return launch_from_fp32<DType::bf16>(dst, src, count, stream);
    case DType::fp16: return launch_from_fp32<DType::fp16>(dst, src, count, stream);
    case DType::fp8_e4m3: return launch_from_fp32<DType::fp8_e4m3>(dst, src, count, stream);
  }
}

void convert_to_fp32(float* dst, const void* src, DType dtype, std::int64_t count,
                     cudaStream_t stream) {
  if (count <= 0) return;
  switch (dtype) {
    case DType::fp32:
    case DType::tf32:
      SB_CUDA_CHECK(cudaMemcpyAsync(dst, src, std::size_t(count) * sizeof(float),
                                    cudaMemcpyDeviceToDevice, stream));
      return;
    case DType::bf16: return launch_to_fp32<DType::bf16>(dst, src, count, stream);
    case DType::fp16: return launch_to_fp32<DType::fp16>(dst, src, count, stream);
    case DType::fp8_e4m3: return launch_to_fp32<DType::fp8_e4m3>(dst, src, count, stream);
  }
}

}  // namespace sb::cuda_kernels
