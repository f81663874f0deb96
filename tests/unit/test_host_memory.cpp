// The host-memory budget: bounds read from /proc and the memory cgroups (v1
// and v2, ancestors included, inside a cgroup namespace too), and the
// cumulative reservation that refuses with OutOfMemory. Each test builds a
// fake /proc/self and /sys/fs/cgroup tree; the real-cgroup test is
// tests/scenario/test_memory_cgroup.py.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <unistd.h>

#include "harness/errors.hpp"
#include "harness/host_load.hpp"
#include "harness/host_memory.hpp"

namespace sb {
namespace {

namespace fs = std::filesystem;
constexpr std::uint64_t MiB = std::uint64_t(1) << 20;

class FakeHost : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sb_host_memory_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "proc_self");
    fs::create_directories(dir_ / "cg");
    paths_.proc_self = (dir_ / "proc_self").string();
    paths_.meminfo = (dir_ / "meminfo").string();
    paths_.cgroup_root = (dir_ / "cg").string();
    paths_.use_rlimit = false;
    write("meminfo", "MemTotal: 25165824 kB\nMemFree: 1000 kB\nMemAvailable: 20971520 kB\n");  // 20 GiB
    write("proc_self/statm", "1000 100 0 0 0 0 0\n");
  }
  void TearDown() override {
    set_host_memory_paths_for_testing(nullptr);
    fs::remove_all(dir_);
  }
  void write(const fs::path& rel, const std::string& text) {
    fs::create_directories((dir_ / rel).parent_path());
    std::ofstream(dir_ / rel) << text;
  }
  // A v1 memory cgroup at cg/memory/<rel>.
  void v1(const std::string& rel, std::uint64_t limit, std::uint64_t usage, std::uint64_t inactive = 0) {
    const fs::path d = fs::path("cg/memory") / rel;
    write(d / "memory.limit_in_bytes", std::to_string(limit) + "\n");
    write(d / "memory.usage_in_bytes", std::to_string(usage) + "\n");
    write(d / "memory.stat", "cache 0\nrss 0\ntotal_inactive_file " + std::to_string(inactive) + "\n");
  }
  fs::path dir_;
  HostMemoryPaths paths_;
};

TEST_F(FakeHost, MemAvailableAloneIsTheBoundWithoutACgroup) {
  write("proc_self/cgroup", "0::/\n");
  const HostMemory m = read_host_memory(paths_);
  ASSERT_TRUE(m.mem_available);
  EXPECT_EQ(*m.mem_available, 20 * 1024 * MiB);
  ASSERT_EQ(m.bounds.size(), 1u);
  EXPECT_EQ(m.rss, 100u * std::uint64_t(::sysconf(_SC_PAGESIZE)));
}

TEST_F(FakeHost, CgroupV1LimitLessItsUnreclaimableUsage) {
  write("proc_self/cgroup", "5:cpu:/\n4:memory:/job/step\n0::/\n");
  fs::create_directories(dir_ / "cg/memory");
  v1("job/step", 1024 * MiB, 400 * MiB, 100 * MiB);  // 300 MiB really used
  const auto t = read_host_memory(paths_).tightest();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->available, 724 * MiB);
  EXPECT_NE(t->what.find("cgroup v1"), std::string::npos) << t->what;
  EXPECT_NE(t->what.find("job/step"), std::string::npos) << t->what;
}

TEST_F(FakeHost, AParentCgroupsLimitHoldsForItsChildren) {
  write("proc_self/cgroup", "4:memory:/job/step\n");
  v1("job/step", std::uint64_t(9223372036854771712ULL), 100 * MiB);  // the child: no limit
  v1("job", 512 * MiB, 200 * MiB);
  v1("", std::uint64_t(9223372036854771712ULL), 4096 * MiB);  // the root: no limit
  const auto t = read_host_memory(paths_).tightest();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->available, 312 * MiB);
  EXPECT_NE(t->what.find("/job:"), std::string::npos) << t->what;
}

