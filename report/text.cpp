// diagnose's text report (text.hpp): what the terminal shows, from the result alone.
#include "report/text.hpp"

#include <sstream>  // std::ostringstream
#include <string>   // std::string

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/printer.hpp"  // format_number
#include "harness/units.hpp"    // format_bytes
#include "report/html.hpp"      // mfu_line

namespace sb::report {

using json = nlohmann::ordered_json;

namespace {
// One check of diagnose --trace on a line: the rule's evidence when it fired,
// else its reading or its first figures.
std::string trace_line(const Point& p) {
  if (p.info.contains("evidence")) return p.info["evidence"].get<std::string>();
  if (p.info.contains("reading")) return p.info["reading"].get<std::string>();
  std::string s;
  for (std::size_t i = 0; i < p.metrics.size() && i < 3; ++i)
    s += fmt::format("{}{} {} {}", i ? ", " : "", p.metrics[i].name, format_number(p.metrics[i].value),
                     p.metrics[i].unit);
  return s;
}
// A finding's gain and how it was had, for its lead line: ": 1.13x measured on your loop".
std::string lead_gain(const Finding& f, bool simulated) {
  const std::string check = f.evidence.value("check", std::string());
  const std::string verdict = f.evidence.value("verdict", std::string());
  // the loader's runs load a sample at an assumed cost (the dataloader scenario's supply), not the user's:
  // its gain is modelled whatever the loop showed
  std::string how = simulated               ? "modelled (simulated device)"
                    : check == "memory" || check == "offload" ? "modelled from your config"
                    : check == "loader"     ? "modelled: your per-sample load cost is assumed, not measured"
                    : !verdict.empty()      ? "measured"
                                            : "measured at your shape (its scenario alone)";
  if (!verdict.empty()) {
    std::string v = verdict;  // "confirmed on their loop" -> "confirmed on your loop"
    if (const auto at = v.find("their loop"); at != std::string::npos) v.replace(at, 10, "your loop");
    how += ": " + v;
  }
  if (!f.speedup) return " (" + how + ")";
  if (f.evidence.contains("gain_serial") && f.evidence["gain_serial"].is_number())  // a range: overlapped to serial
    return fmt::format(": {:.2f}x to {:.2f}x, {}", *f.speedup, f.evidence["gain_serial"].get<double>(), how);
  return fmt::format(": {:.2f}x, {}", *f.speedup, how);
}

}  // namespace

std::string format_text(const Result& r) {
  std::ostringstream o;
  const json& dm = r.meta.contains("diagnose") ? r.meta["diagnose"] : json::object();
  const bool from_run = dm.value("source", std::string()) == "run";
  // a trace and a run are read, not measured: their points print what was read
  const bool from_trace = dm.value("source", std::string()) == "trace" || from_run;
  if (from_run) {
    const json& rm = r.meta.contains("run") ? r.meta["run"] : json::object();
    o << "diagnose " << dm.value("run", std::string()) << "\n";
    // the curves' file: trainer_state.json, or the event files where the run has none
    const std::string curves = rm.contains("curves") && rm["curves"].is_string() ? rm["curves"].get<std::string>()
                                                                                 : rm.value("trainer_state", std::string());
    o << fmt::format("  {}: {} training and {} evaluation logs to step {}{}{}\n",
                     curves.empty() ? "no curves" : curves, rm.value("training_logs", std::int64_t(0)),
                     rm.value("evaluation_logs", std::int64_t(0)), rm.value("global_step", std::int64_t(0)),
                     rm.value("max_steps", std::int64_t(0)) > 0
                         ? fmt::format(" of {}", rm.value("max_steps", std::int64_t(0)))
                         : "",
                     rm.value("resumed", false) ? " (resumed: the step goes back in the log)" : "");
    if (rm.contains("adapter") && rm["adapter"].is_object() && rm["adapter"].contains("peft_type"))
      o << fmt::format("  trains adapters: {} r={} ({}){}\n", rm["adapter"].value("peft_type", std::string()),
                       rm["adapter"].value("r", std::int64_t(0)), rm["adapter"].value("file", std::string()),
                       rm["adapter"].value("base_model", std::string()).empty()
                           ? ""
                           : ", base " + rm["adapter"].value("base_model", std::string()));
    if (rm.contains("training_args") && rm["training_args"].is_object())
      o << fmt::format("  settings: {} ({}{})\n", rm["training_args"].value("file", std::string()),
                       rm["training_args"].value("class", std::string()),
                       rm["training_args"].value("version_hint", std::string()).empty()
                           ? ""
                           : "; " + rm["training_args"].value("version_hint", std::string()));
    o << "  the curves the trainer logged, read as they are: each finding names the real step\n";
  } else if (from_trace) {
    const json& tm = r.meta.contains("trace") ? r.meta["trace"] : json::object();
    o << "diagnose --trace " << dm.value("trace", std::string()) << "\n";
    o << fmt::format("  {} events kept of {:.1f} MB of JSON, read in {:.2f} s ({:.0f} MB/s){}{}\n",
                     tm.value("events_kept", std::int64_t(0)), tm.value("json_bytes", 0.0) / 1e6,
                     tm.value("read_s", 0.0), tm.value("read_mb_per_s", 0.0),
                     tm.contains("rank") && tm["rank"].is_number() ? fmt::format(", rank {}", tm["rank"].get<long>())
                                                                   : "",
                     tm.contains("devices") && !tm["devices"].empty()
                         ? ", " + tm["devices"][0].get<std::string>()
                         : "");
    o << "  figures read from the trace, defined as Holistic Trace Analysis defines them; gains are estimates\n";
  } else {
    o << "diagnose: " << r.meta.value("/device/id"_json_pointer, std::string("?")) << "\n";
  }
  if (r.meta.value("/device/simulated"_json_pointer, false))
    o << "  SIMULATED device: every figure below is modelled, not measured\n";
  if (dm.contains("measured_shape"))
    o << (dm["measured_shape"].value("reduced", false) ? "  measured at a reduced shape: " : "  shape: ")
      << dm["measured_shape"].value("note", std::string()) << "\n";
  if (dm.contains("busy_checks") && dm["busy_checks"].is_array() && !dm["busy_checks"].empty()) {
    std::vector<std::string> names;
    for (const auto& b : dm["busy_checks"]) names.push_back(b.value("check", std::string()));
    o << fmt::format("  WARNING: the machine was not quiet: other processes or the hypervisor took a share of its "
                     "CPUs during {} of the checks ({}); their figures may be wrong, and each says so below\n",
                     names.size(), fmt::join(names, ", "));
  }
  o << "\nchecks, in the standard order:\n";
  const bool simulated = r.simulated();
  for (const Point& p : r.points) {
    const std::string name = p.params.value("check", std::string());
    if (name == "summary") continue;
    // "ok" read as "healthy" beside a 0.43x line: the column says how the figure was had.
    const std::string how = p.status != Status::ok ? std::string(to_string(p.status))
                            : from_trace          ? "read"
                            : simulated || name == "memory" ? "modelled"
                                                            : "measured";
    o << fmt::format("  {:<13} {:<9}", name, how);
    if (p.status != Status::ok)
      o << " " << p.reason;
    else if (from_trace)  // what the rule saw, or the figures it read
      o << " " << trace_line(p);
    else if (const Metric* g = p.metric("gain")) {
      o << fmt::format(" {} -> {} {} ({:.2f}x)", format_number(p.metric("baseline")->value),
                       format_number(p.metric("with_fix")->value), p.metric("baseline")->unit, g->value);
      if (p.info.contains("reading") && p.info["reading"].is_string())  // what the figures say (batch: its limit)
        o << "\n" << std::string(24, ' ') << p.info["reading"].get<std::string>();
    } else if (name == "utilization" && p.metric("busy_pct"))
      o << fmt::format(" {} tokens/s on the step alone (padding included, no loader), {:.0f}% busy, {}",
                       format_number(p.metric("tokens_per_s")->value),
                       p.metric("busy_pct")->value, p.info.value("pattern", std::string()));
    else if (name == "memory" && p.metric("footprint_gib"))
      o << fmt::format(" about {:.1f} GiB of {:.1f} GiB (modelled)", p.metric("footprint_gib")->value,
                       p.metric("capacity_gib")->value);
    else if (name == "applied" && p.info.contains("reading"))
      o << " " << p.info["reading"].get<std::string>()
        << (p.metric("step_gain_together")
                ? fmt::format("; every line together: {:.2f}x on their training loop", p.metric("step_gain_together")->value)
                : "");
    o << "\n";
    if (!from_trace && p.info.is_object() && p.info.contains("warning") && p.info["warning"].is_string())
      o << std::string(24, ' ') << "WARNING: " << p.info["warning"].get<std::string>() << "\n";
  }
  if (!from_trace && dm.contains("wall_s") && dm["wall_s"].is_number()) {
    double checks = 0, applied = 0;
    for (const Point& p : r.points)
      if (p.info.is_object() && p.info.contains("wall_s") && p.info["wall_s"].is_number())
        (p.params.value("check", std::string()) == "applied" ? applied : checks) += p.info["wall_s"].get<double>();
    o << fmt::format("  took {:.0f} s: {:.0f} s of checks, {:.0f} s of their loop with each line applied\n",
                     dm["wall_s"].get<double>(), checks, applied);
  }
  o << (from_run     ? "\nfindings, by the step they start at:\n"
        : from_trace ? "\nfindings, by estimated gain:\n"
                     : "\nfindings, by their verdict on your training loop, then by measured gain:\n");
  int i = 0;
  for (const Finding& f : r.findings) {
    if (from_trace || f.cause == "none found") {
      o << fmt::format("  {}. [{}] {}\n", ++i, f.cause, f.summary);
    } else {
      // diagnose CONFIG: one short line to act on (the cause, the line to change, the gain and how it was had),
      // the evidence under it
      o << fmt::format("  {}. {}{}{}\n", ++i, f.cause,
                       f.evidence.value("config_line", std::string()).empty()
                           ? std::string()
                           : " -> " + f.evidence.value("config_line", std::string()),
                       lead_gain(f, r.simulated()));
      o << "     " << f.summary << "\n";
    }
    if (f.evidence.contains("figures") && f.evidence["figures"].is_array())
      for (const auto& line : f.evidence["figures"])
        if (line.is_string()) o << "     " << line.get<std::string>() << "\n";
    if (f.evidence.contains("change") && f.evidence["change"].is_string() && !f.evidence["change"].get<std::string>().empty())
      o << "     change: " << f.evidence["change"].get<std::string>()
        << (f.evidence.value("basis", std::string()) == "assumed" ? " (the cause is assumed, not measured)" : "") << "\n";
    if (f.evidence.contains("caveat") && f.evidence["caveat"].is_string())
      o << "     caveat: " << f.evidence["caveat"].get<std::string>() << "\n";
    if (f.evidence.contains("command")) o << "     reproduce: " << f.evidence["command"].get<std::string>() << "\n";
    if (f.evidence.contains("explore")) o << "     explore: " << f.evidence["explore"].get<std::string>() << "\n";
  }
  for (const Point& p : r.points)
    if (p.params.value("check", std::string()) == "summary") {
      if (p.metric("tokens_per_s_now") && p.info.value("no_line_to_apply", false))
        o << fmt::format("\nthroughput of their training loop: {} real tokens/s ({}; no line to apply)\n",
                         format_number(p.metric("tokens_per_s_now")->value), p.metric("tokens_per_s_now")->note);
      else if (p.metric("tokens_per_s_now"))
        o << fmt::format("\nthroughput of their training loop: {} real tokens/s now, {} with the fixes ({})\n",
                         format_number(p.metric("tokens_per_s_now")->value),
                         format_number(p.metric("tokens_per_s_after_estimate")->value),
                         p.metric("tokens_per_s_after_estimate")->note);
      if (const std::string m = mfu_line(p); !m.empty()) o << m << "\n";
      if (p.info.contains("observed")) o << p.info["observed"].get<std::string>() << "\n";
    }
  return o.str();
}

}  // namespace sb::report
