#include "harness/compare.hpp"

#include <algorithm>  // std::max, std::find, std::all_of, std::any_of
#include <cmath>      // std::isfinite, std::log, std::exp
#include <map>        // std::map
#include <set>        // std::set

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/dtype.hpp"     // parse_dtype
#include "harness/errors.hpp"    // UsageError
#include "harness/files.hpp"     // terminal_safe
#include "harness/expected.hpp"  // ExpectedFile, expected_from_json, expected_mismatch (DeviceInfo, CpuInfo)
#include "harness/json_read.hpp"  // JsonRef, reading_file
#include "harness/printer.hpp"   // format_number

namespace sb {

using json = nlohmann::ordered_json;

Verdict judge(double a, double b, Direction d, double tol) {
  if (d == Direction::none || !std::isfinite(a) || !std::isfinite(b) || a < 0 || b < 0) return Verdict::not_comparable;
  // B at zero: no ratio, but a direction still reads it (0 skipped steps in B, 3 in A: worse).
  if (b == 0) {
    if (a == 0) return Verdict::same;
    return d == Direction::higher ? Verdict::better : Verdict::worse;
  }
  // gain > 1 means a is better than b whichever way the metric points.
  const double gain = d == Direction::higher ? a / b : b / std::max(a, 1e-300);
  if (gain > 1 + tol) return Verdict::better;
  if (gain < 1 - tol) return Verdict::worse;
  return Verdict::same;
}

Verdict judge_points(double a, double b, Direction d, double tol) {
  if (d == Direction::none || !std::isfinite(a) || !std::isfinite(b)) return Verdict::not_comparable;
  const double gain = d == Direction::higher ? a - b : b - a;  // percentage points in a's favour
  if (gain > tol * 100) return Verdict::better;
  if (gain < -tol * 100) return Verdict::worse;
  return Verdict::same;
}

// A percentage, or a difference already in points (the dataloader's model_error_pts, signed): A - B, never a
// ratio of two signed values.
bool judged_by_points(const std::string& unit) { return unit == "%" || unit == "pts"; }

namespace {

std::string point_label(const json& params);

const char* article(const std::string& word) {
  return !word.empty() && std::string_view("aeiou").find(word[0]) != std::string_view::npos ? "an" : "a";
}

CompareRow make_row(const json& params, const Metric& m, double b) {
  CompareRow r;
  r.point = point_label(params);
  r.params = params;
  r.metric = m.name;
  r.unit = m.unit;
  r.direction = m.direction;
  r.a = m.value;
  r.b = b;
  r.ratio = b != 0 ? m.value / b : 0;
  r.by_points = judged_by_points(m.unit);
  return r;
}

Verdict judge_row(const CompareRow& r, double tol) {
  return r.by_points ? judge_points(r.a, r.b, r.direction, tol) : judge(r.a, r.b, r.direction, tol);
}

std::string param_value(const json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string point_label(const json& params) {
  std::string s;
  for (const auto& [k, v] : params.items()) {
    if (!s.empty()) s += ' ';
    s += fmt::format("{}={}", k, param_value(v));
  }
  return s;
}

std::string result_label(const Result& r) {
  // Read from a checked result: meta.device's fields, when present, are typed.
  const json dev = r.meta.value("device", json::object());
  return fmt::format("{} on {} ({}){}", r.scenario, dev.value("id", "?"), dev.value("name", "?"),
                     r.simulated() ? " [simulated]" : "");
}

// A document's "kind" ("" when it has none); a kind that is not a string is
// an error naming the file.
std::string doc_kind(const json& doc, const std::string& file) {
  if (!doc.is_object() || !doc.contains("kind")) return "";
  return JsonRef(doc, file).at("kind").str();
}

// A's device and CPU as its result recorded them (meta.device, meta.cpu), to be read the way
// match_expected reads the machine a run is on. A field that is missing or of another type reads
// as unknown. A result from before meta.cpu.vendor was recorded (2026-12-02) gets the vendor its
// model name says, and a note.
void recorded_hardware(const Result& r, DeviceInfo& dev, CpuInfo& cpu, std::vector<std::string>& notes) {
  auto str = [](const json& o, const char* k) {
    const auto it = o.find(k);
    return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  auto num = [](const json& o, const char* k, int fallback) {
    const auto it = o.find(k);
    return it != o.end() && it->is_number_integer() ? it->get<int>() : fallback;
  };
  const json d = r.meta.contains("device") && r.meta["device"].is_object() ? r.meta["device"] : json::object();
  dev.id = str(d, "id");
  dev.name = str(d, "name");
  // As run_meta writes it (cpu, cuda, sim); without it, as the id reads (cuda:0, sim:h100).
  const std::string kind = str(d, "kind").empty() ? dev.id.substr(0, dev.id.find(':')) : str(d, "kind");
  // a kind this build does not know is not a cpu: the result names no device to match expected numbers for
  const auto parsed = parse_device_kind(kind);
  if (!parsed)
    throw UsageError(fmt::format("meta.device.kind: expected {}, got '{}'", fmt::join(kDeviceKindNames.names(), "|"),
                                 terminal_safe(kind)));
  dev.kind = *parsed;
  dev.simulated = r.simulated();
  if (d.contains("props") && d["props"].is_object()) dev.props = d["props"];
  const json c = r.meta.contains("cpu") && r.meta["cpu"].is_object() ? r.meta["cpu"] : json::object();
  cpu.model = str(c, "model");
  cpu.logical_cores = num(c, "logical_cores", 0);
  if (c.contains("isa") && c["isa"].is_array())
    for (const auto& f : c["isa"])
      if (f.is_string()) cpu.isa.push_back(f.get<std::string>());
  cpu.vendor = str(c, "vendor");
  cpu.family = num(c, "family", -1);
  if (cpu.vendor.empty() && dev.kind == DeviceKind::cpu) {
    if (cpu.model.find("Intel") != std::string::npos) cpu.vendor = "GenuineIntel";
    else if (cpu.model.find("AMD") != std::string::npos) cpu.vendor = "AuthenticAMD";
    if (!cpu.vendor.empty())
      notes.push_back(fmt::format("A records no CPU vendor (a result from before it was recorded): {} read from its "
                                  "model name \"{}\"", cpu.vendor, cpu.model));
  }
}

void compare_with_expected(const Result& ra, const ExpectedFile& ef, double tol, CompareReport& rep) {
  const bool sim = ra.simulated();
  if (sim) rep.notes.push_back("A is simulated: its figures are shown beside the expected ones but not judged");
  // The file must be for A's hardware, as `run` chose it: a Zen 4's run held against an Intel
  // Xeon's figures, or a CPU's against an H100's, says nothing about either.
  std::string mismatch;
  const auto ran_with = ra.expected.is_object() ? ra.expected.find("id") : ra.expected.end();
  if (!sim && !(ran_with != ra.expected.end() && ran_with->is_string() && ran_with->get<std::string>() == ef.id())) {
    DeviceInfo dev;
    CpuInfo cpu;
    std::vector<std::string> notes;
    recorded_hardware(ra, dev, cpu, notes);
    mismatch = expected_mismatch(ef, dev, cpu);
    if (mismatch.empty()) rep.notes.insert(rep.notes.end(), notes.begin(), notes.end());
    else
      rep.notes.push_back(fmt::format("{} is not for A's hardware ({}): its figures are shown, not judged; compare "
                                      "with a result from the other machine instead",
                                      ef.id(), mismatch));
  }
  const bool judged = !sim && mismatch.empty();
  for (const auto& p : ra.points) {
    if (p.status != Status::ok) continue;
    for (const auto& m : p.metrics) {
      for (const auto& f : ef.figures_for(ra.scenario, m.name, p.params)) {
        CompareRow row = make_row(p.params, m, f.value("value", 0.0));
        std::string source = f.value("source", "?");
        if (source.size() > 72) source = source.substr(0, 70) + "...";  // the whole source is in the file
        row.b_label = fmt::format("{}: {}", f.value("kind", "?"), source);
        if (f.value("unit", m.unit) != m.unit) {
          rep.notes.push_back(fmt::format("{} {}: units differ ({} vs {}), not compared", row.point, m.name, m.unit,
                                          f.value("unit", "?")));
          continue;
        }
        if (!judged) {
          row.verdict = Verdict::not_comparable;
        } else if (f.value("kind", "") == "datasheet") {
          row.verdict = Verdict::ceiling;
        } else {
          row.verdict = judge_row(row, tol);
          row.gated = row.verdict != Verdict::not_comparable;
        }
        rep.rows.push_back(std::move(row));
      }
      // Datasheet peak for a GEMM throughput: a ceiling, shown as % of peak.
      if (m.name == "tflops" && p.params.contains("dtype") && p.params["dtype"].is_string()) {
        if (const auto dt = parse_dtype(p.params["dtype"].get<std::string>())) {
          if (const auto peak = ef.peak_tflops(*dt)) {
            CompareRow row = make_row(p.params, m, peak->first);
            row.b_label = "datasheet peak: " + peak->second;
            row.verdict = judged ? Verdict::ceiling : Verdict::not_comparable;
            rep.rows.push_back(std::move(row));
          }
        }
      }
    }
  }
}

// A parameter only one result has: a version that added it (a run from before it has none) or a
// scenario that records more. When it holds one value at every point of that side, the points are
// matched on the parameters both have, and a note names it; a swept one (several values) stays in
// the key, so its points match nothing rather than several things.
void drop_one_sided_params(std::vector<json>& keys_a, std::vector<json>& keys_b, CompareReport& rep) {
  struct Seen {
    std::vector<json> values;  // distinct
    std::size_t points = 0;    // that have it
  };
  auto seen = [](const std::vector<json>& keys) {
    std::map<std::string, Seen> v;
    for (const json& k : keys)
      for (const auto& [name, value] : k.items()) {
        Seen& x = v[name];
        ++x.points;
        if (std::find(x.values.begin(), x.values.end(), value) == x.values.end()) x.values.push_back(value);
      }
    return v;
  };
  const auto sa = seen(keys_a), sb = seen(keys_b);
  auto drop = [&](const std::map<std::string, Seen>& mine, const std::map<std::string, Seen>& other,
                  std::vector<json>& keys, const char* side) {
    for (const auto& [name, x] : mine) {
      if (other.count(name) || x.values.size() != 1 || x.points != keys.size()) continue;
      for (json& k : keys) k.erase(name);
      const json& v = x.values.front();
      rep.notes.push_back(fmt::format("parameter {} only in {} ({}={} at every point): points matched on the "
                                      "parameters both have",
                                      name, side, name, v.is_string() ? v.get<std::string>() : v.dump()));
    }
  };
  drop(sa, sb, keys_a, "A");
  drop(sb, sa, keys_b, "B");
}

// True when no point matched and a note says which parameters kept them apart.
bool compare_with_result(const Result& ra, const Result& rb, double tol, const std::vector<std::string>& non_workload,
                         CompareReport& rep) {
  if (ra.scenario != rb.scenario)
    throw UsageError(fmt::format("A is {} {} result and B {} {} result: compare two results of one scenario, or a "
                                 "result with an expected-numbers file",
                                 article(ra.scenario), ra.scenario, article(rb.scenario), rb.scenario));
  // A simulated figure is a model's output: never judged as if measured, against a measurement
  // or against another model run.
  const bool unjudged = ra.simulated() || rb.simulated();
  if (ra.simulated() != rb.simulated())
    rep.notes.push_back("one result is simulated and the other measured: shown, not judged");
  else if (ra.simulated())
    rep.notes.push_back("both results are simulated (a model's output, not a measurement): shown, not judged");
  // Each point's key once: the matching below compares every pair. A parameter that does not
  // define the workload on either side (each file's meta.measurement_params, and this build's
  // list, which an older file may predate) is left out of both keys.
  std::vector<std::string> steer = non_workload;
  for (const Result* r : {&ra, &rb})
    for (const auto& k : r->meta.value("measurement_params", json::array()))
      if (k.is_string()) steer.push_back(k.get<std::string>());
  auto key = [&](const json& params) {
    json out = params;
    for (const auto& k : steer) out.erase(k);
    return out;
  };
  std::vector<json> keys_a, keys_b;
  for (const auto& p : ra.points) keys_a.push_back(key(p.params));
  for (const auto& p : rb.points) keys_b.push_back(key(p.params));
  drop_one_sided_params(keys_a, keys_b, rep);
  std::set<std::string> disagree;  // metrics whose direction differs, noted once
  // A measurement parameter the two matched points ran with differently (trials=10 against 50, bare=on
  // against off): the row shows both, "10|50", where it showed A's alone and the fixed line read as if B
  // had run with it too; noted once a parameter.
  std::map<std::string, std::set<std::string>> differs;  // parameter -> "A|B" values seen
  auto both_values = [&](const Point& pa, const Point& pb) {
    json params = pa.params;
    for (const auto& k : steer)
      if ((pa.params.contains(k) || pb.params.contains(k)) && pa.params.value(k, json()) != pb.params.value(k, json())) {
        // one side may predate the parameter (a file from before bare=): "(none)" for it
        auto side = [&](const Point& q) { return q.params.contains(k) ? param_value(q.params[k]) : "(none)"; };
        const std::string v = side(pa) + "|" + side(pb);
        params[k] = v;
        differs[k].insert(v);
      }
    return params;
  };
  for (std::size_t i = 0; i < ra.points.size(); ++i) {
    const Point& pa = ra.points[i];
    const Point* pb = nullptr;
    for (std::size_t j = 0; j < rb.points.size(); ++j)
      if (keys_b[j] == keys_a[i]) pb = &rb.points[j];
    if (!pb) {
      rep.notes.push_back(fmt::format("{}: only in A", point_label(pa.params)));
      continue;
    }
    if (pa.status != pb->status) {
      rep.notes.push_back(fmt::format("{}: status {} in A, {} in B", point_label(pa.params), to_string(pa.status),
                                      to_string(pb->status)));
      if (pb->status == Status::ok && pa.status != Status::skipped) ++rep.worse;  // it used to work
      continue;  // figures of a point that did not run are not figures
    }
    if (pa.status != Status::ok) continue;
    const json shown_params = both_values(pa, *pb);
    for (const auto& m : pa.metrics) {
      const Metric* mb = pb->metric(m.name);
      if (!mb) continue;
      CompareRow row = make_row(shown_params, m, mb->value);
      row.b_label = "result";
      if (m.unit != mb->unit) {
        rep.notes.push_back(fmt::format("{} {}: units differ ({} vs {})", row.point, m.name, m.unit, mb->unit));
        continue;
      }
      // A metric whose direction changed between the two builds (device_us_per_launch was
      // "higher" before it became "none") has no one reading: shown, not judged.
      const bool split = m.direction != mb->direction;
      if (split && disagree.insert(m.name).second)
        rep.notes.push_back(fmt::format("{}: direction {} in A, {} in B (the builds disagree): shown, not judged",
                                        m.name, to_string(m.direction), to_string(mb->direction)));
      row.verdict = unjudged || split ? Verdict::not_comparable : judge_row(row, tol);
      row.gated = row.verdict != Verdict::not_comparable;
      rep.rows.push_back(std::move(row));
    }
  }
  for (const auto& [k, vs] : differs)
    rep.notes.push_back(fmt::format("{} ran differently ({} as A|B): a measurement parameter, not part of the "
                                    "workload, so the points matched across it",
                                    k, fmt::join(vs, ", ")));
  for (std::size_t j = 0; j < rb.points.size(); ++j)
    if (std::find(keys_a.begin(), keys_a.end(), keys_b[j]) == keys_a.end())
      rep.notes.push_back(fmt::format("{}: only in B", point_label(rb.points[j].params)));
  // No point matched: say which parameters kept them apart ("no metric has a counterpart" read as if the
  // metrics differed, when tflops was in both and the sizes were not).
  bool matched = false;
  for (const json& k : keys_a) matched = matched || std::find(keys_b.begin(), keys_b.end(), k) != keys_b.end();
  if (!matched && !keys_a.empty() && !keys_b.empty()) {
    std::vector<std::string> apart;
    std::set<std::string> names;
    for (const auto* keys : {&keys_a, &keys_b})
      for (const json& k : *keys)
        for (const auto& [n, v] : k.items()) names.insert(n);
    for (const std::string& n : names) {
      std::set<std::string> va, vb;
      for (const json& k : keys_a) va.insert(k.contains(n) ? param_value(k[n]) : "(none)");
      for (const json& k : keys_b) vb.insert(k.contains(n) ? param_value(k[n]) : "(none)");
      if (va != vb) apart.push_back(fmt::format("{}: A {}, B {}", n, fmt::join(va, ","), fmt::join(vb, ",")));
    }
    if (!apart.empty()) {
      rep.notes.push_back(fmt::format("no point of A has B's parameters: {}", fmt::join(apart, "; ")));
      return true;
    }
  }
  return false;
}

}  // namespace

CompareReport compare_docs(const json& a, const json& b, double tol, const std::string& a_file,
                           const std::string& b_file, const std::vector<std::string>& non_workload) {
  if (doc_kind(a, a_file) == "expected")
    throw UsageError(fmt::format("compare: {} is an expected-numbers file; A must be a result: put the expected file "
                                 "second", a_file));
  const Result ra = result_from_json(a, a_file);
  CompareReport rep;
  rep.tolerance = tol;
  rep.a_label = result_label(ra);
  const std::string b_kind = doc_kind(b, b_file);
  if (b_kind != "expected" && b_kind != "result")
    throw UsageError(fmt::format("{} is neither a stallbench result nor an expected-numbers file (\"kind\" is {})",
                                 b_file, b_kind.empty() ? "missing" : "\"" + b_kind + "\""));
  bool explained = false;  // a note already says why no row came out
  // Both documents are checked by now; this net only names the files should
  // the comparison itself still meet a JSON surprise.
  reading_file(fmt::format("compare {} {}", a_file, b_file), [&] {
    if (b_kind == "expected") {
      const ExpectedFile ef = expected_from_json(b, b_file);
      rep.b_label = fmt::format("expected {}", ef.id());
      rep.b_expected = true;
      compare_with_expected(ra, ef, tol, rep);
    } else {
      const Result rb = result_from_json(b, b_file);
      rep.b_label = result_label(rb);
      explained = compare_with_result(ra, rb, tol, non_workload, rep);
    }
  });
  for (const auto& r : rep.rows) rep.worse += r.gated && r.verdict == Verdict::worse;
  if (rep.rows.empty() && b_kind == "expected") {
    explained = true;
    // What the file does hold for this scenario, so the user can run at those parameters.
    std::set<std::string> at;
    const json figures = b.value("figures", json::array());
    for (const auto& f : figures)
      if (f.is_object() && f.value("scenario", std::string()) == ra.scenario && f.contains("where"))
        at.insert(point_label(f["where"]));
    rep.notes.push_back(at.empty() ? fmt::format("the expected file has no {} figure", ra.scenario)
                                   : fmt::format("no point of A has the parameters of the expected {} figures: {}",
                                                 ra.scenario, fmt::join(at, "; ")));
  }
  if (rep.rows.empty() && !explained) rep.notes.push_back("no metric of A has a counterpart in B");
  rep.summary = summarize(rep.rows);
  return rep;
}

std::vector<MetricSummary> summarize(const std::vector<CompareRow>& rows) {
  std::vector<MetricSummary> out;
  std::vector<double> logsum;
  for (const auto& r : rows) {
    if (r.verdict != Verdict::better && r.verdict != Verdict::same && r.verdict != Verdict::worse) continue;
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const MetricSummary& m) { return m.metric == r.metric && m.unit == r.unit; });
    if (it == out.end()) {
      MetricSummary m;
      m.metric = r.metric;
      m.unit = r.unit;
      m.direction = r.direction;
      m.by_points = r.by_points;
      m.min_diff = m.max_diff = r.a - r.b;
      out.push_back(m);
      logsum.push_back(0);
      it = out.end() - 1;
    }
    MetricSummary& m = *it;
    ++m.points;
    const double diff = r.a - r.b;
    m.mean_diff += diff;  // a sum until the end
    m.min_diff = std::min(m.min_diff, diff);
    m.max_diff = std::max(m.max_diff, diff);
    if (r.ratio > 0 && std::isfinite(r.ratio)) {
      m.min_ratio = m.ratio_points ? std::min(m.min_ratio, r.ratio) : r.ratio;
      m.max_ratio = m.ratio_points ? std::max(m.max_ratio, r.ratio) : r.ratio;
      ++m.ratio_points;
      logsum[std::size_t(it - out.begin())] += std::log(r.ratio);
    }
    m.better += r.verdict == Verdict::better;
    m.same += r.verdict == Verdict::same;
    m.worse += r.verdict == Verdict::worse;
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i].mean_diff /= double(out[i].points);
    if (out[i].ratio_points) out[i].geomean = std::exp(logsum[i] / double(out[i].ratio_points));
  }
  return out;
}

