// `stallbench watch`: a live job's GPUs through NVML, a command run under the watch (--exec), or a
// recorded nvidia-smi / dcgmi log (--from); the pattern, what it suggests and the stuck alarm.
#include "app/app.hpp"

#include <csignal>      // std::signal: SIGPIPE
#include <iostream>     // std::cout, std::cerr
#include <memory>       // std::make_shared
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/errors.hpp"      // UsageError
#include "harness/exit_codes.hpp"  // kExit*
#include "harness/files.hpp"       // check_writable_target, write_file_atomic, refuse_clobbering
#include "report/html.hpp"         // report::format_html
#include "watch/watch.hpp"         // watch::run

namespace sb::app {
namespace {

using json = nlohmann::ordered_json;

struct WatchCli {
  watch::Args a;
  std::string json_path;  // "": no file (a monitor writes none unless asked); "-": the final JSON on stdout
  std::string html_path;
};

int cmd_watch(WatchCli w, int argc, char** argv) {
  if (w.json_path == "-" && w.html_path == "-")
    throw UsageError("--json - and --html - both name stdout, where the two documents would run together: give one a file");
  if (w.json_path == "-" && !w.a.exec.empty())
    throw UsageError("--json - with --exec: the command's output owns stdout; give --json a file");
  w.a.stdout_taken = w.json_path == "-" || w.html_path == "-";
  if (!w.json_path.empty()) check_writable_target(w.json_path, "--json");
  if (!w.html_path.empty()) check_writable_target(w.html_path, "--html");
  refuse_clobbering({{w.json_path, "--json"}, {w.html_path, "--html"}}, {{w.a.from, "the log --from reads"}});
  auto meta_for = [&](const std::string& id, const std::string& name, const json& props) {
    DeviceInfo di;
    di.id = id;
    di.kind = DeviceKind::cuda;
    di.name = name;
    di.props = props;
    RunArgs ra;
    json meta = run_meta(ra, argc, argv, di, MeasureConfig{});
    meta["measure"]["timing"] = w.a.from.empty() ? fmt::format("NVML sampled every {} ms", w.a.interval_ms)
                                                 : "read from a recorded log";
    return meta;
  };
  const bool json_stdout = w.json_path == "-";
  auto write = [&](const Result& r) {  // at each alarm, every 60 s: a file only (stdout gets the final one)
    if (!w.json_path.empty() && !json_stdout)
      write_file_atomic(w.json_path, to_json(r).dump(2, ' ', false, json::error_handler_t::replace) + "\n");
  };
  watch::Outcome o = watch::run(w.a, meta_for, write);
  write(o.result);
  if (!w.html_path.empty()) write_file_atomic(w.html_path, report::format_html(o.result));
  // with --exec the command's output owns stdout, and with --json - the JSON does: the summary goes
  // to stderr. A reader that went away (watch | head) loses the summary, not the exit code.
  std::signal(SIGPIPE, SIG_IGN);
  std::ostream& out = w.a.exec.empty() && !w.a.stdout_taken ? std::cout : std::cerr;
  out << o.summary;
  std::vector<std::string> written;
  if (!w.json_path.empty() && !json_stdout) written.push_back("result: " + w.json_path);
  if (!w.html_path.empty()) written.push_back("report: " + w.html_path);
  if (!written.empty()) out << fmt::format("{}\n", fmt::join(written, ", "));
  if (json_stdout) write_file_atomic("-", to_json(o.result).dump(2, ' ', false, json::error_handler_t::replace) + "\n");
  return o.exit_code;
}

}  // namespace

Command add_watch(CLI::App& app, int& argc, char** argv, int* early_exit) {
  auto wc = std::make_shared<WatchCli>();
  // everything after --exec (and an optional --) is the command, taken before CLI11 sees the line
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) != "--exec") continue;
    if (i < 2 || std::string_view(argv[1]) != "watch") break;
    int first = i + 1;
    if (first < argc && std::string_view(argv[first]) == "--") ++first;
    for (int k = first; k < argc; ++k) wc->a.exec.emplace_back(argv[k]);
    if (wc->a.exec.empty()) {
      std::cerr << "stallbench: watch --exec: name the command to run, e.g. watch --exec -- python train.py\n";
      *early_exit = kExitUsage;
    }
    argc = i;
    break;
  }
  auto* watch_cmd = app.add_subcommand(
      "watch", "watch a live job's GPUs (NVML): the utilization pattern, what it suggests, the stuck alarm");
  watch_cmd->add_option("--gpu", wc->a.gpus, "all, or NVML indices: 0,1")->capture_default_str();
  auto* interval_opt = watch_cmd->add_option("--interval", wc->a.interval_ms, "milliseconds between samples (10-10000)")
                           ->capture_default_str()
                           ->check(CLI::Range(10, 10000));
  auto* duration_opt = watch_cmd->add_option("--duration", wc->a.duration_s, "seconds to watch (default: until Ctrl-C)")
                           ->check(finite_range(0.0, 1e7));
  auto* count_opt = watch_cmd->add_option("--count", wc->a.count, "stop after this many samples of each GPU (as nvidia-smi -c)")
                        ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 40));
  watch_cmd->add_option("--kill-after", wc->a.kill_after_s,
                        "--exec: SIGKILL the job this many seconds after a forwarded INT/TERM/HUP/QUIT")
      ->capture_default_str()
      ->check(finite_range(0.1, 86400.0));
  watch_cmd->add_option("--json", wc->json_path,
                        "write the result JSON to FILE at each alarm, every 60 s and at the end; - : once, at the "
                        "end, on stdout (the summary then goes to stderr); none unless asked")
      ->type_name("FILE|-")
      ->check(non_empty_path());
  watch_cmd->add_option("--html", wc->html_path, "also write the report as one self-contained HTML file")
      ->check(non_empty_path());
  watch_cmd->add_option("--stuck-after", wc->a.opt.stuck_after_s,
                        "seconds of utilization 0 with memory held before the stuck alarm; with --exec also the "
                        "least silence (no progress) before it, or 10x the job's median step gap when longer")
      ->capture_default_str()
      ->check(finite_range(0.0, 1e7));
  watch_cmd->add_option("--progress-file", wc->a.progress_files,
                        "--exec: a file whose growth is the job's progress, besides its output's step lines (the "
                        "run's trainer_state.json, a log file); repeatable")
      ->check(non_empty_path());
  watch_cmd->add_option("--fr-dir", wc->a.fr_dir,
                        "--exec: where the job's Flight Recorder dumps go; at a stuck alarm every rank is asked for "
                        "one (its dump pipes there) and analyze-hang reads them")
      ->capture_default_str()
      ->check(non_empty_path());
  watch_cmd->add_flag("--kill-on-stuck", wc->a.kill_on_stuck,
                      "--exec: end the job at the stuck alarm, after its dumps (default: it keeps running)");
  watch_cmd->add_option("--held-mib", wc->a.opt.held_mib, "memory used that counts as held, MiB (a process listed also counts)")
      ->capture_default_str()
      ->check(finite_range(0.0, 1e9));
  watch_cmd->add_option("--window", wc->a.opt.window_s, "seconds of samples the live pattern is named from")
      ->capture_default_str()
      ->check(finite_range(0.1, 86400.0));
  watch_cmd->add_option("--summary-window", wc->a.opt.summary_window_s,
                        "the summary names the pattern of each window of this many seconds")
      ->capture_default_str()
      ->check(finite_range(0.1, 86400.0));
  auto* on_stuck_opt = watch_cmd->add_option("--on-stuck", wc->a.on_stuck,
                                             "a shell command run at each stuck alarm (env STALLBENCH_STUCK_GPU, "
                                             "_PIDS, STALLBENCH_CHILD_PID), e.g. 'py-spy dump --pid $STALLBENCH_CHILD_PID'");
  watch_cmd->add_option("--on-stuck-timeout", wc->a.on_stuck_timeout_s, "seconds before --on-stuck is killed")
      ->capture_default_str()
      ->check(finite_range(0.1, 86400.0));
  watch_cmd->add_option("--print-every", wc->a.print_every_s,
                        "seconds between plain lines (default 1; 10 with --exec; a terminal refreshes in place)")
      ->check(finite_range(0.01, 86400.0));
  auto plain = std::make_shared<bool>(false);
  watch_cmd->add_flag("--plain", *plain, "plain lines even on a terminal");
  auto* from_opt = watch_cmd->add_option("--from", wc->a.from,
                                         "read recorded telemetry instead: nvidia-smi --query-gpu ... --format=csv "
                                         "output, or dcgmi dmon output")
                       ->check(non_empty_path());
  watch_cmd->add_option("--from-interval", wc->a.from_interval_ms,
                        "the log's interval in ms when it has no timestamps (dcgmi dmon -d; default 1000)")
      ->check(finite_range(1.0, 3.6e6));
  watch_cmd->footer("--exec -- CMD ARGS...  run CMD under the watch (last on the line): signals sent to stallbench "
                    "are forwarded to it, the watch ends when it does, and its exit code is returned. Its output "
                    "passes through stallbench (PYTHONUNBUFFERED=1 is set): a step line (tqdm's it/s, 'step N', the "
                    "Trainer's log dicts) is progress, and silence after steps is the stuck alarm, with or without "
                    "GPUs.\n"
                    "Exit codes: 0; 1 every watched GPU stopped answering; 2 bad input or no NVML; 4 a stuck or "
                    "NVML-not-answering alarm was raised (without --exec), or --from's log holds a stuck episode; with "
                    "--exec, the command's.");
  for (CLI::Option* o : {interval_opt, on_stuck_opt, count_opt}) from_opt->excludes(o);
  return {watch_cmd, [wc, plain, duration_opt, &argc, argv] {
            wc->a.live = !*plain;
            if (!wc->a.exec.empty() && !wc->a.from.empty())
              throw UsageError("watch: --from reads a recorded log; --exec runs a command to watch live: one or the other");
            if (!wc->a.exec.empty() && duration_opt->count() > 0)
              throw UsageError("watch --exec: the watch lasts as long as the command; --duration does not apply");
            return cmd_watch(*wc, argc, argv);
          }};
}

}  // namespace sb::app
