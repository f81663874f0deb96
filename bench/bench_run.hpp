// The end of every benchmark binary's main: run what --benchmark_filter
// selects, and fail (exit 1) when it selects nothing, so a smoke test whose
// filter no longer matches cannot pass vacuously.
#pragma once

#include <cstdio>  // std::fprintf

#include <benchmark/benchmark.h>  // benchmark::RunSpecifiedBenchmarks, BenchmarkReporter

namespace sb {

inline int run_selected_benchmarks(benchmark::BenchmarkReporter* reporter = nullptr) {
  const std::size_t ran =
      reporter ? benchmark::RunSpecifiedBenchmarks(reporter) : benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (ran == 0) {
    std::fprintf(stderr, "no benchmark matched the filter\n");
    return 1;
  }
  return 0;
}

}  // namespace sb
