// Attention microbenchmarks: one forward (and, under /fwd+bwd, a backward)
// per implementation, dtype and sequence length, on every device this build
// has (cpu; cuda when a GPU answers). Time is the device's own (manual time
// from its events: CUDA events on GPU, the compute thread's clock on cpu).
// FLOPs: 4*B*H*S^2*D forward, 3.5x for forward+backward (docs/DESIGN.md); the
// TFLOPS counter is FLOPs per second of device time.
// Sizes: S=128 is the smoke test (`meson test --suite bench-smoke`).
#include <string>  // std::string

#include <benchmark/benchmark.h>  // benchmark::State, RegisterBenchmark

#include "harness/device.hpp"    // Device, AttentionOp
#include "kernels/backends.hpp"  // all_backends
#include "bench/bench_run.hpp"  // run_selected_benchmarks

namespace {

void attention(benchmark::State& st, const sb::Backend* backend, sb::AttnImpl impl, sb::DType dt, bool bwd) {
  auto dev = backend->open(0);
  if (auto why = dev->attention_unsupported(impl, dt)) {
    st.SkipWithError(why->c_str());
    return;
  }
  sb::AttnShape s;
  s.batch = 1;
  s.heads = backend->name == "cuda" ? 16 : 8;
  s.head_dim = backend->name == "cuda" ? 128 : 64;
  s.seq = st.range(0);
  std::unique_ptr<sb::AttentionOp> op;
  try {
    op = dev->make_attention(s, impl, dt, 1);
  } catch (const sb::OutOfMemory& e) {
    st.SkipWithError(e.what());
    return;
  }
  st.SetLabel(op->impl_detail());
  auto pass = [&] {
    op->forward();
    if (bwd) op->backward();
  };
  pass();
  dev->synchronize(std::chrono::minutes(5));
  for (auto _ : st) {
    auto e0 = dev->record();
    pass();
    auto e1 = dev->record();
    dev->synchronize(std::chrono::minutes(5));
    st.SetIterationTime(dev->elapsed_ms(e0, e1) / 1e3);
  }
  const double flops = s.fwd_flops() * (bwd ? 3.5 : 1.0);
  st.counters["TFLOPS"] = benchmark::Counter(flops * double(st.iterations()) / 1e12, benchmark::Counter::kIsRate);
  st.counters["workspace_MiB"] = double(op->workspace_bytes()) / double(1 << 20);
}

}  // namespace

int main(int argc, char** argv) {
  for (const auto& backend : sb::all_backends()) {
    if (backend.name == "sim" || backend.list().empty()) continue;  // measured devices only
    const bool gpu = backend.name == "cuda";
    for (sb::AttnImpl impl : {sb::AttnImpl::naive, gpu ? sb::AttnImpl::cudnn : sb::AttnImpl::flash})
      for (sb::DType dt : {sb::DType::fp32, sb::DType::bf16})
        for (bool bwd : {false, true}) {
          const std::string name = backend.name + "/" + std::string(sb::to_string(impl)) + "/" +
                                   std::string(sb::to_string(dt)) + (bwd ? "/fwd+bwd" : "/fwd");
          auto* b = benchmark::RegisterBenchmark(name.c_str(), [bk = &backend, impl, dt, bwd](benchmark::State& st) {
            attention(st, bk, impl, dt, bwd);
          });
          b->Arg(128)->Arg(1024)->Arg(4096)->UseManualTime()->Unit(benchmark::kMillisecond);
          if (gpu) b->Arg(16384);
        }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  return sb::run_selected_benchmarks();
}
