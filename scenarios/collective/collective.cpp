// Scenario `collective`: collectives that do not match across ranks.
//
// Healthy mode (mismatch=none) is nccl-tests on the user's ranks: a sweep of
// message sizes (min_bytes..max_bytes, ×factor) per op and dtype, each timed
// over `iters` calls after `warmup`, with algbw and busbw (harness/comm.hpp
// bus_factor) and an exact data check (coll_data.hpp). mode=blocking (the
// default) times the blocking calls users write (MPI_Allreduce...);
// mode=nonblocking starts each call and polls it (MPI_Iallreduce +
// MPI_Test), which in Open MPI 4.1 is another algorithm family (coll/libnbc)
// and slower on shared memory. nccl has only the second kind: a call on a
// stream, which is what its users issue.
//
// Mismatch mode runs a training-like step loop (coll_schedule.hpp) in
// which one rank issues a wrong call. A flight recorder on every rank keeps
// its last calls; the watchdog (coll_watchdog.hpp) catches the hang,
// dumps every rank and ends the job; analyze-hang names the culprit. With
// check=fingerprint, ranks agree on each call before issuing it, so the
// mismatch is refused at the first bad call and nothing hangs.
//
// Launch: mpirun -np N stallbench run collective ... (or srun).
#include <algorithm>  // std::max_element
#include <map>        // std::map
#include <cmath>      // std::pow
#include <limits>     // std::numeric_limits
#include <numeric>    // std::accumulate
#include <thread>     // std::this_thread

#include <unistd.h>  // getpid

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/errors.hpp"                   // UnsupportedError, MismatchError, HangError
#include "harness/random.hpp"                   // splitmix64
#include "harness/scenario.hpp"                 // Scenario
#include "harness/watchdog.hpp"                 // kExitHang
#include "scenarios/collective/coll_data.hpp"       // fill_coll_input, count_coll_wrong
#include "scenarios/collective/coll_findings.hpp"   // collective_findings, bytes_text
#include "scenarios/collective/coll_schedule.hpp"   // parse_mismatch, planned_calls
#include "scenarios/collective/coll_watchdog.hpp"   // CollWatchdog
#include "readers/flight_recorder.hpp" // FlightRecorder
#include "diagnose/hang/hang_analysis.hpp"   // analyze_hang_dir

namespace sb {
namespace {

// backend: auto picks nccl on a cuda device, mpi elsewhere (open_communicator).
enum class Backend { automatic, mpi, nccl };
constexpr NameTable<Backend, 3> kBackendNames{{{{Backend::automatic, "auto"}, {Backend::mpi, "mpi"}, {Backend::nccl, "nccl"}}}};
enum class Check { off, fingerprint };
constexpr NameTable<Check, 2> kCheckNames{{{{Check::off, "off"}, {Check::fingerprint, "fingerprint"}}}};
// How the size sweep issues its calls (the step loop is always nonblocking).
enum class Mode { blocking, nonblocking };
constexpr NameTable<Mode, 2> kModeNames{{{{Mode::blocking, "blocking"}, {Mode::nonblocking, "nonblocking"}}}};

using json = nlohmann::ordered_json;
using clock_type = std::chrono::steady_clock;

struct Settings {
  std::string backend;
  CollOp op;
  CommDtype dtype;
  std::int64_t min_bytes, max_bytes, factor;
  int iters, warmup, steps;
  bool fingerprint;
  bool blocking;  // mode=blocking: where the communicator has blocking calls
  std::optional<Mismatch> mismatch;
  std::int64_t step_bytes;
  double delay_ms, timeout_s;
  std::string dump_dir;
  std::int64_t ring;
  std::uint64_t seed;

