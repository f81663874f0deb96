// What the host was doing while the GPU waited (definitions in host_attribution.hpp).
#include "diagnose/trace/host_attribution.hpp"
#include "diagnose/trace/intervals.hpp"  // merged, length, overlap, intersected

#include <algorithm>      // std::sort, std::stable_sort, std::max, std::min
#include <limits>         // std::numeric_limits
#include <map>            // std::map
#include <string_view>    // std::string_view
#include <unordered_map>  // std::unordered_map

#include <fmt/format.h>  // fmt::format

namespace sb::readers {
namespace {

using json = nlohmann::ordered_json;
using intervals::Interval;
using intervals::merged;
using intervals::length;
using intervals::overlap;
using intervals::intersected;
using intervals::median;
constexpr double kInf = std::numeric_limits<double>::infinity();

bool starts(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool contains(std::string_view s, std::string_view w) { return s.find(w) != std::string_view::npos; }

// [x, y) less the merged list m, in order.
std::vector<Interval> minus(double x, double y, const std::vector<Interval>& m) {
  std::vector<Interval> out;
  auto it = std::upper_bound(m.begin(), m.end(), Interval{x, kInf});
  if (it != m.begin()) --it;
  double at = x;
  for (; it != m.end() && it->first < y; ++it) {
    if (it->second <= at) continue;
    if (it->first > at) out.emplace_back(at, std::min(it->first, y));
    at = std::max(at, it->second);
  }
  if (at < y) out.emplace_back(at, y);
  return out;
}

bool loader_name(std::string_view n) {
  return (starts(n, "enumerate(DataLoader)#") || starts(n, "enumerate(DataPipe)#")) && contains(n, "__next__");
}
bool optimizer_name(std::string_view n) { return starts(n, "Optimizer.step#") || starts(n, "Optimizer.zero_grad#"); }
bool host_cat(Cat c) {
  return c == Cat::cpu_op || c == Cat::user_annotation || c == Cat::cuda_runtime || c == Cat::cuda_driver ||
         c == Cat::python_function;
}

// What one host event's name says it is.
enum class Kind : std::uint8_t { op, loader, optimizer, item, blocking, alloc, setup, launch, runtime, python };
Kind kind_of(const Event& e, std::string_view n) {
  if (e.cat == Cat::python_function) return Kind::python;
  if (e.cat == Cat::cuda_runtime || e.cat == Cat::cuda_driver) {
    std::string_view b = n;
    if (b.size() > 3 && b.substr(b.size() - 3) == "_v2") b.remove_suffix(3);
    if (contains(b, "Synchronize")) return Kind::blocking;
    const bool memcpy = starts(b, "cudaMemcpy") || starts(b, "hipMemcpy") || starts(b, "cuMemcpy");
    if (memcpy && !contains(b, "Async")) return Kind::blocking;  // hipMemcpyWithStream blocks too
    static constexpr std::string_view alloc[] = {
        "cudaMalloc", "cudaFree", "cudaMallocHost", "cudaFreeHost", "cudaHostAlloc", "cudaMallocManaged",
        "cudaHostRegister", "cudaHostUnregister", "hipMalloc", "hipFree", "hipHostMalloc", "hipHostFree",
        "hipExtMallocWithFlags", "hipMallocManaged", "hipHostRegister", "hipHostUnregister", "cuMemAlloc",
        "cuMemFree", "cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemRelease", "cuMemAddressReserve",
        "cuMemAddressFree", "cuMemSetAccess", "cuMemAllocHost", "cuMemFreeHost", "cuMemHostAlloc"};
    for (std::string_view a : alloc)
      if (b == a) return Kind::alloc;
    static constexpr std::string_view setup[] = {
        "cudaEventCreate", "cudaStreamCreate", "cudaGetDeviceProperties", "cudaFuncGetAttributes",
        "cudaFuncSetAttribute", "cudaDeviceEnablePeerAccess", "cudaMemGetInfo", "cudaDeviceGetStreamPriorityRange",
        "cuModule", "cuLibrary", "cuDevicePrimaryCtx", "cuCtxCreate", "hipEventCreate", "hipStreamCreate",
        "hipGetDeviceProperties", "hipModuleLoad", "hipModuleGetFunction", "hipFuncGetAttributes", "hipMemGetInfo",
        "hipDeviceEnablePeerAccess"};
    for (std::string_view s : setup)
      if (starts(b, s)) return Kind::setup;
    if (contains(b, "Launch") || ((starts(b, "cuda") || starts(b, "hip") || starts(b, "cu")) && contains(b, "Async")))
      return Kind::launch;
    return Kind::runtime;
  }
  if (loader_name(n)) return Kind::loader;
  if (optimizer_name(n)) return Kind::optimizer;
  if (n == "aten::item" || n == "aten::_local_scalar_dense" || n == "aten::nonzero" || n == "aten::is_nonzero" ||
      n == "aten::equal")
    return Kind::item;
  return Kind::op;
}

// One host thread, flattened: at each instant the innermost event covering it.
struct Flat {
  std::vector<double> a, b;                     // segments [a, b), in order
  std::vector<std::int64_t> top;                // the innermost event (an index into the trace's events)
  std::vector<std::pair<double, std::size_t>> blocking;  // (end, event) of its blocking calls, by end
};

class Attributor {
 public:
  Attributor(const Trace& t, const HtaRows& rows, HostAttribution& h) : t_(t), rows_(rows), h_(h) {
    kinds_.resize(t.names.size());
    kind_done_.assign(t.names.size(), 0);
    parent_.assign(t.events.size(), -1);
  }

  // The gap the pieces added next belong to (an item counts the gaps it covered some of).
  void gap(std::int64_t g) { gap_ = g; }

  // The events of one host thread, keyed by (pid, tid).
  void add_host(std::size_t i) { threads_[{t_.events[i].pid, t_.events[i].tid}].push_back(i); }

  Kind kind(std::size_t i) {
    const Event& e = t_.events[i];
    if (!kind_done_[e.name]) {
      kinds_[e.name] = kind_of(e, t_.name(e));
      kind_done_[e.name] = 1;
    }
    // a runtime call's kind depends on its category as well as its name; names are shared across categories
    // only in hand-made traces, where the first event's reading holds
    return kinds_[e.name];
  }

  const Flat& flat(std::pair<std::int64_t, std::int64_t> key) {
    auto it = flats_.find(key);
    if (it != flats_.end()) return it->second;
    Flat& f = flats_[key];
    auto th = threads_.find(key);
    if (th == threads_.end()) return f;
    std::vector<std::size_t>& ev = th->second;
    const auto& ts = rows_.ts;
    const auto& te = rows_.te;
    std::sort(ev.begin(), ev.end(), [&](std::size_t x, std::size_t y) {
      if (ts[x] != ts[y]) return ts[x] < ts[y];
      if (te[x] != te[y]) return te[x] > te[y];
      return x < y;
    });
    std::vector<std::size_t> stack;
    double cur = -kInf;
    auto emit = [&](double x, double y, std::int64_t top) {
      if (y <= x) return;
      f.a.push_back(x);
      f.b.push_back(y);
      f.top.push_back(top);
    };
    auto pop_to = [&](double until) {
      while (!stack.empty() && te[stack.back()] <= until) {
        const std::size_t s = stack.back();
        if (te[s] > cur) {
          emit(cur, te[s], std::int64_t(s));
          cur = te[s];
        }
        stack.pop_back();
      }
    };
    for (std::size_t i : ev) {
      if (te[i] <= ts[i]) continue;
      if (kind(i) == Kind::blocking) f.blocking.emplace_back(te[i], i);
      pop_to(ts[i]);
      if (!stack.empty() && ts[i] > cur) emit(cur, ts[i], std::int64_t(stack.back()));
      cur = std::max(cur, ts[i]);
      parent_[i] = stack.empty() ? -1 : std::int64_t(stack.back());
      stack.push_back(i);
    }
    pop_to(kInf);
    std::sort(f.blocking.begin(), f.blocking.end());
    return f;
  }

  // The ancestors of event i, innermost first (i included).
  template <class F>
  void walk(std::int64_t i, F&& f) {
    for (int depth = 0; i >= 0 && depth < 256; ++depth, i = parent_[std::size_t(i)])
      if (!f(std::size_t(i))) return;
  }

  // What the ranges around an instant are: the innermost's kind and the ancestors that decide its cause.
  struct Roles {
    Kind k = Kind::op;
    bool step = false;  // the innermost is ProfilerStep#N itself
    std::int64_t loader = -1, optimizer = -1, item = -1, op = -1, py = -1;
  };
  Roles roles(std::int64_t top) {
    Roles r;
    walk(top, [&](std::size_t i) {
      const Kind k = kind(i);
      if (k == Kind::loader && r.loader < 0) r.loader = std::int64_t(i);
      if (k == Kind::optimizer && r.optimizer < 0) r.optimizer = std::int64_t(i);
      if (k == Kind::item) r.item = std::int64_t(i);  // the outermost: aten::item, not the _local_scalar_dense in it
      if ((k == Kind::op || k == Kind::item) && r.op < 0 && std::int64_t(i) != top) r.op = std::int64_t(i);
      if (k == Kind::python && r.py < 0) r.py = std::int64_t(i);
      return true;
    });
    r.k = kind(std::size_t(top));
    r.step = r.k == Kind::op && starts(t_.name(t_.events[std::size_t(top)]), "ProfilerStep#");
    return r;
  }
  static HostCause cause_of(const Roles& r) {
    if (r.step) return HostCause::nothing;  // inside the step, outside any op it recorded
    if (r.loader >= 0) return HostCause::loader;
    if (r.k == Kind::blocking || r.item >= 0) return HostCause::sync;
    if (r.k == Kind::alloc) return HostCause::allocator;
    if (r.k == Kind::setup) return HostCause::setup;
    if (r.optimizer >= 0) return HostCause::optimizer;
    if (r.k == Kind::launch) return HostCause::launch;
    if (r.k == Kind::python) return HostCause::python;
    return HostCause::host_op;
  }
  HostCause cause_at(std::int64_t top) { return top < 0 ? HostCause::nothing : cause_of(roles(top)); }

  // The cause and item name of time spent with `top` innermost (-1: nothing recorded).
  void classify(std::int64_t top, HostCause& cause, std::string& name, std::string& where) {
    where.clear();
    if (top < 0) {
      cause = HostCause::nothing;
      name = "(no host event recorded)";
      return;
    }
    const Roles r = roles(top);
    cause = cause_of(r);
    const std::string& inner = t_.name(t_.events[std::size_t(top)]);
    auto nm = [&](std::int64_t i) -> const std::string& { return t_.name(t_.events[std::size_t(i)]); };
    auto where_of = [&]() {
      std::string w;
      if (r.item >= 0 && r.item != top) w = nm(r.item);
      else if (r.op >= 0) w = nm(r.op);
      if (r.py >= 0) w += (w.empty() ? "" : "; ") + nm(r.py);
      return w;
    };
    switch (cause) {
      case HostCause::nothing: name = "(in ProfilerStep#N, no op recorded)"; break;
      case HostCause::loader: name = nm(r.loader); break;
      case HostCause::sync:
        name = r.k == Kind::blocking ? inner : nm(r.item);
        where = where_of();
        break;
      case HostCause::allocator:
        name = inner;
        where = where_of();
        break;
      case HostCause::optimizer: name = nm(r.optimizer); break;
      default: name = inner; break;
    }
  }

  void add(bool warm, HostCause cause, const std::string& name, const std::string& where, double us,
           double call_us, double at) {
    if (us <= 0) return;
    h_.pieces.push_back({at, at + us, cause});
    auto& index = warm ? warm_index_ : index_;
    auto& items = warm ? h_.warmup_items : h_.items;
    auto& last = warm ? warm_last_gap_ : last_gap_;
    const std::string key = fmt::format("{}\x1f{}\x1f{}", int(cause), name, where);
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, items.size()).first;
      HostItem hi;
      hi.cause = cause;
      hi.name = name;
      hi.where = where;
      items.push_back(std::move(hi));
      last.push_back(-1);
    }
    HostItem& hi = items[it->second];
    hi.us += us;
    ++hi.pieces;
    if (last[it->second] != gap_) ++hi.gaps;
    last[it->second] = gap_;
    hi.longest_call_us = std::max(hi.longest_call_us, call_us);
    (warm ? h_.warmup_by_cause : h_.by_cause)[std::size_t(cause)] += us;
    if (warm) h_.warmup_us += us;
  }

