#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "harness/compare.hpp"
#include "harness/errors.hpp"

namespace sb {
namespace {

using json = nlohmann::ordered_json;

json result_doc(double tflops, double ms, bool simulated = false, const char* status = "ok") {
  Result r;
  r.meta = json{{"device", {{"id", "cuda:0"}, {"name", "GPU"}, {"simulated", simulated}}},
                {"measurement_params", {"trials"}}};
  r.scenario = "precision";
  r.params = json{{"size", {8192}}, {"dtype", {"bf16"}}, {"trials", {10}}};
  Point p;
  p.params = json{{"size", 8192}, {"dtype", "bf16"}, {"trials", 10}};
  p.status = *parse_status(status);
  if (p.status != Status::ok) p.reason = "x";
  p.add({"tflops", tflops, "TFLOP/s", Direction::higher, std::nullopt, ""});
  p.add({"ms", ms, "ms", Direction::lower, std::nullopt, ""});
  r.points.push_back(p);
  return to_json(r);
}

json expected_doc() {
  return json::parse(R"({
    "schema_version": 1, "kind": "expected",
    "hardware": {"id": "h200-sxm", "class": "gpu", "match": {"name_contains": ["H200"]}},
    "peaks": {"tflops": {"bf16": {"value": 989.4, "unit": "TFLOP/s", "kind": "datasheet", "source": "sheet"}}},
    "figures": [
      {"scenario": "precision", "metric": "tflops", "where": {"dtype": "bf16"}, "value": 700,
       "unit": "TFLOP/s", "direction": "higher", "kind": "published", "source": "generic"},
      {"scenario": "precision", "metric": "tflops", "where": {"dtype": "bf16", "size": 8192}, "value": 769,
       "unit": "TFLOP/s", "direction": "higher", "kind": "measured", "source": "same machine"},
      {"scenario": "precision", "metric": "tflops", "where": {"dtype": "fp32"}, "value": 50,
       "unit": "TFLOP/s", "direction": "higher", "kind": "published", "source": "other dtype"}
    ]})");
}

bool has_note(const CompareReport& rep, const std::string& part) {
  for (const auto& n : rep.notes)
    if (n.find(part) != std::string::npos) return true;
  return false;
}

// The verdicts that are not a ratio: points on one side only, metrics in
// different units, results of different scenarios.
TEST(Compare, OnlyInAOnlyInBUnitsDifferAndDifferentScenarios) {
  json a = result_doc(700, 1.2), b = result_doc(800, 1.0);
  b["points"][0]["params"]["size"] = 4096;  // no longer the same point
  CompareReport rep = compare_docs(a, b, 0.05);
  EXPECT_TRUE(rep.rows.empty());
  EXPECT_TRUE(has_note(rep, "only in A")) << fmt::format("{}", fmt::join(rep.notes, " | "));
  EXPECT_TRUE(has_note(rep, "only in B")) << fmt::format("{}", fmt::join(rep.notes, " | "));

  json c = result_doc(800, 1.0);
  c["points"][0]["metrics"]["ms"]["unit"] = "us";  // ms vs us: never divided
  rep = compare_docs(result_doc(700, 1.2), c, 0.05);
  EXPECT_TRUE(has_note(rep, "units differ")) << fmt::format("{}", fmt::join(rep.notes, " | "));
  for (const auto& row : rep.rows) EXPECT_NE(row.metric, "ms");
  EXPECT_EQ(rep.rows.size(), 1u);  // tflops only

  json d = result_doc(800, 1.0);
  d["scenario"] = "attention";
  rep = compare_docs(result_doc(700, 1.2), d, 0.05);
  EXPECT_TRUE(has_note(rep, "different scenarios")) << fmt::format("{}", fmt::join(rep.notes, " | "));
}

TEST(Compare, JudgeReadsDirection) {
  EXPECT_EQ(judge(110, 100, Direction::higher, 0.05), Verdict::better);
  EXPECT_EQ(judge(90, 100, Direction::higher, 0.05), Verdict::worse);
  EXPECT_EQ(judge(97, 100, Direction::higher, 0.05), Verdict::same);
  EXPECT_EQ(judge(90, 100, Direction::lower, 0.05), Verdict::better);  // less time is better
  EXPECT_EQ(judge(120, 100, Direction::lower, 0.05), Verdict::worse);
  EXPECT_EQ(judge(1, 2, Direction::none, 0.05), Verdict::not_comparable);
}

TEST(Compare, ResultVsResultMatchesPointsIgnoringTrials) {
  json b = result_doc(800, 1.0);
  b["points"][0]["params"]["trials"] = 50;  // measurement-only: still the same point
  const CompareReport rep = compare_docs(result_doc(700, 1.2), b, 0.05);
  ASSERT_EQ(rep.rows.size(), 2u);
  EXPECT_EQ(rep.rows[0].verdict, Verdict::worse);
  EXPECT_NEAR(rep.rows[0].ratio, 700.0 / 800.0, 1e-12);
  EXPECT_EQ(rep.rows[1].verdict, Verdict::worse);  // 1.2 ms vs 1.0 ms
  EXPECT_EQ(rep.worse, 2);
  EXPECT_EQ(compare_docs(result_doc(700, 1.2), b, 0.5).worse, 0);  // inside a 50% tolerance
}

TEST(Compare, AgainstExpectedUsesMostSpecificFigureAndPeakIsACeiling) {
  const CompareReport rep = compare_docs(result_doc(780, 1.0), expected_doc(), 0.05);
  ASSERT_EQ(rep.rows.size(), 2u);
  EXPECT_DOUBLE_EQ(rep.rows[0].b, 769);  // the size-specific figure, not the generic one
  EXPECT_EQ(rep.rows[0].verdict, Verdict::same);
  EXPECT_TRUE(rep.rows[0].gated);
  EXPECT_DOUBLE_EQ(rep.rows[1].b, 989.4);
  EXPECT_EQ(rep.rows[1].verdict, Verdict::ceiling);
  EXPECT_FALSE(rep.rows[1].gated);
  EXPECT_EQ(rep.worse, 0);
  EXPECT_EQ(compare_docs(result_doc(500, 1.0), expected_doc(), 0.05).worse, 1);
}

TEST(Compare, SimulatedIsNeverJudgedAsMeasured) {
  const CompareReport rep = compare_docs(result_doc(10, 1.0, true), expected_doc(), 0.05);
  for (const auto& r : rep.rows) EXPECT_EQ(r.verdict, Verdict::not_comparable);
  EXPECT_EQ(rep.worse, 0);
  const CompareReport mixed = compare_docs(result_doc(10, 1.0, true), result_doc(800, 1.0), 0.05);
  EXPECT_EQ(mixed.worse, 0);
  EXPECT_FALSE(mixed.notes.empty());
}

TEST(Compare, StatusRegressionCounts) {
  const CompareReport rep = compare_docs(result_doc(0, 0, false, "oom"), result_doc(800, 1.0), 0.05);
  EXPECT_EQ(rep.worse, 1);
  EXPECT_NE(format_compare(rep).find("status oom in A, ok in B"), std::string::npos);
}

TEST(Compare, ExpectedFileMustBeSecond) {
  EXPECT_THROW(compare_docs(expected_doc(), result_doc(1, 1), 0.05), UsageError);
  EXPECT_THROW(compare_docs(json{{"kind", "nonsense"}}, result_doc(1, 1), 0.05), UsageError);
}

}  // namespace
}  // namespace sb
