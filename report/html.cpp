// diagnose's HTML report: one self-contained file (inline CSS and SVG; no
// script, no font, no image or stylesheet from the network), readable
// offline and attachable to an issue.
#include <algorithm>  // std::max
#include <sstream>    // std::ostringstream
#include <string>     // std::string

#include <fmt/format.h>  // fmt::format

#include "harness/printer.hpp"              // format_number
#include "report/html.hpp"

#include "report/html_trace.hpp"  // trace_timeline_html, job_ranks_html, trace_origin_html

namespace sb::report {
namespace {

using json = nlohmann::ordered_json;

std::string esc(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (const char c : s) switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += c;
    }
  return o;
}

// Two horizontal bars on one scale: the user's setting and the fix.
std::string bars(double base, double fixed, const std::string& unit, const std::string& first = "yours",
                 const std::string& second = "fixed") {
  const double top = std::max({base, fixed, 1e-30});
  const double w = 260;
  auto bar = [&](double v, int y, const char* colour, const std::string& label) {
    return fmt::format(
        "<rect x='0' y='{}' width='{:.1f}' height='14' fill='{}'/><text x='{:.1f}' y='{}' font-size='11'>{} {}</text>",
        y, std::max(1.0, w * v / top), colour, std::max(1.0, w * v / top) + 4, y + 11, esc(label),
        esc(format_number(v) + " " + unit));
  };
  return fmt::format("<svg width='460' height='36' role='img' aria-label='baseline and fix'>{}{}</svg>",
                     bar(base, 0, "#b0b7c3", first), bar(fixed, 18, "#2f7d4f", second));
}

std::string page_head(const std::string& title) {
  std::ostringstream o;
  o << "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
       "<meta name='viewport' content='width=device-width, initial-scale=1'>"
       "<title>" + esc(title) + "</title><style>"
       "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:60em;"
       "color:#1d2330;padding:0 1em}h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em}"
       "table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #dde1e8;padding:.35em .5em;"
       "text-align:left;vertical-align:top}th{background:#f3f5f8}.ok{color:#2f7d4f}.skipped{color:#8a6d00}"
       ".error,.oom,.hang{color:#b3261e}code{background:#f3f5f8;padding:0 .25em;border-radius:3px}"
       ".finding{border-left:4px solid #2f7d4f;padding:.3em .8em;margin:.8em 0;background:#f7faf8}"
       ".note{color:#5b6472}.sim{background:#fff4d6;padding:.4em .8em;border:1px solid #e8c96a}"
       "</style></head><body>\n";
  return o.str();
}

const char* pattern_colour(const std::string& p) {
  if (p == "healthy") return "#2f7d4f";
  if (p == "spiky") return "#d98c1f";
  if (p == "steady-low") return "#c9b037";
  if (p == "stuck") return "#b3261e";
  return "#b0b7c3";  // idle
}

// The utilization series as a line over time (0-100%), SM active dashed
// when the log has it, and below it the pattern of each summary window.
std::string watch_chart(const json& sum) {
  const json& ser = sum["series"];
  const json& t = ser["t_s"];
  const json& u = ser["util_pct"];
  const double w = 640, h = 120;
  const double t_end = std::max(sum.value("duration_s", 0.0), t.empty() ? 0.0 : t.back().get<double>()) +
                       ser.value("bucket_s", 1.0);
  auto x = [&](double ts) { return w * ts / std::max(t_end, 1e-9); };
  std::string pts, sm;
  for (std::size_t i = 0; i < t.size(); ++i) {
    pts += fmt::format("{:.1f},{:.1f} ", x(t[i].get<double>()), h - h * u[i].get<double>() / 100);
    if (ser.contains("sm_active") && ser["sm_active"][i].is_number())
      sm += fmt::format("{:.1f},{:.1f} ", x(t[i].get<double>()), h - h * ser["sm_active"][i].get<double>());
  }
  std::string svg = fmt::format(
      "<svg width='{0}' height='{1}' role='img' aria-label='utilization over time'>"
      "<rect x='0' y='0' width='{0}' height='{2}' fill='#f7f8fa' stroke='#dde1e8'/>"
      "<line x1='0' y1='{3:.1f}' x2='{0}' y2='{3:.1f}' stroke='#9aa3b0' stroke-dasharray='3,3'/>"
      "<polyline fill='none' stroke='#2b5fb3' stroke-width='1.5' points='{4}'/>",
      w, h + 38, h, h - h * 0.9, pts);
  if (!sm.empty())
    svg += fmt::format("<polyline fill='none' stroke='#7a3fb0' stroke-width='1' stroke-dasharray='4,2' points='{}'/>", sm);
  const double win = sum.value("window_s", 10.0);
  for (const auto& wd : sum["windows"]) {
    const double ts = wd["t_s"].get<double>();
    svg += fmt::format("<rect x='{:.1f}' y='{:.1f}' width='{:.1f}' height='14' fill='{}'><title>{} at {:.0f} s</title></rect>",
                       x(ts), h + 6, std::max(1.0, x(std::min(ts + win, t_end)) - x(ts)),
                       pattern_colour(wd["pattern"].get<std::string>()), esc(wd["pattern"].get<std::string>()), ts);
  }
  svg += fmt::format("<text x='0' y='{:.0f}' font-size='11'>0 s</text><text x='{:.0f}' y='{:.0f}' font-size='11' "
                     "text-anchor='end'>{:.0f} s</text></svg>",
                     h + 34, w, h + 34, t_end);
  return svg;
}

std::string watch_html(const Result& r) {
  std::ostringstream o;
  o << page_head("stallbench watch");
  o << "<h1>stallbench watch</h1>\n";
  const json& props = r.meta.value("/device/props"_json_pointer, json::object());
  const std::string source = props.value("source", std::string("nvml"));
  o << fmt::format("<p>{} &middot; stallbench {} ({}) &middot; {}</p>\n",
                   source == "nvml" ? fmt::format("NVML, every {} ms", props.value("interval_ms", 0))
                                    : esc(source + " log " + props.value("file", std::string())),
                   esc(r.meta.value("version", std::string())), esc(r.meta.value("git_sha", std::string())),
                   esc(r.meta.value("time_utc", std::string())));
  o << "<p class='note'>The pattern rule (the dataloader scenario's): idle under 5% mean; healthy at 90% and up; "
       "spiky when at least 15% of samples are near idle and 15% near full; steady-low otherwise; stuck when "
       "utilization stays 0 with memory held past --stuck-after. Line: utilization.gpu (blue), SM active (purple, "
       "dashed, when recorded), 90% dashed; bar: the pattern of each window (green healthy, orange spiky, yellow "
       "steady-low, red stuck, grey idle).</p>\n";
  o << "<h2>Findings</h2>\n";
  if (r.findings.empty()) o << "<p>None: healthy or idle throughout.</p>\n";
  for (const Finding& f : r.findings) {
    o << "<div class='finding'><b>" << esc(f.cause) << "</b><br>" << esc(f.summary);
    if (f.evidence.contains("config_line"))
      o << "<br>Change: <code>" << esc(f.evidence["config_line"].get<std::string>()) << "</code>";
    if (f.evidence.contains("command"))
      o << "<br><span class='note'>Then: <code>" << esc(f.evidence["command"].get<std::string>()) << "</code></span>";
    o << "</div>\n";
  }
  for (const Point& p : r.points) {
    const json& sum = p.info.contains("summary") ? p.info["summary"] : json::object();
    o << fmt::format("<h2>GPU {} {}</h2>\n", p.params.value("gpu", 0), esc(p.info.value("name", std::string())));
    if (p.status != Status::ok) {
      o << "<p class='error'>" << esc(p.reason) << "</p>\n";
      continue;
    }
    if (sum.contains("series")) o << watch_chart(sum) << "\n";
    o << "<table><tr><th>figure</th><th>value</th><th>note</th></tr>\n";
    for (const Metric& m : p.metrics)
      o << "<tr><td>" << esc(m.name) << "</td><td>" << esc(format_number(m.value) + " " + m.unit) << "</td><td class='note'>"
        << esc(m.note) << "</td></tr>\n";
    o << "</table>\n";
  }
  o << "<p class='note'>Written by <code>stallbench watch</code>; the result JSON holds every figure with its unit "
       "and the series behind the chart.</p>\n</body></html>\n";
  return o.str();
}

// The machine the figures are of: the device measured on, or (a trace: read, not measured) the trace's own.
std::string header_line(const Result& r, const json& dm) {
  const std::string dev = r.meta.value("/device/id"_json_pointer, std::string("?"));
  const std::string version = esc(r.meta.value("version", std::string())), sha = esc(r.meta.value("git_sha", std::string())),
                    when = esc(r.meta.value("time_utc", std::string()));
  if (dm.value("source", std::string()) == "trace")
    return trace_origin_html(r.meta) +
           fmt::format("<p class='note'>Read by stallbench {} ({}) &middot; {}; reproduce commands for {}</p>\n",
                       version, sha, when, esc(dev));
  return fmt::format("<p>Device <b>{}</b> {} &middot; stallbench {} ({}) &middot; {}</p>\n", esc(dev),
                     esc(r.meta.value("/device/name"_json_pointer, std::string())), version, sha, when);
}

}  // namespace

