#include "watch/progress.hpp"

#include <dirent.h>    // opendir, readdir
#include <fcntl.h>     // open, O_WRONLY, O_NONBLOCK
#include <poll.h>      // poll
#include <signal.h>    // kill, SIGKILL
#include <sys/stat.h>  // stat
#include <unistd.h>    // pipe2, read, write, close

#include <algorithm>  // std::sort, std::max
#include <cctype>     // std::tolower, std::isdigit
#include <cerrno>     // errno
#include <cstring>    // std::strerror
#include <cstdlib>    // std::getenv
#include <filesystem>  // std::filesystem
#include <fstream>    // std::ifstream
#include <sstream>    // std::istringstream

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "diagnose/hang/hang_analysis.hpp"  // analyze_hang_dir, format_hang_report, to_json
#include "harness/errors.hpp"               // Error, UsageError
#include "watch/child.hpp"                  // spawn, reap_within

namespace sb::watch {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

bool digit_before(std::string_view s, std::size_t at) {
  while (at > 0 && s[at - 1] == ' ') --at;
  return at > 0 && std::isdigit(static_cast<unsigned char>(s[at - 1]));
}

// Writes all of it to fd; a reader that went away (EPIPE) or an error drops the rest: the job's
// output must keep flowing out of its pipe whatever happens to ours.
void pass_on(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

std::int64_t mtime_ns(const struct stat& st) { return std::int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec; }

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The processes under pid (children, theirs, ...), from /proc: torchrun's workers, a shell's python.
std::vector<pid_t> descendants(pid_t root) {
  std::vector<std::pair<pid_t, pid_t>> parent_of;  // (pid, ppid)
  DIR* d = ::opendir("/proc");
  if (!d) return {};
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    std::ifstream f("/proc/" + name + "/stat");
    std::string text;
    std::getline(f, text);
    const auto close_paren = text.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::istringstream rest(text.substr(close_paren + 1));
    char state = 0;
    long ppid = 0;
    if (rest >> state >> ppid) parent_of.emplace_back(pid_t(std::stol(name)), pid_t(ppid));
  }
  ::closedir(d);
  std::vector<pid_t> out{root};
  for (std::size_t i = 0; i < out.size() && out.size() < 4096; ++i)
    for (const auto& [pid, ppid] : parent_of)
      if (ppid == out[i]) out.push_back(pid);
  return out;
}

bool is_python(pid_t pid) {
  std::ifstream f(fmt::format("/proc/{}/comm", pid));
  std::string comm;
  std::getline(f, comm);
  return comm.rfind("python", 0) == 0 || comm == "pt_main_thread";
}

std::string which(const std::string& exe) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (!dir.empty() && ::access((dir + "/" + exe).c_str(), X_OK) == 0) return dir + "/" + exe;
  return "";
}

// A variable of another process's environment ("" when unreadable or unset).
std::string env_of(pid_t pid, const std::string& name) {
  std::ifstream f(fmt::format("/proc/{}/environ", pid), std::ios::binary);
  for (std::string kv; std::getline(f, kv, '\0');)
    if (kv.size() > name.size() && kv.compare(0, name.size(), name) == 0 && kv[name.size()] == '=')
      return kv.substr(name.size() + 1);
  return "";
}

// py-spy dump's main thread, innermost frames first: "all_reduce (distributed_c10d.py:4181) <- <module> (job.py:13)".
std::string main_thread_where(const std::string& file) {
  std::ifstream f(file);
  std::vector<std::string> frames;
  bool in_main = false;
  for (std::string ln; std::getline(f, ln);) {
    if (ln.rfind("Thread ", 0) == 0) {
      if (in_main) break;
      in_main = ln.find("\"MainThread\"") != std::string::npos;
      continue;
    }
    if (in_main && ln.rfind("    ", 0) == 0 && frames.size() < 4) frames.push_back(ln.substr(4));
  }
  return fmt::format("{}", fmt::join(frames, " <- "));
}

}  // namespace

