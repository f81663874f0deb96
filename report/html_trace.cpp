// diagnose --trace's pictures (html_trace.hpp).
#include "report/html_trace.hpp"

#include <algorithm>  // std::max, std::min
#include <map>        // std::map

#include <fmt/format.h>  // fmt::format

namespace sb::report {
namespace {

using json = nlohmann::ordered_json;

// what the host was doing (host_attribution.hpp's causes), each its colour and its words
const std::map<std::string, std::pair<const char*, const char*>>& causes() {
  static const std::map<std::string, std::pair<const char*, const char*>> m = {
      {"loader", {"#c0392b", "DataLoader"}},
      {"sync", {"#8e44ad", "synchronization"}},
      {"allocator", {"#d35400", "allocator"}},
      {"setup", {"#6d4c41", "set-up"}},
      {"launch", {"#2471a3", "launches"}},
      {"optimizer", {"#138d75", "optimizer"}},
      {"host_op", {"#e5a50a", "other host ops"}},
      {"python", {"#f4d03f", "Python"}},
      {"nothing", {"#99a3a4", "nothing recorded"}},
      {"other_stream", {"#34495e", "another stream"}},
      {"kernel_wait", {"#d5dbdb", "back-to-back kernels"}},
      {"gpu_wait", {"#aab7b8", "waiting on an event"}},
  };
  return m;
}
constexpr const char* kBusy = "#2f7d4f";

}  // namespace

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '\'': o += "&#39;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  return o;
}

std::string trace_timeline_html(const json& meta) {
  if (!meta.contains("timeline") || !meta["timeline"].is_array() || meta["timeline"].empty()) return "";
  const json& tl = meta["timeline"];
  const double w = 640;
  std::string o = "<h2>Each step: the GPU busy, and what the host did while it waited</h2>\n"
                  "<p class='note'>One row per steady iteration (warm-up left out): green where a kernel, copy or "
                  "memset ran on the device; each idle stretch coloured by what the host was doing (the host "
                  "attribution); pale grey: outside the device's first-to-last kernel window, not attributed.</p>\n";
  std::map<std::string, double> seen;
  int i = 0;
  for (const auto& it : tl) {
    const double ms = it.value("ms", 0.0);
    if (ms <= 0) continue;
    const double k = w / ms;
    std::string rects = fmt::format("<rect x='0' y='0' width='{:.1f}' height='16' fill='#eef0f1'/>", w);
    for (const auto& b : it.value("busy", json::array()))
      if (b.is_array() && b.size() >= 2)
        rects += fmt::format("<rect x='{:.2f}' y='0' width='{:.2f}' height='16' fill='{}'/>", k * b[0].get<double>(),
                             std::max(0.5, k * (b[1].get<double>() - b[0].get<double>())), kBusy);
    for (const auto& g : it.value("idle", json::array())) {
      if (!g.is_array() || g.size() < 3 || !g[2].is_string()) continue;
      const std::string c = g[2].get<std::string>();
      const auto f = causes().find(c);
      const char* colour = f == causes().end() ? "#99a3a4" : f->second.first;
      const double x0 = g[0].get<double>(), x1 = g[1].get<double>();
      seen[c] += x1 - x0;
      rects += fmt::format("<rect x='{:.2f}' y='0' width='{:.2f}' height='16' fill='{}'><title>{}: {:.2f} ms</title></rect>",
                           k * x0, std::max(0.5, k * (x1 - x0)), colour,
                           html_escape(f == causes().end() ? c : f->second.second), x1 - x0);
    }
    o += fmt::format("<div style='white-space:nowrap'><svg width='{:.0f}' height='18' role='img' aria-label='step {}'>{}</svg> "
                     "<span class='note'>iteration {}: {:.1f} ms</span></div>\n",
                     w, ++i, rects, i, ms);
  }
  o += "<p class='note'>";
  o += fmt::format("<span style='color:{}'>&#9632;</span> GPU busy ", kBusy);
  for (const auto& [c, us] : seen) {
    const auto f = causes().find(c);
    if (f == causes().end()) continue;
    o += fmt::format("&nbsp; <span style='color:{}'>&#9632;</span> {}", f->second.first, f->second.second);
  }
  o += "</p>\n";
  return o;
}

