// packing: short sequences padded to a long max_len.
//
// Workload: a dataset of sequence lengths is batched by a strategy into
// max_len-token rows (workloads/packers.hpp: pad-max, pad-longest,
// bucket, first/best-fit-decreasing packing, best fit over a length
// histogram, naive concat), and the device
// runs one transformer layer, forward and backward, over the computed tokens
// of a sample of the batches:
//   projections and MLP: 4 GEMMs per layer, M = computed tokens,
//     QKV [M, q, d] (q = d + 2 kv_heads head_dim: 3d unless kv_heads is
//     given), out [M, d, d], up [M, f, d], down [M, d, f] (f = d_ff, 4d
//     unless given); forward FLOPs 2*M*(qd + d^2 + 2df); the backward's two GEMMs per forward GEMM are
//     timed as two more GEMMs of the same shape (same FLOPs);
//   attention per sequence: padded rows attend within the row (dense, the
//     padding computed); packed rows use varlen attention over the segment
//     boundaries (cu_seqlens), so no example attends to another; concat runs
//     dense over whole rows: examples attend to each other (wrong for training).
// Definitions (docs/DESIGN.md): padding fraction = 1 - real tokens / computed
// tokens; packing efficiency = real tokens / (rows * max_len). Effective
// tokens/s counts real tokens only. The predicted speedup over pad-max is the
// ratio of computed tokens per real token.
#include <algorithm>
#include <limits>  // std::min, std::max
#include <array>      // std::array
#include <map>        // std::map
#include <optional>   // std::optional
#include <set>        // std::set
#include <vector>     // std::vector

#include <fmt/format.h>  // fmt::format

#include "harness/attention_check.hpp"   // attention_flops
#include "harness/errors.hpp"            // UnsupportedError
#include "harness/host_memory.hpp"       // reserve_host_memory: lengths and plan
#include "harness/point_metrics.hpp"     // measurement_info, against_baseline, workload_key, varying_params
#include "harness/printer.hpp"           // format_number
#include "harness/scenario.hpp"          // Scenario, ScenarioRun
#include "harness/text.hpp"              // split
#include "workloads/packers.hpp"  // plan, generate_lengths

namespace sb {
namespace {

using json = nlohmann::ordered_json;
namespace pk = packing;

// Forward+backward FLOPs of a GEMM: the forward and the two backward GEMMs.
constexpr double kGemmFwdBwdFactor = 3;

// The layer's four GEMMs over m tokens: QKV (q outputs: K and V at the K/V heads), the output projection,
// the MLP's up and down (f wide).
std::array<GemmShape, 4> layer_gemms(std::int64_t m, std::int64_t d, std::int64_t f, std::int64_t q) {
  return {GemmShape{m, q, d}, GemmShape{m, d, d}, GemmShape{m, f, d}, GemmShape{m, d, f}};
}

// The layer's attention before its rows are laid out (prepare sets batch, seq and cu_seqlens).
AttnShape layer_attention(std::int64_t d, std::int64_t heads) {
  AttnShape a;
  a.heads = heads;
  a.head_dim = d / heads;
  return a;
}

// The device work of one batch, prepared before timing.
struct BatchWork {
  std::vector<std::unique_ptr<GemmOp>> gemms;
  std::unique_ptr<AttentionOp> attn;
  std::int64_t real = 0, computed = 0;
  // Forward+backward FLOPs: 3 x the GEMMs' 2*M*N*K, and 3.5 x attention's
  // forward (quadratic in each sequence's length: padding costs S^2 there).
  double attn_flops() const { return attention_flops(attn->shape(), true); }
  double gemm_flops() const {
    double f = 0;
    for (const auto& g : gemms) f += kGemmFwdBwdFactor * g->shape().flops();
    return f;
  }
};

// Everything a point is, read once from its parameters (validate uses it too).
struct Settings {
  pk::Strategy strategy = pk::Strategy::pad_max;
  pk::Overflow overflow = pk::Overflow::split;
  std::int32_t max_len = 0, rows_per_batch = 0, window = 0, pad_multiple = 1;
  std::int64_t d_model = 0, d_ff = 0, heads = 0, kv_heads = 0, sequences = 0, batches = 0;
  // QKV's outputs: Q at every head, K and V at the K/V heads
  std::int64_t qkv_out() const { return d_model + 2 * (kv_heads > 0 ? kv_heads : heads) * (d_model / heads); }
  DType dtype = DType::fp32;
  AttnImpl attn = AttnImpl::naive;
  std::string lengths;
  int trials = 0;

