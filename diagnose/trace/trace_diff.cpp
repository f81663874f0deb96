// diagnose --trace NEW --baseline OLD (trace_diff.hpp).
#include "diagnose/trace/trace_diff.hpp"

#include <algorithm>  // std::sort, std::max, std::min
#include <cmath>      // std::abs
#include <limits>     // std::numeric_limits
#include <map>        // std::map
#include <set>        // std::set
#include <vector>     // std::vector

#include <fmt/format.h>  // fmt::format

#include "diagnose/trace/host_attribution.hpp"  // find_iterations, steps_over, attribute_host
#include "diagnose/trace/intervals.hpp"         // merged, length, intersected, median
#include "diagnose/trace/trace_analysis.hpp"    // analyze, hta_rows, kernel_type, gemm_dtype

namespace sb::diagnose {
namespace {

using json = nlohmann::ordered_json;
namespace iv = readers::intervals;
using readers::Cat;

struct Use {
  double us = 0, calls = 0;
};

struct Profile {
  std::string path, steps_source, device_name;
  double steps = 0, step_us = 0, lo = 0, hi = 0;
  bool gpu = false;
  double compute_us = 0, comm_us = 0, copy_us = 0, idle_us = 0;  // per step (GPU)
  std::map<std::string, double> idle_by_cause;                  // per step (GPU)
  std::map<std::string, Use> kernels, ops;                      // per step: kernel families; CPU ops' self time
  std::map<std::string, double> gemm_by_dtype;                  // per step
  double gemm_us = 0, loader_us = 0;
  std::string loader_iter;
  Use sync, alloc;
  std::string sync_name;  // the op the syncs come from ("aten::item", "cudaStreamSynchronize", ...)
};

bool starts(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// "void at::native::vectorized_elementwise_kernel<4, ...>(...)" -> "at::native::vectorized_elementwise_kernel"
std::string family(std::string n) {
  if (starts(n, "void ")) n.erase(0, 5);
  return n.substr(0, n.find_first_of("(<"));
}

bool is_sync(const std::string& n) {
  return n == "aten::_local_scalar_dense" || n == "cudaStreamSynchronize" || n == "cudaDeviceSynchronize" ||
         n == "cudaEventSynchronize" || n == "hipStreamSynchronize" || n == "hipDeviceSynchronize" ||
         n == "hipEventSynchronize" || n == "cudaMemcpy" || n == "hipMemcpy";
}
bool is_alloc(const std::string& n) {
  return n == "cudaMalloc" || n == "cudaFree" || n == "hipMalloc" || n == "hipFree" || n == "cudaMallocHost" ||
         n == "cudaFreeHost" || n == "hipHostMalloc" || n == "hipHostFree" || n == "cudaMallocAsync" ||
         n == "cudaFreeAsync";
}
bool is_cpu_gemm(const std::string& n) {
  return n == "aten::mm" || n == "aten::addmm" || n == "aten::bmm" || n == "aten::baddbmm" ||
         n == "aten::_addmm_activation" || n == "aten::mkldnn_convolution";  // not aten::_convolution: its parent
}

// The CPU side: every op's self time (its time less its children's, per thread) and calls; the syncs, the
// allocator's calls and (no GPU) the GEMM ops by their input's element type.
void cpu_side(const readers::Trace& t, const readers::HtaRows& rows, Profile& p) {
  std::map<std::int64_t, std::vector<std::size_t>> by_tid;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const auto& e = t.events[i];
    if (e.is_gpu() || e.cat == Cat::other || e.cat == Cat::gpu_user_annotation) continue;
    if (rows.ts[i] < p.lo || rows.ts[i] >= p.hi) continue;
    if (starts(t.name(e), "ProfilerStep#")) continue;
    by_tid[e.tid].push_back(i);
  }
  for (auto& [tid, v] : by_tid) {
    std::sort(v.begin(), v.end(), [&](std::size_t a, std::size_t b) {
      return rows.ts[a] < rows.ts[b] || (rows.ts[a] == rows.ts[b] && rows.te[a] > rows.te[b]);
    });
    std::vector<std::size_t> stack;
    std::vector<double> self(v.size());
    std::map<std::size_t, std::size_t> pos;
    for (std::size_t k = 0; k < v.size(); ++k) {
      const std::size_t i = v[k];
      while (!stack.empty() && rows.te[v[stack.back()]] <= rows.ts[i]) stack.pop_back();
      self[k] = rows.te[i] - rows.ts[i];
      if (!stack.empty()) self[stack.back()] -= std::min(rows.te[i], rows.te[v[stack.back()]]) - rows.ts[i];
      stack.push_back(k);
    }
    for (std::size_t k = 0; k < v.size(); ++k) {
      const auto& e = t.events[v[k]];
      const std::string& n = t.name(e);
      Use& u = p.ops[n];
      u.us += std::max(0.0, self[k]), u.calls += 1;
      if (is_alloc(n)) p.alloc.us += e.dur, p.alloc.calls += 1;
      if (!p.gpu && is_cpu_gemm(n)) {
        const std::string dt = readers::to_string(e.input_type);
        p.gemm_by_dtype[dt.empty() ? "unknown" : dt] += e.dur;
        p.gemm_us += e.dur;
      }
    }
  }
  // syncs: every .item() goes through aten::_local_scalar_dense; without it, the runtime's sync calls
  const bool dense = p.ops.count("aten::_local_scalar_dense") > 0;
  for (const auto& [n, u] : p.ops)
    if (is_sync(n) && (n == "aten::_local_scalar_dense" || !dense)) {
      p.sync.calls += u.calls;
      if (p.sync_name.empty()) p.sync_name = n;
    }
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const auto& e = t.events[i];
    if (e.is_gpu() || rows.ts[i] < p.lo || rows.ts[i] >= p.hi) continue;
    if (is_sync(t.name(e)) && (t.name(e) == "aten::_local_scalar_dense" || !dense)) p.sync.us += e.dur;
  }
}

void gpu_side(const readers::Trace& t, const readers::TraceAnalysis& a, const readers::HtaRows& rows,
              const readers::Iterations& its, Profile& p) {
  const readers::Temporal* dev = nullptr;
  for (const auto& d : a.temporal)
    if (!dev || d.kernel_us > dev->kernel_us) dev = &d;
  if (!dev) return;
  p.gpu = true;
  std::vector<iv::Interval> comp, comm, copy, all;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const auto& e = t.events[i];
    if (!e.is_gpu() || rows.te[i] <= p.lo || rows.ts[i] >= p.hi) continue;
    const iv::Interval x{std::max(rows.ts[i], p.lo), std::min(rows.te[i], p.hi)};
    const std::string& n = t.name(e);
    Use& u = p.kernels[family(n)];
    u.us += e.dur, u.calls += 1;
    if (e.pid != dev->device) continue;
    all.push_back(x);
    const auto k = e.cat == Cat::kernel ? readers::kernel_type(n) : readers::KernelType::memory;
    (k == readers::KernelType::computation     ? comp
     : k == readers::KernelType::communication ? comm
                                               : copy)
        .push_back(x);
    if (e.cat == Cat::kernel) {
      const std::string dt = readers::gemm_dtype(n);
      if (!dt.empty()) p.gemm_by_dtype[dt] += e.dur, p.gemm_us += e.dur;
    }
  }
  p.compute_us = iv::length(iv::merged(comp));
  p.comm_us = iv::length(iv::merged(comm));
  p.copy_us = iv::length(iv::merged(copy));
  p.idle_us = (p.hi - p.lo) - iv::length(iv::merged(all));
  const readers::HostAttribution h = readers::attribute_host(t, a, rows, its, dev->device);
  for (std::size_t c = 0; c < readers::kHostCauses; ++c)
    if (h.by_cause[c] > 0) p.idle_by_cause[readers::to_string(readers::HostCause(c))] += h.by_cause[c];
  if (!t.device_properties.empty() && t.device_properties[0].is_object())
    p.device_name = t.device_properties[0].value("name", std::string());
}

