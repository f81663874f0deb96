// The flight recorder and `analyze-hang`. Each case drives one FlightRecorder
// per rank as a run would (issue, start, complete, or hang where the library
// would), dumps them to JSON text, reads them back and analyses them, so the
// recorder, the dump format and the analysis are tested together.
#include <gtest/gtest.h>

#include <algorithm>   // std::find, std::swap
#include <chrono>      // std::chrono::milliseconds
#include <filesystem>  // temp dump directories
#include <fstream>     // std::ofstream
#include <memory>      // std::unique_ptr
#include <thread>      // std::this_thread::sleep_for, std::thread

#include <unistd.h>  // getpid

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"                    // UsageError
#include "readers/flight_recorder.hpp"  // FlightRecorder
#include "diagnose/hang/hang_analysis.hpp"    // analyze_dumps

namespace sb {
namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

const CollCall kAllReduce{CollOp::all_reduce, 1024, CommDtype::fp32, 0, ReduceOp::sum};
const CollCall kBroadcast{CollOp::broadcast, 256, CommDtype::fp32, 0, ReduceOp::sum};
const std::string kAllReduceText = "all_reduce count=1024 fp32 sum";
const std::string kBroadcastText = "broadcast count=256 fp32 root=0";

struct Issued {
  int step = -1, call_index = -1;
  CollCall call;
};

// The training program every rank should run: each step an all-reduce of the
// gradients, then a broadcast. Call #i of the list is seq i.
std::vector<Issued> program(int steps) {
  std::vector<Issued> p;
  for (int s = 0; s < steps; ++s) {
    p.push_back({s, 0, kAllReduce});
    p.push_back({s, 1, kBroadcast});
  }
  return p;
}

std::size_t index_of(const std::vector<Issued>& p, int step, int call) {
  for (std::size_t i = 0; i < p.size(); ++i)
    if (p[i].step == step && p[i].call_index == call) return i;
  ADD_FAILURE() << "no step " << step << " call " << call;
  return 0;
}

struct Job {
  int nranks = 2;
  int steps = 8;
  std::vector<std::vector<Issued>> programs;  // by rank; filled from `program` by make_job
  bool async = false;           // NCCL: a step's calls are queued before waiting on them
  bool silent_pairing = false;  // the library pairs mismatched calls and completes them
  int stop_rank = -1;           // a straggler that never issues its call #stop_at
  std::size_t stop_at = 0;
  int late_rank = -1;  // a straggler that issues its call #late_at late_ms late
  std::size_t late_at = 0;
  int late_ms = 0;
  std::int64_t never_completes = -1;  // a seq the library never finishes, on every rank
  std::size_t capacity = 64;
  std::string run_id = "run-a";
};

Job make_job(int nranks, int steps = 8) {
  Job j;
  j.nranks = nranks;
  j.steps = steps;
  j.programs.assign(static_cast<std::size_t>(nranks), program(steps));
  return j;
}

using Recorders = std::vector<std::unique_ptr<FlightRecorder>>;

// Runs the job the way the collective scenario would: each rank issues its
// calls (a whole step at a time when async), and a seq completes only once
// every rank issued it and the calls match (or the library pairs them
// silently, leaving wrong data). The first seq that cannot complete is the hang.
Recorders run(const Job& job) {
  Recorders recs;
  for (int r = 0; r < job.nranks; ++r) recs.push_back(std::make_unique<FlightRecorder>(job.capacity));
  std::vector<std::size_t> next(job.programs.size(), 0);
  auto issue_upto = [&](int r, std::size_t s) {
    const auto& p = job.programs[r];
    if (s >= p.size()) return;
    const bool stops = r == job.stop_rank;
    if (stops && s >= job.stop_at) {
      recs[r]->set_where(fmt::format("sleeping before step {} (straggler)", p[job.stop_at].step));
      return;
    }
    std::size_t upto = s;
    while (job.async && upto + 1 < p.size() && p[upto + 1].step == p[s].step && !(stops && upto + 1 >= job.stop_at))
      ++upto;
    for (; next[r] <= upto; ++next[r]) {
      const Issued& c = p[next[r]];
      const std::int64_t seq = recs[r]->enqueue(c.call, c.step, c.call_index);
      EXPECT_EQ(seq, static_cast<std::int64_t>(next[r]));
      recs[r]->started(seq);
      recs[r]->set_where(fmt::format("step {} call {}: {}", c.step, c.call_index, to_string(c.call.op)));
    }
  };
  for (std::size_t s = 0;; ++s) {
    for (int r = 0; r < job.nranks; ++r)
      if (r != job.late_rank || s != job.late_at) issue_upto(r, s);
    if (job.late_rank >= 0 && s == job.late_at) {
      std::this_thread::sleep_for(std::chrono::milliseconds(job.late_ms));
      issue_upto(job.late_rank, s);
    }
    bool everyone = true, match = true;
    for (int r = 0; r < job.nranks; ++r) {
      everyone = everyone && next[r] > s;
      if (everyone) match = match && job.programs[r][s].call == job.programs[0][s].call;
    }
    if (!everyone || (!match && !job.silent_pairing) || static_cast<std::int64_t>(s) == job.never_completes)
      break;
    for (int r = 0; r < job.nranks; ++r) {
      recs[r]->completed(static_cast<std::int64_t>(s));
      recs[r]->set_wrong(static_cast<std::int64_t>(s), match ? 0 : job.programs[r][s].call.count);
    }
  }
  return recs;
}

DumpHeader header_of(const Job& job, int rank) {
  DumpHeader h;
  h.run_id = job.run_id;
  h.rank = rank;
  h.size = job.nranks;
  h.local_rank = rank;
  h.host = "node0";
  h.pid = 1000 + rank;
  h.backend = "mpi";
  h.device = "host";
  h.timeout_s = 30;
  return h;
}

// Dumps every rank but those in `absent`, through JSON text, as the watchdog
// writes them and analyze-hang reads them.
std::vector<RankDump> dumps_of(const Recorders& recs, const Job& job, const std::vector<int>& absent = {}) {
  std::vector<RankDump> out;
  for (int r = 0; r < job.nranks; ++r) {
    if (std::find(absent.begin(), absent.end(), r) != absent.end()) continue;
    const std::string text = recs[r]->dump(header_of(job, r), "watchdog: no progress for 30 s").dump(2);
    out.push_back(rank_dump_from_json(json::parse(text)));
  }
  return out;
}

HangReport analyze(const Job& job, const std::vector<int>& absent = {}) {
  Recorders recs = run(job);
  return analyze_dumps(dumps_of(recs, job, absent));
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ---- the recorder ----

TEST(FlightRecorder, RecordsStatesTimesAndProgress) {
  FlightRecorder fr(8);
  EXPECT_EQ(fr.last_enqueued(), -1);
  EXPECT_EQ(fr.last_completed(), -1);
  EXPECT_FALSE(fr.in_flight());
  EXPECT_EQ(fr.where(), "starting");
  const auto made = fr.last_progress();

  const std::int64_t before = now_us();
  EXPECT_EQ(fr.enqueue(kAllReduce, 0, 0), 0);
  EXPECT_EQ(fr.enqueue(kBroadcast, 0, 1), 1);
  EXPECT_TRUE(fr.in_flight());
  fr.started(0);
  fr.completed(0);
  fr.set_wrong(0, 0);
  EXPECT_TRUE(fr.last_progress() >= made);
  EXPECT_EQ(fr.last_completed(), 0);
  EXPECT_TRUE(fr.in_flight());  // seq 1 is still enqueued
  fr.failed(1, "fingerprint mismatch: rank 1 issued broadcast");
  EXPECT_FALSE(fr.in_flight());
  EXPECT_EQ(fr.last_completed(), 0);  // a failed call is no progress
  fr.set_where("step 1 call 0: all_reduce");

  const auto es = fr.entries();
  ASSERT_EQ(es.size(), 2u);
  EXPECT_EQ(es[0].seq, 0);
  EXPECT_EQ(es[0].state, CallState::completed);
  EXPECT_GE(es[0].t_enqueue_us, before);
  EXPECT_GE(es[0].t_start_us, es[0].t_enqueue_us);
  EXPECT_GE(es[0].t_complete_us, es[0].t_start_us);
  EXPECT_EQ(es[0].wrong, 0);
  EXPECT_EQ(es[1].state, CallState::failed);
  EXPECT_EQ(es[1].t_start_us, 0);
  EXPECT_GT(es[1].t_complete_us, 0);
  EXPECT_EQ(es[1].wrong, -1);
  EXPECT_EQ(es[1].error, "fingerprint mismatch: rank 1 issued broadcast");
  EXPECT_EQ(es[1].call, kBroadcast);
  EXPECT_EQ(fr.where(), "step 1 call 0: all_reduce");
}

TEST(FlightRecorder, DumpHasTheDocumentedKeysInOrder) {
  FlightRecorder fr(4);
  fr.enqueue(kBroadcast, 3, 1);
  Job job = make_job(2);
  const json j = fr.dump(header_of(job, 1), "end of run");
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"format", "version", "run_id", "rank", "size", "local_rank", "host",
                                            "pid", "backend", "device", "reason", "where", "time_us", "timeout_s",
                                            "capacity", "dropped", "last_enqueued_seq", "last_completed_seq",
                                            "entries"}));
  EXPECT_EQ(j["format"], "stallbench-flight-recorder");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["rank"], 1);
  EXPECT_EQ(j["reason"], "end of run");
  EXPECT_EQ(j["capacity"], 4);
  EXPECT_EQ(j["dropped"], 0);
  EXPECT_EQ(j["last_enqueued_seq"], 0);
  EXPECT_EQ(j["last_completed_seq"], -1);
  const json& e = j["entries"][0];
  std::vector<std::string> ekeys;
  for (auto it = e.begin(); it != e.end(); ++it) ekeys.push_back(it.key());
  EXPECT_EQ(ekeys, (std::vector<std::string>{"seq", "step", "call", "op", "count", "dtype", "root", "reduce",
                                             "state", "t_enqueue_us", "t_start_us", "t_complete_us", "wrong",
                                             "error"}));
  EXPECT_EQ(e["op"], "broadcast");
  EXPECT_EQ(e["count"], 256);
  EXPECT_EQ(e["dtype"], "fp32");
  EXPECT_EQ(e["step"], 3);
  EXPECT_EQ(e["call"], 1);
  EXPECT_EQ(e["state"], "enqueued");
}