  static Settings from(const ParamSet& ps) {
    Settings st;
    st.strategy = ps.get_choice("strategy", pk::kStrategyNames);
    st.overflow = ps.get_choice("overflow", pk::kOverflowNames);
    st.max_len = std::int32_t(ps.get_int("max_len"));
    st.rows_per_batch = std::int32_t(ps.get_int("rows"));
    st.window = std::int32_t(ps.get_int("window"));
    st.pad_multiple = std::int32_t(ps.get_int("pad_multiple"));
    st.d_model = ps.get_int("d_model");
    st.d_ff = ps.get_int("d_ff") > 0 ? ps.get_int("d_ff") : 4 * st.d_model;
    st.heads = ps.get_int("heads");
    st.kv_heads = ps.get_int("kv_heads");
    st.sequences = ps.get_int("sequences");
    st.batches = ps.get_int("batches");
    st.dtype = ps.get_choice("dtype", kDTypeNames);
    st.attn = ps.get_choice("attn", kAttnImplNames);
    st.lengths = ps.get_str("lengths");
    st.trials = int(ps.get_int("trials"));
    return st;
  }
  bool lengths_from_file() const { return !lengths.empty() && lengths.front() == '@'; }
};

class PackingRun : public ScenarioRun {
 public:
  explicit PackingRun(RunContext& ctx) : ctx_(ctx) {}