Profile profile(const TraceRead& tr, const readers::TraceAnalysis& a) {
  const readers::Trace& t = tr.trace;
  Profile p;
  p.path = tr.path;
  const readers::HtaRows rows = readers::hta_rows(t);
  const readers::Iterations its = readers::find_iterations(t, rows);
  std::vector<std::pair<double, double>> spans(its.spans.begin() + std::ptrdiff_t(its.warmup), its.spans.end());
  if (!spans.empty()) {
    p.steps_source = its.source;
    p.lo = spans.front().first, p.hi = spans.back().second;
    std::vector<double> d;
    for (const auto& [a0, b0] : spans) d.push_back(b0 - a0);
    p.steps = double(spans.size());
    p.step_us = iv::median(d);
  } else {
    p.steps_source = "the whole trace (no iterations found)";
    p.lo = std::numeric_limits<double>::infinity(), p.hi = -p.lo;
    for (std::size_t i = 0; i < t.events.size(); ++i) p.lo = std::min(p.lo, rows.ts[i]), p.hi = std::max(p.hi, rows.te[i]);
    if (t.events.empty()) p.lo = p.hi = 0;
    p.steps = 1;
    p.step_us = p.hi - p.lo;
  }
  gpu_side(t, a, rows, its, p);
  cpu_side(t, rows, p);
  if (!spans.empty()) {
    const readers::Steps s = readers::steps_over(t, rows, spans);
    p.loader_us = s.dataloader_exposed_us;
    p.loader_iter = s.loader_iter;
  }
  // everything per step
  const double n = std::max(1.0, p.steps);
  for (double* x : {&p.compute_us, &p.comm_us, &p.copy_us, &p.idle_us, &p.gemm_us, &p.loader_us, &p.sync.us,
                    &p.sync.calls, &p.alloc.us, &p.alloc.calls})
    *x /= n;
  for (auto* m : {&p.kernels, &p.ops})
    for (auto& [k, u] : *m) u.us /= n, u.calls /= n;
  for (auto* m : {&p.idle_by_cause, &p.gemm_by_dtype})
    for (auto& [k, v] : *m) v /= n;
  return p;
}

