#include <gtest/gtest.h>

#include "harness/sampler.hpp"
#include "harness/timeline.hpp"

#include <thread>

namespace sb {
namespace {

TEST(Timeline, UnionCountsOverlapsOnce) {
  EXPECT_DOUBLE_EQ(union_length({{0, 1}, {0.5, 2}, {3, 4}, {3.5, 3.6}}), 3.0);
  EXPECT_DOUBLE_EQ(union_length({}), 0.0);
  EXPECT_DOUBLE_EQ(union_length({{2, 1}}), 0.0);  // empty intervals count nothing
}

TEST(Timeline, BusyFractionAndIdleBreakdown) {
  Timeline t;
  // Device busy 0-1 (h2d 0-0.2, compute 0.2-1), idle 1-3, busy 3-4.
  t.add({"device", Phase::h2d, 0.0, 0.2, 0});
  t.add({"device", Phase::compute, 0.2, 1.0, 0});
  t.add({"device", Phase::compute, 3.0, 4.0, 1});
  // The train loop waited for batch 1 from 1.5 to 3.0.
  t.add({"train loop", Phase::wait, 1.5, 3.0, 1});
  t.add({"worker 0", Phase::load, 0.0, 3.0, 1});  // host lanes never count as device busy
  const TimelineSummary s = t.summarize(4.0);
  EXPECT_DOUBLE_EQ(s.busy_s, 2.0);
  EXPECT_DOUBLE_EQ(s.busy_fraction, 0.5);
  EXPECT_DOUBLE_EQ(s.idle_host_wait_s, 1.5);
  EXPECT_DOUBLE_EQ(s.idle_other_s, 0.5);
  // A window that starts after a warm-up: [1, 4] holds 1 s busy of 3.
  const TimelineSummary w = t.summarize(1.0, 4.0);
  EXPECT_DOUBLE_EQ(w.wall_s, 3.0);
  EXPECT_DOUBLE_EQ(w.busy_s, 1.0);
  EXPECT_DOUBLE_EQ(w.idle_host_wait_s, 1.5);
  EXPECT_DOUBLE_EQ(w.idle_other_s, 0.5);
}

TEST(Timeline, ChromeTraceHasLanesAndIdleSlices) {
  TraceProcess p{"workers=1", {}, 2.0};
  p.timeline.add({"device", Phase::compute, 0.5, 1.0, 0});
  p.timeline.add({"worker 0", Phase::load, 0.0, 0.5, 0});
  const auto j = chrome_trace({p});
  int idle = 0, compute = 0, names = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") ++names;
    if (e["ph"] == "X" && e["name"] == "idle") ++idle;
    if (e["ph"] == "X" && e["name"] == "compute") {
      ++compute;
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 0.5e6);
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 0.5e6);
    }
  }
  EXPECT_EQ(names, 3);    // device, train loop, worker 0
  EXPECT_EQ(idle, 2);     // 0-0.5 and 1.0-2.0
  EXPECT_EQ(compute, 1);
}

TEST(Pattern, ClassifiesSyntheticSeries) {
  const std::vector<double> healthy(50, 0.97);
  EXPECT_EQ(classify(healthy), Pattern::healthy);
  std::vector<double> spiky;
  for (int i = 0; i < 50; ++i) spiky.push_back(i % 3 == 0 ? 1.0 : 0.02);  // bursts, then starvation
  EXPECT_EQ(classify(spiky), Pattern::spiky);
  const std::vector<double> low(50, 0.4);
  EXPECT_EQ(classify(low), Pattern::steady_low);
  std::vector<double> wobble;
  for (int i = 0; i < 50; ++i) wobble.push_back(i % 2 ? 0.5 : 0.35);
  EXPECT_EQ(classify(wobble), Pattern::steady_low);
  const std::vector<double> idle(50, 0.01);
  EXPECT_EQ(classify(idle), Pattern::idle);
  EXPECT_EQ(classify(healthy, /*progressed=*/false), Pattern::stuck);
  EXPECT_EQ(to_string(Pattern::steady_low), "steady-low");
}

