// Correctness of a device GEMM against a double-precision host reference,
// before anything is timed (llm.c's habit). The reference uses the inputs
// rounded to the GEMM's dtype, so only accumulation and output rounding are
// left to the tolerance:
//   |c - ref| <= rel * |ref| + acc * sum_k |a_ik * w_jk|
// rel = 2 * unit roundoff of C's type; acc bounds the accumulation error of
// the dtype's compute path (fp8 on Hopper accumulates with fewer bits).
#pragma once

#include <chrono>   // std::chrono::milliseconds
#include <cstdint>   // std::uint64_t
#include <optional>  // std::optional
#include <string>    // std::string

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

// Why a GPU GEMM (cuBLASLt, and the sim device that stands for one) cannot
// take this shape in this dtype, or nullopt. fp8: cuBLASLt needs the TN
// layout with 16-byte aligned leading dimensions, i.e. N and K multiples of
// 16 (our N is cuBLAS's m). The cpu device has no such rule.
std::optional<std::string> gpu_gemm_shape_problem(DType, GemmShape);

// The small problem each dtype is checked on before timing: odd sizes where
// the dtype allows them (edge tiles), multiples of 16 for fp8. Legal for
// every device: gpu_gemm_shape_problem(t, gemm_check_shape(t)) is nullopt.
GemmShape gemm_check_shape(DType);

// Runs one GEMM of `shape` on dev with inputs from seed and checks it.
// Throws whatever the device throws (UnsupportedError, OutOfMemory, HangError).
GemmCheck check_gemm(Device& dev, DType dtype, GemmShape shape, std::uint64_t seed,
                     std::chrono::milliseconds timeout);

}  // namespace sb