// The dtype most GEMM time ran in; "" when the trace does not say (no record_shapes on a CPU, or GEMM kernels
// whose names give none), so that a trace without shapes is no dtype change.
std::string dominant(const std::map<std::string, double>& m) {
  std::string best;
  double v = 0, unknown = 0;
  for (const auto& [k, x] : m) {
    if (k == "unknown" || k.empty()) {
      unknown += x;
      continue;
    }
    if (x > v) v = x, best = k;
  }
  return v >= unknown ? best : std::string();
}

struct Change {
  std::string cause, what, line;
  double delta_us = 0;  // per step: now - base
  json detail = json::object();
};

double get(const std::map<std::string, double>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? 0 : it->second;
}

void named_changes(const Profile& now, const Profile& base, std::vector<Change>& out) {
  const double scale = std::max(base.step_us, 1.0);
  // the GEMMs' element type
  const std::string d0 = dominant(base.gemm_by_dtype), d1 = dominant(now.gemm_by_dtype);
  if (!d0.empty() && !d1.empty() && d0 != d1) {
    const bool lost_tf32 = d0 == "tf32" && d1 == "f32";
    const bool widened = !lost_tf32 && (d1 == "f32" || d1 == "tf32" || d1 == "f64") && d0 != "f32" && d0 != "f64";
    out.push_back({"the GEMMs' dtype changed",
                   fmt::format("the GEMMs now run in {} (were {}): {:.2f} ms of GEMM per step against {:.2f}{}", d1, d0,
                               now.gemm_us / 1e3, base.gemm_us / 1e3,
                               lost_tf32 ? "; TF32 is off in the new run"
                               : widened ? "; autocast or bf16/fp16 is off in the new run"
                                         : ""),
                   lost_tf32 ? "torch.backends.cuda.matmul.allow_tf32 = True  # as the baseline ran (tf32: true)"
                   : widened ? "bf16: true  # as the baseline ran (or torch.autocast back on)"
                             : "the dtype the baseline ran in, where it was faster",
                   now.gemm_us - base.gemm_us,
                   {{"base_dtype", d0}, {"now_dtype", d1}}});
  }
  // the loader
  const double dl = now.loader_us - base.loader_us;
  if (std::abs(dl) >= std::max(0.03 * scale, 500.0) || (now.loader_iter != base.loader_iter && !now.loader_iter.empty() &&
                                                        !base.loader_iter.empty())) {
    std::string iter;
    if (now.loader_iter != base.loader_iter && !now.loader_iter.empty() && !base.loader_iter.empty())
      iter = now.loader_iter == "single" ? "; the loader now runs in the training process (_SingleProcessDataLoaderIter: "
                                           "num_workers 0; the baseline had workers)"
                                         : "; the loader now has workers (_MultiProcessingDataLoaderIter; the baseline ran it "
                                           "in the training process)";
    out.push_back({"the DataLoader's wait changed",
                   fmt::format("the step waits {:.2f} ms per step on the DataLoader's __next__ (baseline {:.2f}){}",
                               now.loader_us / 1e3, base.loader_us / 1e3, iter),
                   now.loader_iter == "single" && base.loader_iter == "multi"
                       ? "dataloader_num_workers: as the baseline had (more than 0)"
                       : "dataloader_num_workers: more, or the baseline's dataset and transforms",
                   dl,
                   {{"base_iter", base.loader_iter}, {"now_iter", now.loader_iter}}});
  }
  // a synchronization in the step
  if (now.sync.calls >= base.sync.calls + 0.5) {
    const double idle = get(now.idle_by_cause, "sync") - get(base.idle_by_cause, "sync");
    out.push_back({"a new synchronization in the step",
                   fmt::format("{:.1f} {} per step (baseline {:.1f}): each blocks the host until the device is done "
                               "(.item(), printing or logging a loss, a bool of a tensor){}{}",
                               now.sync.calls, now.sync_name.empty() ? "sync calls" : now.sync_name + " calls",
                               base.sync.calls,
                               now.gpu ? fmt::format("; the GPU's idle time in syncs {:+.2f} ms per step", idle / 1e3)
                                       : "",
                               now.gpu ? "" : "; on a CPU it waits for nothing, on a GPU it drains the queue each step"),
                   "drop the .item() (or log every N steps, on a detached tensor)",
                   // on a GPU the call's own length is the host waiting for work already queued, paid anyway: its
                   // cost is the GPU's idle after it; on a CPU there is no queue, its length is all it costs
                   now.gpu ? idle : now.sync.us - base.sync.us,
                   {{"calls_per_step", now.sync.calls}, {"baseline_calls_per_step", base.sync.calls}}});
  }
  // allocator churn
  if (now.alloc.calls >= base.alloc.calls + 1 && now.alloc.us - base.alloc.us >= 0.01 * scale)
    out.push_back({"allocator churn appeared",
                   fmt::format("{:.1f} cudaMalloc/cudaFree-like calls per step (baseline {:.1f}), {:.2f} ms per step: "
                               "the caching allocator is bypassed or emptied (PYTORCH_NO_CUDA_MEMORY_CACHING, "
                               "torch.cuda.empty_cache() in the loop)",
                               now.alloc.calls, base.alloc.calls, now.alloc.us / 1e3),
                   "drop torch.cuda.empty_cache() from the step; unset PYTORCH_NO_CUDA_MEMORY_CACHING",
                   now.alloc.us - base.alloc.us});
  // communication
  if (now.gpu && base.gpu && std::abs(now.comm_us - base.comm_us) >= 0.05 * scale)
    out.push_back({"communication changed",
                   fmt::format("communication kernels {:.2f} ms per step (baseline {:.2f})", now.comm_us / 1e3,
                               base.comm_us / 1e3),
                   "the baseline's DDP buckets, NCCL settings and world size", now.comm_us - base.comm_us});
  // another convolution algorithm: conv kernels in one run and not in the other, both runs convolving
  auto conv = [](const std::string& n) {
    for (const char* k : {"conv", "implicit_gemm", "implicit_convolve", "winograd", "fprop", "dgrad", "wgrad", "igemm",
                          "scudnn", "cudnn"})
      if (n.find(k) != std::string::npos) return true;
    return false;
  };
  double gone = 0, came = 0, came_top = 0, gone_top = 0;
  std::string came_name, gone_name;  // the largest of each side
  for (const auto& [k, u] : now.kernels)
    if (conv(k) && !base.kernels.count(k)) {
      came += u.us;
      if (u.us > came_top) came_top = u.us, came_name = k;
    }
  for (const auto& [k, u] : base.kernels)
    if (conv(k) && !now.kernels.count(k)) {
      gone += u.us;
      if (u.us > gone_top) gone_top = u.us, gone_name = k;
    }
  if (came > 0 && gone > 0 && came + gone >= 0.02 * scale)
    out.push_back({"another convolution algorithm",
                   fmt::format("convolution kernels appeared and others went: {} and the like ({:.2f} ms per step) "
                               "where the baseline ran {} and the like ({:.2f} ms): cuDNN picked another algorithm (a "
                               "new cuDNN or PyTorch, torch.backends.cudnn.benchmark, another shape or layout)",
                               came_name, came / 1e3, gone_name, gone / 1e3),
                   "torch.backends.cudnn.benchmark = True, or the baseline's cuDNN", came - gone});
}