  Point run_point(const ParamSet& ps) override {
    Device& dev = ctx_.device;
    const Settings st = Settings::from(ps);
    const auto strategy = st.strategy;
    const auto overflow = st.overflow;
    const auto max_len = st.max_len;
    const auto rows_per_batch = st.rows_per_batch;
    const std::int64_t d = st.d_model, f = st.d_ff, heads = st.heads, q = st.qkv_out();
    const DType dt = st.dtype;
    const AttnImpl attn_impl = st.attn;
    if (auto why = dev.attention_unsupported(attn_impl, dt)) throw UnsupportedError(*why);

    // pack-hist on a whole histogram file (sequences=0) plans its counts and
    // never expands them; everything else plans the dataset's lengths.
    const std::optional<std::vector<pk::LengthCount>> counts =
        strategy == pk::Strategy::pack_hist && st.sequences == 0 ? file_histogram(st.lengths, max_len)
            : std::nullopt;
    static const std::vector<std::int32_t> kNone;
    const std::vector<std::int32_t>& lengths =
        counts ? kNone : dataset_.get(st.lengths, st.sequences, max_len);
    std::int64_t n_sequences = std::int64_t(lengths.size());
    if (counts)
      for (const auto& c : *counts) n_sequences += c.count;
    // The plan's rows, held for the point: about a segment (16 B) and a row
    // (a vector and its block, ~56 B) per sequence, refused up front (oom)
    // rather than killed half-way under a memory limit.
    const HostReservation plan_memory = reserve_host_memory(
        std::uint64_t(lengths.size()) * 72, fmt::format("packing {}: the plan of {} sequences (about 72 B each)",
                                                        to_string(strategy), lengths.size()));
    const pk::Plan plan =
        counts ? pk::plan_histogram(*counts, max_len, overflow)
               : pk::plan(lengths, strategy, max_len, rows_per_batch, st.window, overflow, st.pad_multiple);
    if (plan.real_tokens == 0)  // e.g. a length distribution wholly over max_len with overflow=drop
      throw MismatchError(fmt::format("no token is left to measure: all {} sequences were dropped (longer than "
                                      "max_len={} with overflow=drop)",
                                      n_sequences, max_len));
    const std::int64_t n_rows = plan.row_count();
    const std::int64_t n_batches = (n_rows + rows_per_batch - 1) / rows_per_batch;
    // The epoch's per-batch costs and their order below (32 B a batch), held in the budget as the plan
    // is: a histogram's counts are never expanded, but a count of 2^34 is 2^32 batches of four rows.
    const HostReservation batch_memory = reserve_host_memory(
        std::uint64_t(n_batches) * 32, fmt::format("packing {}: the costs and order of the epoch's {} batches (32 B "
                                                   "each)",
                                                   to_string(strategy), n_batches));

    // A sample of batches is prepared and timed: the middle batch of each of `sample` equal
    // strata of the epoch's batches ordered by their FLOPs, so the few timed batches hold the
    // epoch's mix of short and long sequences (evenly spaced batches of pad-longest's random
    // order held 787 tokens of a mean-450 dataset in 4 batches; pack-bfd's rows come longest
    // first).
    const std::vector<Cost> costs = batch_flops(plan, rows_per_batch, d, f, q, heads, is_packed(strategy));
    const std::int64_t sample = std::min<std::int64_t>(st.batches, n_batches);
    std::vector<std::int64_t> by_cost(std::size_t(n_batches), 0);
    for (std::int64_t b = 0; b < n_batches; ++b) by_cost[std::size_t(b)] = b;
    std::stable_sort(by_cost.begin(), by_cost.end(),
                     [&](std::int64_t a, std::int64_t b) {
                       const Cost &x = costs[std::size_t(a)], &y = costs[std::size_t(b)];
                       return x.gemm + x.attn < y.gemm + y.attn;
                     });
    std::vector<std::int64_t> chosen;
    for (std::int64_t i = 0; i < sample; ++i) chosen.push_back(by_cost[std::size_t((2 * i + 1) * n_batches / (2 * sample))]);
    std::sort(chosen.begin(), chosen.end());
    std::vector<BatchWork> work;
    ctx_.progress(fmt::format("packing {}: preparing {} batches", to_string(strategy), sample));
    for (const std::int64_t b : chosen)
      work.push_back(prepare(dev, plan, b * rows_per_batch, std::min(n_rows, (b + 1) * rows_per_batch), d, f, q,
                             heads, dt, attn_impl));
    std::int64_t real = 0, computed = 0;
    double gemm_flops = 0, attn_flops = 0;
    for (const auto& w : work) {
      real += w.real;
      computed += w.computed;
      gemm_flops += w.gemm_flops();
      attn_flops += w.attn_flops();
    }
    const double flops = gemm_flops + attn_flops;

    // The GEMMs and the attention are timed apart (half the budget each): their FLOP/s differ
    // (on this project's AMX Xeon, flash attention ran at 0.5-0.7x the GEMMs' FLOP/s), and the timed batches'
    // share of each is not the epoch's.
    ctx_.progress(fmt::format("packing {}: timing", to_string(strategy)));
    MeasureConfig cfg = with_min_trials(ctx_.measure, st.trials);
    cfg.budget_s /= 2;
    const Measurement mg = measure(
        dev,
        [&] {
          for (auto& w : work)
            for (int rep = 0; rep < 3; ++rep)  // forward, and backward's dX and dW per GEMM
              for (auto& g : w.gemms) g->enqueue();
        },
        cfg);
    const Measurement ma = measure(
        dev,
        [&] {
          for (auto& w : work) {
            w.attn->forward();
            w.attn->backward();
          }
        },
        cfg);
    const double gemm_s = mg.ms.median / 1e3, attn_s = ma.ms.median / 1e3, secs = gemm_s + attn_s;
    // The timed batches are a few of the epoch's: attention's cost per token grows with each
    // sequence's length, so their tokens/s is not the epoch's (4 evenly spaced, short batches of
    // pad-longest read 1.67x pack-bfd's tokens/s where the epochs' FLOPs per real token are
    // equal). The epoch's time is taken as its GEMM FLOPs at the timed GEMMs' FLOP/s plus its
    // attention FLOPs at the timed attention's; the sample's own figure is kept beside it.
    double all_gemm = 0, all_attn = 0;
    for (const Cost& c : costs) {
      all_gemm += c.gemm;
      all_attn += c.attn;
    }
    const double all_flops = all_gemm + all_attn;
    const double epoch_s = (gemm_flops > 0 ? gemm_s * all_gemm / gemm_flops : gemm_s) +
                           (attn_flops > 0 ? attn_s * all_attn / attn_flops : attn_s);

    Point p;
    p.add({"padding_pct", 100 * plan.padding_fraction(), "%", Direction::lower, std::nullopt,
           "1 - real tokens / computed tokens (whole epoch)"});
    p.add({"efficiency_pct", 100 * plan.efficiency(), "%", Direction::higher, std::nullopt,
           "real tokens / (rows * max_len) (whole epoch)"});
    p.add({"real_tokens_per_s", double(plan.real_tokens) / epoch_s, "tokens/s", Direction::higher, std::nullopt,
           "the epoch's real (non-padding) tokens / its time (its GEMM and attention FLOPs, each at the FLOP/s "
           "the timed batches ran it at): effective throughput"});
    p.add({"computed_tokens_per_s", double(plan.computed_tokens) / epoch_s, "tokens/s", Direction::higher,
           std::nullopt, "the epoch's computed tokens, padding included, likewise", false});
    p.add({"timed_real_tokens_per_s", double(real) / secs, "tokens/s", Direction::higher, std::nullopt,
           "real tokens of the timed batches themselves / median time (their own mix of lengths)", false});
    p.add({"tflops", flops / secs / 1e12, "TFLOP/s", Direction::higher, std::nullopt,
           "forward+backward FLOPs of the timed batches / their time", false});
    p.add({"gemm_tflops", gemm_flops / gemm_s / 1e12, "TFLOP/s", Direction::higher, std::nullopt,
           "the timed batches' GEMMs, forward+backward", false});
    p.add({"attention_tflops", attn_flops / attn_s / 1e12, "TFLOP/s", Direction::higher, std::nullopt,
           "the timed batches' attention, forward+backward", false});
    p.add({"rows", double(n_rows), "rows", Direction::lower, std::nullopt, "max_len rows for the epoch"});
    p.add({"plan_ms", plan.seconds * 1e3, "ms", Direction::lower, std::nullopt, "time the batching strategy took"});
    p.add({"ms", 1e3 * secs, "ms", Direction::lower, std::nullopt,
           "time of the timed batches, fwd+bwd: the GEMMs' median + the attention's median", false});
    p.add({"gemm_ms", mg.ms.median, "ms", Direction::lower, mg.ms, "median time of the timed batches' GEMMs", false});
    p.add({"attention_ms", ma.ms.median, "ms", Direction::lower, ma.ms,
           "median time of the timed batches' attention", false});
    p.info = json{{"real_tokens", plan.real_tokens},
                  {"computed_tokens", plan.computed_tokens},
                  {"dropped_tokens", plan.dropped_tokens},
                  {"split_sequences", plan.split_sequences},
                  // sequences over 4 x max_len are clipped to it before planning (a heavy tail would
                  // otherwise dominate the run): split counts at most 4 pieces of them, drop and
                  // truncate are unchanged
                  {"clipped_sequences", counts ? hist_clipped_ : dataset_.clipped()},
                  {"clip_length", 4 * std::int64_t(max_len)},
                  {"batches", n_batches},
                  {"timed_batches", sample},
                  {"timed_real_tokens", real},
                  {"timed_computed_tokens", computed},
                  {"timed_flops", flops},
                  {"epoch_flops", all_flops},
                  {"timed_gemm_flops", gemm_flops},
                  {"epoch_gemm_flops", all_gemm},
                  {"cross_contamination", plan.cross_contamination},
                  {"pad_multiple", st.pad_multiple},
                  {"attention", std::string(to_string(attn_impl)) + (is_packed(strategy) ? " varlen" : " dense")},
                  {"layer", fmt::format("d_model {}, {} heads{}, MLP {} wide{}, {}", d, heads,
                                         q != 3 * d ? fmt::format(" (K/V at {})", (q - d) / 2 / (d / heads)) : "", f,
                                         f == 4 * d ? " (4d)" : "", to_string(dt))}};
    p.info["gemm_timing"] = measurement_info(mg);
    p.info["attention_timing"] = measurement_info(ma);
    if (plan.packed)  // pack-hist: rows as pack shapes with repeat counts
      p.info["pack_shapes"] = std::int64_t(plan.packed->groups.size());
    if (plan.cross_contamination)
      p.info["warning"] = "concat lets examples attend to each other: wrong for training";
    return p;
  }

