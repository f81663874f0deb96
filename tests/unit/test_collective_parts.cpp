// The collective scenario's pure parts: nccl-tests' counts and bus factors,
// the exact data check, and the mismatch grammar and schedule. The ranks'
// side is exercised under mpirun (suite mpi); here each collective's result
// is built by hand from its definition, so the checker is held to that.
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <cstdio>      // std::fflush
#include <cstdlib>     // std::_Exit
#include <cstring>     // std::memcpy
#include <filesystem>  // std::filesystem: the fake job's dump_dir
#include <list>        // std::list: the fake communicator's buffers stay put
#include <map>         // std::map: the fake job's parameters
#include <thread>      // std::this_thread::sleep_for

#include <fmt/format.h>  // fmt::format

#include "harness/comm.hpp"                    // CollCall, coll_counts, bus_factor
#include "harness/dtype.hpp"                   // float_to_bf16_bits
#include "harness/errors.hpp"                  // UsageError
#include "scenarios/collective/coll_data.hpp"      // fill_coll_input, count_coll_wrong
#include "scenarios/collective/coll_findings.hpp"  // coll_size_point
#include "scenarios/collective/coll_schedule.hpp"  // parse_mismatch, planned_calls
#include "harness/exit_codes.hpp"                  // kExitHang, kExitCollectiveError
#include "harness/params.hpp"                      // expand_sweep
#include "harness/result.hpp"                      // write_file_atomic, read_json_file
#include "harness/scenario.hpp"                    // Scenario, RunContext, RankServices
#include "fake_device.hpp"                         // test::FakeDevice

