// Naive attention on the cpu device: the score matrix is materialised, as an
// eager framework does it without a fused kernel.
//   forward:  S = Q K^T (oneDNN batched matmul, fp32), P = softmax(scale*S
//             [+ causal mask]) row by row in C++, O = P V (oneDNN).
//   backward: dV = P^T dO, dP = dO V^T (oneDNN); dS = scale * P * (dP - D)
//             with D = rowsum(dO * O) (C++); dQ = dS K, dK = dS^T Q (oneDNN).
// The scale is folded into the softmax and into dS, so every GEMM is plain.
// Memory: S (fp32, reused for dP), P and dS (dtype) are B*H*S^2 each: this is
// the implementation that runs out of memory, and it does so in
// make_attention, where everything is allocated up front.
// bf16: Q, K, V, dO, P and dS are bf16 operands of bf16 oneDNN matmuls (fp32
// accumulation, fp32 results), as a bf16 eager framework would keep them.
#include <omp.h>  // omp_get_max_threads

#include <algorithm>  // std::max
#include <cmath>      // INFINITY
#include <map>        // std::map
#include <set>        // std::set

#include <fmt/format.h>  // fmt::format

#include "kernels/cpu/detail/attention.hpp"   // CpuAttention, fast_exp
#include "kernels/cpu/detail/dnnl_check.hpp"  // SB_DNNL_CHECK

namespace sb::cpu {
namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

// One batched GEMM: its primitive and its operands, views over op-owned memory.
struct Mm {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  dnnl::memory src, wei, dst, scratch;
};

// Sequences laid out alike form one group of batched GEMMs over N matrices.
// Dense: one group, N = B*H matrices of S x D, S*D elements apart. Varlen:
// one group per sequence, N = H matrices of len x D, T*D apart (the head
// stride), starting at the sequence's first token.
struct Group {
  std::int64_t n = 0, len = 0, bs = 0, off = 0;  // bs, off in elements of a [B,H,T,D] tensor
  std::size_t s_off = 0;                         // first of its N*len*len scores
  Mm qk, pv, dv, dp, dq, dk;
};

struct NaivePlan {
  std::vector<Group> groups;
  std::size_t scores = 0;   // sum over groups of N*len^2
  std::size_t scratch = 0;  // the largest oneDNN scratchpad: one buffer serves every GEMM in turn
  std::size_t rows = 0;     // B*H*T, for rowsum(dO*O)
  std::size_t workspace = 0;
  std::string what;
};

// Row r of matrix n of a [N, rows, cols] view with the given strides.
dnnl::memory::desc view(std::int64_t n, std::int64_t rows, std::int64_t cols, dims strides, dt type) {
  return dnnl::memory::desc({n, rows, cols}, type, strides);
}

dnnl::matmul::primitive_desc matmul_pd(dnnl::engine& eng, const dnnl::memory::desc& a, const dnnl::memory::desc& b,
                                       const dnnl::memory::desc& c) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // so the ledger sees it
  return SB_DNNL_CHECK(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, eng));
}

NaivePlan plan(dnnl::engine& eng, const AttnShape& s, DType t) {
  NaivePlan p;
  const dt in = t == DType::bf16 ? dt::bf16 : dt::f32;
  const std::int64_t D = s.head_dim, T = attn_tokens(s);
  if (!s.varlen()) {
    p.groups.push_back({s.batch * s.heads, s.seq, s.seq * D, 0});
  } else {
    for (const AttnSeq& q : attn_sequences(s)) p.groups.push_back({s.heads, q.len, T * D, q.start * D});
  }
  for (Group& g : p.groups) {
    const std::int64_t N = g.n, L = g.len, bs = g.bs;
    g.s_off = p.scores;
    p.scores += std::size_t(N * L * L);
    const auto rows = [&](dt ty) { return view(N, L, D, {bs, D, 1}, ty); };        // Q, K, V, dO, O, ...
    const auto rows_t = [&](dt ty) { return view(N, D, L, {bs, 1, D}, ty); };      // K^T, V^T
    const auto sq = [&](dt ty) { return view(N, L, L, {L * L, L, 1}, ty); };       // S, P, dS
    const auto sq_t = [&](dt ty) { return view(N, L, L, {L * L, 1, L}, ty); };     // P^T, dS^T
    g.qk.pd = matmul_pd(eng, rows(in), rows_t(in), sq(dt::f32));        // S = Q K^T
    g.pv.pd = matmul_pd(eng, sq(in), rows(in), rows(dt::f32));          // O = P V
    g.dv.pd = matmul_pd(eng, sq_t(in), rows(in), rows(dt::f32));        // dV = P^T dO
    g.dp.pd = matmul_pd(eng, rows(in), rows_t(in), sq(dt::f32));        // dP = dO V^T
    g.dq.pd = matmul_pd(eng, sq(in), rows(in), rows(dt::f32));          // dQ = dS K
    g.dk.pd = matmul_pd(eng, sq_t(in), rows(in), rows(dt::f32));        // dK = dS^T Q
    for (Mm* m : {&g.qk, &g.pv, &g.dv, &g.dp, &g.dq, &g.dk})
      p.scratch = std::max(p.scratch, m->pd.scratchpad_desc().get_size());
  }
  const std::size_t esz = std::size_t(storage_bytes(t));
  p.rows = std::size_t(s.batch * s.heads * T);
  // Workspace: S fp32 (dP reuses it), P and dS in the dtype, D = rowsum(dO*O)
  // per row, and the scratchpad.
  p.workspace = p.scores * (4 + 2 * esz) + p.rows * 4 + p.scratch;
  const char* formula = s.varlen() ? "H*sum(len^2)" : "B*H*S*S";
  p.what = fmt::format("S = {} fp32 {}, P {} {}, dS {} {}, rowsum(dO*O) {}, oneDNN scratchpad {}", formula,
                       format_bytes(p.scores * 4), to_string(t), format_bytes(p.scores * esz), to_string(t),
                       format_bytes(p.scores * esz), format_bytes(p.rows * 4), format_bytes(p.scratch));
  return p;
}

