// The memory scenario's parts on the cpu device: the largest-fit search, and
// an out-of-memory while a training step is being built (run under ASan in
// CI): a typed error naming the bytes, nothing leaked, the next smaller step
// builds and runs.
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "harness/errors.hpp"
#include "harness/params.hpp"
#include "scenarios/registry.hpp"   // find_scenario, all_scenarios; Scenario, RunContext
#include "harness/train_ops.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "workloads/decoder.hpp"
#include "scenarios/memory/pool_replay.hpp"
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

// A stream-ordered pool of the test's own, to run the cuda pool's comparison on a CPU: each block is
// rounded up to 2 MiB (cudaMallocAsync maps its pool's memory in such pages), a freed block's pages are
// kept and reused (a release threshold of "never"), and a pool capped at max_bytes refuses what would
// take its pages past it. What it holds is counted, so a test can see every block went back.
class PagedPool : public StreamPool {
 public:
  static constexpr std::size_t kPage = 2u << 20;
  PagedPool(std::size_t max_bytes, int* live_pools) : max_(max_bytes), live_pools_(live_pools) { ++*live_pools_; }
  ~PagedPool() override { --*live_pools_; }
  void* malloc(std::size_t bytes) override {
    const std::size_t pages = (bytes + kPage - 1) / kPage * kPage;
    if (used_ + pages > reserved_) {
      if (max_ && used_ + pages > max_)
        throw OutOfMemory("test pool: " + std::to_string(bytes) + " bytes past its cap of " + std::to_string(max_));
      reserved_ = used_ + pages;
    }
    used_ += pages;
    reserved_high_ = std::max(reserved_high_, reserved_);
    used_high_ = std::max(used_high_, used_);
    void* p = reinterpret_cast<void*>(++next_);
    held_[p] = pages;
    return p;
  }
  void free(void* p) override {
    used_ -= held_.at(p);
    held_.erase(p);
  }
  std::size_t reserved_high() const override { return reserved_high_; }
  std::size_t used_high() const override { return used_high_; }
  std::string impl() const override { return "test pool (2 MiB pages)"; }
  std::size_t held() const { return held_.size(); }

 private:
  std::size_t max_, used_ = 0, reserved_ = 0, reserved_high_ = 0, used_high_ = 0;
  std::uintptr_t next_ = 0;
  std::map<void*, std::size_t> held_;
  int* live_pools_;
};

// A sequence of the probe's shape: a state block held throughout, then steps whose activations are
// allocated in the forward and freed in the backward, the second step's larger.
std::vector<memory::AllocOp> two_steps(std::size_t& slots) {
  using Op = memory::AllocOp;
  std::vector<Op> ops;
  slots = 0;
  auto get = [&](std::uint64_t b) {
    ops.push_back({Op::alloc, slots, b, "x"});
    return slots++;
  };
  const std::size_t state = get(5u << 20);  // 5 MiB: 3 pages
  for (int step = 0; step < 2; ++step) {
    ops.push_back({Op::step_begin, std::size_t(step)});
    const std::uint64_t unit = step == 0 ? (1u << 20) : (3u << 20);  // 1 MiB (1 page) or 3 MiB (2 pages)
    std::vector<std::size_t> acts{get(unit), get(unit), get(unit)};
    for (std::size_t a : acts) ops.push_back({Op::free, a});
    ops.push_back({Op::step_end, std::size_t(step)});
  }
  ops.push_back({Op::free, state});
  return ops;
}

// The cuda pool's comparison (memory scenario, fragmentation probe), on the test's pool: the
// unconstrained run's reserved high-water mark over the peak need is the metric; capped at what the
// caching allocator needed, a too-small cap fails at the step that asked, and every block goes back.
TEST(StreamPoolComparison, ReplaysTheStepsUnconstrainedThenCapped) {
  std::size_t slots = 0;
  const auto ops = two_steps(slots);
  // the peak need, as the caching replay measures it: the state and the second step's activations
  const std::uint64_t peak_need = (5u << 20) + 3 * (3u << 20);  // 14 MiB
  // pages at the peak: 3 (state) + 3 x 2 (step 2) = 9 pages = 18 MiB
  const std::size_t pool_peak = 9 * PagedPool::kPage;
  int live = 0;
  std::vector<std::size_t> caps;
  std::vector<std::size_t> left;  // blocks each pool still held when the replay returned
  auto make = [&](std::size_t cap) -> std::unique_ptr<StreamPool> {
    caps.push_back(cap);
    return std::make_unique<PagedPool>(cap, &live);
  };
  Point p;
  // capped at 16 MiB (as if the caching allocator had needed that): 8 pages, one short of step 2's peak
  const auto a = memory::compare_stream_pool(make, ops, slots, peak_need, 8 * PagedPool::kPage, p);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(caps, (std::vector<std::size_t>{0, 8 * PagedPool::kPage}));
  EXPECT_EQ(live, 0) << "a pool outlived its run";
  EXPECT_TRUE((*a)["ran"].get<bool>());
  EXPECT_EQ((*a)["impl"], "test pool (2 MiB pages)");
  EXPECT_EQ((*a)["reserved_high_bytes"].get<std::size_t>(), pool_peak);
  EXPECT_EQ((*a)["used_high_bytes"].get<std::size_t>(), pool_peak);
  const Metric* m = p.metric("async_pool_overhead_pct");
  ASSERT_NE(m, nullptr);
  EXPECT_NEAR(m->value, 100.0 * (18.0 / 14.0 - 1.0), 1e-9);
  EXPECT_EQ(m->direction, Direction::lower);
  const auto& at = (*a)["at_caching_needed"];
  EXPECT_FALSE(at["ran"].get<bool>());
  EXPECT_EQ(at["failed_step"].get<int>(), 1);  // step 0 fits in 8 pages, step 1's third block does not
  EXPECT_NE(at["error"].get<std::string>().find("past its cap"), std::string::npos) << at.dump();
  EXPECT_EQ(at["capacity"].get<std::size_t>(), 8 * PagedPool::kPage);

  // the replay itself frees what it held when the pool refuses, and a cap that fits runs
  PagedPool tight(8 * PagedPool::kPage, &live);
  const memory::PoolRun r = memory::replay_on_pool(tight, ops, slots);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(tight.held(), 0u) << "blocks left in the pool after the failed run";
  PagedPool roomy(9 * PagedPool::kPage, &live);
  const memory::PoolRun ok = memory::replay_on_pool(roomy, ops, slots);
  EXPECT_TRUE(ok.ok) << ok.error;
  EXPECT_EQ(ok.failed_step, -1);
  EXPECT_EQ(roomy.held(), 0u);
}

