// diagnose --trace on traces without GPU events (diagnose/trace/cpu_breakdown, cpu_rules): the CPU ops read
// as the causes a GPU trace names. The traces are real PyTorch ones, made by
// tests/data/traces/cpu/make_cpu_traces.py (its README: torch's version, what each injects, the first finding
// expected): a healthy fp32 MLP, an .item() per step, a 64 MiB torch.zeros per step, a Python row loop in
// a custom layer, a DataLoader with slow samples and no ProfilerStep#N, tiny matmuls, bf16 under autocast;
// and HTA's real CPU-only trace of a 300-rank gloo job from the shared data. Each test asserts the first
// finding's cause and a piece of its evidence. The CPU reading a trace decides whether bf16 is native: the
// tests pass its ISA in the meta (none, then avx512_bf16), so they hold on any machine.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "diagnose/trace/cpu_breakdown.hpp"
#include "diagnose/trace/host_attribution.hpp"
#include "diagnose/trace/trace_analysis.hpp"
#include "diagnose/trace/trace_diagnose.hpp"
#include "readers/kineto.hpp"
#include "shared_data.hpp"  // sb::test::shared_data, SB_NEED_SHARED_DATA

#ifndef SB_TEST_DATA
#error "SB_TEST_DATA is set by tests/meson.build"
#endif

namespace {

using json = nlohmann::ordered_json;

std::string cpu_trace(const std::string& name) {
  return std::string(SB_TEST_DATA) + "/traces/cpu/" + name + ".pt.trace.json.gz";
}

// diagnose --trace as the command runs it, on a CPU with these ISA extensions (none: no native bf16).
sb::Result diagnose(const std::string& path, std::vector<std::string> isa = {"avx2"}) {
  return sb::diagnose::diagnose_trace(path, json{{"device", {{"id", "cpu"}}}, {"cpu", {{"isa", isa}}}});
}
std::vector<std::string> causes(const sb::Result& r) {
  std::vector<std::string> v;
  for (const auto& f : r.findings) v.push_back(f.cause);
  return v;
}
std::string evidence(const sb::Finding& f) { return f.evidence.value("evidence", std::string()); }
const sb::Point& point(const sb::Result& r, const std::string& check) {
  for (const auto& p : r.points)
    if (p.params.value("check", std::string()) == check) return p;
  throw std::runtime_error("no point " + check);
}
double metric(const sb::Point& p, const std::string& name) {
  for (const auto& m : p.metrics)
    if (m.name == name) return m.value;
  throw std::runtime_error("no metric " + name);
}
bool has(const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); }

constexpr const char* kCpuOnly = "no GPU events: CPU-only";

TEST(TraceCpu, HealthyFp32IsCpuOnlyAndFp32IsRightWithoutNativeBf16) {
  const sb::Result r = diagnose(cpu_trace("cpu_healthy_fp32"));
  ASSERT_FALSE(r.findings.empty());
  EXPECT_EQ(r.findings[0].cause, kCpuOnly) << ::testing::PrintToString(causes(r));
  EXPECT_EQ(r.findings.size(), 1u) << ::testing::PrintToString(causes(r));
  const sb::Point& p = point(r, "cpu");
  EXPECT_GT(metric(p, "compute_ops_pct"), 70);  // the GEMMs are the step
  EXPECT_GT(metric(p, "fp32_gemm_pct"), 99);
  EXPECT_NE(p.info.value("note", std::string()).find("fp32 is right here"), std::string::npos);
  EXPECT_EQ(point(r, "utilization").status, sb::Status::skipped);
}

TEST(TraceCpu, HealthyFp32OnACpuWithNativeBf16NamesTheDtype) {
  const sb::Result r = diagnose(cpu_trace("cpu_healthy_fp32"), {"avx2", "avx512f", "avx512_bf16"});
  ASSERT_FALSE(r.findings.empty());
  EXPECT_EQ(r.findings[0].cause, "fp32 where bf16 would do") << ::testing::PrintToString(causes(r));
  EXPECT_NE(evidence(r.findings[0]).find("runs in fp32 (the ops' Input type)"), std::string::npos);
  EXPECT_GT(*r.findings[0].speedup, 1.3);
  EXPECT_TRUE(has(causes(r), kCpuOnly));
}

