#include "watch/watch.hpp"

#include <fcntl.h>      // O_CLOEXEC
#include <signal.h>     // sigaction, kill
#include <sys/prctl.h>  // PR_SET_PDEATHSIG
#include <sys/ioctl.h>  // TIOCGWINSZ
#include <sys/resource.h>  // getrusage
#include <sys/wait.h>   // waitpid
#include <time.h>       // nanosleep
#include <unistd.h>     // isatty

#include <algorithm>  // std::sort
#include <array>      // std::array
#include <atomic>     // std::atomic
#include <cerrno>     // errno
#include <chrono>     // std::chrono
#include <cstdio>     // std::fputs
#include <cstring>    // std::strerror
#include <map>        // std::map
#include <memory>     // std::unique_ptr
#include <optional>   // std::optional
#include <condition_variable>  // std::condition_variable
#include <deque>      // std::deque
#include <mutex>      // std::mutex
#include <thread>     // std::thread

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/errors.hpp"      // UsageError, Error
#include "harness/exit_codes.hpp"  // kExitHang
#include "kernels/nvml/nvml_abi.hpp"      // kErrorNotSupported
#include "watch/child.hpp"         // SignalScope, spawn, ChildGuard, reap_within, exit_code_of
#include "watch/exec_only.hpp"     // run_exec_without_gpus, progress_options, progress_alarm
#include "watch/nvml_session.hpp"  // NvmlSession
#include "watch/progress.hpp"      // ProgressWatch

namespace sb::watch {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

// --on-stuck: one shell command at a time, killed (its process group) at its deadline.
struct OnStuck {
  pid_t pid = -1;
  Clock::time_point deadline;
  std::size_t watched = 0, episode = 0;  // which GPU's which episode
  int gpu = 0;
};

// ---- the terminal ----
int terminal_width(int fd) {
  struct winsize w {};
  if (ioctl(fd, TIOCGWINSZ, &w) == 0 && w.ws_col > 20) return w.ws_col;
  return 120;
}

// Cuts a line to `cols` terminal columns (the sparkline's blocks are one
// column and three bytes each; everything else here is ASCII).
std::string fit(const std::string& s, int cols) {
  std::string out;
  int c = 0;
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    const std::size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : 4;
    if (c + 1 > cols) break;
    out.append(s, i, len);
    i += len;
    ++c;
  }
  return out;
}

std::string opt_num(const std::optional<double>& v, const char* fmtstr) {
  return v ? fmt::format(fmt::runtime(fmtstr), *v) : std::string("-");
}

double cpu_seconds_self() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

struct Watched {
  GpuIdentity id;
  std::size_t slot = 0;  // NvmlSession's index
  GpuTracker tracker;
  bool lost = false;
  std::string lost_why;
  int errors = 0, consecutive_errors = 0;  // NVML errors on the utilization query
};

std::string live_line(const Watched& w, int cols) {
  const telemetry::Sample* s = w.tracker.last();
  const Pattern p = w.tracker.pattern();
  std::string head = fmt::format("GPU{} ", w.id.index);
  if (w.lost) return fit(head + "lost: " + w.lost_why, cols);
  std::string figures;
  if (s) {
    figures = fmt::format(" {:>3}% ", opt_num(s->util_pct, "{:.0f}"));
    figures += fmt::format("{}/{}MHz ", opt_num(s->sm_clock_mhz, "{:.0f}"), opt_num(s->sm_clock_max_mhz, "{:.0f}"));
    figures += fmt::format("{}/{}W ", opt_num(s->power_w, "{:.0f}"), opt_num(s->power_limit_w, "{:.0f}"));
    figures += fmt::format("{}/{}GiB ", s->mem_used_mib ? fmt::format("{:.1f}", *s->mem_used_mib / 1024) : "-",
                           s->mem_total_mib ? fmt::format("{:.0f}", *s->mem_total_mib / 1024) : "-");
  }
  std::string state = std::string(to_string(p));
  if (p == Pattern::stuck) state = fmt::format("STUCK {:.0f}s", w.tracker.stuck_for_s());
  const std::string tail = state + ": " + short_hint(p);
  // the sparkline takes what the figures and the pattern leave, up to 60 columns
  const int spark_cols = std::clamp(cols - int(head.size() + figures.size() + tail.size()) - 1, 10, 60);
  const auto u = w.tracker.recent_util(std::size_t(spark_cols));
  return fit(head + sparkline(u, std::size_t(spark_cols)) + figures + tail, cols);
}