// Each threshold of the rule (harness/sampler.hpp), at and just past it.
TEST(Pattern, ThresholdsAreExact) {
  auto series = [](std::initializer_list<std::pair<int, double>> parts) {
    std::vector<double> v;
    for (auto [n, x] : parts) v.insert(v.end(), std::size_t(n), x);
    return v;
  };
  // mean 0.90 exactly (9/10, no rounding in the sum) is healthy; just under is not.
  EXPECT_EQ(classify(series({{9, 1.0}, {1, 0.0}})), Pattern::healthy);
  EXPECT_EQ(classify(series({{9, 0.9999}, {1, 0.0}})), Pattern::steady_low);
  // mean 0.05 exactly (0.5/10) is no longer idle; just under is.
  EXPECT_EQ(classify(series({{1, 0.5}, {9, 0.0}})), Pattern::steady_low);
  EXPECT_EQ(classify(series({{1, 0.4999}, {9, 0.0}})), Pattern::idle);
  // spiky needs >= 15% of samples <= 0.2 AND >= 15% >= 0.8 (20 samples: 3 is 15%).
  EXPECT_EQ(classify(series({{3, 0.2}, {3, 0.8}, {14, 0.5}})), Pattern::spiky);
  EXPECT_EQ(classify(series({{2, 0.2}, {3, 0.8}, {15, 0.5}})), Pattern::steady_low);  // 10% near idle
  EXPECT_EQ(classify(series({{3, 0.2}, {2, 0.8}, {15, 0.5}})), Pattern::steady_low);  // 10% near full
  EXPECT_EQ(classify(series({{3, 0.2001}, {3, 0.8}, {14, 0.5}})), Pattern::steady_low);  // not near idle
  EXPECT_EQ(classify(series({{3, 0.2}, {3, 0.7999}, {14, 0.5}})), Pattern::steady_low);  // not near full
  // healthy wins over spiky: a mean >= 90% with some idle samples is healthy.
  EXPECT_EQ(classify(series({{2, 0.0}, {18, 1.0}})), Pattern::healthy);
  EXPECT_EQ(classify(std::vector<double>{}), Pattern::idle);
}

TEST(Pattern, Sparkline) {
  EXPECT_EQ(sparkline(std::vector<double>{0.0, 0.5, 1.0}), "▁▅█");
  EXPECT_EQ(sparkline(std::vector<double>(200, 1.0), 10), "██████████");
  EXPECT_EQ(sparkline(std::vector<double>{}), "");
  std::vector<double> spikes;
  for (int i = 0; i < 120; ++i) spikes.push_back(i % 3 == 0 ? 1.0 : 0.0);
  const std::string line = sparkline(spikes, 60);
  EXPECT_EQ(line.size(), 60u * 3);                         // 60 block characters, 3 bytes each
  EXPECT_NE(line.find("█"), std::string::npos) << line;  // the window keeps the spikes
  EXPECT_NE(line.find("▁"), std::string::npos) << line;
}

}  // namespace
}  // namespace sb

namespace sb {
namespace {

class ConstantProbe : public UtilProbe {
 public:
  UtilSample sample() override {
    ++calls;
    return UtilSample{0.5, 1980.0, 700.0, 0};
  }
  std::string source() const override { return "constant"; }
  std::chrono::milliseconds period() const override { return std::chrono::milliseconds(2); }
  int calls = 0;
};

TEST(Sampler, SamplesUntilStoppedAndStopsTwice) {
  Sampler s(std::make_unique<ConstantProbe>());
  EXPECT_EQ(s.source(), "constant");
  EXPECT_EQ(s.period().count(), 2);
  s.start();
  // Wait for samples with a deadline, not for a fixed time: a loaded machine
  // may deschedule the sampler for longer than any fixed sleep.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (s.series().size() < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  s.stop();
  const auto series = s.series();
  ASSERT_GE(series.size(), 3u) << "no samples within 30 s";
  for (std::size_t i = 0; i < series.size(); ++i) {
    EXPECT_DOUBLE_EQ(series[i].s.util, 0.5);
    if (i) {
      EXPECT_GE(series[i].t_s, series[i - 1].t_s);
    }
  }
  s.stop();  // idempotent
  EXPECT_EQ(s.series().size(), series.size());
}

TEST(Sampler, NoProbeMeansNoSeries) {
  Sampler s(nullptr);
  s.start();
  s.stop();
  EXPECT_TRUE(s.series().empty());
  EXPECT_EQ(s.source(), "none");
}

}  // namespace
}  // namespace sb
