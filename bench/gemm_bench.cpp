// GEMM microbenchmarks. On cpu, the bare oneDNN loop (weights reordered once
// to the primitive's preferred layout, f32 output, as docs/REFERENCE.md measured)
// runs beside the same GEMM through the harness (Device + measure), so the
// harness's overhead is a ratio measured in one run. On cuda, the harness
// path uses manual time from CUDA events.
//
// GEMM FLOPs = 2*M*N*K; the GFLOP/s counter is FLOPs per second of iteration.
// Sizes: 64 (the smoke test in `meson test --suite bench-smoke`), 2048.
#include <cstdio>   // std::printf
#include <cstring>  // std::strlen
#include <map>      // std::map
#include <string>   // std::string

#include <unistd.h>  // isatty

#include <benchmark/benchmark.h>  // benchmark::State, RegisterBenchmark
#include <oneapi/dnnl/dnnl.hpp>   // dnnl::matmul: the bare loop

#include "harness/device.hpp"           // Device, GemmOp
#include "harness/random.hpp"           // uniform_pm1
#include "kernels/backends.hpp"         // all_backends
#include "bench/bench_run.hpp"  // run_selected_benchmarks

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

void report(benchmark::State& st, double flops) {
  st.counters["GFLOPS"] = benchmark::Counter(flops * double(st.iterations()) / 1e9, benchmark::Counter::kIsRate);
}

void bare_onednn(benchmark::State& st, dt type) {
  const dnnl::memory::dim n = st.range(0);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  const dnnl::memory::desc a_md({n, n}, type, tag::ab), w_any({n, n}, type, tag::any), c_md({n, n}, dt::f32, tag::ab);
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, w_any, c_md), eng);
  } catch (const dnnl::error& e) {
    // oneDNN 2.6 has no bf16 matmul below avx512_core: a skip with the reason, not an abort.
    st.SkipWithError(("oneDNN has no such matmul on this CPU: " + std::string(e.what())).c_str());
    return;
  }
  dnnl::matmul mm(pd);
  dnnl::memory a(a_md, eng), w(pd.weights_desc(), eng), c(c_md, eng);
  // Fill through f32 user memory and reorder once (weights to `any`).
  std::vector<float> host(std::size_t(n * n));
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = sb::uniform_pm1(7, i);
  dnnl::memory user({{n, n}, dt::f32, tag::ab}, eng, host.data());
  dnnl::reorder(user, a).execute(s, user, a);
  dnnl::memory wuser({{n, n}, dt::f32, tag::ba}, eng, host.data());
  dnnl::reorder(wuser, w).execute(s, wuser, w);
  s.wait();
  st.SetLabel(pd.impl_info_str());
  for (auto _ : st) {
    mm.execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, c}});
    s.wait();
  }
  report(st, 2.0 * double(n) * double(n) * double(n));
}

// The harness path: the same GEMM enqueued on a Device's stream and timed by
// its events (manual time), as `stallbench run precision` does.
void harness_gemm(benchmark::State& st, const sb::Backend* backend, sb::DType type) {
  const std::int64_t n = st.range(0);
  auto dev = backend->open(0);
  if (auto why = dev->gemm_unsupported(type)) {
    st.SkipWithError(why->c_str());
    return;
  }
  auto op = dev->make_gemm({n, n, n}, type, 7);
  st.SetLabel(op->impl());
  op->enqueue();
  dev->synchronize(std::chrono::minutes(2));
  for (auto _ : st) {
    auto e0 = dev->record();
    op->enqueue();
    auto e1 = dev->record();
    dev->synchronize(std::chrono::minutes(2));
    st.SetIterationTime(dev->elapsed_ms(e0, e1) / 1e3);
  }
  report(st, 2.0 * double(n) * double(n) * double(n));
}

class RatioReporter : public benchmark::ConsoleReporter {
 public:
  explicit RatioReporter(OutputOptions o) : ConsoleReporter(o) {}
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      auto it = r.counters.find("GFLOPS");
      if (it == r.counters.end() || r.error_occurred) continue;
      // "harness/cpu/fp32/2048/manual_time" and "bare_onednn/fp32/2048/real_time"
      // name the same GEMM once the timing suffix is dropped.
      std::string name = r.benchmark_name();
      for (const char* suffix : {"/manual_time", "/real_time"})
        if (name.size() > std::strlen(suffix) && name.ends_with(suffix)) name.resize(name.size() - std::strlen(suffix));
      rates_[name] = it->second.value;
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    // harness/bare at the same size and dtype, measured in this run.
    for (const auto& [name, rate] : rates_) {
      const auto pos = name.find("harness/cpu/");
      if (pos != 0) continue;
      const std::string rest = name.substr(std::string("harness/cpu/").size());
      const auto bare = rates_.find("bare_onednn/" + rest);
      if (bare == rates_.end() || bare->second <= 0) continue;
      std::printf("harness/bare %-24s %.3f  (%.1f vs %.1f GFLOP/s)\n", rest.c_str(), rate / bare->second, rate,
                  bare->second);
    }
  }

 private:
  std::map<std::string, double> rates_;
};

}  // namespace

int main(int argc, char** argv) {
  for (const auto& [name, type] : {std::pair{"fp32", dt::f32}, std::pair{"bf16", dt::bf16}}) {
    benchmark::RegisterBenchmark(("bare_onednn/" + std::string(name)).c_str(),
                                 [type = type](benchmark::State& st) { bare_onednn(st, type); })
        ->Arg(64)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  for (const auto& backend : sb::all_backends()) {
    // Measured devices only: sim's figures are modelled waits, and no GPU
    // means nothing to register for cuda.
    if (backend.name == "sim" || backend.list().empty()) continue;
    for (sb::DType type : sb::all_dtypes()) {
      auto* b = benchmark::RegisterBenchmark(
          ("harness/" + backend.name + "/" + std::string(sb::to_string(type))).c_str(),
          [bk = &backend, type](benchmark::State& st) { harness_gemm(st, bk, type); });
      b->Arg(64)->Arg(2048)->Unit(benchmark::kMillisecond)->UseManualTime();
      if (backend.name == "cuda") b->Arg(8192);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  // Colour only on a terminal: logs and meson's test output stay plain.
  RatioReporter rep(isatty(STDOUT_FILENO) ? benchmark::ConsoleReporter::OO_ColorTabular
                                          : benchmark::ConsoleReporter::OO_Tabular);
  return sb::run_selected_benchmarks(&rep);
}
