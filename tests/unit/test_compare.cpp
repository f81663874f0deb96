#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "harness/compare.hpp"
#include "harness/errors.hpp"
#include "harness/expected.hpp"

namespace sb {
namespace {

using json = nlohmann::ordered_json;

json result_doc(double tflops, double ms, bool simulated = false, const char* status = "ok") {
  Result r;
  r.meta = json{{"device", {{"id", "cuda:0"}, {"kind", "cuda"}, {"name", "NVIDIA H200"}, {"simulated", simulated}}},
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
// different units; results of different scenarios are refused (exit 2).
TEST(Compare, OnlyInAOnlyInBUnitsDifferAndDifferentScenarios) {
  json a = result_doc(700, 1.2), b = result_doc(800, 1.0);
  b["points"][0]["params"]["size"] = 4096;  // no longer the same point
  CompareReport rep = compare_docs(a, b, 0.05);
  EXPECT_TRUE(rep.rows.empty());
  EXPECT_TRUE(has_note(rep, "only in A")) << fmt::format("{}", fmt::join(rep.notes, " | "));
  EXPECT_TRUE(has_note(rep, "only in B")) << fmt::format("{}", fmt::join(rep.notes, " | "));
  // No point matched: the note names the parameter that kept them apart, not "no metric has a counterpart"
  EXPECT_TRUE(has_note(rep, "no point of A has B's parameters: size: A 8192, B 4096"))
      << fmt::format("{}", fmt::join(rep.notes, " | "));
  EXPECT_FALSE(has_note(rep, "no metric of A has a counterpart"));
  // ... and against an expected file, the parameters its figures are at
  json far = result_doc(700, 1.2);
  far["points"][0]["params"]["dtype"] = "fp16";
  rep = compare_docs(far, expected_doc(), 0.05);
  EXPECT_TRUE(has_note(rep, "expected precision figures: dtype=bf16; dtype=bf16 size=8192; dtype=fp32"))
      << fmt::format("{}", fmt::join(rep.notes, " | "));

  json c = result_doc(800, 1.0);
  c["points"][0]["metrics"]["ms"]["unit"] = "us";  // ms vs us: never divided
  rep = compare_docs(result_doc(700, 1.2), c, 0.05);
  EXPECT_TRUE(has_note(rep, "units differ")) << fmt::format("{}", fmt::join(rep.notes, " | "));
  for (const auto& row : rep.rows) EXPECT_NE(row.metric, "ms");
  EXPECT_EQ(rep.rows.size(), 1u);  // tflops only

  json d = result_doc(800, 1.0);
  d["scenario"] = "attention";
  EXPECT_THROW(compare_docs(result_doc(700, 1.2), d, 0.05), UsageError);  // nothing in common: bad input
}

TEST(Compare, JudgeReadsDirection) {
  EXPECT_EQ(judge(110, 100, Direction::higher, 0.05), Verdict::better);
  EXPECT_EQ(judge(90, 100, Direction::higher, 0.05), Verdict::worse);
  EXPECT_EQ(judge(97, 100, Direction::higher, 0.05), Verdict::same);
  EXPECT_EQ(judge(90, 100, Direction::lower, 0.05), Verdict::better);  // less time is better
  EXPECT_EQ(judge(120, 100, Direction::lower, 0.05), Verdict::worse);
  EXPECT_EQ(judge(1, 2, Direction::none, 0.05), Verdict::not_comparable);
}

// B at 0: no ratio, yet the direction reads it; a negative value has no ratio reading.
TEST(Compare, JudgeReadsAZeroInB) {
  EXPECT_EQ(judge(3, 0, Direction::lower, 0.05), Verdict::worse);  // 0 skipped steps in B, 3 in A
  EXPECT_EQ(judge(0, 0, Direction::lower, 0.05), Verdict::same);
  EXPECT_EQ(judge(5, 0, Direction::higher, 0.05), Verdict::better);
  EXPECT_EQ(judge(-1, 2, Direction::higher, 0.05), Verdict::not_comparable);
}

// A percentage: a - b in points against tolerance x 100 points.
TEST(Compare, APercentageIsJudgedInPoints) {
  EXPECT_EQ(judge_points(25.24, 0.0105, Direction::lower, 0.05), Verdict::worse);  // 25 points, not 2,400x
  EXPECT_EQ(judge_points(3.0, 0.5, Direction::lower, 0.05), Verdict::same);         // 2.5 points: within 5
  EXPECT_EQ(judge_points(91, 97, Direction::higher, 0.05), Verdict::worse);
  EXPECT_EQ(judge_points(91, 97, Direction::none, 0.05), Verdict::not_comparable);

  json a = result_doc(700, 1.2), b = result_doc(700, 1.2);
  a["points"][0]["metrics"]["wait_pct"] = json{{"value", 25.24}, {"unit", "%"}, {"direction", "lower"}};
  b["points"][0]["metrics"]["wait_pct"] = json{{"value", 0.0105}, {"unit", "%"}, {"direction", "lower"}};
  a["points"][0]["metrics"]["skipped"] = json{{"value", 3}, {"unit", "steps"}, {"direction", "lower"}};
  b["points"][0]["metrics"]["skipped"] = json{{"value", 0}, {"unit", "steps"}, {"direction", "lower"}};
  const CompareReport rep = compare_docs(a, b, 0.05);
  ASSERT_EQ(rep.rows.size(), 4u);
  EXPECT_TRUE(rep.rows[2].by_points);
  EXPECT_EQ(rep.rows[2].verdict, Verdict::worse);
  EXPECT_EQ(rep.rows[3].verdict, Verdict::worse);  // 3 against 0
  EXPECT_EQ(rep.worse, 2);
  const std::string t = format_compare(rep);
  EXPECT_NE(t.find("+25.2pt"), std::string::npos) << t;
  EXPECT_EQ(t.find("2403"), std::string::npos) << t;  // no ratio for a percentage
  EXPECT_NE(t.find("wait_pct (%, lower is better): 1 point, A-B mean +25.2 points (+25.2 to +25.2); 0 better, 0 "
                   "same, 1 WORSE"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("skipped (steps, lower is better): 1 point, B is 0 at every point: no ratio; 0 better, 0 same, 1 "
                   "WORSE"),
            std::string::npos)
      << t;
  // A signed difference already in points (model_error_pts) shows A - B, never a ratio of signed values
  // (-0.1854 / 0.09129 read "-2.031"); a negative figure elsewhere has no ratio shown.
  json c = result_doc(700, -1.2), d = result_doc(700, 1.2);
  c["points"][0]["metrics"]["model_error_pts"] = json{{"value", -0.1854}, {"unit", "pts"}, {"direction", "none"}};
  d["points"][0]["metrics"]["model_error_pts"] = json{{"value", 0.09129}, {"unit", "pts"}, {"direction", "none"}};
  const CompareReport signed_rep = compare_docs(c, d, 0.05);
  const std::string st = format_compare(signed_rep);
  EXPECT_NE(st.find("-0.3pt"), std::string::npos) << st;
  EXPECT_EQ(st.find("-2.031"), std::string::npos) << st;
  EXPECT_EQ(st.find(" -1.000  "), std::string::npos) << st;  // ms -1.2 against 1.2: no ratio
  const json j = compare_json(rep);
  EXPECT_TRUE(j["rows"][3]["ratio"].is_null());
  EXPECT_NEAR(j["rows"][2]["diff_points"].get<double>(), 25.2295, 1e-9);
  EXPECT_EQ(j["summary"][2]["judged_by"], "difference in percentage points");
  EXPECT_TRUE(j["summary"][3]["ratio_geomean"].is_null());
}

// collective's min_bytes, max_bytes and factor only make the sizes; each point records its bytes.
// A file from before they were marked (no meta.measurement_params entry) still matches a newer
// one at the sizes both have, given this build's list.
TEST(Compare, ParametersThisBuildMarksAsNotWorkloadLeaveTheKey) {
  json a = result_doc(700, 1.2), b = result_doc(800, 1.0);
  a["points"][0]["params"]["factor"] = 8;
  b["points"][0]["params"]["factor"] = 4;
  EXPECT_TRUE(compare_docs(a, b, 0.05).rows.empty());
  const CompareReport rep = compare_docs(a, b, 0.05, "A", "B", {"factor"});
  EXPECT_EQ(rep.rows.size(), 2u) << fmt::format("{}", fmt::join(rep.notes, " | "));
}

// Two model outputs are not measurements: shown, never judged, never an exit 3.
TEST(Compare, SimulatedAgainstSimulatedIsNotJudged) {
  const CompareReport rep = compare_docs(result_doc(10, 1.0, true), result_doc(800, 2.0, true), 0.05);
  ASSERT_EQ(rep.rows.size(), 2u);
  for (const auto& r : rep.rows) EXPECT_EQ(r.verdict, Verdict::not_comparable);
  EXPECT_EQ(rep.worse, 0);
  EXPECT_TRUE(has_note(rep, "both results are simulated")) << fmt::format("{}", fmt::join(rep.notes, " | "));
}

// An expected file for other hardware: shown with a note, never judged (a Zen 4 against an Intel
// Xeon's file read fp32 "WORSE"; a CPU run against the H100 file exited 3).
TEST(Compare, AnExpectedFileForOtherHardwareIsNotJudged) {
  json a = result_doc(500, 1.0);
  a["meta"]["device"]["name"] = "NVIDIA H100 80GB HBM3";
  CompareReport rep = compare_docs(a, expected_doc(), 0.05);
  ASSERT_FALSE(rep.rows.empty());
  for (const auto& r : rep.rows) EXPECT_EQ(r.verdict, Verdict::not_comparable);
  EXPECT_EQ(rep.worse, 0);
  EXPECT_TRUE(has_note(rep, "h200-sxm is not for A's hardware (the gpu's name \"NVIDIA H100 80GB HBM3\" has none of "
                            "h200-sxm's names (\"H200\"))"))
      << fmt::format("{}", fmt::join(rep.notes, " | "));
  // the run chose this file itself (result.expected): judged whatever the name says
  a["expected"] = json{{"id", "h200-sxm"}, {"path", "x"}};
  EXPECT_EQ(compare_docs(a, expected_doc(), 0.05).worse, 1);

  // a cpu result from before meta.cpu.vendor: the vendor read from the model name
  json cpu_file = load_expected_file(std::string(STALLBENCH_SOURCE_DIR) + "/results/expected/cpu-zen4-2c.json").doc;
  json c = result_doc(0.1, 1.0);
  c["scenario"] = "precision";
  c["meta"]["device"] = json{{"id", "cpu"}, {"kind", "cpu"}, {"name", "Intel(R) Xeon(R) Platinum 8481C CPU"}};
  c["meta"]["cpu"] = json{{"model", "Intel(R) Xeon(R) Platinum 8481C CPU"},
                          {"logical_cores", 2},
                          {"isa", {"avx2", "avx512f", "avx512_bf16"}}};
  rep = compare_docs(c, cpu_file, 0.05);
  EXPECT_TRUE(has_note(rep, "cpu-zen4-2c is not for A's hardware (cpu-zen4-2c is for vendor AuthenticAMD, and this "
                            "cpu is GenuineIntel)"))
      << fmt::format("{}", fmt::join(rep.notes, " | "));
  for (const auto& r : rep.rows) EXPECT_EQ(r.verdict, Verdict::not_comparable);
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

// The points matched across a measurement parameter: the table says what each side ran with, not A's
// value alone as if B had run with it too (bare=on against diagnose's bare=off read "fixed: ... bare=on").
TEST(Compare, AMeasurementParameterThatDiffersShowsBothSides) {
  json b = result_doc(800, 1.0);
  b["points"][0]["params"]["trials"] = 50;
  const CompareReport rep = compare_docs(result_doc(700, 1.2), b, 0.05);
  ASSERT_EQ(rep.rows.size(), 2u);
  EXPECT_EQ(rep.rows[0].params["trials"], "10|50");
  EXPECT_TRUE(has_note(rep, "trials ran differently (10|50 as A|B)")) << fmt::format("{}", fmt::join(rep.notes, "\n"));
  const std::string t = format_compare(rep);
  EXPECT_NE(t.find("trials=10|50"), std::string::npos) << t;
  EXPECT_EQ(t.find("trials=10 "), std::string::npos) << t;
  // the same value on both sides: shown once, no note
  const CompareReport same = compare_docs(result_doc(700, 1.2), result_doc(800, 1.0), 0.05);
  EXPECT_EQ(same.rows[0].params["trials"], 10);
  EXPECT_FALSE(has_note(same, "ran differently"));
  // B from before the parameter: the points still match, and the row says B had none
  json old = result_doc(800, 1.0);
  old["points"][0]["params"].erase("trials");
  const CompareReport before = compare_docs(result_doc(700, 1.2), old, 0.05);
  ASSERT_EQ(before.rows.size(), 2u);
  EXPECT_EQ(before.rows[0].params["trials"], "10|(none)");
  EXPECT_TRUE(has_note(before, "trials ran differently (10|(none) as A|B)"));
}

// A metric whose direction changed between builds (device_us_per_launch went from higher to none)
// has no single reading: its rows are shown, not judged, with one note; the other metrics still are.
TEST(Compare, AMetricWhoseDirectionTheBuildsDisagreeOnIsNotJudged) {
  json b = result_doc(800, 1.0);
  b["points"][0]["metrics"]["ms"]["direction"] = "none";
  const CompareReport rep = compare_docs(result_doc(700, 2.0), b, 0.05);
  ASSERT_EQ(rep.rows.size(), 2u);
  EXPECT_EQ(rep.rows[0].metric, "tflops");
  EXPECT_EQ(rep.rows[0].verdict, Verdict::worse);
  EXPECT_EQ(rep.rows[1].metric, "ms");
  EXPECT_EQ(rep.rows[1].verdict, Verdict::not_comparable);  // 2.0 vs 1.0 ms, lower in A: not judged
  EXPECT_FALSE(rep.rows[1].gated);
  EXPECT_EQ(rep.worse, 1);
  EXPECT_TRUE(has_note(rep, "ms: direction lower in A, none in B")) << fmt::format("{}", fmt::join(rep.notes, " | "));
}

// A result from before a parameter existed (the batch scenario gained global_batch and attn, and
// no published batch file matched a new run: "no metric of A has a counterpart in B").
TEST(Compare, AParameterOnlyOneSideHasIsSetAsideWhenItHoldsOneValue) {
  json b = result_doc(800, 1.0);
  b["points"][0]["params"]["timing"] = "warm";  // B's version records it; A's had none
  CompareReport rep = compare_docs(result_doc(700, 1.2), b, 0.05);
  ASSERT_EQ(rep.rows.size(), 2u) << fmt::format("{}", fmt::join(rep.notes, " | "));
  EXPECT_TRUE(has_note(rep, "parameter timing only in B (timing=warm at every point)"))
      << fmt::format("{}", fmt::join(rep.notes, " | "));
  EXPECT_FALSE(has_note(rep, "only in A")) << fmt::format("{}", fmt::join(rep.notes, " | "));

  // swept on that side (two values): kept in the key, so neither point matches A's one
  json c = result_doc(800, 1.0);
  c["points"].push_back(c["points"][0]);
  c["points"][0]["params"]["timing"] = "warm";
  c["points"][1]["params"]["timing"] = "cold";
  rep = compare_docs(result_doc(700, 1.2), c, 0.05);
  EXPECT_TRUE(rep.rows.empty());
  EXPECT_TRUE(has_note(rep, "only in A")) << fmt::format("{}", fmt::join(rep.notes, " | "));
  EXPECT_FALSE(has_note(rep, "parameter timing")) << fmt::format("{}", fmt::join(rep.notes, " | "));

  // on both sides with different values: a different point, as before
  json d = result_doc(800, 1.0), a = result_doc(700, 1.2);
  d["points"][0]["params"]["timing"] = "warm";
  a["points"][0]["params"]["timing"] = "cold";
  rep = compare_docs(a, d, 0.05);
  EXPECT_TRUE(rep.rows.empty());
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

// Two points swept on size, trials and dtype the same at both: the table prints dtype and trials
// once, the point column only size; the summary gives per metric the geometric mean of A/B and
// the verdicts counted; the JSON keeps every row's full parameters.
json sweep_doc(double t1, double t2) {
  json d = result_doc(t1, 1.0);
  json p2 = d["points"][0];
  p2["params"]["size"] = 4096;
  p2["metrics"]["tflops"]["value"] = t2;
  d["points"].push_back(p2);
  d["params"]["size"] = json::array({8192, 4096});
  return d;
}

TEST(Compare, TablePrintsTheSharedParametersOnceAndSummarizesEachMetric) {
  // tflops A/B: 400/800 = 0.5 (WORSE), 880/800 = 1.1 (better); ms 1.0 vs 1.0 twice (same)
  const CompareReport rep = compare_docs(sweep_doc(400, 880), sweep_doc(800, 800), 0.05);
  ASSERT_EQ(rep.rows.size(), 4u);
  const std::string t = format_compare(rep);
  EXPECT_NE(t.find("fixed: dtype=bf16 trials=10\n"), std::string::npos) << t;
  EXPECT_EQ(t.find("size=8192 dtype"), std::string::npos) << t;  // the point column: size alone
  EXPECT_NE(t.find("\nsize=8192  "), std::string::npos) << t;
  EXPECT_EQ(t.find("B is"), std::string::npos) << t;  // against a result every row would say "result"
  ASSERT_EQ(rep.summary.size(), 2u);
  const MetricSummary& tf = rep.summary[0];
  EXPECT_EQ(tf.metric, "tflops");
  EXPECT_EQ(tf.points, 2);
  EXPECT_NEAR(tf.geomean, std::sqrt(0.5 * 1.1), 1e-12);
  EXPECT_DOUBLE_EQ(tf.min_ratio, 0.5);
  EXPECT_DOUBLE_EQ(tf.max_ratio, 1.1);
  EXPECT_EQ(tf.better, 1);
  EXPECT_EQ(tf.worse, 1);
  EXPECT_EQ(tf.same, 0);
  EXPECT_EQ(rep.summary[1].metric, "ms");
  EXPECT_EQ(rep.summary[1].same, 2);
  EXPECT_NE(t.find("tflops (TFLOP/s, higher is better): 2 points, geometric mean 0.742 (0.500-1.100); 1 better, 0 "
                   "same, 1 WORSE"),
            std::string::npos)
      << t;
  const json j = compare_json(rep);
  EXPECT_EQ(j["kind"], "comparison");
  ASSERT_EQ(j["rows"].size(), 4u);
  EXPECT_EQ(j["rows"][0]["params"]["size"], 8192);
  EXPECT_EQ(j["rows"][0]["params"]["dtype"], "bf16");  // full, not the table's shortened label
  EXPECT_EQ(j["rows"][0]["verdict"], "WORSE");
  EXPECT_EQ(j["rows"][0]["direction"], "higher");
  EXPECT_EQ(j["summary"][0]["worse"], 1);
  EXPECT_EQ(j["worse"], rep.worse);
}

TEST(Compare, OnePointAndAnExpectedFileKeepTheSourceColumn) {
  const CompareReport rep = compare_docs(result_doc(700, 1.2), expected_doc(), 0.05);
  const std::string t = format_compare(rep);
  EXPECT_NE(t.find("fixed: size=8192 dtype=bf16 trials=10\n"), std::string::npos) << t;
  EXPECT_NE(t.find("(the one point)"), std::string::npos) << t;
  EXPECT_NE(t.find("B is"), std::string::npos) << t;
  EXPECT_NE(t.find("measured: same machine"), std::string::npos) << t;
  // the datasheet peak is a ceiling: shown, not in the summary's verdicts
  ASSERT_EQ(rep.summary.size(), 1u);
  EXPECT_EQ(rep.summary[0].points, 1);  // the most specific figure alone (size and dtype), not the generic one
  EXPECT_EQ(t.find("published: generic"), std::string::npos) << t;
  EXPECT_NE(t.find("% pk"), std::string::npos) << t;
}

TEST(Compare, ExpectedFileMustBeSecond) {
  EXPECT_THROW(compare_docs(expected_doc(), result_doc(1, 1), 0.05), UsageError);
  EXPECT_THROW(compare_docs(json{{"kind", "nonsense"}}, result_doc(1, 1), 0.05), UsageError);
}

// ---- malformed fields (issue #24): the message names the file and the field ----

std::string compare_error(const json& a, const json& b) {
  try {
    compare_docs(a, b, 0.05, "a.json", "b.json");
  } catch (const UsageError& e) {
    return e.what();
  }  // any other exception fails the test
  return "no error";
}

TEST(CompareErrors, NameTheFileAndTheField) {
  json b = result_doc(800, 1.0);
  b["kind"] = 5;  // once [json.exception.type_error.302] from is_expected_doc, exit 1
  EXPECT_EQ(compare_error(result_doc(700, 1.2), b), "b.json: kind: expected string, got integer 5");
  json a = result_doc(700, 1.2);
  a["meta"]["device"]["simulated"] = "yes";
  EXPECT_EQ(compare_error(a, result_doc(800, 1.0)),
            "a.json: meta.device.simulated: expected boolean, got string \"yes\"");
  json e = expected_doc();
  e["hardware"]["class"] = 5;
  EXPECT_EQ(compare_error(result_doc(700, 1.2), e), "b.json: hardware.class: expected string, got integer 5");
  e = expected_doc();
  e["figures"][1]["value"] = "769";
  EXPECT_EQ(compare_error(result_doc(700, 1.2), e), "b.json: figures[1].value: expected number > 0, got string \"769\"");
  EXPECT_EQ(compare_error(result_doc(700, 1.2), json{{"kind", "notes"}}),
            "b.json is neither a stallbench result nor an expected-numbers file (\"kind\" is \"notes\")");
  EXPECT_EQ(compare_error(expected_doc(), result_doc(1, 1)),
            "compare: a.json is an expected-numbers file; A must be a result: put the expected file second");
}

// ---- expected-numbers files ----

const std::string kExpectedDir = std::string(STALLBENCH_SOURCE_DIR) + "/results/expected";

std::string expected_error(const json& doc) {
  try {
    expected_from_json(doc, "x.json");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ExpectedReader, EveryShippedFileReads) {
  std::vector<std::string> skipped;
  const auto files = load_expected_dir(kExpectedDir, skipped);
  EXPECT_TRUE(skipped.empty()) << fmt::format("{}", fmt::join(skipped, "\n"));
  EXPECT_GE(files.size(), 5u);
}

TEST(ExpectedReader, FieldsOfTheWrongTypeNameTheField) {
  const json good = load_expected_file(kExpectedDir + "/h100-sxm.json").doc;
  json j = good;
  j["hardware"]["class"] = 5;  // once a type_error in every run's match_expected
  EXPECT_EQ(expected_error(j), "x.json: hardware.class: expected string, got integer 5");
  j = good;
  j["hardware"]["class"] = "tpu";
  EXPECT_EQ(expected_error(j), "x.json: hardware.class: expected one of gpu|cpu, got string \"tpu\"");
  j = good;
  j["hardware"]["match"]["name_contains"][0] = 100;
  EXPECT_EQ(expected_error(j), "x.json: hardware.match.name_contains[0]: expected string, got integer 100");
  j = good;
  j["peaks"]["tflops"]["bf16"]["value"] = 0;  // a rate the sim device divides by
  EXPECT_EQ(expected_error(j), "x.json: peaks.tflops.bf16.value: expected number > 0, got integer 0");
  j = good;
  j["figures"][0].erase("source");
  EXPECT_EQ(expected_error(j), "x.json: figures[0].source: expected string, got nothing (the field is missing)");
  j = good;
  j["figures"][0]["where"] = "dtype=bf16";
  EXPECT_EQ(expected_error(j), "x.json: figures[0].where: expected object, got string \"dtype=bf16\"");
  j = load_expected_file(kExpectedDir + "/cpu-avx512-bf16-2c.json").doc;
  j["hardware"]["match"]["logical_cores"] = 4294967298LL;  // once narrowed to 2 by get<int>
  EXPECT_EQ(expected_error(j),
            "x.json: hardware.match.logical_cores: expected integer in [1, 2147483647], got integer 4294967298");
}

// A range in `where` ({"min": a, "max": b}): nccl-tests' large-message figures hold only from 1 GiB.
TEST(ExpectedReader, AWhereRangeHoldsAPointsNumber) {
  const json w{{"op", "all_reduce"}, {"bytes", {{"min", 1024}, {"max", 4096}}}};
  EXPECT_TRUE(where_matches(w, json{{"op", "all_reduce"}, {"bytes", 2048}}));
  EXPECT_TRUE(where_matches(w, json{{"op", "all_reduce"}, {"bytes", 1024}}));
  EXPECT_FALSE(where_matches(w, json{{"op", "all_reduce"}, {"bytes", 512}}));
  EXPECT_FALSE(where_matches(w, json{{"op", "all_reduce"}, {"bytes", 8192}}));
  EXPECT_FALSE(where_matches(w, json{{"op", "all_reduce"}, {"bytes", "2048"}}));  // not a number
  EXPECT_FALSE(where_matches(w, json{{"op", "all_reduce"}}));
  json j = load_expected_file(kExpectedDir + "/h100-sxm.json").doc;
  j["figures"][0]["where"]["size"] = json{{"least", 1}};
  EXPECT_NE(expected_error(j).find("a range has only min and max, not \"least\""), std::string::npos)
      << expected_error(j);
  j["figures"][0]["where"]["size"] = json{{"min", "big"}};
  EXPECT_NE(expected_error(j).find("expected number"), std::string::npos) << expected_error(j);
}

class ExpectedDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = std::filesystem::temp_directory_path() /
          fmt::format("sb_expected_{}_{}", ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir / "expected");
    std::filesystem::create_directories(dir / "expected");
    for (const auto& e : std::filesystem::directory_iterator(kExpectedDir))
      if (e.path().extension() == ".json") std::filesystem::copy_file(e.path(), dir / "expected" / e.path().filename());
    json bad = load_expected_file(kExpectedDir + "/h200-sxm.json").doc;
    bad["hardware"]["class"] = 5;
    bad_path = (dir / "expected" / "bad-h200.json").string();
    std::ofstream(bad_path) << bad.dump(2);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  std::filesystem::path dir;
  std::string bad_path;
};

TEST_F(ExpectedDir, ABadFileIsSkippedAndTheOthersStillServe) {
  std::vector<std::string> skipped;
  const auto files = load_expected_dir((dir / "expected").string(), skipped);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0], "skipped expected-numbers file " + bad_path + ": hardware.class: expected string, got integer 5");
  std::vector<std::string> ids;
  for (const auto& f : files) ids.push_back(f.id());
  EXPECT_EQ(ids, (std::vector<std::string>{"a100-sxm-80gb", "cpu-avx512-bf16-2c", "cpu-spr-amx-2c", "cpu-zen4-2c",
                                           "h100-sxm", "h200-sxm"}));
}

TEST_F(ExpectedDir, TheRunTimeLoaderWarnsOnceAndMatchesWithTheRest) {
  const char* old = std::getenv("STALLBENCH_DATA_DIR");
  const std::string saved = old ? old : "";
  ::setenv("STALLBENCH_DATA_DIR", dir.string().c_str(), 1);
  DeviceInfo gpu;
  gpu.kind = DeviceKind::cuda;
  gpu.name = "NVIDIA H100 80GB HBM3";
  ::testing::internal::CaptureStderr();
  const auto first = match_expected(gpu, CpuInfo{.logical_cores = 16});
  const auto again = load_expected_files();  // read again in the same run: no second warning
  const std::string err = ::testing::internal::GetCapturedStderr();
  if (old) ::setenv("STALLBENCH_DATA_DIR", saved.c_str(), 1);
  else ::unsetenv("STALLBENCH_DATA_DIR");
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->id(), "h100-sxm");
  EXPECT_EQ(again.size(), 6u);
  EXPECT_EQ(err, "stallbench: warning: skipped expected-numbers file " + bad_path +
                     ": hardware.class: expected string, got integer 5\n");
}

TEST(ExpectedMatch, CpuFilesMatchByIsaCoresVendorAndFamily) {
  const ExpectedFile f = load_expected_file(kExpectedDir + "/cpu-avx512-bf16-2c.json");
  DeviceInfo cpu;
  cpu.kind = DeviceKind::cpu;
  const auto intel = [](std::vector<std::string> isa, int cores) {
    return CpuInfo{.model = "Intel Xeon", .logical_cores = cores, .isa = std::move(isa), .vendor = "GenuineIntel",
                   .family = 6};
  };
  EXPECT_TRUE(expected_matches(f, cpu, intel({"avx2", "avx512_bf16"}, 2)));
  EXPECT_FALSE(expected_matches(f, cpu, intel({"avx2", "avx512_bf16", "amx_bf16"}, 2)));  // isa_absent
  EXPECT_FALSE(expected_matches(f, cpu, intel({"avx2", "avx512_bf16"}, 4)));
  EXPECT_FALSE(expected_matches(f, cpu, intel({"avx2"}, 2)));
  // The same flags on an AMD Zen 4 run bf16 at twice fp32, not below it: its own file, not the Xeon's.
  CpuInfo zen4{.model = "AMD EPYC", .logical_cores = 2, .isa = {"avx2", "avx512f", "avx512_bf16"},
               .vendor = "AuthenticAMD", .family = 25};
  EXPECT_FALSE(expected_matches(f, cpu, zen4));
  const ExpectedFile z = load_expected_file(kExpectedDir + "/cpu-zen4-2c.json");
  EXPECT_TRUE(expected_matches(z, cpu, zen4));
  EXPECT_FALSE(expected_matches(z, cpu, intel({"avx2", "avx512_bf16"}, 2)));
  CpuInfo zen3 = zen4;  // family 25 as well, without AVX-512
  zen3.isa = {"avx2"};
  EXPECT_FALSE(expected_matches(z, cpu, zen3));
  CpuInfo zen5 = zen4;
  zen5.family = 26;
  EXPECT_FALSE(expected_matches(z, cpu, zen5));
  // A CPU whose /proc/cpuinfo names no vendor matches no file that asks for one.
  CpuInfo unnamed = zen4;
  unnamed.vendor.clear();
  EXPECT_FALSE(expected_matches(z, cpu, unnamed));
  DeviceInfo sim;
  sim.kind = DeviceKind::sim;
  sim.props = json{{"hardware_id", "cpu-avx512-bf16-2c"}};
  EXPECT_TRUE(expected_matches(f, sim, CpuInfo{}));
}

}  // namespace
}  // namespace sb