TEST(FlightRecorder, EntryJsonRoundTrips) {
  FlightEntry e;
  e.seq = 41;
  e.step = 20;
  e.call_index = 1;
  e.call = {CollOp::reduce, 4096, CommDtype::bf16, 3, ReduceOp::max};
  e.state = CallState::failed;
  e.t_enqueue_us = 1700000000000001;
  e.t_start_us = 1700000000000002;
  e.t_complete_us = 1700000000000003;
  e.wrong = 17;
  e.error = "MPI_ERR_TRUNCATE";
  const FlightEntry back = flight_entry_from_json(json::parse(to_json(e).dump()));
  EXPECT_EQ(back.seq, e.seq);
  EXPECT_EQ(back.step, e.step);
  EXPECT_EQ(back.call_index, e.call_index);
  EXPECT_EQ(back.call, e.call);
  EXPECT_EQ(back.state, e.state);
  EXPECT_EQ(back.t_enqueue_us, e.t_enqueue_us);
  EXPECT_EQ(back.t_start_us, e.t_start_us);
  EXPECT_EQ(back.t_complete_us, e.t_complete_us);
  EXPECT_EQ(back.wrong, e.wrong);
  EXPECT_EQ(back.error, e.error);

  json bad = to_json(e);
  bad.erase("count");
  try {
    flight_entry_from_json(bad);
    FAIL() << "no error for a missing field";
  } catch (const UsageError& err) {
    EXPECT_TRUE(contains(err.what(), "count")) << err.what();
  }
  bad = to_json(e);
  bad["dtype"] = "fp8";
  EXPECT_THROW(flight_entry_from_json(bad), UsageError);
}

