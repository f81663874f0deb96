// memory: memory pressure — the footprint of a training step by part, the
// largest micro batch that fits, with and without activation checkpointing,
// and what an out-of-memory costs. The workload is the batch scenario's
// decoder step (workloads/decoder.hpp), built under the device's
// allocator with `mem_limit_gb` as its capacity (cpu: its ledger; cuda: the
// ledger over cudaMalloc, on top of the real capacity; sim: the GPU's).
//
// Definitions (per point, one `checkpointing` value):
//   footprint by part: read from the allocator around each group of the
//     step's allocations (weights, gradients, optimizer state, activations,
//     attention ops, backward buffers) and the transient peak over a step
//     (peak minus what the parts hold); the model: predict_footprint, closed
//     form for the tensors the step allocates, the GEMM workspace asked of
//     the training ops, the attention op's bytes a line through probe steps at
//     micro batch 1 and 2, the transient predicted 0. model_error_pct: the
//     largest |model - measured| / measured over the parts, at `micro_batch`.
//   fits(mb): a step built at mb (every tensor allocated) runs one
//     optimizer step (zero_grad, a micro step, AdamW) without OutOfMemory.
//   largest_micro_batch: found by doubling from 1, then bisection, on real
//     steps; predicted_largest: the largest mb whose modelled total plus what
//     the device already holds is within the limit. Verified: the predicted
//     largest runs `verify` times, the next size fails `verify` times.
//   oom cost: a loop that starts at twice the largest (as users and batch
//     finders such as accelerate's find_executable_batch_size do) and halves
//     on each OutOfMemory until a step completes. The model (weights, compute
//     copies, gradients, AdamW moments) is built once and stays resident, as
//     in the process that catches the error and retries: each attempt builds
//     only what its micro batch sizes (activations, attention ops, backward
//     buffers) and runs one optimizer step. oom_cost_ms: from the first
//     failing allocation (OutOfMemory::raised_at) to the retried step done
//     (unwinding, releasing, the further failures, the retry);
//     oom_lost_ms: the failed attempts' own time, each from its start to its
//     memory released, which a run started at the right size does not spend.
//     A restart instead of a retry pays the model's build again
//     (info.oom_loop.model_build_ms, before any checkpoint is read).
//     The step allocates every tensor, AdamW's moments included, before it
//     runs (a static plan, as a captured CUDA graph does), so an OOM here
//     fails before any compute;
//     eager PyTorch allocates during the forward and also loses the work
//     done before the failing allocation.
//   fragmentation (checkpointing=none only): a caching allocator with
//     PyTorch's policy (scenarios/memory/caching_allocator.hpp) serves the
//     activations of steps whose lengths follow a real length histogram,
//     padded per batch: reserved vs allocated over the steps, the capacity the
//     pool needs, and the failure just below it (fragmentation when the
//     reserved-but-unallocated bytes would hold the request, else the
//     segment sizes).
#include <algorithm>  // std::max, std::min
#include <chrono>     // std::chrono
#include <cmath>      // std::ceil
#include <map>        // std::map
#include <memory>     // std::unique_ptr
#include <optional>   // std::optional
#include <utility>    // std::exchange

#include <fmt/format.h>  // fmt::format

#include "scenarios/memory/caching_allocator.hpp"  // CachingAllocator: the fragmentation probe
#include "harness/errors.hpp"             // OutOfMemory, UsageError
#include "harness/host_cpus.hpp"          // HostCpuForHost
#include "harness/printer.hpp"            // format_number
#include "harness/random.hpp"             // uniform_pm1
#include "harness/runner.hpp"             // add_warning
#include "harness/scenario.hpp"           // Scenario, ScenarioRun
#include "harness/train_ops.hpp"          // TrainOps
#include "harness/units.hpp"              // format_bytes
#include "workloads/decoder.hpp"    // DecoderStep, predict_footprint
#include "scenarios/memory/pool_replay.hpp"  // compare_stream_pool: the cuda pool's replay
#include "scenarios/memory/search.hpp"    // largest_fitting
#include "workloads/lengths.hpp"  // parse_lengths, generate_lengths: the fragmentation probe's lengths

namespace sb {
namespace {

using json = nlohmann::ordered_json;
using namespace batch;
using clk = std::chrono::steady_clock;

double ms_since(clk::time_point t0) { return std::chrono::duration<double, std::milli>(clk::now() - t0).count(); }
double mib(std::uint64_t b) { return double(b) / (1024.0 * 1024.0); }

// One attempt: build the step at a micro batch and run one optimizer step.
struct Attempt {
  bool ok = false;
  std::string oom;        // the OutOfMemory message, when it failed
  double ms = 0;          // build + step (or build until the failure, and the unwinding)
  clk::time_point start, raised, end;  // raised: the failing allocation (when it failed)
  MemoryParts measured;   // when ok
  std::uint64_t peak = 0;  // the allocator's high-water mark over the attempt, above what was held before
};

class MemoryRun : public ScenarioRun {
 public:
  explicit MemoryRun(RunContext& ctx) : ctx_(ctx) {}

