// diagnose --trace's host attribution (diagnose/trace/host_attribution, host_rules): what the host was
// doing while the GPU waited, iterations recovered without ProfilerStep#N, and every cause named as itself,
// ranked by its estimated gain. Each trace is made here, event by event, as PyTorch's profiler writes one
// (a launch call and its kernel paired by correlation id; cpu_op, user_annotation and python_function
// ranges on the host thread): a starved loader without ProfilerStep#N, a .item() per step, hipFree in
// every step (the caching allocator off), a launch-bound batch, and two causes whose order is their size.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "diagnose/trace/host_attribution.hpp"
#include "diagnose/trace/trace_analysis.hpp"
#include "diagnose/trace/trace_diagnose.hpp"
#include "readers/kineto.hpp"

namespace {

using json = nlohmann::ordered_json;

// A Kineto trace built in order: host ranges on thread 1 of process 1, kernels on device 0's stream 7.
struct Fixture {
  json events = json::array();
  std::int64_t corr = 1;
  double gpu_free = 0;  // when stream 7 has run everything queued so far

  void x(const std::string& cat, const std::string& name, double ts, double dur, json args = json::object()) {
    events.push_back(json{{"ph", "X"}, {"cat", cat},   {"name", name}, {"pid", 1},
                          {"tid", 1},  {"ts", ts},     {"dur", dur},   {"args", args}});
  }
  void gpu(const std::string& cat, const std::string& name, double ts, double dur, std::int64_t c) {
    events.push_back(json{{"ph", "X"}, {"cat", cat}, {"name", name}, {"pid", 0}, {"tid", 7}, {"ts", ts}, {"dur", dur},
                          {"args", {{"device", 0}, {"stream", 7}, {"correlation", c}}}});
  }
  // A launch call at `ts` taking `call` µs; its kernel of `kernel` µs runs once the stream is free. The
  // call's end.
  double launch(double ts, double call, double kernel, const std::string& api = "cudaLaunchKernel",
                const std::string& name = "void at::native::vectorized_elementwise_kernel<4, at::native::"
                                          "CUDAFunctor_add<float>>(int)") {
    const std::int64_t c = corr++;
    x("cuda_runtime", api, ts, call, {{"correlation", c}});
    const double start = std::max(ts + call + 2, gpu_free);
    gpu("kernel", name, start, kernel, c);
    gpu_free = start + kernel;
    return ts + call;
  }
  // An aten op at `ts` that launches one kernel: `self` µs of its own, then the launch. Its end.
  double op(const std::string& name, double ts, double self, double call, double kernel,
            const std::string& api = "cudaLaunchKernel") {
    x("cpu_op", name, ts, self + call);
    return launch(ts + self, call, kernel, api);
  }
  std::string write(const std::string& stem) const {
    const json doc{{"schemaVersion", 1},
                   {"deviceProperties", json::array({json{{"id", 0},
                                                          {"name", "NVIDIA H100 80GB HBM3"},
                                                          {"totalGlobalMem", 85'000'000'000LL},
                                                          {"computeMajor", 9},
                                                          {"computeMinor", 0}}})},
                   {"traceEvents", events}};
    const std::string path = ::testing::TempDir() + "/" + stem + ".pt.trace.json";
    std::ofstream(path) << doc.dump();
    return path;
  }
};

sb::Result diagnose(const Fixture& f, const std::string& stem) {
  const std::string path = f.write(stem);
  sb::Result r = sb::diagnose::diagnose_trace(path, json{{"device", {{"id", "cpu"}}}});
  std::remove(path.c_str());
  return r;
}
std::vector<std::string> causes(const sb::Result& r) {
  std::vector<std::string> v;
  for (const auto& f : r.findings) v.push_back(f.cause);
  return v;
}
std::string all(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += "[" + x + "] ";
  return s;
}
const sb::Finding* finding(const sb::Result& r, const std::string& cause_prefix) {
  for (const auto& f : r.findings)
    if (f.cause.rfind(cause_prefix, 0) == 0) return &f;
  return nullptr;
}
std::string figures(const sb::Finding& f) {
  std::string s;
  if (f.evidence.contains("figures"))
    for (const auto& l : f.evidence["figures"]) s += l.get<std::string>() + "\n";
  return s;
}
const sb::Point& point(const sb::Result& r, const std::string& check) {
  for (const auto& p : r.points)
    if (p.params.value("check", std::string()) == check) return p;
  throw std::runtime_error("no point " + check);
}

// A loop with no profiler schedule: no ProfilerStep#N, a single-process DataLoader whose __next__ takes
// 600 µs against 250 µs of GPU work per iteration. Iterations come from the loader's own calls.
Fixture starved_loader_without_steps(int iterations = 8) {
  Fixture f;
  double t = 100;
  for (int i = 0; i < iterations; ++i) {
    f.x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, 600);
    f.x("cpu_op", "aten::stack", t + 50, 500);  // collation inside __next__
    t += 610;
    for (int k = 0; k < 5; ++k) t = f.op("aten::addmm", t, 4, 6, 50, "cudaLaunchKernel") + 1;
    f.x("user_annotation", "Optimizer.step#AdamW.step", t, 30);
    t = f.launch(t + 2, 6, 10) + 30;
    t = std::max(t, f.gpu_free - 200);  // the host runs ahead of the GPU by at most 200 µs
  }
  return f;
}

TEST(TraceHost, TheLoaderIsFoundWithoutProfilerSteps) {
  const sb::Result r = diagnose(starved_loader_without_steps(), "loader_no_steps");
  const auto& ld = point(r, "loader");
  EXPECT_EQ(ld.status, sb::Status::ok) << ld.reason;  // not "skipped: no ProfilerStep#N annotations"
  EXPECT_EQ(ld.info.value("iterations", std::string()), "enumerate(DataLoader)#...__next__");
  ASSERT_FALSE(r.findings.empty());
  EXPECT_EQ(r.findings[0].cause, "a slow host dataloader") << all(causes(r));
  ASSERT_NE(ld.metric("steps"), nullptr);
  EXPECT_EQ(ld.metric("steps")->value, 7);  // eight calls: seven whole iterations between them
  EXPECT_GT(ld.metric("dataloader_pct_of_step")->value, 50);
  // its evidence is the host attribution: the GPU's wait was the loader's
  const std::string fig = figures(r.findings[0]);
  EXPECT_NE(fig.find("the GPU waited"), std::string::npos) << fig;
  EXPECT_NE(fig.find("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__ [loader]"), std::string::npos) << fig;
  // and no launch-bound finding: the host's wait is the loader's, not its launches'
  EXPECT_EQ(finding(r, "a batch too small"), nullptr) << all(causes(r));
}

TEST(TraceHost, IterationsFromTheOptimizerAndAWarmUpKeptApart) {
  // no ProfilerStep#N and no DataLoader: Optimizer.step#... every 1 ms, after a first iteration of 20 ms
  Fixture f;
  for (double at : {0.0, 20000.0, 21000.0, 22000.0, 23000.0, 24000.0, 25000.0}) {
    f.op("aten::mm", at + 10, 5, 5, 300);
    f.x("user_annotation", "Optimizer.step#SGD.step", at + 900, 50);
  }
  const auto trace = sb::readers::parse_kineto(json{{"traceEvents", f.events}}.dump());
  const auto rows = sb::readers::hta_rows(trace);
  const auto it = sb::readers::find_iterations(trace, rows);
  EXPECT_EQ(it.source, "Optimizer.step#...");
  ASSERT_EQ(it.spans.size(), 6u);  // seven calls: six iterations between them
  EXPECT_EQ(it.warmup, 1u);        // the first, 20x the others
  EXPECT_NEAR(it.median_us, 1000, 1);
}

// A .item() per step (a loss printed each step): the host blocks in cudaStreamSynchronize until the GPU has
// run the step, then spends 400 µs of its own before its next launch; the queue is empty all that time.
TEST(TraceHost, ASyncPerStepIsNamedAsItself) {
  Fixture f;
  double t = 0;
  for (int s = 0; s < 6; ++s) {
    const double step0 = t;
    for (int k = 0; k < 10; ++k) t = f.op("aten::mm", t, 3, 5, 120) + 1;
    // loss.item(): a DtoH copy, then the sync until it lands
    f.x("cpu_op", "aten::item", t, 0);  // widened below
    const std::size_t item = f.events.size() - 1;
    f.x("cpu_op", "aten::_local_scalar_dense", t + 1, 0);
    const std::size_t dense = f.events.size() - 1;
    const std::int64_t c = f.corr++;
    f.x("cuda_runtime", "cudaMemcpyAsync", t + 2, 4, {{"correlation", c}});
    const double copy = std::max(t + 8, f.gpu_free);
    f.gpu("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", copy, 2, c);
    f.gpu_free = copy + 2;
    f.x("cuda_runtime", "cudaStreamSynchronize", t + 7, f.gpu_free + 3 - (t + 7), {{"correlation", f.corr++}});
    const double back = f.gpu_free + 4;
    f.events[item]["dur"] = back + 1 - t;
    f.events[dense]["dur"] = back - (t + 1);
    f.x("python_function", "train.py(118): <module>", t - 0.5, back + 1.5 - t);
    t = back + 2;
    f.x("cpu_op", "aten::add", t, 400);  // the host's own work after the sync: logging, bookkeeping
    t += 401;
    f.x("user_annotation", "ProfilerStep#" + std::to_string(s), step0, t - step0);
  }
  const sb::Result r = diagnose(f, "sync_per_step");
  ASSERT_FALSE(r.findings.empty());
  EXPECT_EQ(r.findings[0].cause, "a sync in the step (the host waits for the GPU)") << all(causes(r));
  EXPECT_NE(r.findings[0].summary.find("cudaStreamSynchronize (in aten::item"), std::string::npos)
      << r.findings[0].summary;
  EXPECT_NE(figures(r.findings[0]).find("train.py(118): <module>"), std::string::npos) << figures(r.findings[0]);
  EXPECT_NE(r.findings[0].evidence.value("config_line", std::string()).find("logging_steps"), std::string::npos);
  EXPECT_EQ(finding(r, "a batch too small"), nullptr) << all(causes(r));  // a host stall, not launch overhead
}

// The caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1 on ROCm): hipFree and hipMalloc in every
// step, the GPU idle while the host frees and allocates.
TEST(TraceHost, AllocatorChurnIsNamedAsItselfNotLaunchBound) {
  Fixture f;
  double t = 0;
  for (int s = 0; s < 5; ++s) {
    const double step0 = t;
    for (int k = 0; k < 4; ++k) {
      t = f.op("aten::addmm", t, 4, 6, 200, "hipLaunchKernel") + 1;
      f.x("cpu_op", "aten::empty", t, 700);
      f.x("cuda_runtime", "hipFree", t + 2, 450);
      f.x("cuda_runtime", "hipMalloc", t + 460, 230);
      t += 702;
    }
    f.x("user_annotation", "ProfilerStep#" + std::to_string(s), step0, t - step0);
  }
  const sb::Result r = diagnose(f, "allocator_churn");
  ASSERT_FALSE(r.findings.empty());
  EXPECT_EQ(r.findings[0].cause, "allocator churn (device memory allocated and freed in the step)") << all(causes(r));
  EXPECT_NE(r.findings[0].summary.find("hipFree"), std::string::npos) << r.findings[0].summary;
  EXPECT_EQ(finding(r, "a batch too small"), nullptr) << all(causes(r));
  const auto& host = point(r, "host");
  EXPECT_GT(host.metric("allocator_pct")->value, 50);
}

// Many short kernels, each launched by an op whose own time is longer than the kernel: launch-bound.
Fixture launch_bound(double loader_us, int kernels_per_step) {
  Fixture f;
  double t = 0;
  for (int s = 0; s < 5; ++s) {
    const double step0 = t;
    if (loader_us > 0) {
      f.x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, loader_us);
      t += loader_us + 1;
    }
    for (int k = 0; k < kernels_per_step; ++k) t = f.op("aten::add", t, 6, 5, 2) + 1;
    f.x("user_annotation", "ProfilerStep#" + std::to_string(s), step0, t - step0);
  }
  return f;
}