// A finding's evidence beyond the lines shown above it, folded: the summary first, the figures under it
// (a run's figures list, a trace rule's numbers, the basis of the gain, the step, the source).
std::string evidence_details(const json& ev) {
  static const char* const kShown[] = {"caveat", "config_line", "command", "explore", "change"};
  std::ostringstream d;
  std::size_t n = 0;
  for (const auto& [k, v] : ev.items()) {
    bool shown = false;
    for (const char* s : kShown) shown = shown || k == s;
    if (shown || v.is_null()) continue;
    ++n;
    if (v.is_array()) {
      d << "<li>" << esc(k) << ":<ul>";
      for (const auto& x : v) d << "<li>" << esc(x.is_string() ? x.get<std::string>() : x.dump()) << "</li>";
      d << "</ul></li>";
    } else {
      d << "<li>" << esc(k) << ": " << esc(v.is_string() ? v.get<std::string>() : v.dump()) << "</li>";
    }
  }
  if (n == 0) return {};
  return "<details><summary>evidence</summary><ul class='note'>" + d.str() + "</ul></details>";
}

// The findings of a diagnosis: each one's cause and gain, its summary, the line to change and the command
// that reproduces it, and its evidence folded under it.
std::string findings_html(const Result& r, bool from_trace, bool from_run, bool simulated) {
  std::ostringstream o;
  o << (from_trace ? "<h2>Findings, by estimated gain</h2>\n"
        : from_run ? "<h2>Findings, from what the run logged</h2>\n"
                   : "<h2>Findings, by their verdict on your training loop, then by measured gain</h2>\n");
  for (const Finding& f : r.findings) {
    o << "<div class='finding'><b>" << esc(f.cause) << "</b>";
    if (f.speedup)
      o << fmt::format(" &mdash; {:.2f}x {}", *f.speedup,
                       from_trace ? "estimated" : simulated ? "modelled" : "measured");
    o << "<br>" << esc(f.summary);
    if (f.evidence.contains("caveat") && f.evidence["caveat"].is_string())
      o << "<br><span class='error'>Caveat: " << esc(f.evidence["caveat"].get<std::string>()) << "</span>";
    if (f.evidence.contains("config_line") && !f.evidence["config_line"].get<std::string>().empty())
      o << "<br>Change: <code>" << esc(f.evidence["config_line"].get<std::string>()) << "</code>";
    if (f.evidence.contains("change") && f.evidence["change"].is_string() && !f.evidence["change"].get<std::string>().empty())
      o << "<br>Change: " << esc(f.evidence["change"].get<std::string>());
    if (f.evidence.contains("command") && f.evidence["command"].is_string())
      o << "<br><span class='note'>Reproduce: <code>" << esc(f.evidence["command"].get<std::string>())
        << "</code></span>";
    if (f.evidence.contains("explore"))
      o << "<br><span class='note'>Explore: <code>" << esc(f.evidence["explore"].get<std::string>())
        << "</code></span>";
    o << evidence_details(f.evidence) << "</div>\n";
  }
  return o.str();
}

