// Naive attention on the cpu device: the score matrix is materialised, as an
// eager framework does it without a fused kernel. Two variants:
//
// `naive` (EagerAttention): the eager path op by op, as a model's "eager"
// attention runs it in PyTorch (Hugging Face's eager_attention_forward:
// matmul, * scaling, + causal_mask, softmax(dtype=float32).to(dtype), matmul)
// and as autograd runs its backward. Every op writes a freshly allocated
// tensor through the device's allocator (the same glibc allocator PyTorch's
// CPU tensors come from: above glibc's mmap threshold each one is new pages,
// faulted in as the op writes them), and frees its inputs when their last
// user is done; softmax's fp32 output (and, in bf16, P) is kept for the
// backward, as autograd saves them. Dropout is not modelled (p = 0, the
// usual fine-tuning setting). O, dQ, dK, dV are the op's own outputs.
//
// `naive-prealloc` (NaiveAttention): the same GEMMs with every S x S buffer
// allocated once, the scale folded into the softmax and dS, and the causal
// mask applied inside the softmax loop: the fastest a materialising
// implementation can be, and what stallbench measured as `naive` before.
//   forward:  S = Q K^T (oneDNN batched matmul, fp32), P = softmax(scale*S
//             [+ causal mask]) row by row in C++, O = P V (oneDNN).
//   backward: dV = P^T dO, dP = dO V^T (oneDNN); dS = scale * P * (dP - D)
//             with D = rowsum(dO * O) (C++); dQ = dS K, dK = dS^T Q (oneDNN).
// Memory: S (fp32, reused for dP), P and dS (dtype) are B*H*S^2 each.
//
// Both run out of memory the same way: the quadratic buffers are checked in
// make_attention, before anything runs (eager: its peak of live tensors).
// bf16: Q, K, V, dO, P and dS are bf16 operands of bf16 oneDNN matmuls (fp32
// accumulation), as a bf16 eager framework would keep them; the eager path's
// S and dP are bf16 too (a bf16 matmul's output), its softmax runs in fp32.
#include <omp.h>  // omp_get_max_threads

#include <algorithm>  // std::max
#include <cmath>      // INFINITY
#include <map>        // std::map
#include <set>        // std::set

#include <fmt/format.h>  // fmt::format

#include "kernels/cpu/detail/attention.hpp"   // CpuAttention, exp_v
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
  std::size_t m_off = 0;                         // eager causal mask: first of its len*len blocks
  std::int64_t heads = 1;                        // matrices sharing one mask block (H)
  Mm qk, pv, dv, dp, dq, dk;
};

