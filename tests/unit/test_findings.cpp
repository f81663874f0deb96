// Each scenario's analysis is a function of a Result: given the recorded
// points of a published result (results/published/), with the derived
// metrics and findings taken off, it must put back the same derived metrics
// and the same findings, word for word. No timing, no device: the analysis
// is tested on real recorded data, not only through end-to-end runs.
#include <cmath>       // std::fabs
#include <filesystem>  // std::filesystem::recursive_directory_iterator
#include <fstream>     // std::ifstream
#include <map>         // std::map
#include <set>         // std::set
#include <string>      // std::string
#include <vector>      // std::vector

#include <gtest/gtest.h>

#include "fake_device.hpp"
#include "harness/result.hpp"
#include "harness/runner.hpp"
#include "harness/scenario.hpp"

namespace sb {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

fs::path published_dir() {
  if (const char* env = std::getenv("STALLBENCH_DATA_DIR"); env && *env) return fs::path(env) / "published";
  return fs::path(STALLBENCH_SOURCE_DIR) / "results" / "published";
}

// The metrics each scenario's analysis derives from the measured ones.
const std::map<std::string, std::set<std::string>>& derived_metrics() {
  static const std::map<std::string, std::set<std::string>> m{
      {"precision", {"speedup_vs_fp32"}},
      {"attention", {"speedup_vs_naive", "memory_ratio_vs_naive"}},
      {"packing", {"speedup_vs_pad_max", "predicted_speedup", "predicted_flops_speedup"}},
      {"dataloader", {}},
      {"collective", {}},
      {"numerics", {}},
      {"batch", {}},
      {"memory", {}},
      {"train", {}},
  };
  return m;
}

struct Recorded {
  std::string file;
  json doc;
};

std::vector<Recorded> recorded_results() {
  std::vector<Recorded> out;
  for (const auto& e : fs::recursive_directory_iterator(published_dir())) {
    if (!e.is_regular_file() || e.path().extension() != ".json") continue;
    std::ifstream in(e.path());
    json doc = json::parse(in);
    if (doc.value("kind", "") == "result") out.push_back({e.path().filename().string(), std::move(doc)});
  }
  return out;
}

TEST(Findings, EveryPublishedResultIsReanalyzedIdentically) {
  const auto recorded = recorded_results();
  ASSERT_GE(recorded.size(), 5u) << "published results under " << published_dir();
  std::set<std::string> scenarios_seen;
  for (const auto& rec : recorded) {
    SCOPED_TRACE(rec.file);
    const Result want = result_from_json(rec.doc);
    const Scenario* sc = find_scenario(want.scenario);
    ASSERT_NE(sc, nullptr) << want.scenario;
    const auto& derived = derived_metrics().at(sc->name);
    scenarios_seen.insert(sc->name);

    Result r = want;
    r.findings.clear();
    for (auto& p : r.points)
      std::erase_if(p.metrics, [&](const Metric& m) { return derived.count(m.name) > 0; });

    test::FakeDevice dev;
    RunContext ctx{dev};
    sc->start(ctx)->analyze(r);
    finish_findings(r, *sc, want.simulated());

    ASSERT_EQ(r.points.size(), want.points.size());
    for (std::size_t i = 0; i < r.points.size(); ++i)
      for (const auto& name : derived) {
        const Metric* a = r.points[i].metric(name);
        const Metric* b = want.points[i].metric(name);
        ASSERT_EQ(a == nullptr, b == nullptr) << "point " << i << " metric " << name;
        if (a) {
          EXPECT_NEAR(a->value, b->value, 1e-9 * std::fabs(b->value)) << "point " << i << " " << name;
          EXPECT_EQ(a->unit, b->unit);
          EXPECT_EQ(a->direction, b->direction);
        }
      }
    ASSERT_EQ(r.findings.size(), want.findings.size());
    for (std::size_t i = 0; i < r.findings.size(); ++i) {
      EXPECT_EQ(r.findings[i].summary, want.findings[i].summary);
      EXPECT_EQ(r.findings[i].cause, sc->cause);
      EXPECT_EQ(r.findings[i].speedup.has_value(), want.findings[i].speedup.has_value());
      if (r.findings[i].speedup && want.findings[i].speedup) {
        EXPECT_NEAR(*r.findings[i].speedup, *want.findings[i].speedup, 1e-9 * std::fabs(*want.findings[i].speedup));
      }
    }
  }
  // Every scenario with published results was reanalyzed.
  for (const char* s : {"precision", "attention", "packing", "dataloader", "collective", "numerics", "batch", "train"})
    EXPECT_TRUE(scenarios_seen.count(s)) << "no published result of " << s;
}

}  // namespace
}  // namespace sb
