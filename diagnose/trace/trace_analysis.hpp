// What a PyTorch profiler trace says, as figures. The breakdowns are defined
// as Holistic Trace Analysis (HTA) defines them, so the two tools' figures can
// be compared (docs/trace-analysis.md has the definitions and HTA's source
// they come from; tests/peer checks the agreement on real traces):
//
//   temporal breakdown, per device: kernel time = |union of the device's GPU
//     events (kernels, memcpy, memset)|; compute = |union of computation
//     kernels|; non-compute = kernel time - compute; idle = (last end - first
//     start) - kernel time; each as % of (last end - first start).
//   idle time, per stream: the gaps between consecutive GPU events on the
//     stream: kernel wait when the gap is under the consecutive-kernel
//     threshold; host wait when the next event's launch (its runtime call,
//     by correlation) began after the previous event ended; other the rest.
//   launch statistics: each GPU event paired with its runtime call by
//     correlation: cpu duration (the call), gpu duration (the event), launch
//     delay (event start - call start); short kernels (gpu < cpu); outliers
//     past the cutoffs.
//
// Beyond HTA: steps (ProfilerStep#N), the DataLoader's __next__ inside them,
// host-to-device copies (pageable or pinned, bandwidth), kernel families
// (GEMM dtype from the kernel names, attention implementation, NCCL and its
// overlap with compute), peak memory against capacity.
#pragma once

#include <cstdint>  // std::int64_t
#include <map>      // std::map
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "readers/kineto.hpp"  // Trace

