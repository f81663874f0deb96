#include "harness/attention_check.hpp"

#include <algorithm>  // std::max
#include <cmath>      // std::exp, std::fabs, std::isfinite, std::sqrt

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // UsageError, OutOfMemory
#include "harness/units.hpp"   // format_bytes
#include "harness/random.hpp"  // uniform_pm1

namespace sb {
namespace {

// One sequence: rows [start, start+len) of batch entry b's token axis.
struct Seq {
  std::int64_t b, start, len;
};

std::vector<Seq> sequences(const AttnShape& s) {
  std::vector<Seq> out;
  if (!s.varlen()) {
    for (std::int64_t b = 0; b < s.batch; ++b) out.push_back({b, 0, s.seq});
    return out;
  }
  const auto& cu = s.cu_seqlens;
  if (s.batch != 1 || cu.size() < 2 || cu.front() != 0 || cu.back() != s.seq)
    throw UsageError("attention reference: varlen needs B = 1, cu_seqlens from 0 to seq");
  for (std::size_t i = 1; i < cu.size(); ++i) {
    if (cu[i] < cu[i - 1]) throw UsageError("attention reference: cu_seqlens must not decrease");
    out.push_back({0, cu[i - 1], cu[i] - cu[i - 1]});
  }
  return out;
}

std::int64_t tokens(const AttnShape& s) { return s.varlen() ? s.cu_seqlens.back() : s.seq; }

// The streams of the four inputs; the cpu device fills its operands the same
// way (kernels/cpu/detail/attention.hpp attn_input_seed).
float input(std::uint64_t seed, int which, std::size_t i) { return uniform_pm1(seed * 4 + std::uint64_t(which), i); }

}  // namespace

AttnReference attention_reference(const AttnShape& s, std::span<const float> q, std::span<const float> k,
                                  std::span<const float> v, std::span<const float> d_o) {
  const std::int64_t H = s.heads, D = s.head_dim, T = tokens(s);
  const std::size_t n = std::size_t(s.batch * H * T * D);
  const bool bwd = !d_o.empty();
  if (q.size() != n || k.size() != n || v.size() != n || (bwd && d_o.size() != n))
    throw UsageError(fmt::format("attention reference: inputs must have B*H*T*D = {} values", n));
  const double scale = s.scale > 0 ? s.scale : 1.0 / std::sqrt(double(D));
  AttnReference r;
  r.o.assign(n, 0.0);
  if (bwd) {
    r.dq.assign(n, 0.0);
    r.dk.assign(n, 0.0);
    r.dv.assign(n, 0.0);
  }
  std::vector<double> P, dS;
  for (const Seq& sq : sequences(s)) {
    const std::int64_t L = sq.len;
    P.assign(std::size_t(L * L), 0.0);
    for (std::int64_t h = 0; h < H; ++h) {
      const std::size_t base = std::size_t(((sq.b * H + h) * T + sq.start) * D);  // row 0 of this (sequence, head)
      auto at = [&](std::int64_t row, std::int64_t d) { return base + std::size_t(row * D + d); };
      // Forward: S = scale * Q K^T, masked (-inf, so P = 0) above the
      // diagonal when causal; P = softmax(S) by rows; O = P V.
      for (std::int64_t i = 0; i < L; ++i) {
        const std::int64_t jn = s.causal ? i + 1 : L;
        double mx = -INFINITY;
        for (std::int64_t j = 0; j < jn; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d) dot += double(q[at(i, d)]) * double(k[at(j, d)]);
          P[std::size_t(i * L + j)] = scale * dot;
          mx = std::max(mx, scale * dot);
        }
        double sum = 0;
        for (std::int64_t j = 0; j < jn; ++j) sum += (P[std::size_t(i * L + j)] = std::exp(P[std::size_t(i * L + j)] - mx));
        for (std::int64_t j = 0; j < L; ++j) P[std::size_t(i * L + j)] = j < jn ? P[std::size_t(i * L + j)] / sum : 0.0;
        for (std::int64_t j = 0; j < jn; ++j)
          for (std::int64_t d = 0; d < D; ++d) r.o[at(i, d)] += P[std::size_t(i * L + j)] * double(v[at(j, d)]);
      }
      if (!bwd) continue;
      // Backward: dV = P^T dO; dP = dO V^T; dS = P * (dP - rowsum(dO * O));
      // dQ = scale * dS K; dK = scale * dS^T Q.
      for (std::int64_t i = 0; i < L; ++i) {
        double di = 0;
        for (std::int64_t d = 0; d < D; ++d) di += double(d_o[at(i, d)]) * r.o[at(i, d)];
        for (std::int64_t j = 0; j < L; ++j) {
          const double p = P[std::size_t(i * L + j)];
          if (p == 0.0) continue;  // masked (or underflowed): contributes nothing
          double dp = 0;
          for (std::int64_t d = 0; d < D; ++d) dp += double(d_o[at(i, d)]) * double(v[at(j, d)]);
          const double ds = p * (dp - di);
          for (std::int64_t d = 0; d < D; ++d) {
            r.dv[at(j, d)] += p * double(d_o[at(i, d)]);
            r.dq[at(i, d)] += scale * ds * double(k[at(j, d)]);
            r.dk[at(j, d)] += scale * ds * double(q[at(i, d)]);
          }
        }
      }
    }
  }
  return r;
}