  // The host's part of the piece [x, y), swept over thread `key`; `drain`: the blocking call the gap opened
  // in, and `budget` what of the gap is its: the time the call waited before the GPU ran dry (without the
  // call the host would have run that far ahead; a call that hardly waited hides no gap).
  void sweep(bool warm, std::pair<std::int64_t, std::int64_t> key, double x, double y, std::int64_t drain,
             double& budget) {
    const Flat& f = flat(key);
    auto it = std::upper_bound(f.a.begin(), f.a.end(), x);
    std::size_t k = it == f.a.begin() ? 0 : std::size_t(it - f.a.begin()) - 1;
    double at = x;
    std::string drain_name, drain_where;
    if (drain >= 0) {
      HostCause c;
      classify(drain, c, drain_name, drain_where);
    }
    for (; k < f.a.size() && f.a[k] < y; ++k) {
      const double lo = std::max(at, f.a[k]), hi = std::min(y, f.b[k]);
      if (hi <= lo) continue;
      if (lo > at) put(warm, -1, at, lo, drain, drain_name, drain_where, budget);
      put(warm, f.top[k], lo, hi, drain, drain_name, drain_where, budget);
      at = hi;
    }
    if (at < y) put(warm, -1, at, y, drain, drain_name, drain_where, budget);
  }

