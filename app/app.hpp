// The command line's composition root: main.cpp makes the CLI11 app and one add_<command>() per
// command wires its options; each cmd_<command>.cpp holds one command (or a few small ones). The
// only place that knows every layer (docs/DESIGN.md).
#pragma once

#include <functional>  // std::function
#include <string>      // std::string

#include <CLI/CLI.hpp>        // CLI::App, CLI::Validator
#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/device.hpp"    // Device, DeviceInfo
#include "harness/measure.hpp"   // MeasureConfig
#include "harness/scenario.hpp"  // RunContext
#include "harness/watchdog.hpp"  // Watchdog

namespace sb::app {

// A command: its subcommand, what runs once the line is parsed into it, and what `--help` adds.
struct Command {
  CLI::App* sub = nullptr;
  std::function<int()> run;
  std::function<void()> more_help;  // after CLI11's help (run SCENARIO --help: the scenario's -p keys)
};

Command add_list(CLI::App& app);
Command add_devices(CLI::App& app, int& argc, char**& argv);
Command add_run(CLI::App& app, int& argc, char**& argv);
Command add_diagnose(CLI::App& app, int& argc, char**& argv);
// Takes everything after --exec off the line first (the command's own flags stay its own): argc
// is shortened. A --exec that names no command is exit 2 before parsing (*early_exit).
Command add_watch(CLI::App& app, int& argc, char** argv, int* early_exit);
Command add_compare(CLI::App& app);
Command add_analyze_hang(CLI::App& app);
Command add_clean(CLI::App& app);

// --help wrapped to the terminal's width ($COLUMNS, else the terminal's, else 80): before the
// commands are added, which take the app's formatter (help_format.cpp).
void use_wrapping_help(CLI::App& app);
// Text after the help (run's scenario list) wrapped alike; each line ends with a newline.
std::string wrap_help_text(const std::string& text, std::size_t indent = 2);

// What the commands share.
std::string utc_now();
std::string scenario_names();               // "precision, dataloader, ..."
CLI::Validator non_empty_path();            // an empty path would silently become the default name
CLI::Validator finite_range(double lo, double hi);  // CLI::Range lets NaN through
// Every scenario with its parameters, or only `only` (run SCENARIO --help).
// json_path: "" the table, "-" JSON on stdout, else a JSON file.
int list_scenarios(bool names_only, const std::string& json_path, const std::string& only = "");
// --json [FILE|-] for a command whose output is the document (list, devices): a bare --json is "-".
CLI::Option* add_json_output(CLI::App* cmd, std::string& path, const std::string& what);
std::string json_output(const CLI::Option* opt, const std::string& path);

// How a run measures, from run's flags (diagnose and watch fill the ones they have).
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
// The result's meta block: the tool, the build, this machine, the device and how it was measured.
nlohmann::ordered_json run_meta(const RunArgs& a, int argc, char** argv, const DeviceInfo& di,
                                const MeasureConfig& measure);
// What a run measures with: the quick profile or the default, --budget and --noise, every wait's
// deadline from --timeout (at most 10 minutes), the device's expected numbers, the watchdog.
RunContext run_context(Device& dev, const RunArgs& a, Watchdog& wd);

}  // namespace sb::app