  static Settings from(const ParamSet& p) {
    Settings s;
    s.backend = std::string(kBackendNames.name(p.get_choice("backend", kBackendNames)));
    s.op = p.get_choice("op", kCollOpNames);
    s.dtype = p.get_choice("dtype", kCommDtypeNames);
    s.min_bytes = p.get_int("min_bytes");
    s.max_bytes = p.get_int("max_bytes");
    s.factor = p.get_int("factor");
    s.iters = static_cast<int>(p.get_int("iters"));
    s.warmup = static_cast<int>(p.get_int("warmup"));
    s.steps = static_cast<int>(p.get_int("steps"));
    s.fingerprint = p.get_choice("check", kCheckNames) == Check::fingerprint;
    s.blocking = p.get_choice("mode", kModeNames) == Mode::blocking;
    s.mismatch = parse_mismatch(p.get_str("mismatch"));
    s.step_bytes = p.get_int("step_bytes");
    s.delay_ms = p.get_real("delay_ms");
    s.timeout_s = p.get_real("timeout_s");
    s.dump_dir = p.get_str("dump_dir");
    s.ring = p.get_int("ring");
    s.seed = static_cast<std::uint64_t>(p.get_int("seed"));
    return s;
  }
};



class CollectiveRun final : public ScenarioRun {
 public:
  explicit CollectiveRun(RunContext& ctx) : ctx_(ctx) {}

  Point run_point(const ParamSet& p) override { return run_points(p).front(); }

  std::vector<Point> run_points(const ParamSet& p) override {
    if (!ctx_.ranks || !ctx_.ranks->group) throw UnsupportedError("collective needs a process group (run it through `stallbench run`)");
    const Settings s = Settings::from(p);
    point_params_ = p.to_json();
    open(s);
    std::vector<Point> out;
    if (s.mismatch) out.push_back(step_loop(s));
    else out = sweep(s);
    return out;
  }

  void analyze(Result& r) override;

 private:
  // Opens (or keeps) the communicator, its recorder and its watchdog.
  void open(const Settings& s) {
    ProcessGroup& g = *ctx_.ranks->group;
    const auto deadline = clock_type::now() + std::chrono::seconds(60);
    std::string backend = s.backend;
    if (backend == "auto") backend = ctx_.device.info().kind == DeviceKind::cuda ? "nccl" : "mpi";
    if (!comm_ || comm_->backend() != backend) {
      wd_.reset();
      comm_.reset();
      ctx_.progress(fmt::format("collective: opening the {} communicator", backend));
      comm_ = ctx_.ranks->open_comm(backend);
      if (run_id_.empty()) {
        const std::string mine = fmt::format("{:x}-{:x}", static_cast<std::uint64_t>(now_us()), getpid());
        run_id_ = g.broadcast(mine, 0, deadline);
      }
      cap_bytes_ = 0;
    }
    // Room for the largest call, twice over: a mismatched rank's call
    // (double the dtype, or a peer's larger count) lands in slack, not past
    // the buffer.
    // (count is already the larger buffer's, so twice covers every kind.)
    const std::int64_t largest = std::max(s.max_bytes, s.step_bytes) * 2 + 4096;
    if (static_cast<std::size_t>(largest) > cap_bytes_) {
      // Two pairs: a step's two calls are in flight together.
      for (int i = 0; i < 2; ++i) {
        send_[i] = comm_->alloc(static_cast<std::size_t>(largest));
        recv_[i] = comm_->alloc(static_cast<std::size_t>(largest));
      }
      fp_send_ = comm_->alloc(64);
      fp_recv_ = comm_->alloc(64);
      cap_bytes_ = static_cast<std::size_t>(largest);
    }
    timeout_s_ = s.timeout_s;
    dump_dir_ = s.dump_dir;
    // Each sweep point has its own recorder and id: its dumps, its marker
    // and its analysis never mix with an earlier point's in dump_dir.
    DumpHeader h{fmt::format("{}.{}", run_id_, point_index_++), g.rank(), g.size(), g.local_rank(), g.host(),
                 static_cast<long>(getpid()), comm_->backend(), comm_->device(), s.timeout_s};
    wd_.reset();
    rec_ = std::make_unique<FlightRecorder>(static_cast<std::size_t>(s.ring));
    wd_ = std::make_unique<CollWatchdog>(*rec_, g, comm_.get(), CollWatchdogConfig{s.timeout_s, s.dump_dir, h, 3.0},
                                         [this, s](const HangReport& rep, const std::string& why, int code) {
                                           write_hang_result(s, rep, why, code);
                                         });
  }