TEST(FlightRecorder, RingOverwritesTheOldest) {
  EXPECT_THROW(FlightRecorder(0), UsageError);
  FlightRecorder fr(3);
  for (int i = 0; i < 5; ++i) fr.enqueue(kAllReduce, i, 0);
  fr.completed(0);  // overwritten already: progress still counts, no entry to update
  fr.completed(4);
  const auto es = fr.entries();
  ASSERT_EQ(es.size(), 3u);
  EXPECT_EQ(es[0].seq, 2);
  EXPECT_EQ(es[2].seq, 4);
  EXPECT_EQ(es[2].state, CallState::completed);
  EXPECT_EQ(fr.last_completed(), 4);
  const json j = fr.dump(header_of(make_job(1), 0), "test");
  EXPECT_EQ(j["dropped"], 2);
  EXPECT_EQ(j["entries"].size(), 3u);
  EXPECT_EQ(j["last_enqueued_seq"], 4);
}

TEST(FlightRecorder, DumpsConsistentlyWhileRecording) {
  FlightRecorder fr(16);
  std::thread main_thread([&] {
    for (int i = 0; i < 20000; ++i) {
      const auto s = fr.enqueue(kAllReduce, i / 2, i % 2);
      fr.started(s);
      fr.completed(s);
    }
  });
  const DumpHeader h = header_of(make_job(1), 0);
  for (int k = 0; k < 200; ++k) {
    const RankDump d = rank_dump_from_json(fr.dump(h, "watchdog"));
    if (d.entries.empty()) continue;
    // The seqs held are contiguous and end at the last enqueued one.
    EXPECT_EQ(d.entries.back().seq, d.last_enqueued_seq);
    EXPECT_EQ(d.entries.front().seq, d.dropped);
    EXPECT_EQ(d.entries.back().seq - d.entries.front().seq + 1, static_cast<std::int64_t>(d.entries.size()));
    EXPECT_LE(d.last_completed_seq, d.last_enqueued_seq);
  }
  main_thread.join();
  EXPECT_EQ(fr.last_completed(), 19999);
}

// ---- the analysis, on 2 and 3 ranks ----

class Analysis : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(Ranks, Analysis, ::testing::Values(2, 3));

// Every rank's call seq started at the same synthetic instant (1 ms apart
// per seq): no scheduling noise (TSan, a loaded machine) can look like a stall.
std::vector<RankDump> with_lockstep_times(std::vector<RankDump> dumps) {
  for (auto& d : dumps)
    for (auto& e : d.entries) {
      e.t_enqueue_us = e.t_start_us = 1'000'000 + e.seq * 1000;
      if (e.t_complete_us) e.t_complete_us = e.t_start_us + 500;
    }
  return dumps;
}

TEST_P(Analysis, HealthyRunHasNoDivergence) {
  const Job job = make_job(GetParam());
  const HangReport r = analyze_dumps(with_lockstep_times(dumps_of(run(job), job)));
  EXPECT_EQ(r.kind, DivergenceKind::none);
  EXPECT_TRUE(r.culprits.empty());
  EXPECT_EQ(r.seq, -1);
  EXPECT_EQ(r.size, GetParam());
  EXPECT_TRUE(r.ranks_missing.empty());
  EXPECT_TRUE(r.wrong_data_from.empty());
  EXPECT_EQ(r.last_completed, std::vector<std::int64_t>(GetParam(), 15));
  EXPECT_EQ(r.stall_lost_ms, 0.0);
  EXPECT_TRUE(contains(r.summary, "no divergence: every rank issued the same 16 calls")) << r.summary;
  EXPECT_TRUE(contains(r.summary, "no significant stall")) << r.summary;
}