 private:
  void put(bool warm, std::int64_t top, double x, double y, std::int64_t drain, const std::string& drain_name,
           const std::string& drain_where, double& budget) {
    HostCause cause;
    std::string name, where;
    classify(top, cause, name, where);
    const double call = top >= 0 ? rows_.te[std::size_t(top)] - rows_.ts[std::size_t(top)] : 0;
    // after a sync the queue is empty: the host's time until its next launch is the sync's, up to what the
    // sync waited, unless the loader holds it (a loader slower than the GPU's work starves it with or without
    // the sync)
    if (drain >= 0 && budget > 0 && cause != HostCause::loader) {
      const double s = std::min(budget, y - x);
      budget -= s;
      add(warm, HostCause::sync, drain_name, drain_where, s,
          rows_.te[std::size_t(drain)] - rows_.ts[std::size_t(drain)], x);
      x += s;
    }
    add(warm, cause, name, where, y - x, call, x);
  }

  const Trace& t_;
  const HtaRows& rows_;
  HostAttribution& h_;
  std::vector<Kind> kinds_;
  std::vector<char> kind_done_;
  std::vector<std::int64_t> parent_;
  std::map<std::pair<std::int64_t, std::int64_t>, std::vector<std::size_t>> threads_;
  std::map<std::pair<std::int64_t, std::int64_t>, Flat> flats_;
  std::unordered_map<std::string, std::size_t> index_, warm_index_;
  std::vector<std::int64_t> last_gap_, warm_last_gap_;  // per item, the last gap it was in
  std::int64_t gap_ = 0;                                 // the gap being attributed
};

void rank(std::vector<HostItem>& items) {
  std::stable_sort(items.begin(), items.end(), [](const HostItem& x, const HostItem& y) { return x.us > y.us; });
}

}  // namespace

