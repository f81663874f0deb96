// Each counted op against the card's roofline (roofline.hpp).
#include "diagnose/trace/roofline.hpp"

#include <algorithm>  // std::sort, std::min, std::max
#include <charconv>   // std::from_chars
#include <cmath>      // std::floor
#include <map>        // std::map
#include <numeric>    // std::accumulate
#include <unordered_map>  // std::unordered_map

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "diagnose/trace/trace_analysis.hpp"  // gemm_dtype
#include "harness/expected.hpp"               // load_expected_files

namespace sb::diagnose {
namespace {

using json = nlohmann::ordered_json;
using readers::ElemType;

double elem_bytes(ElemType t) {
  switch (t) {
    case ElemType::bf16:
    case ElemType::f16: return 2;
    case ElemType::f64:
    case ElemType::integer: return 8;
    case ElemType::f8: return 1;
    default: return 4;
  }
}

double numel(const std::vector<std::int64_t>& d) {
  double n = 1;
  for (auto x : d) n *= double(std::max<std::int64_t>(x, 0));
  return n;
}

const std::vector<std::int64_t>& dim(const readers::OpShape& s, std::size_t i) {
  static const std::vector<std::int64_t> none;
  return i < s.dims.size() ? s.dims[i] : none;
}
ElemType type(const readers::OpShape& s, std::size_t i) { return i < s.types.size() ? s.types[i] : ElemType::none; }

// "[2, 2]" or "2" -> {2, 2} / {2}; {} when it is not one
std::vector<std::int64_t> ints(const readers::OpShape& s, std::size_t i) {
  std::vector<std::int64_t> out;
  if (i >= s.concrete.size()) return out;
  const std::string& c = s.concrete[i];
  for (std::size_t k = 0; k < c.size();) {
    if (c[k] == '-' || (c[k] >= '0' && c[k] <= '9')) {
      std::int64_t v = 0;
      const auto r = std::from_chars(c.data() + k, c.data() + c.size(), v);
      if (r.ec != std::errc()) return {};
      out.push_back(v);
      k = std::size_t(r.ptr - c.data());
    } else {
      ++k;
    }
  }
  return out;
}
bool truth(const readers::OpShape& s, std::size_t i, bool& known) {
  known = i < s.concrete.size() && (s.concrete[i] == "True" || s.concrete[i] == "False");
  return known && s.concrete[i] == "True";
}

// a stride/padding/dilation list for n spatial dims: one value repeated, or n values
std::vector<std::int64_t> spread(std::vector<std::int64_t> v, std::size_t n, std::int64_t dflt) {
  if (v.empty()) v = {dflt};
  if (v.size() == 1) v.assign(n, v[0]);
  v.resize(n, dflt);
  return v;
}

OpWork conv(const readers::OpShape& s, bool backward) {
  OpWork w;
  w.category = "conv";
  if (backward) {
    // (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask)
    const auto& go = dim(s, 0);
    const auto& x = dim(s, 1);
    const auto& wt = dim(s, 2);
    if (go.size() < 3 || x.size() != go.size() || wt.size() != go.size()) return w;
    const auto g = ints(s, 9);
    const double groups = g.empty() ? 1 : double(std::max<std::int64_t>(1, g[0]));
    (void)groups;  // the weight's second dim is C_in / groups already
    const double kernel = numel({wt.begin() + 2, wt.end()});
    const double fwd = 2 * double(go[0]) * double(go[1]) * numel({go.begin() + 2, go.end()}) * double(wt[1]) * kernel;
    w.flops = 2 * fwd;
    const double es = elem_bytes(type(s, 0));
    w.bytes = es * (2 * numel(go) + 2 * numel(x) + 2 * numel(wt));
    w.dtype = readers::to_string(type(s, 0));
    return w;
  }
  // (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
  const auto& x = dim(s, 0);
  const auto& wt = dim(s, 1);
  if (x.size() < 3 || wt.size() != x.size()) return w;
  const std::size_t n = x.size() - 2;
  w.assumed = s.concrete.size() < 9;
  const auto st = spread(ints(s, 3), n, 1), pad = spread(ints(s, 4), n, 0), dil = spread(ints(s, 5), n, 1);
  bool known = false;
  const bool transposed = truth(s, 6, known);
  double out = 1;
  for (std::size_t i = 0; i < n; ++i) {  // in double: a hostile stride or padding must not overflow int64
    const double k = double(wt[i + 2]), in = double(x[i + 2]), sd = double(st[i]), p = double(pad[i]), d = double(dil[i]);
    const double o = transposed ? (in - 1) * sd - 2 * p + d * (k - 1) + 1
                                : std::floor((in + 2 * p - d * (k - 1) - 1) / std::max(1.0, sd)) + 1;
    out *= std::max(o, 0.0);
  }
  const double kernel = numel({wt.begin() + 2, wt.end()});
  // a transposed convolution's weight is [C_in, C_out/groups, k...]: its work counted from its input side
  w.flops = transposed ? 2 * double(x[0]) * double(x[1]) * numel({x.begin() + 2, x.end()}) * double(wt[1]) * kernel
                       : 2 * double(x[0]) * double(wt[0]) * out * double(wt[1]) * kernel;
  const double es = elem_bytes(type(s, 0));
  w.bytes = es * (numel(x) + numel(wt) + double(x[0]) * double(transposed ? wt[1] : wt[0]) * out);
  w.dtype = readers::to_string(type(s, 0));
  return w;
}

OpWork attention(const std::string& name, const readers::OpShape& s) {
  OpWork w;
  w.category = "attention";
  const bool bwd = name.find("_backward") != std::string::npos;
  // forward (query, key, value, ...); backward (grad_out, query, key, value, out, ...)
  const std::size_t q0 = bwd ? 1 : 0;
  const auto& q = dim(s, q0);
  const auto& k = dim(s, q0 + 1);
  const auto& v = dim(s, q0 + 2);
  if (q.size() != 4 || k.size() != 4 || v.size() != 4) return w;
  // [B, H, S, D] as SDPA takes them
  const double fwd = 4 * double(q[0]) * double(q[1]) * double(q[2]) * double(k[2]) * double(q[3]);
  // is_causal: the flash op's 5th input, the efficient op's 7th, the cuDNN op's 7th
  bool known = false;
  // (the backward ops: flash's and efficient's 12th input, cuDNN's 15th, in ATen's native_functions.yaml)
  const std::size_t at = name == "aten::_scaled_dot_product_flash_attention"                     ? 4
                         : name == "aten::_scaled_dot_product_efficient_attention"                ? 6
                         : name == "aten::_scaled_dot_product_cudnn_attention"                    ? 6
                         : name == "aten::_scaled_dot_product_flash_attention_backward"           ? 11
                         : name == "aten::_scaled_dot_product_efficient_attention_backward"       ? 11
                         : name == "aten::_scaled_dot_product_cudnn_attention_backward"           ? 14
                                                                                                  : 99;
  const bool causal = truth(s, at, known);
  w.assumed = !known;
  w.flops = (causal ? 0.5 : 1.0) * fwd * (bwd ? 2.5 : 1.0);
  const double es = elem_bytes(type(s, q0));
  w.bytes = es * (numel(q) + numel(k) + numel(v) + numel(q)) * (bwd ? 2 : 1);
  w.dtype = readers::to_string(type(s, q0));
  return w;
}

}  // namespace

OpWork op_work(const std::string& name, const readers::OpShape& s) {
  if (name == "aten::convolution") return conv(s, false);
  if (name == "aten::convolution_backward") return conv(s, true);
  if (name.find("attention") != std::string::npos) return attention(name, s);
  OpWork w;
  w.category = "gemm";
  const bool bias = name == "aten::addmm" || name == "aten::baddbmm" || name == "aten::_addmm_activation";
  const std::size_t a = bias ? 1 : 0;
  const auto& A = dim(s, a);
  const auto& B = dim(s, a + 1);
  const bool batched = name == "aten::bmm" || name == "aten::baddbmm";
  if (batched ? (A.size() != 3 || B.size() != 3 || A[0] != B[0] || A[2] != B[1])
              : (A.size() != 2 || B.size() != 2 || A[1] != B[0]))
    return w;
  const double b = batched ? double(A[0]) : 1, m = double(A[batched ? 1 : 0]), kk = double(A[batched ? 2 : 1]),
               n = double(B[batched ? 2 : 1]);
  w.flops = 2 * b * m * n * kk;
  const double es = elem_bytes(type(s, a));
  w.bytes = es * (b * (m * kk + kk * n + m * n) + (bias ? numel(dim(s, 0)) : 0));
  w.dtype = readers::to_string(type(s, a));
  return w;
}

json expected_for_trace(const readers::Trace& t) {
  if (t.device_properties.empty() || !t.device_properties[0].is_object()) return nullptr;
  const std::string name = t.device_properties[0].value("name", std::string());
  if (name.empty()) return nullptr;
  for (const auto& f : load_expected_files()) {
    const json& m = f.doc.value("/hardware/match"_json_pointer, json::object());
    if (!m.contains("name_contains") || !m["name_contains"].is_array()) continue;
    for (const auto& s : m["name_contains"])
      if (s.is_string() && name.find(s.get<std::string>()) != std::string::npos) return f.doc;
  }
  return nullptr;
}

Roofline roofline(const readers::Trace& t, const json& peaks) {
  Roofline r;
  // each correlation's GPU time and its kernels' dtype (from their names)
  std::unordered_map<std::int64_t, std::pair<double, std::string>> by_corr;
  for (const auto& e : t.events)
    if (e.is_gpu()) {
      if (e.cat == readers::Cat::kernel) r.kernel_us += e.dur;
      if (e.correlation < 0) continue;
      auto& c = by_corr[e.correlation];
      c.first += e.dur;
      if (c.second.empty() && e.cat == readers::Cat::kernel) c.second = readers::gemm_dtype(t.name(e));
    }
  // the runtime calls of each thread, by start
  std::map<std::pair<std::int64_t, std::int64_t>, std::vector<const readers::Event*>> rt;
  for (const auto& e : t.events)
    if ((e.cat == readers::Cat::cuda_runtime || e.cat == readers::Cat::cuda_driver) && e.correlation >= 0)
      rt[{e.pid, e.tid}].push_back(&e);
  for (auto& [k, v] : rt)
    std::sort(v.begin(), v.end(), [](const auto* a, const auto* b) { return a->ts < b->ts; });
  std::map<std::string, RooflineRow> groups;
  for (const auto& e : t.events) {
    if (e.shape == 0 || e.shape > t.shapes.size()) continue;
    const readers::OpShape& s = t.shapes[e.shape - 1];
    const std::string& name = t.name(e);
    const OpWork w = op_work(name, s);
    if (w.flops <= 0) continue;
    ++r.ops_with_shapes;
    double gpu = 0;
    std::string kd;
    auto it = rt.find({e.pid, e.tid});
    if (it != rt.end()) {
      auto lo = std::lower_bound(it->second.begin(), it->second.end(), e.ts,
                                 [](const readers::Event* x, double ts) { return x->ts < ts; });
      for (; lo != it->second.end() && (*lo)->ts <= e.end(); ++lo) {
        auto c = by_corr.find((*lo)->correlation);
        if (c == by_corr.end()) continue;
        gpu += c->second.first;
        if (kd.empty()) kd = c->second.second;
      }
    }
    if (gpu <= 0) {
      ++r.ops_without_gpu;  // a CPU op, or its kernels outside the trace
      continue;
    }
    std::vector<std::string> dims;
    for (const auto& d : s.dims)
      if (!d.empty()) dims.push_back(fmt::format("[{}]", fmt::join(d, ",")));
    const std::string shapes = fmt::format("{}", fmt::join(dims, " "));
    RooflineRow& row = groups[name + "|" + shapes + "|" + w.dtype];
    row.op = name, row.shapes = shapes, row.dtype = w.dtype, row.category = w.category;
    row.calls++;
    row.gpu_us += gpu, row.flops += w.flops, row.bytes += w.bytes;
    row.assumed = row.assumed || w.assumed;
    if (row.kernel_dtype.empty()) row.kernel_dtype = kd;
  }
  const bool have = peaks.is_object() && peaks.contains("peaks");
  if (have) {
    r.card = peaks.value("/hardware/name"_json_pointer, std::string());
    r.peak_bw_tbps = peaks.value("/peaks/memory_bandwidth/value"_json_pointer, 0.0) / 1e3;
    r.card_source = peaks.value("/peaks/memory_bandwidth/source"_json_pointer, std::string());
  }
  for (auto& [k, row] : groups) {
    row.tflops = row.flops / row.gpu_us / 1e6;
    row.tbps = row.bytes / row.gpu_us / 1e6;
    row.intensity = row.bytes > 0 ? row.flops / row.bytes : 0;
    if (have) {
      // an fp32 op whose kernels run TF32 is held against TF32's peak
      const std::string key = row.dtype == "f16" ? "fp16" : row.dtype == "f32" ? (row.kernel_dtype == "tf32" ? "tf32" : "fp32")
                              : row.dtype == "fp8" ? "fp8_e4m3" : row.dtype;
      row.peak_tflops = peaks.value(json::json_pointer("/peaks/tflops/" + key + "/value"), 0.0);
      row.peak_tbps = r.peak_bw_tbps;
      if (row.peak_tflops > 0 && row.peak_tbps > 0) {
        row.attainable_tflops = std::min(row.peak_tflops, row.peak_tbps * row.intensity);
        row.pct_of_attainable = row.attainable_tflops > 0 ? 100 * row.tflops / row.attainable_tflops : 0;
        row.bound = row.intensity >= row.peak_tflops / row.peak_tbps ? "compute" : "memory";
      }
    }
    r.counted_gpu_us += row.gpu_us;
    r.flops += row.flops;
    r.rows.push_back(row);
  }
  std::sort(r.rows.begin(), r.rows.end(), [](const auto& a, const auto& b) { return a.gpu_us > b.gpu_us; });
  return r;
}

const RooflineRow* holds_back(const Roofline& r) {
  const RooflineRow* best = nullptr;
  double lost = 0;
  for (const auto& x : r.rows) {
    const double l = x.pct_of_attainable > 0 ? x.gpu_us * std::max(0.0, 1 - x.pct_of_attainable / 100) : x.gpu_us;
    if (l > lost) lost = l, best = &x;
  }
  return best;
}

std::string fix_hint(const RooflineRow& x) {
  if (x.dtype == "f32" && x.kernel_dtype != "tf32")
    return "fp32 without Tensor Cores: bf16 autocast (Ampere and newer; fp16 with loss scaling on Volta and Turing), "
           "or TF32 on Ampere and newer (torch.backends.cuda.matmul.allow_tf32)";
  if (x.category == "attention")
    return "already a fused attention kernel: at short sequences and small heads it runs far from the peak; longer "
           "sequences (sample packing) raise its efficiency";
  if (x.category == "gemm" && x.op.find("bmm") != std::string::npos && x.bound == "memory")
    return "a batched GEMM bound by its memory traffic: if it is attention's QK^T or PV, a fused kernel (SDPA, "
           "flash) never writes the scores";
  if (x.bound == "memory")
    return "memory-bound at this shape: a larger micro batch (more rows per weight read), or fusing it with its "
           "neighbours (torch.compile)";
  if (x.bound == "compute" && x.pct_of_attainable < 50)
    return "compute-bound yet under half the peak: shapes that tile badly (dims not multiples of 64), or many small "
           "calls: larger or padded shapes";
  if (x.bound.empty()) return "no peak for this card in results/expected: achieved figures only";
  return "near its roofline: the op itself is not what to fix";
}

json to_json(const Roofline& r, std::size_t top) {
  json rows = json::array();
  for (std::size_t i = 0; i < r.rows.size() && i < top; ++i) {
    const auto& x = r.rows[i];
    rows.push_back({{"op", x.op},
                    {"shapes", x.shapes},
                    {"dtype", x.dtype},
                    {"kernel_dtype", x.kernel_dtype},
                    {"category", x.category},
                    {"calls", x.calls},
                    {"gpu_ms", x.gpu_us / 1e3},
                    {"gflop", x.flops / 1e9},
                    {"tflops", x.tflops},
                    {"tbps", x.tbps},
                    {"flop_per_byte", x.intensity},
                    {"peak_tflops", x.peak_tflops},
                    {"attainable_tflops", x.attainable_tflops},
                    {"pct_of_attainable", x.pct_of_attainable},
                    {"bound", x.bound},
                    {"assumed", x.assumed}});
  }
  json cats = json::object();
  for (const auto& x : r.rows) {
    json& c = cats[x.category];
    if (c.is_null()) c = json{{"gpu_ms", 0.0}, {"gflop", 0.0}, {"gb", 0.0}};
    c["gpu_ms"] = c["gpu_ms"].get<double>() + x.gpu_us / 1e3;
    c["gflop"] = c["gflop"].get<double>() + x.flops / 1e9;
    c["gb"] = c["gb"].get<double>() + x.bytes / 1e9;
  }
  for (auto& [k, c] : cats.items()) {
    const double ms = c["gpu_ms"].get<double>();
    c["tflops"] = ms > 0 ? c["gflop"].get<double>() / ms : 0;  // GFLOP / ms = TFLOP/s
    c["tbps"] = ms > 0 ? c["gb"].get<double>() / ms : 0;        // GB / ms = TB/s
  }
  json hb = nullptr;
  if (const RooflineRow* h = holds_back(r))
    hb = json{{"op", h->op}, {"shapes", h->shapes}, {"dtype", h->dtype}, {"gpu_ms", h->gpu_us / 1e3},
              {"pct_of_attainable", h->pct_of_attainable}, {"fix", fix_hint(*h)}};
  return json{{"card", r.card},
              {"peak_memory_tbps", r.peak_bw_tbps},
              {"counted_gpu_ms", r.counted_gpu_us / 1e3},
              {"kernel_ms", r.kernel_us / 1e3},
              {"counted_pct_of_kernel_time", r.kernel_us > 0 ? 100 * r.counted_gpu_us / r.kernel_us : 0},
              {"ops_counted", r.ops_with_shapes},
              {"ops_without_gpu_time", r.ops_without_gpu},
              {"categories", cats},
              {"holds_back", hb},
              {"rows", rows}};
}

}  // namespace sb::diagnose