TEST_P(Analysis, SkippedCallIsMissingWithPatternSkip) {
  Job job = make_job(GetParam());
  auto& p1 = job.programs[1];
  p1.erase(p1.begin() + index_of(p1, 5, 0));
  const HangReport r = analyze(job);
  EXPECT_EQ(r.kind, DivergenceKind::missing);
  EXPECT_EQ(r.pattern, "skip");
  EXPECT_EQ(r.seq, 10);
  EXPECT_EQ(r.step, 5);
  EXPECT_EQ(r.call_index, 0);
  EXPECT_EQ(r.culprits, std::vector<int>{1});
  EXPECT_EQ(r.expected, kAllReduceText);
  EXPECT_EQ(r.per_rank_call[0], "step 5 call 0: " + kAllReduceText);
  EXPECT_EQ(r.per_rank_call[1], "step 5 call 1: " + kBroadcastText);
  EXPECT_TRUE(contains(r.summary, "first divergence at seq 10 (step 5, call 0), kind missing, pattern skip: rank 1 "
                                  "skipped " + kAllReduceText + " (its seq 10 is step 5 call 1: " +
                                  kBroadcastText + ")"))
      << r.summary;
}

TEST_P(Analysis, SwappedCallsAreOpWithPatternOrder) {
  Job job = make_job(GetParam());
  job.async = true;  // the rank queues both calls of the step, as on an NCCL stream
  auto& p1 = job.programs[1];
  std::swap(p1[index_of(p1, 5, 0)], p1[index_of(p1, 5, 1)]);
  const HangReport r = analyze(job);
  EXPECT_EQ(r.kind, DivergenceKind::op);
  EXPECT_EQ(r.pattern, "order");
  EXPECT_EQ(r.seq, 10);
  EXPECT_EQ(r.step, 5);
  EXPECT_EQ(r.call_index, 0);
  EXPECT_EQ(r.culprits, std::vector<int>{1});
  EXPECT_EQ(r.last_enqueued[1], 11);
  EXPECT_TRUE(contains(r.summary, "rank 1 issued step 5 call 1: " + kBroadcastText + " before " + kAllReduceText +
                                      " (step 5 call 0): calls swapped"))
      << r.summary;
}

TEST_P(Analysis, WrongCountIsCount) {
  Job job = make_job(GetParam());
  job.programs[1][index_of(job.programs[1], 5, 0)].call.count = 512;
  const HangReport r = analyze(job);
  EXPECT_EQ(r.kind, DivergenceKind::count);
  EXPECT_EQ(r.pattern, "");
  EXPECT_EQ(r.seq, 10);
  EXPECT_EQ(r.step, 5);
  EXPECT_EQ(r.culprits, std::vector<int>{1});
  EXPECT_EQ(r.expected, kAllReduceText);
  EXPECT_TRUE(contains(r.summary, "kind count: rank 1 issued step 5 call 0: all_reduce count=512 fp32 sum, "
                                  "expected " + kAllReduceText))
      << r.summary;
}

TEST_P(Analysis, WrongDtypeIsDtype) {
  Job job = make_job(GetParam());
  job.programs[1][index_of(job.programs[1], 5, 0)].call.dtype = CommDtype::fp64;
  const HangReport r = analyze(job);
  EXPECT_EQ(r.kind, DivergenceKind::dtype);
  EXPECT_EQ(r.seq, 10);
  EXPECT_EQ(r.culprits, std::vector<int>{1});
  EXPECT_EQ(r.per_rank_call[1], "step 5 call 0: all_reduce count=1024 fp64 sum");
}

TEST_P(Analysis, WrongRootIsRoot) {
  Job job = make_job(GetParam());
  job.programs[1][index_of(job.programs[1], 5, 1)].call.root = 1;
  const HangReport r = analyze(job);
  EXPECT_EQ(r.kind, DivergenceKind::root);
  EXPECT_EQ(r.seq, 11);
  EXPECT_EQ(r.step, 5);
  EXPECT_EQ(r.call_index, 1);
  EXPECT_EQ(r.culprits, std::vector<int>{1});
  EXPECT_EQ(r.expected, kBroadcastText);
}

TEST_P(Analysis, StragglerThatNeverArrivesIsMissing) {
  Job job = make_job(GetParam());
  job.stop_rank = GetParam() - 1;
  job.stop_at = 10;
  const HangReport r = analyze(job);
  const int late = GetParam() - 1;
  EXPECT_EQ(r.kind, DivergenceKind::missing);
  EXPECT_EQ(r.pattern, "");
  EXPECT_EQ(r.seq, 10);
  EXPECT_EQ(r.step, 5);
  EXPECT_EQ(r.call_index, 0);
  EXPECT_EQ(r.culprits, std::vector<int>{late});
  EXPECT_EQ(r.per_rank_call[late], "-");
  EXPECT_EQ(r.last_enqueued[late], 9);
  EXPECT_EQ(r.where[late], "sleeping before step 5 (straggler)");
  EXPECT_TRUE(contains(r.summary, fmt::format("rank {} never issued {} (its last enqueued seq is 9; where: "
                                              "\"sleeping before step 5 (straggler)\")",
                                              late, kAllReduceText)))
      << r.summary;
}