  // Polls until every started call completed, marking the recorder's
  // entries (seqs, in start order; empty for the fingerprint's own call) as
  // they start and complete. The watchdog owns the deadline; this loop only
  // yields to it (and has a last-resort limit).
  void wait_done(const std::vector<std::int64_t>& seqs) {
    const auto hard = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                              std::chrono::duration<double>(timeout_s_ + 30));
    bool started = false;
    std::size_t marked = 0;  // seqs[0..marked) recorded as completed
    auto complete_through = [&](std::size_t k) {
      for (; marked < k && marked < seqs.size(); ++marked) rec_->completed(seqs[marked]);
    };
    for (long spins = 0;; ++spins) {
      if (wd_->triggered()) wd_->park();
      Communicator::Progress pr;
      try {
        pr = comm_->poll();
      } catch (const Error& e) {
        // The watchdog's own abort makes pending calls fail: not the library's verdict.
        if (wd_->triggered()) wd_->park();
        const std::int64_t seq = marked < seqs.size() ? seqs[marked] : -1;
        if (seq >= 0) rec_->failed(seq, e.what());
        wd_->fail(fmt::format("collective seq {} failed in the library: {}", seq, e.what()));
      }
      if (pr == Communicator::Progress::done) return complete_through(seqs.size());
      if (pr == Communicator::Progress::started && !started) {
        for (auto q : seqs) rec_->started(q);
        started = true;
      }
      if (const std::int64_t k = comm_->completed_in_order(); k > 0) complete_through(static_cast<std::size_t>(k));
      if (clock_type::now() > hard)
        throw HangError(fmt::format("collective seq {} never completed", marked < seqs.size() ? seqs[marked] : -1));
      if (spins < 2000) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(spins < 20000 ? 50 : 500));
    }
  }

  // check=fingerprint: before the call, one 2-element all-reduce (max) of the
  // call's hash and its negation; every rank agrees iff max == -max(-h).
  // Returns false (the call must not be issued) when the ranks disagree.
  bool agree(const CollCall& c, std::int64_t seq) {
    const std::uint64_t h = splitmix64(static_cast<std::uint64_t>(seq) * 0x100000001b3ULL ^
                                       splitmix64((static_cast<std::uint64_t>(c.op) << 40) ^
                                                  (static_cast<std::uint64_t>(c.dtype) << 32) ^
                                                  (static_cast<std::uint64_t>(c.root) << 48) ^
                                                  static_cast<std::uint64_t>(c.count))) >> 2;
    const std::int64_t v[2] = {static_cast<std::int64_t>(h), -static_cast<std::int64_t>(h)};
    comm_->upload(fp_send_, v, sizeof v);
    comm_->start(CollCall{CollOp::all_reduce, 2, CommDtype::i64, 0, ReduceOp::max}, fp_send_, fp_recv_);
    wait_done({});
    std::int64_t r[2];
    comm_->download(r, fp_recv_, sizeof r);
    return r[0] == -r[1];
  }

  // Issues one call and waits for it; returns its seq. It runs inside the
  // timed loop, so it formats nothing: the caller says where it is once.
  // The fingerprint check's own all-reduce is always started and polled;
  // the checked call runs blocking when asked.
  std::int64_t issue(const CollCall& c, int step, int call_index, bool fingerprint, bool blocking) {
    const std::int64_t seq = rec_->enqueue(c, step, call_index);
    if (fingerprint && !agree(c, seq)) {
      rec_->failed(seq, "refused by the fingerprint check: the ranks disagree on (seq, op, count, dtype, root)");
      throw_fingerprint_mismatch(seq);
    }
    if (blocking) {
      run_blocking(c, seq);
    } else {
      comm_->start(c, send_[0], recv_[0]);
      wait_done({seq});
    }
    return seq;
  }

