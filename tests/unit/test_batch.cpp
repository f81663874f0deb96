// The batch scenario's decoder step on the cpu device: gradient accumulation
// means what it says (the optimizer once per window; the window's gradient is
// the big batch's), and graphs replay the same arithmetic as eager.
#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <gtest/gtest.h>

#include "harness/errors.hpp"
#include "harness/params.hpp"
#include "harness/random.hpp"
#include "harness/train_ops.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "workloads/decoder.hpp"

namespace sb {
namespace {

using batch::DecoderConfig;
using batch::DecoderStep;

DecoderConfig tiny(std::int64_t mb) {
  DecoderConfig c;
  c.micro_batch = mb;
  c.seq = 8;
  c.d_model = 16;
  c.heads = 2;
  c.layers = 2;
  return c;
}

std::vector<float> data(std::int64_t n, std::uint64_t seed, float scale) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = scale * uniform_pm1(seed, i);
  return v;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) norm = std::max(norm, double(std::fabs(b[i])));
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])) / norm);
  return worst;
}

TEST(BatchDecoder, AccumulatedGradientsEqualTheBigBatch) {
  auto dev = make_cpu_backend().open(0);
  auto ops = dev->make_train_ops();
  const int accum = 4;
  const std::int64_t per = 8 * 16;  // one sequence's values (seq x d_model)
  const auto x = data(per * accum, 5, 1.0f), t = data(per * accum, 6, 0.5f);
  // one big batch of 4 sequences
  DecoderStep big(*dev, *ops, tiny(accum), 7, [] {});
  big.set_input(x, t);
  big.zero_grad();
  big.micro_step(1.0f);
  // 4 micro batches of 1 sequence, each loss divided by 4
  DecoderStep small(*dev, *ops, tiny(1), 7, [] {});
  small.zero_grad();
  for (int i = 0; i < accum; ++i) {
    small.set_input(std::span<const float>(x).subspan(std::size_t(i * per), std::size_t(per)),
                    std::span<const float>(t).subspan(std::size_t(i * per), std::size_t(per)));
    small.micro_step(1.0f / accum);
  }
  for (int l = 0; l < 2; ++l)
    for (int w : {2, 3}) {  // the MLP's weights (attention is a timing stand-in: Wqkv's and Wo's are 0)
      const auto gb = big.grad(l, w), gs = small.grad(l, w);
      double norm = 0;
      for (float g : gb) norm += double(g) * g;
      ASSERT_GT(norm, 0) << "layer " << l << " weight " << w << ": a zero gradient proves nothing";
      EXPECT_LT(max_rel(gs, gb), 1e-5) << "layer " << l << " weight " << w;
    }
  // and the stand-in's weights really are 0 (documented)
  for (float g : big.grad(0, 0)) ASSERT_EQ(g, 0.0f);
}

// The decoder's forward in double on the host (attention's stand-in output
// is 0, so a layer is x' = x + gelu(rmsnorm(x) W1^T) W2^T), and the MSE loss.
double host_loss(const std::vector<std::vector<double>>& w1, const std::vector<std::vector<double>>& w2,
                 const std::vector<float>& x0, const std::vector<float>& t, std::int64_t tokens, std::int64_t d) {
  std::vector<double> x(x0.begin(), x0.end());
  for (std::size_t l = 0; l < w1.size(); ++l) {
    for (std::int64_t r = 0; r < tokens; ++r) {
      double ss = 0;
      for (std::int64_t j = 0; j < d; ++j) ss += x[std::size_t(r * d + j)] * x[std::size_t(r * d + j)];
      const double rs = 1 / std::sqrt(ss / double(d) + 1e-6);
      const auto ff = std::int64_t(w1[l].size()) / d;  // the MLP's width
      std::vector<double> h(static_cast<std::size_t>(ff), 0.0);
      for (std::int64_t o = 0; o < ff; ++o) {
        double z = 0;
        for (std::int64_t i = 0; i < d; ++i) z += x[std::size_t(r * d + i)] * rs * w1[l][std::size_t(o * d + i)];
        h[std::size_t(o)] = 0.5 * z * (1 + std::tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)));
      }
      for (std::int64_t o = 0; o < d; ++o) {
        double y = 0;
        for (std::int64_t i = 0; i < ff; ++i) y += h[std::size_t(i)] * w2[l][std::size_t(o * ff + i)];
        x[std::size_t(r * d + o)] += y;
      }
    }
  }
  double s = 0;
  for (std::size_t i = 0; i < x.size(); ++i) s += (x[i] - t[i]) * (x[i] - t[i]);
  return s / double(x.size());
}

