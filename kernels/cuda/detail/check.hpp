// Checking macros for the CUDA runtime and cuBLAS(Lt), built on SB_CHECK_CALL.
// A failed call throws the typed error its status means: an allocation failure
// is OutOfMemory (reported as a point with status "oom"), an unsupported
// cuBLAS configuration is UnsupportedError ("skipped"), anything else is a
// runtime Error. Included only by files under kernels/cuda.
#pragma once

#include <cuda_runtime.h>  // cudaError_t, cudaGetErrorName, cudaGetLastError
#include <cublasLt.h>      // cublasStatus_t, cublasLtGetStatusName

#include "harness/errors.hpp"  // SB_CHECK_CALL, ErrorKind

namespace sb::cuda_detail {

inline bool cuda_ok(cudaError_t s) { return s == cudaSuccess; }
inline ErrorKind cuda_kind(cudaError_t s) {
  return s == cudaErrorMemoryAllocation ? ErrorKind::oom : ErrorKind::runtime;
}
inline const char* cuda_name(cudaError_t s) { return cudaGetErrorName(s); }

inline bool cublas_ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
inline ErrorKind cublas_kind(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_ALLOC_FAILED: return ErrorKind::oom;
    case CUBLAS_STATUS_NOT_SUPPORTED: return ErrorKind::unsupported;
    default: return ErrorKind::runtime;
  }
}
// cublasLtGetStatusName names the same cublasStatus_t values as
// cublasGetStatusName, but lives in libcublasLt, which this backend links
// anyway; the classic libcublas is then not needed for error text.
inline const char* cublas_name(cublasStatus_t s) { return cublasLtGetStatusName(s); }

}  // namespace sb::cuda_detail

#define SB_CUDA_CHECK(expr)                                                                 \
  SB_CHECK_CALL("CUDA", expr, ::sb::cuda_detail::cuda_ok, ::sb::cuda_detail::cuda_kind,     \
                ::sb::cuda_detail::cuda_name)

#define SB_CUBLAS_CHECK(expr)                                                                  \
  SB_CHECK_CALL("cuBLAS", expr, ::sb::cuda_detail::cublas_ok, ::sb::cuda_detail::cublas_kind, \
                ::sb::cuda_detail::cublas_name)

// After every kernel launch: a bad configuration (grid, shared memory, missing
// sm_XX image) is reported by the launch itself, not by a later sync.
// cudaGetLastError also clears the error, so callers that handle a failed
// runtime call themselves (e.g. an out-of-memory cudaMalloc) must clear it
// too, or the next launch check would report that stale failure.
#define SB_CUDA_CHECK_LAUNCH() SB_CUDA_CHECK(cudaGetLastError())