  Point run_point(const ParamSet& ps) override {
    Device& dev = ctx_.device;
    DecoderConfig cfg = decoder_config(ps, dev);
    cfg.checkpointing = ps.get_str("checkpointing") == "full";
    const double limit_gb = ps.get_real("mem_limit_gb");
    const std::int64_t max_mb = ps.get_int("max_micro_batch");
    const int verify = int(ps.get_int("verify"));
    const int trials = int(ps.get_int("trials"));
    const std::string where = fmt::format("memory checkpointing={}", cfg.checkpointing ? "full" : "none");

    const HostCpuForHost host_cpu(dev);
    ops_ = dev.make_train_ops();
    dev.synchronize(ctx_.measure.sync_timeout);
    const LimitGuard guard(dev, limit_gb);
    std::string capacity_from = limit_gb > 0 ? "mem_limit_gb" : "";
    if (const Device::MemoryStats now = dev.memory_stats();
        limit_gb > 0 && now.driver_free > 0 && now.limit > now.in_use + now.driver_free) {
      // a limit over what the driver can still give: the driver's answer is the capacity
      dev.set_memory_limit(now.in_use + now.driver_free);
      capacity_from = fmt::format("the driver's free memory at the start (cudaMemGetInfo) plus what the device "
                                  "held, under mem_limit_gb={:g}",
                                  limit_gb);
    }
    if (limit_gb == 0 && dev.memory_stats().limit == 0) {
      // A GPU's own capacity. Where the driver tells what is free (cuda), what this process can still get
      // is that plus what the device holds: totalGlobalMem also counts the context, the libraries'
      // handles and other processes, and a model that fits in it overestimated the largest batch.
      const Device::MemoryStats now = dev.memory_stats();
      if (now.driver_free > 0) {
        dev.set_memory_limit(now.in_use + now.driver_free);
        capacity_from = "the driver's free memory at the start (cudaMemGetInfo) plus what the device held";
      } else if (dev.info().props.contains("memory_bytes")) {
        dev.set_memory_limit(dev.info().props["memory_bytes"].get<std::size_t>());
        capacity_from = "the device's memory (its datasheet's for a simulated one)";
      }
    }
    if (capacity_from.empty()) capacity_from = "the device's own limit (a simulated GPU's datasheet memory)";
    const std::uint64_t held = dev.memory_stats().in_use;  // what the device holds before any step
    const std::uint64_t limit = dev.memory_stats().limit;
    if (limit == 0)
      throw UnsupportedError(fmt::format("{} reports no memory capacity: give mem_limit_gb", dev.info().id));
    if (held >= limit)
      throw UsageError(fmt::format("mem_limit_gb={:g}: the device already holds {} before any step",
                                   limit_gb, format_bytes(double(held))));

    // the allocator's granule: one fp32 element's bytes as the ledger books them
    const std::uint64_t granule = probe_granule(dev);

    // probes at micro batch 1 and 2: the attention op's bytes and the transient peak, fitted by a line
    ctx_.progress(where + ": probe steps at micro batch 1 and 2");
    DecoderConfig c1 = cfg, c2 = cfg;
    c1.micro_batch = 1;
    c2.micro_batch = 2;
    const Attempt p1 = attempt(dev, c1), p2 = attempt(dev, c2);
    if (!p1.ok) throw OutOfMemory(fmt::format("micro batch 1 does not fit: {}", p1.oom));
    const int ops = cfg.checkpointing ? 1 : cfg.layers;
    const double att1 = double(p1.measured.attention) / ops;
    const double att_slope = p2.ok ? double(p2.measured.attention) / ops - att1 : 0;
    const OptKind opt = OptKind::adamw;
    auto model = [&](std::int64_t mb) {
      DecoderConfig c = cfg;
      c.micro_batch = mb;
      const double att = std::max(0.0, att1 + att_slope * double(mb - 1));
      return predict_footprint(c, opt, granule, std::uint64_t(std::llround(att)), step_gemm_workspace(*ops_, c));
    };

    // the model's largest micro batch
    const std::int64_t predicted =
        memory::largest_fitting([&](std::int64_t mb) { return held + model(mb).total() <= limit; }, max_mb).largest;

    // the measured largest: doubling, then bisection, on real steps
    ctx_.progress(where + ": largest micro batch by bisection");
    json trail = json::array();
    std::map<std::int64_t, bool> fits;
    auto fits_at = [&](std::int64_t mb) {
      if (auto it = fits.find(mb); it != fits.end()) return it->second;
      DecoderConfig c = cfg;
      c.micro_batch = mb;
      const Attempt a = attempt(dev, c);
      fits[mb] = a.ok;
      trail.push_back(json{{"micro_batch", mb}, {"fits", a.ok}});
      return a.ok;
    };
    const memory::LargestFit found = memory::largest_fitting(fits_at, max_mb);
    const std::int64_t largest = found.largest;
    const bool capped = found.capped;

    // verification: the predicted largest runs, the next size fails, `verify` times each
    ctx_.progress(where + ": verifying the predicted largest");
    int ok_runs = 0, oom_next = 0;
    std::string next_oom;
    for (int i = 0; i < verify && predicted > 0; ++i) {
      DecoderConfig c = cfg;
      c.micro_batch = predicted;
      ok_runs += attempt(dev, c).ok ? 1 : 0;
      c.micro_batch = predicted + 1;
      const Attempt a = attempt(dev, c);
      if (!a.ok) ++oom_next, next_oom = a.oom;
    }

    // the footprint at the user's micro batch, by part, model beside allocator
    Point p;
    json parts = json::object();
    double worst = 0;
    {
      const Attempt at = attempt(dev, cfg);
      const MemoryParts want = model(cfg.micro_batch);
      if (at.ok) {
        for (int i = 0; i < kMemoryParts; ++i) {
          const double got = double(part(at.measured, i)), pred = double(part(want, i));
          const double err = got > 0 ? 100.0 * std::abs(pred - got) / got : (pred > 0 ? 100.0 : 0.0);
          worst = std::max(worst, err);
          parts[kMemoryPartNames[i]] = json{{"measured_bytes", part(at.measured, i)}, {"model_bytes", part(want, i)},
                                            {"error_pct", err}};
        }
        p.add({"footprint_mib", mib(at.measured.total()), "MiB", Direction::lower, std::nullopt,
               "the step's bytes at micro_batch, by the allocator (the parts and the transient peak)"});
        p.add({"model_footprint_mib", mib(want.total()), "MiB", Direction::lower, std::nullopt,
               "the model's total at micro_batch"});
        p.add({"model_error_pct", worst, "%", Direction::lower, std::nullopt,
               "the largest |model - measured| / measured over the parts (a part measured 0 and modelled more: 100)"});
      } else {
        parts = json{{"oom", at.oom}};
      }
    }
    p.add({"largest_micro_batch", double(largest), "sequences", Direction::higher, std::nullopt,
           capped ? fmt::format("every micro batch up to max_micro_batch={} fits", max_mb)
                  : "the largest micro batch whose step runs, by bisection on real steps"});
    p.add({"predicted_largest_micro_batch", double(predicted), "sequences", Direction::higher, std::nullopt,
           "the largest micro batch the model fits in the limit"});
    p.add({"largest_tokens", double(largest * cfg.seq), "tokens", Direction::higher, std::nullopt,
           "tokens per micro step at the largest micro batch"});

    // throughput at the user's micro batch and at the largest
    ctx_.progress(where + ": throughput");
    const double tps_user = tokens_per_s(dev, cfg, trials);
    if (tps_user > 0)
      p.add({"tokens_per_s", tps_user, "tokens/s", Direction::higher, std::nullopt,
             "at micro_batch, over the timed optimizer steps"});
    if (largest > 0) {
      DecoderConfig c = cfg;
      c.micro_batch = largest;
      const double t = tokens_per_s(dev, c, trials);
      if (t > 0)
        p.add({"tokens_per_s_at_largest", t, "tokens/s", Direction::higher, std::nullopt,
               "at the largest micro batch that fits"});
    }

    // the cost of an OOM: the model resident, start too large, halve on each OOM
    json oom = json::object();
    if (largest > 0 && !capped) {
      ctx_.progress(where + ": out-of-memory recovery loop");
      oom = oom_loop(dev, cfg, largest, p);
    }

    p.info = json{{"limit_bytes", limit},
                  {"limit_from", capacity_from},
                  {"held_before_bytes", held},
                  {"granule_bytes", granule},
                  {"parts_at_micro_batch", parts},
                  {"bisection", trail},
                  {"verify", json{{"predicted_largest", predicted},
                                  {"runs", verify},
                                  {"ok_at_predicted", ok_runs},
                                  {"oom_at_next", oom_next},
                                  {"next_error", next_oom}}},
                  {"oom_loop", oom},
                  {"attention", std::string(to_string(cfg.attention))},
                  {"model_note", "closed form per tensor (decoder.hpp predict_footprint); the GEMM workspace asked "
                                 "of the training ops; the attention op's bytes a line through probe steps at micro "
                                 "batch 1 and 2"},
                  {"plan_note", "every tensor is allocated before the step runs: an OOM fails before any compute"}};
    if (!cfg.checkpointing && ps.get_int("frag_steps") > 0) fragmentation(dev, cfg, ps, p);
    ops_.reset();
    return p;
  }

