// Attention on the cpu device (naive: oneDNN matmul + C++ softmax; flash:
// tiled online softmax) against the double-precision reference, the
// reference itself on a hand-computed case, the check catching a broken op,
// and the memory ledger (limits, OutOfMemory, peak). Small shapes only, no
// timing assertions: this machine has 2 shared cores.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <gtest/gtest.h>

#include "fake_device.hpp"
#include "harness/attention_check.hpp"
#include "harness/errors.hpp"
#include "harness/random.hpp"
#include "kernels/cpu/cpu_backend.hpp"

namespace sb {
namespace {

using namespace std::chrono_literals;
constexpr std::size_t MiB = 1024 * 1024;

std::unique_ptr<Device> cpu() { return make_cpu_backend().open(0); }

AttnShape dense(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d, bool causal = false) {
  AttnShape a;
  a.batch = b;
  a.heads = h;
  a.seq = s;
  a.head_dim = d;
  a.causal = causal;
  return a;
}

AttnShape varlen(std::int64_t h, std::int64_t d, std::vector<std::int32_t> cu, bool causal = false) {
  AttnShape a = dense(1, h, cu.back(), d, causal);
  a.cu_seqlens = std::move(cu);
  return a;
}

// "... C++ (N OpenMP threads)" in the flash op's impl_detail, or 0.
int openmp_threads(const std::string& detail) {
  const auto at = detail.find(" OpenMP threads");
  if (at == std::string::npos) return 0;
  auto start = detail.rfind('(', at);
  return start == std::string::npos ? 0 : std::atoi(detail.substr(start + 1, at - start - 1).c_str());
}

std::size_t elems(const AttnShape& s) { return std::size_t(s.batch * s.heads * s.seq * s.head_dim); }

// ---- every implementation x dtype x masking against the reference ----

struct Case {
  AttnImpl impl;
  DType dtype;
  const char* name;
};

class AttnVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(AttnVsReference, DenseCausalAndVarlenForwardAndBackward) {
  const Case c = GetParam();
  auto dev = cpu();
  if (auto why = dev->attention_unsupported(c.impl, c.dtype)) {
    // Only bf16 may be missing, and only where oneDNN itself has no bf16
    // matmul here (a CPU without AVX-512: oneDNN 2.6 runs bf16 from avx512_core up).
    ASSERT_EQ(c.dtype, DType::bf16) << *why;
    ASSERT_TRUE(dev->gemm_unsupported(DType::bf16).has_value()) << "attention refuses what GEMM runs: " << *why;
    ASSERT_FALSE(test::onednn_uses_avx512(*dev))
        << "bf16 refused where oneDNN runs AVX-512 (" << dev->info().props["onednn_isa"] << "): " << *why;
    GTEST_SKIP() << *why;
  }
  const AttnShape shapes[] = {
      dense(2, 3, 37, 16),                            // S not a multiple of a tile
      dense(2, 3, 37, 16, true),                      // causal
      dense(1, 2, 130, 32, true),                     // causal across three tiles of 64
      varlen(3, 16, {0, 5, 37, 64}),                  // packed sequences
      varlen(2, 16, {0, 70, 70, 75, 140}, true),      // causal, an empty and a tile-crossing sequence
  };
  for (const AttnShape& s : shapes)
    for (bool bwd : {false, true}) {
      const AttnCheck r = check_attention(*dev, s, c.impl, c.dtype, bwd, 7, 60s);
      EXPECT_TRUE(r.ok) << c.name << " S=" << s.seq << " causal=" << s.causal << " varlen=" << s.varlen()
                        << " bwd=" << bwd << ": " << r.wrong << " wrong; " << r.first_mismatches;
      EXPECT_TRUE(r.checked);
      EXPECT_FALSE(r.impl.empty());
      // Margin, not just a pass: the worst element sits well inside its tolerance.
      EXPECT_LT(r.worst_err, 0.5 * r.worst_tol) << c.name << " worst " << r.worst_tensor << "[" << r.worst_index
                                                 << "] err " << r.worst_err << " tol " << r.worst_tol;
    }
}

INSTANTIATE_TEST_SUITE_P(Cpu, AttnVsReference,
                         ::testing::Values(Case{AttnImpl::naive, DType::fp32, "naive_fp32"},
                                           Case{AttnImpl::naive, DType::bf16, "naive_bf16"},
                                           Case{AttnImpl::naive_prealloc, DType::fp32, "naive_prealloc_fp32"},
                                           Case{AttnImpl::naive_prealloc, DType::bf16, "naive_prealloc_bf16"},
                                           Case{AttnImpl::flash, DType::fp32, "flash_fp32"},
                                           Case{AttnImpl::flash, DType::bf16, "flash_bf16"}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(CpuAttention, ImplDetailSaysWhatRuns) {
  auto dev = cpu();
  // naive bf16 needs oneDNN's bf16 matmul (absent without AVX-512); fp32 says the same things.
  const DType naive_t = dev->attention_unsupported(AttnImpl::naive, DType::bf16) ? DType::fp32 : DType::bf16;
  auto naive = dev->make_attention(dense(1, 1, 16, 16), AttnImpl::naive, naive_t, 1);
  EXPECT_NE(naive->impl_detail().find("oneDNN"), std::string::npos) << naive->impl_detail();
  EXPECT_NE(naive->impl_detail().find("softmax"), std::string::npos) << naive->impl_detail();
  EXPECT_NE(naive->impl_detail().find("op by op"), std::string::npos) << naive->impl_detail();
  EXPECT_EQ(naive->impl(), AttnImpl::naive);
  auto pre = dev->make_attention(dense(1, 1, 16, 16), AttnImpl::naive_prealloc, naive_t, 1);
  EXPECT_EQ(pre->impl(), AttnImpl::naive_prealloc);
  EXPECT_EQ(pre->impl_detail().find("op by op"), std::string::npos) << pre->impl_detail();
  auto flash = dev->make_attention(dense(1, 1, 16, 16), AttnImpl::flash, DType::bf16, 1);
  EXPECT_NE(flash->impl_detail().find("Br=64 Bc=64"), std::string::npos) << flash->impl_detail();
  EXPECT_NE(flash->impl_detail().find("outputs fp32"), std::string::npos) << flash->impl_detail();
  EXPECT_EQ(flash->impl(), AttnImpl::flash);
  EXPECT_EQ(flash->dtype(), DType::bf16);
}

TEST(CpuAttention, CudnnAndFp16AreUnsupportedWithAReason) {
  auto dev = cpu();
  const auto why = dev->attention_unsupported(AttnImpl::cudnn, DType::bf16);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("cuda"), std::string::npos) << *why;
  EXPECT_TRUE(dev->attention_unsupported(AttnImpl::flash, DType::fp16).has_value());
  EXPECT_THROW(dev->make_attention(dense(1, 1, 8, 8), AttnImpl::cudnn, DType::fp32, 1), UnsupportedError);
}

TEST(CpuAttention, BadShapesAreUsageErrors) {
  auto dev = cpu();
  EXPECT_THROW(dev->make_attention(varlen(1, 8, {0, 4, 3}), AttnImpl::flash, DType::fp32, 1), UsageError);
  AttnShape wrong_total = varlen(1, 8, {0, 4, 8});
  wrong_total.seq = 9;
  EXPECT_THROW(dev->make_attention(wrong_total, AttnImpl::naive, DType::fp32, 1), UsageError);
  AttnShape two_batches = varlen(1, 8, {0, 4, 8});
  two_batches.batch = 2;
  EXPECT_THROW(dev->make_attention(two_batches, AttnImpl::flash, DType::fp32, 1), UsageError);
}

// ---- the implementations against each other ----

struct Outputs {
  std::vector<float> o, dq, dk, dv;
};

Outputs run(Device& dev, const AttnShape& s, AttnImpl impl, DType t, const std::vector<float>& q,
            const std::vector<float>& k, const std::vector<float>& v, const std::vector<float>& d_o) {
  auto op = dev.make_attention(s, impl, t, 1);
  op->upload(q, k, v, d_o);
  op->forward();
  op->backward();
  dev.synchronize(60s);
  Outputs out{std::vector<float>(elems(s)), std::vector<float>(elems(s)), std::vector<float>(elems(s)),
              std::vector<float>(elems(s))};
  op->download(out.o, out.dq, out.dk, out.dv);
  return out;
}

std::vector<float> random(std::size_t n, std::uint64_t seed) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = uniform_pm1(seed, i);
  return x;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

TEST(CpuAttention, NaiveAndFlashAgree) {
  auto dev = cpu();
  for (bool causal : {false, true}) {
    const AttnShape s = dense(2, 2, 100, 32, causal);
    const auto q = random(elems(s), 11), k = random(elems(s), 12), v = random(elems(s), 13), g = random(elems(s), 14);
    const Outputs a = run(*dev, s, AttnImpl::naive, DType::fp32, q, k, v, g);
    const Outputs b = run(*dev, s, AttnImpl::flash, DType::fp32, q, k, v, g);
    const Outputs c = run(*dev, s, AttnImpl::naive_prealloc, DType::fp32, q, k, v, g);
    for (const Outputs* x : {&b, &c}) {
      EXPECT_LT(max_diff(a.o, x->o), 1e-5);
      EXPECT_LT(max_diff(a.dq, x->dq), 1e-5);
      EXPECT_LT(max_diff(a.dk, x->dk), 1e-5);
      EXPECT_LT(max_diff(a.dv, x->dv), 1e-5);
    }
  }
}

// The eager path allocates a tensor per op and frees it after its last use:
// the ledger's measured high-water mark over a forward and backward is
// exactly the workspace it planned (and checked against the limit) beyond
// what the op holds between steps; nothing it saved outlives the backward.
TEST(CpuAttention, EagerPeakIsThePlannedWorkspace) {
  auto dev = cpu();
  const std::vector<AttnShape> shapes = {dense(2, 3, 64, 16), dense(2, 3, 64, 16, true),
                                         varlen(2, 16, {0, 32, 96}), varlen(2, 16, {0, 32, 96}, true)};
  for (DType t : {DType::fp32, DType::bf16}) {
    if (auto why = dev->attention_unsupported(AttnImpl::naive, t)) {
      std::printf("  [%s] %s\n", std::string(to_string(t)).c_str(), why->c_str());
      continue;
    }
    for (const AttnShape& s : shapes) {
      const std::size_t before = dev->memory_stats().in_use;
      auto op = dev->make_attention(s, AttnImpl::naive, t, 1);
      const std::size_t held = dev->memory_stats().in_use;  // operands and the oneDNN scratchpad
      const std::size_t operands = 4 * elems(s) * std::size_t(storage_bytes(t)) + 4 * elems(s) * 4;
      ASSERT_GE(held - before, operands);
      const std::size_t scratch = held - before - operands;
      for (int step = 0; step < 2; ++step) {
        dev->reset_peak_memory();
        op->forward();
        op->backward();
        dev->synchronize(60s);
        EXPECT_EQ(dev->memory_stats().peak - held, op->workspace_bytes() - scratch)
            << to_string(t) << " causal=" << s.causal << " varlen=" << s.varlen() << " step " << step;
        EXPECT_EQ(dev->memory_stats().in_use, held) << "a saved tensor outlived the backward";
      }
      // A forward alone keeps what the backward would need, and a second
      // forward replaces it rather than adding to it.
      op->forward();
      dev->synchronize(60s);
      const std::size_t saved = dev->memory_stats().in_use - held;
      const std::size_t n = std::size_t(s.heads) * (s.varlen() ? 32 * 32 + 64 * 64 : std::size_t(s.batch * s.seq * s.seq));
      EXPECT_EQ(saved, t == DType::bf16 ? 6 * n : 4 * n);
      op->forward();
      dev->synchronize(60s);
      EXPECT_EQ(dev->memory_stats().in_use - held, saved);
    }
  }
}

// A forward-only op (AttnShape::backward false, a `pass=fwd` point) plans
// the forward's peak, not the backward's: the ledger's high-water mark over a
// forward is exactly its planned workspace, that is less than the same
// shape's forward-and-backward plan, nothing outlives the forward, and a
// backward is refused. Before, a fwd point reserved (and ran out of memory
// at) the backward's peak.
TEST(CpuAttention, ForwardOnlyPlansTheForwardsPeak) {
  auto dev = cpu();
  const std::vector<AttnShape> shapes = {dense(2, 3, 64, 16), dense(2, 3, 64, 16, true),
                                         varlen(2, 16, {0, 32, 96}, true)};
  for (DType t : {DType::fp32, DType::bf16}) {
    if (dev->attention_unsupported(AttnImpl::naive, t)) continue;
    for (AttnShape s : shapes) {
      std::size_t both = 0, held_both = 0;  // the fwd+bwd op's workspace and what it holds
      {
        const std::size_t b0 = dev->memory_stats().in_use;
        auto op_both = dev->make_attention(s, AttnImpl::naive, t, 1);
        both = op_both->workspace_bytes();
        held_both = dev->memory_stats().in_use - b0;
      }
      const std::size_t both_pre = dev->make_attention(s, AttnImpl::naive_prealloc, t, 1)->workspace_bytes();
      s.backward = false;
      const std::string what = std::string(to_string(t)) + (s.causal ? " causal" : "") + (s.varlen() ? " varlen" : "");
      const std::size_t before = dev->memory_stats().in_use;
      auto op = dev->make_attention(s, AttnImpl::naive, t, 1);
      const std::size_t held = dev->memory_stats().in_use;
      // Q, K, V in t and O fp32: no dO, dQ, dK, dV for a forward-only op (they were held, 4 unused tensors)
      const std::size_t operands = 3 * elems(s) * std::size_t(storage_bytes(t)) + elems(s) * 4;
      ASSERT_GE(held - before, operands);
      // the fwd+bwd op held dO (in t), dQ, dK, dV (fp32) more, and a scratchpad at least as large
      EXPECT_GE(held_both, held - before + elems(s) * std::size_t(storage_bytes(t)) + 3 * elems(s) * 4) << what;
      const std::size_t scratch = held - before - operands;
      EXPECT_LT(op->workspace_bytes(), both) << what;
      dev->reset_peak_memory();
      op->forward();
      dev->synchronize(60s);
      EXPECT_EQ(dev->memory_stats().peak - held, op->workspace_bytes() - scratch) << what;
      EXPECT_EQ(dev->memory_stats().in_use, held) << what << ": a forward-only op kept tensors for a backward";
      EXPECT_THROW(op->backward(), Error) << what;
      // The preallocated path: no dS and no rowsum(dO*O).
      auto pre = dev->make_attention(s, AttnImpl::naive_prealloc, t, 1);
      const std::size_t n = std::size_t(s.heads) * (s.varlen() ? 32 * 32 + 64 * 64 : std::size_t(s.batch * s.seq * s.seq));
      EXPECT_GE(both_pre, pre->workspace_bytes() + n * std::size_t(storage_bytes(t))) << what;
      EXPECT_THROW(pre->backward(), Error) << what;
    }
  }
}

// The eager path allocates while it runs: a limit it no longer fits is an
// OutOfMemory at the synchronize (the runner's status "oom"), nothing leaks,
// and the device goes on.
TEST(CpuAttention, EagerRunningOutOfMemoryMidStepIsReported) {
  auto dev = cpu();
  const AttnShape s = dense(1, 2, 256, 32, true);
  const std::size_t before = dev->memory_stats().in_use;
  auto op = dev->make_attention(s, AttnImpl::naive, DType::fp32, 1);
  const std::size_t held = dev->memory_stats().in_use;
  dev->set_memory_limit(held + 3 * 2 * 256 * 256 * 4 / 2);  // room for one and a half S x S fp32 tensors
  op->forward();
  try {
    dev->synchronize(60s);
    FAIL() << "the forward fitted in 1.5 score tensors";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("* scale"), std::string::npos) << e.what();  // the op that did not fit
  }
  EXPECT_EQ(dev->memory_stats().in_use, held);
  dev->set_memory_limit(0);
  op->forward();
  op->backward();
  dev->synchronize(60s);
  op.reset();
  EXPECT_EQ(dev->memory_stats().in_use, before);
}

// A varlen run must equal each sequence run alone: no token sees another
// sequence, and nothing is written outside a sequence's own rows.
TEST(CpuAttention, VarlenEqualsEachSequenceAlone) {
  auto dev = cpu();
  const std::vector<std::int32_t> cu{0, 5, 37, 64};
  const std::int64_t H = 3, D = 16;
  for (AttnImpl impl : {AttnImpl::naive, AttnImpl::naive_prealloc, AttnImpl::flash})
    for (bool causal : {false, true}) {
      const AttnShape s = varlen(H, D, cu, causal);
      const auto q = random(elems(s), 21), k = random(elems(s), 22), v = random(elems(s), 23),
                 g = random(elems(s), 24);
      const Outputs packed = run(*dev, s, impl, DType::fp32, q, k, v, g);
      for (std::size_t i = 1; i < cu.size(); ++i) {
        const std::int64_t L = cu[i] - cu[i - 1];
        const AttnShape one = dense(1, H, L, D, causal);
        // Cut the sequence's rows out of [1,H,T,D] into [1,H,L,D].
        auto cut = [&](const std::vector<float>& x) {
          std::vector<float> y(elems(one));
          for (std::int64_t h = 0; h < H; ++h)
            std::memcpy(&y[std::size_t(h * L * D)], &x[std::size_t((h * s.seq + cu[i - 1]) * D)],
                        std::size_t(L * D) * sizeof(float));
          return y;
        };
        const Outputs alone = run(*dev, one, impl, DType::fp32, cut(q), cut(k), cut(v), cut(g));
        EXPECT_LT(max_diff(cut(packed.o), alone.o), 1e-6) << to_string(impl) << " sequence " << i;
        EXPECT_LT(max_diff(cut(packed.dq), alone.dq), 1e-6) << to_string(impl) << " sequence " << i;
        EXPECT_LT(max_diff(cut(packed.dk), alone.dk), 1e-6) << to_string(impl) << " sequence " << i;
        EXPECT_LT(max_diff(cut(packed.dv), alone.dv), 1e-6) << to_string(impl) << " sequence " << i;
      }
    }
}

// ---- the reference on a case computed by hand ----

TEST(AttentionReference, TwoTokensOneDimensionByHand) {
  // S = 2, D = 1, scale 1: q = (1, 0), k = (1, -1), v = (2, 4), dO = (1, 1).
  // Row 0: scores (1, -1) -> p0 = e/(e+e^-1) = 1/(1+e^-2), p1 = 1 - p0.
  // Row 1: scores (0, 0)  -> (1/2, 1/2).
  AttnShape s = dense(1, 1, 2, 1);
  s.scale = 1;
  const std::vector<float> q{1, 0}, k{1, -1}, v{2, 4}, g{1, 1};
  const AttnReference r = attention_reference(s, q, k, v, g);
  const double p0 = 1 / (1 + std::exp(-2.0)), p1 = 1 - p0;
  EXPECT_NEAR(r.o[0], 2 * p0 + 4 * p1, 1e-12);
  EXPECT_NEAR(r.o[1], 3.0, 1e-12);
  // dV = P^T dO: column sums of P.
  EXPECT_NEAR(r.dv[0], p0 + 0.5, 1e-12);
  EXPECT_NEAR(r.dv[1], p1 + 0.5, 1e-12);
  // Row 0: dP = (2, 4), D0 = o0; dS = P*(dP - D0) = (-2 p0 p1, 2 p0 p1).
  // dQ0 = dS . k = -4 p0 p1; dK = dS^T q = (-2 p0 p1, 2 p0 p1) (row 1 has q = 0).
  const double w = p0 * p1;
  EXPECT_NEAR(r.dq[0], -4 * w, 1e-12);
  EXPECT_NEAR(r.dk[0], -2 * w, 1e-12);
  EXPECT_NEAR(r.dk[1], 2 * w, 1e-12);
  // Row 1: dP = (2, 4), D1 = 3: dS = (-1/2, 1/2): dQ1 = -1/2 - 1/2 = -1.
  EXPECT_NEAR(r.dq[1], -1.0, 1e-12);

  // Causal: row 0 sees only itself (o0 = v0) and gives no gradient to k1, v1.
  s.causal = true;
  const AttnReference c = attention_reference(s, q, k, v, g);
  EXPECT_NEAR(c.o[0], 2.0, 1e-12);
  EXPECT_NEAR(c.o[1], 3.0, 1e-12);
  EXPECT_NEAR(c.dv[0], 1.5, 1e-12);
  EXPECT_NEAR(c.dv[1], 0.5, 1e-12);
  EXPECT_NEAR(c.dq[0], 0.0, 1e-12);
}

// ---- the check catches a broken op ----

// Returns the reference (stored as fp32), with O's position `bad_row` of
// head 0 taken from the next position: an off-by-one a real kernel can have.
class OffByOneAttention : public AttentionOp {
 public:
  OffByOneAttention(const AttnShape& s, DType t, std::int64_t bad_row) : s_(s), t_(t), bad_(bad_row) {}
  AttnShape shape() const override { return s_; }
  AttnImpl impl() const override { return AttnImpl::flash; }
  DType dtype() const override { return t_; }
  std::string impl_detail() const override { return "off by one (test)"; }
  std::size_t workspace_bytes() const override { return 0; }
  void forward() override {
    const AttnReference r = attention_reference(s_, q_, k_, v_, g_);
    o_.assign(r.o.begin(), r.o.end());
    dq_.assign(r.dq.begin(), r.dq.end());
    dk_.assign(r.dk.begin(), r.dk.end());
    dv_.assign(r.dv.begin(), r.dv.end());
    const std::int64_t D = s_.head_dim;
    if (bad_ >= 0)
      for (std::int64_t d = 0; d < D; ++d)
        o_[std::size_t(bad_ * D + d)] = float(r.o[std::size_t((bad_ + 1) * D + d)]);
  }
  void backward() override {}
  void upload(std::span<const float> q, std::span<const float> k, std::span<const float> v,
              std::span<const float> d_o) override {
    auto rounded = [&](std::span<const float> x) {
      std::vector<float> y(x.begin(), x.end());
      for (float& e : y) e = round_to(t_, e);
      return y;
    };
    q_ = rounded(q);
    k_ = rounded(k);
    v_ = rounded(v);
    g_ = rounded(d_o);
  }
  void download(std::span<float> o, std::span<float> dq, std::span<float> dk, std::span<float> dv) override {
    std::copy(o_.begin(), o_.end(), o.begin());
    if (!dq.empty()) std::copy(dq_.begin(), dq_.end(), dq.begin());
    if (!dk.empty()) std::copy(dk_.begin(), dk_.end(), dk.begin());
    if (!dv.empty()) std::copy(dv_.begin(), dv_.end(), dv.begin());
  }

