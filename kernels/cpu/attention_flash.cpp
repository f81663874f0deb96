// Flash attention on the cpu device: FlashAttention-2's tiling in plain C++,
// so the score matrix never exists beyond one Br x Bc tile per thread.
//   forward, per (sequence, head, block of Br query rows): for each block of
//     Bc keys, S = scale*Q K^T on the tile (kept transposed, see fwd_softmax),
//     then the online softmax: running row max m and sum l, O_acc rescaled by
//     exp(m_old - m_new) whenever the max grows; at the end O = O_acc / l and
//     LSE = m + log(l) is saved for the backward.
//   backward, per (sequence, head): D = rowsum(dO * O); for each key block j
//     (K_j, V_j kept in tiles with dK_j, dV_j accumulators), for each query
//     block i: recompute P = exp(scale*Q_i K_j^T - LSE_i), then
//     dV_j += P^T dO_i, dP = dO_i V_j^T, dS = P * (dP - D_i),
//     dQ_i += scale * dS K_j (in the thread's dQ accumulator: the unit owns
//     the sequence's rows, so no atomics), dK_j += scale * dS^T Q_i.
// Extra memory is O(S): LSE and D per row, and per thread the tiles plus a
// dQ accumulator as long as the longest sequence.
// bf16: inputs are widened to fp32 as tiles are loaded (exact), so all
// arithmetic is fp32 and so are the outputs.
// Every product inside a tile goes through one register-blocked kernel
// (tile_gemm: 4 rows x 64 columns of accumulators in registers).
#include <omp.h>  // omp_get_max_threads, omp_get_thread_num

#include <algorithm>  // std::min, std::max, std::clamp
#include <cmath>      // std::log, INFINITY
#include <cstring>    // std::memcpy
#include <type_traits>  // std::is_same_v

#include <fmt/format.h>  // fmt::format

#include "kernels/cpu/detail/attention.hpp"  // CpuAttention, exp_v, ld