bool is_progress_line(std::string_view line) {
  std::string s(line.substr(0, 4096));
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  for (std::size_t at = s.find("it/s"); at != std::string::npos; at = s.find("it/s", at + 1))
    if (digit_before(s, at)) return true;
  for (std::size_t at = s.find("s/it"); at != std::string::npos; at = s.find("s/it", at + 1))
    if (digit_before(s, at)) return true;
  for (std::size_t at = s.find("step"); at != std::string::npos; at = s.find("step", at + 1)) {
    std::size_t k = at + 4;
    while (k < s.size() && k < at + 8 && (s[k] == ' ' || s[k] == ':' || s[k] == '=' || s[k] == '#' || s[k] == '\t')) ++k;
    if (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) return true;
  }
  for (const char* key : {"'loss':", "\"loss\":", "'train_runtime'", "\"train_runtime\"", "'eval_loss':", "\"eval_loss\":"})
    if (s.find(key) != std::string::npos) return true;
  return false;
}

ProgressWatch::ProgressWatch(ProgressOptions o) : o_(std::move(o)) {
  if (::pipe2(out_, O_CLOEXEC) != 0 || ::pipe2(err_, O_CLOEXEC) != 0)
    throw Error(ErrorKind::runtime, fmt::format("watch --exec: pipe failed: {}", std::strerror(errno)));
  for (const auto& f : o_.files) {
    struct stat st {};
    file_state_.push_back({f, ::stat(f.c_str(), &st) == 0 ? std::make_pair(std::int64_t(st.st_size), mtime_ns(st))
                                                          : std::make_pair(std::int64_t(-1), std::int64_t(-1))});
  }
  if (!o_.fr_dir.empty()) {
    std::error_code ec;
    fs::create_directories(o_.fr_dir, ec);
    if (ec) throw UsageError(fmt::format("--fr-dir {}: cannot create it: {}", o_.fr_dir, ec.message()));
    o_.fr_dir = fs::absolute(o_.fr_dir).string();
  }
}

ProgressWatch::~ProgressWatch() {
  finish();
  for (int fd : {out_[0], out_[1], err_[0], err_[1]})
    if (fd >= 0) ::close(fd);
}

std::vector<std::string> ProgressWatch::child_env() const {
  std::vector<std::string> env{"PYTHONUNBUFFERED=1"};
  if (!o_.fr_dir.empty()) {
    // stallbench.torch.flight_recorder() takes this as its directory (and opens a dump pipe per
    // rank there); PyTorch's NCCL watchdog opens <prefix><rank>.pipe and dumps when it is written
    env.push_back("STALLBENCH_FR_DIR=" + o_.fr_dir);
    // PyTorch's own dump pipe opens only with the Flight Recorder on (a buffer above 0); each is set
    // only where the job's environment has none (names as torch 2.15's libtorch_cuda spells them;
    // TORCH_FR_DEBUG_INFO_PIPE_FILE for the newer backends)
    const std::string dir = o_.fr_dir;
    for (const auto& [var, value] :
         {std::pair<const char*, std::string>{"TORCH_NCCL_DEBUG_INFO_PIPE_FILE", (fs::path(dir) / "torch_pipe_rank_").string()},
          {"TORCH_FR_DEBUG_INFO_PIPE_FILE", (fs::path(dir) / "torch_pipe_rank_").string()},
          {"TORCH_FR_BUFFER_SIZE", "2000"},
          {"TORCH_FR_DUMP_TEMP_FILE", (fs::path(dir) / "rank_").string()},
          {"TORCH_NCCL_DUMP_ON_TIMEOUT", "1"}})
      if (!std::getenv(var)) env.push_back(std::string(var) + "=" + value);
  }
  return env;
}

void ProgressWatch::started() {
  ::close(out_[1]);
  ::close(err_[1]);
  out_[1] = err_[1] = -1;
  thread_ = std::thread([this] { reader(); });
}

void ProgressWatch::saw_progress(double t) {
  std::lock_guard lk(mu_);
  if (steps_.size() >= 100000) steps_.erase(steps_.begin(), steps_.begin() + 50000);
  steps_.push_back(t);
}