const char* to_string(HostCause c) {
  switch (c) {
    case HostCause::loader: return "loader";
    case HostCause::sync: return "sync";
    case HostCause::allocator: return "allocator";
    case HostCause::setup: return "setup";
    case HostCause::launch: return "launch";
    case HostCause::optimizer: return "optimizer";
    case HostCause::host_op: return "host_op";
    case HostCause::python: return "python";
    case HostCause::nothing: return "nothing";
    case HostCause::other_stream: return "other_stream";
    case HostCause::kernel_wait: return "kernel_wait";
    case HostCause::gpu_wait: return "gpu_wait";
  }
  return "nothing";
}

bool issuing(HostCause c) {
  return c == HostCause::launch || c == HostCause::host_op || c == HostCause::python || c == HostCause::optimizer;
}

double issuing_us(const HostAttribution& h) {
  double s = h.ops_recorded ? 0 : h.us(HostCause::nothing);
  for (std::size_t k = 0; k < kHostCauses; ++k)
    if (issuing(HostCause(k))) s += h.by_cause[k];
  return s;
}

Iterations find_iterations(const Trace& t, const HtaRows& rows) {
  Iterations it;
  std::vector<Interval> steps, loader, opt_step, zero_grad;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const Event& e = t.events[i];
    if (e.cat != Cat::user_annotation && e.cat != Cat::cpu_op) continue;
    const std::string& n = t.name(e);
    const Interval iv{rows.ts[i], rows.te[i]};
    if (starts(n, "ProfilerStep#")) steps.push_back(iv);
    else if (loader_name(n)) loader.push_back(iv);
    else if (starts(n, "Optimizer.step#")) opt_step.push_back(iv);
    else if (starts(n, "Optimizer.zero_grad#")) zero_grad.push_back(iv);
  }
  // Anchors: an iteration from one call's start to the next's (a call nested in the previous one is not a
  // new iteration).
  auto from_anchors = [&](std::vector<Interval> v, const char* source) {
    std::sort(v.begin(), v.end());
    std::vector<double> at;
    double end = -kInf;
    for (const auto& [a, b] : v) {
      if (a < end) continue;
      at.push_back(a);
      end = b;
    }
    if (at.size() < 3) return false;  // two iterations at least
    it.source = source;
    for (std::size_t k = 0; k + 1 < at.size(); ++k) it.spans.emplace_back(at[k], at[k + 1]);
    return true;
  };
  if (!steps.empty()) {
    std::sort(steps.begin(), steps.end());
    it.source = "ProfilerStep#N";
    it.spans = steps;
  } else if (!from_anchors(loader, "enumerate(DataLoader)#...__next__") &&
             !from_anchors(opt_step, "Optimizer.step#...")) {
    from_anchors(zero_grad, "Optimizer.zero_grad#...");
  }
  std::vector<double> d;
  for (const auto& [a, b] : it.spans) d.push_back(b - a);
  if (d.size() >= 3) {
    const double rest = median(std::vector<double>(d.begin() + 1, d.end()));
    if (rest > 0 && d[0] > 3 * rest) it.warmup = 1;
  }
  it.median_us = median(std::vector<double>(d.begin() + std::ptrdiff_t(std::min(it.warmup, d.size())), d.end()));
  return it;
}