// At the default MLP width (4 x d_model) and at d_ff = 24 (1.5 x d_model: how diagnose runs a gated MLP of
// intermediate size 16), every W1 and W2 entry's gradient against central differences in double.
class DecoderWidth : public ::testing::TestWithParam<std::int64_t> {};
INSTANTIATE_TEST_SUITE_P(BatchDecoder, DecoderWidth, ::testing::Values(0, 24));

TEST_P(DecoderWidth, AccumulatedGradientsMatchAnFp64ReferenceOfTheBigBatch) {
  auto dev = make_cpu_backend().open(0);
  auto ops = dev->make_train_ops();
  const int accum = 3;
  const std::int64_t d = 16, per = 8 * d, tokens = 8 * accum;
  const auto x = data(per * accum, 15, 1.0f), t = data(per * accum, 16, 0.5f);
  DecoderConfig cfg = tiny(1);
  cfg.d_ff = GetParam();
  DecoderStep small(*dev, *ops, cfg, 9, [] {});
  ASSERT_EQ(small.parameters(), 2 * (4 * d * d + 2 * d * cfg.ff()));
  small.zero_grad();
  for (int i = 0; i < accum; ++i) {
    small.set_input(std::span<const float>(x).subspan(std::size_t(i * per), std::size_t(per)),
                    std::span<const float>(t).subspan(std::size_t(i * per), std::size_t(per)));
    small.micro_step(1.0f / accum);
  }
  std::vector<std::vector<double>> w1, w2;
  for (int l = 0; l < 2; ++l) {
    const auto a = small.weight(l, 2), b = small.weight(l, 3);
    ASSERT_EQ(std::int64_t(a.size()), cfg.ff() * d);
    w1.emplace_back(a.begin(), a.end());
    w2.emplace_back(b.begin(), b.end());
  }
  // central differences of the big batch's loss, every W1 and W2 entry of both layers
  for (int l = 0; l < 2; ++l)
    for (int which : {2, 3}) {
      auto& w = which == 2 ? w1[std::size_t(l)] : w2[std::size_t(l)];
      const auto g = small.grad(l, which);
      double gmax = 0;
      for (float v : g) gmax = std::max(gmax, double(std::fabs(v)));
      ASSERT_GT(gmax, 0);
      for (std::size_t i = 0; i < w.size(); ++i) {
        const double keep = w[i], h = 1e-5;
        w[i] = keep + h;
        const double up = host_loss(w1, w2, x, t, tokens, d);
        w[i] = keep - h;
        const double down = host_loss(w1, w2, x, t, tokens, d);
        w[i] = keep;
        ASSERT_NEAR(g[i], (up - down) / (2 * h), 1e-3 * gmax) << "layer " << l << " weight " << which << " [" << i << "]";
      }
    }
}

TEST(BatchDecoder, OptimizerOncePerWindowAndGradientsAccumulate) {
  auto dev = make_cpu_backend().open(0);
  auto ops = dev->make_train_ops();
  DecoderStep s(*dev, *ops, tiny(1), 7, [] {});
  int windows = 0;
  for (int accum : {1, 3, 8}) {
    batch::train_window(s, accum, batch::OptKind::adamw, 1e-3f);
    ++windows;
  }
  EXPECT_EQ(s.optimizer_calls(), windows);
  EXPECT_EQ(s.micro_steps(), 1 + 3 + 8);
  // micro steps add to the gradient (beta = 1) until zero_grad: the same batch twice is twice the gradient
  DecoderStep q(*dev, *ops, tiny(1), 7, [] {});
  q.zero_grad();
  q.micro_step(1.0f);
  const auto g1 = q.grad(1, 3);
  q.micro_step(1.0f);
  const auto g2 = q.grad(1, 3);
  for (std::size_t i = 0; i < g1.size(); ++i) ASSERT_NEAR(g2[i], 2 * g1[i], 1e-5 * (1 + std::fabs(g1[i])));
}