  void analyze(Result& r) override {
    // Each point against the pad-max point of its own workload: every parameter but the
    // strategy (a sweep of lengths held one distribution's strategies against the other's
    // pad-max, and the finding mixed the two).
    auto key = [](const Point& p) { return workload_key(p, {"strategy"}); };
    auto flops_per_real = [](const Point& p) {
      // Over the epoch where the point records its FLOPs (2026-12-03 on), else over the timed batches.
      if (p.info.contains("epoch_flops"))
        return p.info.value("epoch_flops", 0.0) / std::max(1.0, double(p.info.value("real_tokens", 0)));
      return p.info.value("timed_flops", 0.0) / std::max(1.0, double(p.info.value("timed_real_tokens", 0)));
    };
    const auto is_base = [](const Point& p) { return p.params.value("strategy", "") == "pad-max"; };
    struct Workload {
      const Point* base = nullptr;  // its pad-max
      const Point* best = nullptr;  // the fastest strategy that trains correctly
    };
    std::map<std::string, Workload> workloads;
    std::vector<std::string> order;  // workloads in the order of their first point
    against_baseline(r, key, is_base, [&](Point& p, const Point& base) {
      const double base_cpr =
          double(base.info.value("computed_tokens", 0)) / double(base.info.value("real_tokens", 1));
      const double sp = p.metric("real_tokens_per_s")->value / base.metric("real_tokens_per_s")->value;
      const double cpr = double(p.info.value("computed_tokens", 0)) / double(p.info.value("real_tokens", 1));
      p.add({"speedup_vs_pad_max", sp, "x", Direction::higher, std::nullopt,
             "real tokens/s over pad-max, measured in this run"});
      p.add({"predicted_speedup", base_cpr / cpr, "x", Direction::none, std::nullopt,
             "pad-max computed tokens per real token / this strategy's"});
      p.add({"predicted_flops_speedup", flops_per_real(base) / std::max(1e-30, flops_per_real(p)), "x",
             Direction::none, std::nullopt,
             "pad-max FLOPs per real token / this strategy's: attention is quadratic in the padded length"});
      const std::string k = key(p);
      if (!workloads.count(k)) order.push_back(k);
      Workload& w = workloads[k];
      w.base = &base;
      if (!p.info.value("cross_contamination", false) &&
          (!w.best || sp > w.best->metric("speedup_vs_pad_max")->value))
        w.best = &p;
    });
    // What tells the workloads apart, when there are several.
    const std::set<std::string> varying = varying_params(r, {"strategy"});
    for (const std::string& k : order) {
      const Point* b = workloads[k].best;
      const Point* base = workloads[k].base;
      if (!b) continue;  // only concat ran beside pad-max
      const std::string which = params_label(*b, varying);
      const double sp = b->metric("speedup_vs_pad_max")->value;
      r.findings.push_back(
          {{},
           fmt::format("{}pad-max computes {:.0f}% padding; {} cuts it to {:.1f}% and runs {:.2f}x the real "
                       "tokens/s (predicted {:.2f}x from computed tokens, {:.2f}x from FLOPs: padded attention is "
                       "quadratic)",
                       which.empty() ? "" : which + ": ", base->metric("padding_pct")->value,
                       b->params.value("strategy", ""), b->metric("padding_pct")->value, sp,
                       b->metric("predicted_speedup")->value, b->metric("predicted_flops_speedup")->value),
           sp,
           json{{"strategy", b->params.value("strategy", "")},
                {"pad_max_padding_pct", base->metric("padding_pct")->value},
                {"padding_pct", b->metric("padding_pct")->value},
                {"efficiency_pct", b->metric("efficiency_pct")->value}}});
    }
  }