TEST(TraceHost, ALaunchBoundBatch) {
  const sb::Result r = diagnose(launch_bound(0, 100), "launch_bound");
  ASSERT_FALSE(r.findings.empty());
  EXPECT_EQ(r.findings[0].cause, "a batch too small (launch-bound)") << all(causes(r));
  ASSERT_TRUE(r.findings[0].speedup);
  EXPECT_LT(*r.findings[0].speedup, 2.0);  // twice the batch: half the launches per sample at most
  EXPECT_NE(figures(r.findings[0]).find("aten::add [host_op]"), std::string::npos) << figures(r.findings[0]);
  for (const char* other : {"a sync", "allocator", "a slow op", "a slow host dataloader"})
    EXPECT_EQ(finding(r, other), nullptr) << other << ": " << all(causes(r));
}

// Two causes in one trace: a single-process loader and launch-bound work after it. Both are named, whichever
// is larger first (until 2026-12-07 the launch-bound finding was dropped whenever a loader was seen).
TEST(TraceHost, TwoCausesRankedByTheirSize) {
  {
    const sb::Result r = diagnose(launch_bound(1500, 40), "loader_larger");  // loader 1500 µs, launches ~480
    const auto c = causes(r);
    ASSERT_GE(c.size(), 2u) << all(c);
    EXPECT_EQ(c[0], "a slow host dataloader") << all(c);
    EXPECT_NE(std::find(c.begin(), c.end(), "a batch too small (launch-bound)"), c.end()) << all(c);
  }
  {
    const sb::Result r = diagnose(launch_bound(200, 150), "launches_larger");  // loader 200 µs, launches ~1800
    const auto c = causes(r);
    ASSERT_GE(c.size(), 2u) << all(c);
    EXPECT_EQ(c[0], "a batch too small (launch-bound)") << all(c);
    EXPECT_NE(std::find(c.begin(), c.end(), "a slow host dataloader"), c.end()) << all(c);
    // ranked by gain: each is ordered by its own estimate
    for (std::size_t i = 1; i < r.findings.size(); ++i)
      EXPECT_GE(r.findings[i - 1].speedup.value_or(0), r.findings[i].speedup.value_or(0));
  }
}

