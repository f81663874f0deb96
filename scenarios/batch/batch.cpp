// batch: a micro batch too small — launch-bound steps, steady-low
// utilization. A decoder stack's training step (decoder.hpp) over
// micro_batch x seq tokens, grad_accum micro steps per optimizer step, with
// the framework's per-op dispatch cost modelled on the host.
//
// Definitions (per point, over `trials` timed optimizer steps):
//   wall W: host clock over the timed steps;
//   host submit H: host time inside submissions (the modelled dispatch plus
//     the enqueue itself); sync wait S: host time in synchronize; other O:
//     host time between them (bookkeeping). They tile W by construction (one
//     loop, three clocks), so they say where the host's time went, not more.
//   device busy B: the device's busy time over W (cpu: the compute thread's;
//     cuda: NVML's busy share; sim: the stream's); gaps = W - B. Where the
//     device also reports its stream's waiting time (cpu), the gaps split
//     into waiting for submissions and the stream's own per-submission cost
//     (device_wait_pct, stream_cost_pct), from two independent counters.
//   launches: submissions per micro step (ops, attention calls, graph replays).
//   launch-bound (HTA's short-kernel rule): the device time per launch
//     (B / launches) is below the host time per launch (H / launches), and
//     the device is idle more than half the time.
#include <algorithm>  // std::max
#include <chrono>     // std::chrono
#include <cmath>      // std::isfinite
#include <map>        // std::map
#include <optional>   // std::optional
#include <set>        // std::set
#include <span>       // std::span
#include <thread>     // std::this_thread
#include <tuple>      // std::tuple
#include <vector>     // std::vector

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"          // UsageError, UnsupportedError
#include "harness/host_cpus.hpp"       // HostCpuForHost
#include "harness/measure.hpp"         // measure
#include "harness/point_metrics.hpp"   // varying_params, params_label
#include "harness/printer.hpp"         // format_number
#include "harness/random.hpp"          // uniform_pm1
#include "harness/sampler.hpp"         // Sampler, classify, sparkline
#include "harness/stats.hpp"           // summarize
#include "harness/scenario.hpp"        // Scenario, ScenarioRun
#include "harness/train_ops.hpp"       // TrainOps
#include "workloads/decoder.hpp"  // DecoderStep
#include "workloads/batch_limit.hpp"    // batch_limit

namespace sb {
namespace {

using json = nlohmann::ordered_json;
using namespace batch;
using clk = std::chrono::steady_clock;

inline constexpr NameTable<OptKind, 3> kOptKindNames{{{{OptKind::adamw, "adamw"}, {OptKind::sgd, "sgd"}, {OptKind::none, "none"}}}};

double secs(clk::duration d) { return std::chrono::duration<double>(d).count(); }


class BatchRun : public ScenarioRun {
 public:
  explicit BatchRun(RunContext& ctx) : ctx_(ctx) {}