// ---- row kernels (compiled per ISA) ----

// exp(scale*s - max) in place over the n unmasked entries; returns 1/sum.
SB_CPU_CLONES float softmax_exps(float* s, std::int64_t n, float scale) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (std::int64_t c = 0; c < n; ++c) m = std::max(m, s[c]);
  const float ms = m * scale;  // scale > 0, so max(scale*s) = scale*max(s)
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t c = 0; c < n; ++c) {
    const float e = fast_exp(s[c] * scale - ms);
    s[c] = e;
    sum += e;
  }
  return 1.0f / sum;
}

// P row: e * inv where unmasked, 0 after (the causal mask).
template <class T>
inline void write_p(T* p, const float* e, std::int64_t n, std::int64_t len, float inv) {
  for (std::int64_t c = 0; c < n; ++c) st(p + c, e[c] * inv);
  for (std::int64_t c = n; c < len; ++c) st(p + c, 0.0f);
}
SB_CPU_CLONES void write_p_row(float* p, const float* e, std::int64_t n, std::int64_t len, float inv) {
  write_p(p, e, n, len, inv);
}
SB_CPU_CLONES void write_p_row(std::uint16_t* p, const float* e, std::int64_t n, std::int64_t len, float inv) {
  write_p(p, e, n, len, inv);
}

// dS row = scale * P * (dP - D_i); masked entries have P = 0 and so dS = 0.
template <class T>
inline void ds(T* out, const T* p, const float* dp, std::int64_t len, float d_i, float scale) {
  for (std::int64_t c = 0; c < len; ++c) st(out + c, scale * ld(p + c) * (dp[c] - d_i));
}
SB_CPU_CLONES void ds_row(float* out, const float* p, const float* dp, std::int64_t len, float d_i, float scale) {
  ds(out, p, dp, len, d_i, scale);
}
SB_CPU_CLONES void ds_row(std::uint16_t* out, const std::uint16_t* p, const float* dp, std::int64_t len, float d_i,
                          float scale) {
  ds(out, p, dp, len, d_i, scale);
}

template <class T>
float dot_row(const T* a, const float* b, std::int64_t n) {
  float acc = 0;
#pragma omp simd reduction(+ : acc)
  for (std::int64_t i = 0; i < n; ++i) acc += ld(a + i) * b[i];
  return acc;
}

class NaiveAttention final : public CpuAttention {
 public:
  ~NaiveAttention() override { finish_running_work(); }
  NaiveAttention(const AttnEnv& env, const AttnShape& s, DType t, std::uint64_t seed, NaivePlan p)
      : CpuAttention(env, s, AttnImpl::naive, t, seed, p.workspace, p.what), plan_(std::move(p)),
        strm_(SB_DNNL_CHECK(dnnl::stream(env.eng))) {
    const std::size_t esz = std::size_t(storage_bytes(t));
    s_ = alloc_workspace(plan_.scores * 4, "S (scores, fp32; dP in backward)");
    p_ = alloc_workspace(plan_.scores * esz, "P");
    ds_ = alloc_workspace(plan_.scores * esz, "dS");
    d_ = alloc_workspace(plan_.rows * 4, "rowsum(dO*O)");
    scratch_ = alloc_workspace(plan_.scratch, "oneDNN scratchpad");
    auto& eng = env_.eng;
    // Element e of a tensor stored with esz bytes per element.
    auto at = [](const LedgerBlock& b, std::size_t e, std::size_t sz) { return b.as<char>() + e * sz; };
    for (Group& g : plan_.groups) {
      const std::size_t off = std::size_t(g.off);
      auto bind = [&](Mm& m, void* a, void* w, void* c) {
        m.prim = SB_DNNL_CHECK(dnnl::matmul(m.pd));
        m.src = SB_DNNL_CHECK(dnnl::memory(m.pd.src_desc(), eng, a));
        m.wei = SB_DNNL_CHECK(dnnl::memory(m.pd.weights_desc(), eng, w));
        m.dst = SB_DNNL_CHECK(dnnl::memory(m.pd.dst_desc(), eng, c));
        m.scratch = SB_DNNL_CHECK(dnnl::memory(m.pd.scratchpad_desc(), eng, scratch_.data()));
      };
      void* S = at(s_, g.s_off, 4);
      void* P = at(p_, g.s_off, esz);
      void* dS = at(ds_, g.s_off, esz);
      bind(g.qk, at(q_, off, esz), at(k_, off, esz), S);
      bind(g.pv, P, at(v_, off, esz), at(o_, off, 4));
      bind(g.dv, P, at(do_, off, esz), at(dv_, off, 4));
      bind(g.dp, at(do_, off, esz), at(v_, off, esz), S);
      bind(g.dq, dS, at(k_, off, esz), at(dq_, off, 4));
      bind(g.dk, dS, at(q_, off, esz), at(dk_, off, 4));
    }
    std::set<std::string> impls;
    for (Mm* m : {&plan_.groups[0].qk, &plan_.groups[0].pv, &plan_.groups[0].dv, &plan_.groups[0].dk})
      impls.insert(m->pd.impl_info_str());
    std::string names;
    for (const auto& i : impls) names += (names.empty() ? "" : ", ") + i;
    const dnnl_version_t* ver = dnnl_version();
    detail_ = fmt::format("oneDNN {}.{} matmul ({}) + C++ softmax ({} OpenMP threads); S fp32 and P {} materialised, "
                          "outputs fp32",
                          ver->major, ver->minor, names, omp_get_max_threads(), to_string(t));
  }