// The kernels and ops that grew most, appeared or went (|Δ| per step), the top n.
json movers(const std::map<std::string, Use>& now, const std::map<std::string, Use>& base, std::size_t n) {
  std::set<std::string> keys;
  for (const auto& [k, u] : now) keys.insert(k);
  for (const auto& [k, u] : base) keys.insert(k);
  std::vector<std::pair<double, std::string>> d;
  for (const auto& k : keys) {
    const double a = now.count(k) ? now.at(k).us : 0, b = base.count(k) ? base.at(k).us : 0;
    d.push_back({a - b, k});
  }
  std::sort(d.begin(), d.end(), [](const auto& x, const auto& y) { return std::abs(x.first) > std::abs(y.first); });
  json out = json::array();
  for (std::size_t i = 0; i < d.size() && i < n; ++i) {
    const auto& k = d[i].second;
    const bool in_now = now.count(k), in_base = base.count(k);
    out.push_back({{"name", k},
                   {"delta_ms_per_step", d[i].first / 1e3},
                   {"now_ms_per_step", in_now ? now.at(k).us / 1e3 : 0},
                   {"base_ms_per_step", in_base ? base.at(k).us / 1e3 : 0},
                   {"now_calls_per_step", in_now ? now.at(k).calls : 0},
                   {"base_calls_per_step", in_base ? base.at(k).calls : 0},
                   {"status", !in_base ? "appeared" : !in_now ? "went" : "changed"}});
  }
  return out;
}