  void analyze(Result& res) override {
    const Point* none = nullptr;
    const Point* full = nullptr;
    for (const Point& p : res.points) {
      if (p.status != Status::ok || !p.metric("largest_micro_batch")) continue;
      (p.params.value("checkpointing", std::string()) == "full" ? full : none) = &p;
    }
    for (const Point* p : {none, full}) {
      if (!p) continue;
      const auto largest = std::int64_t(p->metric("largest_micro_batch")->value);
      const auto pred = std::int64_t(p->metric("predicted_largest_micro_batch")->value);
      const json& v = p->info["verify"];
      std::string s = fmt::format(
          "checkpointing={}: the largest micro batch that fits in {} is {} (the model says {}; it ran {} of {} times "
          "and {} + 1 failed {} of {} times)",
          p->params.value("checkpointing", std::string()), format_bytes(double(p->info.value("limit_bytes", 0ull))),
          largest, pred, v.value("ok_at_predicted", 0), v.value("runs", 0), pred, v.value("oom_at_next", 0),
          v.value("runs", 0));
      if (p->metric("oom_cost_ms") && !p->metric("oom_lost_ms")) {
        // a result from before 2026-12-05, whose loop rebuilt the model at each attempt: its own words
        s += fmt::format("; a loop that starts at twice the largest and halves on each OOM lost {} ms to {} failed "
                         "attempt(s) (the step allocates before it computes: eager PyTorch also loses the forward "
                         "done before the failing allocation)",
                         format_number(p->metric("oom_cost_ms")->value),
                         format_number(p->metric("oom_failed_attempts")->value));
      } else if (p->metric("oom_cost_ms")) {
        const json o = p->info.value("oom_loop", json::object());
        s += fmt::format("; an OOM recovered in the process (the model kept; from twice the largest, halving on each "
                         "OOM): {} failed attempt(s) lost {} ms, and the step at micro batch {} was done {} ms after "
                         "the first failing allocation ({} ms of it the retried step itself); a restart instead of a "
                         "retry also rebuilds the model, {} ms here before any checkpoint is read (the step allocates "
                         "before it computes: eager PyTorch also loses the forward done before the failing "
                         "allocation)",
                         format_number(p->metric("oom_failed_attempts")->value),
                         format_number(p->metric("oom_lost_ms")->value), o.value("ran_at", std::int64_t(0)),
                         format_number(p->metric("oom_cost_ms")->value), format_number(o.value("retried_step_ms", 0.0)),
                         format_number(o.value("model_build_ms", 0.0)));
      }
      s += fmt::format(" -> micro_batch_size: {}{}", largest,
                       p->params.value("checkpointing", std::string()) == "full" ? ", gradient_checkpointing: true"
                                                                                 : "");
      res.findings.push_back({{}, s, std::nullopt,
                              json{{"checkpointing", p->params.value("checkpointing", std::string())},
                                   {"largest_micro_batch", largest},
                                   {"predicted_largest_micro_batch", pred}}});
    }
    if (none && full) {
      const double a = none->metric("largest_micro_batch")->value, b = full->metric("largest_micro_batch")->value;
      std::string s = fmt::format("gradient_checkpointing fits micro batch {} instead of {} ({:.1f}x)", b, a,
                                  a > 0 ? b / a : 0.0);
      std::optional<double> gain;
      if (none->metric("tokens_per_s") && full->metric("tokens_per_s")) {
        const double cost = none->metric("tokens_per_s")->value / full->metric("tokens_per_s")->value;
        if (cost >= 1)
          s += fmt::format("; at the same micro batch ({}) it costs {:.2f}x in tokens/s (each layer's forward runs "
                           "again in the backward)",
                           none->params.value("micro_batch", std::int64_t(0)), cost);
        else  // "costs 0.95x" read as a gain: say what was measured, and why it is noise
          s += fmt::format("; at the same micro batch ({}) it measured {} tokens/s against {} without it ({:.2f}x "
                           "faster with it): noise, since running each layer's forward again in the backward "
                           "cannot make a step faster",
                           none->params.value("micro_batch", std::int64_t(0)),
                           format_number(full->metric("tokens_per_s")->value),
                           format_number(none->metric("tokens_per_s")->value), 1 / cost);
      }
      if (none->metric("tokens_per_s_at_largest") && full->metric("tokens_per_s_at_largest")) {
        gain = full->metric("tokens_per_s_at_largest")->value / none->metric("tokens_per_s_at_largest")->value;
        s += fmt::format("; each at its largest batch: {} -> {} tokens/s ({:.2f}x){}",
                         format_number(none->metric("tokens_per_s_at_largest")->value),
                         format_number(full->metric("tokens_per_s_at_largest")->value), *gain,
                         *gain < 1 ? ": it buys memory, not speed; use it when the batch that fits without it is "
                                     "too small to fill the device, or for a longer sequence_len"
                                   : "");
      }
      res.findings.push_back({{}, s, gain, json{{"largest_without", a}, {"largest_with", b}}});
    }
    if (none && none->info.contains("fragmentation") && !none->info["fragmentation"].contains("skipped")) {
      const json& f = none->info["fragmentation"];
      const double need = f.value("peak_need_bytes", 0.0), cap = f.value("capacity_needed_bytes", 0.0);
      std::string s = fmt::format(
          "caching allocator: micro batch {} padded to each batch's longest ({}, up to {} tokens) over {} steps: "
          "PyTorch's policy needs {} of capacity to run them all, {:.0f}% above the most "
          "they ask for at once ({})",
          f.value("micro_batch", 0), f.value("lengths", std::string()), f.value("max_len", 0), f.value("steps", 0),
          format_bytes(cap), need > 0 ? 100.0 * (cap / need - 1.0) : 0.0, format_bytes(need));
      if (f.contains("just_below")) {
        const json& b = f["just_below"];
        const bool frag = b.value("kind", std::string()) == "fragmentation";
        s += fmt::format("; at {} (the total fits) step {} fails to allocate {} with {} reserved but unallocated "
                         "(largest free block {}): {}",
                         format_bytes(b.value("capacity", 0.0)), b.value("failed_step", 0),
                         format_bytes(b.value("failed_request", 0.0)), format_bytes(b.value("reserved_unallocated", 0.0)),
                         format_bytes(b.value("largest_free_block", 0.0)),
                         frag ? "fragmentation, the free bytes held in pieces too small"
                              : "the allocator's segment sizes (2 MiB, 20 MiB, rounded to 2 MiB), not fragmentation");
      }
      s += " -> PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or sample_packing: true (constant shapes)";
      json ev = f;
      ev["at_needed"].erase("series");
      res.findings.push_back({{}, s, std::nullopt, ev});
    }
  }