  // One blocking call on send_[0]/recv_[0], marked started and completed
  // around it. This thread keeps no deadline and need not park(): while
  // the watchdog is armed it sees no call complete for timeout_s, dumps the
  // ring (this call: started), and ends the job from its own thread
  // (MPI_Abort, which MPI_THREAD_MULTIPLE allows while this thread is inside
  // MPI_Allreduce), as it does for a polled call.
  void run_blocking(const CollCall& c, std::int64_t seq) {
    rec_->started(seq);
    try {
      comm_->run_blocking(c, send_[0], recv_[0]);
    } catch (const Error& e) {
      // As wait_done: after the watchdog's own abort a failure is not the library's verdict.
      if (wd_->triggered()) wd_->park();
      rec_->failed(seq, e.what());
      wd_->fail(fmt::format("collective seq {} failed in the library: {}", seq, e.what()));
    }
    rec_->completed(seq);
    // A peer declared a hang while this call ran here: issue nothing more
    // (the watchdog is dumping this rank and will end the job).
    if (wd_->triggered()) wd_->park();
  }

  [[noreturn]] void throw_fingerprint_mismatch(std::int64_t seq);
  std::vector<Point> sweep(const Settings& s);
  Point step_loop(const Settings& s);
  void write_hang_result(const Settings& s, const HangReport& rep, const std::string& why, int code);

  RunContext& ctx_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<FlightRecorder> rec_;
  std::unique_ptr<CollWatchdog> wd_;
  std::string run_id_;
  void *send_[2] = {}, *recv_[2] = {}, *fp_send_ = nullptr, *fp_recv_ = nullptr;
  std::size_t cap_bytes_ = 0;
  double timeout_s_ = 5;
  std::string dump_dir_;
  int point_index_ = 0;
  json point_params_;  // the sweep point being run: the hang result's params
};

// Every rank refused the same call at once (the check's all-reduce itself
// always matches): each dumps its ring, and rank 0 explains from the dumps,
// with the same analysis as analyze-hang. Nothing was issued, so the
// communicator stays usable for the next point.
void CollectiveRun::throw_fingerprint_mismatch(std::int64_t seq) {
  ProcessGroup& g = *ctx_.ranks->group;
  wd_->disarm();
  wd_->write_dump(fmt::format("fingerprint check refused seq {}", seq));
  g.barrier(clock_type::now() + std::chrono::seconds(30));  // every dump written
  std::string why = fmt::format("caught by check=fingerprint at seq {}, before the call was issued", seq);
  if (g.rank() == 0) {
    const HangReport rep = analyze_hang_dir(dump_dir_);
    why = fmt::format("{}: {}", why, rep.summary);
  }
  throw MismatchError(why);
}