TEST(BatchDecoder, GraphsReplayTheSameArithmeticWithFewerSubmissions) {
  auto dev = make_cpu_backend().open(0);
  auto ops = dev->make_train_ops();
  int subs_eager = 0, subs_graph = 0;
  DecoderStep e(*dev, *ops, tiny(2), 7, [&] { ++subs_eager; });
  DecoderStep g(*dev, *ops, tiny(2), 7, [&] { ++subs_graph; });
  g.set_graphs(true);
  for (DecoderStep* s : {&e, &g}) {
    s->zero_grad();
    s->micro_step(1.0f);  // the graph is captured here (capture submits nothing)
    s->micro_step(1.0f);  // and replayed
  }
  const auto ge = e.grad(1, 2), gg = g.grad(1, 2);
  for (std::size_t i = 0; i < ge.size(); ++i) ASSERT_EQ(ge[i], gg[i]) << i;
  EXPECT_EQ(e.last_submissions(), 49);  // 2 layers: 22 ops + 2 attention calls each, the loss
  EXPECT_EQ(g.last_submissions(), 9);   // 5 graphs between 4 attention calls
  EXPECT_GT(g.graph_nodes(), 40u);
}

TEST(BatchDecoder, CheckpointingRecomputesTheSameGradientsInLessMemory) {
  auto dev = make_cpu_backend().open(0);
  auto ops = dev->make_train_ops();
  DecoderConfig c = tiny(2);
  c.layers = 3;
  DecoderStep plain(*dev, *ops, c, 7, [] {});
  c.checkpointing = true;
  DecoderStep ckpt(*dev, *ops, c, 7, [] {});
  plain.zero_grad();
  ckpt.zero_grad();
  plain.micro_step(1.0f);
  const std::int64_t subs_plain = plain.last_submissions();
  ckpt.micro_step(1.0f);
  for (int l = 0; l < 3; ++l)
    for (int w = 0; w < 4; ++w) EXPECT_EQ(ckpt.grad(l, w), plain.grad(l, w)) << "layer " << l << " weight " << w;
  double norm = 0;
  for (float g : plain.grad(0, 2)) norm += double(g) * g;
  EXPECT_GT(norm, 0);
  // one activation set and one attention op instead of three; the forward runs twice
  EXPECT_LT(ckpt.measured_memory().activations, plain.measured_memory().activations);
  EXPECT_EQ(3 * ckpt.measured_memory().attention, plain.measured_memory().attention);
  EXPECT_EQ(ckpt.measured_memory().weights, plain.measured_memory().weights);
  EXPECT_GT(ckpt.last_submissions(), subs_plain);
}

// K/V heads must divide the heads (each serves a whole group); a step sharing another's parameters must
// have its K/V width too.
TEST(BatchDecoder, KvHeadsDivideTheHeads) {
  auto dev = make_cpu_backend().open(0);
  auto ops = dev->make_train_ops();
  DecoderConfig c = tiny(1);
  c.heads = 4;
  c.kv_heads = 3;
  EXPECT_THROW((void)DecoderStep(*dev, *ops, c, 1, [] {}), UsageError);
  c.kv_heads = 8;
  EXPECT_THROW((void)DecoderStep(*dev, *ops, c, 1, [] {}), UsageError);
  c.kv_heads = 2;
  DecoderStep owner(*dev, *ops, c, 1, [] {});
  EXPECT_EQ(owner.parameters(), 2 * (16 * (16 + 2 * 2 * 4) + 16 * 16 + 2 * 16 * 64));
  DecoderConfig mha = c;
  mha.kv_heads = 0;
  EXPECT_THROW((void)DecoderStep(*dev, *ops, mha, 1, [] {}, &owner), UsageError);
  DecoderStep sharer(*dev, *ops, c, 1, [] {}, &owner);
  EXPECT_EQ(sharer.parameters(), owner.parameters());
}