  std::string impl_detail() const override { return detail_; }

 protected:
  void run_forward() override {
    for (Group& g : plan_.groups) exec(g.qk);
    SB_DNNL_CHECK(strm_.wait());
    if (bf16())
      softmax<std::uint16_t>();
    else
      softmax<float>();
    for (Group& g : plan_.groups) exec(g.pv);
    SB_DNNL_CHECK(strm_.wait());
  }

  void run_backward() override {
    if (bf16())
      rowsum_do_o<std::uint16_t>();
    else
      rowsum_do_o<float>();
    for (Group& g : plan_.groups) {
      exec(g.dv);
      exec(g.dp);
    }
    SB_DNNL_CHECK(strm_.wait());
    if (bf16())
      grad_scores<std::uint16_t>();
    else
      grad_scores<float>();
    for (Group& g : plan_.groups) {
      exec(g.dq);
      exec(g.dk);
    }
    SB_DNNL_CHECK(strm_.wait());
  }

 private:
  void exec(Mm& m) {
    SB_DNNL_CHECK(m.prim.execute(strm_, {{DNNL_ARG_SRC, m.src},
                                         {DNNL_ARG_WEIGHTS, m.wei},
                                         {DNNL_ARG_DST, m.dst},
                                         {DNNL_ARG_SCRATCHPAD, m.scratch}}));
  }

  template <class T>
  void softmax() {
    const bool causal = shape_.causal;
    const float scale = scale_;
    for (const Group& g : plan_.groups) {
      const std::int64_t L = g.len, rows = g.n * g.len;
      float* S = s_.as<float>() + g.s_off;
      T* P = p_.as<T>() + g.s_off;
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < rows; ++i) {
        const std::int64_t r = i % L;
        const std::int64_t n = causal ? r + 1 : L;  // the causal mask: columns after the row's own are -inf
        const float inv = softmax_exps(S + i * L, n, scale);
        write_p_row(P + i * L, S + i * L, n, L, inv);
      }
    }
  }

  // D = rowsum(dO * O) for every row of every (batch, head).
  template <class T>
  void rowsum_do_o() {
    const std::int64_t rows = std::int64_t(plan_.rows), D = shape_.head_dim;
    const T* dO = do_.as<T>();
    const float* O = o_.as<float>();
    float* out = d_.as<float>();
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < rows; ++i) out[i] = dot_row(dO + i * D, O + i * D, D);
  }

  template <class T>
  void grad_scores() {
    const float scale = scale_;
    for (const Group& g : plan_.groups) {
      const std::int64_t L = g.len, rows = g.n * g.len, D = shape_.head_dim;
      const float* dP = s_.as<float>() + g.s_off;
      const T* P = p_.as<T>() + g.s_off;
      T* dS = ds_.as<T>() + g.s_off;
      const float* Drow = d_.as<float>();
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < rows; ++i) {
        const std::int64_t n = i / L, r = i % L;
        const std::int64_t tok = (g.off + n * g.bs) / D + r;  // the row's index in [B,H,T]
        ds_row(dS + i * L, P + i * L, dP + i * L, L, Drow[tok], scale);
      }
    }
  }

  NaivePlan plan_;
  dnnl::stream strm_;
  LedgerBlock s_, p_, ds_, d_, scratch_;
  std::string detail_;
};

}  // namespace

std::unique_ptr<AttentionOp> make_naive_attention(const AttnEnv& env, const AttnShape& s, DType t,
                                                  std::uint64_t seed) {
  return std::make_unique<NaiveAttention>(env, s, t, seed, plan(env.eng, s, t));
}

}  // namespace sb::cpu