 private:
  AttnShape s_;
  DType t_;
  std::int64_t bad_;
  std::vector<float> q_, k_, v_, g_, o_, dq_, dk_, dv_;
};

class BrokenAttnDevice : public test::FakeDevice {
 public:
  std::int64_t bad_row = -1;
  std::optional<std::string> attention_unsupported(AttnImpl, DType) const override { return std::nullopt; }
  std::unique_ptr<AttentionOp> make_attention(const AttnShape& s, AttnImpl, DType t, std::uint64_t) override {
    return std::make_unique<OffByOneAttention>(s, t, bad_row);
  }
};

TEST(AttentionCheck, CatchesAnOffByOnePosition) {
  const AttnShape s = dense(1, 2, 12, 8);
  for (DType t : {DType::fp32, DType::bf16}) {
    BrokenAttnDevice good;  // the reference itself, in fp32: passes
    const AttnCheck g = check_attention(good, s, AttnImpl::flash, t, true, 5, 5s);
    EXPECT_TRUE(g.ok) << g.first_mismatches;
    BrokenAttnDevice bad;
    bad.bad_row = 3;  // O row 3 of head 0 holds row 4's values
    const AttnCheck c = check_attention(bad, s, AttnImpl::flash, t, true, 5, 5s);
    EXPECT_FALSE(c.ok);
    EXPECT_GT(c.wrong, 0);
    EXPECT_LE(c.wrong, 8);  // one row of D = 8, nothing else
    EXPECT_EQ(c.worst_tensor, "O");
    EXPECT_GE(c.worst_index, 3 * 8);
    EXPECT_LT(c.worst_index, 4 * 8);
    EXPECT_GT(c.worst_err, c.worst_tol);
    EXPECT_NE(c.first_mismatches.find("O[2"), std::string::npos) << c.first_mismatches;  // O[24..31]
  }
}

// ---- memory: ledger, limit, OutOfMemory ----

TEST(CpuMemory, NaiveRunsOutOfMemoryAndTheDeviceCarriesOn) {
  auto dev = cpu();
  // B=1 H=8 S=4096 D=64 fp32: naive's scores alone are 8*4096^2*4 B = 512 MiB
  // (and P, dS as much again each); flash needs the 64 MiB of operands
  // (8 tensors of 8 MiB) plus 256 KiB of LSE/rowsum and its tiles.
  const AttnShape big = dense(1, 8, 4096, 64);
  dev->set_memory_limit(128 * MiB);
  EXPECT_EQ(dev->memory_stats().limit, 128 * MiB);
  const std::size_t before = dev->memory_stats().in_use;
  try {
    dev->make_attention(big, AttnImpl::naive, DType::fp32, 1);
    FAIL() << "naive attention at S=4096 fitted under 128 MiB";
  } catch (const OutOfMemory& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("GiB"), std::string::npos) << m;        // what it needs
    EXPECT_NE(m.find("128.0 MiB"), std::string::npos) << m;  // the limit
    EXPECT_NE(m.find("B*H*S*S"), std::string::npos) << m;    // why
    EXPECT_NE(m.find("512.0 MiB"), std::string::npos) << m;  // S itself
  }
  EXPECT_EQ(dev->memory_stats().in_use, before);  // nothing leaked by the failed op

