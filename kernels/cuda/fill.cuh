// Elementwise device kernels that prepare GEMM operands: fill with seeded
// uniform values, and convert between fp32 and a stored dtype. The launchers
// are host functions; every launch is checked, and all work is enqueued on
// the given stream (nothing here synchronizes).
//
// Only files under kernels/cuda (and the gpu tests, for uniform_value)
// include this; it brings in cuda_runtime.h.
#pragma once

#include <cstdint>  // std::int64_t, std::uint64_t

#include <cuda_runtime.h>  // cudaStream_t

#include "harness/dtype.hpp"  // DType

namespace sb::cuda_kernels {

// dst[i] = round_to(dtype, u(seed, i)) for i in [0, count), where u is uniform
// in [-1, 1) and depends only on (seed, i): counter-based, so the same seed
// gives the same operand on any grid and any device.
void fill_uniform(void* dst, DType dtype, std::int64_t count, std::uint64_t seed,
                  cudaStream_t stream);

// dst (dtype) = src (fp32), rounded to nearest even; fp8 e4m3 saturates at +-448.
void convert_from_fp32(void* dst, DType dtype, const float* src, std::int64_t count,
                       cudaStream_t stream);

// dst (fp32) = src (dtype), exact.
void convert_to_fp32(float* dst, const void* src, DType dtype, std::int64_t count,
                     cudaStream_t stream);

// The host twin of the value fill_uniform stores before rounding, so a CPU
// reference can rebuild an operand without copying it back.
float uniform_value(std::uint64_t seed, std::int64_t index);

}  // namespace sb::cuda_kernels
