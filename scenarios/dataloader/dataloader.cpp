// dataloader: the host loader cannot feed the device.
//
// Workload: a training loop takes batches from a host loader (PyTorch
// DataLoader semantics: scenarios/dataloader/loader.hpp) and runs a device step on
// each: an H2D copy of the batch, then a chain of GEMMs sized so one step takes
// `step_ms` on the device. The loader's per-sample decode is real CPU work.
//
// Measured per point: device busy fraction (timeline: union of device busy
// intervals / wall), the sampled utilization series and its pattern, load time
// per batch vs train time per step, samples/s, H2D GB/s, and a queueing
// model's prediction beside the measurement:
//   demand D = 1 / T (batches/s the device consumes; T = train time per step)
//   supply S = max(1, workers) / L (L = load time per batch; workers = 0 loads
//              inline, overlapped with the asynchronous device step)
//   predicted utilization = min(1, S / D) = min(1, max(1, workers) * T / L)
#include <algorithm>   // std::max, std::min
#include <cmath>       // std::llround
#include <optional>    // std::optional: the dataset file, when source=file
#include <numeric>     // std::accumulate


#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"           // UsageError, HangError
#include "harness/printer.hpp"          // format_number
#include "harness/sampler.hpp"          // Sampler, classify, sparkline
#include "harness/scenario.hpp"         // Scenario, ScenarioRun
#include "harness/timeline.hpp"         // Timeline, Span
#include "scenarios/dataloader/loader.hpp"  // Loader

namespace sb {
namespace {

using json = nlohmann::ordered_json;
using clock_type = std::chrono::steady_clock;
using std::chrono::duration;

// One GEMM kind per device: what a training step's matmuls run in there.
struct StepKernel {
  DType dtype;
  std::int64_t n;
};
StepKernel step_kernel(const Device& dev) {
  switch (dev.info().kind) {
    case DeviceKind::cpu: return {DType::fp32, 512};   // no AMX on many VMs: fp32 is the fast path
    case DeviceKind::cuda: return {DType::bf16, 8192};  // ~1.4 ms on an H100
    case DeviceKind::sim: return {DType::bf16, 8192};
  }
  return {DType::fp32, 512};
}

// Host staging memory of a batch: page-locked (DMA straight from it) or pageable.
enum class Pin { pinned, pageable };
constexpr NameTable<Pin, 2> kPinNames{{{{Pin::pinned, "pinned"}, {Pin::pageable, "pageable"}}}};

class DataloaderRun : public ScenarioRun {
 public:
  explicit DataloaderRun(RunContext& ctx) : ctx_(ctx) {}