// No pool (every device but cuda): no comparison and no metric; an unconstrained pool that fails
// (a device out of memory) says where, with no overhead figure and no capped run.
TEST(StreamPoolComparison, NoPoolNoFigureAndAFailedRunSaysWhere) {
  std::size_t slots = 0;
  const auto ops = two_steps(slots);
  Point p;
  EXPECT_FALSE(memory::compare_stream_pool([](std::size_t) { return std::unique_ptr<StreamPool>(); }, ops, slots,
                                           14u << 20, 16u << 20, p)
                   .has_value());
  EXPECT_EQ(p.metric("async_pool_overhead_pct"), nullptr);
  int live = 0, made = 0;
  auto tiny = [&](std::size_t) -> std::unique_ptr<StreamPool> {
    ++made;
    return std::make_unique<PagedPool>(4 * PagedPool::kPage, &live);  // the state and a step 0 block only
  };
  const auto a = memory::compare_stream_pool(tiny, ops, slots, 14u << 20, 16u << 20, p);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(made, 1) << "a capped run after the unconstrained one failed";
  EXPECT_FALSE((*a)["ran"].get<bool>());
  EXPECT_EQ((*a)["failed_step"].get<int>(), 0);
  EXPECT_FALSE(a->contains("at_caching_needed"));
  EXPECT_EQ(p.metric("async_pool_overhead_pct"), nullptr);
  EXPECT_EQ(live, 0);
}


// A cpu device that answers like a GPU whose driver says what is free (cudaMemGetInfo): the memory
// scenario's capacity on cuda, without a GPU. Everything else goes to the cpu device.
class DriverFreeDevice : public Device {
 public:
  DriverFreeDevice(std::unique_ptr<Device> d, std::size_t free) : d_(std::move(d)), free_(free) {}
  const DeviceInfo& info() const override { return d_->info(); }
  std::optional<std::string> gemm_unsupported(DType t) const override { return d_->gemm_unsupported(t); }
  std::unique_ptr<GemmOp> make_gemm(GemmShape s, DType t, std::uint64_t seed) override {
    return d_->make_gemm(s, t, seed);
  }
  std::optional<std::string> attention_unsupported(AttnImpl i, DType t) const override {
    return d_->attention_unsupported(i, t);
  }
  std::unique_ptr<AttentionOp> make_attention(const AttnShape& s, AttnImpl i, DType t, std::uint64_t seed) override {
    return d_->make_attention(s, i, t, seed);
  }
  std::unique_ptr<TrainOps> make_train_ops() override { return d_->make_train_ops(); }
  MemoryStats memory_stats() const override {
    MemoryStats m = d_->memory_stats();
    m.driver_free = free_;  // as cudaMemGetInfo's free would read while nothing else runs
    return m;
  }
  void reset_peak_memory() override { d_->reset_peak_memory(); }
  void set_memory_limit(std::size_t bytes) override { d_->set_memory_limit(bytes); }
  std::vector<int> reserve_host_cpus(int threads) override { return d_->reserve_host_cpus(threads); }
  std::vector<int> shared_host_cpus() const override { return d_->shared_host_cpus(); }
  Buffer allocate(std::size_t bytes, MemKind kind) override { return d_->allocate(bytes, kind); }
  void copy_h2d(Buffer& dst, const Buffer& src, std::size_t bytes) override { d_->copy_h2d(dst, src, bytes); }
  EventPtr record() override { return d_->record(); }
  double elapsed_ms(const EventPtr& a, const EventPtr& b) override { return d_->elapsed_ms(a, b); }
  void synchronize(std::chrono::milliseconds t) override { d_->synchronize(t); }
  void wait_event(const EventPtr& e, std::chrono::milliseconds t) override { d_->wait_event(e, t); }
  std::unique_ptr<UtilProbe> utilization_probe() override { return d_->utilization_probe(); }
  std::unique_ptr<StreamPool> make_stream_pool(std::size_t max_bytes) override {
    return pools ? pools(max_bytes) : nullptr;
  }
  std::function<std::unique_ptr<StreamPool>(std::size_t)> pools;  // cudaMallocAsync's, as a test pool

