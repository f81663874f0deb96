// The trace's figures (definitions in trace_analysis.hpp and
// docs/trace-analysis.md).
#include "diagnose/trace/trace_analysis.hpp"
#include "diagnose/trace/intervals.hpp"  // merged, length, overlap, intersected

#include <algorithm>      // std::sort, std::max, std::min
#include <cmath>          // std::ceil, std::floor
#include <limits>         // std::numeric_limits
#include <unordered_set>  // std::unordered_set
#include <string_view>    // std::string_view
#include <unordered_map>  // std::unordered_map

namespace sb::readers {
namespace {

using json = nlohmann::ordered_json;
using intervals::Interval;
using intervals::merged;
using intervals::length;
using intervals::overlap;
using intervals::intersected;
using intervals::median;

bool contains(std::string_view s, std::string_view what) { return s.find(what) != std::string_view::npos; }

std::string lower(std::string_view s) {
  std::string o(s);
  for (char& c : o)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return o;
}


// HTA's launch calls (cuda_kernel_analysis.py), and ROCm's, which HTA 0.5 does not know.
bool launch_call(std::string_view n) {
  return n == "cudaLaunchKernel" || n == "cudaLaunchKernelExC" || n == "cudaMemcpyAsync" || n == "cudaMemsetAsync" ||
         n == "runFunction - job_prep_and_submit_for_execution" || n == "hipLaunchKernel" ||
         n == "hipExtLaunchKernel" || n == "hipModuleLaunchKernel" || n == "hipExtModuleLaunchKernel" ||
         n == "hipMemcpyAsync" || n == "hipMemsetAsync" || n == "hipMemcpyWithStream";
}

}  // namespace

const StreamIdle* busiest_stream(const std::vector<StreamIdle>& idle, std::int64_t device) {
  const StreamIdle* best = nullptr;
  for (const auto& s : idle)
    if (s.device == device && (!best || s.busy_us > best->busy_us)) best = &s;
  return best;
}

KernelType kernel_type(const std::string& name) {
  const std::string_view n(name);
  auto starts = [&](std::string_view p) { return n.substr(0, p.size()) == p; };
  if (starts("nccl") && n.find("Kernel", 4) != std::string_view::npos) return KernelType::communication;
  if (starts("Memcpy") || starts("Memset") || starts("dma")) return KernelType::memory;
  if (contains(n, "Memcpy") || contains(n, "Sync")) return KernelType::other;
  return KernelType::computation;
}

std::string gemm_dtype(const std::string& name) {
  const std::string n = lower(name);
  // cuBLAS / CUTLASS / cuDNN kernel names on NVIDIA GPUs, Tensile's (Cijk_) on AMD. cuDNN's own
  // kernels count where they are its convolutions (implicit GEMM, Winograd, its sgemm-like scudnn),
  // not its batch norm or layout transforms (cudnn::bn_bw_1C11_kernel_new, nchwToNhwcKernel: 46.5 of
  // the 87.7 ms of kernels read as "GEMM" in nccl_parser_config's A100 trace); FBGEMM's embedding,
  // permute and quantize kernels are no GEMMs either (88.8 of 156.3 ms in timeline_analysis's).
  const bool not_gemm = contains(n, "bn_fw") || contains(n, "bn_bw") || contains(n, "batch_norm") ||
                        contains(n, "batchnorm") || contains(n, "nchwtonhwc") || contains(n, "nhwctonchw") ||
                        contains(n, "split_embedding") || (contains(n, "fbgemm") && !contains(n, "cutlass"));
  const bool cudnn_math = contains(n, "cudnn") && (contains(n, "scudnn") || contains(n, "hcudnn") ||
                                                   contains(n, "convolve") || contains(n, "wgrad") ||
                                                   contains(n, "dgrad") || contains(n, "fprop") ||
                                                   contains(n, "winograd") || contains(n, "gemm"));
  const bool gemm = !not_gemm && (contains(n, "gemm") || contains(n, "gemv") || contains(n, "nvjet") || cudnn_math ||
                                  contains(n, "cutlass") || contains(n, "xmma") || contains(n, "cijk_"));
  if (!gemm) return "";
  if (contains(n, "e4m3") || contains(n, "e5m2") || contains(n, "fp8") || contains(n, "nvjet_q")) return "fp8";
  // The input type before the MMA shape: cuBLAS's ampere_fp16_s16816gemm_fp16_... and CUTLASS's
  // tensorop_f16_s1688gemm_f16_... are fp16 inputs with an fp32 accumulator (the "s"), bf16 likewise;
  // only an s1688/s16816 GEMM with no 16-bit input named is TF32 (fp32 inputs on tensor cores).
  if (contains(n, "bf16") || contains(n, "bfloat16") || contains(n, "_bbs_") || contains(n, "_bss_") ||
      contains(n, "nvjet_bsb") || contains(n, "nvjet_bss"))
    return "bf16";
  if (contains(n, "h884") || contains(n, "h1688") || contains(n, "h16816") || contains(n, "f16f16") ||
      contains(n, "fp16") || contains(n, "_f16_") || contains(n, "tensorop_f16") || contains(n, "__half") ||
      contains(n, "c10::half") || contains(n, "_hhs_") || contains(n, "_hss_") || contains(n, "nvjet_hs") ||
      contains(n, "nvjet_hh") || contains(n, "hcudnn") || contains(n, "h884cudnn"))
    return "f16";
  if (contains(n, "tf32") || contains(n, "s1688gemm") || contains(n, "s16816gemm") || contains(n, "nvjet_tst") ||
      contains(n, "nvjet_tss"))
    return "tf32";
  if (contains(n, "dgemm") || contains(n, "_db_") || contains(n, "double")) return "f64";
  if (contains(n, "i8i8") || contains(n, "imma") || contains(n, "int8")) return "i8";
  if (contains(n, "sgemm") || contains(n, "scudnn") || contains(n, "fp32") || contains(n, "f32f32_f32") || contains(n, "_sb_") ||
      contains(n, "nvjet_sss") || contains(n, "gemv2t_kernel_val<int, int, float") ||
      contains(n, "gemvx::kernel<int, int, float") || (contains(n, "gemmsn") && contains(n, "float")) ||
      contains(n, "<float, float") || contains(n, "cutlass_80_simt_sgemm") || (cudnn_math && contains(n, "<float,")))
    return "f32";
  return "unknown";
}

std::string attention_family(const std::string& name) {
  const std::string n = lower(name);
  if (contains(n, "log_softmax") || contains(n, "logsoftmax")) return "";  // the loss, not attention
  if (contains(n, "sdpa") || contains(n, "fort_native_sdpa") || contains(n, "cudnn_generated_fort") ||
      (contains(n, "fmha") && contains(n, "cudnn")))
    return "cudnn";
  if (contains(n, "flash_fwd") || contains(n, "flash_bwd") || contains(n, "flash::") || contains(n, "pytorch_flash") ||
      contains(n, "flashattn") || contains(n, "flash_attn"))
    return "flash";
  if (contains(n, "fmha_cutlass") || contains(n, "efficient_attention") || contains(n, "mem_eff") ||
      contains(n, "attentionkernel") || contains(n, "attentionbackwardkernel"))
    return "mem_efficient";
  if (contains(n, "softmax")) return "softmax";
  return "";
}

HtaRows hta_rows(const Trace& t, const AnalysisOptions& opt) {
  HtaRows r;
  // rounded to whole µs when any ts is a float
  const std::size_t n = t.events.size();
  r.ts.resize(n);
  r.te.resize(n);
  r.rounded = opt.hta_rounding && t.fractional_ts;
  for (std::size_t i = 0; i < n; ++i) {
    const Event& e = t.events[i];
    if (r.rounded) {
      r.ts[i] = std::ceil(e.ts);
      r.te[i] = r.ts[i] + (std::floor(e.ts + e.dur) - r.ts[i]);
    } else {
      r.ts[i] = e.ts;
      r.te[i] = e.ts + e.dur;
    }
  }
  // HTA's rows: GPU rows have args.stream >= 0 and a correlation; the iteration filter (two or more
  // ProfilerStep names): CPU rows before the last step's start, GPU rows whose correlation a kept CPU row has
  auto gpu_row = [&](const Event& e) { return e.stream >= 0 && e.correlation >= 0; };
  r.kept.assign(n, 1);
  std::vector<std::uint32_t> step_names;
  double last = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < n; ++i) {
    const Event& e = t.events[i];
    if (gpu_row(e) || !contains(t.name(e), "ProfilerStep")) continue;
    if (std::find(step_names.begin(), step_names.end(), e.name) == step_names.end()) step_names.push_back(e.name);
    last = std::max(last, r.ts[i]);
  }
  r.iteration_filter = opt.iteration_filter && step_names.size() >= 2;
  if (!r.iteration_filter) return r;
  std::unordered_set<std::int64_t> cpu_corr;
  for (std::size_t i = 0; i < n; ++i) {
    const Event& e = t.events[i];
    if (gpu_row(e)) continue;
    r.kept[i] = r.ts[i] < last;
    if (r.kept[i] && e.correlation >= 0) cpu_corr.insert(e.correlation);
  }
  for (std::size_t i = 0; i < n; ++i)
    if (gpu_row(t.events[i])) r.kept[i] = cpu_corr.count(t.events[i].correlation) > 0;
  return r;
}