std::vector<Point> CollectiveRun::sweep(const Settings& s) {
  ProcessGroup& g = *ctx_.ranks->group;
  const int n = g.size();
  const std::size_t dsize = dtype_size(s.dtype);
  // What runs: nccl has no blocking calls (its enqueue is what users call),
  // so mode=blocking is nonblocking there, and each row's info says which.
  const bool blocking = s.blocking && comm_->supports_blocking();
  std::vector<Point> out;
  std::vector<unsigned char> host;
  int size_index = 0;
  for (std::int64_t bytes = s.min_bytes; bytes <= s.max_bytes; bytes *= s.factor, ++size_index) {
    CollCall c;
    c.op = s.op;
    c.dtype = s.dtype;
    c.count = round_count(s.op, std::max<std::int64_t>(bytes / static_cast<std::int64_t>(dsize), 1), n);
    const CollCounts cc = coll_counts(c, n);
    const std::int64_t size_bytes = c.count * static_cast<std::int64_t>(dsize);  // nccl-tests' "size"
    const std::uint64_t seed = call_seed(s.seed, -1, size_index);
    ctx_.progress(fmt::format("collective {} {} {}: timing", to_string(c.op), to_string(c.dtype), bytes_text(size_bytes)));
    fill_coll_input(c, n, g.rank(), seed, host);
    comm_->upload(send_[0], host.data(), host.size());
    std::vector<unsigned char> zeros(static_cast<std::size_t>(cc.recv) * dsize, 0);
    comm_->upload(recv_[0], zeros.data(), zeros.size());

    // Armed only around the calls: filling and checking a 1 GiB buffer on
    // the host can take longer than timeout_s and is not a hang.
    rec_->set_where(fmt::format("{} warm-up and {} timed calls of {} ({}){}", s.warmup, s.iters, describe(c),
                                coll_call_family(comm_->backend(), c.op, blocking),
                                s.fingerprint ? ", each after a fingerprint check" : ""));
    wd_->arm();
    for (int i = 0; i < s.warmup; ++i) issue(c, -1, i, s.fingerprint, blocking);
    g.barrier(clock_type::now() + std::chrono::seconds(60));
    const auto t0 = clock_type::now();
    if (comm_->queues_in_order() && !s.fingerprint && !blocking) {
      // nccl-tests' way on a stream: enqueue every iteration, wait once.
      std::vector<std::int64_t> seqs;
      for (int i = 0; i < s.iters; ++i) {
        seqs.push_back(rec_->enqueue(c, -1, s.warmup + i));
        comm_->start(c, send_[0], recv_[0]);
      }
      wait_done(seqs);
    } else {
      for (int i = 0; i < s.iters; ++i) issue(c, -1, s.warmup + i, s.fingerprint, blocking);
    }
    const double us = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count() / s.iters;
    wd_->disarm();

    // Per-rank times differ by when each rank left the last call; the
    // figure is their mean, as nccl-tests averages across ranks.
    const auto times = g.allgather(us, clock_type::now() + std::chrono::seconds(60));
    std::vector<unsigned char> got(static_cast<std::size_t>(cc.recv) * dsize);
    comm_->download(got.data(), recv_[0], got.size());
    const auto wrongs = g.allgather(count_coll_wrong(c, n, g.rank(), seed, got), clock_type::now() + std::chrono::seconds(60));
    const std::int64_t wrong = std::accumulate(wrongs.begin(), wrongs.end(), std::int64_t{0});

    // --- derive: a pure function of what was recorded ---
    Point p = coll_size_point(c, n, size_bytes, times, wrong, CollPath{comm_->backend(), comm_->library(), blocking});
    out.push_back(std::move(p));
    if (bytes > s.max_bytes / s.factor) break;  // the next size would pass max_bytes (and could overflow)
  }
  g.barrier(clock_type::now() + std::chrono::seconds(60));
  return out;
}