 private:
  static bool is_packed(pk::Strategy s) {
    return s == pk::Strategy::pack_ffd || s == pk::Strategy::pack_bfd || s == pk::Strategy::pack_hist;
  }

  // Forward+backward FLOPs of each batch of the epoch, as BatchWork counts one (prepare's shapes,
  // by the same formulas): the GEMMs over every computed token, and attention per sequence: per
  // segment, and the row's unused tail as one more, when packed; every row at its computed length
  // (its batch's) when dense. pack-hist's rows are summed by the group (identical rows), never made
  // one by one.
  struct Cost {
    double gemm = 0, attn = 0;
  };
  static std::vector<Cost> batch_flops(const pk::Plan& plan, std::int64_t rows_per_batch, std::int64_t d, std::int64_t f,
                                       std::int64_t q, std::int64_t heads, bool packed) {
    double gemm = 0;  // per computed token
    for (const GemmShape& g : layer_gemms(1, d, f, q)) gemm += kGemmFwdBwdFactor * g.flops();
    AttnShape one = layer_attention(d, heads);  // one sequence of a given length
    const auto attn = [&one](double len) {
      one.seq = std::int64_t(len);
      return attention_flops(one, true);
    };
    const std::int64_t rows = plan.row_count();
    std::vector<Cost> out(std::size_t((rows + rows_per_batch - 1) / rows_per_batch));
    // `count` rows from row `r`, each costing `cost`, added to the batches they fall in.
    const auto add = [&](std::int64_t r, std::int64_t count, Cost cost) {
      while (count > 0) {
        const std::int64_t b = r / rows_per_batch, here = std::min(count, (b + 1) * rows_per_batch - r);
        out[std::size_t(b)].gemm += double(here) * cost.gemm;
        out[std::size_t(b)].attn += double(here) * cost.attn;
        r += here;
        count -= here;
      }
    };
    if (packed && plan.packed) {
      std::int64_t r = 0;
      for (const pk::PackGroup& g : plan.packed->groups) {
        double a = attn(double(plan.max_len - g.used));
        for (const pk::LengthCount& c : g.pattern) a += double(c.count) * attn(double(c.length));
        add(r, g.rows, Cost{gemm * double(plan.max_len), a});
        r += g.rows;
      }
    } else {
      for (std::int64_t r = 0; r < rows; ++r) {
        const double len = double(plan.computed(r));
        double a = attn(len);
        if (packed) {
          const pk::Row& row = plan.rows[std::size_t(r)];
          a = attn(len - double(row.used));
          for (const pk::Segment& seg : row.segments) a += attn(double(seg.length));
        }
        add(r, 1, Cost{gemm * len, a});
      }
    }
    return out;
  }

