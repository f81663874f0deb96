// Where a CPU-only training step's time goes (definitions in cpu_breakdown.hpp).
#include "diagnose/trace/cpu_breakdown.hpp"
#include "diagnose/trace/intervals.hpp"  // merged, length, intersected, median

#include <algorithm>      // std::sort, std::max, std::min
#include <limits>         // std::numeric_limits
#include <string_view>    // std::string_view
#include <unordered_map>  // std::unordered_map
#include <utility>        // std::pair

#include <fmt/format.h>  // fmt::format

namespace sb::readers {
namespace {

using json = nlohmann::ordered_json;
using intervals::Interval;
constexpr double kInf = std::numeric_limits<double>::infinity();

bool starts(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool contains(std::string_view s, std::string_view w) { return s.find(w) != std::string_view::npos; }

// What one event's name says it is.
enum class Kind : std::uint8_t {
  loader, collective, item, factory, optimizer, gemm, autograd, view, op, python, module, step, annotation
};

bool one_of(std::string_view n, std::initializer_list<std::string_view> names) {
  for (std::string_view x : names)
    if (n == x) return true;
  return false;
}

Kind kind_of(Cat cat, std::string_view n) {
  if (cat == Cat::python_function) return starts(n, "nn.Module: ") ? Kind::module : Kind::python;
  if ((starts(n, "enumerate(DataLoader)#") || starts(n, "enumerate(DataPipe)#")) && contains(n, "__next__"))
    return Kind::loader;
  if (starts(n, "gloo:") || starts(n, "nccl:") || starts(n, "mpi:") || starts(n, "ucc:") || starts(n, "xccl:") ||
      starts(n, "c10d::") || n == "record_param_comms")
    return Kind::collective;
  if (starts(n, "Optimizer.step#") || starts(n, "Optimizer.zero_grad#")) return Kind::optimizer;
  if (starts(n, "ProfilerStep#")) return Kind::step;
  if (n == "aten::item" || n == "aten::_local_scalar_dense") return Kind::item;
  if (one_of(n, {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::zeros", "aten::zeros_like",
                 "aten::ones", "aten::ones_like", "aten::full", "aten::full_like", "aten::new_empty",
                 "aten::new_empty_strided", "aten::new_zeros", "aten::new_ones", "aten::new_full",
                 "aten::scalar_tensor"}))
    return Kind::factory;
  if (one_of(n, {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::addmv",
                 "aten::mv", "aten::dot", "aten::_addmm_activation", "aten::addbmm", "aten::einsum"}) ||
      contains(n, "convolution") || starts(n, "aten::conv"))
    return Kind::gemm;
  if (starts(n, "autograd::") || starts(n, "torch::autograd::") || (!contains(n, "::") && contains(n, "Backward")))
    return Kind::autograd;
  // views and metadata: the dispatcher's time, no arithmetic (a copy a view makes runs in its own copy op)
  if (one_of(n, {"aten::view", "aten::reshape", "aten::_reshape_alias", "aten::t", "aten::transpose",
                 "aten::permute", "aten::expand", "aten::expand_as", "aten::as_strided", "aten::detach",
                 "aten::detach_", "detach", "detach_", "aten::alias", "aten::unsqueeze", "aten::squeeze",
                 "aten::select", "aten::slice", "aten::narrow", "aten::unbind", "aten::split",
                 "aten::split_with_sizes", "aten::chunk", "aten::flatten", "aten::unflatten", "aten::_unsafe_view",
                 "aten::view_as", "aten::contiguous", "aten::to", "aten::lift_fresh", "aten::resolve_conj",
                 "aten::resolve_neg", "aten::result_type", "aten::numpy_T", "aten::is_same_size", "aten::resize_",
                 "aten::set_", "aten::requires_grad_", "aten::_has_compatible_shallow_copy_type", "aten::size",
                 "aten::stride", "aten::numel", "aten::dim", "aten::is_nonzero", "aten::_unsafe_index",
                 "aten::movedim", "aten::swapaxes", "aten::unfold", "aten::type_as"}))
    return Kind::view;
  if (cat == Cat::user_annotation || cat == Cat::gpu_user_annotation) return Kind::annotation;
  return Kind::op;
}

// A Python frame of the user's code: a file frame outside torch and the standard library's helpers.
bool user_frame(std::string_view n) {
  if (!contains(n, ".py(") || starts(n, "torch/") || starts(n, "<") || contains(n, "site-packages/") ||
      contains(n, "/torch/") || contains(n, "/lib/python"))
    return false;
  for (std::string_view lib : {"typing.py(", "enum.py(", "contextlib.py(", "functools.py(", "abc.py(", "threading.py(",
                               "weakref.py(", "copy.py(", "collections/", "importlib/"})
    if (starts(n, lib)) return false;
  return true;
}

// "<built-in method append of list object at 0x7f2b6c944040>": the address dropped, so one name per function.
std::string python_name(std::string_view n) {
  const auto at = n.find(" at 0x");
  if (at != std::string_view::npos && !n.empty() && n.back() == '>') return std::string(n.substr(0, at)) + ">";
  return std::string(n);
}

// The training thread: ProfilerStep#N's, else the loader's, else the optimizer's, else the one with the most ops.
std::pair<std::int64_t, std::int64_t> training_thread(const Trace& t) {
  std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> ops;
  std::pair<std::int64_t, std::int64_t> best[3] = {{-1, -1}, {-1, -1}, {-1, -1}};
  for (const Event& e : t.events) {
    if (e.cat != Cat::cpu_op && e.cat != Cat::user_annotation) continue;
    const std::string& n = t.name(e);
    const Kind k = kind_of(e.cat, n);
    const int rank = k == Kind::step ? 0 : k == Kind::loader ? 1 : k == Kind::optimizer ? 2 : -1;
    if (rank >= 0 && best[rank].first < 0) best[rank] = {e.pid, e.tid};
    if (e.cat == Cat::cpu_op) ++ops[{e.pid, e.tid}];
  }
  for (const auto& b : best)
    if (b.first >= 0 || b.second >= 0) return b;
  std::pair<std::int64_t, std::int64_t> top{-1, -1};
  std::int64_t most = -1;
  for (const auto& [k, v] : ops)
    if (v > most) most = v, top = k;
  return top;
}

// One thread's events flattened, and the sums over the steps.
class Sweep {
 public:
  Sweep(const Trace& t, CpuBreakdown& b, std::vector<Interval> spans) : t_(t), b_(b), spans_(std::move(spans)) {
    kinds_.resize(t.names.size());
    kind_done_.assign(t.names.size(), 0);
  }

  void run() {
    collect();
    flatten();
    sum_segments();
    count_calls();
    finish();
  }

  const std::vector<Interval>& busy() const { return busy_; }  // gemm + compute segments, merged

 private:
  Kind kind(std::size_t i) {
    const Event& e = t_.events[i];
    if (!kind_done_[e.name]) kinds_[e.name] = kind_of(e.cat, t_.name(e)), kind_done_[e.name] = 1;
    return kinds_[e.name];
  }
  const std::string& name(std::size_t i) const { return t_.name(t_.events[i]); }
  double ts(std::size_t i) const { return t_.events[i].ts; }
  double te(std::size_t i) const { return t_.events[i].end(); }

  void collect() {
    for (std::size_t i = 0; i < t_.events.size(); ++i) {
      const Event& e = t_.events[i];
      if (e.pid != b_.pid || e.tid != b_.tid || e.dur < 0) continue;
      if (e.cat == Cat::cpu_op || e.cat == Cat::user_annotation || e.cat == Cat::python_function) ev_.push_back(i);
    }
    std::sort(ev_.begin(), ev_.end(), [&](std::size_t x, std::size_t y) {
      if (ts(x) != ts(y)) return ts(x) < ts(y);
      if (te(x) != te(y)) return te(x) > te(y);
      return x < y;
    });
    const std::size_t n = t_.events.size();
    parent_.assign(n, -1);
    module_.assign(n, -1);
    bmodule_.assign(n, -1);
    end_.assign(n, 0);
    op_child_.assign(n, 0);
    gemm_child_.assign(n, 0);
  }

  // At each instant the innermost event; a child reaching past its parent's end is cut there.
  void flatten() {
    std::vector<std::size_t> stack;
    double cur = -kInf;
    auto emit = [&](double x, double y, std::int64_t top) {
      if (y > x) seg_.push_back({x, y, top});
    };
    auto pop_to = [&](double until) {
      while (!stack.empty() && end_[stack.back()] <= until) {
        const std::size_t s = stack.back();
        if (end_[s] > cur) emit(cur, end_[s], std::int64_t(s)), cur = end_[s];
        stack.pop_back();
      }
    };
    for (std::size_t i : ev_) {
      pop_to(ts(i));
      end_[i] = stack.empty() ? te(i) : std::min(te(i), end_[stack.back()]);
      if (end_[i] <= ts(i)) continue;
      if (!stack.empty() && ts(i) > cur) emit(cur, ts(i), std::int64_t(stack.back()));
      cur = std::max(cur, ts(i));
      const std::int64_t p = stack.empty() ? -1 : std::int64_t(stack.back());
      parent_[i] = p;
      module_[i] = kind(i) == Kind::module ? std::int64_t(i) : p >= 0 ? module_[std::size_t(p)] : -1;
      backward_module(i, p);
      if (t_.events[i].cat == Cat::cpu_op) mark(i, op_child_, [&](std::size_t a) { return t_.events[a].cat == Cat::cpu_op; });
      if (kind(i) == Kind::gemm) mark(i, gemm_child_, [&](std::size_t a) { return kind(a) == Kind::gemm; });
      stack.push_back(i);
    }
    pop_to(kInf);
  }
  // A forward op inside a module names its autograd node's sequence number; the backward node of that number
  // (autograd::engine::evaluate_function: ...) and everything inside it is that module's backward. The forward
  // comes first in time, so the map is filled before its backward is met.
  void backward_module(std::size_t i, std::int64_t p) {
    const Event& e = t_.events[i];
    bmodule_[i] = p >= 0 ? bmodule_[std::size_t(p)] : -1;
    if (e.cat != Cat::cpu_op || e.sequence < 0) return;
    if (kind(i) == Kind::autograd && starts(name(i), "autograd::engine::evaluate_function:")) {
      if (auto it = seq_module_.find(e.sequence); it != seq_module_.end()) bmodule_[i] = it->second;
    } else if (module_[i] >= 0 && kind(i) != Kind::autograd) {
      seq_module_.emplace(e.sequence, module_[i]);
    }
  }
  // Marks the nearest ancestor of i that `is` names as having such a child.
  template <class F>
  void mark(std::size_t i, std::vector<char>& flag, F&& is) {
    for (std::int64_t a = parent_[i]; a >= 0; a = parent_[std::size_t(a)])
      if (is(std::size_t(a))) {
        flag[std::size_t(a)] = 1;
        return;
      }
  }

  struct Seg {
    double a, b;
    std::int64_t top;
  };
  struct Class {
    CpuCause cause = CpuCause::nothing;
    std::size_t item = 0;
    std::int64_t anchor = -1;  // the event whose calls the item counts
  };

  std::string where_of(std::int64_t i) {
    for (; i >= 0; i = parent_[std::size_t(i)])
      if (t_.events[std::size_t(i)].cat == Cat::python_function && user_frame(name(std::size_t(i))))
        return name(std::size_t(i));
    return "";
  }

  std::size_t item(CpuCause c, const std::string& nm, const std::string& where) {
    const std::string key = fmt::format("{}\x1f{}\x1f{}", int(c), nm, where);
    auto it = index_.find(key);
    if (it != index_.end()) return it->second;
    b_.items.push_back(CpuItem{c, nm, where, 0, 0, 0});
    index_.emplace(key, b_.items.size() - 1);
    return b_.items.size() - 1;
  }

  // What time with `top` innermost was, read from it and its ancestors.
  Class classify(std::int64_t top) {
    if (top < 0) return {CpuCause::nothing, item(CpuCause::nothing, "(no event recorded)", ""), -1};
    if (auto it = memo_.find(top); it != memo_.end()) return it->second;
    std::int64_t loader = -1, coll = -1, itm = -1, fac = -1, opt = -1;
    for (std::int64_t i = top; i >= 0; i = parent_[std::size_t(i)]) {
      const Kind k = kind(std::size_t(i));
      if (k == Kind::loader && loader < 0) loader = i;
      if (k == Kind::collective && coll < 0) coll = i;
      if (k == Kind::item) itm = i;     // the outermost: aten::item, not the _local_scalar_dense in it
      if (k == Kind::factory) fac = i;  // the outermost: aten::zeros, not the aten::empty in it
      if (k == Kind::optimizer && opt < 0) opt = i;
    }
    const std::size_t u = std::size_t(top);
    Class c;
    auto set = [&](CpuCause cause, std::int64_t anchor, const std::string& nm, bool with_where) {
      c = {cause, item(cause, nm, with_where ? where_of(anchor) : ""), anchor};
    };
    const Kind k = kind(u);
    if (loader >= 0) set(CpuCause::loader, loader, name(std::size_t(loader)), false);
    else if (coll >= 0) set(CpuCause::communication, coll, name(std::size_t(coll)), false);
    else if (itm >= 0) set(CpuCause::sync, itm, name(std::size_t(itm)), true);
    else if (fac >= 0) set(CpuCause::allocation, fac, name(std::size_t(fac)), true);
    else if (opt >= 0) set(CpuCause::optimizer, opt, name(std::size_t(opt)), false);
    else if (k == Kind::gemm)
      set(CpuCause::gemm, top, fmt::format("{} ({})", name(u), *to_string(t_.events[u].input_type)
                                                                    ? to_string(t_.events[u].input_type)
                                                                    : "type not recorded"), false);
    else if (k == Kind::op) set(CpuCause::compute, top, name(u), false);
    else if (k == Kind::autograd) set(CpuCause::autograd, top, name(u), false);
    else if (k == Kind::view || k == Kind::item || k == Kind::factory) set(CpuCause::framework, top, name(u), false);
    else if (k == Kind::python && contains(name(u), "run_backward"))  // the engine between its nodes
      set(CpuCause::autograd, top, python_name(name(u)), false);
    else if (k == Kind::python || k == Kind::module) set(CpuCause::python, top, python_name(name(u)), true);
    else set(CpuCause::nothing, top, fmt::format("(in {}, no op recorded)", k == Kind::step ? "ProfilerStep#N" : name(u)),
             false);
    memo_.emplace(top, c);
    return c;
  }

  void add(double x, double y, std::int64_t top, std::size_t step) {
    if (y <= x) return;
    const Class c = classify(top);
    b_.by_cause[std::size_t(c.cause)] += y - x;
    b_.items[c.item].us += y - x;
    if (c.anchor >= 0 && !counted_[std::size_t(c.anchor)]) {
      counted_[std::size_t(c.anchor)] = 1;
      ++b_.items[c.item].calls;
      b_.items[c.item].longest_call_us =
          std::max(b_.items[c.item].longest_call_us, te(std::size_t(c.anchor)) - ts(std::size_t(c.anchor)));
    }
    const bool busy = c.cause == CpuCause::gemm || c.cause == CpuCause::compute;
    if (busy) {
      step_compute_[step] += y - x;
      busy_.emplace_back(x, y);
    }
    if (c.cause == CpuCause::gemm)
      b_.gemm_us_by_type[to_string(t_.events[std::size_t(top)].input_type)] += y - x;
    if (top >= 0) {
      const std::int64_t fwd = module_[std::size_t(top)], m = fwd >= 0 ? fwd : bmodule_[std::size_t(top)];
      if (m >= 0) {
        (fwd >= 0 ? own_ : back_)[m] += y - x;
        if (busy) own_compute_[m] += y - x;
        if (c.cause == CpuCause::allocation) own_alloc_[m] += y - x;
      }
    }
  }

  // The segments clipped to the steps; what no segment covers inside a step is nothing recorded.
  void sum_segments() {
    counted_.assign(t_.events.size(), 0);
    step_compute_.assign(spans_.size(), 0);
    std::size_t k = 0;
    for (std::size_t s = 0; s < spans_.size(); ++s) {
      const auto [lo, hi] = spans_[s];
      while (k < seg_.size() && seg_[k].b <= lo) ++k;
      double at = lo;
      for (std::size_t j = k; j < seg_.size() && seg_[j].a < hi; ++j) {
        const double x = std::max(lo, seg_[j].a), y = std::min(hi, seg_[j].b);
        if (y <= x) continue;
        if (x > at) add(at, x, -1, s);
        add(x, y, seg_[j].top, s);
        at = y;
      }
      if (at < hi) add(at, hi, -1, s);
    }
  }

  std::size_t step_of(double x) const {
    auto it = std::upper_bound(spans_.begin(), spans_.end(), Interval{x, kInf});
    if (it == spans_.begin()) return spans_.size();
    --it;
    return x < it->second ? std::size_t(it - spans_.begin()) : spans_.size();
  }

  // Calls by their start inside a step: leaf ops, GEMMs, .item() reads, each module's forward and ops.
  void count_calls() {
    std::vector<double> leaf, gemm;
    std::vector<char> synced(spans_.size(), 0);
    std::unordered_map<std::int64_t, std::vector<double>> mod_leaf;
    for (std::size_t i : ev_) {
      if (end_[i] <= ts(i)) continue;
      const std::size_t s = step_of(ts(i));
      if (s == spans_.size()) continue;
      const Kind k = kind(i);
      const bool op = t_.events[i].cat == Cat::cpu_op;
      const double d = end_[i] - ts(i);
      if (op && !op_child_[i] && (k == Kind::op || k == Kind::gemm)) leaf.push_back(d);
      if (k == Kind::gemm && !gemm_child_[i]) gemm.push_back(d);
      const std::int64_t p = parent_[i];
      if (k == Kind::item && (p < 0 || kind(std::size_t(p)) != Kind::item)) {
        if (b_.sync_calls++ == 0) b_.sync_where = where_of(std::int64_t(i));
        synced[s] = 1;
      }
      if (k == Kind::module) ++mod_calls_[std::int64_t(i)];
      const std::int64_t m = p >= 0 ? module_[std::size_t(p)] : -1;
      if (op && m >= 0) {
        ++mod_ops_[m];
        if (!op_child_[i]) mod_leaf[m].push_back(d);
      }
      if (k == Kind::python && m >= 0 && !mod_where_.count(m) && user_frame(name(i))) mod_where_[m] = name(i);
    }
    b_.leaf_ops = std::int64_t(leaf.size());
    b_.leaf_op_median_us = intervals::median(leaf);
    b_.gemm_calls = std::int64_t(gemm.size());
    b_.gemm_median_us = intervals::median(gemm);
    for (char c : synced) b_.steps_with_sync += c;
    for (auto& [m, v] : mod_leaf) mod_leaf_median_[m] = intervals::median(v);
  }

  // Modules summed by name (an instance's calls in every step), largest own time first; items ranked.
  void finish() {
    std::map<std::string, CpuModule> by;
    auto get = [&](std::int64_t m) -> CpuModule& {
      CpuModule& x = by[name(std::size_t(m))];
      x.name = name(std::size_t(m));
      if (x.where.empty() && mod_where_.count(m)) x.where = mod_where_[m];
      return x;
    };
    for (const auto& [m, us] : own_) get(m).own_us += us;
    for (const auto& [m, us] : back_) get(m).backward_us += us;
    for (const auto& [m, us] : own_compute_) get(m).compute_us += us;
    for (const auto& [m, us] : own_alloc_) get(m).alloc_us += us;
    for (const auto& [m, n] : mod_calls_) get(m).calls += n;
    for (const auto& [m, n] : mod_ops_) get(m).ops += n;
    // the median of a module's leaf ops: the median of its calls' medians (the calls run the same code)
    std::map<std::string, std::vector<double>> med;
    for (const auto& [m, v] : mod_leaf_median_) med[name(std::size_t(m))].push_back(v);
    for (auto& [nm, v] : med) by[nm].op_median_us = intervals::median(v);
    for (auto& [nm, m] : by) b_.modules.push_back(std::move(m));
    std::stable_sort(b_.modules.begin(), b_.modules.end(),
                     [](const CpuModule& x, const CpuModule& y) {
                       return x.own_us + x.backward_us > y.own_us + y.backward_us;
                     });
    std::stable_sort(b_.items.begin(), b_.items.end(), [](const CpuItem& x, const CpuItem& y) { return x.us > y.us; });
    for (std::size_t s = 0; s < spans_.size(); ++s) {
      const double len = spans_[s].second - spans_[s].first;
      b_.compute_pct.push_back(len > 0 ? 100 * step_compute_[s] / len : 0);
    }
    busy_ = intervals::merged(std::move(busy_));
  }

  const Trace& t_;
  CpuBreakdown& b_;
  std::vector<Interval> spans_;
  std::vector<Kind> kinds_;
  std::vector<char> kind_done_;
  std::vector<std::size_t> ev_;
  std::vector<std::int64_t> parent_, module_, bmodule_;
  std::unordered_map<std::int64_t, std::int64_t> seq_module_;
  std::vector<double> end_;
  std::vector<char> op_child_, gemm_child_, counted_;
  std::vector<Seg> seg_;
  std::unordered_map<std::int64_t, Class> memo_;
  std::unordered_map<std::string, std::size_t> index_;
  std::vector<double> step_compute_;
  std::vector<Interval> busy_;
  std::map<std::int64_t, double> own_, back_, own_compute_, own_alloc_, mod_leaf_median_;
  std::map<std::int64_t, std::int64_t> mod_calls_, mod_ops_;
  std::map<std::int64_t, std::string> mod_where_;
};

// The collectives on every thread: their union over the steps, and of it what the training thread spent
// with no arithmetic (busy: its gemm and compute time, merged).
void collectives(const Trace& t, const std::vector<Interval>& steps, const std::vector<Interval>& busy,
                 CpuBreakdown& b) {
  std::vector<Interval> coll;
  std::map<std::string, std::int64_t> names;
  for (const Event& e : t.events) {
    if (e.cat != Cat::cpu_op && e.cat != Cat::user_annotation) continue;
    const std::string& n = t.name(e);
    if (kind_of(e.cat, n) != Kind::collective) continue;
    ++b.collectives_in_trace;
    if (!intervals::intersected({{e.ts, e.end()}}, steps).empty()) ++b.collectives, ++names[n];
    coll.emplace_back(e.ts, e.end());
  }
  const auto in = intervals::intersected(intervals::merged(std::move(coll)), steps);
  b.communication_us = intervals::length(in);
  b.communication_exposed_us = b.communication_us - intervals::overlap(in, busy);
  std::int64_t most = 0;
  for (const auto& [n, k] : names)
    if (k > most) most = k, b.collective_name = n;
}

}  // namespace

const char* to_string(CpuCause c) {
  switch (c) {
    case CpuCause::gemm: return "gemm";
    case CpuCause::compute: return "compute";
    case CpuCause::allocation: return "allocation";
    case CpuCause::sync: return "sync";
    case CpuCause::loader: return "loader";
    case CpuCause::communication: return "communication";
    case CpuCause::optimizer: return "optimizer";
    case CpuCause::autograd: return "autograd";
    case CpuCause::framework: return "framework";
    case CpuCause::python: return "python";
    case CpuCause::nothing: return "nothing";
  }
  return "nothing";
}

CpuBreakdown cpu_breakdown(const Trace& t, const Iterations& it) {
  CpuBreakdown b;
  bool host = false;
  for (const Event& e : t.events) {
    if (e.is_gpu()) return b;
    if (e.cat == Cat::cpu_op) ++b.cpu_ops;
    if (e.cat == Cat::python_function) b.python_functions = true;
    if (e.input_type != ElemType::none) b.shapes = true;
    host = host || e.cat == Cat::cpu_op || e.cat == Cat::user_annotation;
  }
  if (!host) return b;
  std::tie(b.pid, b.tid) = training_thread(t);
  std::vector<Interval> spans;
  if (it.spans.size() > it.warmup) {
    spans.assign(it.spans.begin() + std::ptrdiff_t(it.warmup), it.spans.end());
    b.steps_source = it.source;
    b.warmup = it.warmup;
  } else {  // no iterations: the training thread's span
    double lo = kInf, hi = -kInf;
    for (const Event& e : t.events)
      if (e.pid == b.pid && e.tid == b.tid && (e.cat == Cat::cpu_op || e.cat == Cat::user_annotation))
        lo = std::min(lo, e.ts), hi = std::max(hi, e.end());
    if (hi > lo) spans.emplace_back(lo, hi);
    b.steps_source = "the training thread's span (no iterations found)";
  }
  // in order, each from the end of the one before (anchored iterations touch: not merged into one)
  std::sort(spans.begin(), spans.end());
  std::vector<Interval> kept;
  for (auto [a, z] : spans) {
    if (!kept.empty()) a = std::max(a, kept.back().second);
    if (z > a) kept.emplace_back(a, z);
  }
  spans = std::move(kept);
  if (spans.empty()) return b;
  b.applies = true;
  b.steps = spans.size();
  b.steps_us = intervals::length(spans);
  Sweep sw(t, b, spans);
  sw.run();
  collectives(t, spans, sw.busy(), b);
  return b;
}

std::string cpu_line(const CpuBreakdown& b, std::size_t top) {
  if (!b.applies || b.steps_us <= 0) return "";
  auto pct = [&](double us) { return 100 * us / b.steps_us; };
  std::string s = fmt::format("compute ops {:.0f}% of the {} (GEMM {:.0f}%)",
                              pct(b.us(CpuCause::gemm) + b.us(CpuCause::compute)),
                              b.steps == 1 ? "step" : fmt::format("{} steps", b.steps), pct(b.us(CpuCause::gemm)));
  s += "; the training thread was in: ";
  std::size_t shown = 0;
  for (const CpuItem& i : b.items) {
    if (shown == top || pct(i.us) < 0.5) break;
    s += fmt::format("{}{} [{}]{} {:.1f}%", shown ? ", " : "", i.name, to_string(i.cause),
                     i.where.empty() ? "" : " (in " + i.where + ")", pct(i.us));
    ++shown;
  }
  if (!shown) s += "nothing over 0.5% of it";
  if (b.communication_us > 0)
    s += fmt::format("; collectives (every thread) cover {:.0f}%", pct(b.communication_us));
  return s;
}

json to_json(const CpuBreakdown& b) {
  json j;
  j["thread"] = json{{"pid", b.pid}, {"tid", b.tid}};
  j["steps_source"] = b.steps_source;
  j["steps"] = b.steps;
  j["warmup_left_out"] = b.warmup;
  j["steps_us"] = b.steps_us;
  json by = json::object();
  for (std::size_t c = 0; c < kCpuCauses; ++c)
    if (b.by_cause[c] > 0) by[to_string(CpuCause(c))] = b.by_cause[c];
  j["by_cause_us"] = by;
  j["compute_pct_per_step"] = b.compute_pct;
  json g = json::object();
  for (const auto& [k, v] : b.gemm_us_by_type) g[k.empty() ? "unknown" : k] = v;
  j["gemm_us_by_type"] = g;
  j["gemm_calls"] = b.gemm_calls;
  j["gemm_median_us"] = b.gemm_median_us;
  j["leaf_ops"] = b.leaf_ops;
  j["leaf_op_median_us"] = b.leaf_op_median_us;
  j["sync_calls"] = b.sync_calls;
  j["steps_with_sync"] = b.steps_with_sync;
  j["communication_us"] = b.communication_us;
  j["communication_exposed_us"] = b.communication_exposed_us;
  j["collectives"] = b.collectives;
  j["collectives_in_trace"] = b.collectives_in_trace;
  json items = json::array();
  for (std::size_t k = 0; k < b.items.size() && k < 20; ++k)
    items.push_back(json{{"cause", to_string(b.items[k].cause)},
                         {"name", b.items[k].name},
                         {"where", b.items[k].where},
                         {"us", b.items[k].us},
                         {"calls", b.items[k].calls},
                         {"longest_call_us", b.items[k].longest_call_us}});
  j["items"] = items;
  json mods = json::array();
  for (std::size_t k = 0; k < b.modules.size() && k < 10; ++k)
    mods.push_back(json{{"name", b.modules[k].name},
                        {"own_us", b.modules[k].own_us},
                        {"backward_us", b.modules[k].backward_us},
                        {"alloc_us", b.modules[k].alloc_us},
                        {"compute_us", b.modules[k].compute_us},
                        {"calls", b.modules[k].calls},
                        {"ops", b.modules[k].ops},
                        {"op_median_us", b.modules[k].op_median_us},
                        {"where", b.modules[k].where}});
  j["modules"] = mods;
  return j;
}

}  // namespace sb::readers