std::string plain_line(const Watched& w, double t) {
  const telemetry::Sample* s = w.tracker.last();
  if (w.lost) return fmt::format("t={:.1f}s gpu={} lost: {}", t, w.id.index, w.lost_why);
  const Pattern p = w.tracker.pattern();
  std::string line = fmt::format("t={:.1f}s gpu={}", t, w.id.index);
  if (s) {
    line += fmt::format(" util={}% sm_clock={}/{}MHz power={}/{}W mem={}/{}MiB", opt_num(s->util_pct, "{:.0f}"),
                        opt_num(s->sm_clock_mhz, "{:.0f}"), opt_num(s->sm_clock_max_mhz, "{:.0f}"),
                        opt_num(s->power_w, "{:.0f}"), opt_num(s->power_limit_w, "{:.0f}"),
                        opt_num(s->mem_used_mib, "{:.0f}"), opt_num(s->mem_total_mib, "{:.0f}"));
    if (s->sm_active) line += fmt::format(" sm_active={:.2f}", *s->sm_active);
  }
  line += fmt::format(" pattern={} ({}) hint: {}", to_string(p), w.tracker.pattern_evidence(), short_hint(p));
  return line;
}

// ---- the result ----
Metric metric(std::string name, double v, std::string unit, Direction d, std::string note = "", bool table = true) {
  Metric m;
  m.name = std::move(name);
  m.value = v;
  m.unit = std::move(unit);
  m.direction = d;
  m.note = std::move(note);
  m.in_table = table;
  return m;
}

constexpr double kFindingSharePct = 25;   // a pattern over a quarter of the watch is named
constexpr double kThrottlePct = 5;        // throttled over 5% of the loaded time is named

void add_findings(Result& r, const Watched& w, const json& sum) {
  const GpuTracker& t = w.tracker;
  const json& share = sum["pattern_share_pct"];
  const std::string gpu = fmt::format("GPU {}", w.id.index);
  auto finding = [&](std::string cause, std::string summary, json evidence) {
    evidence["gpu"] = w.id.index;
    r.findings.push_back({std::move(cause), std::move(summary), std::nullopt, std::move(evidence)});
  };
  for (const auto& e : t.stuck_episodes())
    finding("a hang: stuck with memory held",
            fmt::format("{}: utilization 0 with {:.1f} GiB held from t={:.1f} s{} (alarm after {:.0f} s): {}", gpu,
                        e.mem_used_mib / 1024, e.start_s,
                        e.end_s < 0 ? " to the end of the watch" : fmt::format(" to t={:.1f} s", e.end_s),
                        e.alarm_s - e.start_s,
                        GpuTracker::suggestion(Pattern::stuck)),
            json{{"check", "stuck"},
                 {"start_s", e.start_s},
                 {"alarm_s", e.alarm_s},
                 {"end_s", e.end_s},
                 {"mem_used_mib", e.mem_used_mib},
                 {"pids", e.pids},
                 {"on_stuck_rc", e.on_stuck_rc}});
  const double spiky = share.value("spiky", 0.0), low = share.value("steady-low", 0.0);
  if (spiky >= kFindingSharePct)
    finding("a slow host dataloader",
            fmt::format("{}: spiky {:.0f}% of the watch (near-idle and near-full samples alternate): {}", gpu, spiky,
                        GpuTracker::suggestion(Pattern::spiky)),
            json{{"check", "loader"},
                 {"share_pct", spiky},
                 {"config_line", "dataloader_num_workers: 4  # with dataloader_pin_memory: true"},
                 {"command", "stallbench run dataloader"}});
  if (low >= kFindingSharePct) {
    std::string why = fmt::format("{}: steady-low {:.0f}% of the watch (mean utilization {:.0f}%", gpu, low,
                                  sum.value("mean_util_pct", 0.0));
    if (sum.contains("mean_sm_active")) why += fmt::format(", SM active {:.0f}%", 100 * sum["mean_sm_active"].get<double>());
    if (sum.contains("mean_tensor_active"))
      why += fmt::format(", tensor active {:.0f}%", 100 * sum["mean_tensor_active"].get<double>());
    why += ")";
    const bool no_tensor = sum.contains("mean_tensor_active") && sum["mean_tensor_active"].get<double>() < 0.05;
    finding(no_tensor ? "fp32 where bf16 would do" : "steady-low utilization: fp32 where bf16 would do, or a batch too small",
            why + ": " + GpuTracker::suggestion(Pattern::steady_low),
            json{{"check", "utilization"},
                 {"share_pct", low},
                 {"config_line", no_tensor ? "bf16: true" : "bf16: true  # then a larger micro_batch_size"},
                 {"command", "stallbench diagnose --config your.yml"}});
  }
  const double loaded = sum.value("loaded_s", 0.0);
  if (loaded > 0 && 100 * t.throttled_s() / loaded >= kThrottlePct) {
    // What to look at follows the reasons (analysis.hpp, throttle_advice): heat is cooling, a power
    // cap the power limit (a software cap is a setting, not a fault), the power brake the power supply,
    // and a HW slowdown alone any of the three. A throttled second is not a lost second: how much
    // slower the work ran depends on how far the clocks fell, which the SM clock says.
    std::vector<std::string> reasons;
    for (const auto& [name, s] : t.throttle_reason_s()) reasons.push_back(fmt::format("{} {:.1f} s", name, s));
    std::vector<ThrottleCause> causes;
    for (const auto& [cause, s] : t.throttle_cause_s()) causes.push_back(cause);
    const double pct = 100 * t.throttled_s() / loaded;
    const std::string look = throttle_advice(causes);
    finding("throttling",
            fmt::format("{}: a clock event reason was active {:.0f}% of the time under load ({:.1f} of {:.1f} s){}{}: "
                        "{} (nvidia-smi -q -d PERFORMANCE,POWER); figures measured on this GPU meanwhile ran at "
                        "the lowered clocks",
                        gpu, pct, t.throttled_s(), loaded, reasons.empty() ? "" : "; reasons: " + fmt::format("{}", fmt::join(reasons, ", ")),
                        t.clocks_low_s() > 0 ? fmt::format("; SM clock under 90% of its max {:.1f} s", t.clocks_low_s()) : "",
                        look),
            json{{"check", "throttling"},
                 {"share_pct", pct},
                 {"throttled_s", t.throttled_s()},
                 {"loaded_s", loaded},
                 {"clocks_low_s", t.clocks_low_s()},
                 {"reasons_s", json(t.throttle_reason_s())}});
  }
  if (w.lost) finding("GPU lost", fmt::format("{}: {}", gpu, w.lost_why), json{{"check", "nvml"}});
}