TEST_F(FakeHost, CgroupV2MaxAndCurrent) {
  write("proc_self/cgroup", "0::/user.slice/job\n");
  write("cg/cgroup.controllers", "cpu memory pids\n");
  write("cg/user.slice/job/memory.max", "2147483648\n");
  write("cg/user.slice/job/memory.current", "1073741824\n");
  write("cg/user.slice/job/memory.stat", "anon 1\ninactive_file 268435456\n");
  write("cg/user.slice/memory.max", "max\n");
  write("cg/user.slice/memory.current", "1\n");
  const auto t = read_host_memory(paths_).tightest();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->available, 1280 * MiB);  // 2 GiB - (1 GiB - 256 MiB)
  EXPECT_NE(t->what.find("cgroup v2"), std::string::npos) << t->what;
}

TEST_F(FakeHost, InsideACgroupNamespaceTheMountIsOurCgroup) {
  // /proc/self/cgroup names a path the namespace's mount does not show.
  write("proc_self/cgroup", "0::/../../outside/job\n");
  write("cg/cgroup.controllers", "memory\n");
  write("cg/memory.max", "1073741824\n");
  write("cg/memory.current", "0\n");
  const auto t = read_host_memory(paths_).tightest();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->available, 1024 * MiB);
}

TEST_F(FakeHost, TouchedMeansAnonymousMemoryNotMappedFiles) {
  // A mapped dataset file grows the total RSS, not RssAnon: its pages are no
  // reserved heap being touched, and must not hide untouched reservations.
  write("proc_self/cgroup", "4:memory:/job\n");
  v1("job", 1024 * MiB, 0);
  write("proc_self/status", "Name:\tx\nRssAnon:\t   1000 kB\nRssFile:\t 10 kB\n");
  set_host_memory_paths_for_testing(&paths_);
  EXPECT_EQ(read_host_memory(paths_).rss, 1000u * 1024);
  HostReservation a = reserve_host_memory(600 * MiB, "first");
  const std::uint64_t page = std::uint64_t(::sysconf(_SC_PAGESIZE));
  write("proc_self/statm", "1000 " + std::to_string(100 + 600 * MiB / page) + " 0 0 0 0 0\n");  // a 600 MiB mapping
  EXPECT_THROW(reserve_host_memory(400 * MiB, "second"), OutOfMemory);  // 600 untouched + 400 > 960
}

TEST_F(FakeHost, MissingFilesGiveNoBoundAndNoError) {
  fs::remove(dir_ / "meminfo");
  fs::remove(dir_ / "proc_self/statm");
  const HostMemory m = read_host_memory(paths_);
  EXPECT_FALSE(m.mem_available);
  EXPECT_TRUE(m.bounds.empty());
  set_host_memory_paths_for_testing(&paths_);
  EXPECT_NO_THROW(reserve_host_memory(std::uint64_t(1) << 50, "anything"));
}

TEST_F(FakeHost, ReservationsAreCumulativeAndReturnedOnDestruction) {
  write("proc_self/cgroup", "4:memory:/job\n");
  v1("job", 1024 * MiB, 0);
  set_host_memory_paths_for_testing(&paths_);
  ASSERT_EQ(host_memory_reserved(), 0u);
  {
    // 1 GiB less the 64 MiB kept back: 960 MiB usable.
    HostReservation a = reserve_host_memory(400 * MiB, "first");
    HostReservation b = reserve_host_memory(400 * MiB, "second");
    EXPECT_EQ(host_memory_reserved(), 800 * MiB);
    // Each fits alone; the third does not fit with the first two.
    try {
      reserve_host_memory(400 * MiB, "the third block");
      FAIL() << "a third 400 MiB fitted into 960 MiB";
    } catch (const OutOfMemory& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("the third block"), std::string::npos) << w;
      EXPECT_NE(w.find("needs 400.0 MiB"), std::string::npos) << w;
      EXPECT_NE(w.find("800.0 MiB of it is reserved"), std::string::npos) << w;
      EXPECT_NE(w.find("cgroup v1"), std::string::npos) << w;
    }
    EXPECT_EQ(host_memory_reserved(), 800 * MiB);  // a refusal reserves nothing
    HostReservation moved = std::move(a);
    EXPECT_EQ(host_memory_reserved(), 800 * MiB);
  }
  EXPECT_EQ(host_memory_reserved(), 0u);
  EXPECT_NO_THROW(reserve_host_memory(900 * MiB, "after release"));
  EXPECT_THROW(check_host_memory(961 * MiB, "over the usable"), OutOfMemory);
}

