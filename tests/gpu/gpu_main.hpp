// The main of every GPU test binary: with no CUDA device it prints why and
// returns 77, which Meson reports as SKIP (a gtest binary whose tests all
// call GTEST_SKIP would exit 0 and show as OK).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>     // std::printf
#include <exception>  // std::exception

#include "kernels/cuda/cuda_backend.hpp"  // make_cuda_backend

namespace sb {

inline int gpu_test_main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const Backend cuda = make_cuda_backend();
  try {
    if (cuda.list().empty()) {
      std::printf("SKIP: %s\n", cuda.unavailable().c_str());
      return 77;
    }
  } catch (const std::exception& e) {  // a GPU answers but cannot be queried: a failure
    std::printf("FAIL: listing CUDA devices: %s\n", e.what());
    return 1;
  }
  return RUN_ALL_TESTS();
}

}  // namespace sb
