// The batch scenario's decoder step on the cpu device: gradient accumulation
// means what it says (the optimizer once per window; the window's gradient is
// the big batch's), and graphs replay the same arithmetic as eager.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "harness/random.hpp"
#include "harness/train_ops.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "scenarios/batch/decoder.hpp"

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

}  // namespace
}  // namespace sb
