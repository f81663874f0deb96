// diagnose --trace on a trace without GPU events: the same causes as on a GPU, read from the CPU ops
// themselves (cpu_breakdown.hpp), each named from its own share of the steps:
//   a sync in the step     an .item() (aten::item / _local_scalar_dense) in nearly every step: on a CPU it
//                          waits for nothing (its cost is the trace's), on a GPU each one drains the queue
//   allocator churn        over 5% of the steps inside tensor factories (aten::zeros, empty, full, ...)
//   a slow custom layer    one nn.Module's own forward and the backward of its ops over 10% of the steps,
//                          run as many small ops (32 or more a call, a median under 50 us): a Python loop, not
//                          a few large ops (the allocations of its backward are its, not allocator churn's)
//   dtype                  fp32 GEMMs (their Input type) over half the GEMM time and 5% of the steps:
//                          bf16 named only on a CPU with native bf16 (avx512_bf16, AMX); without it bf16 is
//                          emulated, slower than fp32, and fp32 is said to be right. bf16 GEMMs on such a
//                          CPU are a finding of their own
//   framework overhead     the framework around the math (optimizer, autograd, views, Python, time with no
//                          op) over half of what the causes above leave, around tiny ops (under 50 us of
//                          arithmetic an op on average): the CPU's launch-bound
//   waiting on collectives collectives (gloo:all_reduce ...) on any thread covering over 10% of the steps
//                          (the TensorBoard plugin's line)
//   CPU-only               every such trace; it leads where the steps hold no compute op (under 5% and no
//                          GEMM): then the trace shows none of the job's own work
#include <algorithm>  // std::min, std::max
#include <string>     // std::string

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "diagnose/trace/trace_rules.hpp"

