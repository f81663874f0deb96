// The roofline model behind the `sim:<gpu>` device: operation times computed
// from one expected file (results/expected/<gpu>.json), each input recorded
// with its value, kind and source so a simulated result says where its
// numbers came from. Pure functions: no clock, no thread, testable exactly.
#pragma once

#include <cstddef>   // std::size_t
#include <map>       // std::map
#include <optional>  // std::optional
#include <string>    // std::string

#include <nlohmann/json.hpp>  // nlohmann::ordered_json: props

#include "harness/device.hpp"    // GemmShape, MemKind
#include "harness/dtype.hpp"     // DType
#include "harness/expected.hpp"  // ExpectedFile

namespace sb {

// One model input and where it came from, as DeviceInfo.props records it.
struct SimInput {
  double value = 0;
  std::string unit;
  std::string kind;    // datasheet, published, measured, or assumption
  std::string source;  // the publication, sheet or reasoning behind value
  std::string note;    // e.g. "FLOOR, not a typical value"; may be empty
  nlohmann::ordered_json to_json() const;
};

// The launch overhead every modelled kernel pays: a model assumption, not a
// measurement (a CUDA kernel launch typically costs about 5 us end to end).
inline constexpr double kSimLaunchOverheadUs = 5.0;

struct SimModel {
  std::string id;    // hardware.id, e.g. "h100-sxm"
  std::string name;  // hardware.name, e.g. "NVIDIA H100 SXM 80GB"
  std::string path;  // the expected file the inputs came from
  // GEMM peak per dtype: the best achievable figure (figures[] precision/
  // tflops where.dtype == dtype) when the file has one, else the datasheet
  // peak (peaks.tflops[dtype]). A dtype with neither is in `unsupported`.
  std::map<DType, SimInput> peak_tflops;
  std::map<DType, std::string> unsupported;
  std::optional<SimInput> memory_bandwidth_gbs;  // peaks.memory_bandwidth
  std::optional<SimInput> memory_capacity_gb;    // peaks.memory_capacity (1 GB = 1e9 bytes)
  SimInput launch_overhead_us;
  SimInput h2d_pinned_gbs;    // figures[] dataloader/h2d_gbs pin=pinned, or 25 GB/s assumed
  SimInput h2d_pageable_gbs;  // pin=pageable, or half the pinned rate assumed
};

// Throws UsageError when the file is not a gpu-class expected file.
SimModel make_sim_model(const ExpectedFile& file);

// Every model input with its source, for DeviceInfo.props.
nlohmann::ordered_json sim_props(const SimModel& model);

// Why the model cannot time a GEMM of this dtype, or nullopt.
std::optional<std::string> sim_gemm_unsupported(const SimModel& model, DType dtype);

// One GEMM's modelled time:
//   flops   = 2*M*N*K
//   bytes   = (M*K + N*K) * storage_bytes(dtype) + M*N * storage_bytes(c dtype)
//             (each operand read once and C written once: the roofline's minimum traffic)
//   seconds = max(flops / peak, bytes / bandwidth) + launch overhead
struct SimGemmTime {
  double flops = 0, bytes = 0;
  double compute_s = 0;   // flops / (peak TFLOP/s * 1e12)
  double memory_s = 0;    // bytes / (bandwidth GB/s * 1e9)
  double overhead_s = 0;  // launch overhead
  double seconds() const { return (compute_s > memory_s ? compute_s : memory_s) + overhead_s; }
  bool compute_bound() const { return compute_s >= memory_s; }
};
// Throws UnsupportedError (with sim_gemm_unsupported's reason).
SimGemmTime sim_gemm_time(const SimModel& model, GemmShape shape, DType dtype);
double sim_gemm_seconds(const SimModel& model, GemmShape shape, DType dtype);

// A host-to-device copy: bytes / (h2d GB/s * 1e9) for the source's kind
// (pinned or pageable). Only the bandwidth term: the published rates are
// large-transfer figures, and no launch overhead is added to copies.
double sim_h2d_seconds(const SimModel& model, std::size_t bytes, MemKind source);

}  // namespace sb
