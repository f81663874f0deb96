// dataloader: the host loader cannot feed the device.
//
// Workload: a training loop takes batches from a host loader (PyTorch
// DataLoader semantics: workloads/loader.hpp) and runs a device step on
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
#include <cmath>       // std::llround, std::abs
#include <map>         // std::map: the workloads of a sweep
#include <optional>    // std::optional: the dataset file, when source=file
#include <set>         // std::set

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join: the warnings

#include "harness/cpu_affinity.hpp"     // allowed_cpus, pin_this_thread: the CPU split
#include "harness/errors.hpp"           // UsageError, HangError
#include "harness/point_metrics.hpp"    // workload_key, varying_params, params_label
#include "harness/printer.hpp"          // format_number
#include "harness/sampler.hpp"          // Sampler, classify, sparkline
#include "harness/scenario.hpp"         // Scenario, ScenarioRun
#include "harness/timeline.hpp"         // Timeline, Span
#include "scenarios/dataloader/epoch.hpp"   // EpochRecord, derive_epoch
#include "workloads/loader.hpp"  // Loader

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
    // No AMX on many VMs: fp32 is the fast path. 256^3 is about half a
    // millisecond on one core, so a 20 ms step is ~40 of them and the step
    // can be sized to within a few percent (512^3 left it 15-25% off).
    case DeviceKind::cpu: return {DType::fp32, 256};
    case DeviceKind::cuda: return {DType::bf16, 8192};  // ~1.4 ms on an H100
    case DeviceKind::sim: return {DType::bf16, 8192};
  }
  return {DType::fp32, 512};
}

// Host staging memory of a batch: page-locked (DMA straight from it) or pageable.
enum class Pin { pinned, pageable };
constexpr NameTable<Pin, 2> kPinNames{{{{Pin::pinned, "pinned"}, {Pin::pageable, "pageable"}}}};

// Everything a point is, read once from its parameters (validate uses it too).
struct Settings {
  loader::Config loader;  // all but what the run supplies: decode cost, file, allocator, clock
  Pin pin = Pin::pinned;
  double step_ms = 20;
  double supply = 0.5;
  double decode_us = 0;  // <= 0: derived from supply
  int compute_threads = 0;  // cpu device: CPUs for its compute; 0: half

  static Settings from(const ParamSet& ps) {
    Settings st;
    loader::Config& c = st.loader;
    c.workers = int(ps.get_int("workers"));
    c.prefetch = int(ps.get_int("prefetch"));
    c.batch = int(ps.get_int("batch"));
    c.sample_bytes = std::size_t(ps.get_int("sample_bytes"));
    c.decode_spread = ps.get_real("spread");
    c.source = ps.get_choice("source", loader::kSourceNames);
    c.read = ps.get_choice("read", loader::kReadModeNames);
    c.in_order = ps.get_bool("in_order");
    c.timeout = std::chrono::milliseconds(std::llround(ps.get_real("timeout_s") * 1e3));
    c.fault = loader::parse_fault(ps.get_str("fault"));
    c.on_error = ps.get_choice("on_error", loader::kOnErrorNames);
    c.num_batches = ps.get_int("steps");
    st.pin = ps.get_choice("pin", kPinNames);
    st.step_ms = ps.get_real("step_ms");
    st.supply = ps.get_real("supply");
    st.decode_us = ps.get_real("decode_us");
    st.compute_threads = int(ps.get_int("compute_threads"));
    return st;
  }
  std::int64_t samples() const { return loader.num_batches * loader.batch; }
};

class DataloaderRun : public ScenarioRun {
 public:
  explicit DataloaderRun(RunContext& ctx) : ctx_(ctx) {}
  ~DataloaderRun() override {
    try {
      if (split_) ctx_.device.reserve_host_cpus(0);  // every CPU back to the compute
    } catch (...) {
    }
  }