  // Rows [r0, r1) of the plan as one batch of device work.
  BatchWork prepare(Device& dev, const pk::Plan& plan, std::int64_t r0, std::int64_t r1, std::int64_t d,
                    std::int64_t f, std::int64_t q, std::int64_t heads, DType dt, AttnImpl impl) {
    BatchWork w;
    AttnShape a = layer_attention(d, heads);
    std::vector<pk::Row> rows;  // copies; pack-hist makes them here, on demand
    for (std::int64_t r = r0; r < r1; ++r) {
      rows.push_back(plan.row(r));
      w.real += rows.back().used;
      w.computed += plan.computed(r);
    }
    if (is_packed(plan.strategy)) {
      // Varlen: every row's segments, plus its unused tail as one more segment
      // (computed like padding, attending only to itself).
      a.cu_seqlens.push_back(0);
      std::int32_t base = 0;
      for (std::int64_t r = r0; r < r1; ++r) {
        const auto cu = pk::cu_seqlens(rows[std::size_t(r - r0)]);
        for (std::size_t i = 1; i < cu.size(); ++i) a.cu_seqlens.push_back(base + cu[i]);
        const std::int32_t len = plan.computed(r);
        if (a.cu_seqlens.back() < base + len) a.cu_seqlens.push_back(base + len);
        base += len;
      }
      a.batch = 1;
      a.seq = a.cu_seqlens.back();
    } else {
      // Dense rows of the batch's computed length (pad-max: max_len; pad-longest
      // and bucket: the batch's longest; concat: max_len, no boundaries).
      a.batch = r1 - r0;
      a.seq = plan.computed(r0);
    }
    const std::int64_t m = w.computed;
    for (const GemmShape& g : layer_gemms(m, d, f, q)) w.gemms.push_back(dev.make_gemm(g, dt, 5));
    w.attn = dev.make_attention(a, impl, dt, 6);
    return w;
  }