  Point run_point(const ParamSet& ps) override {
    Device& dev = ctx_.device;
    const DecoderConfig cfg = decoder_config(ps, dev);
    // global_batch holds the sequences per optimizer step across the sweep: micro batch 1 x 8 accumulated
    // against 8 x 1, as a user changing micro_batch_size keeps their effective batch (above it: accum 1)
    const std::int64_t global = ps.get_int("global_batch");
    const int accum = global > 0 ? int(std::max<std::int64_t>(1, global / ps.get_int("micro_batch")))
                                 : int(ps.get_int("grad_accum"));
    const bool graphs = ps.get_str("graphs") == "on";
    const OptKind opt = ps.get_choice("optimizer", kOptKindNames);
    const double dispatch_us = ps.get_real("dispatch_us");
    const int trials = int(ps.get_int("trials"));
    const bool with_bare = ps.get_str("bare") == "on";

    const HostCpuForHost host_cpu(dev);  // the host thread keeps a CPU of its own

    auto ops = dev.make_train_ops();
    clk::duration submit{0};
    bool timing = false;
    std::int64_t timed_subs = 0;  // every submission in the timed steps: micro steps, zero_grad, optimizer
    DecoderStep step(dev, *ops, cfg, 7, [&] {
      spin_for(dispatch_us);
      if (timing) ++timed_subs;
    });
    step.set_graphs(graphs);
    auto window = [&](EventPtr* zero1, EventPtr* opt0, EventPtr* opt1) {
      const auto t0 = clk::now();
      train_window(
          step, accum, opt, 1e-4f, [&] {
            if (opt0) *opt0 = dev.record();
          },
          [&] {
            if (opt1) *opt1 = dev.record();
          },
          [&] {
            if (zero1) *zero1 = dev.record();
          });
      if (timing) submit += clk::now() - t0;
    };
    const std::string where = fmt::format("batch micro_batch={} grad_accum={} graphs={}", cfg.micro_batch, accum,
                                          graphs ? "on" : "off");
    // warm-up: one window (captures the graphs, makes the AdamW moments)
    ctx_.progress(where + ": warm-up");
    window(nullptr, nullptr, nullptr);
    dev.synchronize(ctx_.measure.sync_timeout);

    ctx_.progress(where + ": timing");
    auto busy = dev.utilization_probe();
    Sampler sampler(dev.utilization_probe());
    clk::duration sync{0}, other{0};
    std::vector<double> opt_ms, micro_ms;
    timing = true;
    sampler.start();
    if (busy) (void)busy->sample();  // starts its interval
    const auto w0 = clk::now();
    for (int t = 0; t < trials; ++t) {
      const std::string step_name = fmt::format("ProfilerStep#{}", t);  // as torch.profiler names a step
      dev.range_push(step_name.c_str());
      EventPtr z1, o0, o1;
      window(&z1, &o0, &o1);
      const auto s0 = clk::now();
      dev.synchronize(ctx_.measure.sync_timeout);  // a training loop's loss.item() at each step
      dev.range_pop();
      const auto s1 = clk::now();
      sync += s1 - s0;
      opt_ms.push_back(dev.elapsed_ms(o0, o1));
      micro_ms.push_back(dev.elapsed_ms(z1, o0) / accum);
      other += clk::now() - s1;
    }
    const auto w1 = clk::now();
    const UtilSample window_sample = busy ? busy->sample() : UtilSample{};
    const double busy_frac = window_sample.util;
    sampler.stop();
    timing = false;

    // The optimizer's device time alone: measure()'s hidden timing (its launches queued behind a held stream,
    // the bare GEMMs' mechanism below), one optimizer step a trial (8+ launches each: a GPU's queue of
    // pending launches bounds a held trial), three trials, the median. In a host-bound step the span between
    // its events in the loop is mostly the host's dispatch gaps, and how much of them showed depended on
    // whether the device was still busy with the micro steps when the host reached the optimizer: grad_accum
    // 8 read a larger optimizer share than 1 at micro batch 2 and 4 (1.7% -> 2.0%). The loop's span is kept.
    std::optional<double> opt_alone_ms;
    {
      MeasureConfig mc = ctx_.measure;
      mc.mode = TimingMode::hidden;
      mc.warmup = 0;
      mc.min_trial_ms = 0;  // one step a trial
      mc.min_trials = mc.max_trials = 3;
      try {
        opt_alone_ms = measure(dev, [&] { step.optimizer(opt, 1e-4f, step.optimizer_calls() + 1); }, mc).ms.median;
      } catch (const UnsupportedError&) {  // a device that cannot hold its stream: the loop's span, said so below
      }
    }
    const double W = secs(w1 - w0), H = secs(submit), S = secs(sync), O = secs(other);
    const double micro_steps = double(trials) * accum;
    const double launches = double(step.last_submissions());
    const double tokens = double(step.tokens()) * micro_steps;
    const double B = busy_frac * W;
    std::vector<double> util;
    for (const auto& s : sampler.series()) util.push_back(s.s.util);
    double opt_total = 0;
    for (double x : opt_ms) opt_total += x;
    const double opt_span_ms = opt_total / double(trials);
    const bool opt_alone = opt_alone_ms.has_value();
    if (opt_alone) opt_total = *opt_alone_ms * double(trials);
    const double all_subs = double(std::max<std::int64_t>(1, timed_subs));
    const double host_per_launch_us = 1e6 * H / all_subs;
    const double dev_per_launch_us = 1e6 * B / all_subs;
    const bool launch_bound = dev_per_launch_us < host_per_launch_us && busy_frac < 0.5;

    // diagnose's sweeps pass bare=off: it reads neither figure, and on a 2-core AMD EPYC (AVX2, fp32,
    // naive attention) the bare calls took 3 s of micro batch 8's 5.4 s point, 17 s of its 39 s check
    const BareGemms bare = with_bare ? time_bare_gemms(dev, *ops, step) : BareGemms{};

    Point p;
    p.add({"tokens_per_s", tokens / W, "tokens/s", Direction::higher, std::nullopt,
           "micro_batch x seq_len x grad_accum tokens per optimizer step, over the timed steps"});
    p.add({"step_ms", 1e3 * W / trials, "ms", Direction::lower, std::nullopt, "wall time per optimizer step"});
    p.add({"busy_pct", 100.0 * busy_frac, "%", Direction::higher, std::nullopt,
           "device busy time over the wall time of the timed steps"});
    p.add({"launches", launches, "per micro step", Direction::lower, std::nullopt,
           "submissions per micro step: ops, attention calls, graph replays"});
    p.add({"host_us_per_launch", host_per_launch_us, "us", Direction::lower, std::nullopt,
           "host time per submission (every one in the timed steps: micro steps, zero_grad, optimizer): the "
           "modelled dispatch plus the enqueue"});
    // No direction: it says whether the host keeps up (against host_us_per_launch), not how good the
    // device is; a faster device has less of it at the same shapes.
    p.add({"device_us_per_launch", dev_per_launch_us, "us", Direction::none, std::nullopt,
           "device busy time per submission (the same count); launch-bound when under host_us_per_launch"});
    p.add({"micro_step_ms", summarize(micro_ms).mean, "ms", Direction::lower, std::nullopt,
           "the device's span of the micro steps (from after zero_grad to before the optimizer, events), per "
           "micro step: launch gaps included, the once-per-step work excluded"});
    p.add({"optimizer_pct", W > 0 ? 100.0 * opt_total / 1e3 / W : 0, "%", Direction::lower, std::nullopt,
           opt_alone ? "device time of the optimizer (timed alone, its launches queued behind a held stream) x the "
                       "steps, over the wall time"
                     : "the optimizer's span between events in the loop (launch gaps included: this device cannot "
                       "hold its stream), over the wall time"});
    p.add({"gemm_tflops", step.gemm_flops() * micro_steps / W / 1e12, "TFLOP/s", Direction::higher, std::nullopt,
           "the step's GEMM FLOPs (3 x 2 x tokens x parameters) over the wall time"});
    if (ctx_.expected)
      if (auto peak = ctx_.expected->peak_tflops(cfg.dtype))
        p.add({"gemm_pct_of_peak", 100.0 * step.gemm_flops() * micro_steps / W / 1e12 / peak->first, "%",
               Direction::higher, std::nullopt, fmt::format("of {} TFLOP/s, {}", format_number(peak->first), peak->second)});
    if (bare.tflops > 0) {
      p.add({"gemm_bare_tflops", bare.tflops, "TFLOP/s", Direction::higher, std::nullopt,
             "the step's own GEMM calls (forward and backward: their transposes, dtypes and beta) timed back "
             "to back through its training ops, device time only, in this run"});
      p.add({"gemm_pct_of_bare", 100.0 * step.gemm_flops() * micro_steps / W / 1e12 / bare.tflops, "%",
             Direction::higher, std::nullopt,
             "gemm_tflops over gemm_bare_tflops: the share of its own GEMMs' rate the step reaches"});
    }
    if (window_sample.waiting) {
      // The device timeline from two independent counters of the stream:
      // busy (inside ops) and waiting (blocked on an empty queue). What they
      // leave is the stream's own cost per submission (dequeue, wake-up).
      p.add({"device_wait_pct", 100.0 * *window_sample.waiting, "%", Direction::lower, std::nullopt,
             "the device's stream waiting for submissions, over the wall time"});
      p.add({"stream_cost_pct", 100.0 * (1.0 - busy_frac - *window_sample.waiting), "%", Direction::lower,
             std::nullopt,
             "wall time the device's stream was neither inside an op nor waiting for one: its own per-submission "
             "cost (dequeue, wake-up), the device side of a launch"});
    }
    p.info = pattern_info(util, busy_frac);
    p.info.update(json{{"sparkline", sparkline(util)},
                  {"util_source", sampler.source()},
                  {"launch_bound", launch_bound},
                  {"submissions", timed_subs},
                  {"timeline_ms_per_step",
                   json{{"wall", 1e3 * W / trials},
                        {"device_busy", 1e3 * B / trials},
                        {"device_gaps", 1e3 * (W - B) / trials},
                        {"host_submit", 1e3 * H / trials},
                        {"host_sync_wait", 1e3 * S / trials},
                        {"host_other", 1e3 * O / trials}}},
                  {"optimizer_ms", json{{"device_alone", opt_alone ? json(*opt_alone_ms) : json()},
                                        {"span_in_loop", opt_span_ms}}},
                  {"dispatch_us", dispatch_us},
                  {"dispatch_note", "a modelled framework cost per submission (PyTorch eager: 5-20 us per op, "
                                    "docs/REFERENCE.md), spent as host CPU work: an assumption, not a measurement"},
                  {"graph_nodes", step.graph_nodes()},
                  {"graphs_note", graphs ? (dev.info().kind == DeviceKind::cuda
                                                ? "CUDA graphs: each run of ops between attention calls captured once "
                                                  "and replayed; attention launches eagerly"
                                                : "cpu: each run of ops between attention calls gathered into one "
                                                  "stream submission (what a graph saves: per-op submission)")
                                         : "eager"},
                  {"attention", std::string(to_string(cfg.attention))},
                  {"parameters", step.parameters()},
                  {"tokens_per_micro_step", step.tokens()},
                  {"trials", trials},
                  {"impl", ops->impl()}});
    host_cpu.record(p);
    if (!bare.note.empty()) p.info["gemm_bare"] = bare.note;
    if (!with_bare) p.info["gemm_bare"] = json{{"skipped", "bare=off"}};
    if (global > 0) {
      p.params["grad_accum"] = accum;  // the point's own: what ran
      p.info["global_batch_run"] = cfg.micro_batch * accum;
    }
    if (launch_bound)
      p.info["lines"] = json::array({fmt::format("launch-bound: {:.1f} us of device work per launch, {:.1f} us of "
                                                 "host time per launch",
                                                 dev_per_launch_us, host_per_launch_us)});
    return p;
  }