 private:
  // Sets the device's memory limit for the point; removes it after.
  struct LimitGuard {
    LimitGuard(Device& d, double gb) : dev(d) { dev.set_memory_limit(std::size_t(gb * 1e9)); }
    ~LimitGuard() { dev.set_memory_limit(0); }
    LimitGuard(const LimitGuard&) = delete;
    LimitGuard& operator=(const LimitGuard&) = delete;
    Device& dev;
  };

  std::uint64_t probe_granule(Device& dev) {
    const std::uint64_t before = dev.memory_stats().in_use;
    DTensor t = ops_->alloc(1, DType::fp32, "allocator granule probe");
    const std::uint64_t g = dev.memory_stats().in_use - before;
    return std::max<std::uint64_t>(1, g);
  }

  // Build the step at cfg and run one optimizer step; an OutOfMemory
  // anywhere (building or stepping) is a failed attempt, never a crash.
  // resident: a built model whose parameters, gradients and AdamW state the
  // step trains (built with resident_ops); else the step builds its own, with
  // fresh training ops (a fresh process's: its GEMM workspace starts empty).
  Attempt attempt(Device& dev, const DecoderConfig& cfg, DecoderStep* resident = nullptr,
                  TrainOps* resident_ops = nullptr) {
    Attempt a;
    dev.synchronize(ctx_.measure.sync_timeout);  // settles stream-ordered frees of the last attempt
    const std::uint64_t before = dev.memory_stats().in_use;
    dev.reset_peak_memory();
    const auto t0 = clk::now();
    a.start = t0;
    try {
      std::unique_ptr<TrainOps> fresh = resident ? nullptr : dev.make_train_ops();
      DecoderStep step(dev, resident ? *resident_ops : *fresh, cfg, 7, [] {}, resident);
      step.prepare_optimizer(OptKind::adamw);  // every tensor before any compute
      train_window(step, 1, OptKind::adamw, 1e-4f);
      dev.synchronize(ctx_.measure.sync_timeout);
      a.measured = step.measured_memory();
      const std::uint64_t peak = dev.memory_stats().peak;
      const std::uint64_t parts = a.measured.total();
      a.peak = peak > before ? peak - before : 0;
      a.measured.transient = a.peak > parts ? a.peak - parts : 0;
      a.ok = true;
    } catch (const OutOfMemory& e) {
      a.oom = e.what();
      a.raised = e.raised_at;
      try {
        dev.synchronize(ctx_.measure.sync_timeout);  // what the failed build enqueued
      } catch (const OutOfMemory&) {
      }
    }
    a.end = clk::now();
    a.ms = std::chrono::duration<double, std::milli>(a.end - t0).count();
    return a;
  }

