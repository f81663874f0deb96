#include "harness/gemm_check.hpp"

#include <cmath>   // std::fabs, std::isfinite
#include <vector>  // std::vector

#include <fmt/format.h>  // fmt::format

#include "harness/random.hpp"  // uniform_pm1

namespace sb {

double gemm_accumulation_bound(DType t) {
  switch (t) {
    case DType::fp32: return 2e-5;      // fp32 accumulation, K up to a few hundred
    case DType::tf32: return 2e-3;      // inputs may be truncated, not rounded, to 10 bits
    case DType::bf16:
    case DType::fp16: return 2e-5;      // exact products, fp32 accumulation
    case DType::fp8_e4m3: return 4e-3;  // reduced-precision tensor-core accumulation
  }
  return 1e-3;
}

std::optional<std::string> gpu_gemm_shape_problem(DType t, GemmShape s) {
  if (t == DType::fp8_e4m3 && (s.n % 16 != 0 || s.k % 16 != 0))
    return fmt::format("an fp8_e4m3 GEMM needs N and K to be multiples of 16 (cuBLASLt's TN layout with 16-byte "
                       "aligned leading dimensions); M={} N={} K={}",
                       s.m, s.n, s.k);
  return std::nullopt;
}

GemmShape gemm_check_shape(DType t) {
  // 61x47 leaves partial tiles in both output dimensions; fp8 keeps that
  // spirit with 80x48 (neither a power of two) within its multiples of 16.
  if (t == DType::fp8_e4m3) return GemmShape{80, 48, 256};
  return GemmShape{61, 47, 256};
}

GemmCheck check_gemm(Device& dev, DType t, GemmShape s, std::uint64_t seed, std::chrono::milliseconds timeout) {
  GemmCheck r;
  r.shape = s;
  const std::size_t M = std::size_t(s.m), N = std::size_t(s.n), K = std::size_t(s.k);
  std::vector<float> a(M * K), w(N * K), c(M * N);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = uniform_pm1(seed, i);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = uniform_pm1(seed ^ 0x5bd1e995ULL, i);

  auto op = dev.make_gemm(s, t, seed);
  r.impl = op->impl();
  if (!op->computes()) {  // a simulated device spends time and computes nothing
    r.ok = true;
    r.checked = false;
    return r;
  }
  op->upload(a, w);
  op->enqueue();
  dev.synchronize(timeout);
  op->download_c(c);

  for (auto& x : a) x = round_to(t, x);
  for (auto& x : w) x = round_to(t, x);
  const double rel = 2 * unit_roundoff(op->c_dtype());
  const double acc = gemm_accumulation_bound(t);
  int shown = 0;
  for (std::size_t i = 0; i < M; ++i)
    for (std::size_t j = 0; j < N; ++j) {
      double ref = 0, mag = 0;
      for (std::size_t k = 0; k < K; ++k) {
        const double p = double(a[i * K + k]) * double(w[j * K + k]);
        ref += p;
        mag += std::fabs(p);
      }
      if (!std::isfinite(ref)) continue;  // a non-finite reference checks nothing
      const double got = c[i * N + j];
      const double tol = rel * std::fabs(ref) + acc * mag + 1e-30;
      const double err = std::isfinite(got) ? std::fabs(got - ref) : INFINITY;
      r.worst_ratio = std::max(r.worst_ratio, err / tol);
      if (err > tol) {
        ++r.wrong;
        if (shown++ < 5)
          r.first_mismatches += fmt::format("{}C[{},{}]={:.6g} want {:.6g} (tol {:.2g})", shown > 1 ? "; " : "", i,
                                            j, got, ref, tol);
      }
    }
  r.ok = r.wrong == 0;
  return r;
}

}  // namespace sb