  void analyze(Result& res) override {
    // per (grad_accum, graphs) series over micro_batch
    struct Pt {
      std::int64_t mb;
      double tps, busy;
      std::string pattern;
      std::int64_t ga = 1;  // the point's grad_accum (under global_batch, the point's own)
      const Point* p = nullptr;
    };
    // (grad_accum, or the global batch held, graphs, and every other swept axis but micro_batch: attn=naive
    // and fused are two series)
    std::map<std::tuple<std::string, std::string, std::string>, std::vector<Pt>> series;
    const std::set<std::string> other_axes =
        varying_params(res, {"micro_batch", "grad_accum", "global_batch", "graphs", "trials"});
    auto others = [&](const Point& p) { return params_label(p, other_axes); };
    for (const Point& p : res.points) {
      if (p.status != Status::ok || !p.metric("tokens_per_s")) continue;
      const std::int64_t gb = p.params.value("global_batch", std::int64_t(0));
      const std::string accum = gb > 0 ? fmt::format("global_batch={}", gb)
                                       : fmt::format("grad_accum={}", p.params.value("grad_accum", 1));
      series[{accum, p.params.value("graphs", std::string("off")), others(p)}].push_back(
          {p.params.value("micro_batch", std::int64_t(0)), p.metric("tokens_per_s")->value, p.metric("busy_pct")->value,
           pattern_text(p), p.params.value("grad_accum", std::int64_t(1)), &p});
    }
    for (auto& [key, v] : series) {
      std::sort(v.begin(), v.end(), [](const Pt& a, const Pt& b) { return a.mb < b.mb; });
      double best = 0;
      std::int64_t best_mb = 0;
      for (const Pt& x : v)
        if (x.tps > best) best = x.tps, best_mb = x.mb;
      const Pt* knee = nullptr;
      for (const Pt& x : v)
        if (x.tps >= 0.9 * best) {
          knee = &x;
          break;
        }
      if (!knee || v.size() < 2) continue;
      const Pt& small = v.front();
      if (knee->mb == small.mb) continue;  // the smallest is already within 90% of the best: nothing to change
      // A smallest micro batch that keeps the device fed (neither launch-bound nor steady-low) gains only the
      // device's own efficiency per token: the finding says so, with the figures (diagnose's batch check
      // reads the same), beside a cause that names launch-bound (a 2-vCPU EPYC at 256 tokens read 100% busy,
      // healthy, 1314 us of device work per submission against 13 us of host time).
      const BatchLimit lim = batch_limit(*small.p, *knee->p, small.p->params.value("seq_len", std::int64_t(1)));
      res.findings.push_back(
          {{},
           fmt::format("{} graphs={}{}: micro_batch {} gives {} tokens/s ({:.0f}% busy, {}); the smallest "
                       "micro batch within 90% of the best ({} tokens/s at {}) is {} -> micro_batch_size: {}",
                       std::get<0>(key), std::get<1>(key), std::get<2>(key).empty() ? "" : " " + std::get<2>(key),
                       small.mb, format_number(small.tps), small.busy, small.pattern,
                       format_number(best), best_mb, knee->mb,
                       // the global batch held: the accumulation that keeps it goes with the line
                       std::get<0>(key).starts_with("global_batch=")
                           ? fmt::format("{}, gradient_accumulation_steps: {}", knee->mb, knee->ga)
                           : fmt::format("{}", knee->mb)) +
               (lim.kind == "device-efficiency" ? "; " + lim.reading : std::string()),
           small.tps > 0 ? std::optional<double>(knee->tps / small.tps) : std::nullopt,
           json{{"accumulation", std::get<0>(key)}, {"graphs", std::get<1>(key)}, {"smallest_within_90pct", knee->mb},
                {"best_micro_batch", best_mb}, {"best_tokens_per_s", best}, {"micro_batch_1_pattern", small.pattern}}});
    }
    // grad_accum at a fixed micro batch: what it buys (the optimizer, amortized) and what it does not
    std::map<std::pair<std::int64_t, std::string>, std::map<int, const Point*>> by_mb;
    for (const Point& p : res.points)
      if (p.status == Status::ok && p.metric("tokens_per_s"))
        if (p.params.value("global_batch", std::int64_t(0)) == 0)
          by_mb[{p.params.value("micro_batch", std::int64_t(0)), p.params.value("graphs", std::string("off"))}]
             [p.params.value("grad_accum", 1)] = &p;
    for (const auto& [key, m] : by_mb) {
      if (m.size() < 2 || key.first != by_mb.begin()->first.first) continue;  // the smallest micro batch: one line
      const Point* a = m.begin()->second;
      const Point* b = m.rbegin()->second;
      const double gain = b->metric("tokens_per_s")->value / a->metric("tokens_per_s")->value;
      const int acc_a = m.begin()->first, acc_b = m.rbegin()->first;
      if (!a->metric("micro_step_ms") || !b->metric("micro_step_ms")) continue;
      const double ma = a->metric("micro_step_ms")->value, mb = b->metric("micro_step_ms")->value;
      res.findings.push_back(
          {{},
           fmt::format("micro_batch {} (graphs={}): grad_accum {} -> {} gives {:.2f}x tokens/s. What it amortizes "
                       "is the once-per-step work: the optimizer goes from {:.1f}% to {:.1f}% of the time; the "
                       "device's span per micro step goes {:.3f} -> {:.3f} ms{}; device idle {:.0f}% -> {:.0f}% "
                       "(launch gaps and the wait at each step's synchronization, loss.item()). Raise "
                       "micro_batch_size first; use gradient_accumulation_steps for the effective batch when "
                       "memory is short",
                       key.first, key.second, acc_a, acc_b, gain, a->metric("optimizer_pct")->value,
                       b->metric("optimizer_pct")->value, ma, mb,
                       std::abs(mb - ma) > 0.1 * ma ? " (the work per micro step is the same, so this is not "
                                                      "explained here)"
                                                    : " (unchanged: the work per micro step is the same)",
                       100 - a->metric("busy_pct")->value, 100 - b->metric("busy_pct")->value),
           gain,
           json{{"micro_batch", key.first},
                {"graphs", key.second},
                {"micro_step_ms", json{{std::to_string(acc_a), ma}, {std::to_string(acc_b), mb}}}}});
    }
    // graphs at the smallest micro batch
    std::map<std::pair<std::int64_t, int>, std::map<std::string, const Point*>> by_graph;
    for (const Point& p : res.points)
      if (p.status == Status::ok && p.metric("tokens_per_s"))
        by_graph[{p.params.value("micro_batch", std::int64_t(0)), p.params.value("grad_accum", 1)}]
                [p.params.value("graphs", std::string("off"))] = &p;
    if (!by_graph.empty()) {
      const auto& [key, m] = *by_graph.begin();
      if (m.count("off") && m.count("on")) {
        const double gain = m.at("on")->metric("tokens_per_s")->value / m.at("off")->metric("tokens_per_s")->value;
        res.findings.push_back(
            {{},
             fmt::format("micro_batch {} grad_accum {}: graphs on gives {:.2f}x tokens/s ({} -> {} launches per micro "
                         "step){}",
                         key.first, key.second, gain, format_number(m.at("off")->metric("launches")->value),
                         format_number(m.at("on")->metric("launches")->value),
                         res.meta.value("/device/kind"_json_pointer, std::string()) == "cuda"
                             ? " (torch.compile(mode=\"reduce-overhead\") or torch.cuda.graphs)"
                             : ""),
             gain, json{{"micro_batch", key.first}, {"grad_accum", key.second}}});
        const Point* off = m.at("off");
        if (off->metric("device_us_per_launch") && off->metric("host_us_per_launch") &&
            off->metric("device_us_per_launch")->value >= off->metric("host_us_per_launch")->value)
          res.findings.back().summary += fmt::format(
              "; eager was not launch-bound ({:.1f} us of device work vs {:.1f} us of host time per launch): graphs "
              "save host time the device was not waiting on",
              off->metric("device_us_per_launch")->value, off->metric("host_us_per_launch")->value);
      }
    }
  }