Point CollectiveRun::step_loop(const Settings& s) {
  ProcessGroup& g = *ctx_.ranks->group;
  const int n = g.size();
  const auto healthy = step_calls(s.op, std::max<std::int64_t>(s.step_bytes / static_cast<std::int64_t>(dtype_size(s.dtype)), 1),
                                  s.dtype, n);
  std::vector<unsigned char> host, got;
  std::int64_t wrong = 0;
  int first_wrong_step = -1;
  ctx_.progress(fmt::format("collective: step loop with mismatch {}@{}:{}", to_string(s.mismatch->kind),
                            s.mismatch->step, s.mismatch->rank));
  g.barrier(clock_type::now() + std::chrono::seconds(60));
  const auto t0 = clock_type::now();
  wd_->arm();
  for (int step = 0; step < s.steps; ++step) {
    // A step issues its calls asynchronously, then waits for them, as DDP
    // launches its bucket all-reduces; so a rank that swaps two calls shows
    // both in its ring, and a rank that skips one shows none. Hence this
    // loop is nonblocking whatever `mode` says: mode is the sweep's.
    const auto plan = planned_calls(healthy, s.mismatch, step, g.rank(), n, s.delay_ms);
    std::vector<std::int64_t> seqs;
    std::vector<std::uint64_t> seeds;
    for (std::size_t i = 0; i < plan.size(); ++i) {
      const PlannedCall& pc = plan[i];
      if (pc.sleep_ms > 0) {
        rec_->set_where(fmt::format("sleeping {:.0f} ms before step {} call {} (straggler injected)", pc.sleep_ms,
                                    step, pc.call_index));
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(pc.sleep_ms));
      }
      seeds.push_back(call_seed(s.seed, step, pc.call_index));
      rec_->set_where(fmt::format("filling the input of step {} call {}", step, pc.call_index));
      fill_coll_input(pc.call, n, g.rank(), seeds.back(), host);
      comm_->upload(send_[i], host.data(), host.size());
      rec_->touch();  // host work is progress; only a call that does not complete is a hang
      seqs.push_back(rec_->enqueue(pc.call, step, pc.call_index));
    }
    // Every call of the step is agreed before any is issued: a check queued
    // behind an issued call could itself be paired with a peer's mismatched
    // call. The step's calls are all in the ring first, so a refused swap
    // still shows both calls (order), and a refused skip only one.
    for (std::size_t i = 0; s.fingerprint && i < plan.size(); ++i) {
      rec_->set_where(fmt::format("fingerprint check of seq {} (step {} call {}): {}", seqs[i], step,
                                  plan[i].call_index, describe(plan[i].call)));
      if (!agree(plan[i].call, seqs[i])) {
        rec_->failed(seqs[i], "refused by the fingerprint check: the ranks disagree on (seq, op, count, dtype, root)");
        throw_fingerprint_mismatch(seqs[i]);
      }
    }
    for (std::size_t i = 0; i < plan.size(); ++i) comm_->start(plan[i].call, send_[i], recv_[i]);
    rec_->set_where(fmt::format("waiting for step {}: seqs {}..{}", step, seqs.front(), seqs.back()));
    wait_done(seqs);
    for (std::size_t i = 0; i < plan.size(); ++i) {
      rec_->set_where(fmt::format("checking the result of seq {}", seqs[i]));
      got.resize(static_cast<std::size_t>(coll_counts(plan[i].call, n).recv) * dtype_size(plan[i].call.dtype));
      comm_->download(got.data(), recv_[i], got.size());
      // The check uses the call this rank issued: a peer paired with a
      // different call makes the sums wrong here.
      const std::int64_t w = count_coll_wrong(plan[i].call, n, g.rank(), seeds[i], got);
      rec_->set_wrong(seqs[i], w);
      rec_->touch();
      if (w > 0 && first_wrong_step < 0) first_wrong_step = step;
      wrong += w;
    }
  }
  rec_->set_where("final barrier after the step loop");
  g.barrier(clock_type::now() + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(s.timeout_s * 4)));
  wd_->disarm();
  const double loop_ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();

  // No hang: the mismatch passed through the library. Dump every rank and
  // explain it the same way as a hang.
  wd_->write_dump("end of run (no hang)");
  g.barrier(clock_type::now() + std::chrono::seconds(30));
  const auto wrongs = g.allgather(wrong, clock_type::now() + std::chrono::seconds(30));
  const std::int64_t wrong_total = std::accumulate(wrongs.begin(), wrongs.end(), std::int64_t{0});
  // The first step with wrong data on any rank (a root may see none).
  std::int64_t first_wrong = -1;
  for (auto f : g.allgather(std::int64_t{first_wrong_step}, clock_type::now() + std::chrono::seconds(30)))
    if (f >= 0 && (first_wrong < 0 || f < first_wrong)) first_wrong = f;
  // --- derive: a pure function of what the loop and the dumps recorded ---
  if (g.rank() != 0) return step_loop_point(s.steps, loop_ms, wrong_total, first_wrong, nullptr);
  const HangReport rep = analyze_hang_dir(s.dump_dir);
  return step_loop_point(s.steps, loop_ms, wrong_total, first_wrong, &rep);
}