namespace sb::diagnose::trace_rules {
namespace {

using json = nlohmann::ordered_json;
using readers::CpuBreakdown;
using readers::CpuCause;

constexpr double kCpuCausePct = 5;      // allocation, a sync's own cost: the host rules' line
constexpr double kLayerPct = 10;        // a module's own forward over the steps
constexpr std::int64_t kLayerOps = 32;  // ops per forward call
constexpr double kTinyOpUs = 50;        // an op's arithmetic: its dispatch (a few us) a large part of it
constexpr double kOverheadOfRest = 0.5;
constexpr double kCommPct = 10;         // the TensorBoard plugin's communication line
constexpr double kNoComputePct = 5;
// fp32 to bf16 GEMMs on a CPU with native bf16: AVX512-BF16's dot product does twice the multiply-adds of
// an fp32 FMA per instruction (AMX more): the low end, as on a GPU
constexpr double kF32ToBf16 = 2.0;

double upto(double s) { return 1.0 / (1.0 - std::min(s, 0.99)); }
double pct(const CpuBreakdown& b, double us) { return b.steps_us > 0 ? 100 * us / b.steps_us : 0; }
std::string steps_text(const CpuBreakdown& b) {
  return fmt::format("{} {} ({})", b.steps, b.steps == 1 ? "step" : "steps", b.steps_source);
}
const readers::CpuItem* top_item(const CpuBreakdown& b, CpuCause c) {
  for (const auto& i : b.items)
    if (i.cause == c) return &i;
  return nullptr;
}

// The arithmetic an op does on average: under 50 us, the dispatch around each (a few us) is a large part.
double arithmetic_per_op(const CpuBreakdown& b) {
  return b.leaf_ops > 0 ? (b.us(CpuCause::gemm) + b.us(CpuCause::compute)) / double(b.leaf_ops) : 0;
}

bool has_isa(const Ctx& c, const char* flag) {
  return std::find(c.cpu_isa.begin(), c.cpu_isa.end(), flag) != c.cpu_isa.end();
}
bool native_bf16(const Ctx& c) { return has_isa(c, "avx512_bf16") || has_isa(c, "amx_bf16"); }

void sync(Ctx& c, Point& p, const CpuBreakdown& b) {
  // nearly every step (one may fall outside a step's edge)
  if (b.sync_calls < std::int64_t(b.steps) || b.steps_with_sync * 5 < std::int64_t(b.steps) * 4) return;
  const double s = b.share(CpuCause::sync);
  const bool costly = 100 * s > kCpuCausePct;
  find(c, p, "a sync in the step (.item() every step)", "cpu", costly ? std::optional(upto(s)) : std::nullopt, 100 * s,
       costly ? "high" : "medium",
       fmt::format("{} reads of a tensor into Python (aten::item) in {} of the {}{}: on a CPU they wait for nothing "
                   "and cost {:.2f}% of the steps ({:.0f} us in all){}; on a GPU each one blocks the host until the "
                   "queue drains, and the launches after it come late",
                   b.sync_calls, b.steps_with_sync, steps_text(b),
                   b.sync_where.empty() ? "" : ", the first in " + b.sync_where, 100 * s, b.us(CpuCause::sync),
                   costly ? "" : " (no gain to estimate from this trace: the GPU's drain is the cost)"),
       "logging_steps: 10  # or more; no loss.item(), print(loss), .cpu() or .tolist() in the step: keep the loss "
       "as a tensor until a logging step",
       "train -p micro_batch=1,4", costly);
}

// `layer`: the slow layer named, whose own allocations (a row loop's backward makes a zeroed tensor per
// row) are its finding's.
void allocation(Ctx& c, Point& p, const CpuBreakdown& b, const readers::CpuModule* layer) {
  const double s = std::max(0.0, b.us(CpuCause::allocation) - (layer ? layer->alloc_us : 0)) / b.steps_us;
  if (100 * s <= kCpuCausePct) return;
  const readers::CpuItem* top = top_item(b, CpuCause::allocation);
  find(c, p, "allocator churn (tensors allocated and filled in every step)", "cpu", upto(s), 100 * s, "high",
       fmt::format("the training thread spent {:.1f}% of the {} inside tensor factories{}{}: fresh memory mapped, "
                   "faulted in and filled each time (a large allocation comes from the OS, not a cache); the gain "
                   "assumes that time gone (an upper bound)",
                   100 * s, steps_text(b), layer && layer->alloc_us > 0 ? " outside the slow layer" : "",
                   top ? fmt::format(", most in {}{} ({} calls, the longest {:.1f} ms)", top->name,
                                     top->where.empty() ? "" : " (in " + top->where + ")", top->calls,
                                     top->longest_call_us / 1e3)
                       : ""),
       "allocate the buffer once, outside the step, and reuse it (buf.zero_(), out=buf); many mid-size tensors: "
       "LD_PRELOAD jemalloc or tcmalloc",
       "memory", true);
}

// The module that is a Python loop of small ops (nullptr: none): its forward and the backward of its ops.
const readers::CpuModule* slow_layer(Ctx& c, Point& p, const CpuBreakdown& b) {
  for (const readers::CpuModule& m : b.modules) {
    const double us = m.own_us + m.backward_us;
    if (pct(b, us) <= kLayerPct) break;  // largest first
    if (m.calls <= 0 || m.ops < kLayerOps * m.calls || m.op_median_us >= kTinyOpUs) continue;
    const double s = us / b.steps_us;
    find(c, p, "a slow custom layer (a Python loop of small ops)", "cpu", upto(s), 100 * s, "medium",
         fmt::format("{}{} holds {:.1f}% of the {}: {:.1f}% in its own forward (its submodules' left out), {:.1f}% "
                     "in the backward of its ops ({:.1f}% allocating); {} ops a forward call with a median of {:.1f} "
                     "us, {:.0f}% of its time in arithmetic: a loop of small ops in Python, not a few large ones; the "
                     "gain assumes its time gone (an upper bound)",
                     m.name, m.where.empty() ? "" : " (" + m.where + ")", 100 * s, steps_text(b), pct(b, m.own_us),
                     pct(b, m.backward_us), pct(b, m.alloc_us), m.ops / m.calls, m.op_median_us,
                     us > 0 ? 100 * m.compute_us / us : 0),
         fmt::format("torch_compile: true  # or write {}'s forward in whole-tensor ops (no loop over rows)",
                     m.name.substr(m.name.find(' ') + 1)),
         "train -p dispatch_us=10,100", true);
    return &m;
  }
  return nullptr;
}

void dtype(Ctx& c, Point& p, const CpuBreakdown& b) {
  double gemm = 0;
  for (const auto& [k, v] : b.gemm_us_by_type) gemm += v;
  if (gemm <= 0) return;
  auto us = [&](const char* k) { return b.gemm_us_by_type.count(k) ? b.gemm_us_by_type.at(k) : 0.0; };
  const double f32 = us("f32"), half = us("bf16") + us("f16");
  p.add({"fp32_gemm_pct", 100 * f32 / gemm, "%", Direction::lower, std::nullopt,
         "of GEMM and convolution time: ops whose first tensor input is float (their Input type)"});
  p.add({"bf16_gemm_pct", 100 * half / gemm, "%", Direction::none, std::nullopt, "of GEMM time: bf16 or fp16 inputs"});
  const double share = gemm / b.steps_us;
  if (share < 0.05) return;
  const bool known = c.cpu_isa_known;
  const std::string cpu = known ? fmt::format("this machine's CPU ({})", c.cpu_isa.empty() ? "no listed ISA extension"
                                                                                             : fmt::format("{}", fmt::join(c.cpu_isa, ", ")))
                                : "the CPU";
  if (f32 >= 0.5 * gemm && known && native_bf16(c)) {
    const double s32 = f32 / b.steps_us;
    find(c, p, "fp32 where bf16 would do", "dtype", 1.0 / (1.0 - s32 + s32 / kF32ToBf16), 100 * s32, "medium",
         fmt::format("{:.0f}% of GEMM time runs in fp32 (the ops' Input type), {:.1f}% of the {}; {} has native bf16 "
                     "(a trace does not name its CPU: this holds where it ran on the same kind); the estimate "
                     "assumes those GEMMs 2x faster in bf16 (AVX512-BF16 does twice fp32's multiply-adds per "
                     "instruction; AMX more)",
                     100 * f32 / gemm, 100 * s32, steps_text(b), cpu),
         "bf16: true  # torch.autocast('cpu', dtype=torch.bfloat16)", "precision -p dtype=fp32,bf16");
  } else if (f32 >= 0.5 * gemm) {
    p.info["note"] = known ? fmt::format("GEMMs in fp32, and fp32 is right here: {} has no avx512_bf16 or AMX, so bf16 "
                                         "GEMMs would run emulated, slower than fp32",
                                         cpu)
                           : "GEMMs in fp32; whether bf16 is faster depends on the CPU (avx512_bf16 or AMX): unknown here";
  } else if (half >= 0.5 * gemm && known && !native_bf16(c)) {
    find(c, p, "bf16 on a CPU without native bf16 (slower than fp32)", "dtype", std::nullopt, 100 * half / b.steps_us,
         "medium",
         fmt::format("{:.0f}% of GEMM time runs in bf16 or fp16 (the ops' Input type), {:.1f}% of the {}; {} has no "
                     "avx512_bf16 or AMX, so those GEMMs are emulated and slower than fp32 (a trace does not name its "
                     "CPU: this holds where it ran on the same kind); the precision scenario measures the two here",
                     100 * half / gemm, 100 * half / b.steps_us, steps_text(b), cpu),
         "bf16: false  # fp32 on this CPU; no torch.autocast('cpu', dtype=torch.bfloat16)",
         "precision -p dtype=fp32,bf16");
  }
}

// The framework around tiny ops: what the causes named leave, mostly not arithmetic.
void overhead(Ctx& c, Point& p, const CpuBreakdown& b, const readers::CpuModule* layer) {
  double frame = 0;
  for (CpuCause k : {CpuCause::optimizer, CpuCause::autograd, CpuCause::framework, CpuCause::python, CpuCause::nothing})
    frame += b.us(k);
  // the slow layer's time is its finding's: its arithmetic and its framework time apart (its allocation is
  // not in either)
  const double layer_compute = layer ? layer->compute_us : 0;
  frame = std::max(0.0, frame - (layer ? layer->own_us + layer->backward_us - layer_compute - layer->alloc_us : 0));
  // unrecorded time while a collective ran on another thread is the step waiting on it (c10d's work.wait() is
  // no op): the collective's, not the framework's (a gloo rank waiting for a straggler read as overhead-bound)
  frame = std::max(0.0, frame - std::min(b.us(CpuCause::nothing) + b.us(CpuCause::python), b.communication_exposed_us));
  const double compute = std::max(0.0, b.us(CpuCause::gemm) + b.us(CpuCause::compute) - layer_compute);
  const double rest = frame + compute;
  p.add({"framework_pct_of_rest", rest > 0 ? 100 * frame / rest : 0, "%", Direction::lower, std::nullopt,
         "optimizer, autograd, views, Python and unrecorded time over that and the compute ops (a loader, sync, "
         "allocation, collective or slow layer apart)"});
  if (rest <= 0 || frame / rest < kOverheadOfRest || b.leaf_ops == 0 || arithmetic_per_op(b) >= kTinyOpUs) return;
  const double s = frame / b.steps_us;
  if (100 * s < kCpuCausePct) return;
  find(c, p, "a batch too small (framework overhead-bound on CPU)", "batch", 1.0 / (1 - s / 2), 100 * s, "medium",
       fmt::format("compute ops take {:.0f}% of what the {} leave to the model, the framework around them {:.0f}% "
                   "(optimizer {:.0f}%, autograd {:.0f}%, views {:.0f}%, Python or unrecorded {:.0f}% of the steps), "
                   "and the ops are tiny: {} arithmetic ops doing {:.1f} us each on average, the GEMMs a median of {:.1f} us: the CPU's "
                   "launch-bound; the gain assumes half that overhead gone, what twice the micro batch buys at most "
                   "(all of it: up to {:.2g}x)",
                   100 * compute / rest, steps_text(b), 100 * frame / rest, pct(b, b.us(CpuCause::optimizer)),
                   pct(b, b.us(CpuCause::autograd)), pct(b, b.us(CpuCause::framework)),
                   pct(b, b.us(CpuCause::python) + b.us(CpuCause::nothing)), b.leaf_ops, arithmetic_per_op(b),
                   b.gemm_median_us, upto(s)),
       "micro_batch_size: 2x yours  # with gradient_accumulation_steps halved; or torch_compile: true",
       "batch -p micro_batch=1,2,4,8,16,32", true);
}

void communication(Ctx& c, Point& p, const CpuBreakdown& b) {
  const double s = b.communication_us / b.steps_us, exposed = b.communication_exposed_us / b.steps_us;
  if (100 * s <= kCommPct) return;
  find(c, p, "waiting on collectives", "communication", upto(exposed), 100 * s, "high",
       fmt::format("{} collective calls ({} the most; {} in the trace) cover {:.1f}% of the {} (over {:.0f}%: the "
                   "TensorBoard plugin's rule), {:.1f}% with the training thread doing no arithmetic; the gain is "
                   "that part hidden, an upper bound",
                   b.collectives, b.collective_name, b.collectives_in_trace, 100 * s, steps_text(b), kCommPct,
                   100 * exposed),
       c.t.distributed_backend == "gloo" || b.collective_name.rfind("gloo:", 0) == 0
           ? "gradient_accumulation_steps: 2x yours  # fewer all-reduces per sample; gloo reduces through the CPU: "
             "NCCL on GPUs where the job has them"
           : "gradient_accumulation_steps: 2x yours  # fewer all-reduces per sample; or larger DDP buckets",
       "collective -p op=all_reduce", true);
}

bool no_compute(const CpuBreakdown& b) {
  return b.us(CpuCause::gemm) <= 0 && pct(b, b.us(CpuCause::gemm) + b.us(CpuCause::compute)) < kNoComputePct;
}

void cpu_only(Ctx& c, Point& p, const CpuBreakdown& b) {
  std::string dist;
  if (c.t.rank && c.t.world_size)
    dist = fmt::format("; rank {} of {}{}", *c.t.rank, *c.t.world_size,
                       c.t.distributed_backend.empty() ? "" : " (" + c.t.distributed_backend + ")");
  const bool none = no_compute(b);
  find(c, p, "no GPU events: CPU-only", "cpu", std::nullopt, 100, "high",
       fmt::format("no kernel, copy, memset or runtime call, and deviceProperties {}: the job ran on the CPU{}; over "
                   "{} the training thread spent {:.1f}% in compute ops (GEMM {:.1f}%{}), {:.1f}% in the framework "
                   "around them (optimizer, autograd, views, Python), {:.1f}% with no op recorded{}",
                   c.t.device_properties.empty() ? "is empty" : "names no GPU", dist, steps_text(b),
                   pct(b, b.us(CpuCause::gemm) + b.us(CpuCause::compute)), pct(b, b.us(CpuCause::gemm)),
                   b.shapes ? "" : "; no Input type: record_shapes=True gives the GEMMs' dtype",
                   pct(b, b.us(CpuCause::optimizer) + b.us(CpuCause::autograd) + b.us(CpuCause::framework) +
                              b.us(CpuCause::python)),
                   pct(b, b.us(CpuCause::nothing)),
                   none ? fmt::format(" ({} CPU ops in the trace, no GEMM: it records none of the job's own work, "
                                      "and the GPU checks have nothing to read)",
                                      b.cpu_ops)
                        : ""),
       "torch.cuda.is_available() where the job ran, if a GPU was meant (a CPU wheel of torch or an empty "
       "CUDA_VISIBLE_DEVICES trains on the CPU without a word)",
       "");
}

}  // namespace

void read_cpu_isa(Ctx& c, const json& meta) {
  const json isa = meta.value("/cpu/isa"_json_pointer, json());
  if (!isa.is_array()) return;
  c.cpu_isa_known = true;
  for (const auto& f : isa)
    if (f.is_string()) c.cpu_isa.push_back(f.get<std::string>());
}

Point cpu(Ctx& c) {
  if (c.dev) return skipped("cpu", "the trace has GPU events: the checks above read them");
  c.cpu = readers::cpu_breakdown(c.t, *c.iterations);
  if (!c.cpu->applies) return skipped("cpu", "no CPU ops or annotations in the trace");
  const CpuBreakdown& b = *c.cpu;
  Point p = check("cpu");
  p.info["breakdown"] = readers::to_json(b);
  for (std::size_t k = 0; k < readers::kCpuCauses; ++k)
    p.add({std::string(readers::to_string(CpuCause(k))) + "_pct", pct(b, b.by_cause[k]), "%", Direction::none,
           std::nullopt, "of the steps' time on the training thread, by what was innermost (cpu_breakdown.hpp)"});
  p.add({"compute_ops_pct", pct(b, b.us(CpuCause::gemm) + b.us(CpuCause::compute)), "%", Direction::higher,
         std::nullopt, "GEMM and other arithmetic ops innermost, over the steps' time"});
  p.add({"collectives_pct", pct(b, b.communication_us), "%", Direction::lower, std::nullopt,
         "the collectives' union on every thread over the steps' time"});
  p.add({"arithmetic_per_op_us", arithmetic_per_op(b), "us", Direction::higher, std::nullopt,
         "GEMM and compute time over the arithmetic ops with no op inside them (their dispatch included)"});
  p.add({"leaf_op_median_us", b.leaf_op_median_us, "us", Direction::none, std::nullopt,
         "the median arithmetic op with no op inside it"});
  p.add({"sync_calls_per_step", double(b.sync_calls) / double(std::max<std::size_t>(1, b.steps)), "calls",
         Direction::lower, std::nullopt, "aten::item calls (not nested in another) per step"});
  p.add({"steps", double(b.steps), "steps", Direction::none, std::nullopt, b.steps_source});
  p.info["compute_pct_per_step"] = b.compute_pct;
  p.info["reading"] = readers::cpu_line(b);
  sync(c, p, b);
  const readers::CpuModule* layer = slow_layer(c, p, b);
  allocation(c, p, b, layer);
  dtype(c, p, b);
  overhead(c, p, b, layer);
  communication(c, p, b);
  cpu_only(c, p, b);
  return p;
}

void finish_cpu(const Ctx& c, std::vector<Finding>& findings) {
  if (!c.cpu || !c.cpu->applies) return;
  const CpuBreakdown& b = *c.cpu;
  const std::string line = readers::cpu_line(b);
  json items = json::array();
  for (std::size_t k = 0; k < b.items.size() && items.size() < 5; ++k)
    items.push_back(json{{"cause", readers::to_string(b.items[k].cause)},
                         {"name", b.items[k].name},
                         {"where", b.items[k].where},
                         {"pct_of_steps", pct(b, b.items[k].us)}});
  for (Finding& f : findings) {
    f.evidence["figures"] = json::array({"cpu: " + line});
    f.evidence["cpu_breakdown"] = items;
  }
  // CPU-only leads where the steps hold no compute: the trace records none of the job's own work
  auto it = std::find_if(findings.begin(), findings.end(),
                         [](const Finding& f) { return f.cause == "no GPU events: CPU-only"; });
  if (it != findings.end() && no_compute(b)) std::rotate(findings.begin(), it, it + 1);
}

}  // namespace sb::diagnose::trace_rules