 private:
  std::unique_ptr<Device> d_;
  std::size_t free_;
};

// A pool whose attribute reads fail, as cudaMemPoolGetAttribute's error does (cuda_device's attr throws).
class UnreadablePool : public PagedPool {
 public:
  using PagedPool::PagedPool;
  std::size_t reserved_high() const override { throw Error(ErrorKind::runtime, "cudaMemPoolGetAttribute: not supported"); }
};

// The pool comparison is a side measurement: a pool that fails with an error other than out-of-memory is
// recorded in info.fragmentation.async_pool and as a warning, and the point keeps its other figures.
TEST(MemoryCapacity, AFailingPoolComparisonLeavesThePointStanding) {
  const Scenario* sc = find_scenario("memory");
  ASSERT_NE(sc, nullptr);
  DriverFreeDevice dev(make_cpu_backend().open(0), 30'000'000);
  int live = 0;
  dev.pools = [&](std::size_t cap) -> std::unique_ptr<StreamPool> { return std::make_unique<UnreadablePool>(cap, &live); };
  RunContext ctx{dev};
  const Sweep sw = expand_sweep(sc->params,
                                {"mem_limit_gb=0", "checkpointing=none", "frag_steps=6", "verify=1", "trials=1",
                                 "max_micro_batch=64"},
                                SweepProfile{});
  const Point p = sc->start(ctx)->run_point(sw.points.at(0));
  EXPECT_EQ(p.status, Status::ok);
  ASSERT_NE(p.metric("largest_micro_batch"), nullptr);
  ASSERT_NE(p.metric("frag_overhead_pct"), nullptr);
  EXPECT_EQ(p.metric("async_pool_overhead_pct"), nullptr);
  const auto& a = p.info.at("fragmentation").at("async_pool");
  EXPECT_FALSE(a.at("ran").get<bool>());
  EXPECT_NE(a.at("error").get<std::string>().find("not supported"), std::string::npos) << a;
  EXPECT_NE(p.info.value("warning", std::string()).find("pool comparison failed"), std::string::npos) << p.info;
  EXPECT_EQ(live, 0) << "a pool outlived the point";
}

// The capacity the memory scenario works in where the driver tells what is free: that plus what the
// device holds (not the card's total, which also counts the context and other processes), a
// mem_limit_gb above it lowered to it, one below it kept; info.limit_from says which.
TEST(MemoryCapacity, TheDriversFreeMemoryBoundsTheLimit) {
  const Scenario* sc = find_scenario("memory");
  ASSERT_NE(sc, nullptr);
  const std::size_t free = 30'000'000;
  auto point = [&](const std::string& limit) {
    DriverFreeDevice dev(make_cpu_backend().open(0), free);
    RunContext ctx{dev};
    const Sweep sw = expand_sweep(sc->params,
                                  {"mem_limit_gb=" + limit, "checkpointing=none", "frag_steps=0", "verify=1",
                                   "trials=1", "max_micro_batch=64"},
                                  SweepProfile{});
    EXPECT_EQ(sw.points.size(), 1u);
    return sc->start(ctx)->run_point(sw.points.at(0));
  };
  const Point drv = point("0");
  EXPECT_EQ(drv.info.value("limit_bytes", std::uint64_t(0)), drv.info.value("held_before_bytes", std::uint64_t(0)) + free);
  EXPECT_NE(drv.info.value("limit_from", std::string()).find("cudaMemGetInfo"), std::string::npos) << drv.info;
  ASSERT_NE(drv.metric("largest_micro_batch"), nullptr);
  EXPECT_EQ(drv.metric("largest_micro_batch")->value, drv.metric("predicted_largest_micro_batch")->value);
  const Point over = point("1");  // 1 GB asked, 30 MB free: the driver's answer
  EXPECT_EQ(over.info.value("limit_bytes", std::uint64_t(0)), over.info.value("held_before_bytes", std::uint64_t(0)) + free);
  EXPECT_NE(over.info.value("limit_from", std::string()).find("under mem_limit_gb=1"), std::string::npos) << over.info;
  EXPECT_EQ(over.metric("largest_micro_batch")->value, drv.metric("largest_micro_batch")->value);
  const Point under = point("0.02");  // below what is free: the user's limit
  EXPECT_EQ(under.info.value("limit_bytes", std::uint64_t(0)), 20'000'000u);
  EXPECT_EQ(under.info.value("limit_from", std::string()), "mem_limit_gb");
  EXPECT_LT(under.metric("largest_micro_batch")->value, drv.metric("largest_micro_batch")->value);
}

}  // namespace
}  // namespace sb
