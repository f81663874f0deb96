#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "harness/errors.hpp"
#include "harness/result.hpp"

namespace sb {
namespace {

using json = nlohmann::ordered_json;

Result sample() {
  Result r;
  r.meta = json{{"tool", "stallbench"}, {"device", {{"id", "cpu"}, {"simulated", false}}}};
  r.scenario = "precision";
  r.params = json{{"size", {256, 512}}, {"dtype", {"fp32", "bf16"}}};
  Point ok;
  ok.params = json{{"size", 256}, {"dtype", "bf16"}};
  Stats s;
  s.n = 5;
  s.median = 1.5;
  s.p10 = 1.4;
  s.p90 = 1.7;
  s.stdrel = 0.01;
  ok.add({"tflops", 0.25, "TFLOP/s", Direction::higher, s, "2*M*N*K / median time"});
  ok.add({"ms", 1.5, "ms", Direction::lower, std::nullopt, ""});
  ok.info = json{{"impl", "brg:avx512_core_bf16"}};
  Point oom;
  oom.params = json{{"size", 512}, {"dtype", "bf16"}};
  oom.status = Status::oom;
  oom.reason = "cannot allocate";
  r.points = {ok, oom};
  r.findings.push_back({"fp32 where bf16 would do", "fp32 -> bf16: 2.0x", 2.0, json{{"shape", "256x256x256"}}});
  return r;
}

TEST(Result, JsonRoundTripKeepsEverything) {
  const Result a = sample();
  const json j = to_json(a);
  EXPECT_EQ(j["schema_version"], kResultSchemaVersion);
  EXPECT_EQ(j["kind"], "result");
  const Result b = result_from_json(json::parse(j.dump()));
  EXPECT_EQ(to_json(b), j);
  ASSERT_EQ(b.points.size(), 2u);
  EXPECT_EQ(b.points[1].status, Status::oom);
  EXPECT_EQ(b.points[1].reason, "cannot allocate");
  const Metric* m = b.points[0].metric("tflops");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->direction, Direction::higher);
  ASSERT_TRUE(m->stats.has_value());
  EXPECT_DOUBLE_EQ(m->stats->p90, 1.7);
  EXPECT_EQ(b.findings.at(0).speedup, 2.0);
}

TEST(Result, RejectsWhatIsNotAResult) {
  json j = to_json(sample());
  j["points"][0]["status"] = "fine";
  EXPECT_THROW(result_from_json(j), UsageError);
  j = to_json(sample());
  j["points"][0]["metrics"]["tflops"].erase("unit");
  try {
    result_from_json(j);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("points[0].metrics.tflops"), std::string::npos) << e.what();
  }
  EXPECT_THROW(result_from_json(json{{"kind", "expected"}}), UsageError);
  j = to_json(sample());
  j["schema_version"] = 99;
  EXPECT_THROW(result_from_json(j), UsageError);
}

TEST(Result, AtomicWriteReplacesAndLeavesNoTemp) {
  const auto dir = std::filesystem::temp_directory_path() / ("sb-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "r.json").string();
  write_file_atomic(path, "first");
  write_file_atomic(path, "second");
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text, "second");
  int files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1);
  EXPECT_THROW(write_file_atomic((dir / "no-such-dir" / "r.json").string(), "x"), Error);
  std::filesystem::remove_all(dir);
}

TEST(Result, ReadJsonFileErrorsAreUsageErrors) {
  EXPECT_THROW(read_json_file("/nonexistent/stallbench.json"), UsageError);
  const auto p = std::filesystem::temp_directory_path() / ("sb-bad-" + std::to_string(::getpid()) + ".json");
  std::ofstream(p) << "{not json";
  EXPECT_THROW(read_json_file(p.string()), UsageError);
  std::filesystem::remove(p);
}

}  // namespace
}  // namespace sb
