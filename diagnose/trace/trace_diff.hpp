// diagnose --trace NEW --baseline OLD: what changed between two runs of the same model (before and after an
// upgrade, a config change, another machine), per step.
//
// Each trace is reduced to a per-step profile over its iterations (ProfilerStep#N, else the loader's or the
// optimizer's calls, after warm-up; else its whole window as one): the step's median time; on a GPU, the
// busiest device's compute, communication, copies and idle time, the idle split by what the host did
// (host_attribution.hpp); every kernel family's and every CPU op's self time and calls per step; the GEMMs'
// element type (GPU: from kernel names; CPU: the ops' Input type); the DataLoader's wait and iterator; the
// synchronizing calls (.item(), cudaStreamSynchronize, ...) and the allocator's calls per step.
//
// The difference in step time is then explained by category, then by the kernels and ops that grew,
// appeared or went, and named where a rule knows the change: the GEMMs' dtype (autocast or bf16 off or on),
// the loader (its workers), a new synchronization in the step, allocator churn, another convolution
// algorithm (cuDNN's choice), communication. Each named change carries its measured time per step.
#pragma once

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "diagnose/trace/trace_diagnose.hpp"  // TraceRead
#include "harness/result.hpp"                 // Result

namespace sb::diagnose {

Result diagnose_diff(const TraceRead& now, const TraceRead& base, const nlohmann::ordered_json& meta);

}  // namespace sb::diagnose
