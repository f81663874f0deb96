// Checking macros for the CUDA runtime, cuBLAS(Lt) and cuDNN (its C API and
// the cudnn-frontend graph API), built on SB_CHECK_CALL. A failed call throws
// the typed error its status means: an allocation failure is OutOfMemory
// (reported as a point with status "oom"), an unsupported configuration is
// UnsupportedError ("skipped"), anything else is a runtime Error. Included
// only by files under kernels/cuda.
#pragma once

#include <cuda_runtime.h>  // cudaError_t, cudaGetErrorName, cudaGetLastError
#include <cublasLt.h>      // cublasStatus_t, cublasLtGetStatusName

#include <string>  // std::string, std::to_string

#ifdef STALLBENCH_HAVE_CUDNN
#include <cudnn_graph.h>  // cudnnStatus_t, cudnnGetErrorString (the C API; not the frontend)
#endif

#include "harness/errors.hpp"  // SB_CHECK_CALL, ErrorKind

namespace sb::cuda_detail {

inline bool cuda_ok(cudaError_t s) { return s == cudaSuccess; }
inline ErrorKind cuda_kind(cudaError_t s) {
  return s == cudaErrorMemoryAllocation ? ErrorKind::oom : ErrorKind::runtime;
}
// Called only for a failed call, as it is reported: a failed runtime call also sets the thread's last
// error (cudaGetLastError "returns the last error ... and resets it"), which the next launch check would
// report against an unrelated point; it is cleared here. A sticky error (a kernel fault) stays sticky.
inline const char* cuda_name(cudaError_t s) {
  (void)cudaGetLastError();
  return cudaGetErrorName(s);
}

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

#ifdef STALLBENCH_HAVE_CUDNN
// cuDNN 9 groups its status codes by thousands: 3xxx "not supported" (shape,
// layout, arch), 4003/4004 failed host/device allocations.
inline bool cudnn_ok(cudnnStatus_t s) { return s == CUDNN_STATUS_SUCCESS; }
inline ErrorKind cudnn_kind(cudnnStatus_t s) {
  if (s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
      s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
    return ErrorKind::oom;
  if (int(s) / 1000 * 1000 == int(CUDNN_STATUS_NOT_SUPPORTED)) return ErrorKind::unsupported;
  return ErrorKind::runtime;
}
inline const char* cudnn_name(cudnnStatus_t s) { return cudnnGetErrorString(s); }

// The cudnn-frontend graph API returns an error_object {code, err_msg}. Only
// cudnn_sdpa.cpp includes the frontend, so these are templates over that
// type: the enum's names are found through decltype(e.code) where they are
// instantiated, and no other file needs the frontend's headers. A graph the
// installed cuDNN cannot run (no engine, no heuristic, unsupported pattern)
// is "unsupported"; the message the frontend gives is the reason.
template <class FeError>
bool cudnn_fe_ok(const FeError& e) {
  return e.is_good();
}
template <class FeError>
ErrorKind cudnn_fe_kind(const FeError& e) {
  using Code = decltype(e.code);
  switch (e.code) {
    case Code::GRAPH_NOT_SUPPORTED:
    case Code::GRAPH_EXECUTION_PLAN_CREATION_FAILED:
    case Code::HEURISTIC_QUERY_FAILED:
    case Code::UNSUPPORTED_GRAPH_FORMAT: return ErrorKind::unsupported;
    default: return ErrorKind::runtime;
  }
}
template <class FeError>
std::string cudnn_fe_name(const FeError& e) {
  return e.err_msg.empty() ? std::string("error code ") + std::to_string(int(e.code)) : e.err_msg;
}
#endif

}  // namespace sb::cuda_detail

#define SB_CUDA_CHECK(expr)                                                                 \
  SB_CHECK_CALL("CUDA", expr, ::sb::cuda_detail::cuda_ok, ::sb::cuda_detail::cuda_kind,     \
                ::sb::cuda_detail::cuda_name)

#define SB_CUBLAS_CHECK(expr)                                                                  \
  SB_CHECK_CALL("cuBLAS", expr, ::sb::cuda_detail::cublas_ok, ::sb::cuda_detail::cublas_kind, \
                ::sb::cuda_detail::cublas_name)

#ifdef STALLBENCH_HAVE_CUDNN
#define SB_CUDNN_CHECK(expr)                                                                 \
  SB_CHECK_CALL("cuDNN", expr, ::sb::cuda_detail::cudnn_ok, ::sb::cuda_detail::cudnn_kind,   \
                ::sb::cuda_detail::cudnn_name)

// For cudnn_frontend::error_t results (graph validate, build, execute).
#define SB_CUDNN_FE_CHECK(expr)                                                               \
  SB_CHECK_CALL("cudnn-frontend", expr, ::sb::cuda_detail::cudnn_fe_ok,                       \
                ::sb::cuda_detail::cudnn_fe_kind, ::sb::cuda_detail::cudnn_fe_name)
#endif

// After every kernel launch: a bad configuration (grid, shared memory, missing
// sm_XX image) is reported by the launch itself, not by a later sync.
// cudaGetLastError also clears the error; a failed call reported through
// cuda_name clears it too, and callers that handle a failed runtime call
// themselves (e.g. an out-of-memory cudaMalloc) must clear it, or the next
// launch check would report that stale failure.
#define SB_CUDA_CHECK_LAUNCH() SB_CUDA_CHECK(cudaGetLastError())
