// All-reduce bus bandwidth through the `collective` scenario beside a bare
// MPI_Allreduce loop, measured interleaved in one job, so the harness's cost
// (or a slower call family) is a ratio from one run:
//   bare         MPI_Allreduce (fp32, sum) on a dup of MPI_COMM_WORLD, timed
//                as nccl-tests does: warm-up, barrier, N calls, time per call,
//                mean over ranks;
//   blocking     the scenario through its own API (run_points), op=all_reduce,
//                one size, mode=blocking: MPI_Allreduce with its flight
//                recorder and watchdog around each call;
//   nonblocking  the same with mode=nonblocking: MPI_Iallreduce + MPI_Test.
// busbw = size / time × 2(n−1)/n (nccl-tests; sb::bus_factor). Each round runs
// every size and variant once, the variants' order rotating by round; the
// table gives the median over rounds, and each ratio is the median of the
// rounds' own ratios (a round's variants ran seconds apart).
//
// Not Google Benchmark: its iteration count adapts per process, and ranks
// that disagree on how many collectives to issue deadlock. Every count here is
// fixed by the flags, the same on every rank.
//
// Run: mpirun -np 2 build/bench/coll_bench [--sizes 1048576,16777216]
//        [--rounds 5] [--iters N] [--warmup 5] [--json FILE]
#include <mpi.h>  // MPI_Allreduce, MPI_Comm_dup: the bare loop

#include <unistd.h>  // getpid

#include <algorithm>   // std::sort, std::rotate
#include <charconv>    // std::from_chars
#include <chrono>      // std::chrono::steady_clock
#include <cstdio>      // std::printf, std::fprintf
#include <cstdlib>     // std::aligned_alloc, std::free; std::exit: --help
#include <memory>      // std::unique_ptr: the bare loop's buffers
#include <filesystem>  // std::filesystem::remove_all, temp_directory_path
#include <string>      // std::string
#include <vector>      // std::vector

#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::ordered_json: --json

#include "harness/comm.hpp"       // ProcessGroup, bus_factor
#include "harness/errors.hpp"     // UsageError
#include "harness/files.hpp"      // check_writable_target
#include "harness/params.hpp"     // expand_sweep
#include "harness/result.hpp"     // write_file_atomic
#include "scenarios/registry.hpp"   // find_scenario, all_scenarios; Scenario, RunContext
#include "kernels/backends.hpp"   // open_device, open_process_group, open_communicator
#include "harness/exit_codes.hpp"  // kExitUsage

namespace {

using json = nlohmann::ordered_json;
using clock_type = std::chrono::steady_clock;

struct Options {
  std::vector<std::int64_t> sizes{std::int64_t(1) << 20, std::int64_t(16) << 20};
  int rounds = 5;
  int iters = 0;  // 0: per size, about 256 MiB moved per timed window, 20..1000 calls
  int warmup = 5;
  std::string json_path;
};

const char* kUsage =
    "usage: mpirun -np N coll_bench [--sizes B1,B2,...] [--rounds R] [--iters N] [--warmup W] [--json FILE]\n"
    "  --sizes   message sizes in bytes, multiples of 4, 8 and up (default 1048576,16777216)\n"
    "  --rounds  interleaved rounds; the table gives medians (default 5)\n"
    "  --iters   timed calls per size and variant (default: 256 MiB / size, within 20..1000)\n"
    "  --warmup  untimed calls first (default 5)\n"
    "  --json    also write the figures to FILE (atomically)\n";

std::int64_t parse_int(const std::string& flag, const std::string& text, std::int64_t lo, std::int64_t hi) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi)
    throw sb::UsageError(fmt::format("{} {}: expected an integer in [{}, {}]", flag, text, lo, hi));
  return v;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) throw sb::UsageError(fmt::format("{}: unknown flag, or its value is missing", a));
    const std::string v = argv[++i];
    if (a == "--sizes") {
      o.sizes.clear();
      for (std::size_t at = 0; at <= v.size();) {
        const std::size_t comma = std::min(v.find(',', at), v.size());
        // The scenario's smallest message is 8 bytes; MPI counts elements in an int.
        const std::int64_t b = parse_int("--sizes", v.substr(at, comma - at), 8, std::int64_t(1) << 32);
        if (b % 4 != 0) throw sb::UsageError(fmt::format("--sizes {}: {} is not a whole number of fp32", v, b));
        o.sizes.push_back(b);
        at = comma + 1;
      }
    } else if (a == "--rounds") {
      o.rounds = static_cast<int>(parse_int(a, v, 1, 1000));
    } else if (a == "--iters") {
      o.iters = static_cast<int>(parse_int(a, v, 1, 1000000));
    } else if (a == "--warmup") {
      o.warmup = static_cast<int>(parse_int(a, v, 0, 1000000));
    } else if (a == "--json") {
      o.json_path = v;
    } else {
      throw sb::UsageError(fmt::format("{}: unknown flag", a));
    }
  }
  return o;
}