TEST_P(Analysis, LateStragglerIsAStallNotADivergence) {
  Job job = make_job(GetParam());
  job.late_rank = 1;
  job.late_at = 10;
  job.late_ms = 500;
  const HangReport r = analyze(job);
  EXPECT_EQ(r.kind, DivergenceKind::none);
  EXPECT_TRUE(r.culprits.empty());
  EXPECT_EQ(r.stall_seq, 10);
  EXPECT_EQ(r.stall_rank, 1);
  EXPECT_GE(r.stall_lost_ms, 490.0);
  EXPECT_LT(r.stall_lost_ms, 1500.0);
  EXPECT_TRUE(contains(r.summary, "slowest arrival: rank 1 at seq 10 (step 5 call 0)")) << r.summary;
}

TEST_P(Analysis, CulpritCanBeRankZero) {
  Job job = make_job(GetParam());
  auto& p0 = job.programs[0];
  p0.erase(p0.begin() + index_of(p0, 5, 0));
  const HangReport r = analyze(job);
  EXPECT_EQ(r.kind, DivergenceKind::missing);
  EXPECT_EQ(r.pattern, "skip");
  EXPECT_EQ(r.culprits, std::vector<int>{0});
  EXPECT_TRUE(contains(r.summary, "rank 0 skipped")) << r.summary;

  Job count = make_job(GetParam());
  count.programs[0][index_of(count.programs[0], 3, 0)].call.count = 2048;
  const HangReport c = analyze(count);
  EXPECT_EQ(c.kind, DivergenceKind::count);
  EXPECT_EQ(c.seq, 6);
  EXPECT_EQ(c.culprits, std::vector<int>{0});
}

TEST_P(Analysis, RingOverflowKeepsAlignment) {
  Job job = make_job(GetParam(), 14);
  job.capacity = 6;
  auto& p1 = job.programs[1];
  p1.erase(p1.begin() + index_of(p1, 10, 0));
  Recorders recs = run(job);
  const auto dumps = dumps_of(recs, job);
  EXPECT_GT(dumps[0].dropped, 0);
  EXPECT_EQ(dumps[0].entries.size(), 6u);
  EXPECT_EQ(dumps[0].dropped, dumps[0].entries.front().seq);
  const HangReport r = analyze_dumps(dumps);
  EXPECT_EQ(r.kind, DivergenceKind::missing);
  EXPECT_EQ(r.pattern, "skip");
  EXPECT_EQ(r.seq, 20);
  EXPECT_EQ(r.step, 10);
  EXPECT_EQ(r.call_index, 0);
  EXPECT_EQ(r.culprits, std::vector<int>{1});
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_TRUE(contains(r.warnings[0], "common window starts at seq 15")) << r.warnings[0];
}

TEST_P(Analysis, HangInsideTheLibraryWithMatchedCalls) {
  Job job = make_job(GetParam());
  job.never_completes = 10;
  const HangReport r = analyze(job);
  EXPECT_EQ(r.kind, DivergenceKind::none);
  EXPECT_TRUE(r.culprits.empty());
  EXPECT_EQ(r.last_completed[0], 9);
  EXPECT_EQ(r.last_enqueued[0], 10);
  EXPECT_TRUE(contains(r.summary, "seq 10 (step 5 call 0: " + kAllReduceText + ") never completed"))
      << r.summary;
  EXPECT_TRUE(contains(r.summary, "hung inside the library with matched calls (not a mismatch)")) << r.summary;
}

TEST_P(Analysis, SilentMispairingLeavesWrongDataAndTheFirstDivergence) {
  // Open MPI pairs a skipped all-reduce with the next broadcast and goes on:
  // the job hangs only at the end, one call short. Alignment by seq still
  // names the skip, and the data check says the pairing was wrong.
  Job job = make_job(GetParam());
  job.silent_pairing = true;
  auto& p1 = job.programs[1];
  p1.erase(p1.begin() + index_of(p1, 5, 0));
  const HangReport r = analyze(job);
  EXPECT_EQ(r.last_completed[0], 14);  // it hung at the very end, on seq 15
  EXPECT_EQ(r.kind, DivergenceKind::missing);
  EXPECT_EQ(r.pattern, "skip");
  EXPECT_EQ(r.seq, 10);
  EXPECT_EQ(r.culprits, std::vector<int>{1});
  ASSERT_EQ(r.wrong_data_from.size(), static_cast<std::size_t>(GetParam()));
  for (int k = 0; k < GetParam(); ++k) EXPECT_EQ(r.wrong_data_from[k], (std::pair<int, std::int64_t>{k, 10}));
  EXPECT_TRUE(contains(r.summary, "wrong data (rank 0 from seq 10")) << r.summary;
}

// ---- the analysis, special cases ----

TEST(HangAnalysis, TwoRanksWithoutAPrefixCannotTell) {
  Job job = make_job(2);
  job.programs[1][0].call.count = 512;  // seq 0: nothing agreed before it
  const HangReport r = analyze(job);
  EXPECT_EQ(r.kind, DivergenceKind::count);
  EXPECT_EQ(r.seq, 0);
  EXPECT_EQ(r.culprits, (std::vector<int>{0, 1}));
  EXPECT_EQ(r.expected, "");
  EXPECT_TRUE(contains(r.summary, "cannot tell which side is wrong")) << r.summary;

  // Three ranks without a prefix: the majority decides.
  Job three = make_job(3);
  three.programs[2][0].call.count = 512;
  const HangReport m = analyze(three);
  EXPECT_EQ(m.culprits, std::vector<int>{2});
  EXPECT_EQ(m.expected, kAllReduceText);
}

