// The runner's mapping of typed errors to point statuses, and exit codes.
#include <gtest/gtest.h>

#include "fake_device.hpp"
#include "harness/errors.hpp"
#include "harness/runner.hpp"

namespace sb {
namespace {

class ScriptedRun : public ScenarioRun {
 public:
  Point run_point(const ParamSet& ps) override {
    const std::string what = ps.get_str("what");
    if (what == "oom") throw OutOfMemory("cudaMalloc of 80 GB failed");
    if (what == "skip") throw UnsupportedError("no fp8 here");
    if (what == "wrong") throw MismatchError("C[0,0]=1 want 2");
    if (what == "hang") throw HangError("no progress in 1 s");
    Point p;
    Stats st;
    st.n = 5;
    st.median = 1.0;
    st.stdrel = what == "unsettled" ? 0.46 : 0.01;  // 46%: seen with a short --budget
    p.add({"x", 1.0, "ms", Direction::lower, st, ""});
    return p;
  }
  // One finding leaves its cause to the runner, one names its own.
  void analyze(Result& r) override {
    r.findings.push_back({{}, "analyzed", std::nullopt, {}});
    r.findings.push_back({"a cause of its own", "explicit", std::nullopt, {}});
  }
};

Scenario scripted() {
  return Scenario{"scripted", "the scripted cause", "test",
                  {ParamSpec{.name = "what", .type = ParamType::choice, .default_value = "ok",
                             .choices = {"ok", "oom", "skip", "wrong", "hang", "unsettled"}}},
                  [](RunContext&) -> std::unique_ptr<ScenarioRun> { return std::make_unique<ScriptedRun>(); }};
}

Result run(const std::string& sweep) {
  test::FakeDevice dev;
  RunContext ctx{dev};
  const Scenario sc = scripted();
  return run_scenario(sc, ctx, RunOptions{{"what=" + sweep}, false}, nlohmann::ordered_json::object());
}

TEST(Runner, FindingsTakeTheScenariosCause) {
  const Result r = run("ok");
  ASSERT_EQ(r.findings.size(), 2u);
  EXPECT_EQ(r.findings[0].cause, "the scripted cause");
  EXPECT_EQ(r.findings[1].cause, "a cause of its own");
}

// Trials that never settled (46% against --noise 2%) are flagged on the point, and the findings that
// rest on the points carry a caveat; settled points carry neither.
TEST(Runner, UnsettledTrialsAreFlaggedAndFindingsCaveated) {
  const Result quiet = run("ok");
  EXPECT_FALSE(quiet.points[0].info.contains("warning") &&
               quiet.points[0].info["warning"].get<std::string>().find("did not settle") != std::string::npos);
  const Result r = run("ok,unsettled");
  ASSERT_EQ(r.points.size(), 2u);
  ASSERT_TRUE(r.points[1].info.contains("warning"));
  EXPECT_NE(r.points[1].info["warning"].get<std::string>().find("did not settle: they spread 46%"), std::string::npos)
      << r.points[1].info["warning"];
  ASSERT_FALSE(r.findings.empty());
  EXPECT_TRUE(r.findings[0].evidence.contains("caveat")) << r.findings[0].evidence;
}

TEST(Runner, ErrorsBecomeStatusesWithReasons) {
  const Result r = run("ok,oom,skip,wrong");
  ASSERT_EQ(r.points.size(), 4u);
  EXPECT_EQ(r.points[0].status, Status::ok);
  EXPECT_EQ(r.points[1].status, Status::oom);
  EXPECT_EQ(r.points[1].reason, "cudaMalloc of 80 GB failed");
  EXPECT_EQ(r.points[2].status, Status::skipped);
  EXPECT_EQ(r.points[3].status, Status::error);
  for (const auto& p : r.points) EXPECT_EQ(p.params["what"].is_string(), true);
  EXPECT_EQ(r.findings.at(0).summary, "analyzed");
  EXPECT_EQ(run_exit_code(r), 1);
  EXPECT_EQ(run_exit_code(run("ok,oom,skip")), 0);  // oom and skipped are results, not failures
}

TEST(Runner, AfterAHangTheRestIsSkippedAndTheExitCodeSaysHang) {
  const Result r = run("ok,hang,ok");
  EXPECT_EQ(r.points[1].status, Status::hang);
  EXPECT_EQ(r.points[2].status, Status::skipped);
  EXPECT_NE(r.points[2].reason.find("earlier point hung"), std::string::npos);
  EXPECT_EQ(run_exit_code(r), 4);
}

TEST(Runner, BadParamsFailBeforeAnyWork) {
  EXPECT_THROW(run("fine"), UsageError);
}

}  // namespace
}  // namespace sb