// The model alone (the memory scenario's OOM loop keeps one between attempts): exactly its weights,
// gradients and AdamW moments, nothing a micro batch sizes; it does not run; a step sharing it at any
// shape allocates its own activations and computes the same gradients as a step that owns its weights.
TEST(BatchDecoder, ParametersOnlyHoldsTheModelAndStepsShareIt) {
  auto dev = make_cpu_backend().open(0);
  auto ops = dev->make_train_ops();
  const DecoderConfig c = tiny(3);
  const std::uint64_t before = dev->memory_stats().in_use;
  DecoderStep model(*dev, *ops, c, 7, DecoderStep::ParametersOnly{});
  model.prepare_optimizer(batch::OptKind::adamw);
  const batch::MemoryParts want = batch::predict_footprint(c, batch::OptKind::adamw, 64, 0, 0);
  EXPECT_EQ(dev->memory_stats().in_use - before, want.weights + want.gradients + want.optimizer);
  EXPECT_EQ(model.measured_memory().activations, 0u);
  EXPECT_THROW(model.micro_step(1.0f), UsageError);
  EXPECT_THROW(model.set_input(std::vector<float>(8 * 16 * 3), std::vector<float>(8 * 16 * 3)), UsageError);
  const auto x = data(8 * 16 * 3, 5, 1.0f), t = data(8 * 16 * 3, 6, 0.5f);
  DecoderStep own(*dev, *ops, c, 7, [] {});
  for (int mb : {3, 1}) {  // at the model's shape and below it: nothing is borrowed from a model without buffers
    DecoderConfig cm = c;
    cm.micro_batch = mb;
    dev->synchronize(std::chrono::seconds(60));  // the cpu device frees the last step's buffers in stream order
    const std::uint64_t held = dev->memory_stats().in_use;
    DecoderStep step(*dev, *ops, cm, 7, [] {}, &model);
    step.prepare_optimizer(batch::OptKind::adamw);
    EXPECT_EQ(step.measured_memory().weights + step.measured_memory().gradients, 0u);
    EXPECT_GT(step.measured_memory().activations, 0u) << "micro batch " << mb;
    EXPECT_EQ(dev->memory_stats().in_use - held, step.measured_memory().total()) << "micro batch " << mb;
    if (mb != 3) continue;
    step.set_input(x, t);
    own.set_input(x, t);
    step.zero_grad();
    own.zero_grad();
    step.micro_step(1.0f);
    own.micro_step(1.0f);
    dev->synchronize(std::chrono::seconds(60));
    for (int l = 0; l < 2; ++l)
      for (int w = 0; w < 4; ++w) {
        EXPECT_EQ(model.grad(l, w), own.grad(l, w)) << "layer " << l << " weight " << w;
        EXPECT_EQ(model.weight(l, w), own.weight(l, w));
      }
  }
}

// The scenarios' validate (exit 2 before any point runs): kv_heads where declared must divide heads; 0 is
// one per head; without the parameter (a scenario that does not declare it) nothing is checked.
TEST(BatchDecoder, ValidateRefusesKvHeadsThatDoNotDivideTheHeads) {
  auto shape = [](std::int64_t heads, std::optional<std::int64_t> kv) {
    ParamSet ps;
    ps.set("d_model", std::int64_t(64));
    ps.set("heads", heads);
    if (kv) ps.set("kv_heads", *kv);
    return ps;
  };
  EXPECT_NO_THROW(batch::validate_decoder_shape(shape(4, std::nullopt)));
  EXPECT_NO_THROW(batch::validate_decoder_shape(shape(4, 0)));
  EXPECT_NO_THROW(batch::validate_decoder_shape(shape(4, 1)));
  EXPECT_NO_THROW(batch::validate_decoder_shape(shape(4, 4)));
  for (std::int64_t kv : {3, 8}) {
    try {
      batch::validate_decoder_shape(shape(4, kv));
      ADD_FAILURE() << "kv_heads " << kv << " of 4 heads was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("kv_heads={} does not divide heads=4", kv)), std::string::npos)
          << e.what();
    }
  }
}