Point point_of(const Watched& w, const json& sum, double cpu_pct, bool live) {
  const GpuTracker& t = w.tracker;
  Point p;
  p.params = json{{"gpu", w.id.index}};
  if (t.samples() == 0) {
    p.status = Status::error;
    p.reason = w.lost ? w.lost_why : "no sample of this GPU";
  }
  p.add(metric("mean_util", sum.value("mean_util_pct", 0.0), "%", Direction::higher,
               "utilization.gpu: the share of time a kernel ran"));
  for (const auto& [pat, name] : kPatternNames.entries) {
    std::string key = std::string(name);
    std::replace(key.begin(), key.end(), '-', '_');
    p.add(metric(key + "_share", sum["pattern_share_pct"].value(std::string(name), 0.0), "% of time",
                 pat == Pattern::healthy ? Direction::higher : Direction::lower,
                 fmt::format("windows of {} s", sum.value("window_s", 0.0))));
  }
  if (sum.contains("mean_sm_active"))
    p.add(metric("mean_sm_active", 100 * sum["mean_sm_active"].get<double>(), "%", Direction::higher, "DCGM SM active"));
  const double loaded = sum.value("loaded_s", 0.0);
  p.add(metric("throttled", loaded > 0 ? 100 * t.throttled_s() / loaded : 0.0, "% of loaded time", Direction::lower,
               "a clock event reason (power cap, thermal, HW slowdown) or SM clock under 90% of max, at >= 50% util"));
  double stuck_s = 0;
  for (const auto& e : t.stuck_episodes()) stuck_s += (e.end_s < 0 ? t.duration_s() : e.end_s) - e.start_s;
  p.add(metric("stuck", stuck_s, "s", Direction::lower, "utilization 0 with memory held, once past --stuck-after"));
  if (sum.contains("mean_power_w")) p.add(metric("mean_power", sum["mean_power_w"].get<double>(), "W", Direction::none));
  if (sum.contains("max_mem_used_mib"))  // absent, not 0, without a memory reading
    p.add(metric("max_mem_used", sum["max_mem_used_mib"].get<double>(), "MiB", Direction::none));
  p.add(metric("samples", double(t.samples()), "count", Direction::none, "", false));
  p.add(metric("duration", t.duration_s(), "s", Direction::none, "", false));
  if (live)
    p.add(metric("watch_cpu", cpu_pct, "% of a core", Direction::lower,
                 "the whole watch process (sampling every GPU, the view), user + system CPU over wall time"));
  p.info = json{{"name", w.id.name}, {"uuid", w.id.uuid}, {"pattern_now", to_string(t.pattern())},
                {"summary", sum}};
  return p;
}