// On rank 0, from the watchdog thread, just before the job is ended.
void CollectiveRun::write_hang_result(const Settings& s, const HangReport& rep, const std::string& why, int code) {
  if (!ctx_.ranks || !ctx_.ranks->write_result_now) return;
  Result r;  // the points measured before this one are added by the writer
  Point p;
  p.params = point_params_;
  p.status = code == kExitHang ? Status::hang : Status::error;
  p.reason = fmt::format("{} — {}", why, rep.summary);
  p.info["analysis"] = to_json(rep);
  p.info["dump_dir"] = s.dump_dir;
  p.info["timeout_s"] = s.timeout_s;
  r.points.push_back(std::move(p));
  Finding f;
  f.summary = rep.summary;
  f.evidence = json{{"dump_dir", s.dump_dir}, {"kind", to_string(rep.kind)}, {"pattern", rep.pattern},
                    {"seq", rep.seq}, {"step", rep.step}, {"culprits", rep.culprits}};
  r.findings.push_back(std::move(f));
  ctx_.ranks->write_result_now(r);
}

void CollectiveRun::analyze(Result& r) { collective_findings(r); }

void check_mismatch_text(const std::string& v) { (void)parse_mismatch(v); }

void validate_point(const ParamSet& p, const RunContext& ctx) {
  const Settings s = Settings::from(p);
  const int n = ctx.ranks && ctx.ranks->group ? ctx.ranks->group->size() : 1;
  if (s.mismatch && s.mismatch->rank >= n)
    throw UsageError(fmt::format("mismatch rank {} does not exist: the job has {} rank(s) (launch with mpirun -np N)",
                                 s.mismatch->rank, n));
  if (s.mismatch && s.mismatch->step >= s.steps)
    throw UsageError(fmt::format("mismatch step {} is past the last step (steps={})", s.mismatch->step, s.steps));
  if (s.min_bytes > s.max_bytes)
    throw UsageError(fmt::format("min_bytes {} is above max_bytes {}", s.min_bytes, s.max_bytes));
  // MPI's classic calls count elements in an int.
  const bool mpi = s.backend == "mpi" || (s.backend == "auto" && ctx.device.info().kind != DeviceKind::cuda);
  const std::int64_t elems = std::max(s.max_bytes, s.step_bytes) / static_cast<std::int64_t>(dtype_size(s.dtype));
  if (mpi && elems > std::numeric_limits<int>::max())
    throw UsageError(fmt::format("backend=mpi counts elements in an int: {} {} elements is past {}; lower max_bytes",
                                 elems, to_string(s.dtype), std::numeric_limits<int>::max()));
}

}  // namespace