  Point run_point(const ParamSet& ps) override {
    Device& dev = ctx_.device;
    const auto timeout = ctx_.measure.sync_timeout;
    calibrate(ps.get_real("step_ms"));

    loader::Config cfg;
    cfg.workers = int(ps.get_int("workers"));
    cfg.prefetch = int(ps.get_int("prefetch"));
    cfg.batch = int(ps.get_int("batch"));
    cfg.sample_bytes = std::size_t(ps.get_int("sample_bytes"));
    cfg.decode_spread = ps.get_real("spread");
    cfg.source = ps.get_choice("source", loader::kSourceNames);
    cfg.read = ps.get_choice("read", loader::kReadModeNames);
    cfg.in_order = ps.get_bool("in_order");
    cfg.timeout = std::chrono::milliseconds(std::llround(ps.get_real("timeout_s") * 1e3));
    cfg.fault = loader::parse_fault(ps.get_str("fault"));
    cfg.on_error = ps.get_choice("on_error", loader::kOnErrorNames);
    cfg.num_batches = ps.get_int("steps");
    cfg.on_load = [&dev](bool begin) { begin ? dev.range_push("load") : dev.range_pop(); };
    const bool pinned = ps.get_choice("pin", kPinNames) == Pin::pinned;
    cfg.alloc = [&dev, pinned](std::size_t bytes) {
      return dev.allocate(bytes, pinned ? MemKind::host_pinned : MemKind::host_pageable);
    };
    // decode_us = 0: pick the cost at which one worker supplies `supply` of
    // the device's demand (L = T / supply), the seeds' experiment.
    double decode_us = ps.get_real("decode_us");
    const bool derived = decode_us <= 0;
    if (derived) decode_us = step_s_ / ps.get_real("supply") / cfg.batch * 1e6;
    cfg.decode_us = decode_us;
    std::optional<loader::DatasetWrite> dataset;
    if (cfg.source == loader::Source::file) {
      ctx_.progress("dataloader: checking or writing the dataset file");
      const std::int64_t n_samples = cfg.num_batches * cfg.batch;
      dataset = loader::write_dataset_file(loader::dataset_cache_path(n_samples, cfg.sample_bytes, cfg.seed),
                                           n_samples, cfg.sample_bytes, cfg.seed);
      cfg.file_path = dataset->path;
    }

    const std::size_t batch_bytes = std::size_t(cfg.batch) * cfg.sample_bytes;
    Buffer dev_batch = dev.allocate(batch_bytes, MemKind::device);
    ctx_.progress(fmt::format("dataloader workers={}: running", cfg.workers));

    // --- the measured window ---
    Sampler sampler(dev.utilization_probe());
    const auto t0 = clock_type::now();
    cfg.origin = t0;
    loader::Loader L(cfg);
    auto since = [&](clock_type::time_point t) { return duration<double>(t - t0).count(); };
    sampler.start();
    const double sampler_t0 = since(clock_type::now());
    EventPtr base = dev.record();
    const double base_host = since(clock_type::now());
    struct StepEvents {
      long step;
      EventPtr h0, h1, c1;
    };
    std::vector<StepEvents> ev;
    Timeline tl;
    Point p;
    int steps_done = 0;
    double first_batch_s = 0;
    try {
      for (long s = 0;; ++s) {
        const auto w0 = clock_type::now();
        dev.range_push("wait for batch");
        std::optional<loader::Batch> b = L.next();
        dev.range_pop();
        const auto w1 = clock_type::now();
        if (!b) break;
        tl.add({"train loop", Phase::wait, since(w0), since(w1), s});
        if (s == 0) first_batch_s = since(w1);
        dev.range_push("step");
        StepEvents e{s, dev.record(), nullptr, nullptr};
        dev.copy_h2d_from(dev_batch, b->data, b->bytes, pinned ? MemKind::host_pinned : MemKind::host_pageable);
        e.h1 = dev.record();
        for (int r = 0; r < reps_; ++r) op_->enqueue();
        e.c1 = dev.record();
        dev.range_pop();
        // The staging slot is free once its copy is done (the device may still
        // be computing): the loop runs at most one step ahead of the device.
        dev.wait_event(e.h1, timeout);
        L.release(*b);
        ev.push_back(std::move(e));
        ++steps_done;
        ctx_.progress(fmt::format("dataloader workers={}: step {}", cfg.workers, s));
      }
      dev.synchronize(timeout);
    } catch (const loader::SampleError& err) {
      sampler.stop();
      throw MismatchError(err.what());  // status error: a corrupt sample stopped the epoch
    }
    const double wall = since(clock_type::now());
    sampler.stop();

    // --- analysis ---
    double h2d_s = 0, train_s = 0;
    for (const auto& e : ev) {
      const double a = base_host + dev.elapsed_ms(base, e.h0) / 1e3;
      const double b = base_host + dev.elapsed_ms(base, e.h1) / 1e3;
      const double c = base_host + dev.elapsed_ms(base, e.c1) / 1e3;
      tl.add({"device", Phase::h2d, a, b, e.step});
      tl.add({"device", Phase::compute, b, c, e.step});
      h2d_s += b - a;
      train_s += c - a;
    }
    double load_s = 0;
    const auto records = L.records();  // a copy taken under the loader's lock: once
    for (const auto& r : records) {
      tl.add({r.worker < 0 ? "train loop" : fmt::format("worker {}", r.worker), Phase::load, r.t0_s, r.t1_s, r.batch});
      load_s += r.t1_s - r.t0_s;
    }
    const auto n = double(std::max(1, steps_done));
    const double T = train_s / n, Lb = load_s / double(std::max<std::size_t>(1, records.size()));
    // The measured window opens when the first batch arrives: the loader's
    // start-up (first_batch_ms) is reported on its own, not mixed into the
    // steady state a user sees in nvidia-smi.
    const TimelineSummary sum = tl.summarize(first_batch_s, wall);
    const double predicted = loader::predicted_busy(cfg.workers, T, Lb);
    std::vector<double> util;
    for (const auto& x : sampler.series())
      if (x.t_s + sampler_t0 >= first_batch_s) util.push_back(x.s.util);
    const double util_mean = util.empty() ? 0 : std::accumulate(util.begin(), util.end(), 0.0) / double(util.size());
    const Pattern pattern = classify(util, steps_done > 0);

    const bool sim = dev.info().simulated;
    p.add({"busy_pct", 100 * sum.busy_fraction, "%", Direction::higher, std::nullopt,
           "union of device busy intervals / wall time"});
    p.add({"predicted_pct", 100 * predicted, "%", Direction::none, std::nullopt,
           "queueing model min(1, max(1,workers) * train / load)"});
    p.add({"model_error_pts", 100 * (sum.busy_fraction - predicted), "pts", Direction::none, std::nullopt,
           "measured busy minus predicted", false});
    if (!util.empty())
      p.add({"sampled_util_pct", 100 * util_mean, "%", Direction::higher, std::nullopt,
             fmt::format("mean of {} samples every {} ms ({})", util.size(), sampler.period().count(),
                         sampler.source())});
    p.add({"load_ms", Lb * 1e3, "ms", Direction::lower, std::nullopt, "load time per batch (one worker)"});
    p.add({"train_ms", T * 1e3, "ms", Direction::lower, std::nullopt, "device time per step: H2D + compute"});
    p.add({"wait_ms", 1e3 * sum.idle_host_wait_s / n, "ms", Direction::lower, std::nullopt,
           "device idle per step while the loop waited for a batch", false});
    p.add({"samples_per_s", double(std::max(0, steps_done - 1)) * cfg.batch / std::max(sum.wall_s, 1e-9),
           "samples/s", Direction::higher, std::nullopt, "after the first batch"});
    p.add({"first_batch_ms", first_batch_s * 1e3, "ms", Direction::lower, std::nullopt,
           "loader start-up: time until the first batch arrived", false});
    if (h2d_s > 0)
      p.add({"h2d_gbs", double(batch_bytes) * n / h2d_s / 1e9, "GB/s", Direction::higher, std::nullopt,
             fmt::format("{} host memory, {} per copy", pinned ? "pinned" : "pageable", batch_bytes)});
    p.info = json{{"pattern", to_string(pattern)},
                  {"sparkline", sparkline(util)},
                  {"bottleneck", loader::bottleneck(cfg.workers, T, Lb)},
                  {"decode_us", decode_us},
                  {"decode_us_derived", derived},
                  {"step_gemm", fmt::format("{} x {} {}^3", reps_, to_string(kernel_.dtype), kernel_.n)},
                  {"step_ms_achieved", T * 1e3},
                  {"wall_s", wall},
                  {"steps", steps_done},
                  {"skipped_samples", L.skipped()},
                  {"idle_host_wait_s", sum.idle_host_wait_s},
                  {"idle_other_s", sum.idle_other_s},
                  {"util_source", sampler.source()},
                  {"util_series", util}};
    if (sim) p.info["note"] = "simulated device: its step times are modelled, not measured";
    if (dataset) {
      // A cache kept for the next run: say where, and how it is removed.
      p.info["dataset_file"] = dataset->path;
      p.info["dataset_file_cache"] = dataset->how == loader::DatasetWrite::How::reused    ? "reused"
                                     : dataset->how == loader::DatasetWrite::How::written ? "written"
                                                                                          : "rewritten: " + dataset->why;
      p.info["dataset_file_cleanup"] = "stallbench clean";
    }
    if (ctx_.trace)
      ctx_.trace->push_back(TraceProcess{
          fmt::format("dataloader workers={} prefetch={} pin={}", cfg.workers, cfg.prefetch, ps.get_str("pin")),
          std::move(tl), wall});
    return p;
  }

