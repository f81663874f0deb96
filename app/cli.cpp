// The stallbench command line. CLI11 is heavy, so it lives in this one
// translation unit. Exit codes (README "Exit codes"):
//   0 success; 1 a point failed or a library call failed; 2 bad input;
//   3 compare: a metric is worse than --tolerance; 4 a hang was caught;
//   5 collective: a rank's library failed a collective (a mismatch that
//   errored instead of hanging); the job was ended after the dumps.
#include <sys/stat.h>  // fstat: is stdout a pipe
#include <unistd.h>  // getpid

#include <algorithm>  // std::find, std::any_of
#include <cerrno>    // errno, ERANGE
#include <csignal>   // std::signal: SIGPIPE in watch
#include <chrono>    // std::chrono::system_clock
#include <cmath>     // std::isfinite
#include <cstdio>    // std::fputs
#include <cstdlib>   // std::strtod
#include <ctime>     // std::gmtime
#include <filesystem>  // std::filesystem::temp_directory_path
#include <iostream>  // std::cout, std::cerr
#include <memory>    // std::make_shared: what the watchdog saves
#include <mutex>     // std::mutex
#include <optional>  // std::optional
#include <string_view>  // std::string_view
#include <thread>    // std::this_thread::sleep_for

#include <CLI/CLI.hpp>    // CLI::App
#include <fmt/format.h>   // fmt::format
#include <fmt/ranges.h>   // fmt::join

#include "harness/compare.hpp"      // compare_docs
#include "harness/errors.hpp"       // Error, UsageError
#include "harness/expected.hpp"     // match_expected
#include "harness/files.hpp"        // check_writable_target
#include "harness/fingerprint.hpp"  // machine_fingerprint, build_info
#include "harness/printer.hpp"      // format_result_table
#include "harness/runner.hpp"       // run_scenario
#include "harness/kineto_trace.hpp"  // KinetoTrace: --trace
#include "harness/temp_files.hpp"   // install_temp_file_cleanup
#include "harness/units.hpp"        // format_bytes
#include "harness/watchdog.hpp"     // Watchdog
#include "kernels/backends.hpp"     // all_backends, open_device, open_process_group
#include "scenarios/collective/hang_analysis.hpp"  // analyze_hang_dir
#include "scenarios/dataloader/dataset_file.hpp"   // dataset_cache_dir, clean_dataset_cache
#include "scenarios/diagnose/config.hpp"           // read_axolotl_yaml, apply_model_config, read_lengths
#include "scenarios/diagnose/diagnose.hpp"         // diagnose::run, format_report
#include "scenarios/diagnose/trace_diagnose.hpp"   // diagnose_trace
#include "harness/exit_codes.hpp"  // kExit*
#include "watch/watch.hpp"          // watch::run

namespace sb {
namespace {

using json = nlohmann::ordered_json;


std::string utc_now() {
  const auto t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string scenario_names() {
  std::vector<std::string> v;
  for (const Scenario* s : all_scenarios()) v.push_back(s->name);
  return fmt::format("{}", fmt::join(v, ", "));
}

// An empty path would silently become the default file name.
CLI::Validator non_empty_path() {
  return CLI::Validator([](std::string& text) { return text.empty() ? std::string("the path is empty") : std::string(); },
                        "PATH");
}

// CLI::Range lets NaN through (every comparison with NaN is false): a NaN
// --tolerance once disabled the regression gate. A number here must be finite
// and in [lo, hi].
CLI::Validator finite_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v))
          return fmt::format("'{}' is not a finite number", text);
        if (v < lo || v > hi) return fmt::format("{} is outside [{}, {}]", text, lo, hi);
        return std::string();
      },
      fmt::format("FLOAT in [{} - {}]", lo, hi));
}

