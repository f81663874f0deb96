// Correctness of a device's attention against a double-precision host
// reference, before anything is timed: output O, and with backward the
// gradients dQ, dK, dV, for dense, causal and varlen shapes. The reference
// takes the inputs rounded to the dtype. Tolerance (llm.c style):
//   |x - ref| <= atol(dtype) + rtol(dtype) * |ref|
// The helper reports the count of wrong elements, the worst tensor, index and
// error; it never exits the process.
#pragma once

#include <chrono>   // std::chrono::milliseconds
#include <cstdint>  // std::uint64_t
#include <span>     // std::span
#include <string>   // std::string
#include <vector>   // std::vector

#include "harness/device.hpp"  // Device, AttnShape, AttnImpl

namespace sb {

struct AttnCheck {
  bool ok = false;
  bool checked = true;       // false: the device computes nothing (sim)
  long wrong = 0;            // elements outside tolerance, over all tensors
  std::string worst_tensor;  // "O", "dQ", "dK", "dV"
  long worst_index = -1;     // flat index into that tensor
  double worst_err = 0, worst_tol = 0;
  std::string first_mismatches;  // up to 5, "dK[123]=0.1 want 0.2 (tol 0.01)"
  std::string impl;
};

struct AttnReference {
  std::vector<double> o, dq, dk, dv;  // same layouts as the device tensors
};

// Double-precision forward (and backward when d_o is non-empty) on host data
// in the layouts of AttentionOp.
AttnReference attention_reference(const AttnShape& s, std::span<const float> q, std::span<const float> k,
                                  std::span<const float> v, std::span<const float> d_o);

// Tolerances per dtype: {atol, rtol}.
std::pair<double, double> attention_tolerance(DType);

// Throws OutOfMemory naming the bytes when the shape's tensors or its S x S
// scores (as naive attention holds them) pass 2^60 bytes: arithmetic in
// 64-bit integers would wrap (B=4096 H=1024 S=2^20 once read "0 B"), and no
// device has that much memory.
void check_attention_size(const AttnShape& s);

// The FLOPs a timed attention call is credited with (docs/DESIGN.md): the
// forward's 4*B*H*S^2*D (halved for causal, summed per sequence for varlen),
// times 3.5 for forward+backward (the backward recomputes S, as flash does).
inline constexpr double kFwdBwdFlopsFactor = 3.5;
inline double attention_flops(const AttnShape& s, bool backward) {
  return s.fwd_flops() * (backward ? kFwdBwdFlopsFactor : 1.0);
}

// Makes the op, uploads random inputs from seed, runs forward (and backward),
// downloads and compares. Throws what the device throws (UnsupportedError,
// OutOfMemory, HangError).
AttnCheck check_attention(Device& dev, const AttnShape& s, AttnImpl impl, DType dtype, bool backward,
                          std::uint64_t seed, std::chrono::milliseconds timeout);

}  // namespace sb