Steps steps_over(const Trace& t, const HtaRows& rows, const std::vector<Interval>& spans) {
  Steps s;
  std::vector<Interval> step_iv;
  for (const auto& [a, b] : spans) {
    s.step_us.push_back(b - a);
    s.total_us += b - a;
    step_iv.emplace_back(a, b);
  }
  s.count = std::int64_t(spans.size());
  s.median_us = median(s.step_us);
  const auto step_m = merged(step_iv);
  std::vector<Interval> loader, busy, gpu;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const Event& e = t.events[i];
    const Interval iv{rows.ts[i], rows.te[i]};
    if ((e.cat == Cat::cpu_op || e.cat == Cat::user_annotation) && loader_name(t.name(e))) {
      loader.push_back(iv);
      const std::string& nm = t.name(e);
      if (contains(nm, "_MultiProcessingDataLoaderIter")) s.loader_iter = "multi";
      else if (contains(nm, "_SingleProcessDataLoaderIter") && s.loader_iter.empty()) s.loader_iter = "single";
    }
    if (e.cat == Cat::kernel || e.cat == Cat::gpu_memcpy || e.cat == Cat::gpu_memset || e.cat == Cat::cuda_runtime ||
        e.cat == Cat::cuda_driver)
      busy.push_back(iv);
    if (e.stream >= 0) gpu.push_back(iv);
  }
  const auto loader_m = intersected(merged(loader), step_m);
  s.dataloader_us = length(loader_m);
  s.dataloader_exposed_us = s.dataloader_us - overlap(loader_m, merged(std::move(busy)));
  s.gpu_busy_us = overlap(merged(std::move(gpu)), step_m);
  return s;
}

