// What the host was doing while the GPU waited, from a PyTorch profiler trace.
//
// The GPU's idle intervals are Holistic Trace Analysis's (trace_analysis.hpp): the gaps between
// consecutive kernels, copies and memsets of the device's busiest compute stream, with HTA's rounding
// and iteration filter. Each gap is cut into pieces:
//   - another stream of the device runs something (an NCCL kernel, a copy): not the host's;
//   - HTA's kernel wait (under 30 µs, the next kernel already launched): back-to-back kernels;
//   - HTA's other (30 µs or more, the next kernel already launched): the stream waited on an event;
//   - HTA's host wait: the next kernel's launch came after the stream ran dry. The thread that made
//     that launch is swept: at each instant, the innermost of its CPU ops, runtime calls and Python
//     functions (python_function, when the trace has them) is what the host was doing. A gap that
//     opens while that thread sat in a blocking call (cudaStreamSynchronize, a blocking cudaMemcpy,
//     .item()) is the sync's: the host let the queue drain and the launches after it came late.
// Each piece is summed by what covered it, ranked, and mapped to a cause: the DataLoader's __next__,
// synchronization, the allocator (cudaMalloc/cudaFree, hipMalloc/hipFree), one-off set-up (stream and
// event creation, module loading), kernel launches, the optimizer step, other host ops, Python, or
// nothing recorded.
//
// Iterations, where the trace has no ProfilerStep#N, are recovered from the loader's own
// enumerate(DataLoader)#...__next__ calls, else Optimizer.step#... or Optimizer.zero_grad#...; a first
// iteration over 3x the median of the others is warm-up (one-off set-up, cuDNN's autotuning, lazy
// kernel loading) and its gaps are kept apart.
#pragma once

#include <array>    // std::array
#include <cstdint>  // std::int64_t
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "diagnose/trace/trace_analysis.hpp"  // TraceAnalysis, HtaRows, Steps
#include "readers/kineto.hpp"                 // Trace

namespace sb::readers {

enum class HostCause : std::uint8_t {
  loader,        // inside the DataLoader's __next__
  sync,          // a blocking call, or the drain after one
  allocator,     // cudaMalloc / cudaFree / hipMalloc / hipFree ...
  setup,         // stream and event creation, module loading, device queries
  launch,        // kernel launches and async copy/memset calls
  optimizer,     // inside Optimizer.step#... / Optimizer.zero_grad#...
  host_op,       // another CPU op or runtime call (the framework's own time per op)
  python,        // a Python function with no op inside it
  nothing,       // the launching thread recorded nothing (untraced Python, another thread's work)
  other_stream,  // another stream of the device ran meanwhile
  kernel_wait,   // HTA's kernel wait: back-to-back kernels, gaps under 30 µs
  gpu_wait,      // HTA's other: the next kernel was launched already
};
constexpr std::size_t kHostCauses = 12;
const char* to_string(HostCause c);
// The causes that are the host issuing work: launches, op dispatch, Python, the optimizer's ops.
bool issuing(HostCause c);

struct HostItem {
  HostCause cause = HostCause::nothing;
  std::string name;   // the innermost host event, or what the time was
  std::string where;  // a blocking or allocator call's op and nearest Python frame ("aten::item; train.py(118): <module>")
  double us = 0;
  std::int64_t gaps = 0;       // the GPU idle intervals it covered some of
  std::int64_t pieces = 0;     // the stretches of them
  double longest_call_us = 0;  // the longest single event so named that covered some of the gaps
};

// One stretch of a gap and what covered it (the timeline the HTML report draws), µs as HtaRows has them.
struct HostPiece {
  double ts = 0, te = 0;
  HostCause cause = HostCause::nothing;
};

struct Iterations {
  // "ProfilerStep#N", "enumerate(DataLoader)#...__next__", "Optimizer.step#...", "Optimizer.zero_grad#...", or ""
  std::string source;
  std::vector<std::pair<double, double>> spans;  // [start, end), µs as HtaRows has them, in order
  std::size_t warmup = 0;                        // leading spans taken as warm-up (0 or 1)
  double median_us = 0;                          // of the spans after the warm-up
};

struct HostAttribution {
  std::int64_t device = -1, stream = -1;
  double window_lo = 0, window_hi = 0, window_us = 0;  // the device's GPU window (HTA's)
  double idle_us = 0;                                  // the stream's gaps, summed
  std::int64_t gaps = 0;
  std::array<double, kHostCauses> by_cause{};  // µs of the steady part (after warm-up)
  std::vector<HostItem> items;                 // the steady part, largest first
  // warm-up: the gaps before warmup_end (trace time), attributed alike
  double warmup_end = 0;
  double warmup_us = 0;
  std::array<double, kHostCauses> warmup_by_cause{};
  std::vector<HostItem> warmup_items;
  double steady_window_us = 0;  // the window after warm-up
  // The stream's events after warm-up, and of them those whose launch came after the stream ran dry (HTA's
  // host wait): most of them late, the host is what paces the GPU.
  std::int64_t events = 0, late_launches = 0;
  bool python_functions = false;  // the trace has python_function events
  bool ops_recorded = false;      // the trace has CPU ops or Python functions, not only runtime calls
  std::vector<HostPiece> pieces;  // every gap's stretches in time order within a gap (warm-up included)
  double us(HostCause c) const { return by_cause[std::size_t(c)]; }
};
// The host's time issuing work in the steady part: the issuing causes, and time with nothing recorded
// where the trace records only runtime calls (the host's own work between its launches; where ops are
// recorded, nothing recorded is time the trace cannot attribute: a sampled trace, untraced threads).
double issuing_us(const HostAttribution& h);

// Iterations as the trace shows them (ProfilerStep#N first); times as `rows` has them.
Iterations find_iterations(const Trace& t, const HtaRows& rows);
// The loader's figures (trace_analysis.hpp Steps) over these spans.
Steps steps_over(const Trace& t, const HtaRows& rows, const std::vector<std::pair<double, double>>& spans);
// The host's time in the gaps of `device`'s busiest compute stream. An empty attribution (stream -1)
// without GPU events.
HostAttribution attribute_host(const Trace& t, const TraceAnalysis& a, const HtaRows& rows, const Iterations& it,
                               std::int64_t device, const AnalysisOptions& opt = {});

// "the GPU waited 62% of the window; the host was in: DataLoader __next__ 45%, cudaStreamSynchronize (in
// aten::item) 9%, ...": the `top` largest items of the steady part over the steady window (or of the
// warm-up over its part of the window). Another stream's work is not the host's and is left out.
std::string host_line(const HostAttribution& h, bool warmup = false, std::size_t top = 5);
nlohmann::ordered_json to_json(const HostAttribution& h, const Iterations& it);
// The timeline the HTML report draws: for up to `max_iterations` iterations (the steady ones; the whole GPU
// window as one without iterations), the device's busy stretches and each gap's stretches by cause, relative
// to the iteration's start in ms, adjacent stretches of one kind merged and stretches under 1/600 of the
// iteration dropped.
nlohmann::ordered_json timeline_json(const Trace& t, const HtaRows& rows, const HostAttribution& h,
                                     const Iterations& it, std::size_t max_iterations = 12);

}  // namespace sb::readers
