// What the cpu device's two attention implementations share: shape checks,
// operand storage (allocated through the ledger, filled from the seed),
// upload/download, and the dispatch from AttnImpl to an implementation.
#include "kernels/cpu/detail/attention.hpp"

#include <chrono>   // std::chrono::minutes
#include <cmath>    // std::sqrt, std::isfinite
#include <cstring>  // std::memcpy, std::memset

#include <fmt/format.h>  // fmt::format

#include "harness/attention_check.hpp"  // check_attention_size
#include "harness/errors.hpp"  // UsageError, UnsupportedError
#include "harness/random.hpp"  // uniform_pm1
#include "kernels/cpu/detail/omp_team.hpp"  // TeamScope

namespace sb::cpu {

std::vector<AttnSeq> attn_sequences(const AttnShape& s) {
  if (s.batch < 1 || s.heads < 1 || s.head_dim < 1 || s.seq < 1)
    throw UsageError(fmt::format("attention shape B={} H={} S={} D={}: every dimension must be at least 1", s.batch,
                                 s.heads, s.seq, s.head_dim));
  if (!(s.scale >= 0) || !std::isfinite(s.scale))
    throw UsageError(fmt::format("attention scale {} must be finite and >= 0 (0 = 1/sqrt(head_dim))", s.scale));
  check_attention_size(s);
  std::vector<AttnSeq> out;
  if (!s.varlen()) {
    for (std::int64_t b = 0; b < s.batch; ++b) out.push_back({b, 0, s.seq});
    return out;
  }
  const auto& cu = s.cu_seqlens;
  if (s.batch != 1) throw UsageError("varlen attention packs sequences into batch 1 (B must be 1)");
  if (cu.size() < 2 || cu.front() != 0)
    throw UsageError("varlen attention: cu_seqlens must start at 0 and have at least two entries");
  if (cu.back() != s.seq)
    throw UsageError(fmt::format("varlen attention: seq ({}) must equal cu_seqlens.back() ({})", s.seq, cu.back()));
  for (std::size_t i = 1; i < cu.size(); ++i) {
    if (cu[i] < cu[i - 1])
      throw UsageError(fmt::format("varlen attention: cu_seqlens decreases at entry {} ({} < {})", i, cu[i], cu[i - 1]));
    if (cu[i] > cu[i - 1]) out.push_back({0, cu[i - 1], cu[i] - cu[i - 1]});  // empty sequences do nothing
  }
  return out;
}

double attn_scale(const AttnShape& s) { return s.scale > 0 ? s.scale : 1.0 / std::sqrt(double(s.head_dim)); }

std::string attn_label(const AttnShape& s, DType t) {
  std::string l = fmt::format("{} B={} H={} S={} D={}", to_string(t), s.batch, s.heads, s.seq, s.head_dim);
  if (s.varlen()) l += fmt::format(" varlen({} seqs)", s.cu_seqlens.size() - 1);
  if (s.causal) l += " causal";
  return l;
}

std::size_t CpuAttention::operand_bytes(const AttnShape& s, DType t) {
  const std::size_t n = std::size_t(s.batch * s.heads * attn_tokens(s) * s.head_dim);
  // Q,K,V (and dO) in t; O (and dQ,dK,dV) fp32: a forward-only op has no gradients (AttnShape::backward false),
  // as the cuda and sim devices plan it (a fwd point's peak counted 4 unused gradient tensors)
  return s.backward ? 4 * n * std::size_t(storage_bytes(t)) + 4 * n * sizeof(float)
                    : 3 * n * std::size_t(storage_bytes(t)) + n * sizeof(float);
}

namespace {

template <class T>
void fill(T* dst, std::size_t n, std::uint64_t seed) {
  for (std::size_t i = 0; i < n; ++i) st(dst + i, uniform_pm1(seed, i));
}

template <class T>
void convert_in(T* dst, std::span<const float> src) {
  for (std::size_t i = 0; i < src.size(); ++i) st(dst + i, src[i]);
}

}  // namespace

CpuAttention::CpuAttention(const AttnEnv& env, const AttnShape& s, AttnImpl impl, DType t, std::uint64_t seed,
                           std::size_t workspace_bytes, const std::string& workspace_what)
    : env_(env), shape_(s), impl_(impl), dtype_(t), seqs_(attn_sequences(s)), tokens_(attn_tokens(s)),
      elems_(std::size_t(s.batch * s.heads * attn_tokens(s) * s.head_dim)), scale_(float(attn_scale(s))),
      workspace_bytes_(workspace_bytes), label_(fmt::format("{} attention {}", to_string(impl), attn_label(s, t))) {
  const std::size_t ops = operand_bytes(s, t);
  // One check of everything before the first allocation: the message names
  // the whole requirement, not whichever buffer happened to be last.
  env_.ledger->require(ops + workspace_bytes,
                       fmt::format("{} ({}; operands {} {})", label_, workspace_what,
                                   s.backward ? "Q,K,V,dO,O,dQ,dK,dV" : "Q,K,V,O", format_bytes(ops)));
  const std::size_t in_bytes = elems_ * std::size_t(storage_bytes(t)), out_bytes = elems_ * sizeof(float);
  auto& L = *env_.ledger;
  q_ = L.alloc(in_bytes, label_ + " Q");
  k_ = L.alloc(in_bytes, label_ + " K");
  v_ = L.alloc(in_bytes, label_ + " V");
  o_ = L.alloc(out_bytes, label_ + " O");
  if (s.backward) {
    do_ = L.alloc(in_bytes, label_ + " dO");
    dq_ = L.alloc(out_bytes, label_ + " dQ");
    dk_ = L.alloc(out_bytes, label_ + " dK");
    dv_ = L.alloc(out_bytes, label_ + " dV");
  }
  // Fresh buffers no stream work can touch yet: filled here, on this thread.
  // Outputs are written once so that no page fault lands in a timed region.
  const LedgerBlock* ins[] = {&q_, &k_, &v_, &do_};
  for (int i = 0; i < (s.backward ? 4 : 3); ++i) {
    if (bf16())
      fill(ins[i]->as<std::uint16_t>(), elems_, attn_input_seed(seed, i));
    else
      fill(ins[i]->as<float>(), elems_, attn_input_seed(seed, i));
  }
  for (const LedgerBlock* b : {&o_, &dq_, &dk_, &dv_})
    if (b->data()) std::memset(b->data(), 0, out_bytes);
}

LedgerBlock CpuAttention::alloc_workspace(std::size_t bytes, const char* name) {
  LedgerBlock b = env_.ledger->alloc(bytes, fmt::format("{} {}", label_, name));
  if (b.data()) std::memset(b.data(), 0, b.bytes());  // touched now, not in the first timed run
  return b;
}

void CpuAttention::forward() {
  last_seq_ = env_.cs.enqueue(label_ + " fwd", [this] { run_forward(); });
}

void CpuAttention::backward() {
  if (!shape_.backward)
    throw Error(ErrorKind::runtime, label_ + ": backward on an op planned for the forward only (AttnShape::backward)");
  last_seq_ = env_.cs.enqueue(label_ + " bwd", [this] { run_backward(); });
}

void CpuAttention::upload(std::span<const float> q, std::span<const float> k, std::span<const float> v,
                          std::span<const float> d_o) {
  for (auto sp : {q, k, v, d_o})
    if (sp.size() != elems_ && !(sp.data() == d_o.data() && !shape_.backward))  // no dO without a backward
      throw Error(ErrorKind::runtime, fmt::format("cpu attention upload: {} values given, the shape has {}",
                                                  sp.size(), elems_));
  // On the stream, after any work still reading the inputs.
  env_.cs.enqueue("attention upload", [&, this] {
    const std::span<const float> src[] = {q, k, v, d_o};
    const LedgerBlock* dst[] = {&q_, &k_, &v_, &do_};
    for (int i = 0; i < (shape_.backward ? 4 : 3); ++i) {
      if (bf16())
        convert_in(dst[i]->as<std::uint16_t>(), src[i]);
      else
        convert_in(dst[i]->as<float>(), src[i]);
    }
  });
  env_.cs.synchronize(std::chrono::minutes(5));
}

void CpuAttention::download(std::span<float> o, std::span<float> dq, std::span<float> dk, std::span<float> dv) {
  const std::span<float> dst[] = {o, dq, dk, dv};
  const LedgerBlock* src[] = {&o_, &dq_, &dk_, &dv_};
  for (int i = 0; i < 4; ++i) {
    if (dst[i].empty()) continue;
    if (!src[i]->data())
      throw Error(ErrorKind::runtime, label_ + ": no gradients to download: the op was planned for the forward only");
    if (dst[i].size() != elems_)
      throw Error(ErrorKind::runtime, fmt::format("cpu attention download: room for {} values, the shape has {}",
                                                  dst[i].size(), elems_));
    std::memcpy(dst[i].data(), src[i]->data(), elems_ * sizeof(float));
  }
}

std::optional<std::string> attention_unsupported(dnnl::engine& eng, AttnImpl impl, DType t) {
  if (impl == AttnImpl::cudnn)
    return "cuDNN SDPA runs on cuda devices; the cpu device has naive, naive-prealloc and flash";
  if (t != DType::fp32 && t != DType::bf16)
    return fmt::format("cpu attention is implemented for fp32 and bf16, not {}", to_string(t));
  if ((impl == AttnImpl::naive || impl == AttnImpl::naive_prealloc) && t == DType::bf16) {
    // naive's GEMMs are oneDNN bf16 matmuls: ask whether this CPU has one.
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    try {
      const dnnl::matmul::desc d({{2, 32, 32}, dt::bf16, tag::abc}, {{2, 32, 32}, dt::bf16, tag::abc},
                                 {{2, 32, 32}, dt::f32, tag::abc});
      dnnl::matmul::primitive_desc pd(d, eng);
    } catch (const dnnl::error&) {
      return "oneDNN has no bf16 matmul on this CPU (naive attention's GEMMs); flash bf16 runs in C++";
    }
  }
  return std::nullopt;
}

std::unique_ptr<AttentionOp> make_attention(const AttnEnv& env, const AttnShape& s, AttnImpl impl, DType t,
                                            std::uint64_t seed) {
  if (auto why = attention_unsupported(env.eng, impl, t)) throw UnsupportedError(*why);
  attn_sequences(s);  // a bad shape is a usage error before any memory is planned
  // naive's oneDNN primitives and flash's per-thread tiles: for the team that runs them (omp_team.hpp)
  const TeamScope team(env.cs.team());
  try {
    if (impl == AttnImpl::naive || impl == AttnImpl::naive_prealloc)
      return make_naive_attention(env, s, t, seed, impl == AttnImpl::naive);
    return make_flash_attention(env, s, t, seed);
  } catch (const std::bad_alloc&) {
    throw OutOfMemory(fmt::format("cpu: {} attention {}: host allocation failed", to_string(impl),
                                  attn_label(s, t)));
  }
}

}  // namespace sb::cpu
