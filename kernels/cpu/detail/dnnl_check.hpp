// oneDNN's C++ API reports failure by throwing dnnl::error; this member of the
// checking-macro family turns it into the harness's typed errors with the
// call, file and line: out_of_memory -> OutOfMemory, unimplemented ->
// UnsupportedError, the rest -> Error(runtime).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>  // dnnl::error, dnnl_status_t

#include "harness/errors.hpp"  // throw_call_failure, ErrorKind

namespace sb::cpu {

inline ErrorKind dnnl_status_kind(dnnl_status_t s) {
  switch (s) {
    case dnnl_out_of_memory: return ErrorKind::oom;
    case dnnl_unimplemented: return ErrorKind::unsupported;
    default: return ErrorKind::runtime;
  }
}

inline const char* dnnl_status_name(dnnl_status_t s) {
  switch (s) {
    case dnnl_success: return "dnnl_success";
    case dnnl_out_of_memory: return "dnnl_out_of_memory";
    case dnnl_invalid_arguments: return "dnnl_invalid_arguments";
    case dnnl_unimplemented: return "dnnl_unimplemented";
    case dnnl_iterator_ends: return "dnnl_iterator_ends";
    case dnnl_runtime_error: return "dnnl_runtime_error";
    case dnnl_not_required: return "dnnl_not_required";
    default: return "dnnl status (unknown)";
  }
}

}  // namespace sb::cpu

// Evaluates expr (which may be a declaration's initializer expression); a
// thrown dnnl::error becomes a typed sb error. Usage:
//   auto pd = SB_DNNL_CHECK(dnnl::matmul::primitive_desc(desc, eng));
#define SB_DNNL_CHECK(expr)                                                                 \
  [&]() -> auto {                                                                           \
    try {                                                                                   \
      return (expr);                                                                        \
    } catch (const dnnl::error& sb_e_) {                                                    \
      ::sb::throw_call_failure(::sb::cpu::dnnl_status_kind(sb_e_.status), "oneDNN", #expr,  \
                               ::sb::cpu::dnnl_status_name(sb_e_.status), __FILE__, __LINE__); \
    }                                                                                       \
  }()