std::string format_html(const Result& r) {
  std::ostringstream o;
  const json& dm = r.meta.contains("diagnose") ? r.meta["diagnose"] : json::object();
  const bool simulated = r.meta.value("/device/simulated"_json_pointer, false);
  if (r.scenario == "watch") return watch_html(r);
  o << page_head("stallbench diagnose");
  o << "<h1>stallbench diagnose</h1>\n" << header_line(r, dm);
  if (dm.contains("wall_s") && dm["wall_s"].is_number())
    o << fmt::format("<p>The diagnosis took {:.0f} s.</p>\n", dm["wall_s"].get<double>());
  if (simulated)
    o << "<p class='sim'>Simulated device: every figure below is modelled, not measured.</p>\n";
  if (dm.contains("measured_shape"))
    o << "<p class='note'>"
      << (dm["measured_shape"].value("reduced", false) ? "Measured at a reduced shape: " : "Shape: ")
      << esc(dm["measured_shape"].value("note", std::string())) << "</p>\n";

  const bool from_trace = dm.value("source", std::string()) == "trace";
  if (from_trace) {
    const json& tm = r.meta.contains("trace") ? r.meta["trace"] : json::object();
    o << "<p>Trace <code>" << esc(dm.value("trace", std::string())) << "</code>: "
      << esc(fmt::format("{} events kept of {:.1f} MB of JSON, read in {:.2f} s", tm.value("events_kept", std::int64_t(0)),
                         tm.value("json_bytes", 0.0) / 1e6, tm.value("read_s", 0.0)))
      << ". Figures read from the trace, defined as Holistic Trace Analysis defines them; the gains are "
         "estimates (each finding says from what).</p>\n";
    // HTA's temporal breakdown per device: one stacked bar each
    if (r.meta.contains("trace_analysis") && r.meta["trace_analysis"].contains("temporal")) {
      o << "<h2>GPU time (HTA temporal breakdown)</h2>\n";
      for (const auto& d : r.meta["trace_analysis"]["temporal"]) {
        const double c = d.value("compute_pct", 0.0), n = d.value("non_compute_pct", 0.0), i = d.value("idle_pct", 0.0);
        o << fmt::format(
            "<svg width='460' height='34' role='img' aria-label='device {0} time'>"
            "<rect x='0' y='0' width='{1:.1f}' height='14' fill='#2f7d4f'/>"
            "<rect x='{1:.1f}' y='0' width='{2:.1f}' height='14' fill='#d9a441'/>"
            "<rect x='{3:.1f}' y='0' width='{4:.1f}' height='14' fill='#b0b7c3'/>"
            "<text x='0' y='28' font-size='11'>device {0}: compute {5:.1f}%, non-compute {6:.1f}%, idle {7:.1f}%</text>"
            "</svg><br>\n",
            d.value("device", 0), 4.6 * c, 4.6 * n, 4.6 * (c + n), 4.6 * i, c, n, i);
      }
    }
    o << job_ranks_html(r.meta) << trace_timeline_html(r.meta);
  }
  const bool from_run = dm.value("source", std::string()) == "run";
  o << findings_html(r, from_trace, from_run, simulated);

  o << "<h2>Checks, in the standard order</h2>\n<table><tr><th>check</th><th>status</th><th>measured</th></tr>\n";
  for (const Point& p : r.points) {
    const std::string name = p.params.value("check", std::string());
    if (name == "summary") continue;
    const std::string st(to_string(p.status));
    o << "<tr><td>" << esc(name) << "</td><td class='" << esc(st) << "'>" << esc(st) << "</td><td>";
    if (p.status != Status::ok)
      o << esc(p.reason);
    else if (from_trace) {  // the rule's evidence or its reading, then its figures
      if (p.info.contains("evidence")) o << esc(p.info["evidence"].get<std::string>()) << "<br>";
      else if (p.info.contains("reading")) o << esc(p.info["reading"].get<std::string>()) << "<br>";
      o << "<span class='note'>";
      for (std::size_t i = 0; i < p.metrics.size(); ++i)
        o << (i ? "; " : "") << esc(p.metrics[i].name) << " " << esc(format_number(p.metrics[i].value)) << " "
          << esc(p.metrics[i].unit);
      o << "</span>";
    } else if (const Metric* g = p.metric("gain")) {
      o << bars(p.metric("baseline")->value, p.metric("with_fix")->value, p.metric("baseline")->unit)
        << fmt::format("<br>{:.2f}x", g->value);
      if (p.info.contains("reading") && p.info["reading"].is_string())
        o << "<br><span class='note'>" << esc(p.info["reading"].get<std::string>()) << "</span>";
    }
    else if (from_run) {  // what the run's file says for this check, then its figures
      if (p.info.contains("reading") && p.info["reading"].is_string()) o << esc(p.info["reading"].get<std::string>());
      if (!p.metrics.empty()) o << "<br><span class='note'>";
      for (std::size_t i = 0; i < p.metrics.size(); ++i)
        o << (i ? "; " : "") << esc(p.metrics[i].name) << " " << esc(format_number(p.metrics[i].value)) << " "
          << esc(p.metrics[i].unit);
      if (!p.metrics.empty()) o << "</span>";
    }
    else if (name == "utilization" && p.metric("busy_pct"))
      o << fmt::format("{} tokens/s, {:.0f}% busy, {}", esc(format_number(p.metric("tokens_per_s")->value)),
                       p.metric("busy_pct")->value, esc(p.info.value("pattern", std::string())))
        << "<br><span class='note'>" << esc(p.info.value("reading", std::string())) << "</span>";
    else if (name == "applied" && p.info.contains("lines")) {
      o << esc(p.info.value("reading", std::string())) << "<br>";
      for (const auto& l : p.info["lines"]) {
        o << "<code>" << esc(l.value("config_line", std::string())) << "</code>: ";
        if (l.contains("step_gain"))
          o << esc(fmt::format("{:.2f}x alone on their training loop ({:.2f}x on its part alone)", l["step_gain"].get<double>(),
                               l.value("part_gain", 0.0)));
        if (l.contains("last_gain"))
          o << esc(fmt::format("; {:.2f}x added last", l["last_gain"].get<double>()));
        if (l.contains("repeat_gain"))
          o << esc(fmt::format("; again {:.2f}x", l["repeat_gain"].get<double>()))
            << (l.value("holds", false) ? " <span class='ok'>holds</span>" : " <span class='error'>off by over 15%</span>");
        o << "<br>";
      }
      if (const Metric* t = p.metric("step_gain_together"))
        o << esc(fmt::format("every line together: {:.2f}x on their training loop", t->value));
    } else if (name == "memory" && p.metric("footprint_gib"))
      o << bars(p.metric("capacity_gib")->value, p.metric("footprint_gib")->value, "GiB", "capacity", "needs")
        << "<br><span class='note'>the device's capacity and the modelled footprint; "
        << esc(p.info.value("note", std::string())) << "</span>";
    if (!from_trace && p.info.is_object() && p.info.contains("warning") && p.info["warning"].is_string())
      o << "<br><span class='error'>" << esc(p.info["warning"].get<std::string>()) << "</span>";
    o << "</td></tr>\n";
  }
  o << "</table>\n";

  for (const Point& p : r.points)
    if (p.params.value("check", std::string()) == "summary" && p.metric("tokens_per_s_now")) {
      // the loop with every line applied is measured (or modelled) where the applied check ran: "estimated"
      // only where the figure is the claimed gains multiplied
      const bool loop = p.info.value("combined_gain_measured", false);
      o << (loop ? "<h2>Their training loop</h2>\n" : "<h2>This step</h2>\n")
        << bars(p.metric("tokens_per_s_now")->value, p.metric("tokens_per_s_after_estimate")->value, "tokens/s",
                "now", loop ? "with the fixes" : "estimated")
        << "<p class='note'>Now (" << (simulated ? "modelled" : "measured") << ") and after the fixes: "
        << esc(p.metric("tokens_per_s_after_estimate")->note) << ".</p>\n";
      if (const std::string m = mfu_line(p); !m.empty()) o << "<p>" << esc(m) << "</p>\n";
      if (p.info.contains("observed")) o << "<p>" << esc(p.info["observed"].get<std::string>()) << "</p>\n";
    }

  if (dm.contains("config")) {
    o << "<h2>Your config, as read</h2>\n<table><tr><th>key</th><th>value</th><th>from</th></tr>\n";
    auto row = [&](const std::string& k, const json& v) {
      if (!v.is_object() || !v.contains("value")) return;
      o << "<tr><td>" << esc(k) << "</td><td>"
        << esc(v["value"].dump(-1, ' ', false, json::error_handler_t::replace)) << "</td><td class='note'>"
        << esc(v.value("source", std::string())) << "</td></tr>\n";
    };
    for (const auto& [k, v] : dm["config"].items()) {
      if (k == "model" && v.is_object())
        for (const auto& [mk, mv] : v.items()) row("model." + mk, mv);
      else
        row(k, v);
    }
    o << "</table>\n";
  }
  o << "<p class='note'>Written by <code>stallbench diagnose</code>; the result JSON holds every figure with its "
       "unit and the sub-runs behind it.</p>\n</body></html>\n";
  return o.str();
}

