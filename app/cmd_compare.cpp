// `stallbench compare A B`: two results, or a result and an expected file, row by row; --tolerance
// gates a regression (exit 3). `stallbench analyze-hang DIR`: a collective hang explained from the
// ranks' flight-recorder dumps (stallbench's or PyTorch's).
#include "app/app.hpp"

#include <algorithm>  // std::any_of
#include <iostream>   // std::cout, std::cerr
#include <memory>     // std::make_shared

#include <fmt/format.h>  // fmt::format

#include "diagnose/hang/hang_analysis.hpp"  // analyze_hang_dir, format_hang_report
#include "harness/compare.hpp"              // compare_docs
#include "harness/exit_codes.hpp"           // kExit*
#include "harness/files.hpp"                // check_writable_target, write_file_atomic, refuse_clobbering
#include "harness/result.hpp"               // read_json_file
#include "scenarios/registry.hpp"           // find_scenario

namespace sb::app {
namespace {

using json = nlohmann::ordered_json;

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

// --json FILE: the JSON written there, the report on stdout; --json or --json -: the JSON on stdout,
// the report on stderr; neither: the report alone (an analyzer writes no file unless asked).
int cmd_analyze_hang(const std::string& dir, const std::string& json_path) {
  const bool json_stdout = json_path == "-";
  if (!json_path.empty() && !json_stdout) {
    check_writable_target(json_path, "--json");
    refuse_clobbering({{json_path, "--json"}}, {{dir, "the dump folder"}});
  }
  const HangReport rep = analyze_hang_dir(dir);
  (json_stdout ? std::cerr : std::cout) << format_hang_report(rep);
  if (!json_path.empty()) write_file_atomic(json_path, to_json(rep).dump(2) + "\n");
  return kExitOk;
}

}  // namespace

Command add_compare(CLI::App& app) {
  struct Args {
    std::string a, b, json_path;
    double tolerance = 0.05;
  };
  auto x = std::make_shared<Args>();
  auto* cmp = app.add_subcommand("compare", "compare result A with result B or an expected file");
  cmp->add_option("A", x->a, "a result JSON")->required()->check(non_empty_path());
  cmp->add_option("B", x->b, "a result JSON, or results/expected/<hardware>.json")->required()->check(non_empty_path());
  auto* tol_opt = cmp->add_option("--tolerance", x->tolerance,
                                  "fraction, e.g. 0.1: exit 3 when a measured metric is worse than B by more")
                      ->check(finite_range(0.0, 10.0));
  cmp->add_option("--json", x->json_path, "also write the comparison as JSON: every row with its parameters, the "
                                          "per-metric summary and the notes (written atomically; - is stdout, the "
                                          "table then goes to stderr)")
      ->type_name("FILE|-")
      ->check(non_empty_path());
  return {cmp, [x, tol_opt] { return cmd_compare(x->a, x->b, x->tolerance, tol_opt->count() > 0, x->json_path); }};
}

Command add_analyze_hang(CLI::App& app) {
  struct Args {
    std::string dir, json_path;
  };
  auto x = std::make_shared<Args>();
  auto* hang = app.add_subcommand("analyze-hang",
                                  "explain a collective hang from the flight-recorder dumps the ranks wrote "
                                  "(stallbench's, or PyTorch's Flight Recorder)");
  hang->add_option("DIR", x->dir,
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
  // a bare --json is stdout ("-"), as it always was; the report then goes to stderr
  auto* json_opt = add_json_output(hang, x->json_path, "the analysis as JSON (the report then goes to stderr)");
  return {hang, [x, json_opt] { return cmd_analyze_hang(x->dir, json_output(json_opt, x->json_path)); }};
}

}  // namespace sb::app
