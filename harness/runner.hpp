// Runs one scenario over its sweep on one device and assembles the Result.
#pragma once

#include <functional>  // std::function
#include <string>      // std::string
#include <vector>      // std::vector

#include "harness/scenario.hpp"  // Scenario, RunContext

namespace sb {

struct RunOptions {
  std::vector<std::string> assignments;  // "-p key=v1,v2" texts
  bool quick = false;
  // Called before each point runs (or is skipped after a hang), with its parameters (the CLI keeps them,
  // so a watchdog that fires mid-point can name the point that hung), its index in
  // the sweep and the sweep's size (the CLI's [k/N] and time left).
  std::function<void(const ParamSet&, std::size_t index, std::size_t total)> on_point_start;
};

// Expands the sweep (throws UsageError before any work), runs every point,
// maps typed errors to point statuses, then lets the scenario analyze.
// After a hang the remaining points are skipped (the device is not trusted).
// on_point is called after each point (for live output).
Result run_scenario(const Scenario& sc, RunContext& ctx, const RunOptions& opts,
                    const nlohmann::ordered_json& meta,
                    const std::function<void(const Point&, const Result&)>& on_point = {});

// Exit status of a finished run: 0 when every point is ok, skipped or oom;
// 4 when a point hung; 1 when a point failed (error).
// What the runner does to the findings after Scenario's analysis: a finding
// left without a cause gets its scenario's (Scenario::cause, so no cause
// string is written twice), and each summary the simulated label when the
// device is simulated.
void finish_findings(Result& r, const Scenario& sc, bool simulated);

// `text` appended to the string at obj[key] ("; " between), or set there: a point's warning, a
// finding's caveat. obj must be an object (or null: it becomes one).
void append_text(nlohmann::ordered_json& obj, const char* key, const std::string& text);
// append_text(p.info, "warning", w): what the table prints under a point's row.
void add_warning(Point& p, const std::string& w);

int run_exit_code(const Result& r);

}  // namespace sb
