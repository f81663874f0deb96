// The collective scenario's pure parts: nccl-tests' counts and bus factors,
// the exact data check, and the mismatch grammar and schedule. The ranks'
// side is exercised under mpirun (suite mpi); here each collective's result
// is built by hand from its definition, so the checker is held to that.
#include <gtest/gtest.h>

#include <cstring>  // std::memcpy

#include "harness/comm.hpp"                    // CollCall, coll_counts, bus_factor
#include "harness/dtype.hpp"                   // float_to_bf16_bits
#include "harness/errors.hpp"                  // UsageError
#include "scenarios/collective/coll_data.hpp"      // fill_coll_input, count_coll_wrong
#include "scenarios/collective/coll_findings.hpp"  // coll_size_point
#include "scenarios/collective/coll_schedule.hpp"  // parse_mismatch, planned_calls

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
  const Point p = coll_size_point(c, 8, std::int64_t(1) << 30, times, 0, "mpi", "Open MPI 4.1");
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
  const Point one = coll_size_point(c, 1, 1024, {10.0}, 0, "mpi", "x");
  EXPECT_FALSE(one.metric("busbw"));
  const Point bad = coll_size_point(c, 2, 1024, {10.0, 12.0}, 3, "mpi", "x");
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
