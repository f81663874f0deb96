// `stallbench watch`: the first troubleshooting step (watch -n 1 nvidia-smi,
// squinting at the utilization column) done for the user. Samples every GPU
// through NVML at 10-100 ms, names the pattern (idle, spiky, steady-low,
// healthy, stuck) with what it suggests, raises the stuck alarm, reports
// throttling; or reads recorded nvidia-smi / dcgmi dmon logs (--from) and
// gives the same classification. --exec runs the training command under the
// watch, forwards signals to it and returns its exit code.
#pragma once

#include <cstdint>     // std::int64_t
#include <functional>  // std::function
#include <string>      // std::string
#include <vector>      // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/result.hpp"  // Result
#include "watch/analysis.hpp"  // Options

namespace sb::watch {

struct Args {
  std::string gpus = "all";       // "all" or "0,2": the GPUs to watch (NVML indices)
  int interval_ms = 100;          // 10..10000
  double duration_s = 0;          // 0: until interrupted (or, with exec, until the command ends)
  std::int64_t count = 0;         // > 0: stop after this many samples of every GPU (rounds)
  double kill_after_s = 30;       // exec: SIGKILL the job this long after a forwarded INT/TERM/HUP/QUIT
  std::string from;               // a recorded log instead of NVML
  double from_interval_ms = 0;    // the log's interval when it has no timestamps (dcgmi dmon)
  std::vector<std::string> exec;  // the command to run and watch
  std::string on_stuck;           // a shell command run once per stuck alarm
  double on_stuck_timeout_s = 60;
  double print_every_s = 0;       // plain lines: one per GPU every this many s (0: 1 s alone, 10 s with exec)
  bool live = true;               // false (--plain): plain lines even on a terminal
  bool stdout_taken = false;      // --json -: the JSON owns stdout, the view goes to stderr
  Options opt;
  // --exec: the job's own progress (watch/progress.hpp): files whose growth is progress, where its
  // Flight Recorder dumps and dump pipes go, whether the stuck alarm ends the job
  std::vector<std::string> progress_files;
  std::string fr_dir = "stallbench-fr";
  bool kill_on_stuck = false;
};

struct Outcome {
  Result result;
  int exit_code = 0;  // the command's (exec), else 0, or kExitHang when a stuck alarm was raised
  std::string summary;  // the text printed at the end
};

// meta_for: the result's meta for the watched device (id "cuda:N", name); the
// CLI fills in the host's fingerprint. progress: where the live view and
// plain lines go is decided inside (stdout, or stderr with exec).
// write_json: called with the result so far at each alarm, every 60 s and at
// the end (the caller writes it atomically).
Outcome run(const Args& a, const std::function<nlohmann::ordered_json(const std::string& id, const std::string& name,
                                                                      const nlohmann::ordered_json& props)>& meta_for,
            const std::function<void(const Result&)>& write_json);

// Parses --gpu: "all", or indices separated by commas. UsageError otherwise.
std::vector<int> parse_gpu_list(const std::string& s);

// The pattern's hint in a few words for the live line ("loader: raise dataloader_num_workers").
std::string short_hint(Pattern p);

}  // namespace sb::watch
