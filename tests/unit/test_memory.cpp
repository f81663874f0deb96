// The memory scenario's parts on the cpu device: the largest-fit search, and
// an out-of-memory while a training step is being built (run under ASan in
// CI): a typed error naming the bytes, nothing leaked, the next smaller step
// builds and runs.
#include <chrono>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "harness/errors.hpp"
#include "harness/train_ops.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "scenarios/batch/decoder.hpp"
#include "scenarios/memory/search.hpp"

namespace sb {
namespace {

TEST(LargestFitting, FindsTheBoundaryTryingEachSizeOnce) {
  for (std::int64_t answer : {0, 1, 2, 3, 7, 8, 9, 17, 100, 1000, 4095, 4096}) {
    std::set<std::int64_t> asked;
    const auto r = memory::largest_fitting(
        [&](std::int64_t n) {
          EXPECT_TRUE(asked.insert(n).second) << "asked twice for " << n;
          EXPECT_GE(n, 1);
          EXPECT_LE(n, 4096);
          return n <= answer;
        },
        4096);
    EXPECT_EQ(r.largest, answer);
    EXPECT_EQ(r.capped, answer == 4096) << answer;
    EXPECT_LE(r.tries, 2 * 13 + 1) << answer;  // about 2 log2(max)
  }
  // a max that is not a power of two is never exceeded
  const auto r = memory::largest_fitting([](std::int64_t n) { return n <= 100; }, 5);
  EXPECT_EQ(r.largest, 5);
  EXPECT_TRUE(r.capped);
}

batch::DecoderConfig small(std::int64_t mb) {
  batch::DecoderConfig c;
  c.micro_batch = mb;
  c.seq = 32;
  c.d_model = 32;
  c.heads = 2;
  c.layers = 2;
  return c;
}

TEST(MemoryOom, AStepThatDoesNotFitIsATypedErrorAndLeavesNothingBehind) {
  auto dev = make_cpu_backend().open(0);
  dev->synchronize(std::chrono::seconds(60));
  const std::size_t before = dev->memory_stats().in_use;
  // room for micro batch 1 (its footprint measured, plus some), not for 64
  std::size_t one = 0;
  {
    auto ops = dev->make_train_ops();
    batch::DecoderStep s(*dev, *ops, small(1), 7, [] {});
    batch::train_window(s, 1, batch::OptKind::adamw, 1e-3f);
    dev->synchronize(std::chrono::seconds(60));
    one = dev->memory_stats().peak - before;
  }
  dev->synchronize(std::chrono::seconds(60));
  dev->set_memory_limit(before + 2 * one);
  for (int attempt = 0; attempt < 3; ++attempt) {
    try {
      auto ops = dev->make_train_ops();
      batch::DecoderStep s(*dev, *ops, small(64), 7, [] {});
      batch::train_window(s, 1, batch::OptKind::adamw, 1e-3f);
      dev->synchronize(std::chrono::seconds(60));
      ADD_FAILURE() << "micro batch 64 fit in " << 2 * one << " bytes";
    } catch (const OutOfMemory& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("memory limit"), std::string::npos) << what;
      EXPECT_NE(what.find("needs"), std::string::npos) << what;
    }
    dev->synchronize(std::chrono::seconds(60));  // the half-built step's tensors go in stream order
    EXPECT_EQ(dev->memory_stats().in_use, before) << "attempt " << attempt;
  }
  // and a step that fits still runs, with real gradients
  auto ops = dev->make_train_ops();
  batch::DecoderStep s(*dev, *ops, small(1), 7, [] {});
  s.zero_grad();
  s.micro_step(1.0f);
  double norm = 0;
  for (float g : s.grad(0, 2)) norm += double(g) * g;
  EXPECT_GT(norm, 0);
  dev->set_memory_limit(0);
}

}  // namespace
}  // namespace sb
