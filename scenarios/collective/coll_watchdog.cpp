#include "scenarios/collective/coll_watchdog.hpp"

#include <fcntl.h>   // open
#include <signal.h>  // sigaction, raise
#include <time.h>    // nanosleep
#include <unistd.h>  // write, close

#include <cstdio>      // std::fprintf
#include <cstring>     // std::strncpy
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream
#include <sstream>     // std::stringstream

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"    // UsageError
#include "harness/result.hpp"    // write_file_atomic, read_json_file
#include "harness/watchdog.hpp"  // kExitHang

namespace sb {

namespace fs = std::filesystem;

// A rank that crashes inside the library (Open MPI can SIGSEGV or abort on a
// float/double mismatch) must still make the others dump, and dump itself if
// it can. The signal handler writes the abort marker with system calls only
// (async-signal-safe, from buffers made in advance), then gives the
// watchdog thread a few seconds to dump this rank and, on rank 0, explain,
// before the signal takes its default course.
namespace {
constexpr int kCrashSignals[] = {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL};
std::atomic<int> g_crash_signal{0};
std::atomic<bool> g_crash_handled{false};
char g_marker_path[4096];
char g_marker_text[256];  // "5\nrank R: crashed with signal " + number appended in the handler
struct sigaction g_previous[sizeof kCrashSignals / sizeof kCrashSignals[0]];

void append_int(char* buf, std::size_t cap, int v) {
  std::size_t n = 0;
  while (n < cap && buf[n]) ++n;
  char digits[16];
  int k = 0;
  do {
    digits[k++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0 && k < 15);
  while (k > 0 && n + 2 < cap) buf[n++] = digits[--k];
  buf[n++] = '\n';
  buf[n] = 0;
}

void on_crash(int sig) {
  if (g_crash_signal.exchange(sig) == 0) {
    append_int(g_marker_text, sizeof g_marker_text, sig);
    const int fd = ::open(g_marker_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      std::size_t len = 0;
      while (g_marker_text[len]) ++len;
      (void)!::write(fd, g_marker_text, len);
      ::close(fd);
    }
    // Up to 4 s for the watchdog thread (rank 0 waits 3 s for the dumps).
    const timespec tick{0, 10'000'000};
    for (int i = 0; i < 400 && !g_crash_handled.load(); ++i) nanosleep(&tick, nullptr);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}
}  // namespace

CollWatchdog::CollWatchdog(FlightRecorder& rec, ProcessGroup& group, Communicator* comm, CollWatchdogConfig cfg,
                           std::function<void(const HangReport&, const std::string&, int)> on_report)
    : rec_(rec), group_(group), comm_(comm), cfg_(std::move(cfg)), on_report_(std::move(on_report)) {
  std::error_code ec;
  fs::create_directories(cfg_.dump_dir, ec);
  if (ec)
    throw UsageError(fmt::format("dump_dir '{}': cannot create it: {}", cfg_.dump_dir, ec.message()));
  std::strncpy(g_marker_path, marker_path().c_str(), sizeof g_marker_path - 1);
  std::snprintf(g_marker_text, sizeof g_marker_text, "%d\nrank %d: crashed with signal ", kExitCollectiveError,
                cfg_.header.rank);
  g_crash_signal = 0;
  g_crash_handled = false;
  struct sigaction sa {};
  sa.sa_handler = &on_crash;
  sigemptyset(&sa.sa_mask);
  for (std::size_t i = 0; i < std::size(kCrashSignals); ++i) sigaction(kCrashSignals[i], &sa, &g_previous[i]);
  thread_ = std::thread([this] { loop(); });
}

CollWatchdog::~CollWatchdog() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (std::size_t i = 0; i < std::size(kCrashSignals); ++i) sigaction(kCrashSignals[i], &g_previous[i], nullptr);
}

void CollWatchdog::arm() {
  {
    std::lock_guard lk(mu_);
    armed_at_ = std::chrono::steady_clock::now();
  }
  armed_ = true;
}

void CollWatchdog::disarm() { armed_ = false; }

std::string CollWatchdog::marker_path() const {
  return (fs::path(cfg_.dump_dir) / fmt::format(".abort-{}", cfg_.header.run_id)).string();
}

std::string CollWatchdog::write_dump(const std::string& reason) {
  const std::string path = (fs::path(cfg_.dump_dir) / fmt::format("rank-{}.json", cfg_.header.rank)).string();
  write_file_atomic(path, rec_.dump(cfg_.header, reason).dump(1) + "\n");
  return path;
}

void CollWatchdog::loop() {
  using namespace std::chrono;
  std::unique_lock lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, milliseconds(50));
    if (stop_ || triggered_) continue;
    if (const int sig = g_crash_signal.load(); sig != 0) {
      lk.unlock();
      trigger(fmt::format("crashed with signal {} ({}) inside the collective library", sig, strsignal(sig)),
              kExitCollectiveError, false);
      lk.lock();
      continue;
    }
    if (!armed_) continue;
    // A peer declared the hang first: dump now, while this rank's state is
    // what the hang left, with the peer's exit code.
    std::ifstream marker(marker_path());
    if (marker) {
      int code = kExitHang;
      std::string who;
      marker >> code;
      std::getline(marker >> std::ws, who);
      lk.unlock();
      trigger(fmt::format("peer {}", who), code, false);
      lk.lock();
      continue;
    }
    const auto last = std::max(rec_.last_progress(), armed_at_);
    const double idle_s = duration<double>(steady_clock::now() - last).count();
    if (idle_s < cfg_.timeout_s) continue;
    std::string what = fmt::format("watchdog: no collective completed for {:.1f} s (last completed seq {}, last "
                                   "enqueued seq {}); main thread: {}",
                                   idle_s, rec_.last_completed(), rec_.last_enqueued(), rec_.where());
    lk.unlock();
    trigger(what, kExitHang, true);
    lk.lock();
  }
}