TEST(HangAnalysis, MissingDumpIsNamedAndTheRestAnalysed) {
  Job job = make_job(3);
  job.programs[1][index_of(job.programs[1], 5, 0)].call.count = 512;
  const HangReport r = analyze(job, {2});
  EXPECT_EQ(r.size, 3);
  EXPECT_EQ(r.ranks_found, (std::vector<int>{0, 1}));
  EXPECT_EQ(r.ranks_missing, std::vector<int>{2});
  EXPECT_EQ(r.last_enqueued[2], -2);
  EXPECT_EQ(r.last_completed[2], -2);
  EXPECT_EQ(r.kind, DivergenceKind::count);
  EXPECT_EQ(r.culprits, std::vector<int>{1});
  EXPECT_EQ(r.per_rank_call[2], "-");
  EXPECT_TRUE(contains(r.summary, "rank 2's dump is missing")) << r.summary;
  EXPECT_TRUE(contains(format_hang_report(r), "(no dump)"));
}

TEST(HangAnalysis, ReportTextAndJson) {
  Job job = make_job(3);
  auto& p1 = job.programs[1];
  p1.erase(p1.begin() + index_of(p1, 5, 0));
  const HangReport r = analyze(job, {2});
  const std::string text = format_hang_report(r);
  EXPECT_TRUE(contains(text, "run run-a, size 3: dumps from 2 of 3 ranks (0, 1), none from 2")) << text;
  EXPECT_TRUE(contains(text, "verdict: missing (skip) at seq 10, step 5 call 0; culprit 1")) << text;
  EXPECT_TRUE(contains(text, "expected: " + kAllReduceText)) << text;
  EXPECT_TRUE(contains(text, "step 5 call 1: " + kBroadcastText)) << text;

  const json j = to_json(r);
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"dir", "run_id", "size", "ranks_found", "ranks_missing", "kind",
                                            "pattern", "seq", "step", "call", "culprits", "expected",
                                            "per_rank_call", "ranks", "wrong_data_from", "stall", "summary",
                                            "warnings", "format"}));
  EXPECT_EQ(j["format"], "stallbench-flight-recorder");
  EXPECT_EQ(j["kind"], "missing");
  EXPECT_EQ(j["pattern"], "skip");
  EXPECT_EQ(j["seq"], 10);
  EXPECT_EQ(j["call"], 0);
  EXPECT_EQ(j["culprits"], json::array({1}));
  EXPECT_EQ(j["ranks_missing"], json::array({2}));
  ASSERT_EQ(j["ranks"].size(), 3u);
  EXPECT_EQ(j["ranks"][1]["last_enqueued_seq"], 10);
  EXPECT_EQ(j["ranks"][1]["call_at_seq"], "step 5 call 1: " + kBroadcastText);
  EXPECT_EQ(j["ranks"][2]["last_enqueued_seq"], -2);
  EXPECT_EQ(j["stall"]["seq"], -1);
  EXPECT_EQ(j["summary"], r.summary);
}

// ---- reading dumps ----

class DumpDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() /
          fmt::format("sb_hang_{}_{}", getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir / name) << text; }
  void write_run(const Job& job, const std::string& prefix) {
    Recorders recs = run(job);
    for (int r = 0; r < job.nranks; ++r)
      write(fmt::format("{}rank{}.json", prefix, r), recs[r]->dump(header_of(job, r), "watchdog").dump(2));
  }
  fs::path dir;
};

TEST_F(DumpDir, PicksTheNewestRunAndWarnsAboutTheRest) {
  Job old_run = make_job(2);
  old_run.run_id = "old";
  write_run(old_run, "old_");
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  Job new_run = make_job(2);
  new_run.run_id = "new";
  new_run.stop_rank = 1;
  new_run.stop_at = 10;
  write_run(new_run, "new_");
  write("notes.json", R"({"hello": 1})");
  write("broken.json", "{");
  write("readme.txt", "not json at all");

  const HangReport r = analyze_hang_dir(dir.string());
  EXPECT_EQ(r.dir, dir.string());
  EXPECT_EQ(r.run_id, "new");
  EXPECT_EQ(r.kind, DivergenceKind::missing);
  EXPECT_EQ(r.culprits, std::vector<int>{1});
  std::string all;
  for (const auto& w : r.warnings) all += w + "\n";
  EXPECT_TRUE(contains(all, "stale dumps of run old ignored: " + (dir / "old_rank0.json").string() + ", " +
                                (dir / "old_rank1.json").string()))
      << all;
  EXPECT_TRUE(contains(all, "skipped " + (dir / "notes.json").string() + ": not a flight-recorder dump")) << all;
  EXPECT_TRUE(contains(all, "skipped " + (dir / "broken.json").string())) << all;
  EXPECT_FALSE(contains(all, "readme.txt")) << all;
  EXPECT_TRUE(contains(format_hang_report(r), "warnings:"));
}