 private:
  struct BareGemms {
    double tflops = 0;
    json note;
  };
  // The step's own GEMM calls (workloads/decoder.cpp's step_gemms: the forward's four, the
  // backward's eight, with their transposes, C's dtype and beta: weight gradients accumulated in fp32),
  // each timed back to back through the same training ops with the stream held (timing=hidden: device
  // time, no launch gaps). What the step's GEMMs do with nothing else in the way: the step's GEMM rate
  // over it says how much of that the training step keeps. (It was the precision scenario's GEMM op on
  // the forward shapes until 2026-12-02: on cpu that op's weights are prepacked once into oneDNN's
  // blocked layout, 0.72 ms against the step's 1.64 ms for one bf16 2048x1024x256, so the step was
  // measured against a rate its plain-layout GEMMs cannot reach.)
  BareGemms time_bare_gemms(Device& dev, TrainOps& ops, const DecoderStep& step) {
    BareGemms out;
    const DecoderConfig& cfg = step.config();
    ctx_.progress("batch: the step's GEMM calls back to back");
    MeasureConfig mc = ctx_.measure;
    mc.mode = TimingMode::hidden;
    mc.min_trials = 10;  // 3 trials of a 10 us GEMM all fell in one preemption once: the step read 142% of it
    mc.budget_s = std::min(mc.budget_s, 0.05);
    double seconds = 0, flops = 0;
    json each = json::array();
    try {
      for (const GemmCall& g : step_gemms(cfg)) {
        const DType ct = g.accumulate ? DType::fp32 : cfg.dtype;
        DTensor a = ops.alloc(g.m * g.k, cfg.dtype, "bare GEMM A"), b = ops.alloc(g.k * g.n, cfg.dtype, "bare GEMM B"),
                c = ops.alloc(g.m * g.n, ct, "bare GEMM C");
        std::vector<float> h(std::size_t(std::max(g.m * g.k, g.k * g.n)));  // values, not zeros: a GPU's clock
        for (std::size_t i = 0; i < h.size(); ++i) h[i] = uniform_pm1(0xba7e, i);  // depends on them
        ops.upload(a, std::span<const float>(h.data(), std::size_t(g.m * g.k)));
        ops.upload(b, std::span<const float>(h.data(), std::size_t(g.k * g.n)));
        dev.synchronize(ctx_.measure.sync_timeout);  // the uploads read h: done before it can go
        const float beta = g.accumulate ? 1.0f : 0.0f;
        auto call = [&] { ops.gemm(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a, b, beta, c); };
        Measurement m;
        try {
          m = measure(dev, call, mc);
        } catch (const UnsupportedError&) {  // a device that cannot hold its stream: back to back from the host
          mc.mode = TimingMode::warm;
          m = measure(dev, call, mc);
        }
        seconds += m.ms.median / 1e3;
        flops += 2.0 * double(g.m) * double(g.n) * double(g.k);
        each.push_back(json{{"ta", g.ta}, {"tb", g.tb}, {"m", g.m}, {"n", g.n}, {"k", g.k},
                            {"c", std::string(to_string(ct))}, {"beta", beta}, {"ms", m.ms.median}});
      }
    } catch (const OutOfMemory& e) {  // the step fits, its operands again beside it may not
      out.note = json{{"skipped", e.what()}};
      return out;
    }
    out.tflops = seconds > 0 ? flops / seconds / 1e12 : 0;
    out.note = json{{"timing", std::string(to_string(mc.mode))}, {"impl", ops.gemm_impl(cfg.dtype)}, {"calls", each}};
    return out;
  }