std::string format_compare(const CompareReport& rep) {
  std::string out = fmt::format("A: {}\nB: {}\n", rep.a_label, rep.b_label);
  // The parameters every row has with one value: printed once, as `run` prints its fixed ones.
  std::vector<std::string> fixed_keys;
  if (!rep.rows.empty())
    for (const auto& [k, v] : rep.rows.front().params.items()) {
      const bool everywhere = std::all_of(rep.rows.begin(), rep.rows.end(), [&, &k = k, &v = v](const CompareRow& r) {
        return r.params.contains(k) && r.params[k] == v;
      });
      if (everywhere) fixed_keys.push_back(k);
    }
  auto shown = [&](const CompareRow& r) {
    if (r.params.empty()) return r.point;  // a row made without its parameters: the label as it came
    std::string s;
    for (const auto& [k, v] : r.params.items()) {
      if (std::find(fixed_keys.begin(), fixed_keys.end(), k) != fixed_keys.end()) continue;
      s += fmt::format("{}{}={}", s.empty() ? "" : " ", k, param_value(v));
    }
    return s.empty() ? std::string("(the one point)") : s;
  };
  if (!fixed_keys.empty()) {
    std::string f;
    for (const auto& k : fixed_keys)
      f += fmt::format("{}{}={}", f.empty() ? "" : " ", k, param_value(rep.rows.front().params[k]));
    out += "fixed: " + f + "\n";
  }
  // "B is" names an expected figure's source; against a result every row would say "result".
  const bool b_col = std::any_of(rep.rows.begin(), rep.rows.end(), [](const CompareRow& r) { return r.b_label != "result"; });
  std::size_t wp = 5, wm = 6;
  std::vector<std::string> labels;
  for (const auto& r : rep.rows) {
    labels.push_back(shown(r));
    wp = std::max(wp, labels.back().size());
    wm = std::max(wm, r.metric.size() + r.unit.size() + 3);
  }
  auto line = [&](const std::string& p, const std::string& m, const std::string& a, const std::string& b,
                  const std::string& ratio, const std::string& verdict, const std::string& b_is) {
    std::string l = fmt::format("{:<{}}  {:<{}}  {:>10}  {:>10}  {:>7}  {:<8}", p, wp, m, wm, a, b, ratio, verdict);
    if (b_col) l += "  " + b_is;
    while (!l.empty() && l.back() == ' ') l.pop_back();
    return l + "\n";
  };
  out += line("point", "metric", "A", "B", "A/B", "verdict", "B is");
  for (std::size_t i = 0; i < rep.rows.size(); ++i) {
    const CompareRow& r = rep.rows[i];
    const std::string verdict = r.verdict == Verdict::ceiling ? fmt::format("{:.0f}% pk", r.ratio * 100)
                                                              : std::string(to_string(r.verdict));
    // A percentage shows A - B in points, what it is judged by; no ratio when B is 0.
    // A negative figure (a damaged file) has no ratio either.
    const std::string ratio = r.by_points                  ? fmt::format("{:+.1f}pt", r.a - r.b)
                              : r.b == 0 || r.a < 0 || r.b < 0 ? std::string("-")
                                                              : fmt::format("{:.3f}", r.ratio);
    out += line(labels[i], fmt::format("{} ({})", r.metric, r.unit), format_number(r.a), format_number(r.b), ratio,
                verdict, r.b_label);
  }
  if (!rep.summary.empty()) {
    out += fmt::format("summary, per metric over the points judged (A/B, same = within {0:.0f}%; for a "
                       "percentage A-B, same = within {0:.0f} points):\n",
                       rep.tolerance * 100);
    for (const auto& m : rep.summary) {
      std::string figure;
      if (m.by_points)
        figure = fmt::format("A-B mean {:+.1f} points ({:+.1f} to {:+.1f})", m.mean_diff, m.min_diff, m.max_diff);
      else if (m.ratio_points)
        figure = fmt::format("geometric mean {:.3f} ({:.3f}-{:.3f}){}", m.geomean, m.min_ratio, m.max_ratio,
                             m.ratio_points < m.points ? fmt::format(" over the {} where B is above 0", m.ratio_points)
                                                       : "");
      else
        figure = "B is 0 at every point: no ratio";
      out += fmt::format("  {} ({}, {} is better): {} point{}, {}; {} better, {} same, {} WORSE\n", m.metric, m.unit,
                         to_string(m.direction), m.points, m.points == 1 ? "" : "s", figure, m.better, m.same,
                         m.worse);
    }
  }
  for (const auto& n : rep.notes) out += "note: " + n + "\n";
  return out;
}