TEST_F(DumpDir, TwoDumpsOfOneRankKeepTheNewest) {
  Job job = make_job(2);
  job.stop_rank = 1;
  job.stop_at = 10;
  Recorders recs = run(job);
  write("b_rank0.json", recs[0]->dump(header_of(job, 0), "first").dump());
  write("rank1.json", recs[1]->dump(header_of(job, 1), "watchdog").dump());
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  recs[0]->set_where("the newer dump");
  write("a_rank0.json", recs[0]->dump(header_of(job, 0), "second").dump());
  const HangReport r = analyze_hang_dir(dir.string());
  EXPECT_EQ(r.where[0], "the newer dump");
  ASSERT_FALSE(r.warnings.empty());
  EXPECT_TRUE(contains(r.warnings.back(), "two dumps claim rank 0: kept " + (dir / "a_rank0.json").string()))
      << r.warnings.back();
  EXPECT_EQ(r.culprits, std::vector<int>{1});
}

TEST_F(DumpDir, ErrorsAreUsageErrors) {
  EXPECT_THROW(analyze_hang_dir((dir / "nope").string()), UsageError);
  write("file.json", "{}");
  EXPECT_THROW(analyze_hang_dir((dir / "file.json").string()), UsageError);
  try {
    analyze_hang_dir(dir.string());  // only a non-dump in it
    FAIL() << "no error for a directory without dumps";
  } catch (const UsageError& e) {
    EXPECT_TRUE(contains(e.what(), "no flight-recorder dump")) << e.what();
  }
  EXPECT_THROW(analyze_dumps({}), UsageError);
}

TEST(DumpParsing, BadDumpsAreUsageErrors) {
  FlightRecorder fr(4);
  fr.enqueue(kAllReduce, 0, 0);
  const json good = fr.dump(header_of(make_job(2), 1), "test");
  EXPECT_NO_THROW(rank_dump_from_json(good));
  auto expect_error = [](const json& j, const std::string& part) {
    try {
      rank_dump_from_json(j);
      ADD_FAILURE() << "no error, expected one naming " << part;
    } catch (const UsageError& e) {
      EXPECT_TRUE(contains(e.what(), part)) << e.what();
    }
  };
  json j = good;
  j.erase("last_completed_seq");
  expect_error(j, "flight-recorder dump: last_completed_seq: expected integer in [-1, 9007199254740992], got nothing "
                  "(the field is missing)");
  j = good;
  j["entries"][0].erase("seq");
  expect_error(j, "entries[0].seq: expected integer in [0, 9007199254740992], got nothing");
  j = good;
  j["format"] = "something-else";
  expect_error(j, "format");
  j = good;
  j["version"] = 2;
  expect_error(j, "version 2");
  j = good;
  j["rank"] = 5;
  expect_error(j, "rank: expected integer in [0, 1], got integer 5");
  // Wide integers are range-checked, never narrowed (4294967297 once read as rank 1).
  j = good;
  j["rank"] = 4294967297LL;
  expect_error(j, "rank: expected integer in [0, 1], got integer 4294967297");
  j = good;
  j["size"] = 2000000000;  // once a bad_alloc, and 5000000 a 341 MB report
  expect_error(j, "size: expected integer in [1, 1048576], got integer 2000000000");
  j = good;
  j["last_enqueued_seq"] = 9000000000000000000LL;  // once a loop over every sequence number
  expect_error(j, "last_enqueued_seq: expected integer in [-1, 9007199254740992], got integer 9000000000000000000");
  j = good;
  j["last_enqueued_seq"] = 5;
  expect_error(j, "last_enqueued_seq 5 does not match its entries (newest seq 0, 0 dropped)");
  j = good;
  j["last_completed_seq"] = 3;
  expect_error(j, "last_completed_seq 3 is outside");
  j = good;
  j["entries"][0]["step"] = 4294967297LL;
  expect_error(j, "entries[0].step: expected integer in [-1, 2147483647], got integer 4294967297");
  j = good;
  j["size"] = "two";
  expect_error(j, "size: expected integer in [1, 1048576], got string \"two\"");
  expect_error(json::array(), "flight-recorder dump: the document: expected object, got array");
}

// ---- malformed dumps (issue #24): the file and the field named; the other ranks still analysed ----

// A dump of rank 1 of a 2-rank job whose ring holds seqs 0..1.
json two_call_dump(int rank) {
  FlightRecorder fr(4);
  for (int i = 0; i < 2; ++i) fr.completed(fr.enqueue(kAllReduce, i, 0));
  return fr.dump(header_of(make_job(2), rank), "end of run");
}

std::string dump_error(const json& j) {
  try {
    rank_dump_from_json(j, "rank-1.json");
  } catch (const UsageError& e) {
    return e.what();
  }  // any other exception fails the test
  return "no error";
}