  Attempt attempt(Device& dev, const DecoderConfig& cfg, std::int64_t micro_batch, DecoderStep* resident = nullptr,
                  TrainOps* resident_ops = nullptr) {
    DecoderConfig c = cfg;
    c.micro_batch = micro_batch;
    return attempt(dev, c, resident, resident_ops);
  }

  json oom_loop(Device& dev, const DecoderConfig& cfg, std::int64_t largest, Point& p);

  // tokens/s of whole optimizer steps (grad_accum 1) at cfg; 0 if it does not fit.
  double tokens_per_s(Device& dev, const DecoderConfig& cfg, int trials) {
    try {
      dev.synchronize(ctx_.measure.sync_timeout);
      auto ops = dev.make_train_ops();
      DecoderStep step(dev, *ops, cfg, 7, [] {});
      train_window(step, 1, OptKind::adamw, 1e-4f);  // warm-up (the AdamW moments)
      dev.synchronize(ctx_.measure.sync_timeout);
      // at least `trials` optimizer steps, and on until a quarter of the budget is spent
      const double until_ms = 250.0 * ctx_.measure.budget_s;
      const auto t0 = clk::now();
      int done = 0;
      while (done < trials || ms_since(t0) < until_ms) {
        train_window(step, 1, OptKind::adamw, 1e-4f);
        dev.synchronize(ctx_.measure.sync_timeout);
        ++done;
      }
      return double(step.tokens()) * done / (ms_since(t0) / 1e3);
    } catch (const OutOfMemory&) {
      try {
        dev.synchronize(ctx_.measure.sync_timeout);
      } catch (const OutOfMemory&) {
      }
      return 0;
    }
  }

  void fragmentation(Device& dev, const DecoderConfig& cfg, const ParamSet& ps, Point& p);