TEST(BatchDecoder, FootprintModelIsTheExactByteCount) {
  // tiny(1): T = 8 tokens, d = 16, 2 layers, fp32, every buffer rounded to
  // the cpu allocator's 64 bytes. Counted by hand:
  //   parameters per layer: Wqkv 768, Wo 256, W1 1024, W2 1024 -> 12,288 B fp32
  //   weights 2 x 12,288; gradients the same; AdamW m and v twice that
  //   activations: 2 layer inputs (512 each) + 2 sets of 8,832 + the output 512
  //     (a set: u1, att, o, xm, u2, y 512 each; qkv 1536; hp, h 2048 each;
  //      r1, r2 32 B -> 64 each)
  //   backward: 7 x 512 (dxm, du2, datt, du1, dx x2, dout) + 2 x 2048 (dhp, dh)
  //     + 1536 (dqkv) + 512 (targets) + 64 (the loss)
  const batch::MemoryParts m = batch::predict_footprint(tiny(1), batch::OptKind::adamw, 64, 1000, 70);
  EXPECT_EQ(m.weights, 24576u);
  EXPECT_EQ(m.gradients, 24576u);
  EXPECT_EQ(m.optimizer, 49152u);
  EXPECT_EQ(m.activations, 1024u + 2 * 8832u + 512u);
  EXPECT_EQ(m.attention, 2000u);
  EXPECT_EQ(m.backward, 3584u + 4096u + 1536u + 512u + 64u);
  EXPECT_EQ(m.workspace, 128u);  // 70 B rounded to the granule
  EXPECT_EQ(m.transient, 0u);
  DecoderConfig ck = tiny(1);
  ck.checkpointing = true;
  EXPECT_EQ(batch::predict_footprint(ck, batch::OptKind::adamw, 64, 1000, 0).activations, 1024u + 8832u + 512u);
  EXPECT_EQ(batch::predict_footprint(tiny(1), batch::OptKind::sgd, 64, 0, 0).optimizer, 0u);
  // d_ff = 24 (not 4 x 16): W1 and W2 384 values each (24 x 16), so 7,168 B of fp32 parameters a layer;
  // hp, h, dhp and dh 768 B each (8 x 24 fp32); a set 8,832 - 2 x 2048 + 2 x 768 = 6,272
  DecoderConfig narrow = tiny(1);
  narrow.d_ff = 24;
  const batch::MemoryParts n = batch::predict_footprint(narrow, batch::OptKind::adamw, 64, 1000, 70);
  EXPECT_EQ(n.weights, 2u * 7168u);
  EXPECT_EQ(n.gradients, 2u * 7168u);
  EXPECT_EQ(n.optimizer, 4u * 7168u);
  EXPECT_EQ(n.activations, 1024u + 2 * 6272u + 512u);
  EXPECT_EQ(n.backward, 3584u + 2 * 768u + 1536u + 512u + 64u);
  // grouped-query attention, 1 K/V head of 2 (head_dim 8): Wqkv 32 x 16 (Q 16, K 8, V 8), 512 values, so
  // 2,816 values = 11,264 B a layer; qkv and dqkv 8 x 32 fp32 = 1,024 B; a set 8,832 - 1,536 + 1,024 = 8,320
  DecoderConfig gqa = tiny(1);
  gqa.kv_heads = 1;
  EXPECT_EQ(gqa.qkv_out(), 32);
  const batch::MemoryParts g = batch::predict_footprint(gqa, batch::OptKind::adamw, 64, 1000, 70);
  EXPECT_EQ(g.weights, 2u * 11264u);
  EXPECT_EQ(g.gradients, 2u * 11264u);
  EXPECT_EQ(g.optimizer, 4u * 11264u);
  EXPECT_EQ(g.activations, 1024u + 2 * 8320u + 512u);
  EXPECT_EQ(g.backward, 3584u + 4096u + 1024u + 512u + 64u);
  EXPECT_EQ(batch::step_gemms(gqa).front().n, 32);  // the QKV projection's outputs

  // and the allocator agrees, part by part, on a real step (fp32 and bf16, with and without checkpointing)
  auto dev = make_cpu_backend().open(0);
  auto ops = dev->make_train_ops();
  for (DType t : {DType::fp32, DType::bf16})
    for (bool ckpt : {false, true}) {
      DecoderConfig c = tiny(3);
      c.dtype = t;
      c.checkpointing = ckpt;
      c.layers = 3;
      c.d_ff = t == DType::bf16 ? 40 : 0;  // a width of its own: the model follows it
      c.kv_heads = ckpt ? 1 : 0;           // and K/V at 1 head of 2 (grouped-query attention)
      auto fresh = dev->make_train_ops();  // its GEMM workspace starts empty
      DecoderStep s(*dev, *fresh, c, 7, [] {});
      s.zero_grad();
      dev->synchronize(std::chrono::seconds(60));
      const std::size_t before = dev->memory_stats().in_use;
      dev->reset_peak_memory();
      s.micro_step(1.0f);
      dev->synchronize(std::chrono::seconds(60));
      // the step allocates nothing while it runs: its GEMM workspace was made up front
      EXPECT_EQ(dev->memory_stats().peak, before) << to_string(t) << (ckpt ? " checkpointed" : "");
      s.optimizer(batch::OptKind::adamw, 1e-3f, 1);
      const batch::MemoryParts got = s.measured_memory();
      const std::uint64_t per_op = got.attention / (ckpt ? 1 : 3);
      const batch::MemoryParts want =
          batch::predict_footprint(c, batch::OptKind::adamw, 64, per_op, batch::step_gemm_workspace(*fresh, c));
      EXPECT_GT(got.workspace, 0u);
      for (int i = 0; i < batch::kMemoryParts; ++i)
        EXPECT_EQ(batch::part(got, i), batch::part(want, i))
            << batch::kMemoryPartNames[i] << " " << to_string(t) << (ckpt ? " checkpointed" : "");
      EXPECT_GT(got.attention, 0u);
    }
}

}  // namespace
}  // namespace sb