std::string job_ranks_html(const json& meta) {
  if (!meta.contains("job") || !meta["job"].contains("ranks")) return "";
  const json& job = meta["job"];
  std::string o = "<h2>The job's ranks, side by side</h2>\n<p class='note'>Each rank's GPU time as HTA breaks it down "
                  "(green compute, amber non-compute: communication and copies with nothing computing, grey idle; the "
                  "figures in that order, % of its GPU window); the red tick and \"waits\": the share of its step its "
                  "collectives spent waiting for the last rank to arrive.";
  if (job.contains("straggler") && job["straggler"].is_number())
    o += fmt::format(" The straggler: rank {}.", job["straggler"].get<long>());
  o += "</p>\n";
  const double w = 420;
  for (const auto& r : job["ranks"]) {
    const long rank = r.value("rank", 0L);
    const double step = r.value("step_ms", 0.0), wait = r.value("wait_ms", 0.0);
    double c = 0, n = 0, idle = 0;
    bool gpu = false;
    double most = -1;
    if (r.contains("trace_analysis") && r["trace_analysis"].contains("temporal"))
      for (const auto& t : r["trace_analysis"]["temporal"])  // its busiest device, as the text reads it
        if (t.is_object() && t.value("kernel_us", 0.0) > most) {
          most = t.value("kernel_us", 0.0);
          c = t.value("compute_pct", 0.0), n = t.value("non_compute_pct", 0.0), idle = t.value("idle_pct", 0.0);
          gpu = true;
        }
    if (!gpu) {  // a CPU job's rank: no GPU time to draw
      o += fmt::format("<div class='note'>rank {}: no GPU events (a CPU job); step {:.1f} ms &middot; waits {:.0f}%</div>\n",
                       rank, step, step > 0 ? std::min(100.0, 100 * wait / step) : 0);
      continue;
    }
    const double wp = step > 0 ? std::min(100.0, 100 * wait / step) : 0;
    const bool straggler = job.contains("straggler") && job["straggler"].is_number() && job["straggler"].get<long>() == rank;
    o += fmt::format(
        "<div style='white-space:nowrap'><svg width='{0:.0f}' height='18' role='img' aria-label='rank {1}'>"
        "<rect x='0' y='0' width='{2:.1f}' height='14' fill='#2f7d4f'/>"
        "<rect x='{2:.1f}' y='0' width='{3:.1f}' height='14' fill='#d9a441'/>"
        "<rect x='{4:.1f}' y='0' width='{5:.1f}' height='14' fill='#b0b7c3'/>"
        "<rect x='{6:.1f}' y='0' width='2' height='18' fill='#c0392b'><title>waits {7:.0f}% of its step</title></rect>"
        "</svg> <span class='note' style='font-size:12px'>rank {1}{8}: {9:.1f} / {10:.1f} / {11:.1f}% &middot; step "
        "{12:.1f} ms &middot; waits {7:.0f}%</span></div>\n",
        w, rank, w * c / 100, w * n / 100, w * (c + n) / 100, w * idle / 100, std::max(0.0, w * wp / 100 - 1), wp,
        straggler ? " <b>(straggler)</b>" : "", c, n, idle, step);
  }
  return o;
}

std::string trace_origin_html(const json& meta) {
  if (!meta.contains("trace")) return "";
  const json& t = meta["trace"];
  std::string gpu;
  if (t.contains("devices") && t["devices"].is_array() && !t["devices"].empty() && t["devices"][0].is_string())
    gpu = t["devices"][0].get<std::string>();
  std::string ranks;
  if (t.contains("ranks") && t["ranks"].is_number()) ranks = fmt::format("{} ranks", t["ranks"].get<long>());
  else if (t.contains("rank") && t["rank"].is_number())
    ranks = fmt::format("rank {}{}", t["rank"].get<long>(),
                        t.contains("world_size") && t["world_size"].is_number()
                            ? fmt::format(" of {}", t["world_size"].get<long>())
                            : "");
  return fmt::format("<p>The trace came from: <b>{}</b>{}</p>\n",
                     html_escape(gpu.empty() ? "a machine the trace does not name (no deviceProperties)" : gpu),
                     ranks.empty() ? "" : " &middot; " + html_escape(ranks));
}

}  // namespace sb::report
