#include "kernels/sim/sim_model.hpp"

#include <algorithm>  // std::max
#include <utility>    // std::pair

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // UsageError, UnsupportedError

namespace sb {

using json = nlohmann::ordered_json;

namespace {

// Used only when the file has no pinned h2d figure: roughly what a PCIe
// Gen4 x16 link moves from pinned memory; an assumption, never a measurement.
constexpr double kAssumedPinnedH2dGbs = 25.0;

std::string str_or(const json& j, const char* key, const char* fallback) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string(fallback);
}

SimInput input_from(const json& j, const std::string& default_unit) {
  SimInput in;
  in.value = j.at("value").get<double>();
  in.unit = str_or(j, "unit", default_unit.c_str());
  in.kind = str_or(j, "kind", "?");
  in.source = str_or(j, "source", "?");
  in.note = str_or(j, "note", "");
  return in;
}

bool has_number(const json& j, const char* key) { return j.is_object() && j.contains(key) && j[key].is_number(); }

// peaks.<key> as an input, or nullopt when the file has no such number.
std::optional<SimInput> peak(const json& doc, const char* key, const char* unit) {
  const json peaks = doc.value("peaks", json::object());
  if (!peaks.contains(key) || !has_number(peaks[key], "value")) return std::nullopt;
  return input_from(peaks[key], unit);
}

// The highest figure of scenario/metric whose where[key] equals value (other
// where keys, such as the shape, are ignored: the model has one peak per dtype).
std::optional<SimInput> best_figure(const json& doc, const std::string& scenario, const std::string& metric,
                                    const std::string& key, const std::string& value, const std::string& unit) {
  std::optional<SimInput> best;
  for (const auto& f : doc.value("figures", json::array())) {
    if (f.value("scenario", "") != scenario || f.value("metric", "") != metric || !has_number(f, "value")) continue;
    const json where = f.value("where", json::object());
    if (!where.contains(key) || where[key] != value) continue;
    if (str_or(f, "unit", unit.c_str()) != unit) continue;  // a figure in another unit is not this input
    SimInput in = input_from(f, unit);
    if (!best || in.value > best->value) best = std::move(in);
  }
  return best;
}

}  // namespace

json SimInput::to_json() const {
  json j{{"value", value}, {"unit", unit}, {"kind", kind}, {"source", source}};
  if (!note.empty()) j["note"] = note;
  return j;
}

SimModel make_sim_model(const ExpectedFile& file) {
  const json& doc = file.doc;
  const json hw = doc.value("hardware", json::object());
  if (str_or(hw, "class", "gpu") != "gpu")
    throw UsageError(fmt::format("{} describes a {}, not a gpu: it cannot be simulated", file.path,
                                 str_or(hw, "class", "?")));
  SimModel m;
  m.id = file.id();
  m.name = str_or(hw, "name", m.id.c_str());
  m.path = file.path;

  for (DType t : all_dtypes()) {
    const std::string name(to_string(t));
    // An achievable figure describes what a GEMM really reaches; the datasheet
    // peak is a ceiling no workload reaches, used only when nothing better exists.
    if (auto fig = best_figure(doc, "precision", "tflops", "dtype", name, "TFLOP/s")) {
      m.peak_tflops[t] = *fig;
      continue;
    }
    const json peaks = doc.value("peaks", json::object());
    const json tflops = peaks.value("tflops", json::object());
    if (tflops.contains(name) && has_number(tflops[name], "value")) {
      m.peak_tflops[t] = input_from(tflops[name], "TFLOP/s");
      continue;
    }
    m.unsupported[t] = fmt::format(
        "sim:{}: {} has no {} GEMM figure (figures[] precision/tflops with where.dtype \"{}\") and no "
        "datasheet peak (peaks.tflops.{}), so the model has no rate for it",
        m.id, file.path, name, name, name);
  }

  // bf16 and fp16 run on the same tensor cores at the same datasheet peak. When the file has an
  // achievable figure for one and only the peak for the other, the other takes the same fraction of
  // its peak: else the model would rate fp16 at the full datasheet peak beside bf16's measured 80%,
  // and show a gap between them (1.24x on sim:h200) that is only a missing figure.
  const json tflops_peaks = doc.value("peaks", json::object()).value("tflops", json::object());
  for (const auto& [from, to] : {std::pair{DType::bf16, DType::fp16}, std::pair{DType::fp16, DType::bf16}}) {
    const auto a = m.peak_tflops.find(from), b = m.peak_tflops.find(to);
    if (a == m.peak_tflops.end() || b == m.peak_tflops.end() || a->second.kind == "datasheet" ||
        b->second.kind != "datasheet")
      continue;
    const std::string fname(to_string(from)), tname(to_string(to));
    if (!tflops_peaks.contains(fname) || !has_number(tflops_peaks[fname], "value")) continue;
    const double from_peak = tflops_peaks[fname]["value"].get<double>();
    if (!(from_peak > 0)) continue;
    const double frac = a->second.value / from_peak;
    SimInput in;
    in.value = b->second.value * frac;
    in.unit = "TFLOP/s";
    in.kind = "assumption";
    in.source = fmt::format("{}'s datasheet peak ({}) times the fraction of its peak {}'s figure reaches "
                            "({} of {}: {:.1f}%): the two run on the same tensor cores at the same peak",
                            tname, b->second.value, fname, a->second.value, from_peak, 100 * frac);
    in.note = fmt::format("model assumption: {} has no {} GEMM figure", file.path, tname);
    b->second = std::move(in);
  }

  m.memory_bandwidth_gbs = peak(doc, "memory_bandwidth", "GB/s");
  m.memory_capacity_gb = peak(doc, "memory_capacity", "GB");

  m.launch_overhead_us = {kSimLaunchOverheadUs, "us", "assumption",
                          "model assumption: typical CUDA kernel launch latency, not measured", ""};

  if (auto pinned = best_figure(doc, "dataloader", "h2d_gbs", "pin", "pinned", "GB/s")) {
    m.h2d_pinned_gbs = *pinned;
  } else {
    m.h2d_pinned_gbs = {kAssumedPinnedH2dGbs, "GB/s", "assumption",
                        fmt::format("model assumption: {} has no pinned h2d_gbs figure; about a PCIe Gen4 x16 "
                                    "link's pinned host-to-device rate, not measured",
                                    file.path),
                        ""};
  }
  if (auto pageable = best_figure(doc, "dataloader", "h2d_gbs", "pin", "pageable", "GB/s")) {
    m.h2d_pageable_gbs = *pageable;
  } else {
    m.h2d_pageable_gbs = {m.h2d_pinned_gbs.value / 2, "GB/s", "assumption",
                          fmt::format("model assumption: {} has no pageable h2d_gbs figure; half the pinned "
                                      "rate, since pageable copies stage through a pinned bounce buffer",
                                      file.path),
                          ""};
  }
  return m;
}