namespace sb::cpu {
namespace {

constexpr std::int64_t kBr = 64, kBc = 64;  // 64 rows x 64 keys x D=64: a thread's tiles fit in L2

// Head dim padded to whole 16-float vectors inside tiles (padding is zero).
std::int64_t padded(std::int64_t D) { return (D + 15) / 16 * 16; }
std::int64_t round4(std::int64_t n) { return (n + 3) / 4 * 4; }

// Floats of one thread's tiles (Dp = padded head dim). Forward: qt (Dp x Br),
// acc (Br x Dp), k, v (Bc x Dp), st (Bc x Br), m, l (Br). Backward: q, dO (Br x Dp),
// k, dK, dV (Bc x Dp), kt, vt (Dp x Bc), s, dP (Br x Bc), and dQ's accumulator
// for the longest sequence (its rows are revisited for every key block).
std::size_t tile_floats(std::int64_t D, std::int64_t max_len) {
  const std::int64_t Dp = padded(D);
  const std::int64_t fwd = 2 * kBr * Dp + 2 * kBc * Dp + kBr * kBc + 2 * kBr;
  const std::int64_t bwd = 2 * kBr * Dp + 5 * kBc * Dp + 2 * kBr * kBc + (max_len + kBr) / kBr * kBr * Dp;
  return std::size_t((std::max(fwd, bwd) + 15) / 16 * 16);
}

// ---- the one register-blocked tile product every GEMM of the tile uses ----

// Explicit 16-float vectors (GCC vector extension): the accumulators of a
// 4 x 64 block stay in 16 registers, which an auto-vectorised axpy loop
// (load, fma, store per element) does not manage. Each clone lowers them to
// its own width. The helpers are always inlined (SB_INLINE, vec_math.hpp), so no
// vector crosses a call.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
template <class V>
SB_INLINE V load_v(const float* p) {
  V x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
template <class V>
SB_INLINE void store_v(float* p, V x) {
  std::memcpy(p, &x, sizeof x);
}

// out[i][0..W*NV) += sum_k mul * A(i, k) * B[k][0..W*NV) for 4 rows i, W the
// lanes of V; A(i, k) = a[i*sa + k*sk], so A may be read transposed.
template <class V, int NV>
SB_INLINE void block4(float* out, std::int64_t ldo, const float* a, std::int64_t sa, std::int64_t sk, const float* b,
                      std::int64_t ldb, std::int64_t kn, float mul) {
  constexpr int W = int(sizeof(V) / sizeof(float));
  V acc[4][NV];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = load_v<V>(out + i * ldo + W * j);
  for (std::int64_t k = 0; k < kn; ++k) {
    V bv[NV];
    for (int j = 0; j < NV; ++j) bv[j] = load_v<V>(b + k * ldb + W * j);
    for (int i = 0; i < 4; ++i) {
      const float av = a[i * sa + k * sk] * mul;
      for (int j = 0; j < NV; ++j) acc[i][j] += av * bv[j];
    }
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < NV; ++j) store_v<V>(out + i * ldo + W * j, acc[i][j]);
}

// out[rows x cols] += mul * A[rows x kn] B[kn x cols]; rows a multiple of 4,
// cols of 16. 2*rows*cols*kn FLOPs. The register block fits the ISA: with
// AVX-512, 4 rows x 4 vectors of 16 floats (16 of its 32 zmm registers);
// below it, 4 rows x 2 vectors of 8 (8 of AVX2's 16 ymm). The 64-byte
// vectors on AVX2 spilled every k and ran 2.3x slower at 4x4, 5x at 4x1.
SB_CPU_CLONES void tile_gemm(float* out, std::int64_t ldo, std::int64_t rows, std::int64_t cols, const float* a,
                             std::int64_t sa, std::int64_t sk, const float* b, std::int64_t ldb, std::int64_t kn,
                             float mul) {
  static const bool wide = __builtin_cpu_supports("avx512f");
  for (std::int64_t i = 0; i < rows; i += 4) {
    const float* ai = a + i * sa;
    if (!wide) {
      for (std::int64_t c = 0; c < cols; c += 16) block4<v8, 2>(out + i * ldo + c, ldo, ai, sa, sk, b + c, ldb, kn, mul);
      continue;
    }
    for (std::int64_t c = 0; c < cols; c += 64) {
      float* o = out + i * ldo + c;
      switch (std::min<std::int64_t>(4, (cols - c) / 16)) {
        case 4: block4<v16, 4>(o, ldo, ai, sa, sk, b + c, ldb, kn, mul); break;
        case 3: block4<v16, 3>(o, ldo, ai, sa, sk, b + c, ldb, kn, mul); break;
        case 2: block4<v16, 2>(o, ldo, ai, sa, sk, b + c, ldb, kn, mul); break;
        default: block4<v16, 1>(o, ldo, ai, sa, sk, b + c, ldb, kn, mul); break;
      }
    }
  }
}

// ---- the softmax parts of a tile (compiled per ISA) ----

// Keys row r may see: all bc, or under the causal mask those up to its own
// position (diag = first query row - first key of the tile).
inline std::int64_t visible(bool causal, std::int64_t r, std::int64_t diag, std::int64_t bc) {
  return causal ? std::clamp<std::int64_t>(r + diag + 1, 0, bc) : bc;
}

// Forward, after S^T = K (scale Q)^T (the tile is kept transposed, [key][row],
// so that the row statistics below are vectors over 64 rows, and Q is
// transposed once per row block instead of K once per tile): the online
// softmax. Per row: the new max, alpha = exp(m_old - m_new) rescales l and
// the O accumulator, P = exp(S - m_new) where visible and 0 elsewhere (so
// P V needs no mask). Key c is visible to row r unless causal and c > r + diag.
SB_CPU_CLONES void fwd_softmax(float* st, float* m, float* l, float* acc, std::int64_t bc, std::int64_t Dp,
                               bool causal, std::int64_t diag) {
  constexpr int R = int(kBr);
  float mx[R], m_new[R], alpha[R], sum[R];
  for (int r = 0; r < R; ++r) mx[r] = -INFINITY;
  for (std::int64_t c = 0; c < bc; ++c) {
    const float* __restrict row = st + c * R;
    const int first = causal ? int(std::clamp<std::int64_t>(c - diag, 0, R)) : 0;  // first row that sees key c
    for (int r = first; r < R; ++r) mx[r] = std::max(mx[r], row[r]);
  }
  for (int r = 0; r < R; ++r) {
    m_new[r] = std::max(m[r], mx[r]);
    alpha[r] = m[r] == -INFINITY ? 0.0f : exp_v(m[r] - m_new[r]);
    sum[r] = 0;
  }
  for (std::int64_t c = 0; c < bc; ++c) {
    float* __restrict row = st + c * R;
    const int first = causal ? int(std::clamp<std::int64_t>(c - diag, 0, R)) : 0;
    for (int r = 0; r < first; ++r) row[r] = 0.0f;
    for (int r = first; r < R; ++r) {
      const float p = exp_v(row[r] - m_new[r]);
      row[r] = p;
      sum[r] += p;
    }
  }
  for (int r = 0; r < R; ++r) {
    l[r] = l[r] * alpha[r] + sum[r];
    m[r] = m_new[r];
  }
  for (int r = 0; r < R; ++r)
    for (std::int64_t d = 0; d < Dp; ++d) acc[r * Dp + d] *= alpha[r];
}

// Backward, after S = (scale Q) K^T and dP = dO V^T: P = exp(S - LSE) where
// visible (0 elsewhere), dS = P * (dP - D_r); rows past br are zeroed.
SB_CPU_CLONES void bwd_scores(float* s, float* dp, const float* lse, const float* drow, std::int64_t br,
                              std::int64_t rows, std::int64_t bc, bool causal, std::int64_t diag) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * kBc;
    float* dpr = dp + r * kBc;
    const std::int64_t n = r < br ? visible(causal, r, diag, bc) : 0;
    const float lr = r < br ? lse[r] : 0.0f, dr = r < br ? drow[r] : 0.0f;
#pragma omp simd
    for (std::int64_t c = 0; c < kBc; ++c) {
      const float p = c < n ? exp_v(sr[c] - lr) : 0.0f;
      sr[c] = p;
      dpr[c] = p * (dpr[c] - dr);
    }
  }
}

// ---- tile loads: widen to fp32 (exact for bf16), zero-padded ----

// dst[r][0..Dp) for r < rows_to: source rows below `rows` times mul, zeros
// in the padding columns and rows.
template <class T>
void load_rows(float* dst, const T* src, std::int64_t rows, std::int64_t rows_to, std::int64_t D, std::int64_t Dp,
               float mul) {
  if constexpr (std::is_same_v<T, float>) {
    if (D == Dp && mul == 1.0f) {  // the common case (D a multiple of 16): a plain, libc-vectorised copy
      std::memcpy(dst, src, std::size_t(rows * D) * sizeof(float));
      std::fill(dst + rows * Dp, dst + rows_to * Dp, 0.0f);
      return;
    }
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t d = 0; d < D; ++d) dst[r * Dp + d] = ld(src + r * D + d) * mul;
    for (std::int64_t d = D; d < Dp; ++d) dst[r * Dp + d] = 0.0f;
  }
  std::fill(dst + rows * Dp, dst + rows_to * Dp, 0.0f);
}

