// The expected-numbers reader, as a run uses it (results/expected/*.json are
// loaded on every run): the bytes parsed and checked (expected_from_json,
// behind load_expected_file), matched against a cpu, a gpu and a sim device,
// compared as `compare A B`'s B, and made into the sim device's model.
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint8_t

#include "harness/compare.hpp"    // compare_docs, format_compare
#include "harness/expected.hpp"   // expected_from_json, expected_matches
#include "harness/json_read.hpp"  // parse_json_text
#include "kernels/sim/sim_model.hpp"  // make_sim_model, sim_gemm_time
#include "tests/fuzz/fuzz_common.hpp"

namespace {

using json = nlohmann::ordered_json;

const json& result_doc() {
  static const json doc = [] {
    sb::Result r;
    r.meta = json{{"device", {{"id", "cuda:0"}, {"name", "NVIDIA H100"}, {"simulated", false}}}};
    r.scenario = "precision";
    r.params = json{{"size", {8192}}, {"dtype", {"bf16", "fp32"}}};
    for (const char* dt : {"bf16", "fp32"}) {
      sb::Point p;
      p.params = json{{"size", 8192}, {"dtype", dt}};
      p.add({"tflops", 700, "TFLOP/s", sb::Direction::higher, std::nullopt, ""});
      p.add({"ms", 1.5, "ms", sb::Direction::lower, std::nullopt, ""});
      r.points.push_back(p);
    }
    return sb::to_json(r);
  }();
  return doc;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string file = "fuzz-expected.json";
  sb::fuzz::usage_errors_only(file, [&] {
    const json doc = sb::parse_json_text(sb::fuzz::as_text(data, size), file);
    const sb::ExpectedFile f = sb::expected_from_json(doc, file);
    (void)f.id();
    sb::DeviceInfo cpu, gpu, sim;
    cpu.kind = sb::DeviceKind::cpu;
    gpu.kind = sb::DeviceKind::cuda;
    gpu.name = "NVIDIA H100 80GB HBM3";
    sim.kind = sb::DeviceKind::sim;
    sim.props = json{{"hardware_id", f.id()}};
    const sb::CpuInfo host{.model = "AMD EPYC", .logical_cores = 2, .isa = {"avx2", "avx512f", "avx512_bf16"},
                           .vendor = "AuthenticAMD", .family = 25};
    for (const auto* dev : {&cpu, &gpu, &sim}) (void)sb::expected_matches(f, *dev, host);
    (void)sb::format_compare(sb::compare_docs(result_doc(), doc, 0.05, "a.json", file));
    for (sb::DType t : sb::all_dtypes()) (void)f.peak_tflops(t);
    // `sim:<id>`: the roofline model made from this file.
    if (f.doc["hardware"]["class"] == "gpu") {
      const sb::SimModel m = sb::make_sim_model(f);
      (void)sb::sim_props(m);
      for (sb::DType t : sb::all_dtypes()) {
        try {
          (void)sb::sim_gemm_seconds(m, sb::GemmShape{1024, 1024, 1024}, t);
        } catch (const sb::UnsupportedError&) {
          // a dtype the file has no figure for: the point is skipped
        }
      }
      (void)sb::sim_h2d_seconds(m, 1 << 20, sb::MemKind::host_pinned);
    }
  });
  return 0;
}