void ProgressWatch::reader() {
  struct Stream {
    int from, to;
    std::string line;
  };
  Stream ss[2] = {{out_[0], 1, {}}, {err_[0], 2, {}}};
  int open = 2;
  char buf[65536];
  while (open > 0) {
    pollfd ps[2];
    int n = 0;
    for (auto& st : ss)
      if (st.from >= 0) ps[n++] = {st.from, POLLIN, 0};
    const int r = ::poll(ps, nfds_t(n), 200);
    if (r < 0 && errno != EINTR) break;
    if (r <= 0) {
      if (stop_) break;
      continue;
    }
    for (int i = 0; i < n; ++i) {
      if (!ps[i].revents) continue;
      Stream& st = ss[0].from == ps[i].fd ? ss[0] : ss[1];
      const ssize_t got = ::read(st.from, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {  // the job closed it (or ended)
        st.from = -1;
        --open;
        continue;
      }
      pass_on(st.to, buf, std::size_t(got));
      const double t = std::chrono::duration<double>(Clock::now() - t0_).count();
      for (ssize_t k = 0; k < got; ++k) {
        const char c = buf[k];
        if (c == '\n' || c == '\r') {  // tqdm redraws its bar with \r
          if (!st.line.empty() && is_progress_line(st.line)) {
            bool fresh;
            {
              std::lock_guard lk(mu_);
              fresh = st.line != last_line_;
              if (fresh) last_line_ = st.line;
            }
            if (fresh) saw_progress(t);
          }
          st.line.clear();
        } else if (st.line.size() < 8192) {
          st.line.push_back(c);
        }
      }
    }
  }
}

std::optional<std::string> ProgressWatch::poll(double t) {
  for (auto& [path, state] : file_state_) {
    struct stat st {};
    const auto now = ::stat(path.c_str(), &st) == 0 ? std::make_pair(std::int64_t(st.st_size), mtime_ns(st))
                                                    : std::make_pair(std::int64_t(-1), std::int64_t(-1));
    if (now != state && now.first >= 0) saw_progress(t);
    state = now;
  }
  std::lock_guard lk(mu_);
  if (steps_.empty()) return std::nullopt;  // no step seen yet: loading, compiling; nothing to compare with
  std::vector<double> gaps;
  for (std::size_t i = steps_.size() > 51 ? steps_.size() - 51 : 1; i < steps_.size(); ++i)
    gaps.push_back(steps_[i] - steps_[i - 1]);
  double median = 0;
  if (!gaps.empty()) {
    std::sort(gaps.begin(), gaps.end());
    median = gaps[gaps.size() / 2];
  }
  const double silent = t - steps_.back();
  const double threshold = std::max(o_.stuck_after_s, 10 * median);
  if (alarmed_) {
    if (silent < threshold) alarmed_ = false;  // steps again: a later silence is a new alarm
    return std::nullopt;
  }
  if (silent <= threshold) return std::nullopt;
  alarmed_ = true;
  alarm_t_ = t;
  silent_s_ = silent;
  threshold_s_ = threshold;
  return fmt::format("watch: ALARM the job is stuck: no progress for {:.0f} s (its last step {:.0f} s into the run; "
                     "{} step line(s) or file change(s) so far, median gap {:.1f} s; alarm past {:.0f} s)",
                     silent, steps_.back(), steps_.size(), median, threshold);
}

std::vector<std::string> ProgressWatch::on_stuck(pid_t job, double t) {
  std::vector<std::string> lines;
  json found{{"t_s", t}};
  const std::string dir = o_.fr_dir;
  if (!dir.empty()) {
    // every dump pipe there: PyTorch's NCCL watchdog's, and those stallbench.torch.flight_recorder opened
    const std::int64_t asked_ns = now_ns();
    int poked = 0;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() != ".pipe" || !e.is_fifo(ec)) continue;
      const int fd = ::open(e.path().c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0) continue;  // ENXIO: nobody reads it (the rank is gone)
      pass_on(fd, "1\n", 2);
      ::close(fd);
      ++poked;
    }
    found["pipes_written"] = poked;
    // the dumps written since: every poked rank's, or what came within dump_wait_s
    std::vector<std::string> fresh;
    const auto until = Clock::now() + std::chrono::milliseconds(std::int64_t(o_.dump_wait_s * 1000));
    for (;;) {
      fresh.clear();
      for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (!e.is_regular_file(ec) || name.empty() || name[0] == '.' || e.path().extension() == ".txt") continue;
        struct stat st {};
        if (::stat(e.path().c_str(), &st) == 0 && mtime_ns(st) >= asked_ns) fresh.push_back(name);
      }
      if ((poked > 0 && int(fresh.size()) >= poked) || Clock::now() >= until || poked == 0) break;
      ::usleep(200'000);
    }
    std::sort(fresh.begin(), fresh.end());
    found["dumps"] = fresh;
    lines.push_back(poked == 0 ? fmt::format("watch: no dump pipe in {} (start the job's ranks with "
                                             "stallbench.torch.flight_recorder(), or NCCL's "
                                             "TORCH_NCCL_DEBUG_INFO_PIPE_FILE): no dump asked for", dir)
                               : fmt::format("watch: asked {} rank(s) for a Flight Recorder dump; {} written to {}",
                                             poked, fresh.size(), dir));
    if (!fresh.empty()) {
      ::usleep(500'000);  // a dump being written: let it end
      try {
        const HangReport rep = analyze_hang_dir(dir);
        found["analyze_hang"] = to_json(rep);
        std::istringstream text(format_hang_report(rep));
        int k = 0;
        for (std::string ln; std::getline(text, ln) && k < 6; ++k) lines.push_back("watch: " + ln);
        lines.push_back(fmt::format("watch: the whole report: stallbench analyze-hang {}", dir));
      } catch (const Error& e) {
        lines.push_back(fmt::format("watch: analyze-hang {}: {}", dir, e.what()));
      }
    }
  }
  // py-spy: where each Python process of the job stands
  const std::string pyspy = which("py-spy");
  json stacks = json::array();
  if (!pyspy.empty() && job > 0) {
    const std::string out_dir = dir.empty() ? "." : dir;
    for (pid_t pid : descendants(job)) {
      if (!is_python(pid)) continue;
      const std::string file = (fs::path(out_dir) / fmt::format("py-spy-{}.txt", pid)).string();
      std::string why;
      const pid_t p = spawn({"/bin/sh", "-c", fmt::format("exec \"$0\" dump --pid {} > \"$1\" 2>&1", pid), pyspy, file},
                            {}, true, SIGKILL, true, why);
      if (p > 0 && reap_within(p, 20) < 0) {
        ::kill(-p, SIGKILL);
        (void)reap_within(p, 5);
      }
      const std::string rank = env_of(pid, "RANK");
      const std::string where = main_thread_where(file);
      stacks.push_back({{"pid", pid}, {"rank", rank}, {"file", file}, {"main_thread", where}});
      lines.push_back(fmt::format("watch: py-spy dump of pid {}{}: {}{}", pid, rank.empty() ? "" : " (rank " + rank + ")",
                                  file, where.empty() ? "" : "\n       main thread: " + where));
    }
  } else if (pyspy.empty()) {
    lines.push_back("watch: py-spy is not installed (pip install py-spy): no Python stacks taken");
  }
  found["py_spy"] = stacks;
  std::lock_guard lk(mu_);
  found_.push_back(found);
  return lines;
}

void ProgressWatch::finish() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

json ProgressWatch::summary() const {
  std::lock_guard lk(mu_);
  json j{{"steps_seen", steps_.size()},
         {"last_step_s", steps_.empty() ? json(nullptr) : json(steps_.back())},
         {"files", o_.files},
         {"stuck_after_s", o_.stuck_after_s},
         {"alarms", found_.is_null() ? json::array() : found_}};
  if (alarm_t_ >= 0) j["first_alarm"] = {{"t_s", alarm_t_}, {"silent_s", silent_s_}, {"threshold_s", threshold_s_}};
  if (steps_.empty())
    j["note"] = "no step line in the job's output (tqdm's rate, 'step N', the Trainer's log dicts) and no "
                "--progress-file change: a silent hang cannot be told from a job that prints nothing";
  return j;
}

}  // namespace sb::watch
