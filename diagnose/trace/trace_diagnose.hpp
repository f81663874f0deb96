// diagnose --trace: the causes named from what a real job left behind, a
// PyTorch profiler trace (readers/kineto.hpp), in the same order and the same
// result shape as diagnose --config (one point per check, findings ranked by
// their estimated gain), so the same report, HTML and `compare` serve both.
//
// The rules: every rule of the PyTorch TensorBoard profiler plugin's
// "Performance Recommendation" (tb_plugin/torch_tb_profiler/profiler/
// run_generator.py, removed from the Kineto repository in April 2026):
//   DataLoader over 5% of step time             -> more workers (loader)
//   Tensor-Core-eligible work on kernels without Tensor Cores
//                                               -> mixed precision (dtype)
//   peak memory over 90% of the device          -> checkpointing or mixed precision (memory)
//   kernels on several GPUs in one process      -> DistributedDataParallel (communication)
//   distributed without NCCL                    -> NCCL (communication)
//   communication over 10% of step time         -> fewer, larger all-reduces / accumulation
//   GPU utilization under 50%                   -> a larger batch (batch)
// and beyond it: each finding carries its share of the time, the estimated
// gain of its fix (Amdahl over the device's window, with the speedup of the
// fixed part stated and sourced), a confidence, the config line to change
// and the `stallbench run ...` that reproduces the cause on this machine.
//
// What a trace cannot show is said, not guessed: padding (a trace has no
// token counts; diagnose --config --lengths measures it).
#pragma once

#include <string>  // std::string

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "diagnose/trace/trace_analysis.hpp"  // TraceAnalysis
#include "harness/result.hpp"                  // Result
#include "readers/kineto.hpp"                   // Trace

namespace sb::diagnose {

// Reads the trace at `path` (plain or .gz; exit 2 when it is not one) and
// diagnoses it. `meta` is the run's meta; the trace's own (file, size, read
// time and rate, rank, devices) is added under meta["trace"], and HTA's
// figures under meta["trace_analysis"].
Result diagnose_trace(const std::string& path, const nlohmann::ordered_json& meta);

// A trace as read: the events kept, how long the read took and the process's peak memory after it.
struct TraceRead {
  std::string path;
  readers::Trace trace;
  double read_s = 0, peak_rss_mib = 0;
};
// Reads a trace for diagnosis (python_function events kept: the host attribution names them).
TraceRead read_trace(const std::string& path);
// diagnose_trace on a trace already read and analysed (a job's ranks are read in parallel).
Result diagnose_read(const TraceRead& tr, const readers::TraceAnalysis& a, const nlohmann::ordered_json& meta);

}  // namespace sb::diagnose