TEST(DumpParsing, FieldsOfTheWrongTypeNameTheFileAndTheField) {
  json j = two_call_dump(1);
  j["entries"][1]["seq"] = "1";
  EXPECT_EQ(dump_error(j), "rank-1.json: entries[1].seq: expected integer in [0, 9007199254740992], got string \"1\"");
  j = two_call_dump(1);
  j["reason"] = 5;  // a numeric reason
  EXPECT_EQ(dump_error(j), "rank-1.json: reason: expected string, got integer 5");
  j = two_call_dump(1);
  j["entries"][0]["op"] = "allreduce";
  EXPECT_EQ(dump_error(j), "rank-1.json: entries[0].op: expected one of all_reduce|broadcast|reduce|all_gather|"
                           "reduce_scatter|all_to_all, got string \"allreduce\"");
  j = two_call_dump(1);
  j["entries"][0]["t_complete_us"] = 9223372036854775807LL;  // the stall arithmetic must not overflow
  EXPECT_EQ(dump_error(j), "rank-1.json: entries[0].t_complete_us: expected integer in [0, 9007199254740992], got "
                           "integer 9223372036854775807");
}

// The counters must describe the entries as a ring's dump does: seqs
// dropped..last_enqueued_seq, each once. A rank with no entries but a last
// seq of 9e15 once made the analysis walk 9e15 seqs (a hang of its own).
TEST(DumpParsing, CountersThatDoNotDescribeTheEntriesAreRefused) {
  json j = two_call_dump(1);
  j["entries"] = json::array();
  j["dropped"] = 9000000000000000LL;
  j["last_enqueued_seq"] = 8999999999999999LL;
  j["last_completed_seq"] = 8999999999999999LL;
  EXPECT_EQ(dump_error(j), "rank-1.json: dropped: is 9000000000000000 with no entries: a ring that issued a call keeps "
                           "the last one");
  j = two_call_dump(1);
  j["entries"][1]["seq"] = 5;
  j["last_enqueued_seq"] = 5;
  EXPECT_EQ(dump_error(j), "rank-1.json: entries: seqs 0 and 5 leave a gap: a ring's entries are consecutive");
  j = two_call_dump(1);
  j["entries"][1]["seq"] = 0;
  EXPECT_EQ(dump_error(j), "rank-1.json: entries: seqs 0 and 0 repeat: a ring's entries are consecutive");
  j = two_call_dump(1);
  j["dropped"] = 1;
  EXPECT_EQ(dump_error(j), "rank-1.json: dropped: is 1, but the oldest entry is seq 0: the ring drops seqs "
                           "0..oldest-1");
}

TEST_F(DumpDir, ABadDumpIsSkippedNamingItsFieldAndTheOthersAreAnalysed) {
  write("rank-0.json", two_call_dump(0).dump());
  json bad = two_call_dump(1);
  bad["entries"][0]["count"] = "1024";
  write("rank-1.json", bad.dump());
  const HangReport r = analyze_hang_dir(dir.string());
  EXPECT_EQ(r.ranks_found, std::vector<int>{0});
  EXPECT_EQ(r.ranks_missing, std::vector<int>{1});
  ASSERT_FALSE(r.warnings.empty());
  EXPECT_EQ(r.warnings[0], "skipped " + (dir / "rank-1.json").string() +
                               ": entries[0].count: expected integer in [0, 9007199254740992], got string \"1024\"");
}

TEST_F(DumpDir, WithOnlyABadDumpTheErrorNamesItsFileAndField) {
  json bad = two_call_dump(1);
  bad["timeout_s"] = "30";
  write("rank-1.json", bad.dump());
  try {
    analyze_hang_dir(dir.string());
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_TRUE(contains(e.what(), "skipped " + (dir / "rank-1.json").string() +
                                       ": timeout_s: expected number, got string \"30\""))
        << e.what();
  }
}

// The same hang through the directory: rank 1 claims 9e15 dropped seqs and
// no entries; rank 0 is a normal dump. Once a walk over 9e15 seqs.
TEST_F(DumpDir, AHugeEmptyRingCannotMakeTheAnalysisWalkForever) {
  write("rank-0.json", two_call_dump(0).dump());
  json j = two_call_dump(1);
  j["entries"] = json::array();
  j["dropped"] = 9000000000000000LL;
  j["last_enqueued_seq"] = 8999999999999999LL;
  j["last_completed_seq"] = -1;
  write("rank-1.json", j.dump());
  const HangReport r = analyze_hang_dir(dir.string());
  EXPECT_EQ(r.ranks_missing, std::vector<int>{1});
  ASSERT_FALSE(r.warnings.empty());
  EXPECT_TRUE(contains(r.warnings[0], "dropped: is 9000000000000000 with no entries")) << r.warnings[0];
}

// Found by fuzz_hang_dump: a dump with bytes that are not UTF-8 outside its
// strings was skipped with the parser's message, which quoted those bytes;
// the report's JSON (analyze-hang --json) then threw type_error 316.
TEST_F(DumpDir, ADumpThatIsNotUtf8LeavesAReportThatIsStillJson) {
  write("rank-0.json", two_call_dump(0).dump());
  write("rank-1.json", "{\"format\": \"stallbench-flight-recorder\",\n \xe0\xdf\xdd: 1}");
  const HangReport r = analyze_hang_dir(dir.string());
  ASSERT_FALSE(r.warnings.empty());
  EXPECT_TRUE(contains(r.warnings[0], "is not valid JSON")) << r.warnings[0];
  EXPECT_TRUE(contains(r.warnings[0], "\\xe0")) << r.warnings[0];
  EXPECT_NO_THROW((void)to_json(r).dump());
}

}  // namespace
}  // namespace sb