namespace {

// What every stage of analyze() reads: the trace, its rows as HTA times them, each name classified once (a
// trace repeats a few hundred kernel names thousands of times), the GPU events by device and stream, the
// launching CPU row of each correlation, the steps and the DataLoader's calls.
struct Pass {
  struct NameInfo {
    bool done = false;
    KernelType type = KernelType::computation;
    std::string gemm, attention;
  };
  const Trace& t;
  const AnalysisOptions& opt;
  const HtaRows rows;
  const std::vector<double>& ts = rows.ts;
  const std::vector<double>& te = rows.te;
  const std::vector<char>& kept = rows.kept;
  const std::size_t n = t.events.size();
  std::vector<NameInfo> names = std::vector<NameInfo>(t.names.size());
  std::map<std::int64_t, std::vector<std::size_t>> by_device;
  std::map<std::pair<std::int64_t, std::int64_t>, std::vector<std::size_t>> by_stream;
  std::unordered_map<std::int64_t, std::size_t> cpu_by_corr;
  std::vector<std::size_t> steps, loader_ops;

  Pass(const Trace& tr, const AnalysisOptions& o) : t(tr), opt(o), rows(hta_rows(tr, o)) {}
  const NameInfo& info(const Event& e) {
    NameInfo& i = names[e.name];
    if (!i.done) {
      const std::string& nm = t.names[e.name];
      i.type = kernel_type(nm);
      i.gemm = gemm_dtype(nm);
      i.attention = attention_family(nm);
      i.done = true;
    }
    return i;
  }
};

// GPU events by device and stream; the launching CPU row by correlation; the steps, the loader's calls and
// the SDPA ops (every event: the steps see all, not HTA's filter)
void index_events(Pass& x, TraceAnalysis& a) {
  const Trace& t = x.t;
  const std::size_t n = x.n;
  const auto& kept = x.kept;
  auto& by_device = x.by_device;
  auto& by_stream = x.by_stream;
  auto& cpu_by_corr = x.cpu_by_corr;
  auto& steps = x.steps;
  auto& loader_ops = x.loader_ops;
  for (std::size_t i = 0; i < n; ++i) {
    const Event& e = t.events[i];
    if (!kept[i]) continue;
    if (e.stream >= 0) {
      ++a.gpu_events;
      by_device[e.pid].push_back(i);
      if (e.is_gpu()) by_stream[{e.pid, e.stream}].push_back(i);
      continue;
    }
    if (e.correlation >= 0) cpu_by_corr.emplace(e.correlation, i);
    if (e.cat == Cat::cuda_runtime || e.cat == Cat::cuda_driver) {
      ++a.runtime_calls;
      if (t.name(e).rfind("hip", 0) == 0) a.amd = true;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {  // the steps and what is in them: every event, not HTA's filter
    const Event& e = t.events[i];
    // The DataLoader's __next__ is a Python record_function (USER_SCOPE): user_annotation in a trace
    // PyTorch writes, cpu_op in older ones; the TensorBoard plugin's _parse_step takes either, and
    // DataPipes' `enumerate(DataPipe)#` too.
    if (e.cat == Cat::cpu_op || e.cat == Cat::user_annotation) {
      const std::string& nm = t.name(e);
      if ((nm.rfind("enumerate(DataLoader)#", 0) == 0 || nm.rfind("enumerate(DataPipe)#", 0) == 0) &&
          contains(nm, "__next__")) {
        loader_ops.push_back(i);
        if (contains(nm, "_MultiProcessingDataLoaderIter")) a.steps.loader_iter = "multi";
        else if (contains(nm, "_SingleProcessDataLoaderIter") && a.steps.loader_iter.empty()) a.steps.loader_iter = "single";
      }
    }
    // ProfilerStep#N: a user_annotation, a cpu_op in the Kineto of 2021 (its category Operator)
    if ((e.cat == Cat::user_annotation || e.cat == Cat::cpu_op) && t.name(e).rfind("ProfilerStep#", 0) == 0)
      steps.push_back(i);
    if (e.cat == Cat::cpu_op) {
      ++a.cpu_ops;
      const std::string& nm = t.name(e);
      if (nm.rfind("aten::_scaled_dot_product", 0) == 0 || nm.rfind("aten::_flash_attention", 0) == 0 ||
          nm.rfind("aten::_efficient_attention", 0) == 0 || nm.rfind("aten::_cudnn_attention", 0) == 0) {
        if (std::find(a.families.sdpa_ops.begin(), a.families.sdpa_ops.end(), nm) == a.families.sdpa_ops.end())
          a.families.sdpa_ops.push_back(nm);
      }
    }
  }
}

void temporal(Pass& x, TraceAnalysis& a) {
  const Trace& t = x.t;
  const auto& ts = x.ts;
  const auto& te = x.te;
  auto info = [&x](const Event& e) -> const Pass::NameInfo& { return x.info(e); };
  auto& by_device = x.by_device;
  // ---- temporal breakdown per device (HTA: the union over every stream) ----
  for (auto& [dev, idx] : by_device) {
    a.devices.push_back(dev);
    std::vector<Interval> all, comp, comm, mem;
    double lo = ts[idx.front()], hi = te[idx.front()];
    for (std::size_t i : idx) {
      lo = std::min(lo, ts[i]);
      hi = std::max(hi, te[i]);
      all.emplace_back(ts[i], te[i]);
      switch (info(t.events[i]).type) {
        case KernelType::computation: comp.emplace_back(ts[i], te[i]); break;
        case KernelType::communication: comm.emplace_back(ts[i], te[i]); break;
        case KernelType::memory: mem.emplace_back(ts[i], te[i]); break;
        case KernelType::other: break;
      }
    }
    Temporal tp;
    tp.device = dev;
    tp.window_us = hi - lo;
    const auto all_m = merged(all);
    const auto comp_m = merged(comp);
    const auto comm_m = merged(comm);
    tp.idle_us = tp.window_us - length(all_m);
    tp.kernel_us = length(all_m);
    tp.compute_us = length(comp_m);
    tp.communication_us = length(comm_m);
    tp.memory_us = length(merged(mem));
    tp.non_compute_us = tp.window_us - tp.compute_us - tp.idle_us;
    if (tp.window_us > 0) {
      tp.idle_pct = 100 * tp.idle_us / tp.window_us;
      tp.compute_pct = 100 * tp.compute_us / tp.window_us;
      tp.non_compute_pct = 100 * tp.non_compute_us / tp.window_us;
    }
    a.temporal.push_back(tp);
    a.families.nccl_us += tp.communication_us;
    a.families.nccl_exposed_us += tp.communication_us - overlap(comm_m, comp_m);
  }
}

void stream_idle(Pass& x, TraceAnalysis& a) {
  const Trace& t = x.t;
  const auto& ts = x.ts;
  const auto& te = x.te;
  const AnalysisOptions& opt = x.opt;
  auto info = [&x](const Event& e) -> const Pass::NameInfo& { return x.info(e); };
  auto& by_stream = x.by_stream;
  const auto& cpu_by_corr = x.cpu_by_corr;
  // ---- idle time per stream (HTA: kernels, memcpy, memset; host wait first) ----
  for (auto& [key, idx] : by_stream) {
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t x, std::size_t y) { return ts[x] < ts[y]; });
    StreamIdle si;
    si.device = key.first;
    si.stream = key.second;
    si.events = std::int64_t(idx.size());
    for (std::size_t i : idx)
      if (info(t.events[i]).type == KernelType::computation) si.busy_us += te[i] - ts[i];
    for (std::size_t k = 1; k < idx.size(); ++k) {
      const std::size_t i = idx[k];
      const double prev_end = te[idx[k - 1]];
      const double gap = ts[i] - prev_end;
      const auto rt = cpu_by_corr.find(t.events[i].correlation);
      const bool host = rt != cpu_by_corr.end() && ts[rt->second] > prev_end;
      if (host) si.host_wait_us += gap;
      else if (gap < opt.consecutive_kernel_delay_us) si.kernel_wait_us += gap;
      else si.other_us += gap;
    }
    si.idle_us = si.host_wait_us + si.kernel_wait_us + si.other_us;
    a.idle.push_back(si);
  }
}

void launch_stats(Pass& x, TraceAnalysis& a) {
  const Trace& t = x.t;
  const std::size_t n = x.n;
  const auto& ts = x.ts;
  const auto& te = x.te;
  const auto& kept = x.kept;
  const AnalysisOptions& opt = x.opt;
  const auto& cpu_by_corr = x.cpu_by_corr;
  // ---- launch statistics (HTA's launch names; hip's too, which HTA 0.5 does not pair) ----
  {
    std::vector<double> cpu, gpu, delay;
    for (std::size_t i = 0; i < n; ++i) {
      const Event& e = t.events[i];
      if (!kept[i] || e.stream < 0 || e.correlation < 0) continue;
      const auto rt = cpu_by_corr.find(e.correlation);
      if (rt == cpu_by_corr.end() || !launch_call(t.name(t.events[rt->second]))) continue;
      const std::size_t r = rt->second;
      const double c = te[r] - ts[r], g = te[i] - ts[i], d = std::max(0.0, ts[i] - te[r]);
      cpu.push_back(c);
      gpu.push_back(g);
      delay.push_back(d);
      if (g < c) ++a.launch.short_kernels;
      if (c <= opt.runtime_cutoff_us && g < c) ++a.launch.short_kernels_plot;
      if (c > opt.runtime_cutoff_us) ++a.launch.runtime_outliers;
      if (d > opt.launch_delay_cutoff_us) ++a.launch.launch_delay_outliers;
    }
    a.launch.pairs = std::int64_t(cpu.size());
    for (double v : cpu) a.launch.cpu_sum_us += v;
    for (double v : gpu) a.launch.gpu_sum_us += v;
    for (double v : delay) a.launch.delay_sum_us += v;
    a.launch.cpu_median_us = median(cpu);
    a.launch.gpu_median_us = median(gpu);
    a.launch.delay_median_us = median(delay);
  }
}

void copies(Pass& x, TraceAnalysis& a) {
  const Trace& t = x.t;
  const std::size_t n = x.n;
  const auto& kept = x.kept;
  // ---- copies ----
  // bytes and µs of the copies whose size the trace gives, by the host memory their name says
  std::pair<std::int64_t, double> rated_pageable{0, 0}, rated_pinned{0, 0}, rated_unnamed{0, 0};
  for (std::size_t i = 0; i < n; ++i) {  // HTA's filtered set, as the windows the shares divide by
    const Event& e = t.events[i];
    if (!kept[i] || e.cat != Cat::gpu_memcpy) continue;
    if (e.copy == CopyKind::htod) {
      ++a.copies.htod_count;
      a.copies.htod_us += e.dur;
      if (e.pageable) {
        ++a.copies.htod_pageable_count;
        a.copies.htod_pageable_us += e.dur;
      }
      if (e.bytes >= 0) {  // the rates count only copies whose size the trace gives
        // a copy named neither (ROCm's "Memcpy HtoD (Host -> Device)") counts in the overall rate only
        if (e.pageable || e.pinned) {
          (e.pageable ? rated_pageable : rated_pinned).first += e.bytes;
          (e.pageable ? rated_pageable : rated_pinned).second += e.dur;
        } else {
          rated_unnamed.first += e.bytes;
          rated_unnamed.second += e.dur;
        }
        a.copies.htod_bytes += e.bytes;
        if (e.pageable) a.copies.htod_pageable_bytes += e.bytes;
      }
    } else if (e.copy == CopyKind::dtoh) {
      a.copies.dtoh_us += e.dur;
    } else {
      a.copies.other_us += e.dur;
    }
  }
  auto gbps = [](std::pair<std::int64_t, double> r) { return r.second > 0 && r.first > 0 ? double(r.first) / (r.second * 1e3) : 0.0; };
  a.copies.htod_pageable_gbps = gbps(rated_pageable);
  a.copies.htod_pinned_gbps = gbps(rated_pinned);
  a.copies.htod_gbps = gbps({rated_pageable.first + rated_pinned.first + rated_unnamed.first,
                             rated_pageable.second + rated_pinned.second + rated_unnamed.second});
}

void steps_and_loader(Pass& x, TraceAnalysis& a) {
  const Trace& t = x.t;
  const std::size_t n = x.n;
  const auto& ts = x.ts;
  const auto& te = x.te;
  const auto& steps = x.steps;
  const auto& loader_ops = x.loader_ops;
  // ---- steps and the DataLoader inside them ----
  {
    std::vector<Interval> step_iv;
    for (std::size_t i : steps) {
      a.steps.step_us.push_back(te[i] - ts[i]);
      a.steps.total_us += te[i] - ts[i];
      step_iv.emplace_back(ts[i], te[i]);
    }
    a.steps.count = std::int64_t(steps.size());
    a.steps.median_us = median(a.steps.step_us);
    const auto step_m = merged(step_iv);
    std::vector<Interval> loader;
    for (std::size_t i : loader_ops) loader.emplace_back(ts[i], te[i]);
    const auto loader_m = step_m.empty() ? merged(loader) : intersected(merged(loader), step_m);
    a.steps.dataloader_us = length(loader_m);
    // The TensorBoard plugin's DataLoader cost (overall_parser: each role's time less what the roles
    // before it took, in the order kernel, memcpy, memset, communication, runtime, DataLoader): the
    // loader's time with no GPU kernel, copy or memset running and no CUDA runtime call made, the time
    // the device waits on it. A worker-fed loader's __next__ often runs beside the last step's kernels.
    std::vector<Interval> busy;
    for (std::size_t i = 0; i < n; ++i) {
      const Cat c = t.events[i].cat;
      if (c == Cat::kernel || c == Cat::gpu_memcpy || c == Cat::gpu_memset || c == Cat::cuda_runtime ||
          c == Cat::cuda_driver)
        busy.emplace_back(ts[i], te[i]);
    }
    a.steps.dataloader_exposed_us = a.steps.dataloader_us - overlap(loader_m, merged(std::move(busy)));
    // every GPU event, not HTA's filtered set (that drops the last step's kernels)
    std::vector<Interval> gpu_all;
    for (std::size_t i = 0; i < n; ++i)
      if (t.events[i].stream >= 0) gpu_all.emplace_back(ts[i], te[i]);
    a.steps.gpu_busy_us = step_m.empty() ? 0 : overlap(merged(std::move(gpu_all)), step_m);
  }
}

void families(Pass& x, TraceAnalysis& a) {
  const Trace& t = x.t;
  auto info = [&x](const Event& e) -> const Pass::NameInfo& { return x.info(e); };
  auto& by_stream = x.by_stream;
  // ---- kernel families ----
  for (auto& [key, idx] : by_stream) {  // sorted by start in stream_idle()
    std::vector<const Event*> evs;
    for (std::size_t i : idx) evs.push_back(&t.events[i]);
    for (std::size_t i = 0; i < evs.size(); ++i) {
      const Event* e = evs[i];
      if (e->cat != Cat::kernel) continue;
      const std::string& g = info(*e).gemm;
      if (!g.empty()) {
        a.families.gemm_us_by_dtype[g] += e->dur;
        a.families.gemm_us += e->dur;
      }
      const std::string& f = info(*e).attention;
      if (!f.empty()) a.families.attention_us[f] += e->dur;
      if (f == "softmax") {
        // the math path: a GEMM right before and right after the softmax on its stream
        double s = e->dur;
        bool before = false, after = false;
        for (std::size_t j = i; j-- > 0 && i - j <= 3;)
          if (!info(*evs[j]).gemm.empty()) {
            s += evs[j]->dur, before = true;
            break;
          }
        for (std::size_t j = i + 1; j < evs.size() && j - i <= 3; ++j)
          if (!info(*evs[j]).gemm.empty()) {
            s += evs[j]->dur, after = true;
            break;
          }
        if (before && after) a.families.math_attention_us += s;
      }
    }
  }
}

void memory_peaks(Pass& x, TraceAnalysis& a) {
  const Trace& t = x.t;
  // ---- memory: peak allocated per device against its capacity ----
  {
    std::map<std::int64_t, MemoryPeak> peaks;
    for (const MemorySample& m : t.memory) {
      if (m.device < 0) continue;
      MemoryPeak& p = peaks[m.device];
      p.device = m.device;
      p.peak_allocated = std::max(p.peak_allocated, m.total_allocated);
      p.peak_reserved = std::max(p.peak_reserved, m.total_reserved);
    }
    for (auto& [dev, p] : peaks) {
      for (const auto& d : t.device_properties)
        if (d.is_object() && d.value("id", std::int64_t(-1)) == dev)
          p.capacity = d.value("totalGlobalMem", std::int64_t(0));
      for (const MemorySample& m : t.memory) {
        if (m.device != dev) continue;
        const std::int64_t cap = m.limit > 0 ? m.limit : p.capacity;
        if (cap > 0) p.peak_pct = std::max(p.peak_pct, 100.0 * double(m.total_allocated) / double(cap));
      }
      a.memory.push_back(p);
    }
  }
}

}  // namespace