HostAttribution attribute_host(const Trace& t, const TraceAnalysis& a, const HtaRows& rows, const Iterations& it,
                               std::int64_t device, const AnalysisOptions& opt) {
  HostAttribution h;
  h.device = device;
  const StreamIdle* s = busiest_stream(a.idle, device);
  if (!s) return h;
  h.stream = s->stream;
  const auto& ts = rows.ts;
  const auto& te = rows.te;
  const std::size_t n = t.events.size();
  // the stream's events (HTA's: kernels, copies, memsets it keeps), the device's other streams, the launches
  std::vector<std::size_t> mine;
  std::vector<Interval> comm, other;
  std::unordered_map<std::int64_t, std::size_t> cpu_by_corr;
  Attributor at(t, rows, h);
  h.window_lo = kInf;
  h.window_hi = -kInf;
  for (std::size_t i = 0; i < n; ++i) {
    const Event& e = t.events[i];
    if (e.cat == Cat::python_function) h.python_functions = true;
    if (e.cat == Cat::python_function || e.cat == Cat::cpu_op) h.ops_recorded = true;
    if (e.stream < 0) {
      if (host_cat(e.cat)) at.add_host(i);
      if (rows.kept[i] && e.correlation >= 0) cpu_by_corr.emplace(e.correlation, i);
      continue;
    }
    if (!rows.kept[i] || e.pid != device) continue;
    h.window_lo = std::min(h.window_lo, ts[i]);
    h.window_hi = std::max(h.window_hi, te[i]);
    if (e.stream == s->stream && e.is_gpu()) mine.push_back(i);
    else if (kernel_type(t.name(e)) == KernelType::communication) comm.emplace_back(ts[i], te[i]);
    else other.emplace_back(ts[i], te[i]);
  }
  if (mine.empty()) return h;
  h.window_us = h.window_hi - h.window_lo;
  std::stable_sort(mine.begin(), mine.end(), [&](std::size_t x, std::size_t y) { return ts[x] < ts[y]; });
  const auto comm_m = merged(std::move(comm));
  const auto other_m = merged(std::move(other));
  std::vector<Interval> any = comm_m;
  any.insert(any.end(), other_m.begin(), other_m.end());
  const auto any_m = merged(std::move(any));
  h.warmup_end = it.warmup > 0 && it.spans.size() > it.warmup ? it.spans[it.warmup].first : -kInf;
  h.steady_window_us = h.window_us - std::max(0.0, std::min(h.warmup_end, h.window_hi) - h.window_lo);
  for (std::size_t k = 1; k < mine.size(); ++k) {
    const std::size_t i = mine[k];
    const double x = te[mine[k - 1]], y = ts[i];
    if (ts[i] >= h.warmup_end) ++h.events;
    if (y <= x) continue;
    at.gap(++h.gaps);
    h.idle_us += y - x;
    const bool warm = x < h.warmup_end;
    // another stream's work: NCCL first, then the rest
    for (const auto& iv : intersected({{x, y}}, comm_m))
      at.add(warm, HostCause::other_stream, "NCCL kernels on another stream", "", iv.second - iv.first, 0, iv.first);
    for (const auto& iv : intersected(minus(x, y, comm_m), other_m))
      at.add(warm, HostCause::other_stream, "kernels or copies on another stream", "", iv.second - iv.first, 0,
             iv.first);
    const auto rt = cpu_by_corr.find(t.events[i].correlation);
    const bool host = rt != cpu_by_corr.end() && ts[rt->second] > x;
    if (host && !warm) ++h.late_launches;
    double budget = -1;  // the drain's share of this gap, once found
    for (const auto& [p, q] : minus(x, y, any_m)) {
      if (!host) {
        if (y - x < opt.consecutive_kernel_delay_us)
          at.add(warm, HostCause::kernel_wait, "back-to-back kernels (gaps under 30 us)", "", q - p, 0, p);
        else
          at.add(warm, HostCause::gpu_wait, "the next kernel launched already (an event or another stream)", "",
                 q - p, 0, p);
        continue;
      }
      const Event& r = t.events[rt->second];
      const std::pair<std::int64_t, std::int64_t> key{r.pid, r.tid};
      // the gap opened while that thread sat in a blocking call: the queue drained under it
      std::int64_t drain = -1;
      const Flat& f = at.flat(key);
      for (auto b = std::lower_bound(f.blocking.begin(), f.blocking.end(), std::make_pair(x - 1, std::size_t(0)));
           b != f.blocking.end() && b->first <= y; ++b)
        if (ts[b->second] < x) {
          drain = std::int64_t(b->second);
          break;
        }
      if (drain >= 0 && budget < 0) budget = x - ts[std::size_t(drain)];
      at.sweep(warm, key, p, q, drain, budget);
    }
  }
  rank(h.items);
  rank(h.warmup_items);
  return h;
}