std::string summary_text(const std::vector<Watched>& ws, const Result& r, double wall_s, double cpu_pct, bool live,
                         const std::string& source) {
  std::string o = fmt::format("watch: {:.1f} s of {}{}\n", wall_s, source,
                              live ? fmt::format(", the watch itself {:.2f}% of a core", cpu_pct) : "");
  for (std::size_t i = 0; i < ws.size(); ++i) {
    const Watched& w = ws[i];
    const json& sum = r.points.at(i).info["summary"];  // point_of's, one per GPU in ws's order
    if (w.tracker.util_samples() == 0)
      o += fmt::format("  GPU{} {}: {} samples, no utilization reading (every value empty: N/A, [Not Supported])",
                       w.id.index, w.id.name, w.tracker.samples());
    else
      o += fmt::format("  GPU{} {}: {} samples, mean utilization {:.0f}%", w.id.index, w.id.name,
                       w.tracker.samples(), sum.value("mean_util_pct", 0.0));
    std::vector<std::string> shares;
    for (const auto& [k, v] : sum["pattern_share_pct"].items())
      if (v.get<double>() > 0) shares.push_back(fmt::format("{} {:.0f}%", k, v.get<double>()));
    o += shares.empty() ? "\n" : fmt::format("; time {}\n", fmt::join(shares, ", "));
    const double loaded = sum.value("loaded_s", 0.0);
    if (w.tracker.throttled_s() > 0)
      o += fmt::format("    throttled {:.1f} s of {:.1f} s under load\n", w.tracker.throttled_s(), loaded);
    for (const auto& e : w.tracker.stuck_episodes())
      o += fmt::format("    STUCK from t={:.1f} s{}, {:.1f} GiB held{}\n", e.start_s,
                       e.end_s < 0 ? " to the end" : fmt::format(" to t={:.1f} s", e.end_s), e.mem_used_mib / 1024,
                       e.on_stuck_rc == -1000 ? "" : fmt::format(", --on-stuck exit {}", e.on_stuck_rc));
  }
  const bool any_util =
      std::any_of(ws.begin(), ws.end(), [](const Watched& w) { return w.tracker.util_samples() > 0; });
  if (r.findings.empty())
    o += any_util ? "findings: none (healthy or idle throughout)\n"
                  : "findings: none: no utilization reading to judge a pattern by\n";
  else o += "findings:\n";
  for (const auto& f : r.findings) o += "  - " + f.summary + "\n";
  return o;
}

// Where the view goes (stdout, or stderr while a command shares the terminal or --json - has
// stdout), and what it has drawn: a terminal is redrawn in place, else plain lines now and then.
struct View {
  FILE* f;
  int fd;
  bool tty;
  double every;
  bool dead = false;  // the reader of the view went away (EPIPE): the watch goes on
  int drawn = 0;      // lines of the live view on screen
  double next = 0;

  View(const Args& a, bool exec)
      : f(exec || a.stdout_taken ? stderr : stdout),
        fd(fileno(f)),
        tty(a.live && !exec && isatty(fd)),
        every(a.print_every_s > 0 ? a.print_every_s : tty ? 0.25 : exec ? 10.0 : 1.0) {}

  void draw(const std::vector<std::string>& alarms, double t, bool stop, const std::vector<Watched>& ws, bool exec,
            int interval_ms, std::vector<std::string>& notes) {
    if (dead) {
      for (const auto& al : alarms) notes.push_back(al);
      return;
    }
    if (alarms.empty() && t < next && !stop) return;
    const int cols = terminal_width(fd);
    std::string text;
    if (tty && drawn > 0) text += fmt::format("\x1b[{}A", drawn);  // back to the top of the view
    for (const auto& al : alarms) text += (tty ? "\r\x1b[2K" : "") + al + "\n";
    if (tty) {
      text += "\r\x1b[2K" + fit(fmt::format("stallbench watch  {:.0f} s  every {} ms  Ctrl-C ends", t, interval_ms), cols) + "\n";
      for (const auto& w : ws) text += "\r\x1b[2K" + live_line(w, cols) + "\n";
      drawn = int(ws.size()) + 1;
    } else if (t >= next || stop) {
      for (const auto& w : ws) text += (exec ? "watch: " : "") + plain_line(w, t) + "\n";
    }
    if (std::fputs(text.c_str(), f) < 0 || std::fflush(f) != 0) {
      dead = true;  // EPIPE: nobody reads the view; the watch and its JSON go on
      clearerr(f);
    }
    if (t >= next) next = t + every;
  }
};

