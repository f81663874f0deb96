#include <gtest/gtest.h>

#include "fake_device.hpp"
#include "harness/measure.hpp"
#include "harness/stats.hpp"

namespace sb {
namespace {

TEST(Stats, PercentilesInterpolateLikeNumpy) {
  const std::vector<double> v{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const Stats s = summarize(v);
  EXPECT_EQ(s.n, 10);
  EXPECT_DOUBLE_EQ(s.median, 5.5);
  EXPECT_DOUBLE_EQ(s.p10, 1.9);
  EXPECT_DOUBLE_EQ(s.p90, 9.1);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 10);
  EXPECT_DOUBLE_EQ(s.mean, 5.5);
  EXPECT_NEAR(s.stdrel, 3.0276503540974917 / 5.5, 1e-12);
}

TEST(Stats, UnsortedInputAndSingleSample) {
  const std::vector<double> v{3, 1, 2};
  EXPECT_DOUBLE_EQ(summarize(v).median, 2);
  const std::vector<double> one{4};
  const Stats s = summarize(one);
  EXPECT_DOUBLE_EQ(s.median, 4);
  EXPECT_DOUBLE_EQ(s.stdrel, 0);
  EXPECT_EQ(summarize(std::vector<double>{}).n, 0);
}

// measure() on a virtual clock: each op advances it by op_ms (+ jitter).
TEST(Measure, QuietDeviceStopsOnNoiseAfterMinTrials) {
  test::FakeDevice dev;
  dev.op_ms = 2.0;
  MeasureConfig cfg;
  cfg.warmup = 1;
  cfg.min_trials = 5;
  cfg.min_trial_ms = 1.0;
  const Measurement m = measure(dev, [&] { dev.tick(); }, cfg);
  EXPECT_EQ(m.ms.n, 5);
  EXPECT_TRUE(m.converged);
  EXPECT_EQ(m.stop, "noise");
  EXPECT_DOUBLE_EQ(m.ms.median, 2.0);
  EXPECT_EQ(m.reps_per_trial, 1);
}

TEST(Measure, ShortOpsAreBatchedIntoLongerTrials) {
  test::FakeDevice dev;
  dev.op_ms = 0.01;
  MeasureConfig cfg;
  cfg.min_trial_ms = 1.0;
  const Measurement m = measure(dev, [&] { dev.tick(); }, cfg);
  EXPECT_EQ(m.reps_per_trial, 100);
  EXPECT_NEAR(m.ms.median, 0.01, 1e-12);
}

TEST(Measure, NoisyDeviceRunsUntilBudget) {
  test::FakeDevice dev;
  dev.op_ms = 1.0;
  dev.jitter = {0.0, 0.9, 0.1, 0.5};  // ~35% noise: never converges
  MeasureConfig cfg;
  cfg.min_trials = 3;
  cfg.budget_s = 0.05;  // 50 ms of virtual device time
  cfg.min_trial_ms = 0.5;
  const Measurement m = measure(dev, [&] { dev.tick(); }, cfg);
  EXPECT_FALSE(m.converged);
  EXPECT_EQ(m.stop, "budget");
  EXPECT_GE(m.spent_s, 0.05);
  EXPECT_LT(m.spent_s, 0.05 + 0.002);
}

TEST(Measure, MaxTrialsCaps) {
  test::FakeDevice dev;
  dev.jitter = {0.0, 1.0};
  MeasureConfig cfg;
  cfg.min_trials = 2;
  cfg.max_trials = 7;
  cfg.budget_s = 1e9;
  const Measurement m = measure(dev, [&] { dev.tick(); }, cfg);
  EXPECT_EQ(m.ms.n, 7);
  EXPECT_EQ(m.stop, "max_trials");
}

// Cold: the flush runs before each op and outside its events, so the figure
// is the op's time alone; each op of a trial is flushed, and trials are
// capped at kMaxRepsCold ops.
TEST(Measure, ColdFlushesBeforeEveryOpAndTimesTheOpAlone) {
  test::FakeDevice dev;
  dev.op_ms = 0.001;
  dev.flush_ms = 5.0;
  MeasureConfig cfg;
  cfg.mode = TimingMode::cold;
  cfg.warmup = 1;
  cfg.min_trials = 4;
  cfg.min_trial_ms = 1.0;
  const Measurement m = measure(dev, [&] { dev.tick(); }, cfg);
  EXPECT_EQ(m.mode, TimingMode::cold);
  EXPECT_EQ(m.flush_bytes, std::size_t(1) << 20);
  EXPECT_NEAR(m.ms.median, 0.001, 1e-12);  // 5 ms flushes excluded
  EXPECT_EQ(m.reps_per_trial, kMaxRepsCold);  // 1000 ops would make 1 ms: capped
  // One flush ahead of the measurement, then one per timed op (the
  // calibration's three single ops included); warm-up ops are not flushed.
  EXPECT_EQ(std::size_t(dev.flushes), 1 + 3 + std::size_t(m.ms.n) * std::size_t(m.reps_per_trial));
  EXPECT_EQ(dev.ops, std::size_t(1 + 3 + m.ms.n * m.reps_per_trial));
}

// A calibration sample preempted by another process must not make every trial one op: the
// least of the calibration's samples decides (0.35 ms ops, one sample at 7.95 ms: 3 ops a trial).
TEST(Measure, APreemptedCalibrationSampleDoesNotDecideTheTrialLength) {
  test::FakeDevice dev;
  dev.op_ms = 0.35;
  dev.jitter.assign(10000, 0.0);
  dev.jitter[1] = 7.6;  // op 0 is the warm-up, op 1 the first calibration sample
  MeasureConfig cfg;
  cfg.warmup = 1;
  cfg.min_trial_ms = 1.0;
  const Measurement m = measure(dev, [&] { dev.tick(); }, cfg);
  EXPECT_EQ(m.reps_per_trial, 3);
  EXPECT_NEAR(m.ms.median, 0.35, 1e-9);
  // an op of 50 ms or more is timed once in calibration
  test::FakeDevice slow;
  slow.op_ms = 60;
  cfg.max_trials = 3;
  cfg.min_trials = 3;
  (void)measure(slow, [&] { slow.tick(); }, cfg);
  EXPECT_EQ(slow.ops, std::size_t(1 + 1 + 3));
}

TEST(Measure, WarmNeverFlushes) {
  test::FakeDevice dev;
  dev.flush_ms = 5.0;
  const Measurement m = measure(dev, [&] { dev.tick(); }, MeasureConfig{});
  EXPECT_EQ(dev.flushes, 0);
  EXPECT_EQ(m.flush_bytes, 0u);
  EXPECT_EQ(m.mode, TimingMode::warm);
}

// Hidden: every trial (and the calibration) is enqueued behind a gate that is
// released once the trial is queued; an expired gate invalidates the figure.
TEST(Measure, HiddenGatesEveryTrialAndRefusesAnExpiredGate) {
  test::FakeDevice dev;
  dev.op_ms = 0.01;
  MeasureConfig cfg;
  cfg.mode = TimingMode::hidden;
  cfg.min_trials = 3;
  const Measurement m = measure(dev, [&] { dev.tick(); }, cfg);
  EXPECT_EQ(m.mode, TimingMode::hidden);
  EXPECT_EQ(dev.gates, 3 + m.ms.n);  // three calibration samples, then one gate a trial
  EXPECT_EQ(dev.gates_released, dev.gates);
  EXPECT_NEAR(m.ms.median, 0.01, 1e-12);
  EXPECT_EQ(m.reps_per_trial, 100);  // under kMaxRepsHidden
  test::FakeDevice late;
  late.gates_expire = true;
  cfg.mode = TimingMode::hidden;
  EXPECT_THROW(measure(late, [&] { late.tick(); }, cfg), Error);
}

TEST(Measure, TimingModeNamesRoundTrip) {
  for (auto mode : {TimingMode::warm, TimingMode::cold, TimingMode::hidden})
    EXPECT_EQ(parse_timing_mode(to_string(mode)), mode);
  EXPECT_FALSE(parse_timing_mode("hot").has_value());
}

TEST(Measure, HangPropagates) {
  test::FakeDevice dev;
  dev.hang_on_sync = true;
  EXPECT_THROW(measure(dev, [&] { dev.tick(); }, MeasureConfig{}), HangError);
}

}  // namespace
}  // namespace sb