  // The device still works: a small op runs and checks out.
  EXPECT_TRUE(check_attention(*dev, dense(1, 2, 40, 16), AttnImpl::naive, DType::fp32, true, 3, 60s).ok);

  // Flash fits at the same shape and limit (sized only; not run here).
  // Its workspace is O(S) plus a fixed set of tiles per OpenMP thread (the
  // thread count is in impl_detail), whatever the machine's core count.
  auto flash = dev->make_attention(big, AttnImpl::flash, DType::fp32, 1);
  const int threads = openmp_threads(flash->impl_detail());
  ASSERT_GE(threads, 1) << flash->impl_detail();
  const std::size_t lse = 2 * std::size_t(big.batch * big.heads * big.seq) * 4;  // LSE and rowsum(dO*O)
  EXPECT_LE(flash->workspace_bytes(), lse + std::size_t(threads) * 2 * MiB) << threads << " threads";
  EXPECT_GE(dev->memory_stats().in_use, before + 64 * MiB);
  flash.reset();
  EXPECT_EQ(dev->memory_stats().in_use, before);

  dev->set_memory_limit(0);
  EXPECT_EQ(dev->memory_stats().limit, 0u);
}

TEST(CpuMemory, GemmsAndBuffersGoThroughTheLedger) {
  auto dev = cpu();
  dev->set_memory_limit(8 * MiB);
  EXPECT_THROW(dev->make_gemm({2048, 2048, 1024}, DType::fp32, 1), OutOfMemory);  // 8+8+16 MiB
  EXPECT_THROW(dev->allocate(9 * MiB, MemKind::device), OutOfMemory);
  dev->set_memory_limit(0);
  const auto s0 = dev->memory_stats();
  EXPECT_EQ(s0.source, "allocator");
  {
    Buffer b = dev->allocate(3 * MiB, MemKind::device);
    auto g = dev->make_gemm({256, 256, 256}, DType::fp32, 1);
    EXPECT_GE(dev->memory_stats().in_use, s0.in_use + 3 * MiB + 3 * 256 * 256 * 4);
  }
  EXPECT_EQ(dev->memory_stats().in_use, s0.in_use);
}

TEST(CpuMemory, PeakGrowsWithAllocationAndResets) {
  auto dev = cpu();
  const auto s0 = dev->memory_stats();
  {
    auto op = dev->make_attention(dense(2, 2, 256, 32), AttnImpl::naive_prealloc, DType::fp32, 1);
    // S, P, dS: 3 * B*H*S*S fp32 = 3 MiB, and rowsum(dO*O), all allocated up front.
    EXPECT_GE(op->workspace_bytes(), 3 * 4 * 256 * 256 * 4u);
    const auto s1 = dev->memory_stats();
    EXPECT_GE(s1.in_use, s0.in_use + op->workspace_bytes());
    EXPECT_GE(s1.peak, s1.in_use);
  }
  const auto s2 = dev->memory_stats();
  EXPECT_EQ(s2.in_use, s0.in_use);
  EXPECT_GT(s2.peak, s2.in_use);  // the op's high-water mark stays
  dev->reset_peak_memory();
  EXPECT_EQ(dev->memory_stats().peak, dev->memory_stats().in_use);
}

TEST(CpuMemory, FlashWorkspaceIsLinearInS) {
  auto dev = cpu();
  auto ws = [&](std::int64_t S, AttnImpl impl) {
    return dev->make_attention(dense(1, 2, S, 32), impl, DType::fp32, 1)->workspace_bytes();
  };
  // LSE, rowsum(dO*O) and each thread's dQ accumulator grow with S; nothing
  // grows with S^2: doubling S again adds exactly twice as much.
  const std::size_t a = ws(256, AttnImpl::flash), b = ws(512, AttnImpl::flash), c = ws(1024, AttnImpl::flash);
  EXPECT_GT(b, a);
  EXPECT_EQ(c - b, 2 * (b - a));
  // Naive's S x S grows quadratically: each doubling of S adds about 4x what the previous one
  // did (flash: exactly 2x, above). Not exactly 4: oneDNN's matmul scratchpad, in the workspace
  // too, depends on the ISA it picks (an AMD EPYC gave 3.58). So: more than 3x, and the S x S
  // tensors (S fp32, P and dS fp32 here: 12 bytes a score) are all there.
  const double n1 = double(ws(512, AttnImpl::naive) - ws(256, AttnImpl::naive));
  const double n2 = double(ws(1024, AttnImpl::naive) - ws(512, AttnImpl::naive));
  EXPECT_GT(n2 / n1, 3.0);
  EXPECT_LE(n2 / n1, 4.0 + 1e-9);
  for (std::int64_t S : {256, 512, 1024}) EXPECT_GE(ws(S, AttnImpl::naive), std::size_t(2 * S * S * 12));
}

// ---- FLOPs: the convention of docs/DESIGN.md ----

TEST(AttnShapeFlops, ForwardBackwardIsThreePointFiveForward) {
  const AttnShape s = dense(2, 3, 100, 16, true);
  EXPECT_DOUBLE_EQ(attention_flops(s, false), 2.0 * 2 * 3 * 100 * 100 * 16);
  EXPECT_DOUBLE_EQ(attention_flops(s, true), 3.5 * 2.0 * 2 * 3 * 100 * 100 * 16);
}

TEST(AttnShapeFlops, DenseCausalAndVarlen) {
  // 4*B*H*S^2*D: QK^T and PV, 2*S*S*D each.
  EXPECT_DOUBLE_EQ(dense(2, 3, 100, 16).fwd_flops(), 4.0 * 2 * 3 * 100 * 100 * 16);
  EXPECT_DOUBLE_EQ(dense(2, 3, 100, 16, true).fwd_flops(), 2.0 * 2 * 3 * 100 * 100 * 16);
  // Varlen sums per sequence: 5^2 + 32^2 + 27^2, never 64^2.
  EXPECT_DOUBLE_EQ(varlen(3, 16, {0, 5, 37, 64}).fwd_flops(), 4.0 * 3 * 16 * (25 + 1024 + 729));
  EXPECT_DOUBLE_EQ(varlen(3, 16, {0, 5, 37, 64}, true).fwd_flops(), 2.0 * 3 * 16 * (25 + 1024 + 729));
}

}  // namespace
}  // namespace sb