  void analyze(Result& r) override {
    // The smallest worker count that keeps the device >= 90% busy.
    const Point* worst = nullptr;
    const Point* best = nullptr;
    const Point* first_ok = nullptr;
    for (const auto& p : r.points) {
      if (p.status != Status::ok || !p.metric("busy_pct")) continue;
      if (!worst || p.metric("busy_pct")->value < worst->metric("busy_pct")->value) worst = &p;
      if (!best || p.metric("busy_pct")->value > best->metric("busy_pct")->value) best = &p;
      if (p.metric("busy_pct")->value >= 90 &&
          (!first_ok || p.params["workers"].get<int>() < first_ok->params["workers"].get<int>()))
        first_ok = &p;
    }
    if (!worst) return;
    const std::string dev = r.meta.value("/device/id"_json_pointer, std::string("the device"));
    auto busy = [](const Point* p) { return p->metric("busy_pct")->value; };
    auto sps = [](const Point* p) { return p->metric("samples_per_s")->value; };
    json ev{{"worst", {{"params", worst->params}, {"busy_pct", busy(worst)}, {"pattern", worst->info["pattern"]},
                       {"load_ms", worst->metric("load_ms")->value}, {"train_ms", worst->metric("train_ms")->value}}}};
    if (first_ok && first_ok != worst) {
      const double gain = sps(first_ok) / sps(worst);
      ev["fix"] = json{{"params", first_ok->params}, {"busy_pct", busy(first_ok)}, {"pattern", first_ok->info["pattern"]}};
      r.findings.push_back(
          {{},
           fmt::format("workers={} is the smallest worker count that keeps {} >= 90% busy ({:.0f}%, {}); "
                       "workers={} left it {:.0f}% busy ({}, load {} ms > train {} ms per step): {:.2f}x samples/s",
                       first_ok->params["workers"].get<int>(), dev, busy(first_ok),
                       first_ok->info["pattern"].get<std::string>(), worst->params["workers"].get<int>(), busy(worst),
                       worst->info["pattern"].get<std::string>(), format_number(worst->metric("load_ms")->value),
                       format_number(worst->metric("train_ms")->value), gain),
           gain, ev});
    } else if (!first_ok) {
      r.findings.push_back({{},
                            fmt::format("no worker count tried keeps {} >= 90% busy (best {:.0f}% at workers={}, "
                                        "{}); add workers (up to the free cores), cut decode cost, or pin memory",
                                        dev, busy(best), best->params["workers"].get<int>(),
                                        best->info["pattern"].get<std::string>()),
                            std::nullopt, ev});
    } else {
      r.findings.push_back({{},
                            fmt::format("the loader keeps {} >= 90% busy at every point tried", dev), std::nullopt,
                            ev});
    }
  }

