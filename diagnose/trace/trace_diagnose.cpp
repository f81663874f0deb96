// diagnose --trace (rules and order in trace_diagnose.hpp).
#include "diagnose/trace/trace_diagnose.hpp"

#include <sys/resource.h>  // getrusage: the reader's peak memory

#include <algorithm>  // std::sort, std::max
#include <chrono>     // std::chrono
#include <cmath>      // std::isfinite

#include <fmt/format.h>  // fmt::format

#include "diagnose/trace/host_attribution.hpp"  // attribute_host, find_iterations
#include "diagnose/trace/roofline.hpp"          // roofline, expected_for_trace
#include "diagnose/trace/trace_analysis.hpp"    // analyze
#include "diagnose/trace/trace_rules.hpp"       // Ctx, find
#include "harness/units.hpp"                    // format_bytes
#include "readers/kineto.hpp"                   // read_kineto

namespace sb::diagnose {
namespace {

using json = nlohmann::ordered_json;
using readers::TraceAnalysis;

// The speedups the estimates assume for the fixed part, each the low end of
// a published figure (../shared/REFERENCE.md):
//   fp32 GEMMs to bf16: "fp32 is 2 to 4x slower than bf16 on modern NVIDIA GPUs";
//   tf32 to bf16: the dense datasheet ratio, 2.0 on A100 and H100;
//   the math path to a fused kernel: "flash attention is 2 to 4x faster on long sequences"
//     (FlashAttention-2 fwd+bwd on A100: 187-201 TFLOP/s against standard PyTorch's 76-86);
//   pageable to pinned copies: PCIe Gen4 x16 pinned about 25.7 GB/s, pageable 3 to 10
//     (used only when the trace has no pinned copy of its own to measure the ratio).
constexpr double kF32ToBf16 = 2.0, kTf32ToBf16 = 2.0, kMathToFused = 2.0, kPageableToPinned = 2.57;

// The TensorBoard plugin's thresholds.
constexpr double kLoaderPct = 5, kCommPct = 10, kMemoryPct = 90, kUtilPct = 50;
// stallbench's own line between healthy and steady-low (harness/sampler.hpp).
constexpr double kHealthyPct = 90;

double amdahl(double share, double speedup) { return 1.0 / (1.0 - share + share / speedup); }

}  // namespace

namespace trace_rules {

Point check(const std::string& name) {
  Point p;
  p.params = json{{"check", name}};
  return p;
}
Point skipped(const std::string& name, const std::string& why) {
  Point p = check(name);
  p.status = Status::skipped;
  p.reason = why;
  return p;
}

// bound: the gain is an upper bound (the cost removed entirely), said "up to".
void find(Ctx& c, Point& p, const std::string& cause, const std::string& check_name, std::optional<double> gain,
          double share_pct, const std::string& confidence, const std::string& evidence, const std::string& line,
          const std::string& command, bool bound) {
  const std::string cmd = command.empty() ? "" : fmt::format("stallbench run {} --device {}", command, c.device);
  std::string summary = gain ? fmt::format("{}: {} {:.2f}x estimated from the trace -> {} ({})", check_name,
                                           bound ? "up to" : "about", *gain, line, evidence)
                             : fmt::format("{}: {} -> {}", check_name, evidence, line);
  json ev{{"check", check_name},
          {"config_line", line},
          {"command", cmd},
          {"evidence", evidence},
          {"share_pct", share_pct},
          {"confidence", confidence},
          {"estimated", true},
          {"upper_bound", bound}};
  if (cmd.empty()) ev.erase("command");
  c.found.push_back({cause, summary, gain, ev});
  p.info["finding"] = cause;
  p.info["evidence"] = evidence;
  p.info["confidence"] = confidence;
  if (gain) p.add({"gain_estimate", *gain, "x", Direction::higher, std::nullopt, "Amdahl over the GPU window; see note"});
}

}  // namespace trace_rules

namespace {

using namespace trace_rules;

Point utilization(Ctx& c) {
  if (!c.dev) return skipped("utilization", "the trace has no GPU events (a CPU-only profile)");
  Point p = check("utilization");
  const auto& d = *c.dev;
  const double busy = 100 - d.idle_pct;
  p.add({"gpu_busy_pct", busy, "%", Direction::higher, std::nullopt,
         "100 - HTA's idle %: the time some kernel, copy or memset runs, over the first-to-last GPU event window"});
  p.add({"idle_pct", d.idle_pct, "%", Direction::lower, std::nullopt, "HTA temporal breakdown"});
  p.add({"compute_pct", d.compute_pct, "%", Direction::higher, std::nullopt, "HTA temporal breakdown"});
  p.add({"non_compute_pct", d.non_compute_pct, "%", Direction::lower, std::nullopt,
         "HTA temporal breakdown: copies, memsets, communication with no computation beside them"});
  p.add({"gpu_window_ms", d.window_us / 1e3, "ms", Direction::lower, std::nullopt, "first GPU start to last GPU end"});
  // the idle time's causes on this device's busiest stream (HTA's idle breakdown is per stream: summed
  // over streams, a side stream's long gaps read as the device's, 596 ms of "host wait" from a stream
  // with 7.8 ms of kernels in timeline_analysis's trace)
  double hw = 0, kw = 0, other = 0;
  const readers::StreamIdle* cs = readers::busiest_stream(c.a.idle, d.device);
  if (cs) hw = cs->host_wait_us, kw = cs->kernel_wait_us, other = cs->other_us;
  if (cs) p.info["idle_stream"] = cs->stream;
  const double tot = hw + kw + other;
  if (tot > 0) {
    p.add({"idle_host_wait_pct", 100 * hw / tot, "%", Direction::lower, std::nullopt,
           "of the busiest stream's idle time: the next launch came after the stream ran dry (the host was late)"});
    p.add({"idle_kernel_wait_pct", 100 * kw / tot, "%", Direction::lower, std::nullopt,
           "of the busiest stream's idle time: gaps under 30 us between back-to-back kernels"});
  }
  std::string pattern = busy >= 80 ? "healthy" : busy < kUtilPct ? "low" : "fair";
  p.info["pattern"] = pattern;
  p.info["reading"] = fmt::format("device {}: {:.1f}% busy over {:.1f} ms{}", d.device, busy, d.window_us / 1e3,
                                  tot > 0 ? fmt::format("; idle: {:.0f}% host wait, {:.0f}% kernel wait, {:.0f}% other",
                                                        100 * hw / tot, 100 * kw / tot, 100 * other / tot)
                                          : "");
  return p;
}

Point loader(Ctx& c) {
  const auto& s = c.steps;
  if (s.count == 0)
    return skipped("loader", "no ProfilerStep#N annotations, and no iterations to recover from the DataLoader's "
                             "__next__ or Optimizer.step calls: profile with torch.profiler.schedule(...) and call "
                             "prof.step() once per step");
  Point p = check("loader");
  // Where the steps come from: ProfilerStep#N, else the iterations between the loader's (or the optimizer's)
  // calls, after the warm-up when the first was over 3x the others.
  p.info["iterations"] = c.steps_source;
  if (c.iterations && c.iterations->warmup > 0) p.info["warmup_iterations_left_out"] = c.iterations->warmup;
  // The TensorBoard plugin's figure: the loader's time with the device idle (no kernel, copy or memset,
  // no CUDA runtime call), over the steps' time; __next__'s wall time beside it. Until 2026-12-05 the
  // wall time was the share: a stallbench trace read 98.0% where the plugin reads 71.3%.
  const double share = s.total_us > 0 ? s.dataloader_exposed_us / s.total_us : 0;
  p.add({"dataloader_pct_of_step", 100 * share, "%", Direction::lower, std::nullopt,
         "the DataLoader's __next__ (enumerate(DataLoader)#...) inside ProfilerStep#N while no GPU kernel, copy "
         "or memset runs and no CUDA runtime call is made (the TensorBoard plugin's DataLoader), over the steps' "
         "time"});
  p.add({"dataloader_wall_pct_of_step", s.total_us > 0 ? 100 * s.dataloader_us / s.total_us : 0, "%",
         Direction::lower, std::nullopt, "the DataLoader's __next__ inside ProfilerStep#N, all of it, over the steps' time"});
  p.add({"steps", double(s.count), "steps", Direction::higher, std::nullopt,
         c.steps_source == "ProfilerStep#N" ? "ProfilerStep#N annotations"
                                            : "iterations between consecutive " + c.steps_source + " calls"});
  p.add({"step_median_ms", s.median_us / 1e3, "ms", Direction::lower, std::nullopt, "ProfilerStep#N durations"});
  if (s.dataloader_us <= 0) p.info["note"] = "no DataLoader __next__ inside the steps";
  // Hidden entirely, the wait leaves a step no shorter than the GPU's work in it.
  const double after = std::max(s.total_us - s.dataloader_exposed_us, s.gpu_busy_us);
  const double gain = after > 0 ? s.total_us / after : 1.0;
  p.add({"gpu_busy_pct_of_step", s.total_us > 0 ? 100 * s.gpu_busy_us / s.total_us : 0, "%", Direction::higher,
         std::nullopt, "GPU events' union inside the steps over the steps' time"});
  if (100 * share > kLoaderPct)
    find(c, p, "a slow host dataloader", "loader", gain, 100 * share, "high",
         fmt::format("the device waits on the DataLoader's __next__ for {:.1f}% of step time{} (over {:.0f}%: the "
                     "TensorBoard plugin's rule; __next__ itself spans {:.1f}%); the gain is the wait hidden "
                     "entirely, bounded by the GPU's {:.1f}% of the step: an upper bound",
                     100 * share,
                     c.steps_source == "ProfilerStep#N"
                         ? ""
                         : fmt::format(" over {} iterations between its calls (no ProfilerStep#N)", s.count),
                     kLoaderPct, s.total_us > 0 ? 100 * s.dataloader_us / s.total_us : 0,
                     s.total_us > 0 ? 100 * s.gpu_busy_us / s.total_us : 0),
         // What the trace says of the loader it has: PyTorch's iterator names num_workers 0 or more.
         s.loader_iter == "multi"
             ? "dataloader_num_workers: more than now  # the trace's loader has workers already "
               "(_MultiProcessingDataLoaderIter) and still holds the step: more, up to the free cores, or a "
               "cheaper sample"
         : s.loader_iter == "single"
             ? "dataloader_num_workers: 4  # the trace's loader runs in the training process "
               "(_SingleProcessDataLoaderIter: num_workers 0); with dataloader_pin_memory: true"
             : "dataloader_num_workers: 4  # with dataloader_pin_memory: true",
         "dataloader -p workers=0,1,2,4", true);
  return p;
}

Point dtype(Ctx& c) {
  const auto& f = c.a.families;
  if (f.gemm_us <= 0) return skipped("dtype", "no GEMM or convolution kernel recognised by its name");
  Point p = check("dtype");
  auto us = [&](const char* k) {
    auto it = f.gemm_us_by_dtype.find(k);
    return it == f.gemm_us_by_dtype.end() ? 0.0 : it->second;
  };
  const double f32 = us("f32"), tf32 = us("tf32");
  const double window = c.windows;
  p.add({"gemm_pct_of_window", 100 * f.gemm_us / std::max(window, 1e-9), "%", Direction::lower, std::nullopt,
         "GEMM and convolution kernels' time over the GPU windows"});
  p.add({"fp32_gemm_pct", 100 * f32 / f.gemm_us, "%", Direction::lower, std::nullopt,
         "of GEMM time: kernels without Tensor Cores in fp32 (sgemm, scudnn, f32 xmma, ...), from their names"});
  p.add({"tf32_gemm_pct", 100 * tf32 / f.gemm_us, "%", Direction::lower, std::nullopt, "of GEMM time"});
  json by = json::object();
  for (const auto& [k, v] : f.gemm_us_by_dtype) by[k] = v;
  p.info["gemm_us_by_dtype"] = by;
  const double s32 = f32 / std::max(window, 1e-9), s_tf = tf32 / std::max(window, 1e-9);
  int major = 0;  // 0: the trace does not say
  if (!c.t.device_properties.empty() && c.t.device_properties[0].is_object())
    major = c.t.device_properties[0].value("computeMajor", 0);
  // fp32 or tf32 over half of the GEMM time and 5% of the window
  const bool wide = s32 + s_tf >= 0.05 && (f32 + tf32) >= 0.5 * f.gemm_us;
  if (wide && major > 0 && major < 7)
    // Before Volta there are no Tensor Cores and no bf16 (the TensorBoard plugin's rule asks for compute 7.0+)
    p.info["note"] = fmt::format("compute {}.x has no Tensor Cores and no bf16: a lower precision is no fix to "
                                 "name here", major);
  else if (wide) {
    const std::string line = major == 7 ? "fp16: true  # this GPU (compute 7.x) has no bf16; with loss scaling"
                                        : "bf16: true";
    const double gain = 1.0 / (1.0 - s32 - s_tf + s32 / kF32ToBf16 + s_tf / kTf32ToBf16);
    find(c, p, "fp32 where bf16 would do", "dtype", gain, 100 * (s32 + s_tf), "medium",
         fmt::format("{:.0f}% of GEMM time runs in fp32{} ({:.1f}% of the GPU window), dtype read from kernel names; "
                     "the estimate assumes those GEMMs 2x faster in bf16/fp16 (the low end of the 2-4x users are told)",
                     100 * (f32 + tf32) / f.gemm_us, tf32 > 0 ? " or tf32" : "", 100 * (s32 + s_tf)),
         line, major == 7 ? "precision -p dtype=fp32,fp16" : "precision -p dtype=fp32,tf32,bf16");
  }
  return p;
}

Point attention(Ctx& c) {
  const auto& f = c.a.families;
  double fused = 0;
  for (const auto& [k, v] : f.attention_us)
    if (k != "softmax") fused += v;
  const bool math_op = std::any_of(f.sdpa_ops.begin(), f.sdpa_ops.end(),
                                   [](const std::string& n) { return n.find("_math") != std::string::npos; });
  if (fused <= 0 && f.math_attention_us <= 0 && !math_op)
    return skipped("attention", "no attention recognised: no fused attention kernel, no softmax between two GEMMs");
  Point p = check("attention");
  p.add({"fused_attention_ms", fused / 1e3, "ms", Direction::lower, std::nullopt,
         "flash, cuDNN and memory-efficient attention kernels, by name"});
  p.add({"math_attention_ms", f.math_attention_us / 1e3, "ms", Direction::lower, std::nullopt,
         "softmax kernels with a GEMM right before and after them on their stream, and those GEMMs"});
  json fam = json::object();
  for (const auto& [k, v] : f.attention_us) fam[k] = v;
  p.info["attention_us"] = fam;
  p.info["sdpa_ops"] = f.sdpa_ops;
  // every device's math path over every device's window (one device's window inflated it under DataParallel)
  const double share = c.windows > 0 ? f.math_attention_us / c.windows : 0;
  if (math_op && share < 0.02)
    p.info["note"] = fmt::format("aten::_scaled_dot_product_attention_math ran, but the math path takes {:.1f}% of the "
                                 "GPU window: not what limits this job",
                                 100 * share);
  if (share >= 0.02 && (fused <= 0 || math_op))
    find(c, p, "attention without a fused kernel", "attention", amdahl(std::min(share, 0.99), kMathToFused),
         100 * share, math_op ? "high" : "medium",
         fmt::format("the math path (softmax between two GEMMs{}) takes {:.1f}% of the GPU window; the estimate assumes "
                     "it 2x faster fused (the low end of the 2-4x of FlashAttention)",
                     math_op ? "; aten::_scaled_dot_product_attention_math in the trace" : "", 100 * share),
         "attn_implementation: flash_attention_2  # or sdpa; flash_attention: true before Axolotl 0.12",
         c.device.rfind("cuda", 0) == 0 ? "attention -p impl=naive,cudnn" : "attention -p impl=naive,flash");
  return p;
}

// Each counted op (GEMM, convolution, attention) against the card's roofline (roofline.hpp): what the
// top ones achieve, of what the card can at their intensity.
Point roofline_check(Ctx& c) {
  if (c.t.shapes.empty())
    return skipped("roofline", "no op shapes: profile with record_shapes=True to hold each GEMM, convolution and "
                               "attention against the card's peak");
  const json card = expected_for_trace(c.t);
  const Roofline rl = roofline(c.t, card);
  if (rl.rows.empty())
    return skipped("roofline", fmt::format("{} ops with shapes, none with GPU time (a CPU trace, or their kernels "
                                           "outside it)",
                                           rl.ops_with_shapes));
  Point p = check("roofline");
  p.add({"counted_pct_of_kernel_time", rl.kernel_us > 0 ? 100 * rl.counted_gpu_us / rl.kernel_us : 0, "%",
         Direction::none, std::nullopt, "the GPU time of the ops whose FLOPs their shapes give, over all kernel time"});
  p.add({"counted_tflops", rl.counted_gpu_us > 0 ? rl.flops / rl.counted_gpu_us / 1e6 : 0, "TFLOP/s",
         Direction::higher, std::nullopt, "their FLOPs over their GPU time"});
  p.info["roofline"] = to_json(rl);
  std::string s;
  for (std::size_t i = 0; i < rl.rows.size() && i < 3; ++i) {
    const auto& x = rl.rows[i];
    s += fmt::format("{}{} {} {} x{}: {:.1f} ms, {:.1f} TFLOP/s{}", i ? "; " : "", x.op, x.shapes, x.dtype, x.calls,
                     x.gpu_us / 1e3, x.tflops,
                     x.attainable_tflops > 0 ? fmt::format(", {:.0f}% of the {:.0f} attainable ({}-bound)",
                                                           x.pct_of_attainable, x.attainable_tflops, x.bound)
                                             : "");
  }
  const RooflineRow* h = holds_back(rl);
  p.info["reading"] = fmt::format("{:.0f}% of kernel time in counted ops{}; {}{}",
                                  rl.kernel_us > 0 ? 100 * rl.counted_gpu_us / rl.kernel_us : 0,
                                  rl.card.empty() ? " (no peaks: the trace's GPU is not in results/expected)"
                                                  : " against " + rl.card + "'s datasheet peaks",
                                  s, h ? fmt::format("; most time lost: {} {} ({})", h->op, h->shapes, fix_hint(*h)) : "");
  return p;
}

// The share of the GPU's wait the host's issuing of work explains (launch calls, op dispatch, Python, the
// optimizer's ops, time with nothing recorded), from the host attribution: a loader, a sync, the allocator,
// set-up and a slow op already named are not launch overhead. Without one (no stream), HTA's host wait.
struct IssuingWait {
  double of_idle = 0;    // of the GPU's wait (the device idle)
  double of_window = 0;  // of the GPU window (after warm-up)
  double late = 0;       // the stream's events whose launch came after it ran dry
  bool attributed = false;
};
IssuingWait issuing_wait(const Ctx& c, double busy_pct) {
  IssuingWait w;
  const readers::HostAttribution* h = c.host;
  if (h && h->stream >= 0 && h->steady_window_us > 0) {
    double idle = 0;
    for (std::size_t k = 0; k < readers::kHostCauses; ++k)
      if (readers::HostCause(k) != readers::HostCause::other_stream) idle += h->by_cause[k];
    const double issuing = std::max(0.0, readers::issuing_us(*h) - c.slow_op_us);
    w.attributed = true;
    w.of_idle = idle > 0 ? issuing / idle : 0;
    w.of_window = std::min(1.0, issuing / h->steady_window_us);
    w.late = h->events > 0 ? double(h->late_launches) / double(h->events) : 0;
    return w;
  }
  double hw = 0, tot = 0;  // on the device's busiest stream, as the utilization check reads it
  if (const readers::StreamIdle* cs = readers::busiest_stream(c.a.idle, c.dev->device))
    hw = cs->host_wait_us, tot = cs->host_wait_us + cs->kernel_wait_us + cs->other_us;
  w.of_idle = tot > 0 ? hw / tot : 0;
  w.of_window = (1 - busy_pct / 100) * w.of_idle;
  return w;
}

Point batch(Ctx& c) {
  if (!c.dev) return skipped("batch", "the trace has no GPU events");
  Point p = check("batch");
  const auto& l = c.a.launch;
  if (l.pairs > 0) {
    p.add({"short_kernel_pct", 100.0 * double(l.short_kernels) / double(l.pairs), "%", Direction::lower, std::nullopt,
           "GPU events that ran for less time than their launch call took (HTA launch statistics)"});
    p.add({"launch_cpu_median_us", l.cpu_median_us, "us", Direction::lower, std::nullopt, "launch call duration"});
    p.add({"kernel_median_us", l.gpu_median_us, "us", Direction::higher, std::nullopt, "GPU event duration"});
    p.add({"launch_delay_median_us", l.delay_median_us, "us", Direction::lower, std::nullopt,
           "GPU start - launch call end (HTA, clipped at 0)"});
  }
  // Utilization as the TensorBoard plugin defined it where the trace has steps (GPU busy over the
  // steps' time; iterations recovered from the loader's or optimizer's calls count), else over the GPU window.
  const auto& st = c.steps;
  const bool per_step = st.count > 0 && st.total_us > 0;
  const double busy = per_step ? 100 * st.gpu_busy_us / st.total_us : 100 - c.dev->idle_pct;
  p.add({"gpu_busy_pct", busy, "%", Direction::higher, std::nullopt,
         per_step ? "GPU busy inside the steps over their time" : "over the GPU window"});
  const IssuingWait w = issuing_wait(c, busy);
  if (w.attributed)
    p.add({"late_launch_pct", 100 * w.late, "%", Direction::lower, std::nullopt,
           "the busiest stream's kernels, copies and memsets whose launch came after the stream ran dry (HTA's host "
           "wait), after warm-up"});
  p.add({"issuing_pct_of_wait", 100 * w.of_idle, "%", Direction::lower, std::nullopt,
         w.attributed ? "of the GPU's wait, the host issuing work: launch calls, op dispatch, Python, the optimizer's "
                        "ops, nothing recorded (the host attribution; a loader, sync, allocator or slow op apart)"
                      : "HTA's host wait over the busiest stream's idle time"});
  p.info["reading"] = fmt::format("{:.1f}% busy {}; {:.0f}% of the GPU's wait is the host issuing work", busy,
                                  per_step ? "in the steps" : "over the GPU window", 100 * w.of_idle);
  // steady-low (under 90% busy: the sampler's rule, harness/sampler.hpp) and launch-bound: the host's issuing
  // of work (launches, op dispatch, Python) is most of the GPU's wait, or most of the stream's kernels waited
  // for their launch (the GPU paced by the host all through the step, not only in the ramp after a loader's
  // or a sync's drain) and that issuing is 5% of the window or more (a stall before every kernel, an
  // allocator's, is not launches), whatever else is named beside it (a loader, a sync: each finding is its
  // own; until 2026-12-07 any loader hid this one, and any host wait read as launches).
  // Without steps the window holds whatever ran between them (setup, evaluation): only the
  // plugin's 50% line, at low confidence.
  const bool launch_bound = w.of_idle >= 0.5 || (w.late >= 0.5 && w.of_window >= 0.05);
  if (busy < (per_step ? kHealthyPct : kUtilPct) && launch_bound && w.of_window >= 0.02) {
    // The line's change, not all the wait: twice the micro batch issues half the launches per sample, so at
    // most half the host wait per sample goes (under 2x); all of it (CUDA graphs) is the upper bound named.
    // (The wait removed whole read 71x on a trace 1.4% busy, beside a line that doubles the batch.)
    const double wait = w.of_window;
    const double gain = 1.0 / std::max(1e-9, 1 - wait / 2);
    const double all = 1.0 / std::max(1e-9, 1 - wait);
    find(c, p, "a batch too small (launch-bound)", "batch", gain, 100 * wait, per_step ? "medium" : "low",
         fmt::format("the GPU is {:.1f}% busy {} ({}) and the host takes longer to issue the work than the GPU to "
                     "run it{}: the GPU waited on launches, op dispatch and Python for {:.0f}% of the window, {:.0f}% "
                     "of its wait{}; the gain assumes half that wait removed, what twice the micro batch can buy at "
                     "most (all of it, with CUDA graphs or a far larger batch: up to {:.2g}x)",
                     busy, per_step ? "in the steps" : "over the GPU window",
                     busy < kUtilPct ? "under 50%: the TensorBoard plugin's rule" : "steady-low: under 90%",
                     w.attributed ? fmt::format(" ({:.0f}% of its kernels waited for their launch)", 100 * w.late)
                                  : "",
                     100 * wait, 100 * w.of_idle,
                     l.pairs > 0 ? fmt::format(", {:.0f}% of kernels shorter than their launch",
                                               100.0 * double(l.short_kernels) / double(l.pairs))
                                 : "",
                     all),
         "micro_batch_size: 2x yours  # with gradient_accumulation_steps halved; or CUDA graphs",
         "batch -p micro_batch=1,2,4,8,16,32", true);
  }
  return p;
}

Point memory(Ctx& c) {
  if (c.a.memory.empty())
    return skipped("memory", "no [memory] events: profile with profile_memory=True to see the peak");
  Point p = check("memory");
  const auto top = *std::max_element(c.a.memory.begin(), c.a.memory.end(), [](const auto& x, const auto& y) {
    return x.peak_pct < y.peak_pct || (x.peak_pct == y.peak_pct && x.peak_allocated < y.peak_allocated);
  });
  p.add({"peak_allocated_gib", double(top.peak_allocated) / double(1ull << 30), "GiB", Direction::lower, std::nullopt,
         "the largest Total Allocated of a [memory] event on a GPU"});
  if (top.peak_pct > 0) {
    const double pct = top.peak_pct;
    p.add({"peak_pct_of_capacity", pct, "%", Direction::lower, std::nullopt,
           "the largest Total Allocated over deviceProperties' totalGlobalMem (a stallbench trace: over the limit in "
           "force at that sample)"});
    if (pct > kMemoryPct)
      find(c, p, "memory pressure", "memory", std::nullopt, pct, "high",
           fmt::format("allocated memory reached {:.0f}% of the device (over {:.0f}%: the TensorBoard plugin's rule; "
                       "the largest peak {}): the next longer batch or a fragmented pool runs out of memory",
                       pct, kMemoryPct, format_bytes(double(top.peak_allocated))),
           "gradient_checkpointing: true  # or bf16: true", "memory -p checkpointing=none,full");
  } else {
    p.info["note"] = "the trace has no deviceProperties: capacity unknown";
  }
  return p;
}

Point communication(Ctx& c) {
  const auto& f = c.a.families;
  Point p = check("communication");
  const bool dp = c.a.devices.size() > 1 && !c.t.world_size;
  const bool ddp_no_nccl = c.t.world_size && *c.t.world_size > 1 && !c.t.distributed_backend.empty() &&
                           c.t.distributed_backend.find("nccl") == std::string::npos && c.dev;
  if (f.nccl_us <= 0 && !dp && !ddp_no_nccl)
    return skipped("communication", "no NCCL kernels in the trace (one process, one GPU)");
  // Over the GPU windows of the events NCCL's time is summed from (HTA's iteration filter drops the last
  // step's kernels): nccl_parser_config's 24.3 ms read 3.6% over every step's 667 ms, 5.6% over its window.
  const double denom = c.windows;
  const double share = denom > 0 ? f.nccl_us / denom : 0, exposed = denom > 0 ? f.nccl_exposed_us / denom : 0;
  p.add({"communication_pct", 100 * share, "%", Direction::lower, std::nullopt,
         "NCCL kernels' time over the GPU window (every device's, HTA's iteration filter)"});
  p.add({"exposed_communication_pct", 100 * exposed, "%", Direction::lower, std::nullopt,
         "NCCL time with no computation kernel running beside it on the device"});
  if (c.t.rank) p.info["rank"] = *c.t.rank;
  if (dp)
    find(c, p, "DataParallel on several GPUs", "communication", std::nullopt, 0, "medium",
         fmt::format("kernels on {} GPUs in one process and no distributedInfo: torch.nn.DataParallel",
                     c.a.devices.size()),
         "launch with torchrun / accelerate: DistributedDataParallel, one process per GPU", "collective");
  if (ddp_no_nccl)
    find(c, p, "distributed training without NCCL", "communication", std::nullopt, 0, "high",
         fmt::format("distributedInfo.backend is {} on GPUs", c.t.distributed_backend),
         "ddp_backend: nccl", "collective");
  if (100 * share > kCommPct)
    find(c, p, "waiting on collectives", "communication", 1.0 / (1.0 - std::min(exposed, 0.99)), 100 * share, "high",
         fmt::format("NCCL kernels take {:.1f}% of the time (over {:.0f}%: the TensorBoard plugin's rule), {:.1f}% "
                     "with no computation beside them; the gain is the exposed part hidden, an upper bound",
                     100 * share, kCommPct, 100 * exposed),
         "gradient_accumulation_steps: 2x yours  # fewer all-reduces per sample; or larger DDP buckets",
         "collective -p op=all_reduce", true);
  return p;
}

Point copies(Ctx& c) {
  const auto& cp = c.a.copies;
  if (cp.htod_count == 0) return skipped("copies", "no host-to-device copies in the trace");
  Point p = check("copies");
  if (cp.htod_gbps > 0)
    p.add({"htod_gbps", cp.htod_gbps, "GB/s", Direction::higher, std::nullopt,
           "bytes / copy time, the H2D copies whose size the trace gives"});
  if (cp.htod_pageable_gbps > 0)
    p.add({"htod_pageable_gbps", cp.htod_pageable_gbps, "GB/s", Direction::higher, std::nullopt,
           "copies from pageable host memory (Memcpy HtoD (Pageable -> Device))"});
  if (cp.htod_pinned_gbps > 0)
    p.add({"htod_pinned_gbps", cp.htod_pinned_gbps, "GB/s", Direction::higher, std::nullopt,
           "copies from pinned host memory"});
  p.add({"htod_copies", double(cp.htod_count), "copies", Direction::none, std::nullopt, "host-to-device copies"});
  const double share = c.windows > 0 ? cp.htod_pageable_us / c.windows : 0;  // every device's copies, windows
  p.add({"pageable_htod_pct", 100 * share, "%", Direction::lower, std::nullopt,
         "pageable host-to-device copy time over the GPU window"});
  const bool measured = cp.htod_pinned_gbps > 0 && cp.htod_pageable_gbps > 0;
  if (share >= 0.01 && measured && cp.htod_pinned_gbps <= cp.htod_pageable_gbps) {
    // The trace itself says pinning buys nothing here: no finding at "about 1.00x".
    p.info["note"] = fmt::format("pinned copies ran no faster than pageable ones in this trace ({:.1f} against {:.1f} "
                                 "GB/s): dataloader_pin_memory would not help these copies",
                                 cp.htod_pinned_gbps, cp.htod_pageable_gbps);
  } else if (share >= 0.01) {
    const double r = measured ? cp.htod_pinned_gbps / cp.htod_pageable_gbps : kPageableToPinned;
    find(c, p, "pageable host-to-device copies", "copies", amdahl(std::min(share, 0.99), r), 100 * share, "high",
         fmt::format("{} of {} H2D copies come from pageable memory, {:.1f}% of the GPU window at {:.1f} GB/s; pinned "
                     "copies {}",
                     cp.htod_pageable_count, cp.htod_count, 100 * share, cp.htod_pageable_gbps,
                     measured ? fmt::format("ran at {:.1f} GB/s in this trace", cp.htod_pinned_gbps)
                              : "assumed 2.57x faster (PCIe Gen4: about 25.7 GB/s pinned, 3-10 pageable)"),
         "dataloader_pin_memory: true", "dataloader -p pin=pinned,pageable");
  }
  return p;
}

}  // namespace

TraceRead read_trace(const std::string& path) {
  const auto t0 = std::chrono::steady_clock::now();
  readers::ReadOptions ro;
  ro.python_functions = true;  // the host attribution names the Python function the host was in
  TraceRead r{path, readers::read_kineto(path, ro), 0, 0};
  r.read_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  r.peak_rss_mib = double(ru.ru_maxrss) / 1024.0;
  return r;
}

Result diagnose_trace(const std::string& path, const json& meta) {
  const TraceRead tr = read_trace(path);
  return diagnose_read(tr, readers::analyze(tr.trace), meta);
}

Result diagnose_read(const TraceRead& tr, const TraceAnalysis& a, const json& meta) {
  const readers::Trace& t = tr.trace;
  const std::string& path = tr.path;
  const double read_s = tr.read_s;
  Result r;
  r.scenario = "diagnose";
  r.meta = meta;
  r.params = json{{"check", json::array({"utilization", "host", "loader", "dtype", "padding", "attention", "batch", "memory",
                                         "communication", "copies", "cpu", "roofline"})}};
  json devs = json::array();
  for (const auto& d : t.device_properties)
    if (d.is_object()) devs.push_back(d.value("name", std::string()));
  json cats = json::object();
  for (const auto& [k, v] : t.category_counts) cats[k.empty() ? "(none)" : k] = v;
  r.meta["diagnose"] = json{{"source", "trace"}, {"trace", path}};
  r.meta["trace"] = json{{"path", path},
                         {"file_bytes", t.file_bytes},
                         {"json_bytes", t.json_bytes},
                         {"gzip", t.gzip},
                         {"read_s", read_s},
                         {"read_mb_per_s", read_s > 0 ? double(t.json_bytes) / 1e6 / read_s : 0},
                         {"peak_rss_mib", tr.peak_rss_mib},
                         {"events_kept", t.events.size()},
                         {"categories", cats},
                         {"rank", t.rank ? json(*t.rank) : json(nullptr)},
                         {"world_size", t.world_size ? json(*t.world_size) : json(nullptr)},
                         {"devices", devs}};
  r.meta["trace_analysis"] = readers::to_json(a);

  Ctx c{t, a, meta.value("/device/id"_json_pointer, std::string("cpu"))};
  trace_rules::read_cpu_isa(c, meta);  // whether bf16 is native on this CPU (a trace without GPU events)
  for (const auto& d : a.temporal)
    if (!c.dev || d.kernel_us > c.dev->kernel_us) c.dev = &d;
  c.window = c.dev ? c.dev->window_us : 0;
  for (const auto& t : c.a.temporal) c.windows += t.window_us;
  // iterations (ProfilerStep#N, else recovered from the loader's or the optimizer's calls) and what the host
  // did while the GPU waited
  const readers::HtaRows rows = readers::hta_rows(t);
  const readers::Iterations its = readers::find_iterations(t, rows);
  c.iterations = &its;
  c.steps_source = its.source;
  if (its.warmup > 0 || (a.steps.count == 0 && !its.spans.empty()))
    c.steps = readers::steps_over(t, rows, {its.spans.begin() + std::ptrdiff_t(its.warmup), its.spans.end()});
  else
    c.steps = a.steps;
  const readers::HostAttribution host =
      c.dev ? readers::attribute_host(t, a, rows, its, c.dev->device) : readers::HostAttribution{};
  c.host = &host;
  r.meta["host_attribution"] = readers::to_json(host, its);
  r.meta["timeline"] = readers::timeline_json(t, rows, host, its);

  r.points.push_back(utilization(c));
  r.points.push_back(trace_rules::host(c));
  r.points.push_back(loader(c));
  r.points.push_back(dtype(c));
  r.points.push_back(skipped("padding", "a profiler trace has no token counts: padding is measured by diagnose "
                                        "--config with --lengths (the packing scenario)"));
  r.points.push_back(attention(c));
  r.points.push_back(roofline_check(c));
  r.points.push_back(batch(c));
  r.points.push_back(memory(c));
  r.points.push_back(communication(c));
  r.points.push_back(copies(c));
  r.points.push_back(trace_rules::cpu(c));  // a trace without GPU events, read from its CPU ops

  std::stable_sort(c.found.begin(), c.found.end(), [](const Finding& x, const Finding& y) {
    return x.speedup.value_or(0) > y.speedup.value_or(0);
  });
  trace_rules::attach_host_evidence(c, c.found);
  trace_rules::finish_cpu(c, c.found);
  r.findings = c.found;
  if (r.findings.empty())
    r.findings.push_back({"none found",
                          "none of the trace rules fired (each check's figures are in its point)", std::nullopt,
                          json::object()});
  return r;
}

}  // namespace sb::diagnose
