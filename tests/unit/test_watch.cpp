// watch's analysis on made series (the pattern rule over windows, the stuck
// alarm, throttling, DCGM's SM active), and NVML read through the fake
// libnvidia-ml.so.1 (tests/fake_nvml, on LD_LIBRARY_PATH from meson).
#include <dlfcn.h>  // dlopen(RTLD_NOLOAD), dlsym: the fake's guard

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <functional>  // std::function
#include <map>  // std::map

#include <fmt/format.h>  // fmt::format
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/errors.hpp"
#include "harness/exit_codes.hpp"  // kExitHang
#include "watch/analysis.hpp"
#include "kernels/nvml/nvml_abi.hpp"
#include "watch/nvml_session.hpp"
#include "watch/progress.hpp"
#include "watch/watch.hpp"

namespace sb::watch {
namespace {

using json = nlohmann::ordered_json;

telemetry::Sample at(double t, double util, double mem_mib = 40000) {
  telemetry::Sample s;
  s.t_s = t;
  s.util_pct = util;
  s.mem_used_mib = mem_mib;
  return s;
}

Options opts(double window = 10, double summary = 5, double stuck_after = 3) {
  Options o;
  o.window_s = window;
  o.summary_window_s = summary;
  o.stuck_after_s = stuck_after;
  return o;
}

TEST(WatchAnalysis, EachPatternIsNamedFromItsSeries) {
  struct Case {
    const char* name;
    double (*util)(int);
    Pattern want;
  };
  const Case cases[] = {
      {"healthy", [](int i) { return 94.0 + i % 5; }, Pattern::healthy},
      {"spiky", [](int i) { return i % 10 < 4 ? 100.0 : 3.0; }, Pattern::spiky},
      {"steady-low", [](int i) { return 45.0 + i % 7; }, Pattern::steady_low},
      {"idle", [](int) { return 0.0; }, Pattern::idle},
  };
  for (const Case& c : cases) {
    GpuTracker t(0, opts(10, 5, 1e9));
    for (int i = 0; i < 200; ++i) t.add(at(i * 0.1, c.util(i), c.want == Pattern::idle ? 0 : 40000));
    t.finish();
    EXPECT_EQ(t.pattern(), c.want) << c.name << ": " << t.pattern_evidence();
    // 20 s in windows of 5 s: four windows, all of the one pattern: one run
    const json s = t.summary();
    ASSERT_EQ(s["windows"].size(), 1u) << c.name;
    EXPECT_DOUBLE_EQ(s["windows"][0]["t_s"].get<double>(), 0);
    EXPECT_NEAR(s["windows"][0]["end_s"].get<double>(), 19.9, 1e-9);
    EXPECT_NEAR(s["pattern_share_pct"][std::string(to_string(c.want))].get<double>(), 100.0, 1e-9) << c.name;
  }
}

TEST(WatchAnalysis, SharesFollowThePatternOverTime) {
  // 10 s healthy, then 10 s spiky, then 10 s steady-low
  GpuTracker t(0, opts(5, 5, 1e9));
  for (int i = 0; i < 300; ++i) {
    const double u = i < 100 ? 97 : i < 200 ? (i % 4 == 0 ? 100 : 0) : 40;
    t.add(at(i * 0.1, u));
  }
  t.finish();
  const json s = t.summary();
  const json& share = s["pattern_share_pct"];
  // windows of 5 s: [0,5) [5,10) healthy, [10,15) [15,20) spiky, [20,25) steady-low, [25,29.9] steady-low
  EXPECT_NEAR(share["healthy"].get<double>(), 100 * 10 / 29.9, 0.01);
  EXPECT_NEAR(share["spiky"].get<double>(), 100 * 10 / 29.9, 0.01);
  EXPECT_NEAR(share["steady-low"].get<double>(), 100 * 9.9 / 29.9, 0.01);
  EXPECT_EQ(t.pattern(), Pattern::steady_low);
}

TEST(WatchAnalysis, StuckAlarmOnceAfterTheThresholdWithMemoryHeld) {
  GpuTracker t(3, opts(10, 5, 3));
  int alarms = 0;
  double alarm_t = -1;
  for (int i = 0; i <= 100; ++i) {
    const double time = i * 0.1;
    const double u = time < 2 ? 90 : 0;  // stops at t=2 s, memory still held
    if (t.add(at(time, u, 50000))) {
      ++alarms;
      alarm_t = time;
    }
  }
  EXPECT_EQ(alarms, 1);
  EXPECT_NEAR(alarm_t, 5.0, 1e-9);  // 0 from t=2.0, stuck-after 3 s
  EXPECT_TRUE(t.stuck_now());
  EXPECT_EQ(t.pattern(), Pattern::stuck);
  ASSERT_EQ(t.stuck_episodes().size(), 1u);
  EXPECT_NEAR(t.stuck_episodes()[0].start_s, 2.0, 1e-9);
  EXPECT_LT(t.stuck_episodes()[0].end_s, 0);  // still stuck
  EXPECT_NEAR(t.stuck_for_s(), 8.0, 1e-9);
  // it recovers: the episode ends, and a second stall raises a second alarm
  t.add(at(10.1, 80, 50000));
  EXPECT_FALSE(t.stuck_now());
  EXPECT_NEAR(t.stuck_episodes()[0].end_s, 10.1, 1e-9);
  for (int i = 0; i <= 40; ++i) alarms += t.add(at(10.2 + i * 0.1, 0, 50000));
  EXPECT_EQ(alarms, 2);
  t.finish();
  EXPECT_GT(t.summary()["pattern_share_pct"]["stuck"].get<double>(), 0);
}

TEST(WatchAnalysis, AZeroRunAfterAnEpisodeIsNotCountedAsThatEpisode) {
  // stuck 0.5-6.0 s (alarm at 5.5), busy to 8.0, then 0 from 8.0 to 12.0: too short for an alarm,
  // and pending when the 10 s window closes. Its zeros belong to the window (utilization 0), not to
  // the earlier episode that also lies in that window.
  GpuTracker t(0, opts(10, 10, 5));
  for (int i = 0; i <= 200; ++i) {
    const double time = i * 0.1;
    const bool zero = (time >= 0.5 && time < 6.0) || (time >= 8.0 && time < 12.0);
    t.add(at(time, zero ? 0 : 97, 50000));
  }
  t.finish();
  ASSERT_EQ(t.stuck_episodes().size(), 1u);
  const json share = t.summary()["pattern_share_pct"];
  // [0,10): 5.5 s stuck; the rest (97% then 0 from 8.0) is spiky. [10,20): the run's end, then 97%: spiky too.
  EXPECT_NEAR(share["stuck"].get<double>(), 100 * 5.5 / 20, 1e-6);
  EXPECT_NEAR(share["spiky"].get<double>(), 100 * 14.5 / 20, 1e-6);
}

TEST(WatchAnalysis, ZeroWithoutMemoryHeldIsIdleNotStuck) {
  GpuTracker t(0, opts(10, 5, 1));
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(t.add(at(i * 0.1, 0, 300)));  // a bare context, under 1 GiB
  EXPECT_EQ(t.pattern(), Pattern::idle);
  // a listed process holding memory counts as held, even under the MiB line
  GpuTracker p(0, opts(10, 5, 1));
  const std::vector<unsigned> pids = {42};
  const std::vector<double> mib = {300};
  bool alarm = false;
  for (int i = 0; i < 30; ++i) alarm |= p.add(at(i * 0.1, 0, 300), &pids, &mib);
  EXPECT_TRUE(alarm);
  EXPECT_EQ(p.stuck_episodes().at(0).pids, pids);
}

TEST(WatchAnalysis, ThrottlingByReasonAndByClocksUnderLoad) {
  GpuTracker t(0, opts(10, 5, 1e9));
  for (int i = 0; i <= 100; ++i) {
    telemetry::Sample s = at(i * 0.1, 99);
    s.sm_clock_max_mhz = 1980;
    s.sm_clock_mhz = 1980;
    if (i >= 50 && i < 70) s.clock_event_reasons = nvml_abi::kReasonSwPowerCap | nvml_abi::kReasonGpuIdle;
    if (i >= 70 && i < 80) s.sm_clock_mhz = 1200;  // no reason given, clocks low under load
    if (i >= 80) s.clock_event_reasons = nvml_abi::kReasonGpuIdle;  // not a throttle
    t.add(s);
  }
  EXPECT_NEAR(t.throttled_s(), 3.0, 1e-6);   // 20 samples power cap + 10 clocks low, 0.1 s each
  EXPECT_NEAR(t.clocks_low_s(), 1.0, 1e-6);
  EXPECT_NEAR(t.throttle_reason_s().at("sw_power_cap"), 2.0, 1e-6);
  EXPECT_EQ(t.throttle_reason_s().count("gpu_idle"), 0u);
  EXPECT_EQ(throttle_reason_names(nvml_abi::kReasonHwThermal | nvml_abi::kReasonHwPowerBrake),
            (std::vector<std::string>{"hw_thermal", "hw_power_brake"}));
  // what each names points at: heat is cooling, a power cap the limit, the brake the power supply, and
  // HW slowdown any of those three; every name has one
  const std::uint64_t all = nvml_abi::kReasonSwPowerCap | nvml_abi::kReasonHwSlowdown | nvml_abi::kReasonSwThermal |
                            nvml_abi::kReasonHwThermal | nvml_abi::kReasonHwPowerBrake;
  const std::map<std::string, ThrottleCause> want{{"sw_power_cap", ThrottleCause::power_cap},
                                                  {"hw_slowdown", ThrottleCause::hw_slowdown},
                                                  {"sw_thermal", ThrottleCause::heat},
                                                  {"hw_thermal", ThrottleCause::heat},
                                                  {"hw_power_brake", ThrottleCause::power_brake}};
  ASSERT_EQ(throttle_reason_names(all).size(), want.size());
  for (const std::string& name : throttle_reason_names(all)) EXPECT_EQ(throttle_reason_cause(name), want.at(name)) << name;
  EXPECT_FALSE(throttle_reason_cause("gpu_idle").has_value());
}

TEST(WatchAnalysis, HwSlowdownNamesItsThreeCausesUnlessAnotherBitSaysWhich) {
  // NVML's HW slowdown (0x8): temperature too high, the external power brake, or power draw too
  // high (fast trigger); with HW power brake (0x88) it is the brake, with HW thermal (0x48) heat
  using C = std::vector<ThrottleCause>;
  EXPECT_EQ(throttle_causes(0x8), (C{ThrottleCause::hw_slowdown}));
  EXPECT_EQ(throttle_causes(0x88), (C{ThrottleCause::power_brake}));
  EXPECT_EQ(throttle_causes(0x48), (C{ThrottleCause::heat}));
  EXPECT_EQ(throttle_causes(0x4 | 0x20), (C{ThrottleCause::power_cap, ThrottleCause::heat}));
  const std::string alone = throttle_advice({ThrottleCause::hw_slowdown});
  for (const char* cause : {"temperature too high", "external power brake", "power draw too high"})
    EXPECT_NE(alone.find(cause), std::string::npos) << cause << ": " << alone;
  const std::string brake = throttle_advice(throttle_causes(0x88));
  EXPECT_NE(brake.find("power brake"), std::string::npos) << brake;
  EXPECT_EQ(brake.find("cooling"), std::string::npos) << brake;
  EXPECT_EQ(throttle_advice({}), "check the clocks");
  // the tracker keeps the seconds of each cause: 0x8 alone for 1 s, then 0x88 for 2 s
  GpuTracker t(0, opts(10, 5, 1e9));
  for (int i = 0; i <= 30; ++i) {
    telemetry::Sample s = at(i * 0.1, 99);
    s.clock_event_reasons = i < 10 ? 0x8 : 0x88;
    t.add(s);
  }
  EXPECT_NEAR(t.throttle_cause_s().at(ThrottleCause::hw_slowdown), 1.0, 1e-6);
  EXPECT_NEAR(t.throttle_cause_s().at(ThrottleCause::power_brake), 2.0, 1e-6);
  EXPECT_NEAR(t.throttle_reason_s().at("hw_slowdown"), 3.0, 1e-6);  // the reason itself, as NVML set it
}

TEST(WatchAnalysis, SmActiveTellsSteadyLowFromHealthy) {
  // utilization.gpu at 100% (a kernel always running) but few SMs busy: launch-bound
  GpuTracker t(0, opts(10, 5, 1e9));
  for (int i = 0; i < 100; ++i) {
    telemetry::Sample s = at(i * 0.1, 100);
    s.sm_active = 0.2;
    t.add(s);
  }
  EXPECT_EQ(t.pattern(), Pattern::steady_low);
  EXPECT_NE(t.pattern_evidence().find("SM active 20%"), std::string::npos) << t.pattern_evidence();
  GpuTracker h(0, opts(10, 5, 1e9));
  for (int i = 0; i < 100; ++i) {
    telemetry::Sample s = at(i * 0.1, 100);
    s.sm_active = 0.85;
    h.add(s);
  }
  EXPECT_EQ(h.pattern(), Pattern::healthy);
}

TEST(WatchAnalysis, AClockStepBackIsClampedAndTheSparklineHoldsTheLastValue) {
  GpuTracker t(0, opts(6, 5, 1e9));
  t.add(at(0, 100));
  t.add(at(1, 0));
  t.add(at(0.5, 100));  // the log's clock stepped back: counted at t=1
  t.add(at(6, 50));
  EXPECT_NEAR(t.duration_s(), 6, 1e-9);
  const auto u = t.recent_util(6);  // slices of 1 s from t=0
  ASSERT_EQ(u.size(), 6u);
  EXPECT_DOUBLE_EQ(u[0], 1.0);  // (0, 1]: the last sample in it is the clamped 100%
  EXPECT_DOUBLE_EQ(u[2], 1.0);  // no sample: the last value holds
  EXPECT_DOUBLE_EQ(u[5], 0.5);
}

TEST(WatchAnalysis, AGapOfYearsInALogIsOneStepNotBillions) {
  // the fuzzer's input: a clock jump of 10 years between two rows
  GpuTracker t(0, opts(60, 10, 1e9));
  t.add(at(0, 100));
  t.add(at(0.1, 100));
  t.add(at(3.15e8, 100));
  t.finish();
  const json s = t.summary();
  EXPECT_NEAR(t.duration_s(), 3.15e8, 1);
  EXPECT_LE(s["series"]["t_s"].size(), 3u);  // the empty buckets are not listed
  EXPECT_LE(s["windows"].size(), 3u);
  EXPECT_NEAR(s["pattern_share_pct"]["healthy"].get<double>(), 100, 1e-9);
}

TEST(WatchAnalysis, TheSparklineShowsTheSpreadInsideASlice) {
  // a loader's stall every second, sampled at 100 ms: each 1 s column holds
  // both idle and full samples; even columns show the low, odd the high
  GpuTracker t(0, opts(60, 10, 1e9));
  for (int i = 0; i <= 600; ++i) t.add(at(i * 0.1, i % 10 < 3 ? 100 : 0));
  const auto u = t.recent_util(60);
  ASSERT_EQ(u.size(), 60u);
  for (std::size_t c = 0; c < u.size(); ++c) EXPECT_DOUBLE_EQ(u[c], c % 2 ? 1.0 : 0.0) << c;
  // a steady series stays flat
  GpuTracker f(0, opts(60, 10, 1e9));
  for (int i = 0; i <= 600; ++i) f.add(at(i * 0.1, 45));
  for (double v : f.recent_util(60)) EXPECT_DOUBLE_EQ(v, 0.45);
}

TEST(WatchAnalysis, ReasonsOfAnIdleGpuAndApplicationClocksAreNotThrottling) {
  GpuTracker t(0, opts(10, 5, 1e9));
  for (int i = 0; i <= 100; ++i) {
    telemetry::Sample s = at(i * 0.1, i < 50 ? 0 : 99);
    s.sm_clock_max_mhz = 1980;
    s.sm_clock_mhz = 1200;
    s.clock_event_reasons = i < 50 ? nvml_abi::kReasonSwPowerCap : nvml_abi::kReasonAppClocks;
    t.add(s);
  }
  EXPECT_DOUBLE_EQ(t.throttled_s(), 0);
  EXPECT_LE(t.throttled_s(), t.duration_s());
}

TEST(WatchAnalysis, ThePatternOverADayStaysBounded) {
  // alternating 10 s windows for a day: runs merge past 2000, time still adds up
  GpuTracker t(0, opts(10, 10, 1e9));
  for (int i = 0; i <= 86400; ++i) t.add(at(i, (i / 10) % 2 ? 97 : 40));
  t.finish();
  const json s = t.summary();
  EXPECT_LE(s["windows"].size(), 2001u);
  EXPECT_GT(s["windows"].size(), 500u);
  EXPECT_DOUBLE_EQ(s["windows"][0]["t_s"].get<double>(), 0);
  EXPECT_NEAR(s["windows"].back()["end_s"].get<double>(), 86400, 1e-6);
  EXPECT_NEAR(s["pattern_share_pct"]["healthy"].get<double>(), 50, 0.1);
  EXPECT_LE(s["series"]["t_s"].size(), 3600u);
}

TEST(WatchAnalysis, GpuListIsParsedOrRefused) {
  EXPECT_TRUE(parse_gpu_list("all").empty());
  EXPECT_EQ(parse_gpu_list("3,1,1"), (std::vector<int>{1, 3}));
  for (const char* bad : {"", "x", "1,", ",1", "-1", "1;2", "99999"}) EXPECT_THROW(parse_gpu_list(bad), UsageError) << bad;
}

// watch --from FILE through run(): the result and the printed summary.
Outcome watch_log(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::temp_directory_path() / ("sb_watch_log_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / name).string();
  std::ofstream(path) << text;
  Args a;
  a.from = path;
  a.from_interval_ms = 100;
  a.opt = opts(10, 5, 3);
  return run(a, [](const std::string&, const std::string&, const json& props) { return json{{"watch", props}}; },
             [](const Result&) {});
}

// dcgmi dmon rows of GPU 0 with these fields, `ticks` ticks of `value(t)` each.
std::string dmon_log(const std::vector<std::string>& fields, int ticks, const std::function<std::string(int)>& value) {
  std::string out = "#Entity   ";
  for (const auto& f : fields) out += f + std::string(10 - f.size(), ' ');
  out += "\nID        \n";
  for (int t = 0; t < ticks; ++t) out += "GPU 0     " + value(t) + "\n";
  return out;
}

TEST(WatchFromLog, ADcgmiLogWithoutMemorySaysStuckCannotBeDetected) {
  // the README's dcgmi dmon -e 203,204,1002,1004: no FBUSD (252); utilization 0 for 10 s of 20
  const auto zeros = [](int t) { return t < 100 ? std::string("97        48        0.800     0.300") : std::string("0         0         0.000     0.000"); };
  const Outcome o = watch_log("dcgmi.txt", dmon_log({"GPUTL", "MCUTL", "SMACT", "TENSO"}, 200, zeros));
  ASSERT_EQ(o.result.points.size(), 1u);
  const Point& p = o.result.points[0];
  EXPECT_FALSE(p.info["summary"].contains("max_mem_used_mib")) << p.info["summary"].dump();  // absent, not 0
  EXPECT_FALSE(p.info["summary"]["series"].contains("mem_used_mib"));
  for (const auto& m : p.metrics) EXPECT_NE(m.name, "max_mem_used");
  ASSERT_NE(p.metric("stuck"), nullptr);
  EXPECT_NE(p.metric("stuck")->note.find("not detectable"), std::string::npos) << p.metric("stuck")->note;
  ASSERT_TRUE(p.info.contains("stuck_undetectable")) << p.info.dump();
  EXPECT_NE(p.info["stuck_undetectable"].get<std::string>().find("field 252, FBUSD"), std::string::npos);
  EXPECT_NE(o.summary.find("note: GPU 0: no memory-used reading in the log (add field 252, FBUSD, to dcgmi dmon -e): "
                           "stuck (utilization 0 with memory held) cannot be detected"),
            std::string::npos)
      << o.summary;
  bool in_json = false;
  for (const auto& n : o.result.meta["watch"]["notes"]) in_json |= n.get<std::string>().find("cannot be detected") != std::string::npos;
  EXPECT_TRUE(in_json) << o.result.meta.dump();
  // with FBUSD (252) the same run is stuck: the alarm fires and the maximum is reported
  const auto held = [&](int t) { return zeros(t) + "     60000"; };
  const Outcome s = watch_log("dcgmi_fbusd.txt", dmon_log({"GPUTL", "MCUTL", "SMACT", "TENSO", "FBUSD"}, 200, held));
  EXPECT_EQ(s.exit_code, kExitHang);
  EXPECT_DOUBLE_EQ(s.result.points[0].info["summary"]["max_mem_used_mib"].get<double>(), 60000);
  EXPECT_FALSE(s.result.points[0].info.contains("stuck_undetectable"));
  EXPECT_EQ(s.summary.find("cannot be detected"), std::string::npos) << s.summary;
}

TEST(WatchFromLog, TheThrottlingAdviceFollowsTheReasons) {
  // nvidia-smi at 100 ms, busy, clocks event reasons 0x8 (HW slowdown alone) or 0x88 (with HW power brake)
  const auto log = [](unsigned reasons) {
    std::string out = "timestamp, index, utilization.gpu [%], clocks_event_reasons.active\n";
    for (int i = 0; i < 100; ++i)
      out += fmt::format("2024/05/01 12:00:{:02d}.{}00, 0, 99 %, 0x{:016x}\n", i / 10, i % 10, reasons);
    return out;
  };
  auto advice = [](const Outcome& o) {
    for (const auto& f : o.result.findings)
      if (f.cause == "throttling") return f.summary;
    return std::string("no throttling finding");
  };
  const std::string alone = advice(watch_log("hw_slowdown.csv", log(0x8)));
  for (const char* cause : {"temperature too high", "external power brake", "power draw too high"})
    EXPECT_NE(alone.find(cause), std::string::npos) << cause << ": " << alone;
  const std::string brake = advice(watch_log("power_brake.csv", log(0x88)));
  EXPECT_NE(brake.find("power brake"), std::string::npos) << brake;
  EXPECT_EQ(brake.find("cooling"), std::string::npos) << brake;
  EXPECT_NE(advice(watch_log("thermal.csv", log(0x48))).find("check cooling"), std::string::npos);
}

// ---- NVML through the fake library ----
std::string write_series(const json& doc) {
  const auto dir = std::filesystem::temp_directory_path() / ("sb_fake_nvml_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "series.json";
  std::ofstream(path) << doc.dump();
  return path.string();
}

json two_gpus() {
  json rows0 = json::array(), rows1 = json::array();
  for (int i = 0; i < 5; ++i) {
    rows0.push_back({{"util", 10 * i},
                     {"mem_util", 5},
                     {"sm_clock_mhz", 1700 + i},
                     {"power_w", 300.5},
                     {"mem_used_mib", 1024 * (i + 1)},
                     {"reasons", 4},
                     {"pcie_tx_kb_s", 1000},
                     {"pcie_rx_kb_s", 2000},
                     {"temp_c", 55},
                     {"procs", json::array({json::array({4242, 512}), json::array({4243, -1})})}});
    rows1.push_back({{"util", 100}});  // a GPU that reports utilization alone
  }
  return json{{"driver", "570.86.15"},
              {"gpus",
               {{{"name", "NVIDIA H200"}, {"uuid", "GPU-aaaa"}, {"mem_total_mib", 143771}, {"sm_clock_max_mhz", 1980},
                 {"power_limit_w", 700}, {"rows", rows0}},
                {{"name", "NVIDIA H100 80GB HBM3"}, {"rows", rows1}}}}};
}

TEST(WatchNvml, ReadsEveryFieldThroughTheFakeLibrary) {
  ::setenv("FAKE_NVML_SERIES", write_series(two_gpus()).c_str(), 1);
  ::unsetenv("FAKE_NVML_FAIL");
  std::string why;
  auto s = NvmlSession::open(why);
  ASSERT_NE(s, nullptr) << why << " (is tests/fake_nvml on LD_LIBRARY_PATH?)";
  EXPECT_NE(s->library().find("fake_nvml"), std::string::npos) << s->library();
  EXPECT_EQ(s->driver_version(), "570.86.15");
  ASSERT_EQ(s->gpus().size(), 2u);
  EXPECT_EQ(s->gpus()[0].name, "NVIDIA H200");
  EXPECT_EQ(s->gpus()[0].uuid, "GPU-aaaa");
  EXPECT_DOUBLE_EQ(s->gpus()[0].sm_clock_max_mhz, 1980);
  EXPECT_DOUBLE_EQ(s->gpus()[0].power_limit_w, 700);
  EXPECT_NEAR(s->gpus()[0].mem_total_mib, 143771, 1e-6);
  for (int i = 0; i < 7; ++i) {  // 5 rows, then the last one holds
    const LiveSample ls = s->sample(0);
    const int row = std::min(i, 4);
    EXPECT_DOUBLE_EQ(*ls.s.util_pct, 10.0 * row);
    EXPECT_DOUBLE_EQ(*ls.s.mem_util_pct, 5);
    EXPECT_DOUBLE_EQ(*ls.s.sm_clock_mhz, 1700.0 + row);
    EXPECT_DOUBLE_EQ(*ls.s.sm_clock_max_mhz, 1980);
    EXPECT_DOUBLE_EQ(*ls.s.power_w, 300.5);
    EXPECT_DOUBLE_EQ(*ls.s.power_limit_w, 700);
    EXPECT_DOUBLE_EQ(*ls.s.temp_c, 55);
    EXPECT_NEAR(*ls.s.mem_used_mib, 1024.0 * (row + 1), 1e-6);
    EXPECT_NEAR(*ls.s.pcie_tx_mb_s, 1000 * 1024 / 1e6, 1e-9);
    EXPECT_NEAR(*ls.s.pcie_rx_mb_s, 2000 * 1024 / 1e6, 1e-9);
    EXPECT_EQ(*ls.s.clock_event_reasons, 4u);
    ASSERT_TRUE(ls.processes_known);
    ASSERT_EQ(ls.processes.size(), 2u);
    EXPECT_EQ(ls.processes[0].pid, 4242u);
    EXPECT_NEAR(ls.processes[0].used_mib, 512, 1e-9);
    EXPECT_DOUBLE_EQ(ls.processes[1].used_mib, -1);  // hidden by NVML
  }
  // the second GPU answers utilization alone: every other field is empty, not zero
  const LiveSample b = s->sample(1);
  EXPECT_DOUBLE_EQ(*b.s.util_pct, 100);
  EXPECT_FALSE(b.s.sm_clock_mhz.has_value());
  EXPECT_FALSE(b.s.power_w.has_value());
  EXPECT_FALSE(b.s.clock_event_reasons.has_value());
  EXPECT_EQ(b.s.gpu, 1);
}

TEST(WatchNvml, MoreProcessesThanTheFirstArrayHolds) {
  json doc = two_gpus();
  json procs = json::array();
  for (int i = 0; i < 70; ++i) procs.push_back(json::array({1000 + i, 100}));
  doc["gpus"][0]["rows"] = json::array({{{"util", 0}, {"mem_used_mib", 7000}, {"procs", procs}}});
  ::setenv("FAKE_NVML_SERIES", write_series(doc).c_str(), 1);
  ::unsetenv("FAKE_NVML_FAIL");
  std::string why;
  auto s = NvmlSession::open(why);
  ASSERT_NE(s, nullptr) << why;
  const LiveSample ls = s->sample(0);
  ASSERT_TRUE(ls.processes_known);
  ASSERT_EQ(ls.processes.size(), 70u);  // not 64 zeroed records
  EXPECT_EQ(ls.processes[0].pid, 1000u);
  EXPECT_EQ(ls.processes[69].pid, 1069u);
}

// The fake's guard (fake_nvml.cpp): the bytes process queries would have written past the
// arrays they were given since the last call.
std::size_t fake_overflow_bytes() {
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib) return std::size_t(-1);
  const auto fn = reinterpret_cast<std::size_t (*)(int)>(::dlsym(lib, "fake_nvml_overflow_bytes"));
  const std::size_t n = fn ? fn(1) : std::size_t(-1);
  ::dlclose(lib);  // NOLOAD's reference; the session's own keeps it loaded
  return n;
}

// GPU 0 with `count` processes, pid 5000 + 17 i holding 100 + i MiB, under `driver`.
json with_processes(const std::string& driver, int count) {
  json procs = json::array();
  for (int i = 0; i < count; ++i) procs.push_back(json::array({5000 + 17 * i, 100 + i}));
  json doc = two_gpus();
  doc["driver"] = driver;
  doc["gpus"][0]["rows"] = json::array({{{"util", 0}, {"mem_used_mib", 7000}, {"procs", procs}}});
  return doc;
}

TEST(WatchNvml, ProcessRecordsOfEveryDriverAreReadRightAndStayInTheirArray) {
  // 535.43-535.86's _v3 writes 32-byte records where the others write 24 (nvitop #88/#89,
  // go-nvml #75): read as 24, every pid after the first is garbage, and 60 processes in an
  // array of 64 x 24 bytes are written 384 bytes past its end.
  const std::string v1 = "nvmlDeviceGetComputeRunningProcesses", v2 = v1 + "_v2", v3 = v1 + "_v3";
  struct Case {
    const char* driver;
    std::string absent;  // FAKE_NVML_ABSENT: what the library does not export
    int count;
    std::string want;  // the query chosen; "" none
  };
  const Case cases[] = {
      {"535.54.03", "", 60, v2},                   // every version exported: _v2, one layout everywhere
      {"535.54.03", v2, 60, v3},                   // _v3 alone on a driver with the 32-byte record
      {"535.86.10", v2, 3, v3},
      {"535.104.05", v2, 60, v3},                  // 24 bytes again
      {"570.86.15", v2, 3, v3},
      {"535.98", v3, 3, v2},                       // 535.98 removed _v3
      {"535.54.03", v2 + "," + v3, 60, v1},        // 16-byte records
      {"NVIDIA fake (no number)", v2, 3, v1},      // _v3's record unknown: skipped
      {"570.86.15", v1 + "," + v2 + "," + v3, 3, ""},
  };
  ::unsetenv("FAKE_NVML_FAIL");
  for (const Case& c : cases) {
    const std::string what = std::string(c.driver) + " without [" + c.absent + "]";
    ::setenv("FAKE_NVML_SERIES", write_series(with_processes(c.driver, c.count)).c_str(), 1);
    ::setenv("FAKE_NVML_ABSENT", c.absent.c_str(), 1);
    std::string why;
    auto s = NvmlSession::open(why);
    ASSERT_NE(s, nullptr) << why;
    fake_overflow_bytes();  // from here on
    EXPECT_EQ(s->process_query(), c.want) << what;
    const LiveSample ls = s->sample(0);
    EXPECT_EQ(fake_overflow_bytes(), 0u) << what << ": written past the array";
    if (c.want.empty()) {
      EXPECT_FALSE(ls.processes_known) << what;
      continue;
    }
    ASSERT_TRUE(ls.processes_known) << what;
    ASSERT_EQ(ls.processes.size(), std::size_t(c.count)) << what;
    for (int i = 0; i < c.count; ++i) {
      EXPECT_EQ(ls.processes[std::size_t(i)].pid, unsigned(5000 + 17 * i)) << what << ", process " << i;
      EXPECT_NEAR(ls.processes[std::size_t(i)].used_mib, 100 + i, 1e-9) << what << ", process " << i;
    }
  }
  ::unsetenv("FAKE_NVML_ABSENT");
}

TEST(WatchNvml, TheV3RecordSizeFollowsTheDriverVersion) {
  using nvml_abi::process_info_v3_size;
  for (const char* v : {"535.43.02", "535.54.03", "535.86.05", "535.86.10"}) EXPECT_EQ(process_info_v3_size(v), 32u) << v;
  for (const char* v : {"530.41.03", "535.98", "535.104.05", "535.183.01", "550.54.15", "570.86.15", "1535.54.03"})
    EXPECT_EQ(process_info_v3_size(v), 24u) << v;
  for (const char* v : {"", "535", "535.", ".54", "fake", "5350000000.54.03"}) EXPECT_EQ(process_info_v3_size(v), 0u) << v;
  EXPECT_EQ(process_info_v3_size(nullptr), 0u);
  // the choice: _v2 first, _v3 with a known record, v1
  EXPECT_EQ(choose_process_query(true, true, true, "535.54.03").version, 2);
  EXPECT_EQ(choose_process_query(true, false, true, "535.54.03").record_size, 32u);
  EXPECT_EQ(choose_process_query(true, false, true, "535.104.05").record_size, 24u);
  EXPECT_EQ(choose_process_query(true, false, true, "").version, 1);
  EXPECT_EQ(choose_process_query(false, false, true, "").version, 0);
  EXPECT_EQ(choose_process_query(true, false, false, "").record_size, 16u);
}

TEST(WatchNvml, FailuresAreReasonsNotCrashes) {
  ::setenv("FAKE_NVML_SERIES", write_series(two_gpus()).c_str(), 1);
  std::string why;
  ::setenv("FAKE_NVML_FAIL", "init", 1);
  EXPECT_EQ(NvmlSession::open(why), nullptr);
  EXPECT_NE(why.find("nvmlInit_v2 failed: Driver Not Loaded (9)"), std::string::npos) << why;
  ::setenv("FAKE_NVML_FAIL", "nogpu", 1);
  why.clear();
  EXPECT_EQ(NvmlSession::open(why), nullptr);
  EXPECT_EQ(why, "NVML sees no GPU");
  ::setenv("FAKE_NVML_FAIL", "lost@3", 1);
  why.clear();
  auto s = NvmlSession::open(why);
  ASSERT_NE(s, nullptr) << why;
  EXPECT_EQ(s->sample(0).error, 0);
  EXPECT_EQ(s->sample(0).error, 0);
  const LiveSample lost = s->sample(0);
  EXPECT_EQ(lost.error, nvml_abi::kErrorGpuIsLost);
  EXPECT_TRUE(lost.lost);
  EXPECT_NE(lost.error_text.find("GPU is lost"), std::string::npos) << lost.error_text;
  EXPECT_FALSE(lost.s.util_pct.has_value());
  ::unsetenv("FAKE_NVML_FAIL");
}

}  // namespace
}  // namespace sb::watch

// A line of the job's output that says it made a step: real lines of tqdm, the Hugging Face
// Trainer (its progress bar and its log dicts), Accelerate and Lightning; and lines that do not.
TEST(WatchProgress, StepLinesOfRealTrainersAndNotOthers) {
  using sb::watch::is_progress_line;
  for (const char* yes : {
           " 12%|#2        | 60/500 [00:31<03:49,  1.92it/s]",
           " 3%|3         | 15/500 [01:02<33:20,  4.12s/it]",
           "{'loss': 1.8342, 'grad_norm': 0.912, 'learning_rate': 1.9e-05, 'epoch': 0.04}",
           "{\"loss\": 2.1, \"learning_rate\": 5e-05, \"epoch\": 0.5}",
           "{'train_runtime': 312.4, 'train_samples_per_second': 51.2, 'train_loss': 1.52, 'epoch': 3.0}",
           "Step 120/1000 | loss 2.31",
           "step: 42 loss=1.0",
           "global_step=1200 lr=3e-4",
           "Epoch 0:  40%|####      | 40/100 [00:10<00:15,  3.98it/s, v_num=0, train_loss=0.693]"}) {
    EXPECT_TRUE(is_progress_line(yes)) << yes;
  }
  for (const char* no : {"Loading checkpoint shards: done", "max_steps is given, it will override num_train_epochs",
                         "NCCL INFO Channel 00/02 :    0   1", "steps_per_epoch = ", "it/s", "warmup_steps: 100",
                         "", "Saving model checkpoint to output/checkpoint-500"}) {
    EXPECT_FALSE(is_progress_line(no)) << no;
  }
}