int iters_for(const Options& o, std::int64_t bytes) {
  if (o.iters > 0) return o.iters;
  return static_cast<int>(std::clamp<std::int64_t>((std::int64_t(256) << 20) / bytes, 20, 1000));
}

// The bare loop's buffers: allocated once per size and kept, as a user's
// loop (and nccl-tests) does, 64-byte aligned and separate, as the
// scenario's are (MpiCommunicator::alloc). This matters: on the 2-core
// machine, two std::vector<float> made per measurement (send and recv 1 MiB
// + 16 B apart, so 16 B out of step within a cache line) ran the same loop
// 3x slower at 1 MiB; the figure would then measure Open MPI's copy and
// reduction on mutually misaligned buffers, not the harness.
struct BareBuffers {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> send, recv;
  explicit BareBuffers(std::int64_t bytes) {
    const std::size_t n = static_cast<std::size_t>(bytes / 4);
    const std::size_t rounded = (static_cast<std::size_t>(bytes) + 63) / 64 * 64;
    send.reset(static_cast<float*>(std::aligned_alloc(64, rounded)));
    recv.reset(static_cast<float*>(std::aligned_alloc(64, rounded)));
    if (!send || !recv) throw sb::OutOfMemory(fmt::format("coll_bench: 2 x {} bytes for the bare loop", bytes));
    std::fill(send.get(), send.get() + n, 1.0f);
    std::fill(recv.get(), recv.get() + n, 0.0f);
  }
};

// The bare loop: what a user's benchmark would write. Returns busbw (GB/s)
// from the mean over ranks of the per-call time.
double bare_allreduce(MPI_Comm comm, const BareBuffers& buf, std::int64_t bytes, int iters, int warmup) {
  const int count = static_cast<int>(bytes / 4);
  float* send = buf.send.get();
  float* recv = buf.recv.get();
  for (int i = 0; i < warmup; ++i) MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, comm);
  MPI_Barrier(comm);
  const auto t0 = clock_type::now();
  for (int i = 0; i < iters; ++i) MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, comm);
  double us = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count() / iters;
  int n = 1;
  MPI_Comm_size(comm, &n);
  MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_SUM, comm);
  us /= n;
  if (recv[0] != float(n) || recv[count - 1] != float(n))
    throw sb::Error(sb::ErrorKind::runtime, "the bare all-reduce summed wrong");
  return double(bytes) / (us * 1e-6) / 1e9 * sb::bus_factor(sb::CollOp::all_reduce, n);
}