std::string host_line(const HostAttribution& h, bool warmup, std::size_t top) {
  const auto& items = warmup ? h.warmup_items : h.items;
  const auto& by = warmup ? h.warmup_by_cause : h.by_cause;
  const double denom = warmup ? h.window_us - h.steady_window_us : h.steady_window_us;
  if (denom <= 0) return "";
  auto pct = [&](double us) { return 100 * us / denom; };
  double waited = 0;
  for (std::size_t c = 0; c < kHostCauses; ++c)
    if (HostCause(c) != HostCause::other_stream) waited += by[c];
  std::string s = fmt::format("the GPU waited {:.0f}% of the {}", pct(waited), warmup ? "warm-up" : "window");
  if (by[std::size_t(HostCause::other_stream)] > 0)
    s += fmt::format(" (another stream ran for {:.0f}% more)", pct(by[std::size_t(HostCause::other_stream)]));
  const double queued = by[std::size_t(HostCause::gpu_wait)] + by[std::size_t(HostCause::kernel_wait)];
  if (pct(queued) >= 0.5) s += fmt::format("; {:.0f}% with its next kernel already queued", pct(queued));
  s += "; the host was in: ";
  std::size_t shown = 0;
  for (const HostItem& i : items) {
    if (i.cause == HostCause::other_stream || i.cause == HostCause::gpu_wait || i.cause == HostCause::kernel_wait)
      continue;
    if (shown == top || pct(i.us) < 0.5) break;
    s += fmt::format("{}{} [{}]{} {:.1f}%", shown ? ", " : "", i.name, to_string(i.cause),
                     i.where.empty() ? "" : " (in " + i.where + ")", pct(i.us));
    ++shown;
  }
  if (!shown) s += "nothing over 0.5% of it";
  return s;
}