  Point run_point(const ParamSet& ps) override {
    // --- configure: the step, the loader, the dataset file, the buffers ---
    Device& dev = ctx_.device;
    const Settings st = Settings::from(ps);
    // The compute gets its own CPUs and the loader the rest, as a GPU job's
    // compute never competes with its DataLoader workers for cores. The step
    // is calibrated after the split, under the conditions the loop runs in.
    const CpuSplit split = split_cpus(st.compute_threads);
    calibrate(st.step_ms, split.compute.size());
    loader::Config cfg = st.loader;
    cfg.cpus = split.loader;
    const bool pinned = st.pin == Pin::pinned;
    cfg.on_load = [&dev](bool begin) { begin ? dev.range_push("DataLoader worker: load + collate") : dev.range_pop(); };
    cfg.alloc = [&dev, pinned](std::size_t bytes) {
      return dev.allocate(bytes, pinned ? MemKind::host_pinned : MemKind::host_pageable);
    };
    // decode_us = 0: pick the cost at which one worker supplies `supply` of
    // the device's demand (L = T / supply), the seeds' experiment.
    const bool derived = st.decode_us <= 0;
    cfg.decode_us = derived ? step_s_ / st.supply / cfg.batch * 1e6 : st.decode_us;
    std::optional<loader::DatasetWrite> dataset;
    if (cfg.source == loader::Source::file) {
      ctx_.progress("dataloader: checking or writing the dataset file");
      dataset = loader::write_dataset_file(loader::dataset_cache_path(st.samples(), cfg.sample_bytes, cfg.seed),
                                           st.samples(), cfg.sample_bytes, cfg.seed);
      cfg.file_path = dataset->path;
    }
    const std::size_t batch_bytes = std::size_t(cfg.batch) * cfg.sample_bytes;
    Buffer dev_batch = dev.allocate(batch_bytes, MemKind::device);
    ctx_.progress(fmt::format("dataloader workers={}: running", cfg.workers));

    // --- the timed window: records only ---
    loader::EpochRecord rec;
    {
      // workers = 0 loads on this thread: it runs on the loader's CPUs too.
      const ThreadAffinityGuard keep;
      pin_this_thread(split.loader);
      rec = timed_epoch(cfg, dev_batch, pinned);
    }

    // --- derive ---
    Timeline tl;
    Point p = loader::derive_epoch(
        rec, {cfg.workers, cfg.batch, batch_bytes, pinned, dev.info().simulated, int(split.loader.size())},
        ctx_.trace ? &tl : nullptr);
    p.info["decode_us"] = cfg.decode_us;
    p.info["decode_us_derived"] = derived;
    p.info["step_gemm"] = fmt::format("{} x {} {}^3", reps_, to_string(kernel_.dtype), kernel_.n);
    p.info["cpu_split"] = json{{"compute_cpus", split.compute},
                               {"loader_cpus", split.loader},
                               {"note", split.note}};
    std::vector<std::string> warnings;
    const double achieved = p.info.value("step_ms_achieved", 0.0);
    if (steps_ok(p) && std::abs(achieved - st.step_ms) > 0.1 * st.step_ms)
      warnings.push_back(fmt::format(
          "the step took {} ms, not the {} ms asked ({:+.0f}%): the loop's conditions differ from the calibration's",
          format_number(achieved), format_number(st.step_ms), 100 * (achieved / st.step_ms - 1)));
    // The loader's CPU per batch is its decode and its copies, so never much
    // under the decode asked; well under it, the decode calibration read a
    // slower CPU than the loop ran on (a clock still rising, a preempted
    // calibration), and the supply asked was not what the loop got.
    const double asked_decode_ms = cfg.decode_us * cfg.batch / 1e3;
    const Metric* load_cpu = p.metric("load_cpu_ms");
    const double load_cpu_ms = load_cpu ? load_cpu->value : 0.0;
    p.info["decode_ms_asked_per_batch"] = asked_decode_ms;
    if (steps_ok(p) && asked_decode_ms > 1 && load_cpu_ms > 0 && load_cpu_ms < 0.8 * asked_decode_ms)
      warnings.push_back(fmt::format(
          "a batch's load took {} ms of CPU, under the {} ms of decode asked ({:+.0f}%): the CPU ran faster than "
          "when the decode was calibrated, so the loader supplied more than supply={} asked",
          format_number(load_cpu_ms), format_number(asked_decode_ms), 100 * (load_cpu_ms / asked_decode_ms - 1),
          format_number(st.supply)));
    if (!warnings.empty()) p.info["warning"] = fmt::format("{}", fmt::join(warnings, "; "));
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
          std::move(tl), rec.wall_s});
    return p;
  }

  void analyze(Result& r) override {
    // Per workload (every parameter but workers and trials): the smallest worker count that keeps
    // the device >= 90% busy. A sweep of another axis (pin=pinned,pageable at one worker count) was
    // read as a sweep of workers ("workers=4 is the smallest worker count ...; workers=4 left it").
    auto key = [](const Point& p) { return workload_key(p, {"workers", "trials"}); };
    std::vector<std::string> order;
    std::map<std::string, std::vector<const Point*>> groups;
    for (const auto& p : r.points) {
      if (p.status != Status::ok || !p.metric("busy_pct")) continue;
      const std::string k = key(p);
      if (!groups.count(k)) order.push_back(k);
      groups[k].push_back(&p);
    }
    const std::set<std::string> varying = varying_params(r, {"workers", "trials"});  // what tells them apart
    const std::string dev = r.meta.value("/device/id"_json_pointer, std::string("the device"));
    auto busy = [](const Point* p) { return p->metric("busy_pct")->value; };
    auto sps = [](const Point* p) { return p->metric("samples_per_s")->value; };
    for (const std::string& k : order) {
      const std::vector<const Point*>& pts = groups[k];
      const Point* worst = nullptr;
      const Point* best = nullptr;
      const Point* first_ok = nullptr;
      std::set<int> worker_counts;
      for (const Point* p : pts) {
        worker_counts.insert(p->params["workers"].get<int>());
        if (!worst || busy(p) < busy(worst)) worst = p;
        if (!best || busy(p) > busy(best)) best = p;
        if (busy(p) >= 90 && (!first_ok || p->params["workers"].get<int>() < first_ok->params["workers"].get<int>()))
          first_ok = p;
      }
      std::string which = params_label(*worst, varying);
      if (!which.empty()) which += ": ";
      json ev{{"worst", {{"params", worst->params}, {"busy_pct", busy(worst)}, {"pattern", worst->info["pattern"]},
                         {"load_ms", worst->metric("load_ms")->value}, {"train_ms", worst->metric("train_ms")->value}}}};
      if (worker_counts.size() < 2) {  // one worker count: nothing to say about worker counts
        if (busy(worst) < 90)
          r.findings.push_back({{},
                                fmt::format("{}workers={} leaves {} {:.0f}% busy ({}, load {} ms against train {} ms "
                                            "per step); sweep workers to find the smallest count that keeps it fed",
                                            which, worst->params["workers"].get<int>(), dev, busy(worst),
                                            worst->info["pattern"].get<std::string>(),
                                            format_number(worst->metric("load_ms")->value),
                                            format_number(worst->metric("train_ms")->value)),
                                std::nullopt, ev});
        continue;
      }
      if (first_ok && first_ok != worst) {
        const double gain = sps(first_ok) / sps(worst);
        ev["fix"] = json{{"params", first_ok->params}, {"busy_pct", busy(first_ok)}, {"pattern", first_ok->info["pattern"]}};
        r.findings.push_back(
            {{},
             fmt::format("{}workers={} is the smallest worker count that keeps {} >= 90% busy ({:.0f}%, {}); "
                         "workers={} left it {:.0f}% busy ({}, load {} ms > train {} ms per step): {:.2f}x samples/s",
                         which, first_ok->params["workers"].get<int>(), dev, busy(first_ok),
                         first_ok->info["pattern"].get<std::string>(), worst->params["workers"].get<int>(), busy(worst),
                         worst->info["pattern"].get<std::string>(), format_number(worst->metric("load_ms")->value),
                         format_number(worst->metric("train_ms")->value), gain),
             gain, ev});
      } else if (!first_ok) {
        r.findings.push_back({{},
                              fmt::format("{}no worker count tried keeps {} >= 90% busy (best {:.0f}% at workers={}, "
                                          "{}); add workers (up to the free cores), cut decode cost, or pin memory",
                                          which, dev, busy(best), best->params["workers"].get<int>(),
                                          best->info["pattern"].get<std::string>()),
                              std::nullopt, ev});
      } else {
        r.findings.push_back({{},
                              fmt::format("{}the loader keeps {} >= 90% busy at every point tried", which, dev),
                              std::nullopt, ev});
      }
    }
  }

 private:
  // One epoch: the train loop takes each batch, copies it to the device and
  // runs the step's GEMMs; nothing here allocates or formats beyond the
  // record's own vectors. Device events become seconds after the loop.
  loader::EpochRecord timed_epoch(loader::Config cfg, Buffer& dev_batch, bool pinned) {
    Device& dev = ctx_.device;
    const auto timeout = ctx_.measure.sync_timeout;
    struct StepEvents {
      std::int64_t step;
      EventPtr h0, h1, c1;
    };
    std::vector<StepEvents> ev;
    ev.reserve(std::size_t(cfg.num_batches));
    loader::EpochRecord rec;
    rec.waits.reserve(std::size_t(cfg.num_batches));
    Sampler sampler(dev.utilization_probe());
    const auto t0 = clock_type::now();
    cfg.origin = t0;
    loader::Loader L(cfg);
    auto since = [&](clock_type::time_point t) { return duration<double>(t - t0).count(); };
    sampler.start();
    const double sampler_t0 = since(clock_type::now());
    EventPtr base = dev.record();
    const double base_host = since(clock_type::now());
    const std::string in_loop = fmt::format("dataloader workers={}: in the epoch's steps", cfg.workers);
    const char* next_name = cfg.workers == 0 ? "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
                                             : "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__";
    try {
      for (std::int64_t s = 0;; ++s) {
        // The ranges are named as PyTorch's profiler names them, so a --trace of this loop reads
        // as a training job's: the step encloses the DataLoader's __next__, as in a real loop.
        const std::string step_name = fmt::format("ProfilerStep#{}", s);
        dev.range_push(step_name.c_str());
        const auto w0 = clock_type::now();
        dev.range_push(next_name);
        std::optional<loader::Batch> b = L.next();
        dev.range_pop();
        const auto w1 = clock_type::now();
        if (!b) {
          dev.range_pop();
          break;
        }
        rec.waits.push_back({s, since(w0), since(w1)});
        if (s == 0) rec.first_batch_s = since(w1);
        StepEvents e{s, dev.record(), nullptr, nullptr};
        dev.copy_h2d_from(dev_batch, b->data, b->bytes, pinned ? MemKind::host_pinned : MemKind::host_pageable);
        e.h1 = dev.record();
        for (int r = 0; r < reps_; ++r) op_->enqueue();
        e.c1 = dev.record();
        // The staging slot is free once its copy is done (the device may still
        // be computing): the loop runs at most one step ahead of the device.
        dev.wait_event(e.h1, timeout);
        L.release(*b);
        dev.range_pop();  // ProfilerStep#s
        ev.push_back(std::move(e));
        ctx_.progress(in_loop);
      }
      dev.synchronize(timeout);
    } catch (const loader::SampleError& err) {
      sampler.stop();
      throw MismatchError(err.what());  // status error: a corrupt sample stopped the epoch
    }
    rec.wall_s = since(clock_type::now());
    sampler.stop();

    for (const auto& e : ev)
      rec.steps.push_back({e.step, base_host + dev.elapsed_ms(base, e.h0) / 1e3,
                           base_host + dev.elapsed_ms(base, e.h1) / 1e3, base_host + dev.elapsed_ms(base, e.c1) / 1e3});
    rec.loads = L.records();  // a copy taken under the loader's lock: once
    rec.skipped_samples = L.skipped();
    for (const auto& x : sampler.series())
      if (x.t_s + sampler_t0 >= rec.first_batch_s) rec.util.push_back(x.s.util);
    rec.util_source = sampler.source();
    rec.util_period_ms = int(sampler.period().count());
    return rec;
  }

  struct CpuSplit {
    std::vector<int> compute, loader;
    std::string note;
  };
  CpuSplit split_cpus(int compute_threads) {
    CpuSplit out;
    const std::vector<int> all = allowed_cpus();
    const int want = compute_threads > 0 ? compute_threads : std::max(1, int(all.size()) / 2);
    out.compute = ctx_.device.reserve_host_cpus(want);
    split_ = split_ || !out.compute.empty();
    for (int c : all)
      if (std::find(out.compute.begin(), out.compute.end(), c) == out.compute.end()) out.loader.push_back(c);
    if (out.compute.empty()) {
      out.note = "the device computes off the host: the loader has every CPU";
    } else if (out.loader.empty()) {
      out.loader = all;  // no CPU left: they must share
      out.note = fmt::format("compute_threads takes all {} CPU(s): the compute and the loader share them",
                             all.size());
    } else {
      out.note = fmt::format("{} CPU(s) pinned to the compute, {} to the loader", out.compute.size(),
                             out.loader.size());
    }
    return out;
  }
  static bool steps_ok(const Point& p) { return p.info.value("steps", 0) > 0; }

  // Sizes the step's GEMM chain once per run: reps of one GEMM whose time is
  // measured here, so the step takes about step_ms on this device.
  void calibrate(double step_ms, std::size_t compute_cpus) {
    if (op_ && step_ms == calibrated_for_ && compute_cpus == calibrated_cpus_) return;
    Device& dev = ctx_.device;
    kernel_ = step_kernel(dev);
    ctx_.progress("dataloader: calibrating the step");
    op_ = dev.make_gemm({kernel_.n, kernel_.n, kernel_.n}, kernel_.dtype, 3);
    MeasureConfig mc = quick_measure_config();
    mc.sync_timeout = ctx_.measure.sync_timeout;
    const double gemm_ms = measure(dev, [&] { op_->enqueue(); }, mc).ms.median;
    reps_ = std::max(1, int(std::lround(step_ms / gemm_ms)));
    // Then the chain itself, back to back as the loop enqueues it (caches,
    // clocks and the OpenMP team behave differently from one GEMM alone),
    // and the count corrected once by what it took.
    const double chain_ms = measure(dev, [&] { for (int r = 0; r < reps_; ++r) op_->enqueue(); }, mc).ms.median;
    const double per_gemm_ms = chain_ms / reps_;
    reps_ = std::max(1, int(std::lround(step_ms / per_gemm_ms)));
    (void)loader::decode_iters_per_us();  // its one-time calibration stays out of the measured window
    step_s_ = reps_ * per_gemm_ms / 1e3;
    calibrated_for_ = step_ms;
    calibrated_cpus_ = compute_cpus;
  }

  RunContext& ctx_;
  StepKernel kernel_{};
  std::unique_ptr<GemmOp> op_;
  int reps_ = 1;
  double step_s_ = 0;
  double calibrated_for_ = -1;
  std::size_t calibrated_cpus_ = 0;
  bool split_ = false;  // the compute was pinned: unpinned when the run ends
};

}  // namespace

// A fault at a sample the epoch never reaches would never fire, and the run
// would say nothing of it.
void validate_dataloader_point(const ParamSet& ps, const RunContext&) {
  const Settings st = Settings::from(ps);
  // source=file writes under TMPDIR: a missing one is bad input, found now.
  if (st.loader.source == loader::Source::file) (void)loader::dataset_cache_dir();
  const loader::Fault f = st.loader.fault;
  const std::int64_t samples = st.samples();
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
                  .help = "prefetch_factor: prefetch x workers batches in flight, the one the loop holds apart", .unit = "batches", .min = 1, .max = 64},
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
        ParamSpec{.name = "compute_threads", .type = ParamType::integer, .default_value = "0",
                  .help = "cpu device: CPUs pinned to its compute (0: half of them, at least 1); the loader gets "
                          "the rest. Other devices compute off the host.",
                  .unit = "threads", .min = 0, .max = 1024},
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
                  .help = "loader timeout: the longest the loop waits for any batch to arrive (DataLoader timeout)", .unit = "s",
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
