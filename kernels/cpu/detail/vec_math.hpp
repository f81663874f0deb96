// exp and tanh for float, written so that a `#pragma omp simd` loop
// vectorises them: no libm call, no branch, only selects. glibc's expf and
// tanhf are scalar calls (its vector variants are declared only under
// -ffast-math, which would break the NaN semantics the numerics scenario
// depends on), so a GELU over a 256 x 1024 activation spent ~37 ns an element
// there: 10 ms, where PyTorch's vectorised (Sleef) GELU takes well under 1.
//
// The polynomials are Cephes' expf and tanhf (S. L. Moshier, public domain):
// exp by range reduction to r = x - n ln 2 (ln 2 in two parts) and a degree-6
// polynomial, scaled by 2^n through the exponent bits; tanh by an odd
// polynomial below 0.625 and 1 - 2 / (exp(2|x|) + 1) above. The errors are
// tested in tests/unit/test_cpu_device.cpp against double-precision libm:
// both within a few fp32 ulp.
//
// Edge cases: NaN in, NaN out; exp is +inf above 88.72 and 0 below -86.6
// (fp32's normal range ends at 2^-126 = exp(-87.3): the few values between are
// flushed to 0, not kept subnormal); tanh is +-1 from |x| >= 8.7 and at +-inf.
#pragma once

#include <bit>      // std::bit_cast
#include <cmath>    // std::fabs, std::copysign
#include <cstdint>  // std::int32_t, std::uint32_t

// Always inlined: a call, even to an inline function the compiler chose not
// to inline, keeps the loop around it scalar, and in an ISA clone
// (train_ops.cpp) the callee would run at the baseline ISA.
#if defined(__GNUC__)
#define SB_INLINE [[gnu::always_inline]] inline
#else
#define SB_INLINE inline
#endif

// Hot loops are compiled three times and picked at load time by the CPU
// (GCC ifunc): the library is built for baseline x86-64, where a loop gets
// 16-byte vectors, and AVX-512 quadruples that. OpenMP-outlined bodies do not
// inherit the attribute, so only leaf kernels carry it, and what they call is
// SB_INLINE, so it is compiled into each clone.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define SB_HAS_CPU_CLONES 1
#define SB_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SB_HAS_CPU_CLONES 0
#define SB_CPU_CLONES
#endif

namespace sb::cpu {

// The clone of SB_CPU_CLONES functions the ifunc resolver picks on this CPU (its rule: the first listed
// target the CPU supports), for the implementation strings results record.
inline const char* cpu_clone_isa() {
#if SB_HAS_CPU_CLONES
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return "avx512f";
  if (__builtin_cpu_supports("avx2")) return "avx2";
  return "x86-64 baseline (SSE2)";
#else
  return "as built (no run-time ISA clones)";
#endif
}

SB_INLINE float exp_v(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kC1 = 0.693359375f, kC2 = -2.12194440e-4f;  // ln 2 = C1 + C2, C1 exact in 9 bits
  constexpr float kHi = 88.7228317f, kLo = -86.6f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting rounds to an integer (nearest even)
  const bool nan = x != x;
  float xc = nan ? 0.0f : x;
  xc = xc > kHi ? kHi : xc;
  xc = xc < kLo ? kLo : xc;
  const float n = (xc * kLog2e + kRound) - kRound;
  const float r = (xc - n * kC1) - n * kC2;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n as 2 * 2^(n - 1): n reaches 128 just under kHi, past the largest exponent field
  const std::int32_t ni = std::int32_t(n);
  const float scale = std::bit_cast<float>(std::uint32_t(ni + 126) << 23);
  const float e = p * scale * 2.0f;
  return nan ? x : (x > kHi ? INFINITY : (x < kLo ? 0.0f : e));
}

SB_INLINE float tanh_v(float x) {
  const float a = std::fabs(x);
  const float z = x * x;
  float s = -5.70498872745e-3f;
  s = s * z + 2.06390887954e-2f;
  s = s * z - 5.37397155531e-2f;
  s = s * z + 1.33314422036e-1f;
  s = s * z - 3.33332819422e-1f;
  s = s * z * x + x;
  const float e = exp_v(2.0f * (a < 20.0f ? a : 20.0f));  // a NaN reaches the last select
  const float big = std::copysign(1.0f - 2.0f / (e + 1.0f), x);
  return a < 0.625f ? s : (a != a ? x : big);
}

}  // namespace sb::cpu
