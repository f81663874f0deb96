// The packers' speed (the README's figures): Google Benchmark, not a unit
// test, since seconds depend on the machine.
//   build/bench/packing_bench [--benchmark_filter=bfd]
// - a million lognormal lengths (mean 256, max_len 2048), every planner;
// - pack-hist on the published histograms: Wikipedia at 512
//   (16.3M sequences as 508 counts) and SQuAD 1.1 at 384, never expanded;
// - pack-bfd on the same histograms expanded into one length per sequence
//   (shuffled, as a dataset is read): the same rows, for comparison. The
//   Wikipedia one holds about 1.2 GB.
// The histograms are third-party data, not in the repository: read from
// $STALLBENCH_SHARED_DATA/data (default <source root>/../shared/data); where
// they are absent, their benchmarks are left out with a message.
// Counters: efficiency (real tokens / (rows x max_len)), rows, and
// sequences or lengths per second.
#include <cstdint>     // std::int32_t, std::int64_t
#include <cstdio>      // std::fprintf
#include <cstdlib>     // std::getenv
#include <filesystem>  // std::filesystem
#include <map>         // std::map
#include <string>      // std::string
#include <vector>      // std::vector

#include <benchmark/benchmark.h>  // benchmark::State, RegisterBenchmark

#include "workloads/lengths.hpp"  // parse_lengths, generate_lengths
#include "workloads/packers.hpp"  // plan, plan_histogram, Strategy
#include "bench/bench_run.hpp"  // run_selected_benchmarks

#ifndef SB_SHARED_DATA
#error "SB_SHARED_DATA (<source root>/../shared) is set by bench/meson.build"
#endif

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
    rows = double(p.row_count());
    benchmark::DoNotOptimize(rows);
  }
  st.counters["efficiency"] = eff;
  st.counters["rows"] = rows;
  st.counters["lengths/s"] = benchmark::Counter(double(lengths.size()) * double(st.iterations()),
                                                benchmark::Counter::kIsRate);
}

// $STALLBENCH_SHARED_DATA/data, or SB_SHARED_DATA/data when the variable is unset or empty.
std::string published_dir() {
  const char* env = std::getenv("STALLBENCH_SHARED_DATA");
  return (std::filesystem::path(env && *env ? env : SB_SHARED_DATA) / "data").lexically_normal().string();
}

// A published histogram, as `-p lengths=@FILE` reads it.
struct Published {
  const char* name;
  std::int32_t max_len;
  std::string path() const { return published_dir() + "/" + name + ".csv"; }
  const std::vector<LengthCount>& histogram() const {  // read once
    static std::map<std::string, std::vector<LengthCount>> read;
    auto [at, fresh] = read.try_emplace(name);
    if (fresh) at->second = parse_lengths(std::string("@").append(path())).histogram;
    return at->second;
  }
  std::int64_t sequences() const {
    std::int64_t n = 0;
    for (const auto& e : histogram()) n += e.count;
    return n;
  }
};
constexpr Published kWikipedia{"wikipedia_max512", 512}, kSquad{"squad11_max384", 384};

void pack_histogram(benchmark::State& st, const Published& data) {
  const auto& h = data.histogram();
  double eff = 0, rows = 0, shapes = 0;
  for (auto _ : st) {
    const Plan p = plan_histogram(h, data.max_len, Overflow::split);
    eff = p.efficiency();
    rows = double(p.row_count());
    shapes = double(p.packed->groups.size());
    benchmark::DoNotOptimize(rows);
  }
  st.counters["efficiency"] = eff;
  st.counters["rows"] = rows;
  st.counters["pack_shapes"] = shapes;
  st.counters["sequences/s"] = benchmark::Counter(double(data.sequences()) * double(st.iterations()),
                                                  benchmark::Counter::kIsRate);
}

void pack_expanded(benchmark::State& st, const Published& data) {
  LengthSpec spec;
  spec.kind = LengthSpec::Kind::file_histogram;
  spec.histogram = data.histogram();
  const std::vector<std::int32_t> lengths = generate_lengths(spec, 0, 1);  // every sequence, shuffled
  double eff = 0, rows = 0;
  for (auto _ : st) {
    const Plan p = plan(lengths, Strategy::pack_bfd, data.max_len, 1, 1, Overflow::split);
    eff = p.efficiency();
    rows = double(p.row_count());
    benchmark::DoNotOptimize(rows);
  }
  st.counters["efficiency"] = eff;
  st.counters["rows"] = rows;
  st.counters["sequences/s"] = benchmark::Counter(double(lengths.size()) * double(st.iterations()),
                                                  benchmark::Counter::kIsRate);
}

}  // namespace

int main(int argc, char** argv) {
  for (const Strategy s : {Strategy::pad_max, Strategy::pad_longest, Strategy::bucket, Strategy::pack_ffd,
                           Strategy::pack_bfd, Strategy::pack_hist})
    benchmark::RegisterBenchmark(("pack_1M_lognormal256/" + std::string(to_string(s))).c_str(),
                                 [s](benchmark::State& st) { pack(st, s); })
        ->Unit(benchmark::kMillisecond);
  for (const Published* data : {&kWikipedia, &kSquad}) {
    if (std::error_code ec; !std::filesystem::exists(data->path(), ec)) {
      std::fprintf(stderr,
                   "packing_bench: %s is absent (third-party data, not in the repository; read from "
                   "$STALLBENCH_SHARED_DATA/data, default <source root>/../shared/data): histogram_%s and "
                   "expanded_%s left out\n",
                   data->path().c_str(), data->name, data->name);
      continue;
    }
    benchmark::RegisterBenchmark((std::string("histogram_") + data->name + "/pack-hist").c_str(),
                                 [data](benchmark::State& st) { pack_histogram(st, *data); })
        ->Unit(benchmark::kMillisecond);
    // Named "expanded_..._bfd" so the smoke test's filter (pack-bfd|pack-hist)
    // leaves the 1.2 GB Wikipedia one out.
    benchmark::RegisterBenchmark((std::string("expanded_") + data->name + "/bfd").c_str(),
                                 [data](benchmark::State& st) { pack_expanded(st, *data); })
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  return sb::run_selected_benchmarks();
}
