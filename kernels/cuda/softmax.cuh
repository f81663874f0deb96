// Row softmax and its backward for naive attention (attention_naive.cpp):
// the kernels between the cuBLAS GEMMs of PyTorch's math path. One block per
// row, warp-shuffle reductions; every launch is checked and enqueued on the
// given stream (nothing here synchronizes).
//
// A "row" is one query's scores over all keys: the buffers hold `rows / cols`
// row-major cols x cols matrices back to back, so row r is query r % cols of
// its matrix. Only files under kernels/cuda include this; it brings in
// cuda_runtime.h.
#pragma once

#include <cstdint>  // std::int64_t

#include <cuda_runtime.h>  // cudaStream_t

#include "harness/dtype.hpp"  // DType

namespace sb::cuda_kernels {

// p = softmax(s) per row, written in p_dtype (fp32, bf16 or fp16). The scale
// is already in s (the QK^T GEMM's alpha). causal: key j > query i is masked
// (p = 0); every row keeps at least its diagonal, so no row is empty.
void softmax_rows_forward(const float* s, void* p, DType p_dtype, std::int64_t rows, int cols, bool causal,
                          cudaStream_t stream);

// ds = p * (dp - sum_j dp_j * p_j) per row: the softmax Jacobian applied to
// dp. p and ds share the dtype (fp32, bf16 or fp16); dp is fp32. Masked
// entries have p = 0, so they get ds = 0 without a mask.
void softmax_rows_backward(const void* p, const float* dp, void* ds, DType dtype, std::int64_t rows, int cols,
                           cudaStream_t stream);

}  // namespace sb::cuda_kernels
