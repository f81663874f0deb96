// Each counted op against the card's roofline, from a trace recorded with record_shapes=True.
//
// The ops whose work can be counted from their input shapes (readers/kineto.hpp counted_op: GEMMs,
// convolutions and their backward, fused attention and its backward) get their FLOPs and the bytes of their
// inputs and output; their GPU time is the kernels their runtime calls launched (by correlation, on the
// op's thread, inside its span). Grouped by op, shapes and dtype: achieved TFLOP/s and TB/s, arithmetic
// intensity, and, where results/expected/ has the card (matched by the trace's deviceProperties name), the
// datasheet peak for the dtype, the memory bandwidth, the roofline's attainable TFLOP/s at that intensity
// (min(peak, bandwidth x intensity)), the share of it reached, and whether the op is compute- or
// memory-bound (its intensity against the ridge point, peak / bandwidth).
//
// FLOPs: mm/addmm 2MNK; bmm/baddbmm 2BMNK; convolution 2 N C_out prod(out) (C_in/groups) prod(kernel), out
// from stride, padding and dilation (Concrete Inputs; assumed 1, 0, 1 and said so where the trace lacks
// them); convolution_backward twice its forward (input and weight gradients); attention 4 B H S_q S_k D,
// halved when causal; its backward 2.5x that (FlashAttention-2's count). Bytes: each input and the output
// once, at the element size of their dtype: a lower bound on the traffic.
#pragma once

#include <cstdint>  // std::int64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "readers/kineto.hpp"  // Trace, Event, OpShape

namespace sb::diagnose {

struct OpWork {
  double flops = 0, bytes = 0;
  std::string dtype;     // "bf16", "f16", "f32", ... of its first tensor input
  std::string category;  // "gemm", "conv", "attention"
  bool assumed = false;  // a stride, padding or causal flag assumed (the trace lacks Concrete Inputs)
};
// The work of a counted op from its shapes; flops 0 when the shapes do not fit the op.
OpWork op_work(const std::string& name, const readers::OpShape& s);

struct RooflineRow {
  std::string op, shapes, dtype, category;
  std::int64_t calls = 0;
  double gpu_us = 0, flops = 0, bytes = 0;
  double tflops = 0, tbps = 0, intensity = 0;  // achieved; FLOP/byte
  double peak_tflops = 0, peak_tbps = 0;       // the card's, 0 unknown
  double attainable_tflops = 0, pct_of_attainable = 0;
  std::string bound;  // "compute", "memory", or "" (no peak)
  bool assumed = false;
  std::string kernel_dtype;  // from its kernels' names where they say ("tf32": an fp32 op on Tensor Cores)
};

struct Roofline {
  std::string card, card_source;  // the expected file matched, its peaks' source
  double peak_bw_tbps = 0;
  double counted_gpu_us = 0;  // the counted ops' GPU time
  double kernel_us = 0;       // every kernel's time
  double flops = 0;           // the counted ops', summed
  std::int64_t ops_with_shapes = 0, ops_without_gpu = 0;
  std::vector<RooflineRow> rows;  // every group, by GPU time
};

// `peaks`: an expected file's document (results/expected/*.json: peaks.tflops.<dtype>, memory_bandwidth), or
// null when the card is not known.
Roofline roofline(const readers::Trace& t, const nlohmann::ordered_json& peaks);
// The expected file whose hardware.match.name_contains names the trace's device (null when none does).
nlohmann::ordered_json expected_for_trace(const readers::Trace& t);
nlohmann::ordered_json to_json(const Roofline& r, std::size_t top = 10);
// The row that loses the most GPU time against its roofline (its time x the share of its attainable it does
// not reach; its time alone without peaks), and what would move it, or nullptr.
const RooflineRow* holds_back(const Roofline& r);
std::string fix_hint(const RooflineRow& row);

}  // namespace sb::diagnose
