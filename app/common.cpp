// What the commands share (app.hpp), and the small commands: list, clean (devices: cmd_devices.cpp).
#include "app/app.hpp"

#include <cerrno>    // errno, ERANGE
#include <chrono>    // std::chrono::system_clock
#include <cmath>     // std::isfinite
#include <cstdlib>   // std::strtod
#include <ctime>     // gmtime_r, std::strftime
#include <iostream>  // std::cout

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/exit_codes.hpp"   // kExit*
#include "harness/expected.hpp"     // match_expected
#include "harness/fingerprint.hpp"  // machine_fingerprint, build_info
#include "harness/units.hpp"        // format_bytes
#include "kernels/backends.hpp"     // all_backends
#include "scenarios/registry.hpp"   // all_scenarios
#include "workloads/dataset_file.hpp"  // dataset_cache_dir, clean_dataset_cache

namespace sb::app {

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
int list_scenarios(bool names_only, const std::string& json_path, const std::string& only) {
  const bool as_json = !json_path.empty();
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
    write_file_atomic(json_path, out.dump(2) + "\n");  // "-": stdout
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
                        {"kind", to_string(di.kind)},
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

namespace {

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

}  // namespace

CLI::Option* add_json_output(CLI::App* cmd, std::string& path, const std::string& what) {
  return cmd->add_option("--json", path, what + ": to FILE, or to stdout with - or no value")
      ->type_name("[FILE|-]")
      ->expected(0, 1);
}

std::string json_output(const CLI::Option* opt, const std::string& path) {
  return opt->count() > 0 && path.empty() ? "-" : path;
}

Command add_list(CLI::App& app) {
  auto* list = app.add_subcommand("list", "scenarios, with their parameters");
  auto names_only = std::make_shared<bool>(false);
  auto json_path = std::make_shared<std::string>();
  list->add_flag("--names", *names_only, "only the scenario names, one per line");
  auto* json_opt = add_json_output(list, *json_path, "as JSON");
  return {list, [=] { return list_scenarios(*names_only, json_output(json_opt, *json_path)); }};
}

Command add_clean(CLI::App& app) {
  auto* clean = app.add_subcommand("clean", "remove the cached dataset files (source=file) and what killed runs left");
  auto dry = std::make_shared<bool>(false);
  clean->add_flag("--dry-run", *dry, "list what would be removed");
  return {clean, [=] { return cmd_clean(*dry); }};
}

}  // namespace sb::app