namespace sb::readers {

enum class KernelType { computation, memory, communication, other };
// HTA's classification (utils.py get_kernel_type), by name alone:
// communication ^nccl.*Kernel, memory ^Memcpy|^Memset|^dma, other a name
// with Memcpy or Sync in it, computation the rest.
KernelType kernel_type(const std::string& name);

// The element type a GEMM kernel's name says it computes in ("" when the
// name is not a GEMM's or does not say): "f32" (SIMT, no Tensor Cores),
// "tf32", "bf16", "f16", "fp8", "f64", "i8".
std::string gemm_dtype(const std::string& kernel_name);
// The attention implementation a kernel's name belongs to: "flash",
// "cudnn", "mem_efficient", "softmax" (the math path's softmax between its
// two GEMMs), or "".
std::string attention_family(const std::string& kernel_name);

struct AnalysisOptions {
  // HTA rounds every time to whole µs when any ts is a float: ts' = ceil(ts),
  // dur' = floor(ts + dur) - ts' (trace.py round_down_time_stamps).
  bool hta_rounding = true;
  // With two or more ProfilerStep names HTA keeps CPU rows that start before
  // the last step and the GPU rows they launched (trace.py
  // _filter_irrelevant_gpu_kernels). Steps and families below see every event.
  bool iteration_filter = true;
  double consecutive_kernel_delay_us = 30;  // HTA's default
  double runtime_cutoff_us = 50;            // launch stats outliers (HTA's defaults)
  double launch_delay_cutoff_us = 100;
};

struct Temporal {
  std::int64_t device = 0;
  double window_us = 0, kernel_us = 0, compute_us = 0, non_compute_us = 0, idle_us = 0;
  double communication_us = 0, memory_us = 0;  // unions of those kernel types
  double idle_pct = 0, compute_pct = 0, non_compute_pct = 0;
};

struct StreamIdle {
  std::int64_t device = 0, stream = 0;
  std::int64_t events = 0;
  double idle_us = 0, host_wait_us = 0, kernel_wait_us = 0, other_us = 0;
  double busy_us = 0;  // its computation kernels' time (not HTA's: which stream computes the most)
};
// The stream of `device` whose computation kernels took the most time (its compute stream, not NCCL's or a
// copy stream's; HTA reports each stream's idle time alone, and a side stream's long gaps are not the
// device's), or nullptr without a stream.
const StreamIdle* busiest_stream(const std::vector<StreamIdle>& idle, std::int64_t device);

struct LaunchStats {
  std::int64_t pairs = 0;
  double cpu_sum_us = 0, gpu_sum_us = 0, delay_sum_us = 0;
  double cpu_median_us = 0, gpu_median_us = 0, delay_median_us = 0;
  std::int64_t short_kernels = 0;       // gpu < cpu
  std::int64_t short_kernels_plot = 0;  // HTA's plot: cpu <= runtime cutoff and gpu < cpu
  std::int64_t runtime_outliers = 0, launch_delay_outliers = 0;
};

struct Copies {
  std::int64_t htod_count = 0, htod_pageable_count = 0;
  double htod_us = 0, htod_pageable_us = 0;
  std::int64_t htod_bytes = 0, htod_pageable_bytes = 0;
  double htod_gbps = 0, htod_pageable_gbps = 0, htod_pinned_gbps = 0;  // bytes / time
  double dtoh_us = 0, other_us = 0;
};

struct Steps {
  std::int64_t count = 0;
  double total_us = 0, median_us = 0;
  double dataloader_us = 0;  // the DataLoader's __next__ inside the steps
  // of it, the time no GPU kernel, copy or memset runs and no CUDA runtime call is made (the
  // TensorBoard plugin's DataLoader cost: the time the device waits on the loader)
  double dataloader_exposed_us = 0;
  // Which iterator's __next__ the trace shows: "single" (_SingleProcessDataLoaderIter:
  // num_workers 0), "multi" (_MultiProcessingDataLoaderIter: workers already), or "" (neither named).
  std::string loader_iter;
  double gpu_busy_us = 0;    // |union of GPU events| inside the steps, every device
  std::vector<double> step_us;
};

struct Families {
  std::map<std::string, double> gemm_us_by_dtype;  // "f32", "tf32", "bf16", ..., "unknown"
  std::map<std::string, double> attention_us;      // "flash", "cudnn", "mem_efficient", "softmax"
  double gemm_us = 0;
  double nccl_us = 0;           // |union of communication kernels|, every device
  double nccl_exposed_us = 0;   // of that, not overlapped by computation on the same device
  std::vector<std::string> sdpa_ops;  // aten::_scaled_dot_product_* cpu ops seen
  double math_attention_us = 0;       // softmax kernels + the GEMMs right before and after them
};

struct MemoryPeak {
  std::int64_t device = 0;
  std::int64_t peak_allocated = 0, peak_reserved = 0, capacity = 0;  // bytes; capacity 0 = unknown
  // the largest allocated / capacity of a sample (its own Limit where it has one), %; 0 = unknown
  double peak_pct = 0;
};

struct TraceAnalysis {
  std::vector<Temporal> temporal;  // one per device with GPU events
  std::vector<StreamIdle> idle;    // one per (device, stream)
  LaunchStats launch;
  Copies copies;
  Steps steps;
  Families families;
  std::vector<MemoryPeak> memory;
  std::int64_t gpu_events = 0, cpu_ops = 0, runtime_calls = 0;
  std::vector<std::int64_t> devices;  // with GPU events
  std::string device_name;            // deviceProperties[0].name, or ""
  bool amd = false;                   // hip runtime calls
  bool rounded = false;               // times rounded as HTA rounds them
  bool iteration_filter = false;      // HTA's iteration filter applied
};

TraceAnalysis analyze(const Trace& t, const AnalysisOptions& opt = {});

// The events as HTA's figures see them: each event's start and end (rounded to whole µs as HTA rounds
// them when any ts is a float) and whether HTA's iteration filter keeps it (all kept without the filter).
struct HtaRows {
  std::vector<double> ts, te;
  std::vector<char> kept;
  bool rounded = false, iteration_filter = false;
};
HtaRows hta_rows(const Trace& t, const AnalysisOptions& opt = {});

// The figures as JSON (for the peer test and the result's point info).
nlohmann::ordered_json to_json(const TraceAnalysis& a);

}  // namespace sb::readers