 private:
  // Sizes the step's GEMM chain once per run: reps of one GEMM whose time is
  // measured here, so the step takes about step_ms on this device.
  void calibrate(double step_ms) {
    if (op_ && step_ms == calibrated_for_) return;
    Device& dev = ctx_.device;
    kernel_ = step_kernel(dev);
    ctx_.progress("dataloader: calibrating the step");
    op_ = dev.make_gemm({kernel_.n, kernel_.n, kernel_.n}, kernel_.dtype, 3);
    MeasureConfig mc = quick_measure_config();
    mc.sync_timeout = ctx_.measure.sync_timeout;
    const double gemm_ms = measure(dev, [&] { op_->enqueue(); }, mc).ms.median;
    reps_ = std::max(1, int(std::lround(step_ms / gemm_ms)));
    (void)loader::decode_iters_per_us();  // its one-time calibration stays out of the measured window
    step_s_ = reps_ * gemm_ms / 1e3;
    calibrated_for_ = step_ms;
  }

  RunContext& ctx_;
  StepKernel kernel_{};
  std::unique_ptr<GemmOp> op_;
  int reps_ = 1;
  double step_s_ = 0;
  double calibrated_for_ = -1;
};

}  // namespace

// A fault at a sample the epoch never reaches would never fire, and the run
// would say nothing of it.
void validate_dataloader_point(const ParamSet& ps, const RunContext&) {
  // source=file writes under TMPDIR: a missing one is bad input, found now.
  if (ps.get_choice("source", loader::kSourceNames) == loader::Source::file) (void)loader::dataset_cache_dir();
  const loader::Fault f = loader::parse_fault(ps.get_str("fault"));
  const std::int64_t samples = ps.get_int("steps") * ps.get_int("batch");
  if (f.kind != loader::Fault::Kind::none && f.sample >= samples)
    throw UsageError(fmt::format("fault={}: sample {} does not exist; the epoch has steps x batch = {} samples "
                                 "(0..{})",
                                 ps.get_str("fault"), f.sample, samples, samples - 1));
}

extern const Scenario dataloader_scenario;
const Scenario dataloader_scenario{
    "dataloader",
    "slow host dataloader",
    "device busy fraction and utilization pattern vs loader workers, prefetch, pinning and decode cost",
    {
        ParamSpec{.name = "workers", .type = ParamType::integer, .default_value = "0,1,2,4",
                  .help = "loader worker threads; 0 loads inline (DataLoader num_workers=0)", .unit = "threads",
                  .min = 0, .max = 64, .quick_default = "0,2"},
        ParamSpec{.name = "prefetch", .type = ParamType::integer, .default_value = "2",
                  .help = "batches in flight per worker (prefetch_factor)", .unit = "batches", .min = 1, .max = 64},
        ParamSpec{.name = "batch", .type = ParamType::integer, .default_value = "32", .help = "samples per batch",
                  .unit = "samples", .min = 1, .max = 65536},
        ParamSpec{.name = "sample_bytes", .type = ParamType::integer, .default_value = "150528",
                  .help = "bytes per sample (150528: a 224x224 RGB uint8 image)", .unit = "bytes", .min = 16,
                  .max = 1 << 28},
        ParamSpec{.name = "decode_us", .type = ParamType::real, .default_value = "0",
                  .help = "CPU work per sample (real work, not sleep); 0 = derived from supply", .unit = "us",
                  .min = 0, .max = 1e7},
        ParamSpec{.name = "supply", .type = ParamType::real, .default_value = "0.5",
                  .help = "with decode_us=0: the fraction of the device's demand one worker supplies", .unit = "",
                  .min = 0.01, .max = 100},
        ParamSpec{.name = "spread", .type = ParamType::real, .default_value = "0",
                  .help = "per-sample decode cost varies uniformly by +-spread", .unit = "", .min = 0, .max = 1},
        ParamSpec{.name = "step_ms", .type = ParamType::real, .default_value = "20",
                  .help = "device compute per step (calibrated; the achieved value is reported)", .unit = "ms",
                  .min = 0.1, .max = 10000},
        ParamSpec{.name = "steps", .type = ParamType::integer, .default_value = "60",
                  .help = "training steps (batches) per point", .unit = "steps", .min = 2, .max = 1000000,
                  .quick_default = "20"},
        ParamSpec{.name = "source", .type = ParamType::choice, .default_value = "memory",
                  .help = "samples from memory, or from a dataset file written once", .choices = loader::kSourceNames.names()},
        ParamSpec{.name = "read", .type = ParamType::choice, .default_value = "pread",
                  .help = "how source=file reads", .choices = loader::kReadModeNames.names()},
        ParamSpec{.name = "pin", .type = ParamType::choice, .default_value = "pinned",
                  .help = "host staging memory: pinned (cudaHostAlloc) or pageable (malloc)",
                  .choices = kPinNames.names()},
        ParamSpec{.name = "in_order", .type = ParamType::boolean, .default_value = "true",
                  .help = "deliver batches in order (DataLoader default)"},
        ParamSpec{.name = "timeout_s", .type = ParamType::real, .default_value = "10",
                  .help = "loader timeout: the longest the loop waits for a batch (DataLoader timeout)", .unit = "s",
                  .min = 0.05, .max = 3600},
        ParamSpec{.name = "fault", .type = ParamType::text, .default_value = "none",
                  .help = "none | hang@N (sample N stalls its worker) | throw@N (sample N is corrupt)",
                  .check = [](const std::string& t) { (void)loader::parse_fault(t); }},
        ParamSpec{.name = "on_error", .type = ParamType::choice, .default_value = "stop",
                  .help = "a corrupt sample stops the epoch, or is skipped", .choices = loader::kOnErrorNames.names()},
    },
    [](RunContext& ctx) -> std::unique_ptr<ScenarioRun> { return std::make_unique<DataloaderRun>(ctx); },
    false,
    &validate_dataloader_point,
};

}  // namespace sb