// Every scenario, or only `only` (run SCENARIO --help prints its parameters).
int cmd_list(bool names_only, bool as_json, const std::string& only = "") {
  if (names_only) {
    for (const Scenario* s : all_scenarios()) std::cout << s->name << "\n";
    return kExitOk;
  }
  json out = json::array();
  for (const Scenario* s : all_scenarios()) {
    if (!only.empty() && s->name != only) continue;
    json ps = json::array();
    for (const auto& p : s->params)
      ps.push_back(json{{"name", p.name},
                        {"type", to_string(p.type)},
                        {"default", p.default_value},
                        {"gpu_default", p.gpu_default},
                        {"quick_default", p.quick_default},
                        {"range", describe_range(p)},
                        {"unit", p.unit},
                        {"help", p.help}});
    // needs_ranks: launched under mpirun/srun to mean anything (the smoke test reads it).
    out.push_back(json{{"name", s->name}, {"cause", s->cause}, {"summary", s->summary},
                       {"needs_ranks", s->needs_ranks}, {"params", ps}});
  }
  if (as_json) {
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  for (const auto& s : out) {
    std::cout << fmt::format("{:<12} {}\n{:<12} cause: {}\n", s["name"].get<std::string>(),
                             s["summary"].get<std::string>(), "", s["cause"].get<std::string>());
    std::size_t w = 12;  // the name column: the scenario's longest name (load_us_per_token) sets it
    for (const auto& p : s["params"]) w = std::max(w, p["name"].get<std::string>().size());
    for (const auto& p : s["params"]) {
      std::string def = p["default"].get<std::string>();
      if (!p["gpu_default"].get<std::string>().empty()) def += fmt::format(" (gpu: {})", p["gpu_default"].get<std::string>());
      if (!p["quick_default"].get<std::string>().empty()) def += fmt::format(" (--quick: {})", p["quick_default"].get<std::string>());
      std::cout << fmt::format("    -p {:<{}} {:<6} default {}\n    {:<{}} {:<6} range {}{}  {}\n",
                               p["name"].get<std::string>(), w, p["type"].get<std::string>(), def, "", w + 3, "",
                               p["range"].get<std::string>(),
                               p["unit"].get<std::string>().empty() ? "" : " " + p["unit"].get<std::string>(),
                               p["help"].get<std::string>());
    }
    std::cout << "\n";
  }
  return kExitOk;
}

int cmd_devices(bool as_json) {
  json fp = machine_fingerprint(all_backends());
  if (as_json) {
    // What this binary was built with (features found at configure): a script can tell
    // whether it may launch a multi-rank scenario under mpirun, or expect cuDNN.
    const BuildInfo b = build_info();
    fp["build"] = json{{"version", b.version}, {"git_sha", b.git_sha}, {"compiler", b.compiler},
                       {"build_type", b.build_type}, {"features", b.features}};
    std::cout << fp.dump(2) << "\n";
    return kExitOk;
  }
  const json& cpu = fp["cpu"];
  std::cout << fmt::format("cpu      {}\n         {} logical cores; ISA: {}\n", cpu["model"].get<std::string>(),
                           cpu["logical_cores"].get<int>(),
                           cpu["isa"].empty() ? std::string("none of interest")
                                              : fmt::format("{}", fmt::join(cpu["isa"].get<std::vector<std::string>>(), " ")));
  {
    // which expected-numbers file a cpu run is compared with (matched on ISA, cores, vendor, family)
    DeviceInfo host;
    host.kind = DeviceKind::cpu;
    const CpuInfo ci = read_cpu_info();
    const auto ex = match_expected(host, ci);
    std::cout << fmt::format("         {}{}; expected numbers: {}\n", ci.vendor.empty() ? "vendor unknown" : ci.vendor,
                             ci.family >= 0 ? fmt::format(" family {}", ci.family) : std::string(),
                             ex ? ex->id() : std::string("none for this CPU (results/expected)"));
  }
  for (const auto& [backend, v] : fp["versions"].items()) {
    std::string line;
    for (const auto& [k, x] : v.items())
      if (k != "unavailable") line += fmt::format("{}={} ", k, x.is_string() ? x.get<std::string>() : x.dump());
    std::cout << fmt::format("{:<8} {}\n", backend, line);
  }
  for (const auto& g : fp["gpus"]) {
    std::cout << fmt::format("{:<8} {}\n", g["id"].get<std::string>(), g["name"].get<std::string>());
    for (const auto& [k, x] : g["props"].items())
      std::cout << fmt::format("         {}: {}\n", k, x.is_string() ? x.get<std::string>() : x.dump());
  }
  for (const auto& [backend, v] : fp["versions"].items())
    if (v.contains("unavailable")) std::cout << fmt::format("{:<8} {}\n", backend, v["unavailable"].get<std::string>());
  if (!fp["versions"].contains("cuda")) std::cout << "cuda     not built (configure with -Dcuda=enabled)\n";
  return kExitOk;
}

struct RunArgs {
  std::string scenario;
  std::vector<std::string> params;
  std::string device = "auto";
  std::string json_path;
  std::string trace_path;
  bool quick = false;
  double timeout_s = 1800;
  double budget_s = -1;
  double noise = -1;
};

// A run in progress, as the watchdogs see it: the points done so far and the
// one running. The main thread holds `mu` only to copy a point.
struct Live {
  std::mutex mu;
  std::vector<Point> done;
  std::optional<nlohmann::ordered_json> running;
  // Held by whichever writes the result (the main thread, the harness
  // watchdog, the collective's own watchdog); once the main thread has the
  // whole result it writes it, and a late watchdog writes nothing.
  std::mutex write_mu;
  bool main_writes = false;
};

// What a watchdog saves before the process ends: the points done so far,
// then `r`'s (the point that stopped, its findings), as one result.
void save_partial(Live& live, Result r, const json& meta, const Sweep& sweep, const Scenario& sc,
                  const std::string& path) {
  std::lock_guard wl(live.write_mu);
  if (live.main_writes) return;
  {
    std::lock_guard lk(live.mu);
    r.points.insert(r.points.begin(), live.done.begin(), live.done.end());
  }
  r.meta = meta;
  r.scenario = sc.name;
  r.params = sweep.axes;
  finish_findings(r, sc, meta.value("/device/simulated"_json_pointer, false));
  write_file_atomic(path, to_json(r).dump(2) + "\n");
  std::cerr << "\n"
            << format_result_table(r, table_width(STDERR_FILENO))
            << fmt::format("\nresult (up to where it stopped): {}\n", path) << std::flush;
}

// The result's meta block: the tool, the build, this machine, the device and
// how it was measured.
json run_meta(const RunArgs& a, int argc, char** argv, const DeviceInfo& di, const MeasureConfig& measure) {
  const BuildInfo b = build_info();
  json meta;
  meta["tool"] = "stallbench";
  meta["version"] = b.version;
  meta["git_sha"] = b.git_sha;
  meta["argv"] = std::vector<std::string>(argv, argv + argc);
  meta["time_utc"] = utc_now();
  meta["build"] = json{{"compiler", b.compiler}, {"build_type", b.build_type}, {"features", b.features}};
  const json fingerprint = machine_fingerprint(all_backends());
  for (const auto& [k, v] : fingerprint.items()) meta[k] = v;
  meta["device"] = json{{"id", di.id},
                        {"kind", di.kind == DeviceKind::cpu ? "cpu" : di.kind == DeviceKind::cuda ? "cuda" : "sim"},
                        {"name", di.name},
                        {"simulated", di.simulated},
                        {"props", di.props}};
  meta["measure"] = json{{"quick", a.quick},
                         {"warmup", measure.warmup},
                         {"max_noise", measure.max_noise},
                         {"budget_s", measure.budget_s},
                         {"min_trial_ms", measure.min_trial_ms},
                         {"timing", di.kind == DeviceKind::cuda ? "cuda events" : "compute-thread steady_clock"}};
  return meta;
}

// Writes the finished result and the trace, and prints the table. A late
// failure (disk full, the directory removed) loses nothing: the table goes
// to the terminal and the JSON to a fallback file in the temporary
// directory; the run then fails (exit 1).
int write_outputs(const Result& r, const Scenario& sc, const std::string& path, const std::string& trace_path,
                  const KinetoTrace* trace) {
  const std::string table = format_result_table(r, table_width(path == "-" ? STDERR_FILENO : STDOUT_FILENO));
  try {
    write_file_atomic(path, to_json(r).dump(2) + "\n");
  } catch (const Error& e) {
    std::cerr << "\n" << table << fmt::format("\nstallbench: {}\n", e.what());
    const std::string fallback = (std::filesystem::temp_directory_path() /
                                  fmt::format("stallbench-{}-{}.json", sc.name, ::getpid())).string();
    try {
      write_file_atomic(fallback, to_json(r).dump(2) + "\n");
      std::cerr << fmt::format("stallbench: the result was saved to {} instead\n", fallback);
    } catch (const Error& e2) {
      std::cerr << fmt::format("stallbench: and not to {} either: {}\n", fallback, e2.what());
    }
    return kExitFailure;
  }
  if (!trace_path.empty() && trace) {
    json t = trace->to_json();
    t["stallbench"]["scenario"] = sc.name;
    t["stallbench"]["device"] = r.meta.value("/device/id"_json_pointer, std::string());
    if (trace->size() == 0)
      std::cerr << fmt::format("stallbench: {} on {} recorded no trace events (cuda kernels need CUPTI; a "
                               "torch.profiler trace of the real job is what diagnose --trace reads)\n",
                               sc.name, r.meta.value("/device/id"_json_pointer, std::string()));
    write_file_atomic(trace_path, t.dump(-1, ' ', false, json::error_handler_t::replace) + "\n");
    std::cerr << fmt::format("stallbench: trace (PyTorch profiler / Kineto format) written to {}; "
                             "stallbench diagnose --trace {} reads it back\n",
                             trace_path, trace_path);
  }
  if (path == "-") {
    std::cerr << "\n" << table;
  } else {
    std::cout << "\n" << table << fmt::format("\nresult: {}\n", path);
  }
  return run_exit_code(r);
}

// What a run measures with, from the command line: the quick profile or the
// default, --budget and --noise, every wait's deadline from --timeout (at most
// 10 minutes), the device's expected numbers, and the watchdog fed by progress.
RunContext run_context(Device& dev, const RunArgs& a, Watchdog& wd) {
  RunContext ctx{dev};
  ctx.quick = a.quick;
  ctx.measure = a.quick ? quick_measure_config() : MeasureConfig{};
  if (a.budget_s > 0) ctx.measure.budget_s = a.budget_s;
  if (a.noise > 0) ctx.measure.max_noise = a.noise;
  ctx.measure.sync_timeout = std::chrono::milliseconds(static_cast<long long>(std::min(a.timeout_s, 600.0) * 1000));
  const CpuInfo cpu = read_cpu_info();
  ctx.expected = match_expected(dev.info(), cpu);
  ctx.progress = [&wd](const std::string& where) { wd.progress(where); };
  ctx.measure.heartbeat = [&wd] { wd.beat(); };
  return ctx;
}

int cmd_run(const RunArgs& a, int* argc, char*** argv) {
  const Scenario* sc = find_scenario(a.scenario);
  if (!sc) throw UsageError(fmt::format("unknown scenario '{}'; valid: {}", a.scenario, scenario_names()));
  // Validate parameters before touching any device.
  const Sweep sweep = expand_sweep(sc->params, a.params, SweepProfile{a.quick, false});
  const DeviceSpec spec = parse_device_spec(a.device);
  if (a.json_path == "-" && a.trace_path == "-")
    throw UsageError("--json - and --trace - both name stdout, where the two documents would run together: give "
                     "one of them a file");
  {  // a result written over the run's own input (-p lengths=@FILE) destroys the user's data: the inputs are
     // the parsed sweep's text values that name a file, as the scenarios read them
    std::vector<NamedPath> inputs;
    for (const auto& [name, values] : sweep.axes.items())
      for (const auto& v : values)
        if (v.is_string() && v.get<std::string>().size() > 1 && v.get<std::string>().front() == '@')
          inputs.push_back({v.get<std::string>().substr(1), fmt::format("the input of -p {}", name)});
    refuse_clobbering({{a.json_path, "--json"}, {a.trace_path, "--trace"}}, inputs);
  }

  // Ranks first: every rank of an mpirun/srun launch runs this same command;
  // rank 0 alone prints and writes the result.
  std::unique_ptr<ProcessGroup> group;
  if (sc->needs_ranks) group = open_process_group(argc, argv);
  const bool lead = !group || group->rank() == 0;

  Watchdog wd{std::chrono::seconds(static_cast<long long>(a.timeout_s))};
  wd.progress("opening device " + spec.str());
  // --trace: declared before the device, which records into it until it is gone
  std::unique_ptr<KinetoTrace> kineto;
  if (!a.trace_path.empty() && lead) kineto = std::make_unique<KinetoTrace>();
  auto dev = open_device(spec);
  if (kineto) dev->set_trace(kineto.get());

  RunContext ctx = run_context(*dev, a, wd);

  const DeviceInfo& di = dev->info();
  json meta = run_meta(a, *argc, *argv, di, ctx.measure);
  const std::string path = a.json_path.empty() ? fmt::format("stallbench-{}.json", sc->name) : a.json_path;
  // Where the results go is checked before anything is measured.
  if (lead) {
    check_writable_target(path, "--json");
    if (!a.trace_path.empty()) check_writable_target(a.trace_path, "--trace");
  }
  auto live = std::make_shared<Live>();
  RankServices rank_services;
  std::string ranks_text;
  if (group) {
    meta["ranks"] = json{{"size", group->size()}, {"launcher", group->launcher()}, {"mpi", group->library()},
                         {"local_size", group->local_size()}};
    meta["measure"]["timing"] = "steady_clock around each call, mean over ranks";
    ranks_text = fmt::format(", {} rank(s) via {} ({})", group->size(), group->launcher(), group->library());
    rank_services.group = group.get();
    rank_services.open_comm = [&group](const std::string& backend) { return open_communicator(*group, backend); };
    // A caught hang ends the job from the watchdog thread: the result is
    // written there, with what is known, before MPI_Abort.
    // Captures copies: a watchdog thread may outlive this function's locals.
    rank_services.write_result_now = [live, m = meta, axes = sweep, sc, path](Result& r) {
      save_partial(*live, r, m, axes, *sc, path);
    };
    ctx.ranks = &rank_services;
  }

  if (lead)
    std::cerr << fmt::format("stallbench: {} on {} ({}){}{}\n", sc->name, di.id, di.name, ranks_text,
                             ctx.expected ? " — expected numbers: " + ctx.expected->id() : "");
  if (lead)
    wd.on_fire([live, m0 = meta, axes = sweep, sc, path](const std::string& what) {
      Result r;
      {
        std::lock_guard lk(live->mu);
        if (live->running) {
          Point p;
          p.params = *live->running;
          p.status = Status::hang;
          p.reason = "watchdog: " + what;
          r.points.push_back(std::move(p));
        }
      }
      json m = m0;
      m["watchdog"] = what;
      save_partial(*live, r, m, axes, *sc, path);
    });
  RunOptions opts{a.params, a.quick};
  opts.on_point_start = [live](const ParamSet& ps) {
    std::lock_guard lk(live->mu);
    live->running = ps.to_json();
  };
  Result r;
  try {
    r = run_scenario(*sc, ctx, opts, meta, [lead, live](const Point& p, const Result& so_far) {
      if (lead) std::cerr << "  " << format_point_line(p, so_far.params) << "\n";
      std::lock_guard lk(live->mu);
      live->done.push_back(p);
      live->running.reset();
    });
  } catch (const Error& e) {
    // With ranks, a clean MPI_Finalize needs every rank there: end the job.
    // Bad input fails on every rank alike; rank 0 alone reports it and ends
    // the job (Open MPI's launcher has crashed on simultaneous aborts). A
    // rank that failed alone ends the job itself after a grace.
    if (!group || group->size() == 1) throw;
    const int code = e.kind() == ErrorKind::usage ? kExitUsage : e.kind() == ErrorKind::hang ? kExitHang : kExitFailure;
    if (group->rank() != 0) std::this_thread::sleep_for(std::chrono::seconds(3));
    std::cerr << fmt::format("stallbench: {}{}\n", group->rank() != 0 ? fmt::format("rank {}: ", group->rank()) : "",
                             e.what());
    group->abort(code);
  }
  // From here on this thread writes the whole result; a watchdog firing now
  // waits for it (within its grace) and adds nothing.
  std::unique_lock result_writer(live->write_mu);
  live->main_writes = true;
  wd.disarm();  // the run is over: a slow write or teardown is not a hang to end it for
  if (!lead) return run_exit_code(r);
  if (kineto) dev->set_trace(nullptr);  // the device flushes what it holds (cuda: CUPTI's buffers)
  return write_outputs(r, *sc, path, a.trace_path, kineto.get());
}

struct DiagnoseArgs {
  std::string config, model_config, lengths, html_path, trace;
  std::string device = "auto";
  std::string json_path = "stallbench-diagnose.json";
  bool quick = false;
  double timeout_s = 1800;
  double observed = -1;
  double budget_s = 0;  // 0: 120 s, --quick 60 s
};

// `diagnose`: the user's config read (exit 2 on a bad value, before any
// device is opened), the checks run in the standard order, the report
// printed and the result written atomically.
// `diagnose --trace FILE`: a real job's PyTorch profiler trace read and
// diagnosed (nothing measured; the reproduce commands name this machine's
// device).
// diagnose prints its report on stdout: a document there too would make neither readable.
void refuse_stdout_targets(const DiagnoseArgs& a) {
  for (const auto& [path, flag] : {std::pair{a.json_path, "--json"}, std::pair{a.html_path, "--html"}})
    if (path == "-")
      throw UsageError(fmt::format("{} -: diagnose prints its report on stdout; give {} a file", flag, flag));
}

int cmd_diagnose_trace(const DiagnoseArgs& a, int argc, char** argv) {
  refuse_stdout_targets(a);
  check_writable_target(a.json_path, "--json");
  if (!a.html_path.empty()) check_writable_target(a.html_path, "--html");
  refuse_clobbering({{a.json_path, "--json"}, {a.html_path, "--html"}}, {{a.trace, "the trace"}});
  const DeviceSpec spec = parse_device_spec(a.device);
  auto dev = open_device(spec);
  RunArgs ra;
  ra.device = a.device;
  json meta = run_meta(ra, argc, argv, dev->info(), MeasureConfig{});
  std::cerr << fmt::format("stallbench: diagnose --trace {} (reproduce commands for {})\n", a.trace, dev->info().id);
  Result r = diagnose::diagnose_trace(a.trace, meta);
  const std::string report = diagnose::format_report(r);
  write_file_atomic(a.json_path, to_json(r).dump(2, ' ', false, json::error_handler_t::replace) + "\n");
  if (!a.html_path.empty()) write_file_atomic(a.html_path, diagnose::format_html(r));
  std::cout << "\n" << report << fmt::format("\nresult: {}{}\n", a.json_path,
                                             a.html_path.empty() ? "" : ", report: " + a.html_path);
  return kExitOk;
}

int cmd_diagnose(const DiagnoseArgs& a, int argc, char** argv) {
  if (!a.trace.empty()) return cmd_diagnose_trace(a, argc, argv);
  diagnose::Options opt;
  opt.cfg = a.config.empty() ? diagnose::default_config() : diagnose::read_axolotl_yaml(a.config);
  if (!a.model_config.empty()) diagnose::apply_model_config(opt.cfg, a.model_config);
  if (!a.lengths.empty()) {
    diagnose::read_lengths(opt.cfg, a.lengths);
    opt.lengths_path = a.lengths;
  }
  opt.quick = a.quick;
  opt.budget_s = a.budget_s > 0 ? a.budget_s : a.quick ? 60 : 120;
  if (a.observed > 0) opt.observed_tokens_per_s = a.observed;
  opt.say = [](const std::string& line) { std::cerr << line << "\n"; };
  const DeviceSpec spec = parse_device_spec(a.device);
  refuse_stdout_targets(a);
  check_writable_target(a.json_path, "--json");
  if (!a.html_path.empty()) check_writable_target(a.html_path, "--html");
  refuse_clobbering({{a.json_path, "--json"}, {a.html_path, "--html"}},
                    {{a.config, "the config"}, {a.model_config, "the model config"}, {a.lengths, "the lengths file"}});
  if (!opt.cfg.unknown_keys.empty())
    std::cerr << fmt::format("diagnose: {} key(s) of the config not used here: {}\n", opt.cfg.unknown_keys.size(),
                             fmt::join(opt.cfg.unknown_keys, ", "));
  for (const auto& n : opt.cfg.notes) std::cerr << "diagnose: " << n << "\n";

  Watchdog wd{std::chrono::seconds(static_cast<long long>(a.timeout_s))};
  wd.progress("opening device " + spec.str());
  auto dev = open_device(spec);
  RunArgs ra;
  ra.device = a.device;
  ra.quick = a.quick;
  ra.timeout_s = a.timeout_s;
  RunContext ctx = run_context(*dev, ra, wd);
  json meta = run_meta(ra, argc, argv, dev->info(), ctx.measure);
  std::cerr << fmt::format("stallbench: diagnose on {} ({}){}\n", dev->info().id, dev->info().name,
                           a.config.empty() ? " with the default config (a 7B-like layer; --config FILE for yours)"
                                            : " with " + a.config);
  Result r = diagnose::run(ctx, opt, meta);
  wd.disarm();
  const std::string report = diagnose::format_report(r);
  // a path or config value that is not UTF-8 is written with U+FFFD, not thrown on at the end
  write_file_atomic(a.json_path, to_json(r).dump(2, ' ', false, json::error_handler_t::replace) + "\n");
  if (!a.html_path.empty()) write_file_atomic(a.html_path, diagnose::format_html(r));
  std::cout << "\n" << report << fmt::format("\nresult: {}{}\n", a.json_path,
                                             a.html_path.empty() ? "" : ", report: " + a.html_path);
  return kExitOk;
}

struct WatchCli {
  watch::Args a;
  std::string json_path = "stallbench-watch.json";
  std::string html_path;
};

int cmd_watch(const WatchCli& w, int argc, char** argv) {
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
  auto write = [&](const Result& r) {
    if (!w.json_path.empty())
      write_file_atomic(w.json_path, to_json(r).dump(2, ' ', false, json::error_handler_t::replace) + "\n");
  };
  watch::Outcome o = watch::run(w.a, meta_for, write);
  write(o.result);
  if (!w.html_path.empty()) write_file_atomic(w.html_path, diagnose::format_html(o.result));
  // with --exec the command's output owns stdout: the summary goes to stderr.
  // A reader that went away (watch | head) loses the summary, not the exit code.
  std::signal(SIGPIPE, SIG_IGN);
  std::ostream& out = w.a.exec.empty() ? std::cout : std::cerr;
  out << o.summary;
  if (!w.json_path.empty() || !w.html_path.empty())
    out << fmt::format("result: {}{}\n", w.json_path, w.html_path.empty() ? "" : ", report: " + w.html_path);
  return o.exit_code;
}

int cmd_analyze_hang(const std::string& dir, bool as_json) {
  const HangReport rep = analyze_hang_dir(dir);
  if (as_json) std::cout << to_json(rep).dump(2) << "\n";
  else std::cout << format_hang_report(rep);
  return kExitOk;
}

int cmd_compare(const std::string& a, const std::string& b, double tolerance, bool gate, const std::string& json_path) {
  const bool json_stdout = json_path == "-";  // as run's --json -: the JSON on stdout, the table on stderr
  if (!json_path.empty() && !json_stdout) {
    check_writable_target(json_path, "--json");  // before the work
    // The comparison written over its own input would destroy a measured result.
    refuse_clobbering({{json_path, "--json"}}, {{a, "result A"}, {b, "result B"}});
  }
  const json doc_a = read_json_file(a);  // A first, so its errors are reported first
  const json doc_b = read_json_file(b);
  // This build's parameters that do not define a point's workload for A's scenario: a file from an
  // older build may record fewer (collective's min_bytes, max_bytes and factor, since 2026-12-03).
  std::vector<std::string> non_workload;
  if (doc_a.is_object() && doc_a.contains("scenario") && doc_a["scenario"].is_string())
    if (const Scenario* sc = find_scenario(doc_a["scenario"].get<std::string>()))
      for (const auto& s : sc->params)
        if (!s.workload) non_workload.push_back(s.name);
  const CompareReport rep = compare_docs(doc_a, doc_b, gate ? tolerance : 0.05, a, b, non_workload);
  std::ostream& table = json_stdout ? std::cerr : std::cout;
  table << format_compare(rep);
  if (!json_path.empty()) {
    json j = compare_json(rep);
    j["a_file"] = a;
    j["b_file"] = b;
    j["gate"] = gate;
    const std::string text = j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
    if (json_stdout)
      std::cout << text << std::flush;
    else
      write_file_atomic(json_path, text);
  }
  // A gate that judged nothing would pass whatever changed (a sweep that no longer matches, a
  // simulated side, an expected file for other hardware): it fails, saying so.
  const bool judged = std::any_of(rep.rows.begin(), rep.rows.end(), [](const CompareRow& r) { return r.gated; });
  if (gate && !judged) {
    table << fmt::format("--tolerance: nothing was judged (see the notes above), so there is nothing to pass (exit "
                         "{})\n",
                         kExitFailure);
    return kExitFailure;
  }
  if (gate && rep.worse > 0) {
    table << fmt::format("{} row(s) worse than B by more than {:.1f}% (a percentage: by more than {:.1f} points), or "
                         "a point that ran in B and failed in A (exit {})\n",
                         rep.worse, tolerance * 100, tolerance * 100, kExitRegression);
    return kExitRegression;
  }
  return kExitOk;
}

// The dataset files that `run dataloader -p source=file` caches under
// $TMPDIR/stallbench-<uid>, and the temporary files of runs that were killed.
int cmd_clean(bool dry_run) {
  const std::string dir = loader::dataset_cache_dir();
  const auto removed = loader::clean_dataset_cache(dir, dry_run);
  std::uint64_t total = 0;
  for (const auto& r : removed) {
    std::cout << fmt::format("{} {} ({})\n", dry_run ? "would remove" : "removed", r.path, format_bytes(double(r.bytes)));
    total += r.bytes;
  }
  std::cout << fmt::format("{} file(s), {} {} in {}\n", removed.size(), format_bytes(double(total)),
                           dry_run ? "to free" : "freed", dir);
  return kExitOk;
}

int main_impl(int argc, char** argv) {
  CLI::App app{"stallbench: reproduce, one by one, the causes that make a fine-tuning job slow or stuck,\n"
               "measure them on this machine, and compare with expected numbers for the hardware."};
  app.require_subcommand(1);
  app.set_version_flag("--version", fmt::format("stallbench {} ({})", build_info().version, build_info().git_sha));
  app.footer("exit codes: 0 ok, 1 failure, 2 bad input, 3 compare regression, 4 hang caught,\n"
             "            5 a collective failed in the library (collective scenario; dumps written)");

  auto* list = app.add_subcommand("list", "scenarios, with their parameters");
  bool names_only = false, list_json = false;
  list->add_flag("--names", names_only, "only the scenario names, one per line");
  list->add_flag("--json", list_json, "as JSON");

  auto* devices = app.add_subcommand("devices", "the CPU and CUDA GPUs, with library versions");
  bool dev_json = false;
  devices->add_flag("--json", dev_json, "the machine fingerprint as JSON");

  RunArgs ra;
  auto* run = app.add_subcommand("run", "run one scenario over a sweep of its parameters");
  run->add_option("scenario", ra.scenario, "scenario name (see `stallbench list`)")->required();
  run->add_option("-p,--param", ra.params,
                  "key=value[,value...]; a comma list is a sweep axis (run SCENARIO --help: its keys)")
      ->allow_extra_args(false);
  run->add_option("--device", ra.device,
                  "auto | cpu | cuda:N | sim:<gpu> (auto: cuda:0 if a GPU answers, else cpu; sim: a simulated GPU "
                  "from results/expected, e.g. sim:h100)")
      ->capture_default_str();
  run->add_option("--json", ra.json_path, "result JSON path, or - for stdout (default: stallbench-<scenario>.json)")
      ->check(non_empty_path());
  run->add_option("--trace", ra.trace_path,
                  "write the run as a PyTorch profiler (Kineto) trace: Perfetto, TensorBoard and HTA open it, "
                  "diagnose --trace reads it")
      ->check(non_empty_path());
  run->add_flag("--quick", ra.quick,
                "small sizes and a short time budget (0.2 s of trials a point, 3 to 20 trials, --noise 0.05): a smoke "
                "run, not for publishing");
  run->add_option("--timeout", ra.timeout_s, "seconds without progress before the run is ended as a hang (exit 4)")
      ->capture_default_str()
      ->check(finite_range(1.0, 86400.0));
  run->add_option("--budget", ra.budget_s, "seconds of timed trials per point (default 2, --quick 0.2)")
      ->check(finite_range(0.001, 3600.0));
  run->add_option("--noise", ra.noise,
                  "stop a point's trials once their relative stddev is below this (default 0.02, --quick 0.05); a "
                  "point that ends more than 3x above it (and over 10%) carries a warning")
      ->check(finite_range(0.0001, 1.0));

  DiagnoseArgs da;
  auto* diag = app.add_subcommand("diagnose",
                                  "run the troubleshooting order on your training config: each cause measured here");
  auto* config_opt = diag->add_option("config,--config", da.config,
                                     "an Axolotl-style YAML config, given as is or after --config (default: a 7B-like layer, documented)")
      ->check(non_empty_path());
  auto* model_opt = diag->add_option("--model-config", da.model_config, "a Hugging Face config.json for the model's dimensions")
      ->check(non_empty_path());
  auto* lengths_opt = diag->add_option("--lengths", da.lengths, "dataset lengths: one per line, or length,count rows")
      ->check(non_empty_path());
  auto* trace_opt = diag->add_option("--trace", da.trace,
                                     "read a PyTorch profiler trace (.json or .json.gz) and name its causes, "
                                     "measuring nothing")
                        ->check(non_empty_path());
  diag->add_option("--device", da.device, "auto | cpu | cuda:N | sim:<gpu>")->capture_default_str();
  diag->add_option("--json", da.json_path, "result JSON path")->capture_default_str()->check(non_empty_path());
  diag->add_option("--html", da.html_path, "also write the report as one self-contained HTML file")
      ->check(non_empty_path());
  auto* observed_opt = diag->add_option("--observed-tokens-per-s", da.observed, "what your training logs report, to compare")
      ->check(finite_range(1e-9, 1e15));
  auto* quick_opt = diag->add_flag("--quick", da.quick,
                                   "small sweeps and a 60 s budget for the loop (62-110 s in all on 2 cores, by CPU)");
  auto* budget_opt = diag->add_option("--budget", da.budget_s,
                                      "seconds for the runs of your training loop with each line applied (default "
                                      "120, --quick 60): each run's timed span is its share, at least 3 steps")
                          ->check(finite_range(1.0, 86400.0));
  for (CLI::Option* o : {config_opt, model_opt, lengths_opt, observed_opt, quick_opt, budget_opt}) trace_opt->excludes(o);
  diag->add_option("--timeout", da.timeout_s, "seconds without progress before the run is ended as a hang (exit 4)")
      ->capture_default_str()
      ->check(finite_range(1.0, 86400.0));

  // watch: everything after --exec (and an optional --) is the command, taken
  // before CLI11 sees the line so the command's own flags stay its own.
  WatchCli wc;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) != "--exec") continue;
    if (i < 2 || std::string_view(argv[1]) != "watch") break;
    int first = i + 1;
    if (first < argc && std::string_view(argv[first]) == "--") ++first;
    for (int k = first; k < argc; ++k) wc.a.exec.emplace_back(argv[k]);
    if (wc.a.exec.empty()) {
      std::cerr << "stallbench: watch --exec: name the command to run, e.g. watch --exec -- python train.py\n";
      return kExitUsage;
    }
    argc = i;
    break;
  }
  auto* watch_cmd = app.add_subcommand(
      "watch", "watch a live job's GPUs (NVML): the utilization pattern, what it suggests, the stuck alarm");
  watch_cmd->add_option("--gpu", wc.a.gpus, "all, or NVML indices: 0,1")->capture_default_str();
  auto* interval_opt = watch_cmd->add_option("--interval", wc.a.interval_ms, "milliseconds between samples (10-10000)")
                           ->capture_default_str()
                           ->check(CLI::Range(10, 10000));
  auto* duration_opt = watch_cmd->add_option("--duration", wc.a.duration_s, "seconds to watch (default: until Ctrl-C)")
                           ->check(finite_range(0.0, 1e7));
  auto* count_opt = watch_cmd->add_option("--count", wc.a.count, "stop after this many samples of each GPU (as nvidia-smi -c)")
                        ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 40));
  watch_cmd->add_option("--kill-after", wc.a.kill_after_s,
                        "--exec: SIGKILL the job this many seconds after a forwarded INT/TERM/HUP/QUIT")
      ->capture_default_str()
      ->check(finite_range(0.1, 86400.0));
  watch_cmd->add_option("--json", wc.json_path, "result JSON (written at each alarm, every 60 s and at the end)")
      ->capture_default_str()
      ->check(non_empty_path());
  watch_cmd->add_option("--html", wc.html_path, "also write the report as one self-contained HTML file")
      ->check(non_empty_path());
  watch_cmd->add_option("--stuck-after", wc.a.opt.stuck_after_s,
                        "seconds of utilization 0 with memory held before the stuck alarm")
      ->capture_default_str()
      ->check(finite_range(0.0, 1e7));
  watch_cmd->add_option("--held-mib", wc.a.opt.held_mib, "memory used that counts as held, MiB (a process listed also counts)")
      ->capture_default_str()
      ->check(finite_range(0.0, 1e9));
  watch_cmd->add_option("--window", wc.a.opt.window_s, "seconds of samples the live pattern is named from")
      ->capture_default_str()
      ->check(finite_range(0.1, 86400.0));
  watch_cmd->add_option("--summary-window", wc.a.opt.summary_window_s,
                        "the summary names the pattern of each window of this many seconds")
      ->capture_default_str()
      ->check(finite_range(0.1, 86400.0));
  auto* on_stuck_opt = watch_cmd->add_option("--on-stuck", wc.a.on_stuck,
                                             "a shell command run at each stuck alarm (env STALLBENCH_STUCK_GPU, "
                                             "_PIDS, STALLBENCH_CHILD_PID), e.g. 'py-spy dump --pid $STALLBENCH_CHILD_PID'");
  watch_cmd->add_option("--on-stuck-timeout", wc.a.on_stuck_timeout_s, "seconds before --on-stuck is killed")
      ->capture_default_str()
      ->check(finite_range(0.1, 86400.0));
  watch_cmd->add_option("--print-every", wc.a.print_every_s,
                        "seconds between plain lines (default 1; 10 with --exec; a terminal refreshes in place)")
      ->check(finite_range(0.01, 86400.0));
  bool plain = false;
  watch_cmd->add_flag("--plain", plain, "plain lines even on a terminal");
  auto* from_opt = watch_cmd->add_option("--from", wc.a.from,
                                         "read recorded telemetry instead: nvidia-smi --query-gpu ... --format=csv "
                                         "output, or dcgmi dmon output")
                       ->check(non_empty_path());
  watch_cmd->add_option("--from-interval", wc.a.from_interval_ms,
                        "the log's interval in ms when it has no timestamps (dcgmi dmon -d; default 1000)")
      ->check(finite_range(1.0, 3.6e6));
  watch_cmd->footer("--exec -- CMD ARGS...  run CMD under the watch (last on the line): signals sent to stallbench "
                    "are forwarded to it, the watch ends when it does, and its exit code is returned.\n"
                    "Exit codes: 0; 1 every watched GPU stopped answering; 2 bad input or no NVML; 4 a stuck or "
                    "NVML-not-answering alarm was raised (without --exec), or --from's log holds a stuck episode; with "
                    "--exec, the command's.");
  for (CLI::Option* o : {interval_opt, on_stuck_opt, count_opt}) from_opt->excludes(o);

  std::string ca, cb, cmp_json;
  double tolerance = 0.05;
  auto* cmp = app.add_subcommand("compare", "compare result A with result B or an expected file");
  cmp->add_option("A", ca, "a result JSON")->required()->check(non_empty_path());
  cmp->add_option("B", cb, "a result JSON, or results/expected/<hardware>.json")->required()->check(non_empty_path());
  auto* tol_opt = cmp->add_option("--tolerance", tolerance,
                                  "fraction, e.g. 0.1: exit 3 when a measured metric is worse than B by more")
                      ->check(finite_range(0.0, 10.0));
  cmp->add_option("--json", cmp_json, "also write the comparison as JSON: every row with its parameters, the "
                                      "per-metric summary and the notes (written atomically; - is stdout, the "
                                      "table then goes to stderr)")
      ->check(non_empty_path());

  std::string hang_dir;
  bool hang_json = false;
  auto* hang = app.add_subcommand("analyze-hang",
                                  "explain a collective hang from the flight-recorder dumps the ranks wrote "
                                  "(stallbench's, or PyTorch's Flight Recorder)");
  hang->add_option("DIR", hang_dir,
                   "a folder of one dump per rank: a collective run's dump_dir (rank-N.json), or PyTorch Flight "
                   "Recorder dumps (TORCH_FR_DUMP_TEMP_FILE + rank; NCCL or gloo, pickle or JSON)")
      ->required()
      ->check(non_empty_path());
  hang->footer("A PyTorch job writes them on a watchdog timeout when TORCH_FR_BUFFER_SIZE and "
               "TORCH_NCCL_DUMP_ON_TIMEOUT=1 are set. The report names the first collective where the ranks "
               "disagree, in the terms of torch's fr_trace analyzer.\n"
               "Exit codes: 0 the report (a divergence found, none, or incomplete: a rank without a dump); 2 a "
               "folder that cannot be read or holds no readable dump. A dump that cannot be read is named in a "
               "warning (with the byte offset for a pickle) and its rank counts as one without a dump.");
  hang->add_flag("--json", hang_json, "the report as JSON");

  bool clean_dry = false;
  auto* clean = app.add_subcommand("clean", "remove the cached dataset files (source=file) and what killed runs left");
  clean->add_flag("--dry-run", clean_dry, "list what would be removed");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    const int rc = app.exit(e);
    // run SCENARIO --help: that scenario's -p keys too (they were only in `stallbench list`)
    if (run->parsed() && find_scenario(ra.scenario)) {
      std::cout << "\nparameters of " << ra.scenario << " (-p key=value[,value...]):\n\n";
      cmd_list(false, false, ra.scenario);
    } else if (run->parsed()) {
      std::cout << "\nrun SCENARIO --help lists that scenario's parameters; scenarios: " << scenario_names() << "\n";
    }
    return rc;
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // A first word that is no command ("stallbench frobnicate"): name it, and the commands.
    if (argc > 1 && argv[1][0] != '-') {
      const std::string word = argv[1];
      std::vector<std::string> names;
      for (const auto* sub : app.get_subcommands([](CLI::App*) { return true; })) names.push_back(sub->get_name());
      if (std::find(names.begin(), names.end(), word) == names.end()) {
        std::cerr << fmt::format("stallbench: unknown command '{}'; valid: {}\n", word, fmt::join(names, ", "));
        std::cerr << "run 'stallbench --help' for usage\n";
        return kExitUsage;
      }
    }
    // CLI11's wording for an option given twice, "--json: At Most 1 required but received 2",
    // read as a count of required values: say what happened.
    std::string what = e.what();
    static constexpr std::string_view kTwice = "At Most 1 required but received ";
    if (const auto at = what.find(kTwice); at != std::string::npos)
      what = what.substr(0, at) + "given " + what.substr(at + kTwice.size()) + " times; give it once";
    std::cerr << "stallbench: " << what << "\n";
    std::cerr << "run 'stallbench --help' (or 'stallbench <command> --help') for usage\n";
    return kExitUsage;
  }

  if (*list) return cmd_list(names_only, list_json);
  if (*devices) return cmd_devices(dev_json);
  if (*run) return cmd_run(ra, &argc, &argv);
  if (*diag) return cmd_diagnose(da, argc, argv);
  if (*hang) return cmd_analyze_hang(hang_dir, hang_json);
  if (*cmp) return cmd_compare(ca, cb, tolerance, tol_opt->count() > 0, cmp_json);
  if (*clean) return cmd_clean(clean_dry);
  if (*watch_cmd) {
    wc.a.live = !plain;
    if (!wc.a.exec.empty() && !wc.a.from.empty())
      throw UsageError("watch: --from reads a recorded log; --exec runs a command to watch live: one or the other");
    if (!wc.a.exec.empty() && duration_opt->count() > 0)
      throw UsageError("watch --exec: the watch lasts as long as the command; --duration does not apply");
    return cmd_watch(wc, argc, argv);
  }
  return kExitUsage;
}

}  // namespace
}  // namespace sb

