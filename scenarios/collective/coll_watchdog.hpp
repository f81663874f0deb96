// The collective watchdog: a thread per rank that watches the flight
// recorder. When no collective completes within timeout_s while the rank is
// in its collective loop, it
//   1. writes the rank's ring and status as JSON into dump_dir/rank-R.json
//      (atomically), and a marker file that tells the other ranks to dump too
//      (a peer stuck elsewhere dumps as soon as it sees it);
//   2. aborts: ncclCommAbort on the communicator, then MPI_Abort on the job;
//   3. exits with kExitHang (4), or kExitCollectiveError (5) when a rank's
//      library reported an error on a collective (a truncation from a count
//      mismatch) instead of hanging.
// Before aborting, rank 0 waits (at most grace_s) for every rank's dump, then
// runs the hang analysis and hands its report to on_report, so the job's
// result JSON and stderr name the culprit without a second command.
#pragma once

#include <atomic>              // std::atomic
#include <condition_variable>  // std::condition_variable
#include <functional>          // std::function
#include <mutex>               // std::mutex
#include <string>              // std::string
#include <thread>              // std::thread

#include "harness/comm.hpp"                      // ProcessGroup, Communicator
#include "readers/flight_recorder.hpp"  // FlightRecorder, DumpHeader
#include "diagnose/hang/hang_analysis.hpp"    // HangReport
#include "harness/exit_codes.hpp"  // kExit*

namespace sb {



struct CollWatchdogConfig {
  double timeout_s = 5;
  std::string dump_dir;
  DumpHeader header;
  double grace_s = 3;  // how long rank 0 waits for the other ranks' dumps
};

class CollWatchdog {
 public:
  CollWatchdog(FlightRecorder& rec, ProcessGroup& group, Communicator* comm, CollWatchdogConfig cfg,
               std::function<void(const HangReport&, const std::string& reason, int exit_code)> on_report);
  ~CollWatchdog();
  CollWatchdog(const CollWatchdog&) = delete;
  CollWatchdog& operator=(const CollWatchdog&) = delete;

  // Watch only between arm() and disarm(): the collective loop and its final
  // barrier, not the set-up before it or the analysis after.
  void arm();
  void disarm();
  // true once a hang or an error was declared: the main thread must stop
  // issuing calls and wait to be ended (park()).
  bool triggered() const { return triggered_.load(); }
  // From the main thread: a collective failed in the library. Dumps, tells
  // the peers, and ends the job with kExitCollectiveError. Never returns.
  [[noreturn]] void fail(const std::string& reason);
  // The main thread's place once triggered: sleeps until the job is ended.
  [[noreturn]] void park();
  // Writes this rank's dump (end of a run with a mismatch injected, or a
  // fingerprint refusal) and returns its path.
  std::string write_dump(const std::string& reason);

 private:
  void loop();
  void trigger(const std::string& reason, int code, bool own);
  std::string marker_path() const;

  FlightRecorder& rec_;
  ProcessGroup& group_;
  Communicator* comm_;
  CollWatchdogConfig cfg_;
  std::function<void(const HangReport&, const std::string&, int)> on_report_;
  std::atomic<bool> armed_{false};
  std::atomic<bool> triggered_{false};
  std::chrono::steady_clock::time_point armed_at_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace sb
