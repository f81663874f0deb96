#include "harness/printer.hpp"

#include <algorithm>  // std::max, std::find
#include <cmath>      // std::fabs
#include <set>        // std::set
#include <vector>     // std::vector

#include <sys/ioctl.h>  // ioctl, TIOCGWINSZ
#include <unistd.h>     // isatty

#include <cstdlib>  // std::getenv, std::strtoul

#include <fmt/format.h>  // fmt::format

#include "harness/point_metrics.hpp"  // varying_params

namespace sb {

using json = nlohmann::ordered_json;

namespace {

std::string json_scalar(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) return format_number(v.get<double>());
  return v.dump();
}

std::string arrow(Direction d) {
  switch (d) {
    case Direction::higher: return " ↑";
    case Direction::lower: return " ↓";
    case Direction::none: return "";
  }
  return "";
}

// Display width in terminal columns: counts UTF-8 code points, not bytes.
std::size_t width(const std::string& s) {
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string pad(const std::string& s, std::size_t w, bool right) {
  const std::size_t sw = width(s);
  if (sw >= w) return s;
  return right ? std::string(w - sw, ' ') + s : s + std::string(w - sw, ' ');
}

}  // namespace

std::size_t table_width(int fd) {
  constexpr std::size_t kLeast = 60, kPipe = 120;
  if (const char* c = std::getenv("COLUMNS"); c && *c) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(c, &end, 10);
    if (end && *end == '\0' && v > 0) return std::max<std::size_t>(kLeast, v);
  }
  winsize ws{};
  if (::isatty(fd) && ::ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
    return std::max<std::size_t>(kLeast, ws.ws_col);
  return kPipe;
}

std::string format_point_line(const Point& p, const json& axes) {
  std::string line;
  // A swept axis, or one the point set itself (batch's grad_accum under global_batch).
  for (const auto& [k, v] : p.params.items())
    if (!axes.contains(k) || (axes[k].is_array() && (axes[k].size() > 1 || (axes[k].size() == 1 && axes[k][0] != v))))
      line += fmt::format("{}={} ", k, json_scalar(v));
  line += fmt::format("[{}]", to_string(p.status));
  // the table's metrics only: a packing point's line ran to 700 characters with the JSON-only ones
  for (const auto& m : p.metrics)
    if (m.in_table) line += fmt::format(" {}={} {}", m.name, format_number(m.value), m.unit);
  if (!p.reason.empty()) line += " — " + p.reason;
  return line;
}

std::string format_result_table(const Result& r, std::size_t max_width) {
  std::string out;
  const json& dev = r.meta.value("device", json::object());
  out += fmt::format("scenario: {}   device: {} ({}){}\n", r.scenario, dev.value("id", "?"), dev.value("name", "?"),
                     dev.value("simulated", false) ? "   SIMULATED figures, not measured" : "");
  // Axes whose points all hold one value go in the header; the others become columns. A
  // point may set an axis itself (batch's grad_accum under global_batch): its value, not the
  // sweep's, says what ran.
  std::vector<std::string> swept;
  std::string fixed;
  const std::set<std::string> varying = varying_params(r, {});
  for (const auto& [k, v] : r.params.items()) {
    if ((v.is_array() && v.size() > 1) || varying.count(k)) {
      swept.push_back(k);
      continue;
    }
    const json* held = nullptr;  // what the points ran
    for (const auto& p : r.points)
      if (p.params.contains(k)) {
        held = &p.params[k];
        break;
      }
    fixed += fmt::format(" {}={}", k, json_scalar(held ? *held : v.is_array() && !v.empty() ? v[0] : v));
  }
  if (!fixed.empty()) out += "fixed:" + fixed + "\n";
  if (!r.expected.is_null()) out += fmt::format("expected numbers: {}\n", r.expected.value("id", "?"));
  if (r.meta.contains("host_steal") && r.meta["host_steal"].is_object())
    out += fmt::format("note: {}\n", r.meta["host_steal"].value("note", ""));

  // Metric columns: union over points, in first-seen order. The header is two lines: the name, then
  // the unit and the direction (a one-line "step_ms (ms) ↓" made the batch table 330 columns wide).
  std::vector<std::string> metric_names;
  std::vector<std::string> metric_units;
  for (const auto& p : r.points)
    for (const auto& m : p.metrics)
      if (m.in_table && std::find(metric_names.begin(), metric_names.end(), m.name) == metric_names.end()) {
        metric_names.push_back(m.name);
        std::string u = m.unit + arrow(m.direction);
        metric_units.push_back(u.empty() || u[0] != ' ' ? u : u.substr(1));  // no unit: the arrow alone
      }

  std::vector<std::string> head, units;
  for (const auto& s : swept) head.push_back(s), units.emplace_back();
  head.push_back("status"), units.emplace_back();
  const std::size_t keys = head.size();  // the columns every block repeats
  head.insert(head.end(), metric_names.begin(), metric_names.end());
  units.insert(units.end(), metric_units.begin(), metric_units.end());
  bool any_stats = false;
  for (const auto& p : r.points)
    for (const auto& m : p.metrics) any_stats = any_stats || (m.in_table && m.stats);
  if (any_stats) head.push_back("noise"), units.emplace_back("sd/mean");
  std::vector<std::vector<std::string>> rows;
  for (const auto& p : r.points) {
    std::vector<std::string> row;
    for (const auto& s : swept) row.push_back(p.params.contains(s) ? json_scalar(p.params[s]) : "");
    row.push_back(std::string(to_string(p.status)));
    std::string noise;
    for (const auto& name : metric_names) {
      const Metric* m = p.metric(name);
      row.push_back(m ? format_number(m->value) : "-");
      if (m && m->stats && noise.empty()) noise = fmt::format("{:.1f}%", m->stats->stdrel * 100);
    }
    if (any_stats) row.push_back(noise.empty() ? "-" : noise);
    rows.push_back(std::move(row));
  }
  std::vector<std::size_t> w(head.size());
  for (std::size_t i = 0; i < head.size(); ++i) w[i] = std::max(width(head[i]), width(units[i]));
  for (const auto& row : rows)
    for (std::size_t i = 0; i < row.size(); ++i) w[i] = std::max(w[i], width(row[i]));

  // Blocks of columns that fit max_width, each repeating the swept axes and the status, as pandas
  // wraps a wide frame; every block holds at least one metric column.
  std::vector<std::vector<std::size_t>> blocks;
  {
    std::size_t key_w = 0;
    for (std::size_t i = 0; i < keys; ++i) key_w += w[i] + 2;
    std::vector<std::size_t> cur;
    std::size_t cur_w = key_w;
    for (std::size_t i = keys; i < head.size(); ++i) {
      if (max_width > 0 && !cur.empty() && cur_w + w[i] > max_width) {
        blocks.push_back(cur);
        cur.clear();
        cur_w = key_w;
      }
      cur.push_back(i);
      cur_w += w[i] + 2;
    }
    blocks.push_back(cur);
  }
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    std::vector<std::size_t> cols;
    for (std::size_t i = 0; i < keys; ++i) cols.push_back(i);
    cols.insert(cols.end(), blocks[b].begin(), blocks[b].end());
    auto emit = [&](const std::vector<std::string>& row) {
      std::string line;
      for (std::size_t j = 0; j < cols.size(); ++j) {
        const std::size_t i = cols[j];
        line += pad(row[i], w[i], i >= keys) + (j + 1 < cols.size() ? "  " : "");
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      out += line + "\n";
    };
    if (blocks.size() > 1) out += fmt::format("{}(columns {} of {})\n", b > 0 ? "\n" : "", b + 1, blocks.size());
    emit(head);
    if (std::any_of(cols.begin(), cols.end(), [&](std::size_t i) { return !units[i].empty(); })) emit(units);
    std::size_t total = 0;
    for (auto i : cols) total += w[i] + 2;
    out += std::string(total - 2, '-') + "\n";
    for (std::size_t k = 0; k < rows.size(); ++k) {
      emit(rows[k]);
      if (b + 1 < blocks.size()) continue;  // a point's notes once, under its row in the last block
      const Point& p = r.points[k];
      if (!p.reason.empty()) out += fmt::format("    {}\n", p.reason);
      const json& info = p.info;
      if (info.contains("sparkline") && info["sparkline"].is_string() && !info["sparkline"].get<std::string>().empty())
        out += fmt::format("    util {} {}\n", info["sparkline"].get<std::string>(), info.value("pattern", ""));
      if (info.contains("lines") && info["lines"].is_array())
        for (const auto& l : info["lines"])
          if (l.is_string()) out += fmt::format("    {}\n", l.get<std::string>());
      if (info.contains("warning") && info["warning"].is_string())
        out += fmt::format("    warning: {}\n", info["warning"].get<std::string>());
    }
  }
  if (!r.findings.empty()) {
    out += "\nfindings:\n";
    for (const auto& f : r.findings) {
      out += fmt::format("  - [{}] {}\n", f.cause, f.summary);
      if (f.evidence.is_object() && f.evidence.contains("caveat") && f.evidence["caveat"].is_string())
        out += fmt::format("    caveat: {}\n", f.evidence["caveat"].get<std::string>());
    }
  }
  return out;
}

}  // namespace sb