json sim_props(const SimModel& m) {
  json peaks = json::object();
  for (const auto& [t, in] : m.peak_tflops) {
    json j = in.to_json();
    j["basis"] = in.kind == "datasheet"    ? "datasheet peak (no achievable figure in the file)"
                 : in.kind == "assumption" ? "the datasheet peak scaled by its tensor-core sibling's achievable fraction"
                                           : "best achievable figure in the file";
    peaks[std::string(to_string(t))] = j;
  }
  json unsupported = json::object();
  for (const auto& [t, why] : m.unsupported) unsupported[std::string(to_string(t))] = why;
  json p{
      {"model", "roofline: time = max(flops / peak, bytes / memory bandwidth) + launch overhead, spent as a "
                "timed wait on the stream thread (no CPU); copies: bytes / h2d bandwidth"},
      {"expected_file", m.path},
      {"hardware_id", m.id},
      {"peak_tflops", peaks},
  };
  if (!unsupported.empty()) p["unsupported"] = unsupported;
  p["memory_bandwidth"] = m.memory_bandwidth_gbs ? m.memory_bandwidth_gbs->to_json() : json("absent");
  p["memory_capacity"] = m.memory_capacity_gb ? m.memory_capacity_gb->to_json() : json("absent: no limit");
  p["launch_overhead"] = m.launch_overhead_us.to_json();
  p["h2d_bandwidth"] = {{"pinned", m.h2d_pinned_gbs.to_json()}, {"pageable", m.h2d_pageable_gbs.to_json()}};
  p["stream"] = "one thread running enqueued operations in order as timed waits";
  return p;
}

std::optional<std::string> sim_gemm_unsupported(const SimModel& m, DType t) {
  if (auto it = m.unsupported.find(t); it != m.unsupported.end()) return it->second;
  if (!m.memory_bandwidth_gbs)
    return fmt::format("sim:{}: {} has no peaks.memory_bandwidth, so the model has no memory term", m.id, m.path);
  return std::nullopt;
}

SimGemmTime sim_gemm_time(const SimModel& m, GemmShape s, DType t) {
  if (auto why = sim_gemm_unsupported(m, t)) throw UnsupportedError(*why);
  const double mm = double(s.m), nn = double(s.n), kk = double(s.k);
  SimGemmTime g;
  g.flops = s.flops();  // 2*M*N*K
  g.bytes = (mm * kk + nn * kk) * storage_bytes(t) + mm * nn * storage_bytes(gpu_gemm_c_dtype(t));
  g.compute_s = g.flops / (m.peak_tflops.at(t).value * 1e12);
  g.memory_s = g.bytes / (m.memory_bandwidth_gbs->value * 1e9);
  g.overhead_s = m.launch_overhead_us.value * 1e-6;
  return g;
}

double sim_gemm_seconds(const SimModel& m, GemmShape s, DType t) { return sim_gemm_time(m, s, t).seconds(); }

double sim_h2d_seconds(const SimModel& m, std::size_t bytes, MemKind source) {
  if (source == MemKind::device)
    throw Error(ErrorKind::runtime, fmt::format("sim:{}: a host-to-device copy needs a host source", m.id));
  const SimInput& bw = source == MemKind::host_pinned ? m.h2d_pinned_gbs : m.h2d_pageable_gbs;
  return double(bytes) / (bw.value * 1e9);
}

}  // namespace sb
