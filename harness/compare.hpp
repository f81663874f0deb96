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
  std::string point;   // "size=2048 dtype=bf16"
  std::string metric;  // "tflops"
  std::string unit;
  Direction direction = Direction::none;
  double a = 0, b = 0;
  double ratio = 0;        // a / b
  Verdict verdict = Verdict::same;
  std::string b_label;     // "result", or the expected figure's kind and source
  bool gated = false;      // counts towards the exit status
};

struct CompareReport {
  std::string a_label, b_label;
  std::vector<CompareRow> rows;
  std::vector<std::string> notes;  // unmatched points, status changes, simulation
  int worse = 0;                   // gated rows whose verdict is worse
};

// Verdict of a against b for a direction: "better"/"worse" beyond tolerance
// (a fraction, e.g. 0.05), else "same". Direction none -> not_comparable.
Verdict judge(double a, double b, Direction d, double tolerance);

// Throws UsageError when a is not a result or b is neither kind, or when a
// field of either is missing or mistyped: the message names the file (a_file,
// b_file: the paths the documents were read from) and the field's path.
CompareReport compare_docs(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b,
                           double tolerance, const std::string& a_file = "A", const std::string& b_file = "B");

std::string format_compare(const CompareReport& rep);

}  // namespace sb