// --from: a recorded nvidia-smi or dcgmi dmon log, classified as a live watch would have.
Outcome run_from_log(const Args& a, const std::function<bool(int)>& wanted,
                     const std::function<json(const std::string&, const std::string&, const json&)>& meta_for) {
  std::vector<Watched> ws;
  Outcome out;
  Result& r = out.result;
  r.scenario = "watch";
  const telemetry::Recording rec = telemetry::read_telemetry(a.from, a.from_interval_ms);
  std::map<int, std::size_t> slot;
  for (const auto& s : rec.samples) {
    if (!wanted(s.gpu)) continue;
    auto it = slot.find(s.gpu);
    if (it == slot.end()) {
      it = slot.emplace(s.gpu, ws.size()).first;
      GpuIdentity id;
      id.index = s.gpu;
      id.name = rec.format + " log";
      ws.push_back({id, ws.size(), GpuTracker(s.gpu, a.opt)});
    }
    ws[it->second].tracker.add(s);
  }
  if (ws.empty())
    throw UsageError(fmt::format("{}: no sample of the GPUs asked for (--gpu {})", a.from, a.gpus));
  std::sort(ws.begin(), ws.end(), [](const Watched& x, const Watched& y) { return x.id.index < y.id.index; });
  double wall = 0;
  for (auto& w : ws) {
    w.tracker.finish();
    wall = std::max(wall, w.tracker.duration_s());
  }
  // Stuck is utilization 0 with memory held, and a log lists no processes: without a memory-used
  // reading (dcgmi dmon -e without 252, FBUSD) it cannot be told, which the report says.
  std::vector<std::string> notes = rec.notes;
  std::map<int, std::string> no_memory;
  for (const auto& w : ws)
    if (w.tracker.mem_samples() == 0) {
      no_memory[w.id.index] = fmt::format(
          "GPU {}: no memory-used reading in the log ({}): stuck (utilization 0 with memory held) cannot be "
          "detected, and the memory used is not known",
          w.id.index, rec.format == "dcgmi" ? "add field 252, FBUSD, to dcgmi dmon -e" : "add memory.used to --query-gpu");
      notes.push_back(no_memory[w.id.index]);
    }
  const json props{{"source", rec.format}, {"file", a.from}, {"columns", rec.columns}, {"ignored", rec.ignored},
                   {"notes", notes}};
  r.meta = meta_for(fmt::format("cuda:{}", ws.front().id.index), rec.format + " log", props);
  r.params = json{{"source", json::array({rec.format})}, {"gpus", json::array({a.gpus})}};
  bool stuck = false;
  for (const auto& w : ws) {
    const json sum = w.tracker.summary();
    r.points.push_back(point_of(w, sum, 0, false));
    if (no_memory.count(w.id.index)) {
      Point& p = r.points.back();
      p.info["stuck_undetectable"] = no_memory[w.id.index];
      for (Metric& m : p.metrics)  // the table and the HTML report show the note beside "stuck 0 s"
        if (m.name == "stuck") m.note = "not detectable: the log has no memory-used reading (" +
                                        std::string(rec.format == "dcgmi" ? "FBUSD, field 252" : "memory.used") + ")";
    }
    if (w.tracker.util_samples() == 0) {  // "mean utilization 0%" would read as idle
      r.points.back().status = Status::skipped;
      r.points.back().reason = "no utilization reading in the log: every value empty (N/A, [Not Supported])";
    }
    add_findings(r, w, sum);
    stuck = stuck || !w.tracker.stuck_episodes().empty();
  }
  out.summary = summary_text(ws, r, wall, 0, false, fmt::format("{} ({}, {} samples)", a.from, rec.format,
                                                                rec.samples.size()));
  for (const auto& n : notes) out.summary += "note: " + n + "\n";
  // As live: a stuck alarm in the log is exit 4, so a post-mortem gate sees it.
  out.exit_code = stuck ? kExitHang : 0;
  return out;
}

}  // namespace

std::string short_hint(Pattern p) {
  switch (p) {
    case Pattern::spiky: return "loader: raise dataloader_num_workers, pin_memory";
    case Pattern::steady_low: return "dtype/batch: bf16, then micro_batch_size";
    case Pattern::stuck: return "hang: dump stacks (py-spy), Flight Recorder, analyze-hang";
    case Pattern::idle: return "no work";
    case Pattern::healthy: return "ok";
  }
  return "";
}