struct NaivePlan {
  std::vector<Group> groups;
  std::size_t scores = 0;   // sum over groups of N*len^2
  std::size_t scratch = 0;  // the largest oneDNN scratchpad: one buffer serves every GEMM in turn
  std::size_t rows = 0;     // B*H*T, for rowsum(dO*O)
  std::size_t mask = 0;     // eager, causal: the mask's elements (B*S^2, or sum(len^2))
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

// eager: QK^T and dO V^T write the dtype (a bf16 matmul's output is bf16).
// Element e of a tensor stored with sz bytes per element.
char* element(const LedgerBlock& b, std::size_t e, std::size_t sz) { return b.as<char>() + e * sz; }

// Makes a GEMM's primitive and its operands' memory (src/dst may be
// DNNL_MEMORY_NONE, bound per call), the scratchpad shared by every GEMM.
void bind(Mm& m, dnnl::engine& eng, void* a, void* w, void* c, void* scratch) {
  m.prim = SB_DNNL_CHECK(dnnl::matmul(m.pd));
  m.src = SB_DNNL_CHECK(dnnl::memory(m.pd.src_desc(), eng, a));
  m.wei = SB_DNNL_CHECK(dnnl::memory(m.pd.weights_desc(), eng, w));
  m.dst = SB_DNNL_CHECK(dnnl::memory(m.pd.dst_desc(), eng, c));
  m.scratch = SB_DNNL_CHECK(dnnl::memory(m.pd.scratchpad_desc(), eng, scratch));
}

// Runs one bound GEMM on the stream.
void exec(Mm& m, dnnl::stream& strm) {
  SB_DNNL_CHECK(m.prim.execute(strm, {{DNNL_ARG_SRC, m.src},
                                      {DNNL_ARG_WEIGHTS, m.wei},
                                      {DNNL_ARG_DST, m.dst},
                                      {DNNL_ARG_SCRATCHPAD, m.scratch}}));
}

NaivePlan plan(dnnl::engine& eng, const AttnShape& s, DType t, bool eager) {
  NaivePlan p;
  const dt in = t == DType::bf16 ? dt::bf16 : dt::f32;
  const dt sc = eager ? in : dt::f32;  // the scores' type as the GEMM writes them
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
    // A model's causal mask is [B, 1, S, S]: one block per sequence, shared by its heads.
    g.heads = s.heads;
    g.m_off = p.mask;
    if (s.causal) p.mask += std::size_t(N / s.heads * L * L);
    const auto rows = [&](dt ty) { return view(N, L, D, {bs, D, 1}, ty); };        // Q, K, V, dO, O, ...
    const auto rows_t = [&](dt ty) { return view(N, D, L, {bs, 1, D}, ty); };      // K^T, V^T
    const auto sq = [&](dt ty) { return view(N, L, L, {L * L, L, 1}, ty); };       // S, P, dS
    const auto sq_t = [&](dt ty) { return view(N, L, L, {L * L, 1, L}, ty); };     // P^T, dS^T
    g.qk.pd = matmul_pd(eng, rows(in), rows_t(in), sq(sc));             // S = Q K^T
    g.pv.pd = matmul_pd(eng, sq(in), rows(in), rows(dt::f32));          // O = P V
    g.dv.pd = matmul_pd(eng, sq_t(in), rows(in), rows(dt::f32));        // dV = P^T dO
    g.dp.pd = matmul_pd(eng, rows(in), rows_t(in), sq(sc));             // dP = dO V^T
    g.dq.pd = matmul_pd(eng, sq(in), rows(in), rows(dt::f32));          // dQ = dS K
    g.dk.pd = matmul_pd(eng, sq_t(in), rows(in), rows(dt::f32));        // dK = dS^T Q
    for (Mm* m : {&g.qk, &g.pv, &g.dv, &g.dp, &g.dq, &g.dk})
      if (s.backward || m == &g.qk || m == &g.pv)  // a forward-only op binds the forward's two
        p.scratch = std::max(p.scratch, m->pd.scratchpad_desc().get_size());
  }
  const std::size_t esz = std::size_t(storage_bytes(t));
  p.rows = std::size_t(s.batch * s.heads * T);
  const char* formula = s.varlen() ? "H*sum(len^2)" : "B*H*S*S";
  if (eager) {
    // The most bytes live at once over a forward and its backward, tensor by
    // tensor in the order EagerAttention allocates and frees them (n scores,
    // e bytes per dtype element; the unit test checks it against the
    // ledger's measured peak). fp32: 12n in the softmax backward (saved P,
    // dP and dS); bf16: 14n there (saved fp32 softmax and bf16 P, dP in fp32
    // and dS).
    const std::size_t n = p.scores, e = esz, m = p.mask * esz;
    const bool b16 = t == DType::bf16;
    const std::size_t saved = 4 * n + (b16 ? 2 * n : 0);
    const std::size_t fwd = std::max({2 * n * e + m, n * e + 4 * n, saved});
    const std::size_t bwd = std::max({saved + n * e + (b16 ? 4 * n : 0), saved + 8 * n,
                                      (b16 ? 2 * n : 0) + 4 * n + (b16 ? 2 * n : 0), (b16 ? 2 * n : 0) + 2 * n * e});
    // A forward-only op (as under torch.no_grad()) never reaches the backward's peak.
    const std::size_t peak = s.backward ? std::max(fwd, bwd) : fwd;
    p.workspace = peak + p.scratch;
    p.what = fmt::format("{} tensors of S = {} ({} fp32) allocated op by op, {} at the peak ({}), "
                         "{}oneDNN scratchpad {}",
                         to_string(t), formula, format_bytes(p.scores * 4), format_bytes(peak),
                         s.backward && bwd >= fwd ? "softmax backward" : "forward",
                         s.causal ? fmt::format("causal mask {}, ", format_bytes(m)) : std::string(),
                         format_bytes(p.scratch));
    return p;
  }
  // Workspace: S fp32 (dP reuses it), P and dS in the dtype, D = rowsum(dO*O)
  // per row, and the scratchpad; a forward-only op has no dS and no D.
  p.workspace = p.scores * (4 + esz) + (s.backward ? p.scores * esz + p.rows * 4 : 0) + p.scratch;
  p.what = fmt::format("S = {} fp32 {}, P {} {}, {}oneDNN scratchpad {}", formula, format_bytes(p.scores * 4),
                       to_string(t), format_bytes(p.scores * esz),
                       s.backward ? fmt::format("dS {} {}, rowsum(dO*O) {}, ", to_string(t),
                                                format_bytes(p.scores * esz), format_bytes(p.rows * 4))
                                  : std::string("forward only (no dS), "),
                       format_bytes(p.scratch));
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
    const float e = exp_v(s[c] * scale - ms);
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


// ---- the eager path's elementwise ops (compiled per ISA) ----

template <class T>
inline void scale_n(T* out, const T* in, std::int64_t n, float a) {
  for (std::int64_t i = 0; i < n; ++i) st(out + i, ld(in + i) * a);
}
SB_CPU_CLONES void scale_span(float* out, const float* in, std::int64_t n, float a) { scale_n(out, in, n, a); }
SB_CPU_CLONES void scale_span(std::uint16_t* out, const std::uint16_t* in, std::int64_t n, float a) {
  scale_n(out, in, n, a);
}

template <class T>
inline void add_n(T* out, const T* a, const T* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) st(out + i, ld(a + i) + ld(b + i));
}
SB_CPU_CLONES void add_span(float* out, const float* a, const float* b, std::int64_t n) { add_n(out, a, b, n); }
SB_CPU_CLONES void add_span(std::uint16_t* out, const std::uint16_t* a, const std::uint16_t* b, std::int64_t n) {
  add_n(out, a, b, n);
}

