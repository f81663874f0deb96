// Where a CPU-only training step's time goes, from a PyTorch profiler trace without GPU events.
//
// On a CPU the device is the host: there is no idle GPU to attribute, so the step itself is swept. The
// training thread (the one with ProfilerStep#N, else the DataLoader's __next__, else Optimizer.step#, else
// the one with the most ops) is flattened into what was innermost at each instant: a CPU op, an annotation
// or a Python function (python_function, with_stack=True). Inside each iteration after warm-up
// (host_attribution.hpp's Iterations; the thread's whole span when there are none) that time is summed by
// what it was, the innermost event read with its ancestors:
//   loader         inside the DataLoader's __next__
//   communication  inside a collective (gloo:all_reduce, nccl:..., c10d::..., record_param_comms)
//   sync           inside aten::item / _local_scalar_dense (a tensor read into Python: .item(), print(loss))
//   allocation     inside a tensor factory (aten::empty, zeros, ones, full, *_like, new_*): allocating and
//                  filling fresh memory
//   optimizer      inside Optimizer.step#... / Optimizer.zero_grad#...
//   gemm           a GEMM or convolution op innermost (aten::mm, addmm, bmm, baddbmm, mkldnn_convolution ...);
//                  its element type read from its "Input type" (record_shapes=True)
//   compute        any other op doing arithmetic innermost (relu, add, sum, the loss, copies)
//   autograd       an autograd node innermost (autograd::engine::evaluate_function: ..., AddmmBackward0), or
//                  Python's run_backward with no node inside: the engine's own bookkeeping between the
//                  backward's ops
//   framework      a view or metadata op innermost (aten::view, t, transpose, detach, as_strided, to ...): the
//                  dispatcher's time with no arithmetic
//   python         a Python function innermost, no op inside it
//   nothing        inside the iteration with nothing recorded (untraced Python without with_stack)
// The compute share of a step is gemm + compute over its time; the rest is the framework around the math
// (optimizer, autograd, views, Python, ...). Beside the sweep: the GEMMs' element types, the leaf ops'
// durations (tiny ops: the dispatch costs about as much as the arithmetic), the .item() calls per step,
// the collectives on every thread (their union over the steps, and of it the part the training thread
// computed nothing), and each nn.Module's own forward time (python_function "nn.Module: Name_k", less
// the modules inside it) with the ops it ran, and the backward of those ops (each autograd node named by
// the "Sequence number" of the forward op that made it).
#pragma once

#include <array>    // std::array
#include <cstdint>  // std::int64_t
#include <map>      // std::map
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "diagnose/trace/host_attribution.hpp"  // Iterations
#include "readers/kineto.hpp"                   // Trace

namespace sb::readers {

enum class CpuCause : std::uint8_t {
  gemm,
  compute,
  allocation,
  sync,
  loader,
  communication,
  optimizer,
  autograd,
  framework,
  python,
  nothing,
};
constexpr std::size_t kCpuCauses = 11;
const char* to_string(CpuCause c);

struct CpuItem {
  CpuCause cause = CpuCause::nothing;
  std::string name;   // the op, annotation or function; a GEMM's with its element type ("aten::addmm (f32)")
  std::string where;  // the nearest Python frame of the user's code, where with_stack recorded one
  double us = 0;
  std::int64_t calls = 0;  // the calls of `name` that covered some of it
  double longest_call_us = 0;
};

struct CpuModule {
  std::string name;         // "nn.Module: RowNorm_0"
  double own_us = 0;        // its forward's time less its submodules', inside the steps
  double backward_us = 0;   // the backward nodes of its own forward ops (their "Sequence number")
  double compute_us = 0;    // of both, gemm + compute innermost
  double alloc_us = 0;      // of both, inside tensor factories
  std::int64_t calls = 0;   // forward calls inside the steps
  std::int64_t ops = 0;     // CPU ops run in its own forward (not its submodules')
  double op_median_us = 0;  // of those without an op inside them
  std::string where;        // its forward's frame ("model.py(41): forward")
};

struct CpuBreakdown {
  bool applies = false;  // no GPU events, and CPU ops or annotations to read
  std::int64_t pid = -1, tid = -1;  // the training thread
  std::string steps_source;         // Iterations::source, or "the thread's span"
  std::size_t steps = 0, warmup = 0;
  double steps_us = 0;  // the iterations after warm-up, summed
  std::array<double, kCpuCauses> by_cause{};
  std::vector<CpuItem> items;           // largest first
  std::vector<double> compute_pct;      // per step: gemm + compute over its time
  std::map<std::string, double> gemm_us_by_type;  // "f32", "bf16", ..., "" (no Input type)
  std::int64_t gemm_calls = 0, leaf_ops = 0;
  double gemm_median_us = 0, leaf_op_median_us = 0;  // calls without an op inside them (the leaf ops)
  std::int64_t sync_calls = 0, steps_with_sync = 0;  // aten::item (or _local_scalar_dense) calls
  std::string sync_where;                             // the first one's Python frame
  double communication_us = 0;  // the collectives' union (any thread) inside the steps
  double communication_exposed_us = 0;  // of it, the training thread doing no gemm or compute
  std::int64_t collectives = 0;  // overlapping the steps
  std::int64_t collectives_in_trace = 0;
  std::string collective_name;  // the most frequent
  std::vector<CpuModule> modules;  // by own time, largest first
  std::int64_t cpu_ops = 0;        // CPU ops on every thread
  bool python_functions = false;
  bool shapes = false;  // some op has an Input type (record_shapes=True)
  double us(CpuCause c) const { return by_cause[std::size_t(c)]; }
  double share(CpuCause c) const { return steps_us > 0 ? us(c) / steps_us : 0; }
};

// The breakdown of a trace without GPU events (applies false when it has some, or nothing on the CPU).
CpuBreakdown cpu_breakdown(const Trace& t, const Iterations& it);
// "compute ops 12% of the step (GEMM 8%: aten::mm (f32) 6%, ...); the rest: aten::zeros [allocation] 70%,
// ...": the `top` largest items.
std::string cpu_line(const CpuBreakdown& b, std::size_t top = 5);
nlohmann::ordered_json to_json(const CpuBreakdown& b);

}  // namespace sb::readers