// dst[d][r] (row stride kBc = kBr) for d < D: the tile transposed, times
// mul, zero past `rows`.
template <class T>
void load_transposed(float* dst, const T* src, std::int64_t rows, std::int64_t D, float mul) {
  static_assert(kBr == kBc, "one transposed-tile layout serves Q and K");
  std::fill(dst, dst + D * kBc, 0.0f);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t d = 0; d < D; ++d) dst[d * kBc + r] = ld(src + r * D + d) * mul;
}

class FlashAttention final : public CpuAttention {
 public:
  ~FlashAttention() override { finish_running_work(); }
  FlashAttention(const AttnEnv& env, const AttnShape& s, DType t, std::uint64_t seed, int threads, std::size_t rows,
                 std::int64_t max_len)
      : CpuAttention(env, s, AttnImpl::flash, t, seed, workspace(s, threads, rows, max_len),
                     what(s, threads, rows, max_len)),
        threads_(threads), tile_floats_(tile_floats(s.head_dim, max_len)) {
    lse_ = alloc_workspace(rows * 4, "LSE");
    drow_ = alloc_workspace(rows * 4, "rowsum(dO*O)");
    tiles_ = alloc_workspace(std::size_t(threads) * tile_floats_ * 4, "tiles");
    for (std::size_t i = 0; i < seqs_.size(); ++i)
      for (std::int64_t h = 0; h < s.heads; ++h) {
        for (std::int64_t i0 = 0; i0 < seqs_[i].len; i0 += kBr) fwd_units_.push_back({i, h, i0});
        bwd_units_.push_back({i, h, 0});
      }
    detail_ = fmt::format("tiled online softmax (FlashAttention-2), Br={} Bc={}, C++ ({} OpenMP threads){}", kBr, kBc,
                          threads_, t == DType::bf16 ? "; bf16 inputs widened to fp32 in tiles, outputs fp32" : "");
  }

  std::string impl_detail() const override { return detail_; }