template <class To, class From>
inline void cast_n(To* out, const From* in, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) st(out + i, ld(in + i));
}
SB_CPU_CLONES void cast_span(std::uint16_t* out, const float* in, std::int64_t n) { cast_n(out, in, n); }
SB_CPU_CLONES void cast_span(float* out, const std::uint16_t* in, std::int64_t n) { cast_n(out, in, n); }

// softmax(dtype=float32) of one whole row: the mask is in the values (the
// dtype's lowest), so every column is read, as a framework's softmax does.
template <class T>
inline void softmax_full(float* out, const T* in, std::int64_t n) {
  float m = -INFINITY;
  for (std::int64_t c = 0; c < n; ++c) m = std::max(m, ld(in + c));
  float sum = 0;
  for (std::int64_t c = 0; c < n; ++c) {
    const float e = exp_v(ld(in + c) - m);
    out[c] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
  for (std::int64_t c = 0; c < n; ++c) out[c] *= inv;
}
SB_CPU_CLONES void softmax_row_full(float* out, const float* in, std::int64_t n) { softmax_full(out, in, n); }
SB_CPU_CLONES void softmax_row_full(float* out, const std::uint16_t* in, std::int64_t n) { softmax_full(out, in, n); }

// The softmax's backward on one row (PyTorch's _softmax_backward_data):
// dS = P * (dP - sum(dP * P)).
SB_CPU_CLONES void softmax_backward_row(float* ds, const float* p, const float* dp, std::int64_t n) {
  float dot = 0;
#pragma omp simd reduction(+ : dot)
  for (std::int64_t c = 0; c < n; ++c) dot += dp[c] * p[c];
  for (std::int64_t c = 0; c < n; ++c) ds[c] = p[c] * (dp[c] - dot);
}

// Elements [0, n) in chunks across the OpenMP team: an elementwise op.
template <class F>
void parallel_span(std::int64_t n, F&& f) {
  constexpr std::int64_t kChunk = 1 << 16;
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < chunks; ++i) f(i * kChunk, std::min(kChunk, n - i * kChunk));
}