json to_json(const HostAttribution& h, const Iterations& it) {
  json j;
  j["device"] = h.device;
  j["stream"] = h.stream;
  j["window_us"] = h.window_us;
  j["steady_window_us"] = h.steady_window_us;
  j["idle_us"] = h.idle_us;
  j["events"] = h.events;
  j["late_launches"] = h.late_launches;
  j["gaps"] = h.gaps;
  j["python_functions"] = h.python_functions;
  j["ops_recorded"] = h.ops_recorded;
  json by = json::object(), wby = json::object();
  for (std::size_t c = 0; c < kHostCauses; ++c) {
    if (h.by_cause[c] > 0) by[to_string(HostCause(c))] = h.by_cause[c];
    if (h.warmup_by_cause[c] > 0) wby[to_string(HostCause(c))] = h.warmup_by_cause[c];
  }
  j["by_cause_us"] = by;
  auto items = [](const std::vector<HostItem>& v) {
    json a = json::array();
    for (std::size_t k = 0; k < v.size() && k < 20; ++k)
      a.push_back(json{{"cause", to_string(v[k].cause)},
                       {"name", v[k].name},
                       {"where", v[k].where},
                       {"us", v[k].us},
                       {"gaps", v[k].gaps},
                       {"pieces", v[k].pieces},
                       {"longest_call_us", v[k].longest_call_us}});
    return a;
  };
  j["items"] = items(h.items);
  j["iterations"] = json{{"source", it.source},
                         {"count", it.spans.size()},
                         {"warmup", it.warmup},
                         {"median_us", it.median_us}};
  if (it.warmup > 0) {
    j["warmup_us"] = h.warmup_us;
    j["warmup_by_cause_us"] = wby;
    j["warmup_items"] = items(h.warmup_items);
  }
  return j;
}

json timeline_json(const Trace& t, const HtaRows& rows, const HostAttribution& h, const Iterations& it,
                   std::size_t max_iterations) {
  json out = json::array();
  if (h.device < 0) return out;
  std::vector<Interval> busy;
  for (std::size_t i = 0; i < t.events.size(); ++i)
    if (t.events[i].is_gpu() && t.events[i].pid == h.device && rows.te[i] > rows.ts[i])
      busy.push_back({rows.ts[i], rows.te[i]});
  const auto busy_m = merged(std::move(busy));
  std::vector<std::pair<double, double>> spans(it.spans.begin() + std::ptrdiff_t(std::min(it.warmup, it.spans.size())),
                                               it.spans.end());
  if (spans.empty()) spans.push_back({h.window_lo, h.window_hi});
  if (spans.size() > max_iterations) spans.resize(max_iterations);
  std::vector<HostPiece> pieces = h.pieces;
  std::sort(pieces.begin(), pieces.end(), [](const HostPiece& a, const HostPiece& b) { return a.ts < b.ts; });
  for (const auto& [a, b] : spans) {
    const double len = b - a, min_us = len / 600;
    if (len <= 0) continue;
    json bj = json::array(), ij = json::array();
    for (const auto& iv : intersected({{a, b}}, busy_m)) {
      if (!bj.empty() && iv.first - (bj.back()[1].get<double>() * 1e3 + a) < min_us) {
        bj.back()[1] = (iv.second - a) / 1e3;  // a gap too small to draw: one stretch
        continue;
      }
      bj.push_back({(iv.first - a) / 1e3, (iv.second - a) / 1e3});
    }
    auto first = std::lower_bound(pieces.begin(), pieces.end(), a,
                                  [](const HostPiece& p, double x) { return p.te <= x; });
    for (auto p = first; p != pieces.end() && p->ts < b; ++p) {
      const double x = std::max(p->ts, a), y = std::min(p->te, b);
      if (y <= x) continue;
      const char* c = to_string(p->cause);
      if (!ij.empty() && ij.back()[2] == c && x - (ij.back()[1].get<double>() * 1e3 + a) < min_us) {
        ij.back()[1] = (y - a) / 1e3;
        continue;
      }
      if (y - x < min_us) continue;
      ij.push_back({(x - a) / 1e3, (y - a) / 1e3, c});
    }
    out.push_back({{"start_us", a}, {"ms", len / 1e3}, {"busy", bj}, {"idle", ij}});
  }
  return out;
}

}  // namespace sb::readers
