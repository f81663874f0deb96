// The sim:<gpu> device: name resolution, the roofline model as pure functions
// (exact), and one real enqueue (a timed wait that uses no CPU). Only lower
// bounds on time: this machine is noisy.
#include <sys/resource.h>  // getrusage: process CPU time

#include <algorithm>  // std::all_of
#include <chrono>     // std::chrono
#include <cmath>      // std::fabs
#include <string>     // std::string
#include <vector>     // std::vector

#include <gtest/gtest.h>  // TEST, EXPECT_*

#include "harness/device.hpp"           // parse_device_spec, Device
#include "harness/errors.hpp"           // UsageError, OutOfMemory, UnsupportedError
#include "harness/expected.hpp"         // load_expected_files, ExpectedFile
#include "harness/gemm_check.hpp"       // gemm_check_shape, gpu_gemm_shape_problem, check_gemm
#include "kernels/backends.hpp"         // open_device
#include "kernels/sim/sim_backend.hpp"  // make_sim_backend
#include "kernels/sim/sim_model.hpp"    // SimModel, sim_gemm_seconds, sim_h2d_seconds

namespace sb {
namespace {

using json = nlohmann::ordered_json;
using namespace std::chrono_literals;

std::unique_ptr<Device> open(const std::string& spec) { return open_device(parse_device_spec(spec)); }

ExpectedFile expected(const std::string& id) {
  for (auto& f : load_expected_files())
    if (f.id() == id) return f;
  ADD_FAILURE() << "no expected file " << id << " (STALLBENCH_DATA_DIR or the source tree)";
  return {};
}

// A minimal gpu expected file, for inputs the real files do not exercise.
ExpectedFile synthetic(json peaks, json figures = json::array()) {
  return ExpectedFile{"synthetic.json",
                      json{{"schema_version", 1},
                           {"kind", "expected"},
                           {"hardware", {{"id", "synth"}, {"name", "Synthetic GPU"}, {"class", "gpu"}}},
                           {"peaks", std::move(peaks)},
                           {"figures", std::move(figures)}}};
}

std::string usage_error(const std::string& spec) {
  try {
    (void)open(spec);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << spec << " opened";
  return "";
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

TEST(SimBackend, ListsOneSimulatedDevicePerGpuFile) {
  const Backend sim = make_sim_backend();
  EXPECT_EQ(sim.unavailable(), "");
  std::vector<std::string> ids;
  for (const auto& d : sim.list()) {
    ids.push_back(d.id);
    EXPECT_EQ(d.kind, DeviceKind::sim);
    EXPECT_TRUE(d.simulated);
    EXPECT_EQ(d.name.rfind("simulated ", 0), 0u) << d.name;
  }
  for (const char* id : {"sim:h100-sxm", "sim:h200-sxm", "sim:a100-sxm-80gb"})
    EXPECT_NE(std::find(ids.begin(), ids.end(), id), ids.end()) << id;
  for (const auto& id : ids) EXPECT_EQ(id.find("cpu"), std::string::npos) << "a cpu file listed: " << id;
}

TEST(SimBackend, OpensByIdOrUniquePrefix) {
  for (const char* spec : {"sim:h100", "sim:h100-sxm"}) {
    auto dev = open(spec);
    EXPECT_EQ(dev->info().id, "sim:h100-sxm") << spec;
    EXPECT_EQ(dev->info().kind, DeviceKind::sim);
    EXPECT_TRUE(dev->info().simulated);
    EXPECT_EQ(dev->info().name, "simulated NVIDIA H100 SXM 80GB");
  }
}

TEST(SimBackend, UnknownOrAmbiguousNamesListTheValidOnes) {
  const std::string unknown = usage_error("sim:nope");
  const std::string ambiguous = usage_error("sim:h");  // h100-sxm and h200-sxm
  const std::string cpu_file = usage_error("sim:cpu-spr-amx-2c");  // only gpu files are simulated
  for (const std::string& msg : {unknown, ambiguous, cpu_file})
    for (const char* name : {"sim:h100-sxm", "sim:h200-sxm", "sim:a100-sxm-80gb"})
      EXPECT_NE(msg.find(name), std::string::npos) << name << " not in: " << msg;
  EXPECT_NE(ambiguous.find("ambiguous"), std::string::npos) << ambiguous;
}

TEST(SimModel, PeakIsTheBestAchievableFigureElseTheDatasheet) {
  const ExpectedFile f = expected("h100-sxm");
  const SimModel m = make_sim_model(f);
  double best = 0;
  for (const auto& fig : f.doc["figures"])
    if (fig["scenario"] == "precision" && fig["metric"] == "tflops" && fig["where"].value("dtype", "") == "bf16")
      best = std::max(best, fig["value"].get<double>());
  ASSERT_GT(best, 0) << "h100-sxm.json lost its bf16 figure";
  EXPECT_EQ(m.peak_tflops.at(DType::bf16).value, best);
  EXPECT_NE(m.peak_tflops.at(DType::bf16).kind, "datasheet");
  // No fp32 figure in the file: the datasheet peak stands in, and says so.
  EXPECT_EQ(m.peak_tflops.at(DType::fp32).value, f.doc["peaks"]["tflops"]["fp32"]["value"].get<double>());
  EXPECT_EQ(m.peak_tflops.at(DType::fp32).kind, "datasheet");

  // The same inputs, with their sources, are in the device's props.
  auto dev = open("sim:h100");
  const json& p = dev->info().props;
  EXPECT_EQ(p["peak_tflops"]["bf16"]["value"].get<double>(), best);
  EXPECT_FALSE(p["peak_tflops"]["bf16"]["source"].get<std::string>().empty());
  EXPECT_EQ(p["launch_overhead"]["value"], 5);
  EXPECT_EQ(p["launch_overhead"]["unit"], "us");
  EXPECT_EQ(p["launch_overhead"]["kind"], "assumption");
  EXPECT_EQ(p["memory_bandwidth"]["value"].get<double>(), f.doc["peaks"]["memory_bandwidth"]["value"].get<double>());
  EXPECT_EQ(p["h2d_bandwidth"]["pageable"]["kind"], "assumption");  // the file has no pageable figure
}

// bf16 and fp16 share the tensor cores' peak: with a measured bf16 figure and only fp16's datasheet
// peak, fp16 takes bf16's fraction of its peak (it was rated at the full peak: 1.24x bf16 on sim:h200).
TEST(SimModel, Fp16TakesBf16sAchievableFractionOfTheSamePeak) {
  for (const char* id : {"h100-sxm", "h200-sxm"}) {
    const ExpectedFile f = expected(id);
    const SimModel m = make_sim_model(f);
    const SimInput& bf = m.peak_tflops.at(DType::bf16);
    const SimInput& fp = m.peak_tflops.at(DType::fp16);
    ASSERT_NE(bf.kind, "datasheet") << id;
    const double bf_peak = f.doc["peaks"]["tflops"]["bf16"]["value"].get<double>();
    const double fp_peak = f.doc["peaks"]["tflops"]["fp16"]["value"].get<double>();
    EXPECT_EQ(fp.kind, "assumption") << id;
    EXPECT_NEAR(fp.value, fp_peak * bf.value / bf_peak, 1e-9) << id;
    EXPECT_NEAR(fp.value / bf.value, 1.0, 1e-9) << id << ": the same peak, the same rate";
    EXPECT_NE(fp.source.find("same tensor cores"), std::string::npos) << fp.source;
  }
  // a file with an fp16 figure of its own keeps it
  ExpectedFile f = expected("h200-sxm");
  f.doc["figures"].push_back(json{{"scenario", "precision"}, {"metric", "tflops"}, {"where", {{"dtype", "fp16"}}},
                                  {"value", 700.0}, {"unit", "TFLOP/s"}, {"direction", "higher"},
                                  {"kind", "measured"}, {"source", "test"}});
  const SimModel m = make_sim_model(f);
  EXPECT_EQ(m.peak_tflops.at(DType::fp16).value, 700.0);
  EXPECT_EQ(m.peak_tflops.at(DType::fp16).kind, "measured");
}

TEST(SimModel, GemmTimeIsTheRooflinePlusLaunchOverhead) {
  const SimModel m = make_sim_model(expected("h100-sxm"));
  const double peak = m.peak_tflops.at(DType::bf16).value;
  const double bw = m.memory_bandwidth_gbs->value;

  // 8192^3 bf16 is compute-bound: 2*8192^3 / peak + 5 us.
  const GemmShape big{8192, 8192, 8192};
  const double want = 2.0 * 8192.0 * 8192.0 * 8192.0 / (peak * 1e12) + 5e-6;
  const double got = sim_gemm_seconds(m, big, DType::bf16);
  EXPECT_NEAR(got, want, want * 1e-9);
  EXPECT_TRUE(sim_gemm_time(m, big, DType::bf16).compute_bound());

  // K = 1 is memory-bound: (M*K + N*K)*2 + M*N*2 bytes (bf16 operands, bf16 C) / bandwidth + 5 us.
  const GemmShape thin{8192, 8192, 1};
  const double bytes = (8192.0 + 8192.0) * 2 + 8192.0 * 8192.0 * 2;
  const double want_thin = bytes / (bw * 1e9) + 5e-6;
  EXPECT_NEAR(sim_gemm_seconds(m, thin, DType::bf16), want_thin, want_thin * 1e-9);
  EXPECT_FALSE(sim_gemm_time(m, thin, DType::bf16).compute_bound());

  // fp32 C is 4 bytes, fp32 operands 4 bytes.
  const SimGemmTime t32 = sim_gemm_time(m, {64, 32, 16}, DType::fp32);
  EXPECT_EQ(t32.bytes, (64.0 * 16 + 32.0 * 16) * 4 + 64.0 * 32 * 4);
  // fp8 operands are 1 byte, C is bf16.
  const SimGemmTime t8 = sim_gemm_time(m, {64, 32, 16}, DType::fp8_e4m3);
  EXPECT_EQ(t8.bytes, (64.0 * 16 + 32.0 * 16) * 1 + 64.0 * 32 * 2);
}

TEST(SimModel, H2dCopyTimeIsBytesOverTheFilesBandwidth) {
  const std::size_t gib = std::size_t(1) << 30;
  // h100: a pinned figure (52 GB/s), no pageable one: half the pinned rate, marked assumed.
  const SimModel h100 = make_sim_model(expected("h100-sxm"));
  EXPECT_NE(h100.h2d_pinned_gbs.kind, "assumption");
  const double pinned = h100.h2d_pinned_gbs.value;
  EXPECT_NEAR(sim_h2d_seconds(h100, gib, MemKind::host_pinned), double(gib) / (pinned * 1e9), 1e-15);
  EXPECT_EQ(h100.h2d_pageable_gbs.kind, "assumption");
  EXPECT_EQ(h100.h2d_pageable_gbs.value, pinned / 2);
  EXPECT_NEAR(sim_h2d_seconds(h100, gib, MemKind::host_pageable), double(gib) / (pinned / 2 * 1e9), 1e-15);

  // a100: both figures published.
  const SimModel a100 = make_sim_model(expected("a100-sxm-80gb"));
  EXPECT_NE(a100.h2d_pageable_gbs.kind, "assumption");
  EXPECT_NEAR(sim_h2d_seconds(a100, gib, MemKind::host_pageable), double(gib) / (a100.h2d_pageable_gbs.value * 1e9),
              1e-15);

  // Neither: 25 GB/s pinned and 12.5 GB/s pageable, both assumptions.
  const SimModel none = make_sim_model(synthetic({{"memory_bandwidth", {{"value", 1000}}}}));
  EXPECT_EQ(none.h2d_pinned_gbs.value, 25.0);
  EXPECT_EQ(none.h2d_pinned_gbs.kind, "assumption");
  EXPECT_EQ(none.h2d_pageable_gbs.value, 12.5);
  EXPECT_EQ(none.h2d_pageable_gbs.kind, "assumption");
}

TEST(SimDevice, DtypesWithNoFigureAreUnsupportedWithAReason) {
  // A100 has neither an fp8 figure nor an fp8 datasheet peak.
  auto a100 = open("sim:a100");
  const auto why = a100->gemm_unsupported(DType::fp8_e4m3);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("fp8_e4m3"), std::string::npos) << *why;
  EXPECT_THROW(a100->make_gemm({64, 64, 64}, DType::fp8_e4m3, 1), UnsupportedError);
  EXPECT_FALSE(a100->gemm_unsupported(DType::bf16).has_value());
  EXPECT_TRUE(a100->info().props["unsupported"].contains("fp8_e4m3"));

  const SimModel only_bf16 = make_sim_model(
      synthetic({{"tflops", {{"bf16", {{"value", 100}}}}}, {"memory_bandwidth", {{"value", 1000}}}}));
  for (DType t : {DType::fp32, DType::tf32, DType::fp16, DType::fp8_e4m3}) {
    const auto w = sim_gemm_unsupported(only_bf16, t);
    ASSERT_TRUE(w.has_value()) << to_string(t);
    EXPECT_NE(w->find(std::string(to_string(t))), std::string::npos) << *w;
    EXPECT_NE(w->find("synthetic.json"), std::string::npos) << *w;
    EXPECT_THROW((void)sim_gemm_seconds(only_bf16, {8, 8, 8}, t), UnsupportedError);
  }
  EXPECT_FALSE(sim_gemm_unsupported(only_bf16, DType::bf16).has_value());
}

TEST(SimDevice, DeviceMemoryIsCappedAtTheModelledCapacity) {
  auto dev = open("sim:h100");  // 80 GB
  EXPECT_THROW((void)dev->allocate(std::size_t(81e9), MemKind::device), OutOfMemory);
  Buffer small = dev->allocate(1 << 20, MemKind::device);  // real host memory, writable
  ASSERT_NE(small.data(), nullptr);
  static_cast<char*>(small.data())[(1 << 20) - 1] = 1;

  // GEMM operands count against the capacity without being allocated:
  // 3 * 90000^2 bf16 values are 48.6 GB, so a second such GEMM does not fit.
  const GemmShape huge{90000, 90000, 90000};
  auto first = dev->make_gemm(huge, DType::bf16, 1);
  EXPECT_THROW((void)dev->make_gemm(huge, DType::bf16, 1), OutOfMemory);
  first.reset();
  EXPECT_NO_THROW((void)dev->make_gemm(huge, DType::bf16, 1));
}

TEST(SimDevice, GemmOpComputesNothingAndSaysSo) {
  auto dev = open("sim:h100");
  auto op = dev->make_gemm({64, 48, 32}, DType::bf16, 1);
  EXPECT_FALSE(op->computes());
  EXPECT_EQ(op->c_dtype(), DType::bf16);
  EXPECT_EQ(op->impl().rfind("simulated roofline: memory-bound, ", 0), 0u) << op->impl();
  std::vector<float> c(64 * 48, 7.0f);
  op->upload(std::vector<float>(64 * 32), std::vector<float>(48 * 32));
  op->download_c(c);
  EXPECT_TRUE(std::all_of(c.begin(), c.end(), [](float x) { return x == 0.0f; }));
}

TEST(SimDevice, AnEnqueuedOpTakesItsModelledTimeWithoutCpu) {
  auto dev = open("sim:h100");
  const SimModel m = make_sim_model(expected("h100-sxm"));
  // About 20 ms of bf16 work on the modelled H100.
  const GemmShape shape{20000, 20000, 20000};
  const double modelled_ms = sim_gemm_seconds(m, shape, DType::bf16) * 1e3;
  ASSERT_GT(modelled_ms, 10.0);
  auto op = dev->make_gemm(shape, DType::bf16, 1);
  auto probe = dev->utilization_probe();
  ASSERT_NE(probe, nullptr);
  dev->synchronize(10s);  // setup work out of the measured window

  const double cpu0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  auto start = dev->record();
  op->enqueue();
  auto stop = dev->record();
  dev->wait_event(stop, 10s);
  dev->synchronize(10s);
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu_s = cpu_seconds() - cpu0;

  EXPECT_GE(dev->elapsed_ms(start, stop), modelled_ms - 1e-6);
  EXPECT_GE(wall_s * 1e3, modelled_ms - 1e-3);
  // A timed wait, not a spin: generous, since the test process does a little work.
  EXPECT_LT(cpu_s, 0.5 * wall_s) << "cpu " << cpu_s << " s over " << wall_s << " s";
  const UtilSample s = probe->sample();
  EXPECT_GT(s.util, 0.0);
  EXPECT_LE(s.util, 1.0);
  EXPECT_EQ(probe->source(), "simulated: modelled busy time of the stream");
}

// A fused attention forward over a 1M-token sequence (8 heads of 128): seconds of modelled time.
AttnShape million_token_forward() {
  AttnShape s;
  s.batch = 1, s.heads = 8, s.seq = 1'000'000, s.head_dim = 128, s.backward = false;
  return s;
}

// Modelled time is not wall time: a fused attention forward modelled at seconds (a 1M-token sequence) is
// waited out for 100 ms only; its events still measure the modelled time, and the next op starts after it
// on the modelled clock.
TEST(SimDevice, ALongModelledOpIsNotWaitedOutInRealTime) {
  auto dev = open("sim:h100");
  const AttnShape s = million_token_forward();
  auto op = dev->make_attention(s, AttnImpl::flash, DType::bf16, 1);
  dev->synchronize(10s);
  const auto t0 = std::chrono::steady_clock::now();
  auto a = dev->record();
  op->forward();
  auto b = dev->record();
  op->forward();
  auto c = dev->record();
  dev->wait_event(c, 60s);  // 10.4 s modelled: a 10 s deadline would be a hang (the test below)
  dev->synchronize(60s);
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double modelled_s = 4.0 * 8 * 1e12 * 128 / (make_sim_model(expected("h100-sxm")).peak_tflops.at(DType::bf16).value * 1e12);
  ASSERT_GT(modelled_s, 2.0);
  EXPECT_GE(dev->elapsed_ms(a, b), 1e3 * modelled_s * 0.99);
  EXPECT_NEAR(dev->elapsed_ms(b, c), dev->elapsed_ms(a, b), 1e-3 * dev->elapsed_ms(a, b));
  EXPECT_LT(wall_s, 2.0) << "two modelled forwards of " << modelled_s << " s each took " << wall_s << " s of wall time";
  EXPECT_GE(wall_s, 0.19);  // each waited its 100 ms
}

// The deadline of a host wait is judged in modelled time: a forward modelled at seconds outlasts a 2 s
// deadline on the device, so the wait is a hang naming the operation, though it ends in real time at once.
TEST(SimDevice, AWaitIsAHangWhenTheModelledOpOutlastsItsDeadline) {
  auto dev = open("sim:h100");
  const AttnShape s = million_token_forward();
  auto op = dev->make_attention(s, AttnImpl::flash, DType::bf16, 1);
  dev->synchronize(10s);
  const auto t0 = std::chrono::steady_clock::now();
  op->forward();
  auto e = dev->record();
  try {
    dev->wait_event(e, 2s);
    ADD_FAILURE() << "a 5 s modelled forward ended within a 2 s deadline";
  } catch (const HangError& err) {
    EXPECT_NE(std::string(err.what()).find("no progress within 2.0 s of modelled time"), std::string::npos)
        << err.what();
    EXPECT_NE(std::string(err.what()).find("attention"), std::string::npos) << err.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.5);
  // (once a fast-forward ended, the host's modelled clock is past it: a second wait on the same forward
  // ends at once, where a GPU would still be on it; fast-forwarding cannot keep that)
  dev->synchronize(60s);
  // a wait begun after the fast-forward ended sees the modelled clock past it: a short op fits 2 s
  op->forward();
  EXPECT_THROW(dev->synchronize(2s), HangError);
  AttnShape short_seq = s;
  short_seq.seq = 4096;
  auto small = dev->make_attention(short_seq, AttnImpl::flash, DType::bf16, 1);
  small->forward();
  EXPECT_NO_THROW(dev->synchronize(2s));
}

// Short ops (a 5 us launch each) are not waited out one by one on the stream
// thread, but they are busy time in the model: the probe counts them.
TEST(SimDevice, ShortOpsCountAsBusyTime) {
  auto dev = open("sim:h100");
  const SimModel m = make_sim_model(expected("h100-sxm"));
  const GemmShape shape{64, 64, 64};
  const double each_s = sim_gemm_seconds(m, shape, DType::bf16);
  ASSERT_LT(each_s, 50e-6);  // under the stream's 100 us wait threshold
  auto op = dev->make_gemm(shape, DType::bf16, 1);
  dev->synchronize(10s);
  auto probe = dev->utilization_probe();
  const auto t0 = std::chrono::steady_clock::now();
  const int n = 2000;
  for (int i = 0; i < n; ++i) op->enqueue();
  dev->synchronize(10s);
  const UtilSample s = probe->sample();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double busy = s.util * wall, modelled = n * each_s;
  EXPECT_GT(busy, 0.8 * modelled) << "busy " << busy << " s, modelled " << modelled << " s";
  EXPECT_LT(busy, 1.2 * modelled) << "busy " << busy << " s, modelled " << modelled << " s";
}

TEST(SimDevice, CopiesNeedAHostSourceAndADeviceDestination) {
  auto dev = open("sim:h100");
  Buffer host = dev->allocate(4096, MemKind::host_pinned);
  Buffer pageable = dev->allocate(4096, MemKind::host_pageable);
  Buffer device = dev->allocate(4096, MemKind::device);
  EXPECT_NO_THROW(dev->copy_h2d(device, host, 4096));
  EXPECT_NO_THROW(dev->copy_h2d(device, pageable, 4096));  // returns once the stream ran it
  EXPECT_THROW(dev->copy_h2d(host, device, 4096), Error);
  EXPECT_THROW(dev->copy_h2d(device, host, 8192), Error);
  dev->synchronize(10s);
}

}  // namespace
}  // namespace sb

namespace sb {
namespace {

// The pre-timing check shape of every dtype is one a GPU accepts; fp8's old
// 61x47x256 is not (cuBLASLt's N and K multiples of 16), and the sim device
// refuses it as cuBLASLt would, with the rule named.
TEST(SimDevice, GemmCheckShapeIsLegalForEveryDtype) {
  auto dev = open("sim:h100");
  for (DType t : all_dtypes()) {
    const GemmShape s = gemm_check_shape(t);
    EXPECT_FALSE(gpu_gemm_shape_problem(t, s).has_value()) << to_string(t);
    if (dev->gemm_unsupported(t)) continue;
    EXPECT_NO_THROW((void)check_gemm(*dev, t, s, 1, 10s)) << to_string(t);
  }
  EXPECT_TRUE(gpu_gemm_shape_problem(DType::fp8_e4m3, {61, 47, 256}).has_value());
  EXPECT_TRUE(gpu_gemm_shape_problem(DType::fp8_e4m3, {64, 64, 40}).has_value());  // K
  EXPECT_FALSE(gpu_gemm_shape_problem(DType::bf16, {61, 47, 256}).has_value());
  try {
    (void)dev->make_gemm({61, 47, 256}, DType::fp8_e4m3, 1);
    ADD_FAILURE() << "sim:h100 accepted an fp8 GEMM with N = 47";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sb