TEST_F(FakeHost, TouchedReservationsAreNotCountedTwice) {
  // Once the reserved pages are touched they show in the cgroup's usage; the
  // growth of the resident set says so, and the budget does not count them again.
  write("proc_self/cgroup", "4:memory:/job\n");
  v1("job", 1024 * MiB, 0);
  set_host_memory_paths_for_testing(&paths_);
  HostReservation a = reserve_host_memory(600 * MiB, "first");
  const std::uint64_t page = std::uint64_t(::sysconf(_SC_PAGESIZE));
  write("proc_self/statm", "1000 " + std::to_string(100 + 600 * MiB / page) + " 0 0 0 0 0\n");
  v1("job", 1024 * MiB, 600 * MiB);
  EXPECT_NO_THROW(reserve_host_memory(300 * MiB, "second, after the first was touched"));
  EXPECT_THROW(reserve_host_memory(400 * MiB, "too much"), OutOfMemory);
}

TEST(HostMemory, TheRealMachineHasABound) {
  // On Linux MemAvailable is always there.
  const HostMemory m = read_host_memory();
  ASSERT_TRUE(m.mem_available);
  EXPECT_GT(*m.mem_available, 0u);
  EXPECT_GT(m.rss, 0u);
  EXPECT_THROW(reserve_host_memory(std::uint64_t(1) << 60, "an exabyte"), OutOfMemory);
}

}  // namespace
}  // namespace sb

// ---- MemoryLedger: the device-memory account every device shares ----
#include "harness/memory_ledger.hpp"

namespace sb {
namespace {

TEST(MemoryLedger, LimitPeakAndReservations) {
  auto l = std::make_shared<MemoryLedger>("dev:0");
  l->set_limit(100 * MiB);
  {
    MemoryReservation a = l->reserve(60 * MiB, "A");
    EXPECT_EQ(l->in_use(), 60 * MiB);
    try {
      l->reserve(50 * MiB, "operand B");
      FAIL() << "50 MiB fitted beside 60 MiB under a 100 MiB limit";
    } catch (const OutOfMemory& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("dev:0: out of memory: operand B needs 50.0 MiB"), std::string::npos) << w;
      EXPECT_NE(w.find("memory limit"), std::string::npos) << w;
      EXPECT_NE(w.find("60.0 MiB already in use"), std::string::npos) << w;
    }
    MemoryReservation b = l->reserve(40 * MiB, "B");
    EXPECT_EQ(l->stats("x").peak, 100 * MiB);
  }
  EXPECT_EQ(l->in_use(), 0u);
  EXPECT_EQ(l->stats("x").peak, 100 * MiB);
  l->reset_peak();
  EXPECT_EQ(l->stats("x").peak, 0u);
  l->set_limit(0);
  EXPECT_NO_THROW(l->reserve(std::uint64_t(1) << 50, "no limit: anything"));
}

TEST(MemoryLedger, CapacityHoldsAndALowerLimitShrinksIt) {
  auto l = std::make_shared<MemoryLedger>("sim:x", 80 * MiB, "the simulated X's memory (80 MiB)");
  try {
    l->check(81 * MiB, "a GEMM's operands");
    FAIL() << "over capacity";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("the simulated X's memory"), std::string::npos) << e.what();
  }
  l->set_limit(200 * MiB);  // a limit above the capacity does not raise it
  EXPECT_THROW(l->check(81 * MiB, "x"), OutOfMemory);
  EXPECT_EQ(l->stats("s").limit, 80 * MiB);
  l->set_limit(10 * MiB);
  EXPECT_THROW(l->check(11 * MiB, "x"), OutOfMemory);
  EXPECT_EQ(l->stats("s").limit, 10 * MiB);
  // A reservation that outlives its ledger's owner still settles the account.
  MemoryReservation r = l->reserve(5 * MiB, "kept");
  std::weak_ptr<MemoryLedger> w = l;
  l.reset();
  ASSERT_FALSE(w.expired());  // the reservation keeps its ledger
  EXPECT_EQ(w.lock()->in_use(), 5 * MiB);
  r = MemoryReservation();  // releasing settles the account, then lets the ledger go
  EXPECT_TRUE(w.expired());
}

