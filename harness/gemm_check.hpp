// Correctness of a device GEMM against a double-precision host reference,
// before anything is timed (llm.c's habit). The reference uses the inputs
// rounded to the GEMM's dtype, so only accumulation and output rounding are
// left to the tolerance:
//   |c - ref| <= rel * |ref| + acc * sum_k |a_ik * w_jk|
// rel = 2 * unit roundoff of C's type; acc bounds the accumulation error of
// the dtype's compute path (fp8 on Hopper accumulates with fewer bits).
#pragma once

#include <chrono>   // std::chrono::milliseconds
#include <cstdint>  // std::uint64_t
#include <string>   // std::string

#include "harness/device.hpp"  // Device, GemmShape
#include "harness/dtype.hpp"   // DType

namespace sb {

struct GemmCheck {
  bool ok = false;
  bool checked = true;         // false: the device computes nothing (sim), so nothing was compared
  GemmShape shape;
  long wrong = 0;              // elements outside tolerance
  double worst_ratio = 0;      // max |c - ref| / tol over all elements
  std::string first_mismatches;  // up to 5, with their indices
  std::string impl;
};

double gemm_accumulation_bound(DType);

// Runs one GEMM of `shape` on dev with inputs from seed and checks it.
// Throws whatever the device throws (UnsupportedError, OutOfMemory, HangError).
GemmCheck check_gemm(Device& dev, DType dtype, GemmShape shape, std::uint64_t seed,
                     std::chrono::milliseconds timeout);

}  // namespace sb