namespace sb {
namespace {

TEST(Stats, RateFromMsInvertsAndSwapsTheTails) {
  Stats ms;
  ms.n = 3;
  ms.median = 2.0;
  ms.p10 = 1.0;
  ms.p90 = 4.0;
  ms.min = 1.0;
  ms.max = 4.0;
  ms.mean = 2.0;
  ms.stdrel = 0.1;
  const Stats r = rate_from_ms(ms, 2e12);  // 2 TFLOP in 2 ms = 1000 TFLOP/s
  EXPECT_DOUBLE_EQ(r.median, 1000);
  EXPECT_DOUBLE_EQ(r.p90, 2000);  // the fastest 10% of trials
  EXPECT_DOUBLE_EQ(r.p10, 500);
  EXPECT_DOUBLE_EQ(r.max, 2000);
  EXPECT_DOUBLE_EQ(r.min, 500);
  EXPECT_DOUBLE_EQ(r.stdrel, 0.1);
  EXPECT_EQ(r.n, 3);
  EXPECT_DOUBLE_EQ(rate_from_ms(Stats{}, 1.0).median, 0.0);  // no time, no rate
  EXPECT_EQ(with_min_trials(MeasureConfig{}, 5000).max_trials, 5000);
}

}  // namespace
}  // namespace sb