extern const Scenario collective_scenario;
const Scenario collective_scenario{
    "collective",
    kCollectiveCause,
    "nccl-tests-style busbw sweep with an exact check; injected mismatches caught by a watchdog with a flight recorder",
    {
        ParamSpec{.name = "backend", .type = ParamType::choice, .default_value = "auto",
                  .help = "mpi: host buffers; nccl: one GPU per rank (auto: nccl on cuda)",
                  .choices = kBackendNames.names()},
        ParamSpec{.name = "op", .type = ParamType::choice, .default_value = "all_reduce", .help = "the collective",
                  .choices = kCollOpNames.names()},
        ParamSpec{.name = "dtype", .type = ParamType::choice, .default_value = "fp32", .help = "element type",
                  .choices = kCommDtypeNames.names({CommDtype::fp32, CommDtype::fp64, CommDtype::bf16})},
        ParamSpec{.name = "min_bytes", .type = ParamType::integer, .default_value = "1024",
                  .help = "smallest message (nccl-tests -b)", .unit = "bytes", .min = 8, .max = 1e12,
                  .workload = false},  // the range: each point records its own `bytes`
        ParamSpec{.name = "max_bytes", .type = ParamType::integer, .default_value = "16777216",
                  .help = "largest message (nccl-tests -e)", .unit = "bytes", .min = 8, .max = 1e12,
                  .quick_default = "262144", .gpu_default = "268435456", .workload = false},
        ParamSpec{.name = "factor", .type = ParamType::integer, .default_value = "4",
                  .help = "size multiplier (nccl-tests -f)", .min = 2, .max = 1024, .quick_default = "16",
                  .workload = false},
        ParamSpec{.name = "iters", .type = ParamType::integer, .default_value = "20",
                  .help = "timed calls per size (nccl-tests -n)", .min = 1, .max = 1e6, .quick_default = "5",
                  .workload = false},
        ParamSpec{.name = "warmup", .type = ParamType::integer, .default_value = "5",
                  .help = "untimed calls first (nccl-tests -w)", .min = 0, .max = 1e6, .quick_default = "1",
                  .workload = false},
        ParamSpec{.name = "check", .type = ParamType::choice, .default_value = "off",
                  .help = "fingerprint: ranks agree on each call before issuing it", .choices = kCheckNames.names()},
        ParamSpec{.name = "mode", .type = ParamType::choice, .default_value = "blocking",
                  .help = "the sweep's calls: blocking (MPI_Allreduce..., what users call) or nonblocking "
                          "(MPI_Iallreduce... polled with MPI_Test); nccl is always a stream enqueue, and the "
                          "mismatch step loop always nonblocking (DDP's async bucket all-reduces)",
                  .choices = kModeNames.names()},
        ParamSpec{.name = "mismatch", .type = ParamType::text, .default_value = "none",
                  .help = "KIND@STEP:RANK, KIND one of skip, order, count, dtype, root, straggler: injected in a step loop",
                  .check = &check_mismatch_text},
        ParamSpec{.name = "steps", .type = ParamType::integer, .default_value = "20",
                  .help = "steps of the mismatch loop (2 calls each)", .min = 1, .max = 1e6, .quick_default = "10"},
        ParamSpec{.name = "step_bytes", .type = ParamType::integer, .default_value = "65536",
                  .help = "size of the step loop's main call", .unit = "bytes", .min = 8, .max = 1e10},
        ParamSpec{.name = "delay_ms", .type = ParamType::real, .default_value = "1000", .help = "the straggler's sleep",
                  .unit = "ms", .min = 0, .max = 3.6e6},
        ParamSpec{.name = "timeout_s", .type = ParamType::real, .default_value = "5",
                  .help = "watchdog: seconds without a completed collective", .unit = "s", .min = 0.2, .max = 3600,
                  .quick_default = "3"},
        ParamSpec{.name = "dump_dir", .type = ParamType::text, .default_value = "stallbench-dumps",
                  .help = "where each rank writes its flight-recorder dump", .workload = false},
        ParamSpec{.name = "ring", .type = ParamType::integer, .default_value = "2048",
                  .help = "flight-recorder entries per rank", .min = 4, .max = 1e7, .workload = false},
        ParamSpec{.name = "seed", .type = ParamType::integer, .default_value = "1", .help = "input data seed", .min = 0,
                  .max = 1e15, .workload = false},
    },
    [](RunContext& ctx) -> std::unique_ptr<ScenarioRun> { return std::make_unique<CollectiveRun>(ctx); },
    true,
    &validate_point,
};

}  // namespace sb
