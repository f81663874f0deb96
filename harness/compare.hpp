// `stallbench compare A B`: A is a result; B is a result or an expected file.
// Per metric: both values, the ratio, and a verdict read by the metric's
// direction. Datasheet peaks are ceilings: shown as a fraction of peak,
// never gated. Simulated figures are never compared as if measured.
#pragma once

#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/result.hpp"  // Direction
#include "harness/names.hpp"  // NameTable: to_string, parse and choices from one table
#include "harness/exit_codes.hpp"  // kExit*

namespace sb {



enum class Verdict { better, same, worse, ceiling, not_comparable };
inline constexpr NameTable<Verdict, 5> kVerdictNames{{{{Verdict::better, "better"}, {Verdict::same, "same"}, {Verdict::worse, "WORSE"}, {Verdict::ceiling, "of peak"}, {Verdict::not_comparable, "-"}}}};
inline std::string_view to_string(Verdict v) { return kVerdictNames.name(v); }

struct CompareRow {
  std::string point;   // "size=2048 dtype=bf16": every parameter of A's point
  // the same, as A's JSON has them; but a measurement parameter the two points ran with differently (they
  // match across it) is the string "A|B" ("10|50", "on|(none)" where B predates it)
  nlohmann::ordered_json params = nlohmann::ordered_json::object();
  std::string metric;  // "tflops"
  std::string unit;
  Direction direction = Direction::none;
  double a = 0, b = 0;
  double ratio = 0;        // a / b; 0 when b is 0
  // A percentage (unit "%") is judged by a - b in percentage points against the tolerance x 100
  // points: 25.2% of the step waiting on data against 0.01% is 25 points worse, not 2,400 times.
  bool by_points = false;
  Verdict verdict = Verdict::same;
  std::string b_label;     // "result", or the expected figure's kind and source
  bool gated = false;      // counts towards the exit status
};

// One metric over the points both sides have: how A stands against B as a
// whole (the geometric mean of A/B and its range, or for a percentage the mean
// of A - B in points and its range; and the verdicts counted).
struct MetricSummary {
  std::string metric, unit;
  Direction direction = Direction::none;
  int points = 0;      // judged
  bool by_points = false;
  int ratio_points = 0;  // of those, the ones with B above 0: the geometric mean's
  double geomean = 0, min_ratio = 0, max_ratio = 0;  // of A/B (ratio_points > 0)
  double mean_diff = 0, min_diff = 0, max_diff = 0;  // of A - B, percentage points (by_points)
  int better = 0, same = 0, worse = 0;
};

struct CompareReport {
  std::string a_label, b_label;
  bool b_expected = false;  // B is an expected-numbers file (each row's b_label names its figure's source)
  double tolerance = 0.05;  // the verdicts' band
  std::vector<CompareRow> rows;
  std::vector<MetricSummary> summary;  // per judged metric, in the order the rows first show it
  std::vector<std::string> notes;  // unmatched points, status changes, simulation
  int worse = 0;                   // gated rows whose verdict is worse
};

// Verdict of a against b for a direction: "better"/"worse" beyond tolerance
// (a fraction, e.g. 0.05), else "same". Direction none, a negative or a
// non-finite value -> not_comparable. b = 0: same when a is 0 too, else read
// by the direction (a lower-is-better count going from 0 to 3 is worse).
Verdict judge(double a, double b, Direction d, double tolerance);
// The same for percentages: a - b in percentage points against tolerance x 100.
Verdict judge_points(double a, double b, Direction d, double tolerance);

// Throws UsageError when a is not a result or b is neither kind, or when a
// field of either is missing or mistyped: the message names the file (a_file,
// b_file: the paths the documents were read from) and the field's path.
// non_workload: parameters this build marks as not defining a point's workload
// for A's scenario (ParamSpec::workload), left out of the point keys beside each
// file's own meta.measurement_params, which a file from an older build lacks.
// Against an expected file, the file must be for A's recorded hardware
// (expected_mismatch; a run that chose it itself passes); if not, its figures
// are shown with a note and not judged.
CompareReport compare_docs(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b,
                           double tolerance, const std::string& a_file = "A", const std::string& b_file = "B",
                           const std::vector<std::string>& non_workload = {});

// Per metric, over the rows that were judged (better, same or worse).
std::vector<MetricSummary> summarize(const std::vector<CompareRow>& rows);

// The table: the parameters every row shares printed once ("fixed: ..."), the
// point column only the ones that vary; then the per-metric summary and notes.
std::string format_compare(const CompareReport& rep);

// The report as JSON (`compare --json`): every row with its full parameters.
nlohmann::ordered_json compare_json(const CompareReport& rep);

}  // namespace sb