TraceAnalysis analyze(const Trace& t, const AnalysisOptions& opt) {
  TraceAnalysis a;
  if (!t.device_properties.empty() && t.device_properties[0].is_object())
    a.device_name = t.device_properties[0].value("name", std::string());
  // times as HTA sees them, and the rows its iteration filter keeps
  Pass x(t, opt);
  a.rounded = x.rows.rounded;
  a.iteration_filter = x.rows.iteration_filter;
  index_events(x, a);
  temporal(x, a);
  stream_idle(x, a);
  launch_stats(x, a);
  copies(x, a);
  steps_and_loader(x, a);
  families(x, a);
  memory_peaks(x, a);
  return a;
}

json to_json(const TraceAnalysis& a) {
  json j;
  j["device_name"] = a.device_name;
  j["rounded_like_hta"] = a.rounded;
  j["iteration_filter"] = a.iteration_filter;
  j["gpu_events"] = a.gpu_events;
  j["runtime_calls"] = a.runtime_calls;
  j["cpu_ops"] = a.cpu_ops;
  json tp = json::array();
  for (const Temporal& x : a.temporal)
    tp.push_back(json{{"device", x.device},
                      {"window_us", x.window_us},
                      {"kernel_us", x.kernel_us},
                      {"compute_us", x.compute_us},
                      {"non_compute_us", x.non_compute_us},
                      {"idle_us", x.idle_us},
                      {"communication_us", x.communication_us},
                      {"memory_us", x.memory_us},
                      {"idle_pct", x.idle_pct},
                      {"compute_pct", x.compute_pct},
                      {"non_compute_pct", x.non_compute_pct}});
  j["temporal"] = tp;
  json id = json::array();
  for (const StreamIdle& x : a.idle)
    id.push_back(json{{"device", x.device},
                      {"stream", x.stream},
                      {"events", x.events},
                      {"idle_us", x.idle_us},
                      {"host_wait_us", x.host_wait_us},
                      {"kernel_wait_us", x.kernel_wait_us},
                      {"other_us", x.other_us}});
  j["idle"] = id;
  j["launch"] = json{{"pairs", a.launch.pairs},
                     {"cpu_sum_us", a.launch.cpu_sum_us},
                     {"gpu_sum_us", a.launch.gpu_sum_us},
                     {"delay_sum_us", a.launch.delay_sum_us},
                     {"cpu_median_us", a.launch.cpu_median_us},
                     {"gpu_median_us", a.launch.gpu_median_us},
                     {"delay_median_us", a.launch.delay_median_us},
                     {"short_kernels", a.launch.short_kernels},
                     {"short_kernels_plot", a.launch.short_kernels_plot},
                     {"runtime_outliers", a.launch.runtime_outliers},
                     {"launch_delay_outliers", a.launch.launch_delay_outliers}};
  j["copies"] = json{{"htod_count", a.copies.htod_count},
                     {"htod_pageable_count", a.copies.htod_pageable_count},
                     {"htod_us", a.copies.htod_us},
                     {"htod_bytes", a.copies.htod_bytes},
                     {"htod_gbps", a.copies.htod_gbps},
                     {"htod_pageable_gbps", a.copies.htod_pageable_gbps},
                     {"htod_pinned_gbps", a.copies.htod_pinned_gbps},
                     {"dtoh_us", a.copies.dtoh_us}};
  j["steps"] = json{{"count", a.steps.count},
                    {"total_us", a.steps.total_us},
                    {"median_us", a.steps.median_us},
                    {"dataloader_us", a.steps.dataloader_us},
                    {"dataloader_exposed_us", a.steps.dataloader_exposed_us},
                    {"loader_iter", a.steps.loader_iter},
                    {"gpu_busy_us", a.steps.gpu_busy_us}};
  j["families"] = json{{"gemm_us", a.families.gemm_us},
                       {"gemm_us_by_dtype", a.families.gemm_us_by_dtype},
                       {"attention_us", a.families.attention_us},
                       {"math_attention_us", a.families.math_attention_us},
                       {"sdpa_ops", a.families.sdpa_ops},
                       {"nccl_us", a.families.nccl_us},
                       {"nccl_exposed_us", a.families.nccl_exposed_us}};
  json mem = json::array();
  for (const MemoryPeak& m : a.memory)
    mem.push_back(json{{"device", m.device},
                       {"peak_allocated", m.peak_allocated},
                       {"peak_reserved", m.peak_reserved},
                       {"capacity", m.capacity},
                       {"peak_pct", m.peak_pct}});
  j["memory"] = mem;
  return j;
}

}  // namespace sb::readers
