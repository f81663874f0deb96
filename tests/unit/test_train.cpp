// The train scenario's parts: one model trained through decoder steps of
// several padded lengths (DecoderStep's `share`), the loader's per-sample
// cost, and the point's figures derived from a record (train::derive).
#include <chrono>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "harness/errors.hpp"
#include "harness/train_ops.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "workloads/decoder.hpp"
#include "workloads/loader.hpp"
#include "scenarios/train/train.hpp"

namespace sb {
namespace {

using batch::DecoderConfig;
using batch::DecoderStep;

DecoderConfig shape(std::int64_t seq) {
  DecoderConfig c;
  c.micro_batch = 2;
  c.seq = seq;
  c.d_model = 16;
  c.heads = 2;
  c.layers = 2;
  return c;
}

// A step at seq 8 that shares a seq-16 step's parameters computes exactly
// the gradients an owning seq-8 step of the same seed computes, into the
// owner's gradients; the owner's optimizer moves the weights both see.
TEST(TrainShare, SharedStepTrainsTheOwnersParameters) {
  auto dev = make_cpu_backend().open(0);
  auto ops = dev->make_train_ops();
  DecoderStep owner(*dev, *ops, shape(16), 7, [] {});
  DecoderStep shared(*dev, *ops, shape(8), 7, [] {}, &owner);
  DecoderStep alone(*dev, *ops, shape(8), 7, [] {});
  owner.zero_grad();
  alone.zero_grad();
  shared.micro_step(1.0f);
  alone.micro_step(1.0f);
  dev->synchronize(std::chrono::seconds(30));
  bool any_nonzero = false;
  for (int l = 0; l < 2; ++l)
    for (int w = 0; w < 4; ++w) {
      const auto a = owner.grad(l, w), b = alone.grad(l, w);
      ASSERT_EQ(a.size(), b.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(a[i], b[i]) << "layer " << l << " weight " << w << " index " << i;
        any_nonzero |= a[i] != 0.0f;
      }
      EXPECT_EQ(shared.weight(l, w), owner.weight(l, w));
    }
  EXPECT_TRUE(any_nonzero) << "the shared step produced no gradient at all";
  // the optimizer, through the shared step's views (AdamW's moments are the owner's)
  const auto before = owner.weight(1, 2);
  shared.optimizer(batch::OptKind::adamw, 1e-2f, 1);
  dev->synchronize(std::chrono::seconds(30));
  const auto after_owner = owner.weight(1, 2);
  EXPECT_NE(before, after_owner);
  EXPECT_EQ(shared.weight(1, 2), after_owner);
}

// A shorter step borrows the longest's activation and gradient buffers (the two never run at once, as a
// caching allocator reuses one step's memory for the next length's): it allocates only its attention
// op, where a set per length held the sum of them all. A step with more tokens than the one it shares
// with allocates its own.
TEST(TrainShare, AShorterStepBorrowsTheLongestsActivations) {
  auto dev = make_cpu_backend().open(0);
  auto ops = dev->make_train_ops();
  DecoderStep owner(*dev, *ops, shape(16), 7, [] {});
  dev->synchronize(std::chrono::seconds(30));
  ASSERT_GT(dev->memory_stats().in_use, 0u) << "the cpu device's ledger reads no memory in use";
  const auto& own = owner.measured_memory();
  ASSERT_GT(own.activations, 0u);
  ASSERT_GT(own.backward, 0u);
  const std::size_t before = dev->memory_stats().in_use;
  DecoderStep shorter(*dev, *ops, shape(8), 7, [] {}, &owner);
  dev->synchronize(std::chrono::seconds(30));
  const auto& m = shorter.measured_memory();
  EXPECT_EQ(m.weights + m.gradients + m.activations + m.backward, 0u);
  EXPECT_GT(m.attention, 0u);  // its attention op follows its own shape
  EXPECT_EQ(dev->memory_stats().in_use - before, m.attention + m.workspace);
  // a longer step than the owner: its own buffers
  DecoderStep longer(*dev, *ops, shape(32), 7, [] {}, &owner);
  EXPECT_GT(longer.measured_memory().activations, own.activations);
  EXPECT_GT(longer.measured_memory().backward, own.backward);
  // and every one still computes: the borrowing step's gradients are an owning step's of its shape
  DecoderStep alone(*dev, *ops, shape(8), 7, [] {});
  owner.zero_grad();
  alone.zero_grad();
  owner.micro_step(1.0f);  // the owner's own run first, through the buffers the shorter one borrows
  owner.zero_grad();
  shorter.micro_step(1.0f);
  alone.micro_step(1.0f);
  dev->synchronize(std::chrono::seconds(30));
  EXPECT_EQ(owner.grad(1, 2), alone.grad(1, 2));
}

TEST(TrainShare, OnlyTheSameModelShares) {
  auto dev = make_cpu_backend().open(0);
  auto ops = dev->make_train_ops();
  DecoderStep owner(*dev, *ops, shape(16), 7, [] {});
  DecoderConfig other = shape(8);
  other.d_model = 32;
  EXPECT_THROW(DecoderStep(*dev, *ops, other, 7, [] {}, &owner), UsageError);
  other = shape(8);
  other.layers = 3;
  EXPECT_THROW(DecoderStep(*dev, *ops, other, 7, [] {}, &owner), UsageError);
  other = shape(8);
  other.dtype = DType::bf16;
  EXPECT_THROW(DecoderStep(*dev, *ops, other, 7, [] {}, &owner), UsageError);
}

// The loader's per-sample cost function replaces decode_us: a sample of cost
// 0 is loaded with no decode work, a costly one takes its CPU time.
TEST(TrainLoader, PerSampleCostIsSpent) {
  loader::Config c;
  c.workers = 0;
  c.batch = 1;
  c.sample_bytes = 64;
  c.num_batches = 2;
  c.sample_us = [](std::int64_t s) { return s == 0 ? 0.0 : 20000.0; };  // 20 ms for sample 1
  loader::Loader L(c);
  for (int i = 0; i < 2; ++i) {
    auto b = L.next();
    ASSERT_TRUE(b);
    L.release(*b);
  }
  const auto rec = L.records();
  ASSERT_EQ(rec.size(), 2u);
  EXPECT_LT(rec[0].cpu_s, 0.005);
  EXPECT_GT(rec[1].cpu_s, 0.015);  // CPU time, not wall: a loaded machine cannot make it shorter
}

train::Record record() {
  train::Record r;
  r.wall_s = 2.0;
  r.data_wait_s = 0.5;
  r.busy_frac = 0.4;
  r.steps = 10;
  r.batches = 10;
  r.real_tokens = 3000;
  r.computed_tokens = 4000;
  r.load_cpu_s = 1.2;  // 0.12 s per batch
  r.loads = 10;
  r.workers = 0;
  return r;
}

double metric(const Point& p, const char* name) {
  const Metric* m = p.metric(name);
  EXPECT_NE(m, nullptr) << name;
  return m ? m->value : NAN;
}

TEST(TrainDerive, Figures) {
  const Point p = train::derive(record());
  EXPECT_DOUBLE_EQ(metric(p, "real_tokens_per_s"), 1500.0);
  EXPECT_DOUBLE_EQ(metric(p, "tokens_per_s"), 2000.0);
  EXPECT_DOUBLE_EQ(metric(p, "padding_pct"), 25.0);
  EXPECT_DOUBLE_EQ(metric(p, "step_ms"), 200.0);
  EXPECT_DOUBLE_EQ(metric(p, "busy_pct"), 40.0);
  EXPECT_DOUBLE_EQ(metric(p, "data_wait_pct"), 25.0);
  EXPECT_DOUBLE_EQ(metric(p, "device_ms_per_batch"), 80.0);  // 0.4 x 2 s / 10
  EXPECT_DOUBLE_EQ(metric(p, "load_ms_per_batch"), 120.0);
  // inline: train / (train + load) = 80 / 200
  EXPECT_NEAR(metric(p, "model_busy_pct"), 40.0, 1e-9);
  EXPECT_EQ(p.info["real_tokens"].get<std::int64_t>(), 3000);
  EXPECT_NE(p.info["bottleneck"].get<std::string>().find("loader"), std::string::npos);
}

// With the epoch's arithmetic: the computed rate measured, at the epoch's real share, not the timed
// batches' own (which a few batches of varied lengths make noisy); the timed batches' figures kept.
TEST(TrainDerive, RealTokensAtTheEpochsShare) {
  train::Record r = record();
  EXPECT_EQ(train::derive(r).metric("timed_real_tokens_per_s"), nullptr);  // no epoch: the timed figures are it
  r.epoch_real_tokens = 600;
  r.epoch_computed_tokens = 1000;
  const Point p = train::derive(r);
  EXPECT_DOUBLE_EQ(metric(p, "tokens_per_s"), 2000.0);
  EXPECT_DOUBLE_EQ(metric(p, "real_tokens_per_s"), 1200.0);  // 2000 x 0.6, not 3000 / 2 s
  EXPECT_DOUBLE_EQ(metric(p, "padding_pct"), 40.0);
  EXPECT_DOUBLE_EQ(metric(p, "timed_real_tokens_per_s"), 1500.0);
  EXPECT_DOUBLE_EQ(metric(p, "timed_padding_pct"), 25.0);
}

TEST(TrainDerive, WorkersOverlapTheStep) {
  train::Record r = record();
  r.workers = 2;
  r.loader_cpus = 0;  // a CPU each: 2 x 80 / 120 >= 1
  EXPECT_DOUBLE_EQ(metric(train::derive(r), "model_busy_pct"), 100.0);
  EXPECT_EQ(train::derive(r).info["bottleneck"].get<std::string>(), "device");
  r.loader_cpus = 1;  // both workers on one CPU: 80 / 120
  EXPECT_NEAR(metric(train::derive(r), "model_busy_pct"), 100.0 * 80 / 120, 1e-9);
  EXPECT_EQ(train::derive(r).info["bottleneck"].get<std::string>(), "loader");
}

TEST(TrainDerive, PatternFromTheSeries) {
  train::Record r = record();
  for (int i = 0; i < 40; ++i) r.util.push_back(i % 2 ? 1.0 : 0.0);
  EXPECT_EQ(train::derive(r).info["pattern"].get<std::string>(), "spiky");
  r.util.assign(40, 0.97);
  EXPECT_EQ(train::derive(r).info["pattern"].get<std::string>(), "healthy");
  EXPECT_EQ(train::derive(r).info["pattern_basis"].get<std::string>(), "sampled utilization");
  // one sample: no shape to read; the label comes from busy % alone, and the point says so
  r.util.assign(1, 0.1);
  EXPECT_EQ(train::derive(r).info["pattern"].get<std::string>(), "steady-low");
  EXPECT_EQ(train::derive(r).info["pattern_basis"].get<std::string>().rfind("busy %", 0), 0u);
}

}  // namespace
}  // namespace sb