  static std::size_t workspace(const AttnShape& s, int threads, std::size_t rows, std::int64_t max_len) {
    return 2 * rows * 4 + std::size_t(threads) * tile_floats(s.head_dim, max_len) * 4;
  }
  static std::string what(const AttnShape& s, int threads, std::size_t rows, std::int64_t max_len) {
    return fmt::format("LSE and rowsum(dO*O) = 2*B*H*S fp32 {}, tiles {} threads x {}", format_bytes(2 * rows * 4),
                       threads, format_bytes(tile_floats(s.head_dim, max_len) * 4));
  }

 protected:
  void run_forward() override {
    if (bf16())
      forward_t<std::uint16_t>();
    else
      forward_t<float>();
  }
  void run_backward() override {
    if (bf16())
      backward_t<std::uint16_t>();
    else
      backward_t<float>();
  }

 private:
  struct Unit {
    std::size_t seq;
    std::int64_t h, row0;
  };

  float* tiles(int thread) const { return tiles_.as<float>() + std::size_t(thread) * tile_floats_; }

  template <class T>
  void forward_t() {
    const std::int64_t D = shape_.head_dim, Dp = padded(D), units = std::int64_t(fwd_units_.size());
    const bool causal = shape_.causal;
    // dynamic: under the causal mask late row blocks have more keys to visit.
    // The team is what the compute thread may use now (reserve_host_cpus
    // sets it), at most the tiles made for: a team wider than the CPUs it is
    // pinned to spins against itself at every barrier (a 4 ms scheduler tick
    // each, measured: 72 ms for a 0.1 ms attention).
    const int team = std::max(1, std::min(threads_, omp_get_max_threads()));
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
    for (std::int64_t u = 0; u < units; ++u) {
      const Unit& un = fwd_units_[std::size_t(u)];
      const AttnSeq& sq = seqs_[un.seq];
      float* t = tiles(omp_get_thread_num());
      float *qt = t, *acc = qt + Dp * kBr, *k = acc + kBr * Dp, *v = k + kBc * Dp, *st = v + kBc * Dp,
            *m = st + kBc * kBr, *l = m + kBr;
      const std::int64_t i0 = un.row0, br = std::min(kBr, sq.len - i0);
      const std::int64_t base = row_offset(sq, un.h, 0);  // element offset of the sequence's row 0
      load_transposed(qt, q_.as<T>() + base + i0 * D, br, D, scale_);  // (scale Q)^T: scale folded in once
      std::fill(acc, acc + kBr * Dp, 0.0f);
      std::fill(m, m + kBr, -INFINITY);
      std::fill(l, l + kBr, 0.0f);
      const std::int64_t kend = causal ? i0 + br : sq.len;  // keys past the block's last row are all masked
      for (std::int64_t j0 = 0; j0 < kend; j0 += kBc) {
        const std::int64_t bc = std::min(kBc, sq.len - j0), bc4 = round4(bc);
        load_rows(k, k_.as<T>() + base + j0 * D, bc, bc4, D, Dp, 1.0f);
        load_rows(v, v_.as<T>() + base + j0 * D, bc, bc, D, Dp, 1.0f);
        std::fill(st, st + bc4 * kBr, 0.0f);
        tile_gemm(st, kBr, bc4, kBr, k, Dp, 1, qt, kBr, D, 1.0f);  // S^T = K (scale Q)^T
        fwd_softmax(st, m, l, acc, bc, Dp, causal, i0 - j0);       // st = P^T
        tile_gemm(acc, Dp, round4(br), Dp, st, 1, kBr, v, Dp, bc, 1.0f);  // O_acc += P V
      }
      float* o = o_.as<float>() + base + i0 * D;
      float* lse = lse_.as<float>() + (base / D) + i0;
      for (std::int64_t r = 0; r < br; ++r) {
        const float inv = 1.0f / l[r];  // l >= 1: every row sees at least its own key
        for (std::int64_t d = 0; d < D; ++d) o[r * D + d] = acc[r * Dp + d] * inv;
        lse[r] = m[r] + std::log(l[r]);
      }
    }
  }

