// diagnose --trace: the rules over what the host did while the GPU waited (host_attribution.hpp). Each
// cause is named as itself, from its own share of the window, whatever else is named beside it:
//   warm-up in the window    the first iteration over 3x the median of the others and over 10% of the
//                            iterations' time: one-off set-up, not the job (the other findings read the
//                            iterations after it)
//   a sync in the step       over 5% of the window idle after a blocking call (cudaStreamSynchronize,
//                            cudaDeviceSynchronize, a blocking cudaMemcpy/hipMemcpy, .item())
//   allocator churn          over 5% of the window in cudaMalloc/cudaFree/hipMalloc/hipFree
//   a slow op on the host    one op, Python function or optimizer step over 5% of the window, a quarter
//                            of the host's issuing time and a call of a millisecond or more (not launch
//                            overhead spread over many short calls)
// Launch overhead (the host issuing work: launches, op dispatch, Python) is the batch check's
// (trace_diagnose.cpp), over what these leave.
#include <algorithm>  // std::min
#include <string>     // std::string

#include <fmt/format.h>  // fmt::format

#include "diagnose/trace/trace_rules.hpp"

namespace sb::diagnose::trace_rules {
namespace {

using json = nlohmann::ordered_json;
using readers::HostAttribution;
using readers::HostCause;
using readers::HostItem;

constexpr double kHostPct = 5;     // a host cause is named from 5% of the window (the loader's line)
constexpr double kWarmupPct = 10;  // warm-up is named from 10% of the iterations' time
constexpr double kSlowOpOfIssuing = 0.25;
constexpr double kSlowCallUs = 1000;

double share(const HostAttribution& h, double us) { return h.steady_window_us > 0 ? us / h.steady_window_us : 0; }
double upto(double s) { return 1.0 / (1.0 - std::min(s, 0.99)); }

const HostItem* top_item(const std::vector<HostItem>& items, std::initializer_list<HostCause> causes) {
  for (const HostItem& i : items)  // ranked
    for (HostCause c : causes)
      if (i.cause == c) return &i;
  return nullptr;
}
std::string item_text(const HostItem& i) { return i.where.empty() ? i.name : i.name + " (in " + i.where + ")"; }

void warmup(Ctx& c, Point& p) {
  const readers::Iterations& it = *c.iterations;
  if (it.warmup == 0 || it.spans.empty()) return;
  double total = 0;
  for (const auto& [a, b] : it.spans) total += b - a;
  const double first = it.spans[0].second - it.spans[0].first;
  const double excess = first - it.median_us;
  p.add({"first_iteration_ms", first / 1e3, "ms", Direction::lower, std::nullopt,
         "the first iteration, over 3x the median of the others: warm-up"});
  p.add({"iteration_median_ms", it.median_us / 1e3, "ms", Direction::lower, std::nullopt, "the iterations after it"});
  if (total <= 0 || 100 * excess / total <= kWarmupPct) return;
  find(c, p, "warm-up in the profiled window (not steady state)", "host", total / (total - excess),
       100 * excess / total, "high",
       fmt::format("the first of {} iterations (from {}) took {:.0f} ms against a median of {:.1f} ms for the {} after "
                   "it: {:.0f}% of the iterations' time is one-off warm-up (CUDA context, cuDNN autotuning, lazy kernel "
                   "loading), not the job's steady state; in it {}; the other findings read the iterations after it. "
                   "The gain is the profile's, not training's: the iterations' time without the warm-up's excess",
                   it.spans.size(), it.source, first / 1e3, it.median_us / 1e3, it.spans.size() - 1,
                   100 * excess / total, readers::host_line(*c.host, true, 4)),
       "torch.profiler.schedule(wait=1, warmup=1, active=3)  # profile after warm-up, prof.step() once per step",
       "", true);
}

void sync(Ctx& c, Point& p) {
  const HostAttribution& h = *c.host;
  const double s = share(h, h.us(HostCause::sync));
  if (100 * s <= kHostPct) return;
  const HostItem* top = top_item(h.items, {HostCause::sync});
  // a blocking copy (cudaMemcpy, hipMemcpyWithStream, a pageable .to(device)) is fixed by pinning, not logging
  const bool copy = top && top->name.find("emcpy") != std::string::npos;
  find(c, p, "a sync in the step (the host waits for the GPU)", "host", upto(s), 100 * s, "high",
       fmt::format("the GPU sat idle {:.1f}% of the window after the host blocked on it{}: the queue drained, and the "
                   "launches after it came late; the gain assumes the host's work after the sync overlaps the GPU's "
                   "once it is gone (the wait hidden entirely: an upper bound)",
                   100 * s,
                   top ? fmt::format(", most in {} ({} gaps)", item_text(*top), top->gaps) : std::string()),
       copy ? "dataloader_pin_memory: true  # and .to(device, non_blocking=True): a copy from pageable memory "
              "blocks the host until the GPU has drained"
            : "logging_steps: 10  # or more; no loss.item(), print(loss), .cpu() or .tolist() in the step: keep the "
              "loss on the GPU until a logging step",
       "train -p micro_batch=1,4", true);
}

void allocator(Ctx& c, Point& p) {
  const HostAttribution& h = *c.host;
  const double s = share(h, h.us(HostCause::allocator));
  if (100 * s <= kHostPct) return;
  const HostItem* top = top_item(h.items, {HostCause::allocator});
  find(c, p, "allocator churn (device memory allocated and freed in the step)", "host", upto(s), 100 * s, "high",
       fmt::format("the GPU waited {:.1f}% of the window while the host was in the device allocator{}: PyTorch's "
                   "caching allocator reuses its blocks, so calls in every step mean it is off "
                   "(PYTORCH_NO_CUDA_MEMORY_CACHING), emptied (torch.cuda.empty_cache() in the loop) or fragmented; "
                   "the gain assumes those calls gone (an upper bound)",
                   100 * s,
                   top ? fmt::format(", most in {} ({} gaps, the longest call {:.1f} ms)", item_text(*top), top->gaps,
                                     top->longest_call_us / 1e3)
                       : std::string()),
       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # with the caching allocator on "
       "(PYTORCH_NO_CUDA_MEMORY_CACHING unset) and no torch.cuda.empty_cache() in the loop",
       "memory", true);
}

void slow_op(Ctx& c, Point& p) {
  const HostAttribution& h = *c.host;
  const double issuing = readers::issuing_us(h);
  const HostItem* top = top_item(h.items, {HostCause::host_op, HostCause::python, HostCause::optimizer});
  if (!top) return;
  const double s = share(h, top->us);
  // one op: a quarter of the host's issuing time, and a call of it holding the host for a millisecond (a
  // launch-bound loop spends its time in many short calls, of one name or several)
  if (100 * s <= kHostPct || top->us < kSlowOpOfIssuing * issuing || top->longest_call_us < kSlowCallUs) return;
  c.slow_op_us = top->us;
  const bool zero_grad = top->name.rfind("Optimizer.zero_grad#", 0) == 0;
  const bool optimizer = top->cause == HostCause::optimizer && !zero_grad;
  find(c, p, "a slow op on the host (custom layer or Python)", "host", upto(s), 100 * s, "medium",
       fmt::format("the GPU waited {:.1f}% of the window while the host was in {} ({} {}, {:.0f}% of the host's time "
                   "issuing work, the longest call {:.1f} ms): one op, not launch overhead spread over many; the gain "
                   "assumes its host time hidden or gone (an upper bound)",
                   100 * s, top->name, top->gaps, top->gaps == 1 ? "gap" : "gaps",
                   issuing > 0 ? 100 * top->us / issuing : 0, top->longest_call_us / 1e3),
       zero_grad   ? "optimizer.zero_grad(set_to_none=True)  # PyTorch 2's default: no kernel per parameter to "
                     "zero the gradients"
       : optimizer ? "optimizer: adamw_torch_fused  # a fused (or foreach) step: one launch for all parameters, not "
                     "one each"
                   : "torch_compile: true  # or move the op's Python work out of the step (a fused or compiled layer)",
       "train -p dispatch_us=10,100", true);
}

}  // namespace

Point host(Ctx& c) {
  if (!c.host || c.host->stream < 0)
    return skipped("host", "the trace has no GPU events: no GPU wait to attribute");
  Point p = check("host");
  const HostAttribution& h = *c.host;
  for (std::size_t k = 0; k < readers::kHostCauses; ++k)
    p.add({std::string(readers::to_string(HostCause(k))) + "_pct", 100 * share(h, h.by_cause[k]), "%",
           Direction::lower, std::nullopt,
           "of the GPU window after warm-up: the busiest compute stream's idle time while the host was so occupied"});
  p.info["stream"] = h.stream;
  p.info["iterations"] = c.iterations->source;
  if (!h.python_functions)
    p.info["note"] = "no python_function events: profile with with_stack=True to see the Python line each wait is in";
  warmup(c, p);
  sync(c, p);
  allocator(c, p);
  slow_op(c, p);
  p.info["reading"] = readers::host_line(h);
  if (p.info.contains("evidence")) p.info["evidence"] = readers::host_line(h);  // the line shows the attribution
  return p;
}

void attach_host_evidence(const Ctx& c, std::vector<Finding>& findings) {
  if (!c.host || c.host->stream < 0) return;
  const HostAttribution& h = *c.host;
  for (Finding& f : findings) {
    const bool warm = f.cause.rfind("warm-up", 0) == 0;
    const std::string line = readers::host_line(h, warm);
    if (line.empty()) continue;
    f.evidence["figures"] = json::array({"host: " + line});
    json items = json::array();
    const auto& v = warm ? h.warmup_items : h.items;
    for (std::size_t k = 0; k < v.size() && items.size() < 5; ++k)
      if (v[k].cause != HostCause::other_stream)
        items.push_back(json{{"cause", readers::to_string(v[k].cause)},
                             {"name", v[k].name},
                             {"where", v[k].where},
                             {"pct_of_window", 100 * v[k].us / std::max(1e-9, warm ? h.window_us - h.steady_window_us
                                                                                  : h.steady_window_us)}});
    f.evidence["host_attribution"] = items;
  }
}

}  // namespace sb::diagnose::trace_rules