class NaiveAttention final : public CpuAttention {
 public:
  ~NaiveAttention() override { finish_running_work(); }
  NaiveAttention(const AttnEnv& env, const AttnShape& s, DType t, std::uint64_t seed, NaivePlan p)
      : CpuAttention(env, s, AttnImpl::naive_prealloc, t, seed, p.workspace, p.what), plan_(std::move(p)),
        strm_(SB_DNNL_CHECK(dnnl::stream(env.eng))) {
    const std::size_t esz = std::size_t(storage_bytes(t));
    s_ = alloc_workspace(plan_.scores * 4, "S (scores, fp32; dP in backward)");
    p_ = alloc_workspace(plan_.scores * esz, "P");
    if (s.backward) {
      ds_ = alloc_workspace(plan_.scores * esz, "dS");
      d_ = alloc_workspace(plan_.rows * 4, "rowsum(dO*O)");
    }
    scratch_ = alloc_workspace(plan_.scratch, "oneDNN scratchpad");
    auto& eng = env_.eng;
    void* scratch = scratch_.data();
    for (Group& g : plan_.groups) {
      const std::size_t off = std::size_t(g.off);
      void* S = element(s_, g.s_off, 4);
      void* P = element(p_, g.s_off, esz);
      bind(g.qk, eng, element(q_, off, esz), element(k_, off, esz), S, scratch);
      bind(g.pv, eng, P, element(v_, off, esz), element(o_, off, 4), scratch);
      if (!s.backward) continue;
      void* dS = element(ds_, g.s_off, esz);
      bind(g.dv, eng, P, element(do_, off, esz), element(dv_, off, 4), scratch);
      bind(g.dp, eng, element(do_, off, esz), element(v_, off, esz), S, scratch);
      bind(g.dq, eng, dS, element(k_, off, esz), element(dq_, off, 4), scratch);
      bind(g.dk, eng, dS, element(q_, off, esz), element(dk_, off, 4), scratch);
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
    mark("gemm S=QK^T");
    for (Group& g : plan_.groups) exec(g.qk);
    SB_DNNL_CHECK(strm_.wait());
    mark("softmax_warp_forward");
    if (bf16())
      softmax<std::uint16_t>();
    else
      softmax<float>();
    mark("gemm O=PV");
    for (Group& g : plan_.groups) exec(g.pv);
    SB_DNNL_CHECK(strm_.wait());
  }

  void run_backward() override {
    mark("reduce_kernel rowsum(dO*O)");
    if (bf16())
      rowsum_do_o<std::uint16_t>();
    else
      rowsum_do_o<float>();
    mark("gemm dV=P^T dO, dP=dO V^T");
    for (Group& g : plan_.groups) {
      exec(g.dv);
      exec(g.dp);
    }
    SB_DNNL_CHECK(strm_.wait());
    mark("softmax_warp_backward");
    if (bf16())
      grad_scores<std::uint16_t>();
    else
      grad_scores<float>();
    mark("gemm dQ=dS K, dK=dS^T Q");
    for (Group& g : plan_.groups) {
      exec(g.dq);
      exec(g.dk);
    }
    SB_DNNL_CHECK(strm_.wait());
  }

 private:
  void exec(Mm& m) { sb::cpu::exec(m, strm_); }

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


// The eager path: one freshly allocated tensor per op (see the top of the
// file). Tensors are LedgerBlocks, so the device's in-use and peak bytes are
// exact; the peak was reserved against the host budget at construction, so
// an op pays the allocator and its page faults, not a /proc read.
class EagerAttention final : public CpuAttention {
 public:
  ~EagerAttention() override { finish_running_work(); }
  EagerAttention(const AttnEnv& env, const AttnShape& s, DType t, std::uint64_t seed, NaivePlan p)
      : CpuAttention(env, s, AttnImpl::naive, t, seed, p.workspace, p.what), plan_(std::move(p)),
        strm_(SB_DNNL_CHECK(dnnl::stream(env.eng))),
        host_(reserve_host_memory(plan_.workspace - plan_.scratch, label_ + " tensors allocated op by op")) {
    scratch_ = alloc_workspace(plan_.scratch, "oneDNN scratchpad");
    auto& eng = env_.eng;
    const std::size_t esz = std::size_t(storage_bytes(t));
    void* scratch = scratch_.data();
    // Operands of the op are bound once; the S x S side of each GEMM is a
    // fresh tensor every call, bound by set_data_handle before it runs.
    for (Group& g : plan_.groups) {
      const std::size_t off = std::size_t(g.off);
      void* none = DNNL_MEMORY_NONE;
      bind(g.qk, eng, element(q_, off, esz), element(k_, off, esz), none, scratch);
      bind(g.pv, eng, none, element(v_, off, esz), element(o_, off, 4), scratch);
      if (!s.backward) continue;  // a forward-only op has no dO, dQ, dK, dV
      bind(g.dv, eng, none, element(do_, off, esz), element(dv_, off, 4), scratch);
      bind(g.dp, eng, element(do_, off, esz), element(v_, off, esz), none, scratch);
      bind(g.dq, eng, none, element(k_, off, esz), element(dq_, off, 4), scratch);
      bind(g.dk, eng, none, element(q_, off, esz), element(dk_, off, 4), scratch);
    }
    const dnnl_version_t* ver = dnnl_version();
    detail_ = fmt::format("eager, op by op: oneDNN {}.{} matmul ({}) and C++ elementwise ops ({} OpenMP threads), "
                          "each into a fresh {} tensor from the allocator: Q K^T, * scale, {}softmax in fp32{}, "
                          "@ V; backward likewise",
                          ver->major, ver->minor, plan_.groups[0].qk.pd.impl_info_str(), omp_get_max_threads(),
                          to_string(t), shape_.causal ? "+ causal mask, " : "", bf16() ? ", .to(bf16)" : "");
  }

  std::string impl_detail() const override { return detail_; }

 protected:
  void run_forward() override {
    const std::size_t n = plan_.scores, e = esz();
    saved_ = false;  // the previous step's saved tensors go with its graph
    p32_ = {};
    pt_ = {};
    mark("gemm S=QK^T");
    LedgerBlock s = tensor(n * e, "Q K^T");
    for (Group& g : plan_.groups) exec(g.qk, nullptr, s.as<char>() + g.s_off * e);
    SB_DNNL_CHECK(strm_.wait());
    mark("elementwise_kernel mul(scale)");
    LedgerBlock scaled = tensor(n * e, "* scale");
    elementwise([&](auto* out, const auto* in, std::int64_t b, std::int64_t k) { scale_span(out + b, in + b, k, scale_); },
                scaled, s, n);
    s = {};
    if (shape_.causal) {
      LedgerBlock mask = tensor(plan_.mask * e, "causal mask");
      fill_mask(mask);
      LedgerBlock sum = tensor(n * e, "+ causal mask");
      add_mask(sum, scaled, mask);
      scaled = std::move(sum);  // frees the unmasked scores; the mask goes at the end of scope
    }
    mark("softmax_warp_forward");
    p32_ = tensor(n * 4, "softmax (fp32)");
    softmax_rows(scaled);
    scaled = {};
    if (bf16()) {
      pt_ = tensor(n * 2, "softmax.to(bf16)");
      parallel_span(std::int64_t(n), [&](std::int64_t b, std::int64_t k) {
        cast_span(pt_.as<std::uint16_t>() + b, p32_.as<float>() + b, k);
      });
    }
    const LedgerBlock& p = bf16() ? pt_ : p32_;
    mark("gemm O=PV");
    for (Group& g : plan_.groups) exec(g.pv, p.as<char>() + g.s_off * e, nullptr);
    SB_DNNL_CHECK(strm_.wait());
    if (!shape_.backward) {  // forward only, as under no_grad: nothing is kept for a backward
      p32_ = {};
      pt_ = {};
      return;
    }
    saved_ = true;  // only a forward that finished leaves what the backward reads
  }

  void run_backward() override {
    if (!saved_)
      throw Error(ErrorKind::runtime, label_ + ": backward without a completed forward (nothing saved)");
    saved_ = false;
    const std::size_t n = plan_.scores, e = esz();
    const LedgerBlock& p = bf16() ? pt_ : p32_;
    // matmul(P, V)'s backward: dV = P^T dO, dP = dO V^T.
    mark("gemm dV=P^T dO, dP=dO V^T");
    LedgerBlock dp = tensor(n * e, "dO V^T");
    for (Group& g : plan_.groups) {
      exec(g.dv, p.as<char>() + g.s_off * e, nullptr);
      exec(g.dp, nullptr, dp.as<char>() + g.s_off * e);
    }
    SB_DNNL_CHECK(strm_.wait());
    if (bf16()) {  // .to(bf16)'s backward: the gradient back to fp32
      LedgerBlock dp32 = tensor(n * 4, "grad.to(fp32)");
      parallel_span(std::int64_t(n), [&](std::int64_t b, std::int64_t k) {
        cast_span(dp32.as<float>() + b, dp.as<std::uint16_t>() + b, k);
      });
      dp = std::move(dp32);
    }
    mark("softmax_warp_backward");
    LedgerBlock ds = tensor(n * 4, "softmax backward");
    softmax_backward_rows(ds, dp);
    dp = {};
    p32_ = {};
    if (bf16()) {  // the softmax's input was bf16: its gradient is cast back
      LedgerBlock d16 = tensor(n * 2, "grad.to(bf16)");
      parallel_span(std::int64_t(n), [&](std::int64_t b, std::int64_t k) {
        cast_span(d16.as<std::uint16_t>() + b, ds.as<float>() + b, k);
      });
      ds = std::move(d16);
    }
    // + mask passes the gradient through; * scale's backward scales it.
    LedgerBlock ds2 = tensor(n * e, "* scale backward");
    elementwise([&](auto* out, const auto* in, std::int64_t b, std::int64_t k) { scale_span(out + b, in + b, k, scale_); },
                ds2, ds, n);
    ds = {};
    // matmul(Q, K^T)'s backward: dQ = dS K, dK = dS^T Q.
    mark("gemm dQ=dS K, dK=dS^T Q");
    for (Group& g : plan_.groups) {
      exec(g.dq, ds2.as<char>() + g.s_off * e, nullptr);
      exec(g.dk, ds2.as<char>() + g.s_off * e, nullptr);
    }
    SB_DNNL_CHECK(strm_.wait());
    pt_ = {};
  }

 private:
  std::size_t esz() const { return std::size_t(storage_bytes(dtype_)); }
  LedgerBlock tensor(std::size_t bytes, const char* what) {
    return env_.ledger->alloc_in_reserved(bytes, fmt::format("{} {}", label_, what));
  }

  // a GEMM with its S x S operand (src or dst, whichever is null) rebound.
  void exec(Mm& m, void* src, void* dst) {
    if (src) m.src.set_data_handle(src);
    if (dst) m.dst.set_data_handle(dst);
    sb::cpu::exec(m, strm_);
  }

  // out = f(in) elementwise over n elements of the dtype.
  template <class F>
  void elementwise(F&& f, LedgerBlock& out, const LedgerBlock& in, std::size_t n) {
    if (bf16())
      parallel_span(std::int64_t(n), [&](std::int64_t b, std::int64_t k) {
        f(out.as<std::uint16_t>(), in.as<const std::uint16_t>(), b, k);
      });
    else
      parallel_span(std::int64_t(n), [&](std::int64_t b, std::int64_t k) { f(out.as<float>(), in.as<const float>(), b, k); });
  }

  // 0 on and below the diagonal, the dtype's lowest value above it (as a
  // model builds its causal mask), one block per sequence.
  void fill_mask(LedgerBlock& mask) {
    const float lowest = bf16() ? -3.3895313892515355e38f : -3.4028234663852886e38f;
    for (const Group& g : plan_.groups) {
      const std::int64_t L = g.len, blocks = g.n / g.heads;
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < blocks * L; ++i) {
        const std::int64_t r = i % L;
        for (std::int64_t c = 0; c < L; ++c) {
          const float v = c <= r ? 0.0f : lowest;
          if (bf16())
            st(mask.as<std::uint16_t>() + g.m_off + i * L + c, v);
          else
            mask.as<float>()[g.m_off + i * L + c] = v;
        }
      }
    }
  }

  // out = scores + mask, the mask broadcast over heads.
  void add_mask(LedgerBlock& out, const LedgerBlock& scores, const LedgerBlock& mask) {
    for (const Group& g : plan_.groups) {
      const std::int64_t L = g.len;
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < g.n * L; ++i) {
        const std::int64_t mrow = (i / L) / g.heads * L + i % L;
        const std::size_t o = g.s_off + std::size_t(i * L), mo = g.m_off + std::size_t(mrow * L);
        if (bf16())
          add_span(out.as<std::uint16_t>() + o, scores.as<std::uint16_t>() + o, mask.as<std::uint16_t>() + mo, L);
        else
          add_span(out.as<float>() + o, scores.as<float>() + o, mask.as<float>() + mo, L);
      }
    }
  }

