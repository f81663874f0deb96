// Typed errors and the one family of checking macros every backend uses.
// A failed vendor call becomes a typed exception naming the call, file:line
// and (when set) the rank; the CLI maps the type to an exit code.
#pragma once

#include <chrono>     // std::chrono::steady_clock: when an OutOfMemory was raised
#include <stdexcept>  // std::runtime_error
#include <string>     // std::string
#include "harness/names.hpp"  // NameTable: to_string, parse and choices from one table

namespace sb {

enum class ErrorKind {
  usage,        // bad input from the user: exit 2
  runtime,      // a library or system call failed
  oom,          // an allocation failed: reported as point status "oom"
  hang,         // a wait passed its deadline: point status "hang"
  mismatch,     // a result failed its correctness check: status "error"
  unsupported,  // the device cannot run this combination: status "skipped"
};

inline constexpr NameTable<ErrorKind, 6> kErrorKindNames{{{{ErrorKind::usage, "usage"}, {ErrorKind::runtime, "runtime"}, {ErrorKind::oom, "oom"}, {ErrorKind::hang, "hang"}, {ErrorKind::mismatch, "mismatch"}, {ErrorKind::unsupported, "unsupported"}}}};
inline std::string_view to_string(ErrorKind v) { return kErrorKindNames.name(v); }

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

struct UsageError : Error {
  explicit UsageError(const std::string& w) : Error(ErrorKind::usage, w) {}
};
struct OutOfMemory : Error {
  explicit OutOfMemory(const std::string& w) : Error(ErrorKind::oom, w) {}
  // When the failing allocation raised it (a copy keeps it): the memory
  // scenario splits an attempt's time at it, before from unwinding after.
  std::chrono::steady_clock::time_point raised_at = std::chrono::steady_clock::now();
};
struct HangError : Error {
  explicit HangError(const std::string& w) : Error(ErrorKind::hang, w) {}
};
struct MismatchError : Error {
  explicit MismatchError(const std::string& w) : Error(ErrorKind::mismatch, w) {}
};
struct UnsupportedError : Error {
  explicit UnsupportedError(const std::string& w) : Error(ErrorKind::unsupported, w) {}
};

// The rank that error messages name; -1 (the default) means a single process.
void set_error_rank(int rank);
int error_rank();

// Throws the exception type that matches kind, with a message of the form
//   "<library> call failed: <call> -> <status> (file.cpp:42, rank 1)".
[[noreturn]] void throw_call_failure(ErrorKind kind, const char* library, const char* call,
                                     const std::string& status, const char* file, int line);

}  // namespace sb

// Each backend wraps this with its own status type, e.g.
//   #define SB_CUDA_CHECK(expr) SB_CHECK_CALL("CUDA", expr, cuda_status_ok, cuda_status_kind, cuda_status_name)
// ok(s) says whether a status is success; kind(s) maps a failure to ErrorKind
// (so allocation failures become OutOfMemory); name(s) gives its text.
// The macro is an expression statement: it never hides a return.
#define SB_CHECK_CALL(library, expr, ok, kind, name)                                  \
  do {                                                                                \
    const auto sb_status_ = (expr);                                                   \
    if (!ok(sb_status_))                                                              \
      ::sb::throw_call_failure(kind(sb_status_), library, #expr, name(sb_status_),    \
                               __FILE__, __LINE__);                                   \
  } while (0)