  // A histogram file's counts, read once per text, each length clipped to
  // 4 * max_len as generate_lengths clips the other strategies' lengths (so
  // every strategy of a sweep plans the same tokens); nullopt for lengths
  // that are not a histogram file.
  std::optional<std::vector<pk::LengthCount>> file_histogram(const std::string& text, std::int32_t max_len) {
    if (!histogram_key_ || *histogram_key_ != text) {
      histogram_.reset();
      if (!text.empty() && text.front() == '@')
        if (pk::LengthSpec spec = pk::parse_lengths(text); spec.kind == pk::LengthSpec::Kind::file_histogram)
          histogram_ = std::move(spec.histogram);
      histogram_key_ = text;
    }
    if (!histogram_) return std::nullopt;
    std::vector<pk::LengthCount> h = *histogram_;
    hist_clipped_ = 0;
    for (auto& e : h)
      if (e.length > 4 * max_len) e.length = 4 * max_len, hist_clipped_ += e.count;
    return h;
  }

  RunContext& ctx_;
  std::optional<std::string> histogram_key_;
  std::optional<std::vector<pk::LengthCount>> histogram_;
  std::int64_t hist_clipped_ = 0;  // of the last file_histogram: sequences over 4 x max_len
  pk::DatasetLengths dataset_{"packing", sizeof(std::int32_t)};  // the strategies of a sweep batch one dataset
};

}  // namespace

// Combinations that would measure nothing are refused before any point runs
// (exit 2), rather than run as all-zero "ok" points with NaN ratios.
void validate_packing_point(const ParamSet& ps, const RunContext&) {
  const Settings st = Settings::from(ps);
  if (st.d_model % st.heads != 0)
    throw UsageError(fmt::format("d_model {} is not a multiple of heads {}", st.d_model, st.heads));
  if (st.kv_heads > st.heads || (st.kv_heads > 0 && st.heads % st.kv_heads != 0))
    throw UsageError(fmt::format("kv_heads={} does not divide heads={}: each K/V head serves a whole group of query "
                                 "heads (0: one per head)",
                                 st.kv_heads, st.heads));
  if (!st.lengths_from_file() && st.sequences == 0)
    throw UsageError(fmt::format("sequences=0 means every length of a file; lengths={} generates lengths, so give "
                                 "sequences >= 1",
                                 st.lengths));
  if (!st.lengths_from_file() && st.overflow == pk::Overflow::drop) {
    const pk::LengthSpec spec = pk::parse_lengths(st.lengths);  // no file: cheap
    // fixed:N and uniform:LO,HI give no length under LO (lognormal can: its tail is both ways)
    if ((spec.kind == pk::LengthSpec::Kind::fixed || spec.kind == pk::LengthSpec::Kind::uniform) &&
        spec.lo > st.max_len)
      throw UsageError(fmt::format("lengths={} with max_len={} and overflow=drop drops every sequence: nothing would "
                                   "be measured (use overflow=split, or a larger max_len)",
                                   st.lengths, st.max_len));
  }
  // A packed batch's cu_seqlens are int32 offsets (as flash-attention and cuDNN take them): rows x max_len
  // tokens must fit, or the offsets overflow before any allocation could refuse the batch.
  if (std::int64_t(st.rows_per_batch) * std::int64_t(st.max_len) > std::int64_t(std::numeric_limits<std::int32_t>::max()))
    throw UsageError(fmt::format("rows={} x max_len={} is {} tokens a batch: over the 2^31 - 1 a varlen batch's int32 "
                                 "cu_seqlens can index (make rows or max_len smaller)",
                                 st.rows_per_batch, st.max_len, std::int64_t(st.rows_per_batch) * std::int64_t(st.max_len)));
}

extern const Scenario packing_scenario;
const Scenario packing_scenario{
    "packing",
    "batches padded instead of packed",
    "padding fraction, packing efficiency and real tokens/s of pad-max, pad-longest, bucketing, FFD/BFD packing "
    "(pack-hist: BFD over a length histogram)",
    {
        ParamSpec{.name = "strategy", .type = ParamType::choice,
                  .default_value = "pad-max,pad-longest,bucket,pack-ffd,pack-bfd,concat",
                  .help = "how lengths become max_len rows (a histogram file: pack-hist for pack-ffd and pack-bfd)",
                  .choices = packing::kStrategyNames.names(),
                  // A histogram file's counts are planned as counts by pack-hist (the 16M-sequence
                  // Wikipedia histogram in 0.2-2 ms); pack-ffd and pack-bfd expand them (2.3 s).
                  .default_from = [](const auto& given) -> std::optional<std::string> {
                    const auto lengths = given("lengths");
                    if (!lengths) return std::nullopt;
                    for (const std::string_view part : text::split(*lengths, ';'))  // a sweep of lengths: all histograms
                      if (part.empty() || part.front() != '@' ||
                          packing::parse_lengths(std::string(part)).kind != packing::LengthSpec::Kind::file_histogram)
                        return std::nullopt;
                    return "pad-max,pad-longest,bucket,pack-hist,concat";
                  }},
        ParamSpec{.name = "lengths", .type = ParamType::text, .default_value = "lognormal:256,1.0",
                  .help = "fixed:N | uniform:LO,HI | lognormal:MEAN,SIGMA | @FILE (lengths, or CSV length,count)",
                  .check = [](const std::string& t) { (void)packing::parse_lengths(t); }},
        ParamSpec{.name = "max_len", .type = ParamType::integer, .default_value = "2048",
                  .help = "sequence length of a row (the trainer's sequence_len)", .unit = "tokens", .min = 8,
                  .max = 1 << 20, .quick_default = "512"},
        ParamSpec{.name = "sequences", .type = ParamType::integer, .default_value = "4096",
                  .help = "examples in the epoch (for @FILE: 0 = all)", .unit = "sequences", .min = 0,
                  .max = 1ll << 32, .quick_default = "512"},
        ParamSpec{.name = "rows", .type = ParamType::integer, .default_value = "4", .help = "rows per batch",
                  .unit = "rows", .min = 1, .max = 4096},
        ParamSpec{.name = "window", .type = ParamType::integer, .default_value = "8",
                  .help = "bucket: sort within this many batches", .unit = "batches", .min = 1, .max = 1 << 20},
        ParamSpec{.name = "pad_multiple", .type = ParamType::integer, .default_value = "1",
                  .help = "pad-longest and bucket: each batch's length rounded up to this, at most max_len (the "
                          "collator's pad_to_multiple_of; Axolotl's trainer sets 64, the train scenario's default)",
                  .unit = "tokens", .min = 1, .max = 1 << 20},
        ParamSpec{.name = "overflow", .type = ParamType::choice, .default_value = "split",
                  .help = "sequences longer than max_len are split or dropped", .choices = packing::kOverflowNames.names()},
        ParamSpec{.name = "d_model", .type = ParamType::integer, .default_value = "128",
                  .help = "the layer's hidden size", .unit = "elements", .min = 16, .max = 65536,
                  .gpu_default = "2048"},
        ParamSpec{.name = "d_ff", .type = ParamType::integer, .default_value = "0",
                  .help = "the layer's MLP width (up's outputs, down's inputs); 0: 4 x d_model. A gated (SwiGLU) "
                          "MLP of intermediate size I has the FLOPs of this one at d_ff = 1.5 I",
                  .unit = "elements", .min = 0, .max = 262144},
        ParamSpec{.name = "heads", .type = ParamType::integer, .default_value = "2", .help = "attention heads",
                  .unit = "heads", .min = 1, .max = 1024, .gpu_default = "16"},
        ParamSpec{.name = "kv_heads", .type = ParamType::integer, .default_value = "0",
                  .help = "K/V heads (grouped-query attention), a divisor of heads; 0: heads. QKV projects K and V "
                          "to kv_heads x head_dim; the attention runs at every query head",
                  .unit = "heads", .min = 0, .max = 1024},
        ParamSpec{.name = "dtype", .type = ParamType::choice, .default_value = "fp32", .help = "element type",
                  .choices = kDTypeNames.names({DType::fp32, DType::bf16, DType::fp16}), .gpu_default = "bf16"},
        ParamSpec{.name = "attn", .type = ParamType::choice, .default_value = "flash",
                  .help = "attention implementation", .choices = kAttnImplNames.names(),
                  .gpu_default = "cudnn"},
        ParamSpec{.name = "batches", .type = ParamType::integer, .default_value = "4",
                  .help = "batches timed, spread evenly over the epoch", .unit = "batches", .min = 1,
                  .max = 100000, .quick_default = "2"},
        trials_param("3"),
    },
    [](RunContext& ctx) -> std::unique_ptr<ScenarioRun> { return std::make_unique<PackingRun>(ctx); },
    false,
    &validate_packing_point,
};

}  // namespace sb