  void softmax_rows(const LedgerBlock& in) {
    for (const Group& g : plan_.groups) {
      const std::int64_t L = g.len;
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < g.n * L; ++i) {
        const std::size_t o = g.s_off + std::size_t(i * L);
        if (bf16())
          softmax_row_full(p32_.as<float>() + o, in.as<std::uint16_t>() + o, L);
        else
          softmax_row_full(p32_.as<float>() + o, in.as<float>() + o, L);
      }
    }
  }

  void softmax_backward_rows(LedgerBlock& ds, const LedgerBlock& dp) {
    for (const Group& g : plan_.groups) {
      const std::int64_t L = g.len;
#pragma omp parallel for schedule(static)
      for (std::int64_t i = 0; i < g.n * L; ++i) {
        const std::size_t o = g.s_off + std::size_t(i * L);
        softmax_backward_row(ds.as<float>() + o, p32_.as<float>() + o, dp.as<float>() + o, L);
      }
    }
  }

  NaivePlan plan_;
  dnnl::stream strm_;
  HostReservation host_;     // the peak of the per-op tensors, against the host budget
  LedgerBlock scratch_;
  LedgerBlock p32_, pt_;     // saved for the backward: softmax's fp32 output, and P in bf16
  bool saved_ = false;       // a forward completed and its tensors are kept (compute thread only)
  std::string detail_;
};

}  // namespace

std::unique_ptr<AttentionOp> make_naive_attention(const AttnEnv& env, const AttnShape& s, DType t, std::uint64_t seed,
                                                  bool eager) {
  if (eager) return std::make_unique<EagerAttention>(env, s, t, seed, plan(env.eng, s, t, true));
  return std::make_unique<NaiveAttention>(env, s, t, seed, plan(env.eng, s, t, false));
}

}  // namespace sb::cpu
