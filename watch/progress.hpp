// `watch --exec`: the job's own progress, for a hang the GPUs cannot show (a NCCL collective that
// never completes spins its kernel: utilization reads 100%). The job's stdout and stderr are read
// through pipes and passed on byte for byte; a line that says a step was made (tqdm's rate, "step
// N", the Hugging Face Trainer's log dicts), or a --progress-file that grew, is progress. Once the
// job has made progress, silence past max(--stuck-after, 10 x its median gap between steps) is the
// stuck alarm, whatever the utilization. At the alarm every rank is asked for its Flight Recorder
// dump (the pipes PyTorch's NCCL watchdog reads, TORCH_NCCL_DEBUG_INFO_PIPE_FILE, and those
// stallbench.torch.flight_recorder opens for any backend), py-spy dumps each Python process of the
// job where py-spy is installed, and analyze-hang says who waits where. The job keeps running
// unless kill_on_stuck.
#pragma once

#include <sys/types.h>  // pid_t

#include <atomic>       // std::atomic
#include <chrono>       // std::chrono::steady_clock
#include <cstdint>      // std::int64_t
#include <mutex>        // std::mutex
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <thread>       // std::thread
#include <vector>       // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

namespace sb::watch {

// Whether a line of the job's output says it made a step: tqdm's rate ("3.2it/s", "1.5s/it"),
// "step N" in any case and spelling ("Step 12", "global_step=12", "step: 12/100"), the Trainer's
// log dicts ({'loss': 1.2, ...}, {"loss": ...}, 'train_runtime').
bool is_progress_line(std::string_view line);

struct ProgressOptions {
  double stuck_after_s = 60;
  std::vector<std::string> files;  // --progress-file: a size or mtime change is progress
  std::string fr_dir;              // --fr-dir: the job's Flight Recorder dumps and dump pipes
  bool kill_on_stuck = false;
  double dump_wait_s = 15;  // how long the alarm waits for the ranks' dumps
};

class ProgressWatch {
 public:
  explicit ProgressWatch(ProgressOptions o);
  ~ProgressWatch();
  ProgressWatch(const ProgressWatch&) = delete;
  ProgressWatch& operator=(const ProgressWatch&) = delete;

  // What the job is started with: its stdout and stderr (the pipes' write ends) and the
  // environment added (PYTHONUNBUFFERED=1, so Python's output arrives as written; where its Flight
  // Recorder dumps and dump pipes go).
  int child_stdout() const { return out_[1]; }
  int child_stderr() const { return err_[1]; }
  std::vector<std::string> child_env() const;
  // After the job started: the write ends closed here, the reader started.
  void started();

  // Once per round of the watch, at t seconds: the alarm text once when the job went silent.
  std::optional<std::string> poll(double t);
  // At the alarm: dumps asked for and waited for, analyze-hang on them, py-spy; the lines to show.
  std::vector<std::string> on_stuck(pid_t job, double t);
  bool kill_on_stuck() const { return o_.kill_on_stuck; }
  // The reader drained and joined (the job has ended, or is being left).
  void finish();
  // What the result records: steps seen, the gaps, the alarm and what it found.
  nlohmann::ordered_json summary() const;

 private:
  void reader();
  void saw_progress(double t);

  ProgressOptions o_;
  int out_[2] = {-1, -1}, err_[2] = {-1, -1};
  std::thread thread_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  std::vector<double> steps_;  // when each progress event came (s since t0_)
  std::string last_line_;      // the last progress line (a repeat of it is not progress)
  std::vector<std::pair<std::string, std::pair<std::int64_t, std::int64_t>>> file_state_;  // (path, (size, mtime ns))
  bool alarmed_ = false;
  double alarm_t_ = -1, silent_s_ = 0, threshold_s_ = 0;
  nlohmann::ordered_json found_;  // what the alarm's dumps said
};

}  // namespace sb::watch
