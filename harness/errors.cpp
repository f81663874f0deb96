#include "harness/errors.hpp"

#include <atomic>  // std::atomic

#include <fmt/format.h>  // fmt::format

namespace sb {

namespace {
std::atomic<int> g_rank{-1};  // set once by a multi-process scenario
}

void set_error_rank(int rank) { g_rank.store(rank); }
int error_rank() { return g_rank.load(); }

void throw_call_failure(ErrorKind kind, const char* library, const char* call,
                        const std::string& status, const char* file, int line) {
  std::string where = fmt::format("{}:{}", file, line);
  if (int r = error_rank(); r >= 0) where += fmt::format(", rank {}", r);
  const std::string msg = fmt::format("{} call failed: {} -> {} ({})", library, call, status, where);
  switch (kind) {
    case ErrorKind::usage: throw UsageError(msg);
    case ErrorKind::oom: throw OutOfMemory(msg);
    case ErrorKind::hang: throw HangError(msg);
    case ErrorKind::mismatch: throw MismatchError(msg);
    case ErrorKind::unsupported: throw UnsupportedError(msg);
    case ErrorKind::runtime: break;
  }
  throw Error(ErrorKind::runtime, msg);
}

}  // namespace sb