  RunContext& ctx_;
  std::unique_ptr<TrainOps> ops_;
};

// The out-of-memory recovery loop (see the header): the model's parameters,
// gradients and AdamW state built once and kept; attempts from 2 x the largest, halving on each
// OutOfMemory, each building its micro batch's tensors over the resident model.
json MemoryRun::oom_loop(Device& dev, const DecoderConfig& cfg, std::int64_t largest, Point& p) {
  const std::int64_t start_mb = std::max<std::int64_t>(2 * largest, largest + 1);
  dev.synchronize(ctx_.measure.sync_timeout);
  const std::uint64_t before = dev.memory_stats().in_use;
  const auto tb = clk::now();
  std::unique_ptr<TrainOps> ops;
  std::unique_ptr<DecoderStep> model;
  try {
    ops = dev.make_train_ops();
    model = std::make_unique<DecoderStep>(dev, *ops, cfg, 7, DecoderStep::ParametersOnly{});
    model->prepare_optimizer(OptKind::adamw);
    dev.synchronize(ctx_.measure.sync_timeout);
  } catch (const OutOfMemory& e) {
    model.reset();
    ops.reset();
    dev.synchronize(ctx_.measure.sync_timeout);
    return json{{"gave_up", std::string("the model alone (parameters, gradients, AdamW state): ") + e.what()}, {"failed_attempts", 0}};
  }
  const double build_ms = ms_since(tb);
  const std::uint64_t resident = dev.memory_stats().in_use - before;

  json attempts = json::array();
  std::int64_t mb = start_mb;
  int failed = 0;
  double lost_ms = 0;
  std::optional<clk::time_point> first_raise;
  std::string first_oom, last_oom;
  Attempt done;
  while (true) {
    const Attempt a = attempt(dev, cfg, mb, model.get(), ops.get());
    json row{{"micro_batch", mb}, {"ok", a.ok}, {"ms", a.ms}};
    if (!a.ok) {
      row["to_failure_ms"] = std::chrono::duration<double, std::milli>(a.raised - a.start).count();
      row["unwind_ms"] = std::chrono::duration<double, std::milli>(a.end - a.raised).count();
      if (!first_raise) first_raise = a.raised, first_oom = a.oom;
      last_oom = a.oom;
      lost_ms += a.ms;
      ++failed;
    }
    attempts.push_back(std::move(row));
    if (a.ok) {
      done = a;
      break;
    }
    if (mb == 1) break;  // even 1 fails now (the host's memory, another process): nothing to recover to
    mb = std::max<std::int64_t>(1, mb / 2);
  }
  model.reset();
  ops.reset();
  dev.synchronize(ctx_.measure.sync_timeout);
  json o{{"started_at", start_mb},
         {"failed_attempts", failed},
         {"model_build_ms", build_ms},
         {"resident_bytes", resident},
         {"attempts", attempts}};
  if (!done.ok) {
    o["gave_up"] = last_oom;
    return o;
  }
  const double cost_ms = std::chrono::duration<double, std::milli>(done.end - *first_raise).count();
  p.add({"oom_cost_ms", cost_ms, "ms", Direction::lower, std::nullopt,
         "from the first failing allocation to the retried step done: unwinding and releasing, the further "
         "failures, and the retry (the model resident)"});
  p.add({"oom_lost_ms", lost_ms, "ms", Direction::lower, std::nullopt,
         "the failed attempts' own time, each from its start to its memory released: what a run started at the "
         "size that fits does not spend"});
  p.add({"oom_failed_attempts", double(failed), "attempts", Direction::lower, std::nullopt,
         "micro batches tried and failed before one ran (halving from twice the largest)"});
  o["ran_at"] = mb;
  o["retried_step_ms"] = done.ms;
  o["first_error"] = first_oom;
  o["note"] = "the model (weights, gradients, AdamW state) is built once and kept, as in the process that catches "
              "the error; a restart pays model_build_ms again before reading a checkpoint. 2 x the largest fails "
              "and the halving lands on the largest or below: one failed attempt is the least this loop costs";
  return o;
}

// Fragmentation: a caching allocator with PyTorch's policy
// (scenarios/memory/caching_allocator.hpp), whose segments are the device's own
// buffers under a capacity set for the probe, serves the saved activations
// of `frag_steps` steps over padded batches: each batch's micro_batch
// lengths are drawn from `lengths` (the packing scenario's grammar), clipped
// to frag_seq_len and padded to the batch's longest (a multiple of 8, as
// pad_to_multiple_of=8). A step asks for one block per saved activation of
// each layer (its input and decoder.hpp's set) and frees them after its backward; the
// weights, gradients and AdamW state are one block held throughout. Only
// the sizes matter here, not compute: the probe runs at GPU-like lengths on
// any device.
//   peak need: the largest step's requested bytes plus the state;
//   capacity needed: the smallest capacity the cached pool runs every step
//     in (bisection), against the peak need: the allocator's overhead;
//   just below that capacity (still above the peak need, so the total
//     fits): the failure, with what was reserved but unallocated and the
//     largest free block.
void MemoryRun::fragmentation(Device& dev, const DecoderConfig& cfg, const ParamSet& ps, Point& p) {
  ctx_.progress("memory: fragmentation under a caching allocator");
  const std::uint64_t e = std::uint64_t(storage_bytes(cfg.dtype)), d = std::uint64_t(cfg.d_model),
                      ff = std::uint64_t(cfg.ff());
  const std::uint64_t q = std::uint64_t(cfg.qkv_out());
  // a layer's saved tensors per token: its input (the residual stream from the layer below, which
  // decoder.hpp keeps per layer as Layer::x), then its set: u1, r1, qkv, att, o, xm, u2, r2, hp, h, y
  const std::uint64_t per_token[] = {e * d, e * d, 4, e * q, e * d, e * d, e * d, e * d, 4, e * ff, e * ff, e * d};
  const auto max_len = std::int32_t(ps.get_int("frag_seq_len"));
  const int steps = int(ps.get_int("frag_steps"));
  const packing::LengthSpec spec = packing::parse_lengths(ps.get_str("lengths"));
  std::vector<std::int64_t> padded(std::size_t(steps), 0);
  for (int i = 0; i < steps; ++i) {
    const auto lens = packing::generate_lengths(spec, cfg.micro_batch, 0xf4a9 + std::uint64_t(i), max_len);
    std::int64_t longest = 1;
    for (std::int32_t l : lens) longest = std::max<std::int64_t>(longest, std::min(l, max_len));
    padded[std::size_t(i)] = std::min<std::int64_t>(max_len, (longest + 7) / 8 * 8);
  }
  DecoderConfig one = cfg;
  one.micro_batch = 1;
  const MemoryParts fixed = predict_footprint(one, OptKind::adamw, 1, 0, 0);
  const std::uint64_t state = fixed.weights + fixed.gradients + fixed.optimizer;
  std::uint64_t per_tok_all = 0;
  for (std::uint64_t b : per_token) per_tok_all += b;
  per_tok_all *= std::uint64_t(cfg.layers);
  // an estimate to size the unconstrained run: the state and the forward's activations at the longest batch
  std::uint64_t estimate = 0;
  for (std::int64_t len : padded) estimate = std::max(estimate, state + per_tok_all * std::uint64_t(cfg.micro_batch * len));

  // The sequence, once: every malloc and free of the steps, in order. The caching allocator and the
  // stream-ordered pool (cuda) replay the same one.
  using Op = memory::AllocOp;
  std::vector<Op> ops;
  std::size_t slots = 0;
  {
    auto get = [&](std::uint64_t bytes, const char* what) {
      ops.push_back({Op::alloc, slots, bytes, what});
      return slots++;
    };
    auto put = [&](std::size_t slot) { ops.push_back({Op::free, slot, 0, ""}); };
    const std::size_t kept = get(state, "weights, gradients, AdamW state");
    std::vector<std::vector<std::size_t>> acts(std::size_t(cfg.layers));
    for (int step = 0; step < steps; ++step) {
      ops.push_back({Op::step_begin, std::size_t(step)});
      const auto tokens = std::uint64_t(cfg.micro_batch * padded[std::size_t(step)]);
      // forward: each layer's saved activations, in order
      for (int l = 0; l < cfg.layers; ++l) {
        acts[std::size_t(l)].clear();
        for (std::uint64_t b : per_token) acts[std::size_t(l)].push_back(get(b * tokens, "activation"));
      }
      ops.push_back({Op::note});
      ops.push_back({Op::forward_end});
      // backward, last layer first: the layer's gradient temporaries, then its activations go;
      // the input gradient passes down to the next layer
      std::optional<std::size_t> dx;
      for (int l = cfg.layers - 1; l >= 0; --l) {
        std::vector<std::size_t> grads;
        for (std::uint64_t b : {e * ff, e * ff, e * d, e * d, e * d, e * q, e * d})
          grads.push_back(get(b * tokens, "activation gradient"));
        const std::size_t next_dx = get(e * d * tokens, "input gradient");
        ops.push_back({Op::note});
        for (std::size_t g : grads) put(g);
        for (std::size_t a : acts[std::size_t(l)]) put(a);
        acts[std::size_t(l)].clear();
        if (dx) put(*dx);
        dx = next_dx;
      }
      if (dx) put(*dx);
      ops.push_back({Op::step_end, std::size_t(step)});
    }
    put(kept);
  }
  std::vector<std::uint64_t> slot_bytes(slots, 0);
  for (const Op& op : ops)
    if (op.kind == Op::alloc) slot_bytes[op.slot] = op.bytes;

  dev.synchronize(ctx_.measure.sync_timeout);  // what the last step freed in stream order is settled first
  const std::uint64_t held = dev.memory_stats().in_use;
  const std::size_t point_limit = dev.memory_stats().limit;
  struct Run {
    bool ok = true;
    int failed_step = -1;
    std::uint64_t request = 0, reserved = 0, allocated = 0, largest_free = 0, peak_alloc = 0, peak_res = 0;
    std::uint64_t pool_free = 0;  // reserved but unallocated in the failed request's pool
    std::uint64_t peak_raw = 0;  // the most requested bytes alive at once
    std::string error;
    json series = json::array();
  };
  auto run = [&](std::uint64_t capacity, bool record) {
    Run r;
    dev.synchronize(ctx_.measure.sync_timeout);
    dev.set_memory_limit(std::size_t(held + capacity));
    {
      CachingAllocator alloc([&dev](std::size_t bytes) -> std::shared_ptr<void> {
        return std::make_shared<Buffer>(dev.allocate(bytes, MemKind::device));
      });
      std::vector<CachingAllocator::Block> blocks(slots);
      int step = -1;
      std::uint64_t live_raw = 0;
      AllocatorStats fwd;
      try {
        for (const Op& op : ops) {
          switch (op.kind) {
            case Op::alloc:
              r.request = op.bytes;
              blocks[op.slot] = alloc.malloc(std::size_t(op.bytes), op.what);
              live_raw += op.bytes;
              r.peak_raw = std::max(r.peak_raw, live_raw);
              break;
            case Op::free:
              alloc.free(blocks[op.slot]);
              live_raw -= slot_bytes[op.slot];
              break;
            case Op::note: {
              const AllocatorStats st = alloc.stats();
              r.peak_alloc = std::max<std::uint64_t>(r.peak_alloc, st.allocated);
              r.peak_res = std::max<std::uint64_t>(r.peak_res, st.reserved);
              break;
            }
            case Op::forward_end: fwd = alloc.stats(); break;
            case Op::step_begin: step = int(op.slot); break;
            case Op::step_end:
              if (record)
                r.series.push_back(json{{"step", step},
                                        {"padded_len", padded[std::size_t(step)]},
                                        {"allocated_after_forward", fwd.allocated},
                                        {"reserved_after_forward", fwd.reserved}});
              break;
          }
        }
      } catch (const OutOfMemory& ex) {
        const AllocatorStats st = alloc.stats();
        r.ok = false;
        r.failed_step = step;
        r.error = ex.what();
        r.reserved = st.reserved;
        r.allocated = st.allocated;
        r.largest_free = st.largest_free_block;
        r.pool_free = r.request <= CachingAllocator::kSmallSize ? st.small_pool_free : st.large_pool_free;
      }
    }
    dev.synchronize(ctx_.measure.sync_timeout);
    dev.set_memory_limit(point_limit);
    return r;
  };
  // the peak need: the most requested bytes alive at once, from a run with room to spare
  const Run free_run = run(4 * estimate + (64u << 20), false);
  if (!free_run.ok) {
    p.info["fragmentation"] = json{{"skipped", "the device could not hold the probe with room to spare: " +
                                                   free_run.error}};
    return;
  }
  const std::uint64_t peak_need = free_run.peak_raw;
  // the smallest capacity the cached pool runs every step in: doubling from the peak need (a few
  // segments' worth above it at least: a small probe's peak may be under one 20 MiB segment), then bisection
  std::uint64_t lo = peak_need - 1, hi = peak_need;
  const std::uint64_t ceiling = std::max<std::uint64_t>(16 * peak_need, peak_need + (256u << 20));
  bool hi_ok = false;
  while (!(hi_ok = run(hi, false).ok) && hi < ceiling) lo = hi, hi = std::min(2 * hi, ceiling);
  if (!hi_ok) {
    p.info["fragmentation"] = json{{"skipped", fmt::format("the pool did not run the steps even at {}",
                                                           format_bytes(double(hi)))}};
    return;
  }
  const std::uint64_t step_bytes = std::max<std::uint64_t>(1 << 20, peak_need / 1000);  // 0.1% or 1 MiB
  while (hi - lo > step_bytes) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    (run(mid, false).ok ? hi : lo) = mid;
  }
  const std::uint64_t needed = hi;
  const Run ok_run = run(needed, true);  // reserved vs allocated over the steps
  json f = json{{"micro_batch", cfg.micro_batch},
                {"lengths", ps.get_str("lengths")},
                {"max_len", max_len},
                {"steps", steps},
                {"state_bytes", state},
                {"peak_need_bytes", peak_need},
                {"capacity_needed_bytes", needed},
                {"at_needed", json{{"ran", ok_run.ok},
                                   {"peak_allocated", ok_run.peak_alloc},
                                   {"peak_reserved", ok_run.peak_res},
                                   {"series", ok_run.series}}}};
  if (lo >= peak_need) {  // just below what the pool needs, yet above the peak need: the total fits
    const Run below = run(lo, false);
    if (!below.ok)
      f["just_below"] = json{{"capacity", lo},
                             // fragmentation: the free bytes held in the request's own pool would take it,
                             // but no block of them is large enough; otherwise the new segment's size is what
                             // did not fit (a large request cannot use the small pool's free bytes)
                             {"kind", below.pool_free >= below.request ? "fragmentation" : "segment granularity"},
                             {"failed_step", below.failed_step},
                             {"failed_request", below.request},
                             {"reserved", below.reserved},
                             {"allocated", below.allocated},
                             {"reserved_unallocated", below.reserved - below.allocated},
                             {"reserved_unallocated_in_its_pool", below.pool_free},
                             {"largest_free_block", below.largest_free},
                             {"error", below.error}};
  }
  // cuda: cudaMallocAsync's pool on the same sequence, unconstrained and capped at what the caching
  // allocator needed (scenarios/memory/pool_replay: the logic, tested on a pool of the test's own)
  const auto make_pool = [&](std::size_t max_bytes) {
    auto pool = dev.make_stream_pool(max_bytes);
    if (pool && max_bytes == 0) ctx_.progress("memory: the same steps through the stream-ordered pool");
    return pool;
  };
  // A side measurement: an error of the pool's (an attribute it does not support, a failed read, no
  // memory to make it) is recorded there and does not take the point's other figures with it; the
  // replays report their own out-of-memory.
  try {
    if (auto a = memory::compare_stream_pool(make_pool, ops, slots, peak_need, needed, p)) f["async_pool"] = *a;
  } catch (const Error& e) {
    f["async_pool"] = {{"ran", false}, {"error", e.what()}};
    add_warning(p, fmt::format("the cudaMallocAsync pool comparison failed: {}", e.what()));
  }
  p.add({"frag_overhead_pct", 100.0 * (double(needed) / double(peak_need) - 1.0), "%", Direction::lower,
         std::nullopt,
         "capacity the caching allocator needs to run the varying-length steps, above their peak need (bisection)"});
  p.add({"frag_peak_reserved_mib", mib(ok_run.peak_res), "MiB", Direction::lower, std::nullopt,
         "reserved bytes at their peak, at the capacity the pool needs"});
  p.add({"frag_peak_need_mib", mib(peak_need), "MiB", Direction::lower, std::nullopt,
         "the largest step's requested bytes plus the state"});
  p.info["fragmentation"] = f;
}

}  // namespace

