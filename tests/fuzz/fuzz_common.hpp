// What the fuzz targets share. A parser of a user's file may end in two ways:
// success, or a UsageError (an sb::Error of kind usage: exit 2) whose message
// names the file. Anything else is a finding and is left to escape: another
// exception type (libFuzzer reports it as a crash via std::terminate), a
// usage message that does not name the file (aborts here), a sanitizer
// report, an allocation over -malloc_limit_mb, a run over -timeout.
#pragma once

#include <cstdio>       // std::fprintf
#include <cstdlib>      // std::abort
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "harness/errors.hpp"  // sb::Error, sb::ErrorKind

namespace sb::fuzz {

inline std::string_view as_text(const unsigned char* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs f; a usage error naming `file` is an expected outcome, every other
// exception escapes.
template <class F>
void usage_errors_only(const std::string& file, F&& f) {
  try {
    f();
  } catch (const sb::Error& e) {
    if (e.kind() != sb::ErrorKind::usage) throw;
    if (std::string_view(e.what()).find(file) == std::string_view::npos) {
      std::fprintf(stderr, "usage error that does not name the file %s: %s\n", file.c_str(), e.what());
      std::abort();
    }
  }
}

// A property the target checks beyond "no crash": its failure is a finding.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "property failed: %s\n", what);
    std::abort();
  }
}

}  // namespace sb::fuzz
