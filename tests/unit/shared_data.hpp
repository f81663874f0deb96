// Test data taken from other repositories (Holistic Trace Analysis's traces, Graphcore's length
// histograms, recorded nvidia-smi / dcgmi logs) is not committed: it lives outside the project, in
// $STALLBENCH_SHARED_DATA/{traces,data,telemetry}, by default ../shared beside the source root
// (SB_SHARED_DATA, set by tests/meson.build). A test that needs such a file skips, naming where
// the file was expected; the tests beside it keep running.
#pragma once

#include <cstdlib>     // std::getenv
#include <filesystem>  // std::filesystem
#include <string>      // std::string

#include <gtest/gtest.h>  // GTEST_SKIP

#ifndef SB_SHARED_DATA
#error "SB_SHARED_DATA (<source root>/../shared) is set by tests/meson.build"
#endif

namespace sb::test {

// $STALLBENCH_SHARED_DATA/<sub>, or SB_SHARED_DATA/<sub> when the variable is unset or empty.
inline std::string shared_data(const std::string& sub) {
  const char* env = std::getenv("STALLBENCH_SHARED_DATA");
  const std::filesystem::path root = env && *env ? std::filesystem::path(env) : std::filesystem::path(SB_SHARED_DATA);
  return (root / sub).lexically_normal().string();
}

// Empty when `path` exists, else why a test that reads it is skipped.
inline std::string shared_data_missing(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) return {};
  return path + " is absent: third-party test data is not in the repository; it is read from "
                "$STALLBENCH_SHARED_DATA (default <source root>/../shared), see tests/data/README.md";
}

}  // namespace sb::test

// Skips the calling test when `path` (a file of the shared data) is absent.
#define SB_NEED_SHARED_DATA(path)                                                        \
  do {                                                                                   \
    if (const std::string sb_missing_ = ::sb::test::shared_data_missing(path);           \
        !sb_missing_.empty())                                                            \
      GTEST_SKIP() << sb_missing_;                                                       \
  } while (0)