std::vector<int> parse_gpu_list(const std::string& s) {
  if (s == "all") return {};
  std::vector<int> out;
  std::size_t i = 0;
  while (i <= s.size()) {
    const std::size_t j = std::min(s.find(',', i), s.size());
    const std::string item = s.substr(i, j - i);
    if (item.empty() || item.size() > 4 || item.find_first_not_of("0123456789") != std::string::npos)
      throw UsageError(fmt::format("--gpu {}: expected all, or GPU indices separated by commas (0,1)", s));
    out.push_back(std::stoi(item));
    i = j + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Outcome run(const Args& a, const std::function<json(const std::string&, const std::string&, const json&)>& meta_for,
            const std::function<void(const Result&)>& write_json) {
  const std::vector<int> want = parse_gpu_list(a.gpus);
  auto wanted = [&](int i) { return want.empty() || std::find(want.begin(), want.end(), i) != want.end(); };
  std::vector<Watched> ws;
  Outcome out;
  Result& r = out.result;
  r.scenario = "watch";

  if (!a.from.empty()) return run_from_log(a, wanted, meta_for);

  // ---- live, through NVML ----
  std::string why;
  std::unique_ptr<NvmlSession> nvml = NvmlSession::open(why);
  if (!nvml && !a.exec.empty()) return run_exec_without_gpus(a, meta_for, write_json, why);
  if (!nvml) throw UsageError("watch: cannot read the GPUs through NVML: " + why);
  for (std::size_t i = 0; i < nvml->gpus().size(); ++i)
    if (wanted(nvml->gpus()[i].index)) ws.push_back({nvml->gpus()[i], i, GpuTracker(nvml->gpus()[i].index, a.opt)});
  if (ws.empty()) throw UsageError(fmt::format("--gpu {}: NVML sees GPUs 0..{}", a.gpus, nvml->gpus().size() - 1));
  if (!why.empty()) std::fprintf(stderr, "watch: %s\n", why.c_str());  // a GPU NVML could not open

  SignalScope signals;
  const bool exec = !a.exec.empty();
  // The job's process group: stallbench's own with a terminal (Ctrl-C reaches
  // both, and the job can read the terminal), one of its own otherwise.
  const bool child_group = exec && !isatty(STDIN_FILENO);
  ChildGuard child;
  int child_rc = -1;
  std::optional<ProgressWatch> pw;  // the job's own progress: its output's step lines, its files
  if (exec) {
    std::string err;
    pw.emplace(progress_options(a));
    child.pid = spawn(a.exec, pw->child_env(), child_group, SIGTERM, !signals.pipe_was_ignored(), err,
                      pw->child_stdout(), pw->child_stderr());
    child.group = child_group;
    if (child.pid < 0) throw UsageError(fmt::format("--exec: cannot run {}: {}", a.exec[0], err));
    pw->started();
  }
  View view(a, exec);

  const json props{{"source", "nvml"},
                   {"library", nvml->library()},
                   {"driver", nvml->driver_version()},
                   {"process_query", nvml->process_query()},  // which ..._ComputeRunningProcesses ("": none)
                   {"interval_ms", a.interval_ms},
                   {"gpus", [&] {
                      json g = json::array();
                      for (const auto& w : ws)
                        g.push_back({{"index", w.id.index}, {"name", w.id.name}, {"uuid", w.id.uuid},
                                     {"mem_total_mib", w.id.mem_total_mib}, {"sm_clock_max_mhz", w.id.sm_clock_max_mhz},
                                     {"power_limit_w", w.id.power_limit_w}});
                      return g;
                    }()}};
  r.meta = meta_for(fmt::format("cuda:{}", ws.front().id.index), ws.front().id.name, props);
  r.params = json{{"source", json::array({"nvml"})}, {"gpus", json::array({a.gpus})}, {"interval_ms", json::array({a.interval_ms})}};
  if (exec) r.params["exec"] = json::array({fmt::format("{}", fmt::join(a.exec, " "))});

  const auto t0 = Clock::now();
  const double cpu0 = cpu_seconds_self();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  auto cpu_pct = [&] {
    const double wall = elapsed();
    return wall > 0 ? 100 * (cpu_seconds_self() - cpu0) / wall : 0.0;
  };

  // ---- the sampler: NVML read on a thread of its own, so that a GPU whose
  // NVML calls block (a wedged driver) cannot stop signals, the job's reaping
  // or the view; the loop below notices when rounds stop coming.
  struct Round {
    double t = 0;
    std::vector<std::pair<std::size_t, LiveSample>> samples;  // (index into ws, sample)
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Round> rounds;
  bool stop_sampling = false, sampler_done = false;
  std::vector<char> skip(ws.size(), 0);  // GPUs no longer read (lost); guarded by mu
  std::int64_t rounds_taken = 0;
  std::thread sampler([&] {
    const auto period = std::chrono::milliseconds(a.interval_ms);
    auto next = Clock::now();
    for (std::int64_t n = 0; a.count <= 0 || n < a.count; ++n) {
      Round rd;
      rd.t = elapsed();
      std::vector<char> sk;
      {
        std::lock_guard lk(mu);
        if (stop_sampling) break;
        sk = skip;
      }
      for (std::size_t i = 0; i < ws.size(); ++i)
        if (!sk[i]) rd.samples.emplace_back(i, nvml->sample(ws[i].slot));
      {
        std::lock_guard lk(mu);
        rounds.push_back(std::move(rd));
        ++rounds_taken;
      }
      next += period;  // no wake-up per round: the loop below takes what has come every 100 ms
      std::unique_lock lk(mu);
      if (next < Clock::now()) next = Clock::now();  // behind: no burst of catch-up samples
      if (cv.wait_until(lk, next, [&] { return stop_sampling; })) break;
    }
    std::lock_guard lk(mu);
    sampler_done = true;
    cv.notify_all();
  });
  // Stops the sampler; a thread stuck inside NVML is left behind with the
  // session (both leaked: the process is about to end, and nvmlShutdown under
  // a blocked call is not safe).
  auto stop_sampler = [&] {
    {
      std::lock_guard lk(mu);
      stop_sampling = true;
    }
    cv.notify_all();
    std::unique_lock lk(mu);
    if (cv.wait_for(lk, std::chrono::seconds(3), [&] { return sampler_done; })) {
      lk.unlock();
      sampler.join();
    } else {
      lk.unlock();
      sampler.detach();
      (void)nvml.release();
      std::fprintf(stderr, "watch: NVML did not return within 3 s of the end: left behind\n");
    }
  };
  struct SamplerGuard {
    std::function<void()> f;
    ~SamplerGuard() {
      if (f) f();
    }
  } sampler_guard{stop_sampler};

  auto build = [&](bool final) {
    Result cur;
    cur.meta = r.meta;
    cur.scenario = r.scenario;
    cur.params = r.params;
    const double cpu = cpu_pct();
    for (auto& w : ws) {
      const json sum = w.tracker.summary();  // once per GPU: it carries the whole series
      cur.points.push_back(point_of(w, sum, cpu, true));
      add_findings(cur, w, sum);
    }
    cur.meta["watch"] = json{{"final", final}, {"wall_s", elapsed()}, {"child_exit_code", child_rc}};
    return cur;
  };
  bool json_warned = false;
  auto write_now = [&](bool final) {
    if (!write_json) return;
    try {
      write_json(build(final));
    } catch (const Error& e) {
      if (final) throw;
      if (!json_warned) std::fprintf(stderr, "watch: the result JSON could not be written (%s); the watch goes on\n", e.what());
      json_warned = true;
    }
  };

  std::optional<OnStuck> on_stuck;
  std::deque<std::pair<std::size_t, std::size_t>> stuck_queue;  // (ws index, episode index) waiting for --on-stuck
  double next_json = 60, last_round_t = 0, kill_at = -1;
  bool stop = false, any_alarm = false, nvml_stall_said = false, all_lost_said = false;
  const double stall_after = std::max(5.0, 20.0 * a.interval_ms / 1000.0);
  std::vector<std::string> notes;  // said once, kept for the summary

  auto start_on_stuck = [&](std::vector<std::string>& alarms) {
    if (on_stuck || stuck_queue.empty()) return;
    const auto [wi, ei] = stuck_queue.front();
    stuck_queue.pop_front();
    const StuckEpisode& e = ws[wi].tracker.stuck_episodes().at(ei);
    std::vector<std::string> env = {fmt::format("STALLBENCH_STUCK_GPU={}", ws[wi].id.index),
                                    fmt::format("STALLBENCH_STUCK_PIDS={}", fmt::join(e.pids, ",")),
                                    fmt::format("STALLBENCH_STUCK_SECONDS={:.0f}", e.alarm_s - e.start_s)};
    if (child.pid > 0) env.push_back(fmt::format("STALLBENCH_CHILD_PID={}", child.pid));
    std::string err;
    const pid_t pid = spawn({"/bin/sh", "-c", a.on_stuck}, env, true, SIGKILL, !signals.pipe_was_ignored(), err);
    if (pid > 0)
      on_stuck = OnStuck{pid,
                         Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(a.on_stuck_timeout_s)),
                         wi, ei, ws[wi].id.index};
    else
      alarms.push_back("watch: --on-stuck could not start: " + err);
  };
  auto poll_on_stuck = [&](std::vector<std::string>& alarms) {
    if (!on_stuck) return;
    int status = 0;
    const pid_t got = waitpid(on_stuck->pid, &status, WNOHANG);
    if (got == on_stuck->pid) {
      ws[on_stuck->watched].tracker.set_on_stuck_rc(on_stuck->episode, exit_code_of(status));
      on_stuck.reset();
    } else if (Clock::now() > on_stuck->deadline) {
      kill(-on_stuck->pid, SIGKILL);
      (void)reap_within(on_stuck->pid, 5);
      ws[on_stuck->watched].tracker.set_on_stuck_rc(on_stuck->episode, -1);
      alarms.push_back(fmt::format("watch: --on-stuck killed after {:.0f} s", a.on_stuck_timeout_s));
      on_stuck.reset();
    }
  };

  while (!stop) {
    std::vector<std::string> alarms;
    std::deque<Round> got;
    {
      std::unique_lock lk(mu);
      // every 100 ms (or the interval, when longer), or at once when the sampler is done: the
      // rounds since are taken together, so the loop's own cost does not grow with 1 / interval
      cv.wait_for(lk, std::chrono::milliseconds(std::max(a.interval_ms, 100)), [&] { return sampler_done; });
      got.swap(rounds);
    }
    const double t = elapsed();
    for (Round& rd : got) {
      last_round_t = rd.t;
      for (auto& [wi, ls] : rd.samples) {
        Watched& w = ws[wi];
        if (w.lost) continue;
        if (ls.error != 0) {
          ++w.errors;
          const bool unsupported = ls.error == nvml_abi::kErrorNotSupported;
          if (ls.lost || unsupported || ++w.consecutive_errors >= 10) {
            w.lost = true;
            w.lost_why = unsupported ? "NVML reports no utilization for this GPU (MIG mode or a vGPU): not watched"
                                     : ls.lost ? "the GPU is lost (fell off the bus: see dmesg for Xid 79): " + ls.error_text
                                               : "NVML stopped answering: " + ls.error_text;
            alarms.push_back(fmt::format("watch: GPU{} {}", w.id.index, w.lost_why));
            std::lock_guard lk(mu);
            skip[wi] = 1;
          }
          continue;
        }
        w.consecutive_errors = 0;
        ls.s.t_s = rd.t;
        std::vector<unsigned> pids;
        std::vector<double> mib;
        for (const auto& p : ls.processes) {
          pids.push_back(p.pid);
          mib.push_back(p.used_mib);
        }
        if (w.tracker.add(ls.s, ls.processes_known ? &pids : nullptr, ls.processes_known ? &mib : nullptr)) {
          any_alarm = true;
          const int ei = w.tracker.open_episode();
          const StuckEpisode& e = w.tracker.stuck_episodes().at(std::size_t(ei));
          alarms.push_back(fmt::format("watch: ALARM GPU{} stuck: utilization 0 with {:.1f} GiB held for {:.0f} s{}",
                                       w.id.index, e.mem_used_mib / 1024, w.tracker.stuck_for_s(),
                                       e.pids.empty() ? "" : fmt::format(" (pids {})", fmt::join(e.pids, ","))));
          if (!a.on_stuck.empty()) stuck_queue.emplace_back(wi, std::size_t(ei));
        }
      }
    }
    // NVML blocked: no round for a while (the sampler is inside a call)
    bool done;
    {
      std::lock_guard lk(mu);
      done = sampler_done;
    }
    if (!done && t - last_round_t > stall_after && !nvml_stall_said) {
      alarms.push_back(fmt::format("watch: ALARM NVML has not answered for {:.0f} s: the driver or a GPU is wedged "
                                   "(nvidia-smi will hang too; see dmesg)",
                                   t - last_round_t));
      notes.push_back(alarms.back());
      nvml_stall_said = true;
      any_alarm = true;  // a wedged driver is a hang too: exit 4
    }
    poll_on_stuck(alarms);
    start_on_stuck(alarms);
    if (pw && progress_alarm(*pw, t, child, a.kill_after_s, kill_at, alarms)) any_alarm = true;
    // signals: forwarded to the job, or the end of the watch
    for (auto [sig, from_process] : signals.take()) {
      if (exec && child.pid > 0) {
        if (from_process || child_group) kill(child.pid, sig);
        if ((sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT) && kill_at < 0) kill_at = t + a.kill_after_s;
      } else {
        stop = true;
      }
    }
    if (exec && child.pid > 0) {
      int status = 0;
      const pid_t r2 = waitpid(child.pid, &status, WNOHANG);
      if (r2 == child.pid) {
        child_rc = exit_code_of(status);
        child.pid = -1;
        stop = true;
      } else if (kill_at >= 0 && t >= kill_at) {
        alarms.push_back(fmt::format("watch: {} still running {:.0f} s after the signal: SIGKILL", a.exec[0], a.kill_after_s));
        kill(child_group ? -child.pid : child.pid, SIGKILL);
        kill_at = -1;
      }
    }
    if (a.duration_s > 0 && t >= a.duration_s) stop = true;
    if (done && !exec) stop = true;  // --count reached
    bool all_lost = true;
    for (const auto& w : ws) all_lost &= w.lost;
    if (all_lost && !all_lost_said) {
      all_lost_said = true;
      notes.push_back("every watched GPU stopped answering");
      if (!exec) stop = true;
    }

    view.draw(alarms, t, stop, ws, exec, a.interval_ms, notes);
    if (!alarms.empty() || t >= next_json) {
      write_now(false);
      next_json = t + 60;
    }
  }
  // the end: a running --on-stuck finishes within its deadline (a second
  // signal cuts that short); alarms still queued are said, not run
  if (on_stuck) {
    std::vector<std::string> ignored;
    while (on_stuck && signals.take().empty()) {
      poll_on_stuck(ignored);
      struct timespec ts {0, 20'000'000};
      nanosleep(&ts, nullptr);
    }
    if (on_stuck) {
      kill(-on_stuck->pid, SIGKILL);
      (void)reap_within(on_stuck->pid, 5);
      ws[on_stuck->watched].tracker.set_on_stuck_rc(on_stuck->episode, -1);
      on_stuck.reset();
    }
  }
  if (!stuck_queue.empty())
    notes.push_back(fmt::format("--on-stuck not run for {} alarm(s): the watch ended first", stuck_queue.size()));
  sampler_guard.f = nullptr;
  stop_sampler();
  for (auto& w : ws) w.tracker.finish();
  const double cpu = cpu_pct();
  r = build(true);
  r.meta["watch"]["rounds"] = rounds_taken;
  if (pw) pw->finish(), r.meta["watch"]["progress"] = pw->summary();
  if (!notes.empty()) r.meta["watch"]["notes"] = notes;
  bool all_lost = true;
  for (const auto& w : ws) all_lost &= w.lost;
  out.exit_code = exec ? (child_rc >= 0 ? child_rc : 0) : all_lost ? kExitFailure : any_alarm ? kExitHang : 0;
  std::string source = fmt::format("NVML every {} ms", a.interval_ms);
  if (exec)
    source += child_rc >= 0 ? fmt::format(", {} exited {}", a.exec[0], child_rc)
                            : fmt::format(", {} still running (pid {})", a.exec[0], child.pid);
  out.summary = summary_text(ws, r, elapsed(), cpu, true, source);
  for (const auto& n : notes) out.summary += "note: " + n + "\n";
  return out;
}

}  // namespace sb::watch