namespace sb {
namespace {

TEST(CommMath, BusFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor(CollOp::all_reduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(bus_factor(CollOp::all_gather, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(bus_factor(CollOp::reduce_scatter, 3), 2.0 / 3);
  EXPECT_DOUBLE_EQ(bus_factor(CollOp::all_to_all, 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_factor(CollOp::broadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(CollOp::reduce, 8), 1.0);
  for (CollOp op : all_coll_ops()) EXPECT_EQ(bus_factor(op, 1), 0.0) << to_string(op);  // one rank has no bus
}

TEST(CommMath, CountsFollowTheLargerBuffer) {
  const CollCall ag{CollOp::all_gather, 12, CommDtype::fp32};
  EXPECT_EQ(coll_counts(ag, 3).send, 4);
  EXPECT_EQ(coll_counts(ag, 3).recv, 12);
  const CollCall rs{CollOp::reduce_scatter, 12, CommDtype::fp32};
  EXPECT_EQ(coll_counts(rs, 3).send, 12);
  EXPECT_EQ(coll_counts(rs, 3).recv, 4);
  EXPECT_EQ(round_count(CollOp::all_gather, 13, 3), 12);
  EXPECT_EQ(round_count(CollOp::all_to_all, 2, 3), 3);
  EXPECT_EQ(round_count(CollOp::all_reduce, 13, 3), 13);
  for (CollOp op : all_coll_ops()) EXPECT_EQ(parse_coll_op(to_string(op)), op);
  EXPECT_FALSE(parse_coll_op("allreduce"));
}

// What rank `me` receives, from the definitions (not from the checker).
std::vector<double> reference(const CollCall& c, int n, int me, std::uint64_t seed) {
  const std::int64_t per = c.count / n;
  std::vector<double> out;
  auto in = [&](int r, std::int64_t i) { return coll_input_value(seed, r, i); };
  switch (c.op) {
    case CollOp::all_reduce:
    case CollOp::reduce:
      for (std::int64_t i = 0; i < c.count; ++i) {
        double s = 0;
        for (int r = 0; r < n; ++r) s += in(r, i);
        out.push_back(s);
      }
      break;
    case CollOp::broadcast:
      for (std::int64_t i = 0; i < c.count; ++i) out.push_back(in(c.root, i));
      break;
    case CollOp::all_gather:
      for (int r = 0; r < n; ++r)
        for (std::int64_t j = 0; j < per; ++j) out.push_back(in(r, j));
      break;
    case CollOp::reduce_scatter:
      for (std::int64_t j = 0; j < per; ++j) {
        double s = 0;
        for (int r = 0; r < n; ++r) s += in(r, me * per + j);
        out.push_back(s);
      }
      break;
    case CollOp::all_to_all:
      for (int r = 0; r < n; ++r)
        for (std::int64_t j = 0; j < per; ++j) out.push_back(in(r, me * per + j));
      break;
  }
  return out;
}

std::vector<unsigned char> encode(const std::vector<double>& v, CommDtype d) {
  std::vector<unsigned char> b(v.size() * dtype_size(d));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (d == CommDtype::fp32) {
      const float f = static_cast<float>(v[i]);
      std::memcpy(b.data() + i * 4, &f, 4);
    } else if (d == CommDtype::fp64) {
      std::memcpy(b.data() + i * 8, &v[i], 8);
    } else {
      const std::uint16_t h = float_to_bf16_bits(static_cast<float>(v[i]));
      std::memcpy(b.data() + i * 2, &h, 2);
    }
  }
  return b;
}

TEST(CollData, InputsAreSmallIntegersThatDifferByRankAndIndex) {
  int distinct = 0;
  for (std::int64_t i = 0; i < 256; ++i) {
    const double a = coll_input_value(7, 0, i), b = coll_input_value(7, 1, i);
    EXPECT_GE(a, -4);
    EXPECT_LE(a, 3);
    EXPECT_EQ(a, static_cast<int>(a));
    distinct += a != b;
  }
  EXPECT_GT(distinct, 150);  // ranks send different data, so a mix-up is visible
  EXPECT_NE(call_seed(1, 5, 0), call_seed(1, 5, 1));
  EXPECT_NE(call_seed(1, 5, 0), call_seed(1, 6, 0));
}

TEST(CollData, TheCheckerAcceptsExactlyTheDefinedResult) {
  for (int n : {2, 3, 8})
    for (CollOp op : all_coll_ops())
      for (CommDtype d : {CommDtype::fp32, CommDtype::fp64, CommDtype::bf16}) {
        CollCall c{op, round_count(op, 48, n), d, op == CollOp::broadcast ? n - 1 : 0};
        for (int me = 0; me < n; ++me) {
          const auto want = encode(reference(c, n, me, 99), d);
          const std::int64_t wrong = count_coll_wrong(c, n, me, 99, want);
          EXPECT_EQ(wrong, 0) << to_string(op) << " " << to_string(d) << " n=" << n << " rank " << me;
          if (op == CollOp::reduce && me != c.root) continue;  // non-roots receive nothing to check
          auto bad = want;
          bad[dtype_size(d)] ^= 0x40;  // one element changed
          EXPECT_EQ(count_coll_wrong(c, n, me, 99, bad), 1) << to_string(op) << " " << to_string(d);
          // Another call's data (a library pairing the wrong iterations) is wrong nearly everywhere.
          EXPECT_GT(count_coll_wrong(c, n, me, 98, want), static_cast<std::int64_t>(want.size() / dtype_size(d) / 2));
        }
      }
}

TEST(CollData, SumsStayExactInBf16OnSixtyFourRanks) {
  const int n = 64;
  CollCall c{CollOp::all_reduce, 512, CommDtype::bf16};
  EXPECT_EQ(count_coll_wrong(c, n, 0, 3, encode(reference(c, n, 0, 3), CommDtype::bf16)), 0);
}

TEST(CollData, InputsFillTheSendCount) {
  std::vector<unsigned char> buf;
  fill_coll_input(CollCall{CollOp::all_gather, 30, CommDtype::fp64}, 3, 1, 5, buf);
  EXPECT_EQ(buf.size(), 10u * 8);
  double v;
  std::memcpy(&v, buf.data() + 8 * 4, 8);
  EXPECT_EQ(v, coll_input_value(5, 1, 4));
}

TEST(Mismatch, GrammarAndErrors) {
  EXPECT_FALSE(parse_mismatch("none"));
  const auto m = parse_mismatch("order@12:3");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->kind, MismatchKind::order);
  EXPECT_EQ(m->step, 12);
  EXPECT_EQ(m->rank, 3);
  for (const char* bad : {"skip", "skip@", "skip@1", "skip@x:1", "skip@1:y", "skip@-1:0", "hop@1:0", "skip@1:0x"})
    EXPECT_THROW(parse_mismatch(bad), UsageError) << bad;
}

TEST(Mismatch, OnlyTheTargetRankAndStepChange) {
  const auto healthy = step_calls(CollOp::all_reduce, 1024, CommDtype::fp32, 3);
  ASSERT_EQ(healthy.size(), 2u);
  EXPECT_EQ(healthy[1].call.op, CollOp::broadcast);
  EXPECT_EQ(healthy[1].call.count, 256);
  const auto m = parse_mismatch("skip@4:2");
  EXPECT_EQ(planned_calls(healthy, m, 4, 1, 3, 0).size(), 2u);  // another rank
  EXPECT_EQ(planned_calls(healthy, m, 3, 2, 3, 0).size(), 2u);  // another step
  const auto skipped = planned_calls(healthy, m, 4, 2, 3, 0);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].call_index, 1);

  const auto order = planned_calls(healthy, parse_mismatch("order@0:0"), 0, 0, 3, 0);
  EXPECT_EQ(order[0].call_index, 1);
  EXPECT_EQ(order[1].call_index, 0);
  EXPECT_EQ(planned_calls(healthy, parse_mismatch("count@0:0"), 0, 0, 3, 0)[0].call.count, 512);
  EXPECT_EQ(planned_calls(healthy, parse_mismatch("dtype@0:0"), 0, 0, 3, 0)[0].call.dtype, CommDtype::fp64);
  EXPECT_EQ(planned_calls(healthy, parse_mismatch("root@0:0"), 0, 0, 3, 0)[1].call.root, 1);
  const auto late = planned_calls(healthy, parse_mismatch("straggler@0:0"), 0, 0, 3, 250);
  EXPECT_EQ(late[0].sleep_ms, 250);
  EXPECT_EQ(late[0].call, healthy[0].call);
  // A rooted main op gets an all-reduce beside it, so root and order still have two ops.
  EXPECT_EQ(step_calls(CollOp::broadcast, 64, CommDtype::fp32, 2)[1].call.op, CollOp::all_reduce);
}

}  // namespace
}  // namespace sb

namespace sb {
namespace {

// A size row from recorded per-rank times, by nccl-tests' formulas
// (PERFORMANCE.md there: algbw = S/t, busbw = algbw * 2(n-1)/n for all-reduce).
TEST(CollSizePoint, AlgbwAndBusbwFromRecordedTimes) {
  CollCall c;
  c.op = CollOp::all_reduce;
  c.dtype = CommDtype::fp32;
  c.count = (std::int64_t(1) << 30) / 4;
  const std::vector<double> times = {1000, 1100, 900, 1000, 1050, 950, 1000, 1000};  // mean 1000 us
  const Point p = coll_size_point(c, 8, std::int64_t(1) << 30, times, 0, CollPath{"mpi", "Open MPI 4.1", true});
  const double algbw = double(std::int64_t(1) << 30) / 1e-3 / 1e9;  // 1.0737 GB/s
  EXPECT_DOUBLE_EQ(p.metric("time_us")->value, 1000);
  EXPECT_NEAR(p.metric("algbw")->value, algbw, 1e-12);
  EXPECT_NEAR(p.metric("busbw")->value, algbw * 2 * 7 / 8, 1e-12);
  EXPECT_EQ(p.status, Status::ok);
  EXPECT_EQ(p.params["ranks"], 8);
  EXPECT_EQ(p.info["time_us_per_rank"].size(), 8u);
}

TEST(CollSizePoint, OneRankHasNoBusbwAndWrongDataIsAnError) {
  CollCall c;
  c.op = CollOp::all_gather;
  c.dtype = CommDtype::fp32;
  c.count = 256;
  const Point one = coll_size_point(c, 1, 1024, {10.0}, 0, CollPath{"mpi", "x", true});
  EXPECT_FALSE(one.metric("busbw"));
  const Point bad = coll_size_point(c, 2, 1024, {10.0, 12.0}, 3, CollPath{"mpi", "x", false});
  EXPECT_EQ(bad.status, Status::error);
  EXPECT_NE(bad.reason.find("3 wrong element(s)"), std::string::npos) << bad.reason;
  EXPECT_NEAR(bad.metric("busbw")->value, bad.metric("algbw")->value * 0.5, 1e-12);  // (n-1)/n
}

}  // namespace
}  // namespace sb

namespace sb {
namespace {

TEST(StepLoopPoint, WhatTheLoopAndTheDumpsRecordedDecideTheStatus) {
  // Other ranks: figures only.
  const Point other = step_loop_point(10, 123.0, 0, -1, nullptr);
  EXPECT_EQ(other.status, Status::ok);
  EXPECT_DOUBLE_EQ(other.metric("loop_ms")->value, 123.0);
  EXPECT_FALSE(other.info.contains("analysis"));

  HangReport healthy;
  healthy.summary = "every rank issued the same 30 calls";
  healthy.stall_rank = 1;
  healthy.stall_seq = 7;
  healthy.stall_lost_ms = 250;
  const Point slow = step_loop_point(10, 400.0, 0, -1, &healthy);
  EXPECT_EQ(slow.status, Status::ok);
  EXPECT_DOUBLE_EQ(slow.metric("stall_lost_ms")->value, 250);
  EXPECT_NE(slow.metric("stall_lost_ms")->note.find("rank 1 at seq 7"), std::string::npos);

  HangReport diverged;
  diverged.kind = DivergenceKind::count;
  diverged.summary = "seq 10 (step 5 call 0): rank 1 all_reduce count=2048";
  const Point silent = step_loop_point(10, 400.0, 96, 5, &diverged);
  EXPECT_EQ(silent.status, Status::error);
  EXPECT_NE(silent.reason.find("no hang, but seq 10"), std::string::npos) << silent.reason;
  EXPECT_NE(silent.reason.find("96 wrong element(s)"), std::string::npos) << silent.reason;

  const Point wrong = step_loop_point(10, 400.0, 8, 3, &healthy);
  EXPECT_EQ(wrong.status, Status::error);
  EXPECT_NE(wrong.reason.find("from step 3 on"), std::string::npos) << wrong.reason;
}

}  // namespace
}  // namespace sb

// The sweep's two modes through the scenario itself, on one rank with a fake
// communicator (a memcpy is a one-rank all-reduce): which calls each mode
// makes, what each row records, and that a blocking call that never returns
// is still caught by the watchdog thread alone, the calling thread stuck
// inside the call (no triggered() or park() on its side).
namespace sb {
extern const Scenario collective_scenario;
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// One process; abort ends it with the code, as MPI_Abort ends the job.
class OneRankGroup final : public ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string launcher() const override { return "test"; }
  std::string host() const override { return "localhost"; }
  std::string library() const override { return "fake"; }
  void barrier(Deadline) override {}
  std::vector<double> allgather(double v, Deadline) override { return {v}; }
  std::vector<std::int64_t> allgather(std::int64_t v, Deadline) override { return {v}; }
  std::string broadcast(const std::string& b, int, Deadline) override { return b; }
  std::vector<std::string> gather(const std::string& b, int, Deadline) override { return {b}; }
  [[noreturn]] void abort(int code) noexcept override {
    std::fflush(stderr);
    std::_Exit(code);
  }
};

struct FakeCommStats {
  int started = 0, blocking = 0;
  int hang_at = -1;        // the blocking call (0-based) that never returns
  int fail_at = -1;        // the blocking call that the "library" refuses
};

// "mpi" on one rank with blocking calls; abort() does nothing, as MPI's.
class OneRankComm final : public Communicator {
 public:
  explicit OneRankComm(FakeCommStats& st) : st_(st) {}
  std::string backend() const override { return "mpi"; }
  std::string device() const override { return "host"; }
  std::string library() const override { return "fake MPI"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  bool queues_in_order() const override { return false; }
  void* alloc(std::size_t bytes) override { return bufs_.emplace_back(bytes + 64).data(); }
  void upload(void* dst, const void* host, std::size_t n) override { std::memcpy(dst, host, n); }
  void download(void* host, const void* src, std::size_t n) override { std::memcpy(host, src, n); }
  void start(const CollCall& c, const void* send, void* recv) override {
    ++st_.started;
    copy(c, send, recv);
  }
  Progress poll() override { return Progress::done; }
  bool supports_blocking() const override { return true; }
  void run_blocking(const CollCall& c, const void* send, void* recv) override {
    const int k = st_.blocking++;
    if (k == st_.fail_at) throw Error(ErrorKind::runtime, "MPI collective failed: MPI_ERR_TRUNCATE (MPI_Allreduce)");
    if (k == st_.hang_at)
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // a peer that never comes
    copy(c, send, recv);
  }
  void abort() noexcept override {}

 private:
  static void copy(const CollCall& c, const void* send, void* recv) {
    std::memcpy(recv, send, static_cast<std::size_t>(coll_counts(c, 1).recv) * dtype_size(c.dtype));
  }
  FakeCommStats& st_;
  std::list<std::vector<unsigned char>> bufs_;
};

struct OneRankJob {
  test::FakeDevice dev;
  OneRankGroup group;
  FakeCommStats stats;
  RankServices services;
  RunContext ctx{dev};
  fs::path dir;
  explicit OneRankJob(const std::string& name)
      : dir(fs::temp_directory_path() / fmt::format("sb-coll-{}-{}", name, ::getpid())) {
    fs::remove_all(dir);
    services.group = &group;
    services.open_comm = [this](const std::string&) { return std::make_unique<OneRankComm>(stats); };
    // What the CLI does when the watchdog ends the job: the hang's row, written first.
    services.write_result_now = [this](Result& r) { write_file_atomic((dir / "result.json").string(), to_json(r).dump()); };
    ctx.ranks = &services;
  }
  ~OneRankJob() { fs::remove_all(dir); }
  // 2 warm-up and 3 timed calls at 1 KiB and 4 KiB, unless params say otherwise.
  std::vector<Point> run(const std::map<std::string, std::string>& params) {
    std::map<std::string, std::string> p = {{"backend", "mpi"}, {"min_bytes", "1024"}, {"max_bytes", "4096"},
                                            {"iters", "3"},       {"warmup", "2"},      {"timeout_s", "0.3"},
                                            {"dump_dir", dir.string()}};
    for (const auto& [k, v] : params) p[k] = v;
    std::vector<std::string> all;
    for (const auto& [k, v] : p) all.push_back(k + "=" + v);
    const Sweep sw = expand_sweep(collective_scenario.params, all, SweepProfile{});
    return collective_scenario.start(ctx)->run_points(sw.points.at(0));
  }
};

TEST(CollectiveModes, BlockingRunsTheBlockingCallsAndRecordsIt) {
  OneRankJob job("blocking");
  const auto rows = job.run({{"mode", "blocking"}});
  ASSERT_EQ(rows.size(), 2u);  // 1 KiB, 4 KiB
  EXPECT_EQ(job.stats.blocking, 2 * (2 + 3));
  EXPECT_EQ(job.stats.started, 0);
  for (const Point& p : rows) {
    EXPECT_EQ(p.status, Status::ok) << p.reason;
    EXPECT_EQ(p.metric("wrong")->value, 0);
    EXPECT_EQ(p.info["mode"], "blocking");
    EXPECT_EQ(p.info["calls"], "MPI_Allreduce");
  }
}

TEST(CollectiveModes, NonblockingStartsAndPollsAndTheFingerprintCheckStaysNonblocking) {
  OneRankJob job("nonblocking");
  const auto rows = job.run({{"mode", "nonblocking"}});
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(job.stats.blocking, 0);
  EXPECT_EQ(job.stats.started, 2 * (2 + 3));
  EXPECT_EQ(rows[0].info["mode"], "nonblocking");
  EXPECT_EQ(rows[0].info["calls"], "MPI_Iallreduce + MPI_Test");

  // check=fingerprint in blocking mode: each checked call blocking, its check started and polled.
  OneRankJob fp("fingerprint");
  const auto checked = fp.run({{"mode", "blocking"}, {"check", "fingerprint"}, {"max_bytes", "1024"}});
  ASSERT_EQ(checked.size(), 1u);
  EXPECT_EQ(checked[0].status, Status::ok) << checked[0].reason;
  EXPECT_EQ(fp.stats.blocking, 2 + 3);
  EXPECT_EQ(fp.stats.started, 2 + 3);
}

TEST(CollectiveModes, CallFamilies) {
  EXPECT_EQ(coll_call_family("mpi", CollOp::reduce_scatter, true), "MPI_Reduce_scatter_block");
  EXPECT_EQ(coll_call_family("mpi", CollOp::broadcast, false), "MPI_Ibcast + MPI_Test");
  EXPECT_EQ(coll_call_family("nccl", CollOp::all_reduce, false), "ncclAllReduce on a stream");
}

// The hung call is the 2nd timed one (blocking call 3 of 2 warm-up + 3): the
// watchdog dumps the ring with it started and not completed, writes the
// hang's result row, and ends the process with exit 4.
TEST(CollectiveModesDeathTest, ABlockingCallThatNeverReturnsIsCaughtByTheWatchdog) {
  OneRankJob job("hang");
  job.stats.hang_at = 3;
  EXPECT_EXIT(job.run({{"mode", "blocking"}, {"max_bytes", "1024"}}), ::testing::ExitedWithCode(kExitHang),
              "no collective completed for .* main thread: 2 warm-up and 3 timed calls of all_reduce count=256 "
              "fp32 sum \\(MPI_Allreduce\\)");
  const json dump = read_json_file((job.dir / "rank-0.json").string());
  const json& last = dump["entries"].back();
  EXPECT_EQ(last["seq"], 3);
  EXPECT_EQ(last["state"], "started");
  EXPECT_EQ(dump["last_completed_seq"], 2);
  const json result = read_json_file((job.dir / "result.json").string());
  EXPECT_EQ(result["points"][0]["status"], "hang");
  EXPECT_EQ(result["points"][0]["params"]["mode"], "blocking");
}

// A blocking call the library refuses: the call is marked failed and the job
// ends with exit 5 (as a polled call's error does).
TEST(CollectiveModesDeathTest, ABlockingCallTheLibraryRefusesEndsTheJobWithItsError) {
  OneRankJob job("fail");
  job.stats.fail_at = 1;
  EXPECT_EXIT(job.run({{"mode", "blocking"}, {"max_bytes", "1024"}}), ::testing::ExitedWithCode(kExitCollectiveError),
              "collective seq 1 failed in the library: MPI collective failed: MPI_ERR_TRUNCATE");
  const json dump = read_json_file((job.dir / "rank-0.json").string());
  EXPECT_EQ(dump["entries"][1]["state"], "failed");
}

}  // namespace
}  // namespace sb
