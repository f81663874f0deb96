// `stallbench diagnose`: the user's config read (exit 2 on a bad value, before any device is opened),
// the checks run in the standard order, the report printed and the result written atomically; with
// --trace, a real job's profiler trace read and diagnosed, nothing measured.
#include "app/app.hpp"

#include <algorithm>  // std::clamp
#include <iostream>  // std::cout, std::cerr
#include <memory>    // std::make_shared

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "diagnose/config.hpp"                // read_axolotl_yaml, apply_model_config, read_lengths
#include "diagnose/diagnose.hpp"              // diagnose::run
#include "diagnose/hf_cache.hpp"              // hf_cache_dirs, find_model_config
#include "diagnose/plan.hpp"                  // format_plan
#include "diagnose/trainer.hpp"               // resolve_axolotl
#include "diagnose/run/run_diagnose.hpp"      // diagnose_run, looks_like_run
#include "diagnose/trace/job_diagnose.hpp"    // trace_files, diagnose_job
#include "diagnose/trace/trace_diagnose.hpp"  // diagnose_trace
#include "diagnose/trace/trace_diff.hpp"      // diagnose_diff
#include "harness/errors.hpp"                 // UsageError
#include "harness/exit_codes.hpp"             // kExit*
#include "harness/files.hpp"                  // check_writable_target, write_file_atomic, refuse_clobbering
#include "kernels/backends.hpp"               // open_device
#include "report/html.hpp"                    // report::format_html
#include "report/text.hpp"                    // report::format_text