  RunContext& ctx_;
};

}  // namespace

extern const Scenario batch_scenario;
const Scenario batch_scenario{
    "batch",
    "a batch that is too small (launch-bound, steady-low utilization)",
    "decoder training step vs micro batch, grad accumulation and graphs: tokens/s, busy, launches, optimizer share",
    {
        ParamSpec{.name = "micro_batch", .type = ParamType::integer, .default_value = "1,2,4,8,16,32",
                  .help = "sequences per micro step", .unit = "sequences", .min = 1, .max = 65536,
                  .quick_default = "1,8"},
        ParamSpec{.name = "grad_accum", .type = ParamType::integer, .default_value = "1,8",
                  .help = "micro steps per optimizer step (gradient_accumulation_steps)", .unit = "steps", .min = 1,
                  .max = 4096, .quick_default = "1"},
        ParamSpec{.name = "global_batch", .type = ParamType::integer, .default_value = "0",
                  .help = "sequences per optimizer step, held across the micro_batch sweep: grad_accum = global_batch "
                          "/ micro_batch (at least 1), as a user raising micro_batch_size keeps their effective "
                          "batch; give grad_accum=1 with it. 0: grad_accum as given",
                  .unit = "sequences", .min = 0, .max = 1 << 24},
        ParamSpec{.name = "graphs", .type = ParamType::choice, .default_value = "off",
                  .help = "on: capture each run of ops once and replay it (cuda: CUDA graphs; cpu: one submission)",
                  .choices = {"off", "on"}},
        ParamSpec{.name = "seq_len", .type = ParamType::integer, .default_value = "32", .help = "tokens per sequence",
                  .unit = "tokens", .min = 1, .max = 1 << 20, .gpu_default = "512"},
        batch::d_model_param("32", "1024"),
        batch::heads_param("2", "16"),
        batch::d_ff_param(),
        batch::kv_heads_param(),
        batch::layers_param("2"),
        batch::dtype_param("compute dtype (autocast; fp32 masters and gradients)"),
        batch::attn_param(),
        ParamSpec{.name = "optimizer", .type = ParamType::choice, .default_value = "adamw",
                  .help = "once per grad_accum micro steps", .choices = {"adamw", "sgd", "none"}},
        batch::dispatch_us_param(),
        ParamSpec{.name = "bare", .type = ParamType::choice, .default_value = "on",
                  .help = "on: time the step's own GEMM calls back to back too (gemm_bare_tflops, gemm_pct_of_bare); "
                          "off: skip them (diagnose's sweeps, which read neither)",
                  .choices = {"on", "off"},
                  .workload = false},  // what is measured beside the step, not the step: compare matches across it
        trials_param("5", "3"),
    },
    [](RunContext& ctx) { return std::make_unique<BatchRun>(ctx); },
    false,
    [](const ParamSet& ps, const RunContext&) {
      batch::validate_decoder_shape(ps);
      if (ps.get_int("global_batch") > 0 && ps.get_int("grad_accum") != 1)
        throw UsageError(fmt::format("batch: global_batch={} sets grad_accum (global_batch / micro_batch): give "
                                     "-p grad_accum=1 with it, not {}",
                                     ps.get_int("global_batch"), ps.get_int("grad_accum")));
    }};

}  // namespace sb
