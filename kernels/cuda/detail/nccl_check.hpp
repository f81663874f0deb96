// Checking macros for NCCL, built on SB_CHECK_CALL like the CUDA ones in
// check.hpp. NCCL has no status of its own for a failed allocation (it shows
// up as ncclUnhandledCudaError or ncclSystemError), so every failure is a
// runtime Error. Included only by files under kernels/cuda, and only when
// STALLBENCH_HAVE_NCCL is defined.
#pragma once

#include <nccl.h>  // ncclResult_t, ncclComm_t, ncclGetErrorString, ncclGetLastError

#include <string>  // std::string

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // SB_CHECK_CALL, ErrorKind

namespace sb::cuda_detail {

inline bool nccl_ok(ncclResult_t s) { return s == ncclSuccess; }

// On a non-blocking communicator (config.blocking = 0) ncclInProgress means
// "accepted, still being carried out in the background": the NCCL API
// reference documents it for ncclCommInitRankConfig, ncclCommFinalize, the
// collectives and ncclGroupEnd; ncclCommGetAsyncError then says when it is
// over. Calls that never run in the background use nccl_ok.
inline bool nccl_accepted(ncclResult_t s) { return s == ncclSuccess || s == ncclInProgress; }

inline ErrorKind nccl_kind(ncclResult_t) { return ErrorKind::runtime; }

inline const char* nccl_symbol(ncclResult_t s) {
  switch (s) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult_t(?)";
  }
}

// "ncclInvalidUsage (invalid usage ...)": the enum name to search for, and
// NCCL's sentence, which says which NCCL_DEBUG level tells more.
inline std::string nccl_name(ncclResult_t s) {
  return fmt::format("{} ({})", nccl_symbol(s), ncclGetErrorString(s));
}

// With a communicator at hand the message also carries ncclGetLastError(comm),
// NCCL's own account of the failure (e.g. "Duplicate GPU detected ..."), which
// otherwise only NCCL_DEBUG=WARN would print. A function object because
// SB_CHECK_CALL calls name(status) with the status alone.
struct NcclNameOn {
  ncclComm_t comm;
  std::string operator()(ncclResult_t s) const {
    const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
    if (last == nullptr || *last == '\0') return nccl_name(s);
    return fmt::format("{}: {}", nccl_name(s), last);
  }
};

}  // namespace sb::cuda_detail

// Calls that complete before they return (ncclGetUniqueId, ncclGetVersion,
// ncclCommGetAsyncError, ncclGroupStart, ncclCommDestroy, ...).
#define SB_NCCL_CHECK(expr)                                                                   \
  SB_CHECK_CALL("NCCL", expr, ::sb::cuda_detail::nccl_ok, ::sb::cuda_detail::nccl_kind,       \
                ::sb::cuda_detail::nccl_name)

// Calls on a non-blocking communicator that may return ncclInProgress; the
// caller polls ncclCommGetAsyncError(comm) before its next NCCL call or any
// CUDA work on the communicator's stream (see nccl_accepted).
#define SB_NCCL_CHECK_NONBLOCKING(comm, expr)                                                 \
  SB_CHECK_CALL("NCCL", expr, ::sb::cuda_detail::nccl_accepted, ::sb::cuda_detail::nccl_kind, \
                ::sb::cuda_detail::NcclNameOn{comm})