namespace sb::app {
namespace {

using json = nlohmann::ordered_json;

struct DiagnoseArgs {
  std::string config, model_config, lengths, html_path;
  std::vector<std::string> trace;  // --trace: files, or a directory of one job's rank traces
  std::string baseline;            // --baseline OLD: the trace NEW is compared with
  std::string device = "auto";
  std::string json_path;  // "": no file (an analyzer writes none unless asked); "-": stdout
  bool quick = false;
  double timeout_s = 1800;
  double observed = -1;
  double budget_s = 0;  // 0: 120 s, --quick 60 s
  std::string axolotl_version;  // "": the newest encoded
  std::string run;              // --run DIR (or a directory given as the config)
  bool plan = false;            // --plan: the settings and the checks, nothing measured
  int world_size = 1;
  bool world_size_given = false;  // --world-size on the command line (a run directory reads or infers it)
  std::string gpu;                // --gpu: the GPU a run directory's throughput is held against
};

// `diagnose`: the user's config read (exit 2 on a bad value, before any
// device is opened), the checks run in the standard order, the report
// printed and the result written atomically.
// `diagnose --trace FILE`: a real job's PyTorch profiler trace read and
// diagnosed (nothing measured; the reproduce commands name this machine's
// device).
// --json - or --html -: that document on stdout, the report on stderr; both there would run together.
void refuse_stdout_targets(const DiagnoseArgs& a) {
  if (a.json_path == "-" && a.html_path == "-")
    throw UsageError("--json - and --html - both name stdout, where the two documents would run together: give one a file");
}

void check_targets(const DiagnoseArgs& a, const std::vector<NamedPath>& inputs) {
  refuse_stdout_targets(a);
  if (!a.json_path.empty()) check_writable_target(a.json_path, "--json");
  if (!a.html_path.empty()) check_writable_target(a.html_path, "--html");
  refuse_clobbering({{a.json_path, "--json"}, {a.html_path, "--html"}}, inputs);
}

// What --trace and a run directory share: the meta of a read (nothing measured; the reproduce
// commands name this machine's device), and the result written and the report printed.
json read_meta(const DiagnoseArgs& a, const std::vector<NamedPath>& inputs, int argc, char** argv,
               std::string* device_id) {
  check_targets(a, inputs);
  auto dev = open_device(parse_device_spec(a.device));
  RunArgs ra;
  ra.device = a.device;
  *device_id = dev->info().id;
  return run_meta(ra, argc, argv, dev->info(), MeasureConfig{});
}

int write_report(const DiagnoseArgs& a, const Result& r) {
  const std::string report = report::format_text(r);
  // a path or config value that is not UTF-8 is written with U+FFFD, not thrown on at the end
  if (!a.json_path.empty())
    write_file_atomic(a.json_path, to_json(r).dump(2, ' ', false, json::error_handler_t::replace) + "\n");
  if (!a.html_path.empty()) write_file_atomic(a.html_path, report::format_html(r));
  // A document on stdout (--json -, --html -): the report goes to stderr
  std::ostream& out = a.json_path == "-" || a.html_path == "-" ? std::cerr : std::cout;
  std::vector<std::string> written;
  if (!a.json_path.empty() && a.json_path != "-") written.push_back("result: " + a.json_path);
  if (!a.html_path.empty() && a.html_path != "-") written.push_back("report: " + a.html_path);
  out << "\n" << report << (written.empty() ? "" : fmt::format("\n{}\n", fmt::join(written, ", ")));
  return kExitOk;
}

int cmd_diagnose_trace(const DiagnoseArgs& a, int argc, char** argv) {
  std::string device;
  const std::vector<std::string> files = diagnose::trace_files(a.trace);
  std::vector<NamedPath> inputs;
  for (const auto& f : files) inputs.push_back({f, "the trace"});
  if (!a.baseline.empty()) inputs.push_back({a.baseline, "the baseline trace"});
  const json meta = read_meta(a, inputs, argc, argv, &device);
  const std::string label = fmt::format("{}", fmt::join(a.trace, " "));
  std::cerr << fmt::format("stallbench: diagnose --trace {} (reproduce commands for {})\n", label, device);
  if (!a.baseline.empty()) {
    if (files.size() != 1)
      throw UsageError("--baseline compares one trace with one trace: give --trace one file (a job's directory is "
                       "not compared yet)");
    const std::vector<std::string> base = diagnose::trace_files({a.baseline});
    if (base.size() != 1) throw UsageError(fmt::format("--baseline {}: one trace file, not {}", a.baseline, base.size()));
    return write_report(a, diagnose::diagnose_diff(diagnose::read_trace(files[0]), diagnose::read_trace(base[0]), meta));
  }
  if (files.size() == 1) return write_report(a, diagnose::diagnose_trace(files[0], meta));
  return write_report(a, diagnose::diagnose_job(files, label, meta));
}

// `diagnose DIR`: a run's output directory read, nothing measured.
int cmd_diagnose_run(const DiagnoseArgs& a, const std::string& dir, int argc, char** argv) {
  std::string device;
  const json meta = read_meta(a, {{dir, "the run"}}, argc, argv, &device);
  std::cerr << fmt::format("stallbench: diagnose {}: the run as its trainer logged it (nothing measured)\n", dir);
  diagnose::RunOptions ro;
  ro.gpu = a.gpu;
  ro.world_size = a.world_size_given ? a.world_size : 0;
  return write_report(a, diagnose::diagnose_run(dir, meta, ro));
}

int cmd_diagnose(const DiagnoseArgs& a, int argc, char** argv) {
  if (!a.trace.empty()) return cmd_diagnose_trace(a, argc, argv);
  if (!a.run.empty()) return cmd_diagnose_run(a, a.run, argc, argv);
  if (!a.config.empty() && diagnose::looks_like_run(a.config)) return cmd_diagnose_run(a, a.config, argc, argv);
  if (!a.gpu.empty())
    throw UsageError("--gpu names the GPU a run directory's logged throughput is held against (diagnose DIR --gpu "
                     "h100); a config is measured on --device");
  diagnose::Options opt;
  opt.cfg = a.config.empty() ? diagnose::default_config() : diagnose::read_axolotl_yaml(a.config);
  if (!a.model_config.empty()) {
    diagnose::apply_model_config(opt.cfg, a.model_config);
  } else if (!opt.cfg.base_model.empty() && diagnose::source_of(opt.cfg, "model.hidden_size") != "default") {
    opt.cfg.notes.push_back(fmt::format("the model's dims from the config's own keys ({}), not base_model {}'s "
                                        "config.json",
                                        diagnose::source_of(opt.cfg, "model.hidden_size"), opt.cfg.base_model));
  } else if (!opt.cfg.base_model.empty()) {
    // the model's dims where the machine has them: the hub cache from_pretrained filled, never the network
    const std::vector<std::string> dirs = diagnose::hf_cache_dirs();
    const std::string found = diagnose::find_model_config(opt.cfg.base_model, dirs);
    if (!found.empty()) {
      diagnose::apply_model_config(opt.cfg, found);
      opt.cfg.notes.push_back(fmt::format("the model's dims from {} (base_model {} in the Hugging Face cache)", found,
                                          opt.cfg.base_model));
    } else {
      opt.cfg.notes.push_back(fmt::format(
          "base_model {} is not in the Hugging Face cache ({}): the model's dims are {} (--model-config FILE, or "
          "HF_HUB_CACHE pointing at the cache that has it)",
          opt.cfg.base_model, dirs.empty() ? std::string("none found") : fmt::format("{}", fmt::join(dirs, ", ")),
          "the default's (a Llama-2-7B layer)"));
    }
  }
  if (!a.config.empty()) {
    diagnose::TrainerSpec t;
    if (!a.axolotl_version.empty()) {
      const auto v = diagnose::parse_version(a.axolotl_version);
      if (!v) throw UsageError(fmt::format("--axolotl-version '{}': expected a release such as 0.11.0", a.axolotl_version));
      if (*v < diagnose::Version{0, 1, 0} || *v > diagnose::kNewestAxolotl)
        opt.cfg.notes.push_back(fmt::format("--axolotl-version {}: outside the releases encoded here (0.1.0 to {}); "
                                            "the nearest's rules apply",
                                            a.axolotl_version, diagnose::to_string(diagnose::kNewestAxolotl)));
      t.axolotl = *v;
      t.version_given = true;
    }
    if (a.axolotl_version.empty() && !opt.cfg.card_axolotl_version.empty()) {
      // the model card names the release the run used ("0.9.1.post1": its major.minor.patch)
      if (const auto v = diagnose::parse_version(opt.cfg.card_axolotl_version)) {
        t.axolotl = std::clamp(*v, diagnose::Version{0, 1, 0}, diagnose::kNewestAxolotl);
        t.version_given = true;
        opt.cfg.notes.push_back(fmt::format("Axolotl {}'s defaults: the release the model card names{}",
                                            diagnose::to_string(t.axolotl),
                                            *v > diagnose::kNewestAxolotl ? " (newer than encoded: the newest's)" : ""));
      }
    }
    t.world_size = a.world_size;
    diagnose::resolve_axolotl(opt.cfg, t);
  }
  if (!a.lengths.empty()) {
    diagnose::read_lengths(opt.cfg, a.lengths);
    opt.lengths_path = a.lengths;
  }
  opt.quick = a.quick;
  opt.budget_s = a.budget_s > 0 ? a.budget_s : a.quick ? 60 : 120;
  if (a.plan) {  // nothing opened, nothing measured
    const DeviceSpec plan_spec = parse_device_spec(a.device);
    std::cout << diagnose::format_plan(opt.cfg, a.config, plan_spec.str(), a.quick, opt.budget_s);
    return kExitOk;
  }
  if (a.observed > 0) opt.observed_tokens_per_s = a.observed;
  opt.say = [](const std::string& line) { std::cerr << line << "\n"; };
  const DeviceSpec spec = parse_device_spec(a.device);
  check_targets(a, {{a.config, "the config"}, {a.model_config, "the model config"}, {a.lengths, "the lengths file"}});
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
  return write_report(a, r);
}

}  // namespace

Command add_diagnose(CLI::App& app, int& argc, char**& argv) {
  auto da = std::make_shared<DiagnoseArgs>();
  auto* diag = app.add_subcommand("diagnose",
                                  "run the troubleshooting order on your training config: each cause measured here");
  auto* config_opt = diag->add_option("config,--config", da->config,
                                      "an Axolotl-style YAML config, given as is or after --config (default: a 7B-like layer, documented)")
                         ->check(non_empty_path());
  auto* model_opt = diag->add_option("--model-config", da->model_config, "a Hugging Face config.json for the model's dimensions")
                        ->check(non_empty_path());
  auto* lengths_opt = diag->add_option("--lengths", da->lengths, "dataset lengths: one per line, or length,count rows")
                          ->check(non_empty_path());
  auto* trace_opt = diag->add_option("--trace", da->trace,
                                     "read a PyTorch profiler trace (.json or .json.gz) and name its causes, "
                                     "measuring nothing; several files or a directory: one job's ranks, side by "
                                     "side, and the straggler the others wait for")
                        ->expected(1, -1)
                        ->check(non_empty_path());
  diag->add_option("--device", da->device, "auto | cpu | cuda:N | sim:<gpu>")->capture_default_str();
  diag->add_option("--json", da->json_path, "write the result JSON to FILE, or to stdout with - (the report then goes "
                   "to stderr); none unless asked")
      ->type_name("FILE|-")
      ->check(non_empty_path());
  diag->add_option("--html", da->html_path, "also write the report as one self-contained HTML file (- for stdout)")
      ->type_name("FILE|-")
      ->check(non_empty_path());
  auto* observed_opt = diag->add_option("--observed-tokens-per-s", da->observed, "what your training logs report, to compare")
                           ->check(finite_range(1e-9, 1e15));
  auto* quick_opt = diag->add_flag("--quick", da->quick,
                                   "small sweeps and a 60 s budget for the loop (62-110 s in all on 2 cores, by CPU)");
  auto* budget_opt = diag->add_option("--budget", da->budget_s,
                                      "seconds for the runs of your training loop with each line applied (default "
                                      "120, --quick 60): each run's timed span is its share, at least 3 steps")
                         ->check(finite_range(1.0, 86400.0));
  for (CLI::Option* o : {config_opt, model_opt, lengths_opt, observed_opt, quick_opt, budget_opt}) trace_opt->excludes(o);
  diag->add_option("--baseline", da->baseline,
                   "with --trace NEW: the trace of an earlier run of the same model (before an upgrade, a config "
                   "change, on another machine); the step's change explained by category, by the kernels and ops "
                   "that moved, and named where a rule knows it")
      ->check(non_empty_path())
      ->needs(trace_opt);
  auto* version_opt = diag->add_option("--axolotl-version", da->axolotl_version,
                                       "the Axolotl release the config is for: its defaults decide the workers, the "
                                       "attention, bf16, packing (default: the newest encoded, 0.18.0)");
  auto* world_opt = diag->add_option("--world-size", da->world_size,
                                     "processes in your job (WORLD_SIZE): Axolotl 0.11+ gives each rank that many "
                                     "loader workers by default")
                        ->capture_default_str()
                        ->check(CLI::Range(1, 1 << 20));
  auto* gpu_opt = diag->add_option("--gpu", da->gpu,
                                   "with a run directory: the GPU it trained on (h100, h200, a100), for its MFU: the "
                                   "Trainer's FLOP count per GPU over that GPU's datasheet peak")
                      ->check(non_empty_path());
  auto* plan_opt = diag->add_flag("--plan,--dry-run", da->plan,
                                  "print every setting as the checks will use it, with its source, and what each "
                                  "check will run or why the config excludes its cause; measure nothing");
  trace_opt->excludes(plan_opt);
  auto* run_opt = diag->add_option("--run", da->run,
                                   "a training run's output directory (or a checkpoint-N/ in it): the curves of "
                                   "its trainer_state.json (else its TensorBoard event files) diagnosed with its "
                                   "training_args.bin's settings, nothing measured or executed; a directory given "
                                   "as the config is read so too")
                      ->check(non_empty_path());
  for (CLI::Option* o : {config_opt, model_opt, lengths_opt, observed_opt, quick_opt, budget_opt, trace_opt, plan_opt})
    run_opt->excludes(o);
  trace_opt->excludes(version_opt);
  trace_opt->excludes(gpu_opt);
  trace_opt->excludes(world_opt);
  diag->add_option("--timeout", da->timeout_s, "seconds without progress before the run is ended as a hang (exit 4)")
      ->capture_default_str()
      ->check(finite_range(1.0, 86400.0));
  return {diag, [da, world_opt, &argc, &argv] {
            da->world_size_given = world_opt->count() > 0;
            return cmd_diagnose(*da, argc, argv);
          }};
}

}  // namespace sb::app