void CollWatchdog::fail(const std::string& reason) {
  trigger(reason, kExitCollectiveError, true);
  park();  // a peer's watchdog got there first and is ending the job
}

void CollWatchdog::park() {
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

void CollWatchdog::trigger(const std::string& reason, int code, bool own) {
  if (triggered_.exchange(true)) return;
  const int rank = cfg_.header.rank;
  if (own) {
    try {
      write_file_atomic(marker_path(), fmt::format("{}\nrank {}: {}\n", code, rank, reason));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "stallbench: rank %d: could not tell the peers through %s: %s\n", rank,
                   marker_path().c_str(), e.what());
    }
  }
  // Unblock the communicator first (NCCL needs it for a safe teardown).
  if (comm_) comm_->abort();
  std::string path;
  try {
    path = write_dump(reason);
  } catch (const std::exception& e) {
    path = fmt::format("(not written: {})", e.what());
  }
  std::fprintf(stderr, "stallbench: rank %d: %s\nstallbench: rank %d: flight recorder dumped to %s\n", rank,
               reason.c_str(), rank, path.c_str());
  std::fflush(stderr);

  using namespace std::chrono;
  const auto deadline = steady_clock::now() + duration_cast<steady_clock::duration>(duration<double>(cfg_.grace_s));
  if (rank == 0) {
    // Wait for every rank's dump of this run (each peer sees the marker
    // within ~50 ms), then explain before ending the job.
    std::vector<RankDump> dumps;
    for (;;) {
      dumps.clear();
      for (int r = 0; r < cfg_.header.size; ++r) {
        const fs::path p = fs::path(cfg_.dump_dir) / fmt::format("rank-{}.json", r);
        try {
          if (!fs::exists(p)) continue;
          RankDump d = rank_dump_from_json(read_json_file(p.string()));
          d.path = p.string();
          if (d.header.run_id == cfg_.header.run_id) dumps.push_back(std::move(d));
        } catch (const std::exception&) {
          // half-visible or stale: look again
        }
      }
      if (static_cast<int>(dumps.size()) == cfg_.header.size || steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(milliseconds(50));
    }
    try {
      HangReport rep = analyze_dumps(dumps);
      rep.dir = cfg_.dump_dir;
      std::fprintf(stderr, "\n%s\n", format_hang_report(rep).c_str());
      if (on_report_) on_report_(rep, reason, code);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "stallbench: the hang analysis failed: %s\n", e.what());
    }
    std::fprintf(stderr, "stallbench: ending the job (exit code %d: %s)\n", code,
                 code == kExitHang ? "hang caught" : "collective error");
  } else {
    // Rank 0 ends the job once it has every dump; if it cannot (it crashed,
    // or the dump directory is not shared), end it from here.
    std::this_thread::sleep_until(deadline + seconds(2));
  }
  std::fflush(stderr);
  g_crash_handled = true;
  group_.abort(code);
}

}  // namespace sb