TEST(TraceCpu, ItemEveryStepIsASync) {
  const sb::Result r = diagnose(cpu_trace("cpu_item_sync"));
  ASSERT_FALSE(r.findings.empty());
  EXPECT_EQ(r.findings[0].cause, "a sync in the step (.item() every step)") << ::testing::PrintToString(causes(r));
  const std::string ev = evidence(r.findings[0]);
  EXPECT_NE(ev.find("reads of a tensor into Python (aten::item) in 4 of the 4 steps"), std::string::npos) << ev;
  EXPECT_NE(ev.find("make_cpu_traces.py"), std::string::npos) << ev;  // the user's line, with_stack=True
  EXPECT_EQ(metric(point(r, "cpu"), "sync_calls_per_step"), 2);  // loss and accuracy
  // the healthy baseline has none
  EXPECT_FALSE(has(causes(diagnose(cpu_trace("cpu_healthy_fp32"))), r.findings[0].cause));
}

TEST(TraceCpu, FreshZerosEveryStepIsAllocatorChurn) {
  const sb::Result r = diagnose(cpu_trace("cpu_alloc_churn"), {"avx512_bf16"});  // ahead of the dtype's gain too
  ASSERT_FALSE(r.findings.empty());
  EXPECT_EQ(r.findings[0].cause, "allocator churn (tensors allocated and filled in every step)")
      << ::testing::PrintToString(causes(r));
  const std::string ev = evidence(r.findings[0]);
  EXPECT_NE(ev.find("most in aten::zeros (in make_cpu_traces.py"), std::string::npos) << ev;
  EXPECT_GT(metric(point(r, "cpu"), "allocation_pct"), 20);
  EXPECT_TRUE(r.findings[0].evidence.contains("cpu_breakdown"));
}

TEST(TraceCpu, PythonRowLoopIsASlowCustomLayerNamedByItsModule) {
  const sb::Result r = diagnose(cpu_trace("cpu_slow_layer"), {"avx512_bf16"});
  ASSERT_FALSE(r.findings.empty());
  EXPECT_EQ(r.findings[0].cause, "a slow custom layer (a Python loop of small ops)")
      << ::testing::PrintToString(causes(r));
  EXPECT_NE(evidence(r.findings[0]).find("nn.Module: RowNorm_0"), std::string::npos) << evidence(r.findings[0]);
  EXPECT_NE(r.findings[0].evidence.value("config_line", std::string()).find("RowNorm_0"), std::string::npos);
  // its backward's zeroed tensors (select's backward, one per row) are the layer's, not allocator churn
  EXPECT_FALSE(has(causes(r), "allocator churn (tensors allocated and filled in every step)"))
      << ::testing::PrintToString(causes(r));
}

TEST(TraceCpu, LoaderWithoutProfilerStepIsFoundFromItsNextCalls) {
  const sb::Result r = diagnose(cpu_trace("cpu_slow_loader_no_steps"));
  ASSERT_FALSE(r.findings.empty());
  EXPECT_EQ(r.findings[0].cause, "a slow host dataloader") << ::testing::PrintToString(causes(r));
  EXPECT_NE(evidence(r.findings[0]).find("between its calls (no ProfilerStep#N)"), std::string::npos)
      << evidence(r.findings[0]);
  EXPECT_EQ(point(r, "loader").info.value("iterations", std::string()), "enumerate(DataLoader)#...__next__");
  EXPECT_GT(metric(point(r, "cpu"), "loader_pct"), 50);
}

TEST(TraceCpu, TinyMatmulsAreFrameworkOverheadBound) {
  const sb::Result r = diagnose(cpu_trace("cpu_tiny_matmuls"), {"avx512_bf16"});
  ASSERT_FALSE(r.findings.empty());
  EXPECT_EQ(r.findings[0].cause, "a batch too small (framework overhead-bound on CPU)")
      << ::testing::PrintToString(causes(r));
  EXPECT_NE(evidence(r.findings[0]).find("the ops are tiny"), std::string::npos) << evidence(r.findings[0]);
  EXPECT_LT(metric(point(r, "cpu"), "arithmetic_per_op_us"), 50);
  EXPECT_LT(metric(point(r, "cpu"), "compute_ops_pct"), 40);
  // the healthy MLP is not
  EXPECT_FALSE(has(causes(diagnose(cpu_trace("cpu_healthy_fp32"))), r.findings[0].cause));
}