// What else ran while a point was measured (harness/host_load): /proc/stat's cpu line and
// /proc/self/stat, as Linux writes them, read by hand.
TEST(HostLoad, ReadsProcStatAndItsOwnTicksAfterAnOddCommandName) {
  // user nice system idle iowait irq softirq steal guest guest_nice
  const std::string stat = "cpu  1000 10 200 5000 40 0 30 300 7 0";
  // comm may hold spaces and parentheses: fields count from the last ')'; utime 111, stime 22
  const std::string self = "4242 (my (odd) name) R 1 4242 4242 0 -1 4194304 100 0 0 0 111 22 0 0 20 0 3 0 5 6 7";
  const CpuTicks t = parse_cpu_ticks(stat, self, 1.5);
  ASSERT_TRUE(t.ok);
  EXPECT_EQ(t.busy, 1000u + 10 + 200 + 0 + 30);
  EXPECT_EQ(t.total, 1000u + 10 + 200 + 5000 + 40 + 0 + 30 + 300);  // guest is inside user already
  EXPECT_EQ(t.steal, 300u);
  EXPECT_EQ(t.self, 133u);
  EXPECT_FALSE(parse_cpu_ticks("intr 1 2 3", self, 0).ok);
  EXPECT_FALSE(parse_cpu_ticks(stat, "4242 no parenthesis", 0).ok);
  EXPECT_TRUE(read_cpu_ticks().ok) << "/proc/stat and /proc/self/stat on Linux";
}

TEST(HostLoad, OtherProcessesAreAShareOfTheTicksNotStolenAndStealOfAll) {
  CpuTicks a, b;
  a.ok = b.ok = true;
  a.total = 1000, b.total = 1200;  // 200 ticks: 1 s of 2 CPUs
  a.busy = 500, b.busy = 640;      // 140 busy ticks, 60 of them ours: 80 others'
  a.self = 100, b.self = 160;
  a.steal = 10, b.steal = 40;      // 30 stolen
  a.wall_s = 2, b.wall_s = 3;
  const auto h = host_load(a, b);
  ASSERT_TRUE(h);
  EXPECT_DOUBLE_EQ(h->other_pct, 100.0 * 80 / 170);  // of the 170 ticks not stolen
  EXPECT_DOUBLE_EQ(h->steal_pct, 15);
  EXPECT_DOUBLE_EQ(h->window_s, 1);
  b.self = 250;  // our per-thread count ran ahead of the machine's: never negative
  EXPECT_DOUBLE_EQ(host_load(a, b)->other_pct, 0);
  b.total = 1010;  // 10 ticks say nothing
  EXPECT_FALSE(host_load(a, b));
  b.total = 1200;
  b.ok = false;
  EXPECT_FALSE(host_load(a, b));
}

}  // namespace
}  // namespace sb