int main(int argc, char** argv) {
  sb::install_temp_file_cleanup();  // a signal never leaves a half-written file behind
  try {
    const int rc = sb::main_impl(argc, argv);
    // A table or report that could not be written (stdout on a full disk, `> /dev/full`) is a
    // failure the user must see, never exit 0. A pipe whose reader left (`watch | head -1`) is
    // not: watch goes on by design, and elsewhere SIGPIPE ends the run as for any tool.
    std::cout.flush();
    struct stat out {};
    const bool pipe = ::fstat(STDOUT_FILENO, &out) == 0 && (S_ISFIFO(out.st_mode) || S_ISSOCK(out.st_mode));
    if (!std::cout && !pipe) {
      std::cerr << "stallbench: cannot write to stdout (closed, or the disk is full): its output is lost\n";
      return rc == 0 ? 1 : rc;
    }
    return rc;
  } catch (const sb::UsageError& e) {  // a message may quote the user's bytes: never raw to the terminal
    std::cerr << "stallbench: " << sb::terminal_safe(e.what()) << "\n";
    return 2;
  } catch (const sb::Error& e) {
    std::cerr << "stallbench: " << sb::to_string(e.kind()) << " error: " << sb::terminal_safe(e.what()) << "\n";
    return e.kind() == sb::ErrorKind::hang ? sb::kExitHang : 1;
  } catch (const std::exception& e) {
    std::cerr << "stallbench: error: " << sb::terminal_safe(e.what()) << "\n";
    return 1;
  }
}