// The scenario's row for one size and mode: busbw (GB/s). A row that is not
// ok (wrong data) ends the bench: its figure would mean nothing.
double scenario_allreduce(sb::ScenarioRun& run, const sb::Scenario& sc, const std::string& dump_dir,
                          std::int64_t bytes, int iters, int warmup, const char* mode) {
  const sb::Sweep sw = sb::expand_sweep(
      sc.params,
      {"backend=mpi", "op=all_reduce", "dtype=fp32", fmt::format("min_bytes={}", bytes),
       fmt::format("max_bytes={}", bytes), fmt::format("iters={}", iters), fmt::format("warmup={}", warmup),
       fmt::format("mode={}", mode), "dump_dir=" + dump_dir},
      sb::SweepProfile{});
  const std::vector<sb::Point> rows = run.run_points(sw.points.at(0));
  const sb::Point& p = rows.at(0);
  if (p.status != sb::Status::ok || !p.metric("busbw") || p.info.value("mode", "") != mode)
    throw sb::Error(sb::ErrorKind::runtime, fmt::format("collective mode={} at {} B: status {}, {}", mode, bytes,
                                                        sb::to_string(p.status), p.reason));
  return p.metric("busbw")->value;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

struct SizeFigures {
  std::int64_t bytes = 0;
  int iters = 0;
  BareBuffers buffers;
  std::vector<double> bare, blocking, nonblocking;  // busbw per round
};

std::vector<double> ratios(const std::vector<double>& a, const std::vector<double>& base) {
  std::vector<double> r;
  for (std::size_t i = 0; i < a.size(); ++i) r.push_back(base[i] > 0 ? a[i] / base[i] : 0);
  return r;
}

json figure(double value, const char* unit, const char* direction, const std::vector<double>& rounds,
            const char* note) {
  return json{{"value", value}, {"unit", unit}, {"direction", direction}, {"rounds", rounds}, {"note", note}};
}

// Every rank measures; rank 0 prints and writes.
void measure(const Options& o, sb::ProcessGroup& group);

int run(int argc, char** argv) {
  // Before MPI, on every rank alike: bad input exits 2 everywhere.
  const Options o = parse_options(argc, argv);
  if (!o.json_path.empty()) sb::check_writable_target(o.json_path, "--json");
  auto group = sb::open_process_group(&argc, &argv);
  if (group->size() < 2) throw sb::UsageError("coll_bench needs 2 or more ranks: mpirun -np 2 coll_bench");
  try {
    measure(o, *group);
  } catch (const std::exception& e) {
    // The peers may be inside a bare MPI_Allreduce, which has no deadline:
    // end the job rather than leave them there.
    std::fprintf(stderr, "coll_bench: rank %d: %s\n", group->rank(), e.what());
    group->abort(sb::kExitFailure);
  }
  return 0;
}

void measure(const Options& o, sb::ProcessGroup& g) {
  sb::ProcessGroup* group = &g;
  const bool lead = group->rank() == 0;
  const auto deadline = [] { return clock_type::now() + std::chrono::seconds(60); };

  // The scenario as the CLI opens it (app/cmd_run.cpp): a cpu device, the
  // process group and a communicator factory.
  const sb::Scenario* sc = sb::find_scenario("collective");
  if (!sc) throw sb::Error(sb::ErrorKind::runtime, "this build has no collective scenario");
  auto dev = sb::open_device(sb::parse_device_spec("cpu"));
  sb::RunContext ctx{*dev};
  sb::RankServices services;
  services.group = group;
  services.open_comm = [group](const std::string& b) { return sb::open_communicator(*group, b); };
  ctx.ranks = &services;
  // Its dumps (none unless something hangs) go to a directory of this job's.
  const std::string dump_dir = group->broadcast(
      (std::filesystem::temp_directory_path() / fmt::format("coll_bench-{}", getpid())).string(), 0, deadline());
  auto scenario = sc->start(ctx);

  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  std::vector<SizeFigures> figs;
  for (std::int64_t b : o.sizes) figs.push_back({b, iters_for(o, b), BareBuffers(b), {}, {}, {}});
  for (int r = 0; r < o.rounds; ++r) {
    for (auto& f : figs) {
      // The variants' order rotates by round: none always runs first.
      for (int k = 0; k < 3; ++k) {
        switch ((r + k) % 3) {
          case 0: f.bare.push_back(bare_allreduce(comm, f.buffers, f.bytes, f.iters, o.warmup)); break;
          case 1:
            f.blocking.push_back(scenario_allreduce(*scenario, *sc, dump_dir, f.bytes, f.iters, o.warmup, "blocking"));
            break;
          case 2:
            f.nonblocking.push_back(
                scenario_allreduce(*scenario, *sc, dump_dir, f.bytes, f.iters, o.warmup, "nonblocking"));
            break;
        }
      }
    }
    if (lead) std::fprintf(stderr, "coll_bench: round %d of %d done\n", r + 1, o.rounds);
  }
  scenario.reset();  // its communicator before MPI ends
  MPI_Comm_free(&comm);
  group->barrier(deadline());
  if (!lead) return;
  std::error_code ec;
  std::filesystem::remove_all(dump_dir, ec);

  std::printf("all_reduce fp32 sum, %d ranks (%s), %d rounds; busbw GB/s: median over rounds; "
              "ratio: median of the rounds' ratios to bare\n",
              group->size(), group->library().c_str(), o.rounds);
  std::printf("%10s %6s %10s %14s %7s %16s %7s\n", "size", "iters", "bare", "blocking", "ratio", "nonblocking",
              "ratio");
  json sizes = json::array();
  for (const auto& f : figs) {
    const auto rb = ratios(f.blocking, f.bare), rn = ratios(f.nonblocking, f.bare);
    std::printf("%10lld %6d %10.3f %14.3f %6.3fx %16.3f %6.3fx\n", static_cast<long long>(f.bytes), f.iters,
                median(f.bare), median(f.blocking), median(rb), median(f.nonblocking), median(rn));
    sizes.push_back(json{
        {"bytes", f.bytes},
        {"iters", f.iters},
        {"bare_busbw", figure(median(f.bare), "GB/s", "higher", f.bare, "bare MPI_Allreduce loop")},
        {"blocking_busbw",
         figure(median(f.blocking), "GB/s", "higher", f.blocking, "collective scenario, mode=blocking")},
        {"blocking_ratio", figure(median(rb), "ratio", "higher", rb, "blocking / bare, median of rounds")},
        {"nonblocking_busbw",
         figure(median(f.nonblocking), "GB/s", "higher", f.nonblocking, "collective scenario, mode=nonblocking")},
        {"nonblocking_ratio", figure(median(rn), "ratio", "higher", rn, "nonblocking / bare, median of rounds")},
    });
  }
  if (!o.json_path.empty()) {
    const json doc{{"kind", "coll_bench"},
                   {"op", "all_reduce"},
                   {"dtype", "fp32"},
                   {"ranks", group->size()},
                   {"library", group->library()},
                   {"rounds", o.rounds},
                   {"warmup", o.warmup},
                   {"sizes", sizes}};
    sb::write_file_atomic(o.json_path, doc.dump(2) + "\n");
    std::printf("json: %s\n", o.json_path.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const sb::UsageError& e) {
    std::fprintf(stderr, "coll_bench: %s\n%s", e.what(), kUsage);
    return sb::kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coll_bench: %s\n", e.what());
    return 1;
  }
}