  template <class T>
  void backward_t() {
    const std::int64_t D = shape_.head_dim, Dp = padded(D), units = std::int64_t(bwd_units_.size());
    const bool causal = shape_.causal;
    const int team = std::max(1, std::min(threads_, omp_get_max_threads()));
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
    for (std::int64_t u = 0; u < units; ++u) {
      const Unit& un = bwd_units_[std::size_t(u)];
      const AttnSeq& sq = seqs_[un.seq];
      float* t = tiles(omp_get_thread_num());
      float *q = t, *g = q + kBr * Dp, *k = g + kBr * Dp, *dk = k + kBc * Dp, *dv = dk + kBc * Dp,
            *kt = dv + kBc * Dp, *vt = kt + Dp * kBc, *s = vt + Dp * kBc, *dp = s + kBr * kBc, *dq = dp + kBr * kBc;
      const std::int64_t base = row_offset(sq, un.h, 0), L = sq.len;
      const T* Q = q_.as<T>() + base;
      const T* dO = do_.as<T>() + base;
      const float* O = o_.as<float>() + base;
      const float* lse = lse_.as<float>() + base / D;
      float* drow = drow_.as<float>() + base / D;
      for (std::int64_t r = 0; r < L; ++r) {  // D_r = rowsum(dO * O)
        float a = 0;
        for (std::int64_t d = 0; d < D; ++d) a += ld(dO + r * D + d) * O[r * D + d];
        drow[r] = a;
      }
      std::fill(dq, dq + (L + kBr) / kBr * kBr * Dp, 0.0f);
      for (std::int64_t j0 = 0; j0 < L; j0 += kBc) {
        const std::int64_t bc = std::min(kBc, L - j0), bc4 = round4(bc);
        load_rows(k, k_.as<T>() + base + j0 * D, bc, bc, D, Dp, 1.0f);
        load_transposed(kt, k_.as<T>() + base + j0 * D, bc, D, 1.0f);
        load_transposed(vt, v_.as<T>() + base + j0 * D, bc, D, 1.0f);
        std::fill(dk, dk + bc4 * Dp, 0.0f);
        std::fill(dv, dv + bc4 * Dp, 0.0f);
        // Causal: query blocks that end before this key block see none of it.
        for (std::int64_t i0 = causal ? j0 / kBr * kBr : 0; i0 < L; i0 += kBr) {
          const std::int64_t br = std::min(kBr, L - i0), br4 = round4(br);
          load_rows(q, Q + i0 * D, br, br4, D, Dp, scale_);
          load_rows(g, dO + i0 * D, br, br4, D, Dp, 1.0f);
          std::fill(s, s + br4 * kBc, 0.0f);
          std::fill(dp, dp + br4 * kBc, 0.0f);
          tile_gemm(s, kBc, br4, kBc, q, Dp, 1, kt, kBc, D, 1.0f);   // S = (scale Q) K^T
          tile_gemm(dp, kBc, br4, kBc, g, Dp, 1, vt, kBc, D, 1.0f);  // dP = dO V^T
          bwd_scores(s, dp, lse + i0, drow + i0, br, br4, bc, causal, i0 - j0);  // s = P, dp = dS
          tile_gemm(dv, Dp, bc4, Dp, s, 1, kBc, g, Dp, br, 1.0f);    // dV_j += P^T dO_i
          tile_gemm(dk, Dp, bc4, Dp, dp, 1, kBc, q, Dp, br, 1.0f);   // dK_j += dS^T (scale Q_i)
          tile_gemm(dq + i0 * Dp, Dp, br4, Dp, dp, kBc, 1, k, Dp, bc, scale_);  // dQ_i += scale dS K_j
        }
        float* dK = dk_.as<float>() + base + j0 * D;
        float* dV = dv_.as<float>() + base + j0 * D;
        for (std::int64_t r = 0; r < bc; ++r)
          for (std::int64_t d = 0; d < D; ++d) {
            dK[r * D + d] = dk[r * Dp + d];
            dV[r * D + d] = dv[r * Dp + d];
          }
      }
      float* dQ = dq_.as<float>() + base;
      for (std::int64_t r = 0; r < L; ++r)
        for (std::int64_t d = 0; d < D; ++d) dQ[r * D + d] = dq[r * Dp + d];
    }
  }

  int threads_;
  std::size_t tile_floats_;
  LedgerBlock lse_, drow_, tiles_;
  std::vector<Unit> fwd_units_, bwd_units_;
  std::string detail_;
};

}  // namespace

std::unique_ptr<AttentionOp> make_flash_attention(const AttnEnv& env, const AttnShape& s, DType t,
                                                  std::uint64_t seed) {
  // Threads as OpenMP will use them on the compute thread (make_attention's TeamScope).
  const int threads = std::max(1, omp_get_max_threads());
  const std::size_t rows = std::size_t(s.batch * s.heads * attn_tokens(s));  // one LSE and one D per query row
  std::int64_t max_len = 0;
  for (const AttnSeq& q : attn_sequences(s)) max_len = std::max(max_len, q.len);
  return std::make_unique<FlashAttention>(env, s, t, seed, threads, rows, max_len);
}

}  // namespace sb::cpu