TEST(TraceCpu, Bf16WithoutNativeBf16IsNamedAndNotOnACpuWithIt) {
  const sb::Result r = diagnose(cpu_trace("cpu_bf16_autocast"));
  ASSERT_FALSE(r.findings.empty());
  EXPECT_EQ(r.findings[0].cause, "bf16 on a CPU without native bf16 (slower than fp32)")
      << ::testing::PrintToString(causes(r));
  EXPECT_NE(evidence(r.findings[0]).find("runs in bf16 or fp16"), std::string::npos);
  const sb::Result amx = diagnose(cpu_trace("cpu_bf16_autocast"), {"amx_bf16", "avx512_bf16"});
  ASSERT_FALSE(amx.findings.empty());
  EXPECT_EQ(amx.findings[0].cause, kCpuOnly) << ::testing::PrintToString(causes(amx));
  EXPECT_LT(metric(point(amx, "cpu"), "fp32_gemm_pct"), 1);
}

// HTA's trace of rank 34 of a 300-rank gloo job: one ProfilerStep, 4 aten::empty and 10 gloo:all_reduce
// calls on two threads covering 85% of the step (../shared/traces/README.md).
TEST(TraceCpu, RealGlooJobIsCpuOnlyThenCommunication) {
  const std::string path =
      sb::test::shared_data("traces") + "/cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz";
  SB_NEED_SHARED_DATA(path);
  const sb::Result r = diagnose(path);
  ASSERT_GE(r.findings.size(), 2u);
  EXPECT_EQ(r.findings[0].cause, kCpuOnly) << ::testing::PrintToString(causes(r));
  EXPECT_NE(evidence(r.findings[0]).find("rank 34 of 300 (gloo)"), std::string::npos) << evidence(r.findings[0]);
  EXPECT_EQ(r.findings[1].cause, "waiting on collectives");
  EXPECT_NE(evidence(r.findings[1]).find("gloo:all_reduce"), std::string::npos) << evidence(r.findings[1]);
  EXPECT_NEAR(metric(point(r, "cpu"), "collectives_pct"), 85, 1.5);
}

// The reader's part: Input type's first tensor element type and the autograd sequence number.
TEST(TraceCpu, ReaderKeepsInputTypeAndSequenceNumber) {
  const json doc{
      {"traceEvents",
       json::array({json{{"ph", "X"}, {"cat", "cpu_op"}, {"name", "aten::addmm"}, {"pid", 1}, {"tid", 1}, {"ts", 10},
                         {"dur", 5},
                         {"args", {{"Input type", {"c10::BFloat16", "c10::BFloat16", "", "Scalar"}},
                                   {"Sequence number", 7}}}},
                    json{{"ph", "X"}, {"cat", "cpu_op"}, {"name", "aten::add"}, {"pid", 1}, {"tid", 1}, {"ts", 20},
                         {"dur", 5}, {"args", {{"Input type", {"", "Scalar", "float"}}}}},
                    json{{"ph", "X"}, {"cat", "cpu_op"}, {"name", "aten::empty"}, {"pid", 1}, {"tid", 1}, {"ts", 30},
                         {"dur", 1}, {"args", {{"Input type", "float"}}}}})}};
  const sb::readers::Trace t = sb::readers::parse_kineto(doc.dump());
  ASSERT_EQ(t.events.size(), 3u);
  EXPECT_EQ(t.events[0].input_type, sb::readers::ElemType::bf16);
  EXPECT_EQ(t.events[0].sequence, 7);
  EXPECT_EQ(t.events[1].input_type, sb::readers::ElemType::f32);
  EXPECT_EQ(t.events[1].sequence, -1);
  EXPECT_EQ(t.events[2].input_type, sb::readers::ElemType::none);  // not an array: none
  EXPECT_EQ(sb::readers::elem_type("long int"), sb::readers::ElemType::integer);
  EXPECT_EQ(sb::readers::elem_type("c10::Half"), sb::readers::ElemType::f16);
}

// A GPU trace is not read as a CPU one.
TEST(TraceCpu, BreakdownDoesNotApplyWithGpuEvents) {
  const json doc{{"traceEvents", json::array({json{{"ph", "X"}, {"cat", "cpu_op"}, {"name", "aten::mm"}, {"pid", 1},
                                                   {"tid", 1}, {"ts", 0}, {"dur", 10}},
                                              json{{"ph", "X"}, {"cat", "kernel"}, {"name", "sgemm"}, {"pid", 0},
                                                   {"tid", 7}, {"ts", 5}, {"dur", 10},
                                                   {"args", {{"device", 0}, {"stream", 7}}}}})}};
  const sb::readers::Trace t = sb::readers::parse_kineto(doc.dump());
  EXPECT_FALSE(sb::readers::cpu_breakdown(t, {}).applies);
}

}  // namespace
