#include "watch/exec_only.hpp"

#include <signal.h>  // kill
#include <unistd.h>  // isatty, usleep
#include <sys/wait.h>  // waitpid

#include <chrono>    // std::chrono
#include <cstdio>    // std::fprintf
#include <optional>  // std::optional

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/errors.hpp"      // UsageError
#include "harness/exit_codes.hpp"  // kExitHang
#include "watch/child.hpp"         // SignalScope, spawn, ChildGuard, exit_code_of
#include "watch/progress.hpp"      // ProgressWatch

namespace sb::watch {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

ProgressOptions progress_options(const Args& a) {
  ProgressOptions o;
  o.stuck_after_s = a.opt.stuck_after_s;
  o.files = a.progress_files;
  o.fr_dir = a.fr_dir;
  o.kill_on_stuck = a.kill_on_stuck;
  return o;
}

std::optional<std::string> progress_alarm(ProgressWatch& pw, double t, const ChildGuard& child, double kill_after_s,
                                         double& kill_at, std::vector<std::string>& alarms) {
  const auto alarm = pw.poll(t);
  if (!alarm) return alarm;
  // said at once (the view is stderr with --exec): the dumps and stacks below take seconds
  std::fprintf(stderr, "%s\n", alarm->c_str());
  for (auto& line : pw.on_stuck(child.pid, t)) alarms.push_back(std::move(line));
  if (pw.kill_on_stuck() && child.pid > 0) {
    alarms.push_back(fmt::format("watch: --kill-on-stuck: ending the job (TERM, then KILL after {:.0f} s)", kill_after_s));
    kill(child.group ? -child.pid : child.pid, SIGTERM);
    if (kill_at < 0) kill_at = t + kill_after_s;
  }
  return alarm;
}

Outcome run_exec_without_gpus(const Args& a,
                              const std::function<json(const std::string&, const std::string&, const json&)>& meta_for,
                              const std::function<void(const Result&)>& write_json, const std::string& why_no_gpus) {
  std::fprintf(stderr, "watch: no GPU to read through NVML (%s): watching %s by its progress alone\n",
               why_no_gpus.c_str(), a.exec[0].c_str());
  SignalScope signals;
  const bool child_group = !isatty(STDIN_FILENO);
  ProgressWatch pw(progress_options(a));
  ChildGuard child;
  std::string err;
  child.pid = spawn(a.exec, pw.child_env(), child_group, SIGTERM, !signals.pipe_was_ignored(), err, pw.child_stdout(),
                    pw.child_stderr());
  child.group = child_group;
  if (child.pid < 0) throw UsageError(fmt::format("--exec: cannot run {}: {}", a.exec[0], err));
  pw.started();

  Outcome out;
  Result& r = out.result;
  r.scenario = "watch";
  r.meta = meta_for("cpu", "no GPU (NVML: " + why_no_gpus + ")", json{{"source", "progress"}, {"nvml", why_no_gpus}});
  r.params = json{{"source", json::array({"progress"})}, {"exec", json::array({fmt::format("{}", fmt::join(a.exec, " "))})}};
  const auto t0 = Clock::now();
  int child_rc = -1;
  double kill_at = -1;
  bool stuck = false;
  std::vector<std::string> said;
  auto build = [&](bool final) {
    Result cur;
    cur.meta = r.meta;
    cur.scenario = r.scenario;
    cur.params = r.params;
    const json prog = pw.summary();
    Point p;
    p.params = json{{"source", "progress"}};
    p.status = Status::ok;
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    p.metrics.push_back({"steps_seen", double(prog["steps_seen"].get<std::size_t>()), "count", Direction::none, {}, ""});
    p.metrics.push_back({"stuck_alarms", double(prog["alarms"].size()), "count", Direction::lower, {}, ""});
    p.metrics.push_back({"wall", wall, "s", Direction::none, {}, ""});
    cur.points.push_back(std::move(p));
    if (stuck)
      cur.findings.push_back({"hang", "the job stopped making progress (no step line, no progress file change)",
                              std::nullopt, json{{"check", "progress"}, {"progress", prog}}});
    cur.meta["watch"] = json{{"final", final}, {"wall_s", wall}, {"child_exit_code", child_rc}, {"progress", prog}};
    return cur;
  };
  while (child.pid > 0) {
    ::usleep(100'000);
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    for (auto [sig, from_process] : signals.take()) {
      if (from_process || child_group) kill(child.pid, sig);
      if ((sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT) && kill_at < 0) kill_at = t + a.kill_after_s;
    }
    std::vector<std::string> alarms;
    if (const auto alarm = progress_alarm(pw, t, child, a.kill_after_s, kill_at, alarms)) {
      stuck = true;
      said.push_back(*alarm);
    }
    for (const auto& al : alarms) std::fprintf(stderr, "%s\n", al.c_str());
    said.insert(said.end(), alarms.begin(), alarms.end());
    if (!alarms.empty() && write_json) write_json(build(false));
    int status = 0;
    if (waitpid(child.pid, &status, WNOHANG) == child.pid) {
      child_rc = exit_code_of(status);
      child.pid = -1;
    } else if (kill_at >= 0 && t >= kill_at) {
      kill(child_group ? -child.pid : child.pid, SIGKILL);
      kill_at = -1;
    }
  }
  pw.finish();
  r = build(true);
  if (!said.empty()) r.meta["watch"]["notes"] = said;
  out.exit_code = child_rc >= 0 ? child_rc : 0;
  const json prog = r.meta["watch"]["progress"];
  out.summary = fmt::format("watch: {} exited {} after {:.0f} s; {} progress step(s) seen; {}\n", a.exec[0], child_rc,
                            r.meta["watch"]["wall_s"].get<double>(), prog["steps_seen"].get<std::size_t>(),
                            stuck ? "STUCK: it stopped making progress (above: the dumps and what they say)"
                                  : "no stuck alarm");
  if (prog.contains("note")) out.summary += "note: " + prog["note"].get<std::string>() + "\n";
  return out;
}

}  // namespace sb::watch