std::string mfu_line(const Point& p) {
  if (!p.metric("mfu_now_pct") || !p.metric("mfu_after_pct")) return "";
  const std::string over = p.info.value("mfu_over", std::string());
  // each over the rate of the dtype it ran in: bf16's is 6x fp32's on an AMX Xeon, so a loop 2.4x faster
  // read 11% -> 4.5%, which reads as a loss unless the two rates are beside the figures
  auto of = [&](const char* key) {
    if (!p.info.contains(key)) return std::string();
    const json& k = p.info[key];
    return fmt::format(" (of {}'s {} TFLOP/s)", k.value("dtype", std::string()), format_number(k.value("tflops", 0.0)));
  };
  return fmt::format("MFU: {:.2g}% now{}, {:.2g}% with the fixes{} (real tokens, over {})",
                     p.metric("mfu_now_pct")->value, of("mfu_peak_now"), p.metric("mfu_after_pct")->value,
                     of("mfu_peak_after"),
                     over == "measured" ? "a large GEMM of each one's dtype measured in this run: its rate here, not a "
                                          "datasheet peak"
                     : over == "mixed"  ? "the expected peak of one dtype and, for the other, which has none, a GEMM "
                                          "measured in this run: see each figure's note"
                                        : "the expected peak of each one's dtype");
}

}  // namespace sb::report