std::string movers_line(const json& m) {
  std::string s;
  for (const auto& x : m) {
    if (!s.empty()) s += ", ";
    s += fmt::format("{} {:+.2f} ms{}", x["name"].get<std::string>(), x["delta_ms_per_step"].get<double>(),
                     x["status"] == "changed" ? "" : " (" + x["status"].get<std::string>() + ")");
  }
  return s;
}

json profile_json(const Profile& p) {
  json j{{"path", p.path},         {"iterations", p.steps_source}, {"steps", p.steps},
         {"step_ms", p.step_us / 1e3}, {"gpu", p.gpu},             {"device", p.device_name},
         {"gemm_ms_per_step", p.gemm_us / 1e3}, {"loader_ms_per_step", p.loader_us / 1e3},
         {"loader_iter", p.loader_iter}, {"sync_calls_per_step", p.sync.calls},
         {"alloc_calls_per_step", p.alloc.calls}};
  if (p.gpu) {
    j["compute_ms_per_step"] = p.compute_us / 1e3;
    j["communication_ms_per_step"] = p.comm_us / 1e3;
    j["copies_ms_per_step"] = p.copy_us / 1e3;
    j["idle_ms_per_step"] = p.idle_us / 1e3;
    json c = json::object();
    for (const auto& [k, v] : p.idle_by_cause) c[k] = v / 1e3;
    j["idle_ms_per_step_by_host_cause"] = c;
  }
  json g = json::object();
  for (const auto& [k, v] : p.gemm_by_dtype) g[k] = v / 1e3;
  j["gemm_ms_per_step_by_dtype"] = g;
  return j;
}