// The reader keeps python_function events only when asked (diagnose asks), and reads the Kineto of 2021's
// categories (Operator, Runtime, Memset) as today's.
TEST(TraceHost, TheReaderKeepsPythonWhenAskedAndReadsTheOldCategories) {
  const std::string text = R"J({"traceEvents": [
    {"ph": "X", "cat": "Operator", "name": "ProfilerStep#5", "pid": 1, "tid": "1", "ts": 0, "dur": 100},
    {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": "1", "ts": 10, "dur": 5,
     "args": {"correlation": 3}},
    {"ph": "X", "cat": "Memset", "name": "Memset (Device)", "pid": 0, "tid": "stream 7", "ts": 20, "dur": 2,
     "args": {"stream": 7, "correlation": 3}},
    {"ph": "X", "cat": "python_function", "name": "train.py(3): <module>", "pid": 1, "tid": "1", "ts": 0, "dur": 90}
  ]})J";
  const auto plain = sb::readers::parse_kineto(text);
  EXPECT_EQ(plain.events.size(), 3u);
  sb::readers::ReadOptions o;
  o.python_functions = true;
  const auto py = sb::readers::parse_kineto(text, o);
  ASSERT_EQ(py.events.size(), 4u);
  EXPECT_EQ(py.events[0].cat, sb::readers::Cat::cpu_op);
  EXPECT_EQ(py.events[1].cat, sb::readers::Cat::cuda_runtime);
  EXPECT_EQ(py.events[2].cat, sb::readers::Cat::gpu_memset);
  EXPECT_EQ(py.events[3].cat, sb::readers::Cat::python_function);
  EXPECT_EQ(sb::readers::analyze(py).steps.count, 1);  // ProfilerStep#N as the Kineto of 2021 files it
}

}  // namespace