extern const Scenario memory_scenario;
const Scenario memory_scenario{
    "memory",
    "memory pressure and out-of-memory recovery",
    "training footprint by part (model vs allocator), the largest micro batch with and without checkpointing, "
    "the cost of an OOM, allocator fragmentation",
    {
        ParamSpec{.name = "checkpointing", .type = ParamType::choice, .default_value = "none,full",
                  .help = "full: each layer's activations recomputed in the backward (gradient_checkpointing)",
                  .choices = {"none", "full"}},
        ParamSpec{.name = "micro_batch", .type = ParamType::integer, .default_value = "4",
                  .help = "the micro batch whose footprint is reported by part and whose throughput is compared",
                  .unit = "sequences", .min = 1, .max = 65536},
        ParamSpec{.name = "mem_limit_gb", .type = ParamType::real, .default_value = "0.04",
                  .help = "the device's capacity for the run (0: the device's own, a GPU's total memory, of "
                          "which the CUDA context and libraries hold some; cpu needs one)",
                  .unit = "GB", .min = 0, .max = 1e6, .gpu_default = "0"},
        ParamSpec{.name = "seq_len", .type = ParamType::integer, .default_value = "64", .help = "tokens per sequence",
                  .unit = "tokens", .min = 1, .max = 1 << 20, .gpu_default = "2048"},
        batch::d_model_param("64", "2048"),
        batch::heads_param("4", "16"),
        batch::d_ff_param(),
        batch::kv_heads_param(),
        batch::layers_param("4", "8"),
        batch::dtype_param("compute dtype (fp32 masters, gradients and AdamW state)"),
        ParamSpec{.name = "max_micro_batch", .type = ParamType::integer, .default_value = "4096",
                  .help = "the bisection's upper bound", .unit = "sequences", .min = 1, .max = 1 << 20},
        ParamSpec{.name = "verify", .type = ParamType::integer, .default_value = "3",
                  .help = "runs at the predicted largest, and at the next size", .unit = "runs", .min = 0, .max = 100,
                  .quick_default = "1"},
        ParamSpec{.name = "lengths", .type = ParamType::text, .default_value = "lognormal:512,1.0",
                  .help = "fragmentation probe: sequence lengths (the packing scenario's grammar: fixed:N | "
                          "uniform:LO,HI | lognormal:MEAN,SIGMA | @FILE)",
                  .check = [](const std::string& t) { (void)packing::parse_lengths(t); }},
        ParamSpec{.name = "frag_seq_len", .type = ParamType::integer, .default_value = "2048",
                  .help = "fragmentation probe: lengths are clipped to this (sequence_len)", .unit = "tokens",
                  .min = 8, .max = 1 << 20},
        ParamSpec{.name = "frag_steps", .type = ParamType::integer, .default_value = "200",
                  .help = "fragmentation probe: padded batches allocated and freed (0: no probe)", .unit = "steps",
                  .min = 0, .max = 100000, .quick_default = "50"},
        trials_param("3", "2"),
    },
    [](RunContext& ctx) { return std::make_unique<MemoryRun>(ctx); },
    false,
    [](const ParamSet& ps, const RunContext& ctx) {
      batch::validate_decoder_shape(ps);
      const double gb = ps.get_real("mem_limit_gb");
      if (gb > 0 && gb * 1e9 < double(1 << 20))
        throw UsageError(fmt::format("mem_limit_gb={:g} is under 1 MiB", gb));
      if (gb == 0 && ctx.device.info().kind == DeviceKind::cpu)
        throw UsageError("mem_limit_gb=0: the cpu device has no capacity of its own; give one (e.g. 0.04)");
    }};

}  // namespace sb