Point category_point(const Profile& now, const Profile& base) {
  Point p;
  p.params = json{{"check", "breakdown"}};
  std::vector<std::pair<std::string, double>> cats;
  if (now.gpu && base.gpu) {
    cats = {{"GPU compute", now.compute_us - base.compute_us},
            {"communication", now.comm_us - base.comm_us},
            {"copies", now.copy_us - base.copy_us}};
    std::set<std::string> causes;
    for (const auto& [k, v] : now.idle_by_cause) causes.insert(k);
    for (const auto& [k, v] : base.idle_by_cause) causes.insert(k);
    for (const auto& k : causes) cats.push_back({"idle: " + k, get(now.idle_by_cause, k) - get(base.idle_by_cause, k)});
  } else {
    cats = {{"GEMM ops", now.gemm_us - base.gemm_us},
            {"DataLoader wait", now.loader_us - base.loader_us},
            {"syncs", now.sync.us - base.sync.us},
            {"allocator", now.alloc.us - base.alloc.us}};
    const double rest = (now.step_us - base.step_us) - (cats[0].second + cats[1].second + cats[2].second + cats[3].second);
    cats.push_back({"the rest of the step", rest});
  }
  std::stable_sort(cats.begin(), cats.end(), [](const auto& a, const auto& b) { return std::abs(a.second) > std::abs(b.second); });
  std::string s;
  json j = json::object();
  for (const auto& [k, v] : cats) {
    j[k] = v / 1e3;
    if (std::abs(v) < 0.005 * std::max(base.step_us, 1.0)) continue;
    s += fmt::format("{}{} {:+.2f} ms", s.empty() ? "" : ", ", k, v / 1e3);
  }
  p.info["delta_ms_per_step"] = j;
  p.info["reading"] = s.empty() ? "no category moved by 0.5% of the step" : "per step: " + s;
  return p;
}

}  // namespace

