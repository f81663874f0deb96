// The cpu device (oneDNN) and the correctness check every GEMM passes before
// it is timed. No timing assertions: this machine is noisy.
#include <sys/resource.h>  // getrusage(RUSAGE_THREAD)

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "fake_device.hpp"
#include "harness/errors.hpp"
#include "harness/gemm_check.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/detail/compute_stream.hpp"
#include "kernels/cpu/detail/stream_device.hpp"  // last_level_cache_bytes
#include "kernels/cpu/detail/vec_math.hpp"       // exp_v, tanh_v

namespace sb {
namespace {

std::unique_ptr<Device> cpu() { return make_cpu_backend().open(0); }

// The vectorisable exp and tanh the cpu kernels use, against double-precision libm.
TEST(VecMath, ExpWithinAFewUlpOverTheNormalRange) {
  double worst = 0;
  float at = 0;
  for (float x = -86.5f; x <= 88.7f; x += 0.000731f) {
    const double ref = std::exp(double(x));
    const double rel = std::fabs(double(cpu::exp_v(x)) - ref) / ref;
    if (rel > worst) worst = rel, at = x;
  }
  EXPECT_LT(worst, 4 * 5.96e-8) << "at x = " << at;  // 4 ulp of fp32 (2^-24 relative each)
  EXPECT_EQ(cpu::exp_v(0.0f), 1.0f);
}

TEST(VecMath, ExpEdgesAreExactZeroInfAndNaN) {
  // a masked score (the dtype's lowest minus the row max) must give exactly 0: a 1e-38 there made
  // P subnormal and fp32 causal eager attention 25x slower (subnormal GEMM operands)
  EXPECT_EQ(cpu::exp_v(-3.4028234e38f), 0.0f);
  EXPECT_EQ(cpu::exp_v(-INFINITY), 0.0f);
  EXPECT_EQ(cpu::exp_v(-87.0f), 0.0f);  // flushed: fp32's normal range ends at exp(-87.3)
  EXPECT_GT(cpu::exp_v(-86.5f), 0.0f);
  EXPECT_TRUE(std::isfinite(cpu::exp_v(88.72f)));
  EXPECT_EQ(cpu::exp_v(88.8f), INFINITY);
  EXPECT_EQ(cpu::exp_v(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(cpu::exp_v(NAN)));
}

TEST(VecMath, TanhWithinAFewUlpAndSaturates) {
  double worst = 0;
  float at = 0;
  for (float x = -12.0f; x <= 12.0f; x += 0.000377f) {
    const double ref = std::tanh(double(x));
    const double err = std::fabs(double(cpu::tanh_v(x)) - ref) / std::max(std::fabs(ref), 1e-30);
    if (err > worst) worst = err, at = x;
  }
  EXPECT_LT(worst, 4 * 5.96e-8) << "at x = " << at;
  for (float x : {1e-3f, 1e-6f, 1e-20f}) {  // small arguments keep their relative accuracy (no 1 - 2/(e+1))
    EXPECT_NEAR(cpu::tanh_v(x), std::tanh(double(x)), 1.2e-7 * x);
    EXPECT_EQ(cpu::tanh_v(-x), -cpu::tanh_v(x));
  }
  EXPECT_EQ(cpu::tanh_v(0.0f), 0.0f);
  EXPECT_EQ(cpu::tanh_v(9.5f), 1.0f);
  EXPECT_EQ(cpu::tanh_v(INFINITY), 1.0f);
  EXPECT_EQ(cpu::tanh_v(-INFINITY), -1.0f);
  EXPECT_TRUE(std::isnan(cpu::tanh_v(NAN)));
}

TEST(CpuGemm, Fp32MatchesDoubleReference) {
  auto dev = cpu();
  const GemmCheck c = check_gemm(*dev, DType::fp32, {61, 47, 256}, 1, std::chrono::seconds(60));
  EXPECT_TRUE(c.ok) << c.first_mismatches;
  EXPECT_LT(c.worst_ratio, 1.0);
  EXPECT_FALSE(c.impl.empty());
}

TEST(CpuGemm, Bf16MatchesReferenceAndRecordsItsImplementation) {
  auto dev = cpu();
  if (auto why = dev->gemm_unsupported(DType::bf16)) {
    // oneDNN 2.6 runs bf16 from avx512_core up; below that the skip names why.
    ASSERT_FALSE(test::onednn_uses_avx512(*dev))
        << "bf16 refused where oneDNN runs AVX-512 (" << dev->info().props["onednn_isa"] << "): " << *why;
    EXPECT_NE(why->find("bf16"), std::string::npos) << *why;
    GTEST_SKIP() << *why;
  }
  const GemmCheck c = check_gemm(*dev, DType::bf16, {33, 65, 128}, 2, std::chrono::seconds(60));
  EXPECT_TRUE(c.ok) << c.first_mismatches;
  // oneDNN names what ran, e.g. brg:avx512_core_amx_bf16 or brg:avx512_core_bf16.
  EXPECT_NE(c.impl.find(":"), std::string::npos) << c.impl;
  const auto& isa = dev->info().props["isa"];
  const bool amx = std::find(isa.begin(), isa.end(), "amx_bf16") != isa.end();
  if (amx) {
    EXPECT_NE(c.impl.find("amx"), std::string::npos) << c.impl;
  }
}

TEST(CpuGemm, NonSquareShapesAreLaidOutAsLinear) {
  // C[M,N] = A[M,K] W[N,K]^T with M != N != K catches any transposition.
  auto dev = cpu();
  EXPECT_TRUE(check_gemm(*dev, DType::fp32, {7, 130, 19}, 3, std::chrono::seconds(60)).ok);
}

TEST(CpuGemm, UnsupportedDtypesSayWhy) {
  auto dev = cpu();
  const auto why = dev->gemm_unsupported(DType::fp8_e4m3);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("fp8"), std::string::npos);
  EXPECT_THROW(dev->make_gemm({16, 16, 16}, DType::tf32, 1), UnsupportedError);
}

TEST(GemmCheck, CatchesALayoutBug) {
  test::FakeDevice good, bad;
  bad.broken_gemm = true;
  EXPECT_TRUE(check_gemm(good, DType::bf16, {9, 13, 32}, 4, std::chrono::seconds(5)).ok);
  const GemmCheck c = check_gemm(bad, DType::bf16, {9, 13, 32}, 4, std::chrono::seconds(5));
  EXPECT_FALSE(c.ok);
  EXPECT_GT(c.wrong, 0);
  EXPECT_NE(c.first_mismatches.find("C[0,"), std::string::npos) << c.first_mismatches;
}

TEST(CpuDevice, AllocationFailureIsTypedOutOfMemory) {
  auto dev = cpu();
  EXPECT_THROW(dev->allocate(std::size_t(1) << 60, MemKind::device), OutOfMemory);
  Buffer b = dev->allocate(4096, MemKind::host_pinned);
  EXPECT_NE(b.data(), nullptr);
}

TEST(CpuDevice, EventsAndCopiesRunInStreamOrder) {
  auto dev = cpu();
  Buffer src = dev->allocate(1 << 20, MemKind::host_pageable);
  Buffer dst = dev->allocate(1 << 20, MemKind::device);
  std::memset(src.data(), 0x5a, 1 << 20);
  std::memset(dst.data(), 0, 1 << 20);
  // The copy runs on the stream after e0: held behind a gate, nothing has
  // been copied until the gate lets go; then the events bracket the copy.
  auto gate = dev->hold_stream(std::chrono::seconds(30));
  auto e0 = dev->record();
  dev->copy_h2d(dst, src, 1 << 20);
  auto e1 = dev->record();
  EXPECT_NE(static_cast<unsigned char*>(dst.data())[12345], 0x5a);  // not yet: the stream is held
  gate->release();
  dev->synchronize(std::chrono::seconds(10));
  EXPECT_GT(dev->elapsed_ms(e0, e1), 0.0);  // a 1 MiB memcpy takes time between the two stamps
  EXPECT_EQ(static_cast<unsigned char*>(dst.data())[12345], 0x5a);
  EXPECT_THROW(dev->copy_h2d(dst, src, 2 << 20), Error);
}

// timing=hidden: nothing enqueued behind a held stream completes before the
// gate is released (the wait below is a deadline, not a measured time), and
// everything does after; a gate nobody releases expires at its deadline.
TEST(CpuDevice, HeldStreamRunsNothingUntilReleased) {
  auto dev = cpu();
  auto gate = dev->hold_stream(std::chrono::seconds(30));
  auto e = dev->record();
  EXPECT_THROW(dev->wait_event(e, std::chrono::milliseconds(50)), HangError);
  gate->release();
  dev->wait_event(e, std::chrono::seconds(30));
  dev->synchronize(std::chrono::seconds(30));
  EXPECT_FALSE(gate->expired());

  auto lapsed = dev->hold_stream(std::chrono::milliseconds(1));
  dev->synchronize(std::chrono::seconds(30));  // the gate lets go by itself
  EXPECT_TRUE(lapsed->expired());
}

// timing=cold: the flush writes twice the last-level cache (read from sysfs,
// or a 32 MiB fallback), on the stream.
TEST(CpuDevice, CacheFlushWritesTwiceTheLastLevelCache) {
  auto dev = cpu();
  const std::size_t n = dev->flush_cache();
  EXPECT_EQ(n, 2 * cpu::last_level_cache_bytes());
  EXPECT_GE(n, std::size_t(1) << 20);
  EXPECT_EQ(dev->flush_cache(), n);  // the buffer is made once
  dev->synchronize(std::chrono::seconds(30));
}

// A wait that times out while GEMMs still run (one running, more queued):
// the op's operands are freed by unwinding right after. They must not be
// returned while a GEMM may still write them (ASan would see a
// heap-use-after-free), and the queued GEMMs are dropped, so the device's
// destruction waits only for the one running.
TEST(CpuDevice, AHungWaitNeverFreesMemoryAnOpStillUses) {
  auto dev = cpu();
  {
    auto op = dev->make_gemm({1024, 1024, 1024}, DType::fp32, 1);  // tens of ms each on any CPU
    for (int i = 0; i < 50; ++i) op->enqueue();
    EXPECT_THROW(dev->synchronize(std::chrono::milliseconds(1)), HangError);
  }  // the op and its buffers go while a GEMM is running
  const auto t0 = std::chrono::steady_clock::now();
  dev.reset();  // joins the stream: the running GEMM only, not the 49 queued
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
}

// The same for attention, whose work items run the op's own members.
TEST(CpuDevice, AHungWaitNeverDestroysAnAttentionOpUnderItsWork) {
  auto dev = cpu();
  for (AttnImpl impl : {AttnImpl::naive, AttnImpl::flash}) {
    AttnShape s;
    s.batch = 1;
    s.heads = 4;
    s.seq = 1024;
    s.head_dim = 64;
    {
      auto op = dev->make_attention(s, impl, DType::fp32, 1);
      for (int i = 0; i < 20; ++i) {
        op->forward();
        op->backward();
      }
      EXPECT_THROW(dev->synchronize(std::chrono::milliseconds(1)), HangError) << to_string(impl);
    }  // destroyed after its running item ends, never under it
  }
}

TEST(ComputeStream, SynchronizeHasADeadlineAndNamesTheStuckItem) {
  // The item cannot finish before the test lets it go, so the short deadline
  // must pass first, however loaded the machine (no race on sleep lengths).
  cpu::ComputeStream cs;
  std::promise<void> started, go;
  std::shared_future<void> go_f = go.get_future().share();
  cs.enqueue("slow item", [&started, go_f] {
    started.set_value();
    go_f.wait();
  });
  ASSERT_EQ(started.get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready);
  try {
    cs.synchronize(std::chrono::milliseconds(20));
    ADD_FAILURE() << "expected a HangError";
  } catch (const HangError& e) {
    EXPECT_NE(std::string(e.what()).find("slow item"), std::string::npos) << e.what();
  }
  go.set_value();
  cs.synchronize(std::chrono::seconds(30));  // it does finish
}

TEST(ComputeStream, WorkErrorsSurfaceAtSynchronize) {
  cpu::ComputeStream cs;
  cs.enqueue("throws", [] { throw OutOfMemory("inside the stream"); });
  EXPECT_THROW(cs.synchronize(std::chrono::seconds(10)), OutOfMemory);
  cs.enqueue("fine", [] {});
  EXPECT_NO_THROW(cs.synchronize(std::chrono::seconds(10)));
}

namespace {
void spin_us(int us) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  while (std::chrono::steady_clock::now() < until) {
  }
}
long voluntary_switches() {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_nvcsw;
}
}  // namespace

TEST(ComputeStream, ABlockedSynchronizeIsWokenAtItsTargetNotOncePerItem) {
  // A host blocked in synchronize() used to be woken by every finished item
  // (2.9 us of the stream's time each, 13% of a small training step). Counted
  // as this thread's voluntary context switches, not timed: 2000 items that
  // each outlast a wake-up would give ~2000 switches; the fix gives a few.
  cpu::ComputeStream cs;
  std::promise<void> go;
  std::shared_future<void> go_f = go.get_future().share();
  cs.enqueue("gate", [go_f] { go_f.wait(); });
  constexpr int kItems = 2000;
  std::atomic<int> ran{0};
  for (int i = 0; i < kItems; ++i)
    cs.enqueue("small", [&ran] {
      spin_us(20);
      ran.fetch_add(1, std::memory_order_relaxed);
    });
  go.set_value();
  const long before = voluntary_switches();
  cs.synchronize(std::chrono::seconds(60));
  const long switches = voluntary_switches() - before;
  EXPECT_EQ(ran.load(), kItems);
  EXPECT_LT(switches, 50) << "the waiting thread was woken " << switches << " times for " << kItems << " items";
}

TEST(ComputeStream, WaitersWithDifferentTargetsEachWakeAtTheirOwn) {
  cpu::ComputeStream cs;
  std::promise<void> go;
  std::shared_future<void> go_f = go.get_future().share();
  cs.enqueue("gate", [go_f] { go_f.wait(); });
  std::uint64_t third = 0;
  for (int i = 0; i < 50; ++i) {
    const auto seq = cs.enqueue("small", [] { spin_us(100); });
    if (i == 2) third = seq;
  }
  // one waits for the third item, one for everything, one drains while more
  // work arrives: each must return (a missed wake-up is a HangError here)
  auto early = std::async(std::launch::async, [&] { cs.wait_done(third, std::chrono::seconds(60)); });
  auto all = std::async(std::launch::async, [&] { cs.synchronize(std::chrono::seconds(60)); });
  auto drained = std::async(std::launch::async, [&] { cs.drain(std::chrono::seconds(60)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let them block (not needed for correctness)
  go.set_value();
  for (int i = 0; i < 20; ++i) cs.enqueue("late", [] { spin_us(100); });
  EXPECT_NO_THROW(early.get());
  EXPECT_NO_THROW(all.get());
  drained.get();
  cs.synchronize(std::chrono::seconds(60));  // and the late ones finish too
}

TEST(CpuBackend, BadIndexIsAUsageError) { EXPECT_THROW(make_cpu_backend().open(1), UsageError); }

}  // namespace
}  // namespace sb
