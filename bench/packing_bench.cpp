// The packers' speed on a million lengths (the README's figure): Google
// Benchmark, not a unit test, since seconds depend on the machine.
//   build/bench/packing_bench [--benchmark_filter=bfd]
#include <cstdint>  // std::int32_t
#include <string>   // std::string
#include <vector>   // std::vector

#include <benchmark/benchmark.h>  // benchmark::State, RegisterBenchmark

#include "scenarios/packing/lengths.hpp"  // parse_lengths, generate_lengths
#include "scenarios/packing/packers.hpp"  // plan, Strategy
#include "bench/bench_run.hpp"  // run_selected_benchmarks

namespace {

using namespace sb::packing;

const std::vector<std::int32_t>& million() {
  static const std::vector<std::int32_t> v = generate_lengths(parse_lengths("lognormal:256,1.0"), 1000000, 1, 4 * 2048);
  return v;
}

void pack(benchmark::State& st, Strategy s) {
  const auto& lengths = million();
  double eff = 0, rows = 0;
  for (auto _ : st) {
    const Plan p = plan(lengths, s, 2048, 8, 16, Overflow::split);
    eff = p.efficiency();
    rows = double(p.rows.size());
    benchmark::DoNotOptimize(rows);
  }
  st.counters["efficiency"] = eff;
  st.counters["rows"] = rows;
  st.counters["lengths/s"] = benchmark::Counter(double(lengths.size()) * double(st.iterations()),
                                                benchmark::Counter::kIsRate);
}

}  // namespace

int main(int argc, char** argv) {
  for (const Strategy s : {Strategy::pad_max, Strategy::pad_longest, Strategy::bucket, Strategy::pack_ffd,
                           Strategy::pack_bfd})
    benchmark::RegisterBenchmark(("pack_1M_lognormal256/" + std::string(to_string(s))).c_str(),
                                 [s](benchmark::State& st) { pack(st, s); })
        ->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  return sb::run_selected_benchmarks();
}