Result diagnose_diff(const TraceRead& now_read, const TraceRead& base_read, const json& meta) {
  const readers::TraceAnalysis an = readers::analyze(now_read.trace), ab = readers::analyze(base_read.trace);
  Result r = diagnose_read(now_read, an, meta);  // the new trace's own diagnosis: its meta and checks
  const Profile now = profile(now_read, an), base = profile(base_read, ab);
  r.meta["diagnose"]["trace"] = fmt::format("{} against {}", now_read.path, base_read.path);
  r.meta["baseline"] = json{{"path", base_read.path}, {"events_kept", base_read.trace.events.size()}};
  const double d = now.step_us - base.step_us;
  Point step;
  step.params = json{{"check", "step"}};
  step.add({"step_ms", now.step_us / 1e3, "ms", Direction::lower, std::nullopt, "median iteration, the new trace"});
  step.add({"baseline_step_ms", base.step_us / 1e3, "ms", Direction::lower, std::nullopt, "median iteration, the baseline"});
  step.add({"step_ratio", base.step_us > 0 ? now.step_us / base.step_us : 0, "x", Direction::lower, std::nullopt,
            "new step time over the baseline's: over 1 is slower"});
  step.info["reading"] = fmt::format("{:.2f} ms per step against {:.2f} ({:+.2f} ms, {:.2f}x the baseline's time; "
                                     "iterations: {} / {})",
                                     now.step_us / 1e3, base.step_us / 1e3, d / 1e3,
                                     base.step_us > 0 ? now.step_us / base.step_us : 0, now.steps_source,
                                     base.steps_source);
  Point kern;
  kern.params = json{{"check", "kernels and ops"}};
  const json km = movers(now.kernels, base.kernels, 6), om = movers(now.ops, base.ops, 6);
  kern.info["kernels"] = km;
  kern.info["ops"] = om;
  kern.info["reading"] = fmt::format("{}{}{}", km.empty() ? "" : "kernels: " + movers_line(km), km.empty() ? "" : "; ",
                                     "CPU ops (self time per step): " + movers_line(om));
  std::vector<Change> ch;
  named_changes(now, base, ch);
  std::stable_sort(ch.begin(), ch.end(), [](const Change& a, const Change& b) {
    return std::abs(a.delta_us) > std::abs(b.delta_us);
  });
  std::vector<Point> pts{step, category_point(now, base), kern};
  std::vector<Finding> found;
  for (const Change& c : ch) {
    const double share = std::abs(d) > 0 ? c.delta_us / d : 0;
    // reverting the change gives back its time, when it added some
    std::optional<double> gain;
    if (c.delta_us > 0 && now.step_us > c.delta_us && now.step_us / (now.step_us - c.delta_us) >= 1.005)
      gain = now.step_us / (now.step_us - c.delta_us);
    // a change whose time is under 0.5% of the step is named for what it is, not for a share of the change
    const bool small = std::abs(c.delta_us) < 0.005 * std::max(base.step_us, 1.0);
    json ev{{"check", "baseline"},
            {"config_line", c.line},
            {"evidence", c.what},
            {"delta_ms_per_step", c.delta_us / 1e3},
            {"share_of_step_change", share},
            {"basis", "measured"},
            {"estimated", false},
            {"detail", c.detail}};
    found.push_back({c.cause,
                     fmt::format("{:+.2f} ms per step ({}{}): {}{}", c.delta_us / 1e3,
                                 small ? "under 0.5% of the step: what changed, not what it cost here"
                                 : c.delta_us > 0 ? "slower"
                                                  : "faster",
                                 std::abs(d) > 0 && !small
                                     ? fmt::format(", {:.0f}% of the step's {:+.2f} ms", 100 * share, d / 1e3)
                                     : "",
                                 c.what, gain ? fmt::format("; reverting it: up to {:.2f}x", *gain) : ""),
                     gain, ev});
  }
  if (found.empty())
    found.push_back({"no named change",
                     fmt::format("{:+.2f} ms per step; no rule names the change: the breakdown and the kernels and ops "
                                 "that moved are in the checks above",
                                 d / 1e3),
                     std::nullopt, json::object()});
  r.meta["diff"] = json{{"now", profile_json(now)},
                        {"baseline", profile_json(base)},
                        {"step_delta_ms", d / 1e3},
                        {"kernels", km},
                        {"ops", om}};
  // the new trace's own checks stay beside the comparison
  pts.insert(pts.end(), r.points.begin(), r.points.end());
  r.points = pts;
  std::vector<Finding> own = r.findings;
  r.findings = found;
  for (auto& f : own)
    if (f.cause != "none found") {
      f.summary = "(the new trace alone) " + f.summary;
      r.findings.push_back(f);
    }
  return r;
}

}  // namespace sb::diagnose