// Measured on the cpu device (B<=2, H<=3, S 37..300, D 16..64, dense, causal,
// varlen, forward and backward): fp32 errors stay below 2e-7 (1% of the
// tolerance), bf16 flash (fp32 arithmetic on bf16 inputs) likewise, bf16
// naive (P and dS rounded to bf16 before their GEMMs) below 3e-3 (10%). The
// bf16 and fp16 figures also leave room for GPU kernels that round P and O
// to the dtype. A value taken from a neighbouring position is off by ~0.1,
// far outside every tolerance.
std::pair<double, double> attention_tolerance(DType t) {
  switch (t) {
    case DType::fp32: return {1e-5, 1e-4};
    case DType::tf32: return {2e-3, 2e-3};
    case DType::bf16: return {2e-2, 2e-2};
    case DType::fp16: return {5e-3, 5e-3};
    case DType::fp8_e4m3: return {1e-1, 1e-1};
  }
  return {1e-2, 1e-2};
}

AttnCheck check_attention(Device& dev, const AttnShape& s, AttnImpl impl, DType t, bool backward,
                          std::uint64_t seed, std::chrono::milliseconds timeout) {
  AttnCheck r;
  AttnShape planned = s;
  planned.backward = backward;
  auto op = dev.make_attention(planned, impl, t, seed);
  r.impl = op->impl_detail();
  if (!op->computes()) {  // a simulated device spends time and computes nothing
    r.ok = true;
    r.checked = false;
    return r;
  }
  const std::size_t n = std::size_t(s.batch * s.heads * tokens(s) * s.head_dim);
  std::vector<float> q(n), k(n), v(n), d_o(n);
  for (std::size_t i = 0; i < n; ++i) {
    q[i] = input(seed, 0, i);
    k[i] = input(seed, 1, i);
    v[i] = input(seed, 2, i);
    d_o[i] = input(seed, 3, i);
  }
  op->upload(q, k, v, d_o);
  op->forward();
  if (backward) op->backward();
  dev.synchronize(timeout);
  std::vector<float> o(n), dq(backward ? n : 0), dk(backward ? n : 0), dv(backward ? n : 0);
  op->download(o, dq, dk, dv);

  // The reference sees what the device stores: inputs rounded to the dtype.
  for (auto* x : {&q, &k, &v, &d_o})
    for (float& e : *x) e = round_to(t, e);
  const AttnReference ref = attention_reference(s, q, k, v, backward ? std::span<const float>(d_o)
                                                                     : std::span<const float>());
  // named copies, not a structured binding: a lambda may capture those only from C++20 compilers
  // newer than clang 14 (the sanitizer builds' compiler)
  const auto tolerance = attention_tolerance(t);
  const double atol = tolerance.first, rtol = tolerance.second;
  double worst_ratio = -1;
  int shown = 0;
  auto compare = [&](const char* name, const std::vector<float>& got, const std::vector<double>& want) {
    for (std::size_t i = 0; i < want.size(); ++i) {
      if (!std::isfinite(want[i])) continue;  // a non-finite reference checks nothing
      const double tol = atol + rtol * std::fabs(want[i]);
      const double err = std::isfinite(got[i]) ? std::fabs(double(got[i]) - want[i]) : INFINITY;
      if (err / tol > worst_ratio) {
        worst_ratio = err / tol;
        r.worst_tensor = name;
        r.worst_index = long(i);
        r.worst_err = err;
        r.worst_tol = tol;
      }
      if (err > tol) {
        ++r.wrong;
        if (shown++ < 5)
          r.first_mismatches += fmt::format("{}{}[{}]={:.6g} want {:.6g} (tol {:.2g})", shown > 1 ? "; " : "", name,
                                            i, got[i], want[i], tol);
      }
    }
  };
  compare("O", o, ref.o);
  if (backward) {
    compare("dQ", dq, ref.dq);
    compare("dK", dk, ref.dk);
    compare("dV", dv, ref.dv);
  }
  r.ok = r.wrong == 0;
  return r;
}

void check_attention_size(const AttnShape& s) {
  // long double: exact enough, and no wrap, for any int64 dimensions.
  const long double tensors = 8.0L * (long double)s.batch * (long double)s.heads * (long double)s.seq *
                              (long double)s.head_dim * 4.0L;  // Q K V O dO dQ dK dV, fp32
  const long double scores = 3.0L * (long double)s.batch * (long double)s.heads * (long double)s.seq *
                             (long double)s.seq * 4.0L;  // S, P, dS
  const long double need = tensors + scores;
  if (need > (long double)(1ULL << 60))
    throw OutOfMemory(fmt::format("attention B={} H={} S={} D={} needs about {} for its tensors and S x S scores "
                                  "(B*H*S*S): more than any device has",
                                  s.batch, s.heads, s.seq, s.head_dim, format_bytes(double(need))));
}

}  // namespace sb
