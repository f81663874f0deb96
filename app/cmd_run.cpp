// `stallbench run SCENARIO`: one scenario over a sweep of its parameters, under a watchdog, on one
// device or every rank of an mpirun/srun launch; the result JSON, the table and an optional Kineto
// trace. Exit codes: app/main.cpp.
#include "app/app.hpp"

#include <unistd.h>    // getpid, STDOUT_FILENO

#include <chrono>      // std::chrono::steady_clock: [k/N] and the time left
#include <filesystem>  // std::filesystem::temp_directory_path
#include <iostream>    // std::cout, std::cerr
#include <memory>      // std::make_shared: what the watchdog saves
#include <mutex>       // std::mutex
#include <optional>    // std::optional
#include <thread>      // std::this_thread::sleep_for

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"        // Error, UsageError
#include "harness/exit_codes.hpp"    // kExit*
#include "harness/files.hpp"         // check_writable_target, write_file_atomic
#include "harness/kineto_trace.hpp"  // KinetoTrace: --trace
#include "harness/printer.hpp"       // format_result_table
#include "harness/runner.hpp"        // run_scenario
#include "kernels/backends.hpp"      // open_device, open_process_group
#include "readers/gzip.hpp"          // gzip_compress: a --trace *.gz
#include "scenarios/registry.hpp"    // find_scenario

namespace sb::app {
namespace {

using json = nlohmann::ordered_json;

// A run in progress, as the watchdogs see it: the points done so far and the
// one running. The main thread holds `mu` only to copy a point.
struct Live {
  std::mutex mu;
  std::vector<Point> done;
  std::optional<nlohmann::ordered_json> running;
  std::size_t index = 0, total = 0;  // the running point's place in the sweep
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
    std::string text = t.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    // a .gz name is a gzip file (HTA's and TensorBoard's loaders open *.json.gz with gzip)
    if (trace_path.size() > 3 && trace_path.ends_with(".gz")) text = readers::gzip_compress(text);
    write_file_atomic(trace_path, text);
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
  opts.on_point_start = [live](const ParamSet& ps, std::size_t index, std::size_t total) {
    std::lock_guard lk(live->mu);
    live->running = ps.to_json();
    live->index = index;
    live->total = total;
  };
  Result r;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    r = run_scenario(*sc, ctx, opts, meta, [lead, live, t0](const Point& p, const Result& so_far) {
      // [k/N] and the time left, as diagnose shows: the points so far took about as long as each
      // of the rest will
      if (lead) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const std::size_t k = live->index + 1, n = live->total;
        const std::string left = k < n ? fmt::format(", about {:.0f} s left", s / double(k) * double(n - k)) : "";
        std::cerr << fmt::format("  [{}/{}] {} ({:.0f} s{})\n", k, n, format_point_line(p, so_far.params), s, left);
      }
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

}  // namespace

Command add_run(CLI::App& app, int& argc, char**& argv) {
  auto ra = std::make_shared<RunArgs>();
  auto* run = app.add_subcommand("run", "run one scenario over a sweep of its parameters");
  run->add_option("scenario", ra->scenario, "scenario name (see `stallbench list`)")->required();
  run->add_option("-p,--param", ra->params,
                  "key=value[,value...]; a comma list is a sweep axis (run SCENARIO --help: its keys)")
      ->allow_extra_args(false);
  run->add_option("--device", ra->device,
                  "auto | cpu | cuda:N | sim:<gpu> (auto: cuda:0 if a GPU answers, else cpu; sim: a simulated GPU "
                  "from results/expected, e.g. sim:h100)")
      ->capture_default_str();
  run->add_option("--json", ra->json_path, "result JSON path, or - for stdout (the table then goes to stderr; default: "
                                          "stallbench-<scenario>.json: a measurement is kept)")
      ->type_name("FILE|-")
      ->check(non_empty_path());
  run->add_option("--trace", ra->trace_path,
                  "write the run as a PyTorch profiler (Kineto) trace: Perfetto, TensorBoard and HTA open it, "
                  "diagnose --trace reads it")
      ->check(non_empty_path());
  run->add_flag("--quick", ra->quick,
                "small sizes and a short time budget (0.2 s of trials a point, 3 to 20 trials, --noise 0.05): a smoke "
                "run, not for publishing");
  run->add_option("--timeout", ra->timeout_s, "seconds without progress before the run is ended as a hang (exit 4)")
      ->capture_default_str()
      ->check(finite_range(1.0, 86400.0));
  run->add_option("--budget", ra->budget_s, "seconds of timed trials per point (default 2, --quick 0.2)")
      ->check(finite_range(0.001, 3600.0));
  run->add_option("--noise", ra->noise,
                  "stop a point's trials once their relative stddev is below this (default 0.02, --quick 0.05); a "
                  "point that ends more than 3x above it (and over 10%) carries a warning")
      ->check(finite_range(0.0001, 1.0));
  Command c{run, [ra, &argc, &argv] { return cmd_run(*ra, &argc, &argv); }};
  // run SCENARIO --help: that scenario's -p keys too (they were only in `stallbench list`)
  c.more_help = [ra, run] {
    if (!run->parsed()) return;
    if (find_scenario(ra->scenario)) {
      std::cout << "\nparameters of " << ra->scenario << " (-p key=value[,value...]):\n\n";
      list_scenarios(false, "", ra->scenario);
    } else {
      std::cout << "\n" << wrap_help_text("run SCENARIO --help lists that scenario's parameters; scenarios: " +
                                          scenario_names());
    }
  };
  return c;
}

}  // namespace sb::app