json compare_json(const CompareReport& rep) {
  json rows = json::array();
  for (const auto& r : rep.rows) {
    json j{{"params", r.params},
           {"metric", r.metric},
           {"unit", r.unit},
           {"direction", to_string(r.direction)},
           {"a", r.a},
           {"b", r.b},
           {"ratio", r.b != 0 ? json(r.ratio) : json(nullptr)},
           {"verdict", r.verdict == Verdict::ceiling ? "of peak" : std::string(to_string(r.verdict))},
           {"b_is", r.b_label},
           {"gated", r.gated}};
    if (r.by_points) j["diff_points"] = r.a - r.b;
    rows.push_back(std::move(j));
  }
  json summary = json::array();
  for (const auto& m : rep.summary) {
    json j{{"metric", m.metric}, {"unit", m.unit}, {"direction", to_string(m.direction)}, {"points", m.points},
           {"judged_by", m.by_points ? "difference in percentage points" : "ratio"}};
    if (m.by_points) {
      j["diff_mean_points"] = m.mean_diff;
      j["diff_min_points"] = m.min_diff;
      j["diff_max_points"] = m.max_diff;
    }
    j["ratio_points"] = m.ratio_points;  // the points with B above 0, over which the ratios run
    j["ratio_geomean"] = m.ratio_points ? json(m.geomean) : json(nullptr);
    j["ratio_min"] = m.ratio_points ? json(m.min_ratio) : json(nullptr);
    j["ratio_max"] = m.ratio_points ? json(m.max_ratio) : json(nullptr);
    j["better"] = m.better;
    j["same"] = m.same;
    j["worse"] = m.worse;
    summary.push_back(std::move(j));
  }
  return json{{"kind", "comparison"},
              {"a", rep.a_label},
              {"b", rep.b_label},
              {"b_is_expected", rep.b_expected},
              {"tolerance", rep.tolerance},
              {"ratio", "a / b: above 1 is better for a metric whose direction is higher, below 1 for lower; null "
                        "when b is 0. A percentage (unit %) is judged by diff_points, a - b in percentage points"},
              {"rows", rows},
              {"summary", summary},
              {"notes", rep.notes},
              {"worse", rep.worse}};
}

}  // namespace sb
