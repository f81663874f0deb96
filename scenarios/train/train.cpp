// train: the training loop end to end (definitions in train.hpp).
#include "scenarios/train/train.hpp"

#include <algorithm>  // std::min, std::max
#include <chrono>     // std::chrono
#include <cmath>      // std::isfinite
#include <map>        // std::map
#include <memory>     // std::unique_ptr
#include <optional>   // std::optional
#include <set>        // std::set

#include <fmt/format.h>  // fmt::format

#include "harness/cpu_affinity.hpp"       // allowed_cpus: the loader keeps off the compute's CPUs
#include "harness/errors.hpp"             // UsageError
#include "harness/host_cpus.hpp"          // HostCpuForHost
#include "harness/host_memory.hpp"        // reserve_host_memory
#include "harness/point_metrics.hpp"      // pattern_info, pattern_text
#include "harness/printer.hpp"            // format_number
#include "harness/sampler.hpp"            // Sampler, classify, sparkline
#include "harness/scenario.hpp"           // Scenario, ScenarioRun
#include "workloads/decoder.hpp"    // DecoderStep, decoder_config, spin_for
#include "workloads/loader.hpp"  // Loader
#include "workloads/packers.hpp"  // plan, generate_lengths

namespace sb {
namespace train {

using json = nlohmann::ordered_json;

Point derive(const Record& r) {
  Point p;
  const double W = r.wall_s > 0 ? r.wall_s : 1e-12;
  const bool epoch = r.epoch_computed_tokens > 0;
  const double computed_tps = double(r.computed_tokens) / W;
  const double timed_share = r.computed_tokens > 0 ? double(r.real_tokens) / double(r.computed_tokens) : 0.0;
  const double share = epoch ? double(r.epoch_real_tokens) / double(r.epoch_computed_tokens) : timed_share;
  p.add({"real_tokens_per_s", computed_tps * share, "tokens/s", Direction::higher, std::nullopt,
         epoch ? "real (non-pad) tokens trained per second: computed tokens/s measured over the timed steps x the "
                 "epoch's real share (every batch of the dataset as collated): the loop's throughput"
               : "real (non-pad) tokens trained per second over the timed steps: the loop's throughput"});
  p.add({"tokens_per_s", computed_tps, "tokens/s", Direction::higher, std::nullopt,
         "computed tokens (padding included) per second"});
  p.add({"padding_pct", 100.0 * (1.0 - share), "%", Direction::lower, std::nullopt,
         epoch ? "1 - real tokens / computed tokens over the epoch's batches" : "1 - real tokens / computed tokens"});
  if (epoch) {
    p.add({"timed_real_tokens_per_s", double(r.real_tokens) / W, "tokens/s", Direction::higher, std::nullopt,
           "real tokens of the timed batches themselves per second (their own real share: noisy over a few "
           "batches of varied lengths)",
           false});
    p.add({"timed_padding_pct", 100.0 * (1.0 - timed_share), "%", Direction::lower, std::nullopt,
           "1 - real tokens / computed tokens of the timed batches", false});
  }
  p.add({"step_ms", r.steps > 0 ? 1e3 * W / double(r.steps) : 0.0, "ms", Direction::lower, std::nullopt,
         "wall time per optimizer step"});
  p.add({"busy_pct", 100.0 * r.busy_frac, "%", Direction::higher, std::nullopt,
         "device busy time over the wall time of the timed steps"});
  p.add({"data_wait_pct", 100.0 * r.data_wait_s / W, "%", Direction::lower, std::nullopt,
         "host time blocked waiting for the loader's next batch, over the wall time"});
  // The queueing model beside the measurement: a device needing train_s per
  // batch and a loader needing load_s of CPU per batch. Inline (workers=0)
  // the loop loads, then trains, then synchronizes: busy = train / (train +
  // load). With workers, loading overlaps the step: busy = min(1, w * train /
  // load), w the workers that have a CPU of their own.
  const double train_s = r.batches > 0 ? r.busy_frac * W / double(r.batches) : 0;
  const double load_s = r.loads > 0 ? r.load_cpu_s / double(r.loads) : 0;
  double model = 1;
  if (r.workers == 0)
    model = train_s + load_s > 0 ? train_s / (train_s + load_s) : 1;
  else
    model = loader::predicted_busy(r.workers, train_s, load_s, r.loader_cpus);
  p.add({"load_ms_per_batch", 1e3 * load_s, "ms", Direction::lower, std::nullopt,
         "the loader's CPU time per micro batch (its own records): the assumed work per token times the batch's "
         "real tokens"});
  p.add({"device_ms_per_batch", 1e3 * train_s, "ms", Direction::lower, std::nullopt,
         "device busy time per micro batch"});
  p.add({"model_busy_pct", 100.0 * model, "%", Direction::none, std::nullopt,
         "the queueing model's busy share from the two figures above (inline: train / (train + load); workers: "
         "min(1, w x train / load))",
         false});
  p.info = pattern_info(r.util, r.busy_frac);
  p.info.update(json{{"sparkline", sparkline(r.util)},
                {"bottleneck", r.workers == 0 ? (load_s > 0.1 * train_s ? "loader (inline, in series with the step)"
                                                                          : "device")
                                              : loader::bottleneck(r.workers, train_s, load_s, r.loader_cpus)},
                {"real_tokens", r.real_tokens},
                {"computed_tokens", r.computed_tokens},
                {"steps", r.steps},
                {"batches", r.batches}});
  return p;
}

}  // namespace train

namespace {

using json = nlohmann::ordered_json;
using clk = std::chrono::steady_clock;
namespace pk = packing;
using namespace batch;

enum class Collate { pad_max, pad_longest, pack };
inline constexpr NameTable<Collate, 3> kCollateNames{
    {{{Collate::pad_max, "pad-max"}, {Collate::pad_longest, "pad-longest"}, {Collate::pack, "pack"}}}};
enum class Pin { pinned, pageable };
inline constexpr NameTable<Pin, 2> kPinNames{{{{Pin::pinned, "pinned"}, {Pin::pageable, "pageable"}}}};

// The bytes a row carries to the device: input_ids, attention_mask and labels, int64 each.
constexpr std::int64_t kBytesPerToken = 24;
// The most timed optimizer steps min_time_s adds up to.
constexpr std::int64_t kMostTimedSteps = 2000;

// Everything a point is, read once from its parameters (validate uses it too).
struct Settings {
  Collate collate = Collate::pad_longest;
  std::string lengths;
  std::int64_t sequences = 0, pad_multiple = 0;
  int grad_accum = 1, workers = 0, prefetch = 2, trials = 0;
  Pin pin = Pin::pinned;
  double load_us_per_token = 0, dispatch_us = 0, min_time_s = 0;

  static Settings from(const ParamSet& ps) {
    Settings st;
    st.collate = ps.get_choice("collate", kCollateNames);
    st.lengths = ps.get_str("lengths");
    st.sequences = ps.get_int("sequences");
    st.pad_multiple = ps.get_int("pad_multiple");
    st.grad_accum = int(ps.get_int("grad_accum"));
    st.workers = int(ps.get_int("workers"));
    st.prefetch = int(ps.get_int("prefetch"));
    st.pin = ps.get_choice("pin", kPinNames);
    st.load_us_per_token = ps.get_real("load_us_per_token");
    st.dispatch_us = ps.get_real("dispatch_us");
    st.trials = int(ps.get_int("trials"));
    st.min_time_s = ps.get_real("min_time_s");
    return st;
  }
};

class TrainRun : public ScenarioRun {
 public:
  explicit TrainRun(RunContext& ctx) : ctx_(ctx) {}

  Point run_point(const ParamSet& ps) override {
    Device& dev = ctx_.device;
    const Settings st = Settings::from(ps);
    const DecoderConfig base = decoder_config(ps, dev);
    const std::int64_t mb = base.micro_batch, max_len = base.seq;

    // ---- configure: the dataset, its plan, the batches' padded lengths
    const std::vector<std::int32_t>& lengths = dataset_.get(st.lengths, st.sequences, std::int32_t(max_len));
    const pk::Strategy strategy = st.collate == Collate::pack        ? pk::Strategy::pack_bfd
                                  : st.collate == Collate::pad_max   ? pk::Strategy::pad_max
                                                                     : pk::Strategy::pad_longest;
    const pk::Plan plan = pk::plan(lengths, strategy, std::int32_t(max_len), std::int32_t(mb), 1, pk::Overflow::split);
    const std::int64_t n_batches = plan.row_count() / mb;
    if (n_batches < 1)
      throw UsageError(fmt::format("train: the dataset makes {} rows, fewer than one micro batch of {}: raise "
                                   "sequences or lower micro_batch",
                                   plan.row_count(), mb));
    std::vector<std::int64_t> row_real(static_cast<std::size_t>(n_batches * mb), 0);
    std::vector<std::int64_t> batch_len(static_cast<std::size_t>(n_batches), 0);
    std::vector<std::int64_t> batch_real(static_cast<std::size_t>(n_batches), 0);
    for (std::int64_t b = 0; b < n_batches; ++b) {
      std::int64_t longest = 0;
      for (std::int64_t r = b * mb; r < (b + 1) * mb; ++r) {
        const pk::Row row = plan.row(r);
        row_real[std::size_t(r)] = row.used;
        batch_real[std::size_t(b)] += row.used;
        longest = std::max<std::int64_t>(longest, plan.computed(r));
      }
      const std::int64_t m = st.pad_multiple;
      batch_len[std::size_t(b)] =
          st.collate == Collate::pad_longest ? std::min(max_len, std::max<std::int64_t>(m, (longest + m - 1) / m * m))
                                             : max_len;
    }
    // Untimed: the first batches, which the workers load at once while the
    // loop waits for the first (a head start a longer run amortizes): the
    // optimizer steps that hold workers + 1 micro batches (at grad_accum 8,
    // one step, not workers + 1 steps of 8). Inline (workers 0) there is no
    // head start: the warm-up below runs each shape and the optimizer once,
    // and the first step is timed (each of diagnose's 72 runs spent 0.46 s
    // untimed with the untimed step of 8 micro batches, 0.18 s without).
    const int skip = st.workers == 0 ? 0 : (st.workers + 1 + st.grad_accum - 1) / st.grad_accum;
    // `trials` timed steps, then more while the timed wall is under
    // min_time_s (a fast configuration measured over as long as a slow one),
    // at most kMostTimedSteps.
    const std::int64_t most_steps = st.min_time_s > 0 ? std::max<std::int64_t>(st.trials, kMostTimedSteps) : st.trials;
    const std::int64_t total = std::int64_t(skip + most_steps) * st.grad_accum;
    // The timed steps train the dataset's first batches whatever the warm-up
    // (which takes the last ones, wrapping): every configuration of one
    // collation and micro batch times the same batches. Timed from the first
    // batch after a warm-up of workers + 1, two runs that differ only in
    // workers timed different sequences: at micro batch 1, five lognormal
    // lengths, 0.70x real tokens/s between runs of the same speed.
    const std::int64_t warm = std::int64_t(skip) * st.grad_accum;
    auto batch_of = [n_batches, warm](std::int64_t i) {
      return std::size_t(((i - warm) % n_batches + n_batches) % n_batches);
    };
    std::int64_t epoch_real = 0, epoch_computed = 0;  // the whole dataset's batches, as the plan collates them
    for (std::int64_t b = 0; b < n_batches; ++b)
      epoch_real += batch_real[std::size_t(b)], epoch_computed += mb * batch_len[std::size_t(b)];

    const HostCpuForHost host_cpu(dev);  // the host thread keeps a CPU of its own
    std::vector<int> loader_cpus;
    if (!host_cpu.compute_cpus().empty()) {
      const std::set<int> compute(host_cpu.compute_cpus().begin(), host_cpu.compute_cpus().end());
      for (int c : allowed_cpus())
        if (!compute.count(c)) loader_cpus.push_back(c);
    }

    // One decoder step per padded length met, every one training the first's parameters.
    auto ops = dev.make_train_ops();
    bool timing = false;
    std::int64_t timed_subs = 0;
    auto before = [&] {
      spin_for(st.dispatch_us);
      if (timing) ++timed_subs;
    };
    std::set<std::int64_t> needed;
    for (std::int64_t i = 0; i < total; ++i) needed.insert(batch_len[batch_of(i)]);
    std::map<std::int64_t, std::unique_ptr<DecoderStep>> steps;  // declared after `ops`: destroyed first
    DecoderStep* owner = nullptr;
    ctx_.progress(fmt::format("train: {} decoder step(s), padded lengths {}..{}", needed.size(), *needed.begin(),
                              *needed.rbegin()));
    for (auto it = needed.rbegin(); it != needed.rend(); ++it) {  // the longest owns the parameters
      DecoderConfig c = base;
      c.seq = *it;
      auto s = std::make_unique<DecoderStep>(dev, *ops, c, 7, before, owner);
      if (!owner) owner = s.get();
      steps[*it] = std::move(s);
    }
    owner->prepare_optimizer(OptKind::adamw);
    for (auto& [len, s] : steps) {  // warm-up: each shape once (attention plans, primitive caches)
      s->prepare_optimizer(OptKind::adamw);
      s->micro_step(1.0f);
    }
    owner->optimizer(OptKind::adamw, 1e-4f, 1);  // and the optimizer once (its kernels, its state's pages)
    owner->zero_grad();
    dev.synchronize(ctx_.measure.sync_timeout);

    // The device's copy of a batch: its rows at their padded length.
    Buffer dev_batch = dev.allocate(std::size_t(mb * max_len * kBytesPerToken), MemKind::device);
    const bool pinned = st.pin == Pin::pinned;
    loader::Config lc;
    lc.workers = st.workers;
    lc.prefetch = st.prefetch;
    lc.batch = int(mb);
    lc.sample_bytes = std::size_t(max_len * kBytesPerToken);
    lc.num_batches = total;
    lc.cpus = loader_cpus;
    lc.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(ctx_.measure.sync_timeout);
    const double us_per_token = st.load_us_per_token;
    lc.sample_us = [&row_real, &batch_of, us_per_token, mb](std::int64_t s) {  // the loader's sample s: a row of batch_of(s / mb)
      return us_per_token * double(row_real[batch_of(s / mb) * std::size_t(mb) + std::size_t(s % mb)]);
    };
    lc.alloc = [&dev, pinned](std::size_t bytes) {
      return dev.allocate(bytes, pinned ? MemKind::host_pinned : MemKind::host_pageable);
    };
    lc.on_load = [&dev](bool begin) {
      if (begin)
        dev.range_push("load");
      else
        dev.range_pop();
    };
    const HostReservation slots = reserve_host_memory(
        // as many as the loader makes: prefetch x workers shared, + 1 for the batch the loop holds; 1 inline
        std::uint64_t(st.workers > 0 ? st.workers * st.prefetch + 1 : 1) * std::uint64_t(mb * max_len * kBytesPerToken),
        "train: the loader's staging slots");

    // ---- the timed window: records only
    train::Record rec;
    rec.workers = st.workers;
    rec.loader_cpus = int(loader_cpus.size());
    rec.epoch_real_tokens = epoch_real;
    rec.epoch_computed_tokens = epoch_computed;
    auto busy = dev.utilization_probe();
    Sampler sampler(dev.utilization_probe());
    const std::string where = fmt::format("train collate={} workers={} micro_batch={} dtype={} attn={}",
                                          ps.get_str("collate"), st.workers, mb, ps.get_str("dtype"),
                                          ps.get_str("attn"));
    ctx_.progress(where + ": timing");
    const char* next_name = st.workers == 0 ? "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
                                            : "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__";
    std::size_t loads_before = 0;
    clk::time_point w0{};
    {
      loader::Loader L(lc);
      int opt_step = 0;
      for (std::int64_t i = 0, step_no = 0; i < total; ++step_no) {
        if (timing && rec.steps >= st.trials &&
            std::chrono::duration<double>(clk::now() - w0).count() >= st.min_time_s)
          break;
        if (step_no == skip) {  // the timed steps start
          timing = true;
          loads_before = L.records().size();
          sampler.start();
          if (busy) (void)busy->sample();
          w0 = clk::now();
        }
        const std::string step_name = fmt::format("ProfilerStep#{}", step_no);
        dev.range_push(step_name.c_str());
        owner->zero_grad();
        for (int a = 0; a < st.grad_accum; ++a, ++i) {
          const auto n0 = clk::now();
          dev.range_push(next_name);
          std::optional<loader::Batch> b = L.next();
          dev.range_pop();
          if (timing) rec.data_wait_s += std::chrono::duration<double>(clk::now() - n0).count();
          if (!b) throw Error(ErrorKind::runtime, "train: the loader ended before the timed steps did");
          const std::size_t bi = batch_of(b->index);
          const std::int64_t len = batch_len[bi];
          dev.copy_h2d_from(dev_batch, b->data, std::size_t(mb * len * kBytesPerToken),
                            pinned ? MemKind::host_pinned : MemKind::host_pageable);
          EventPtr copied = dev.record();
          steps.at(len)->micro_step(1.0f / float(st.grad_accum));
          // the staging slot is free once its copy is done (the device may still be computing)
          dev.wait_event(copied, ctx_.measure.sync_timeout);
          L.release(*b);
          if (timing) {
            ++rec.batches;
            rec.real_tokens += batch_real[bi];
            rec.computed_tokens += mb * len;
          }
        }
        owner->optimizer(OptKind::adamw, 1e-4f, ++opt_step);
        dev.synchronize(ctx_.measure.sync_timeout);  // loss.item() at each step
        dev.range_pop();
        if (timing) ++rec.steps;
        ctx_.progress(where);
      }
      rec.wall_s = std::chrono::duration<double>(clk::now() - w0).count();
      rec.busy_frac = busy ? busy->sample().util : 0;
      sampler.stop();
      timing = false;
      const std::vector<loader::LoadRecord> loads = L.records();
      for (std::size_t k = loads_before; k < loads.size(); ++k) rec.load_cpu_s += loads[k].cpu_s, ++rec.loads;
    }
    for (const auto& s : sampler.series()) rec.util.push_back(s.s.util);

    Point p = train::derive(rec);
    p.info["padded_lengths"] = json(std::vector<std::int64_t>(needed.begin(), needed.end()));
    p.info["loader_cpus"] = loader_cpus;
    host_cpu.record(p);
    p.info["util_source"] = sampler.source();
    p.info["submissions"] = timed_subs;
    p.info["attention"] = std::string(to_string(base.attention));
    p.info["parameters"] = owner->parameters();
    p.info["plan"] = json{{"rows", plan.row_count()},
                          {"batches", n_batches},
                          {"padding_fraction", plan.padding_fraction()},
                          {"split_sequences", plan.split_sequences},
                          {"clipped_sequences", dataset_.clipped()},  // over 4 x max_len: clipped to it first
                          // two figures, two definitions: a reader saw 0.5164 here beside padding_pct 61.65
                          {"note", "padding_fraction is the packer's plan: every row padded to its longest "
                                   "sequence, the last partial batch included, before rounding to pad_multiple; "
                                   "the padding_pct metric is what the loop computed (rows rounded up to "
                                   "pad_multiple), over the epoch's batches run"}};
    p.info["assumptions"] = json::array(
        {fmt::format("the loader's work: {} us of CPU per real token (tokenizing, collating), an assumption about "
                     "your loader, not a measurement of it",
                     format_number(st.load_us_per_token)),
         fmt::format("the framework's dispatch: {} us of host CPU per submission (PyTorch eager: 5-20 us per op)",
                     format_number(st.dispatch_us)),
         "the decoder's attention runs causally over each whole row: packed rows' attention is not cut at their "
         "sequences' boundaries (varlen attention would cost less), so packing's gain here is a lower bound",
         "the batch's token ids are copied to the device (24 bytes a token); the step's inputs are a stand-in"});
    return p;
  }

  void analyze(Result& res) override {
    // Each axis swept: its first value against each other, every other parameter equal.
    // Axes of the workload only: trials and min_time_s steer the measurement (measurement_params).
    auto text = [](const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
    std::vector<json> wp;
    for (const Point& p : res.points) wp.push_back(workload_params(res, p.params));
    std::map<std::string, std::set<std::string>> seen;
    for (const json& w : wp)
      for (const auto& [k, v] : w.items()) seen[k].insert(text(v));
    for (const auto& [axis, values] : seen) {
      if (values.size() < 2) continue;
      for (std::size_t i = 0; i < res.points.size(); ++i) {
        const Point& a = res.points[i];
        if (a.status != Status::ok || !a.metric("real_tokens_per_s")) continue;
        if (text(wp[i][axis]) != text(wp.front()[axis])) continue;
        for (std::size_t k = 0; k < res.points.size(); ++k) {
          const Point& b = res.points[k];
          if (k == i || b.status != Status::ok || !b.metric("real_tokens_per_s")) continue;
          json other_a = wp[i], other_b = wp[k];
          other_a.erase(axis), other_b.erase(axis);
          if (text(wp[k][axis]) == text(wp[i][axis]) || other_a != other_b) continue;
          const double x = a.metric("real_tokens_per_s")->value, y = b.metric("real_tokens_per_s")->value;
          res.findings.push_back(
              {{},
               fmt::format("{} {} -> {}: {:.2f}x real tokens/s on the whole loop ({} -> {}; busy {:.0f}% ({}) -> "
                           "{:.0f}% ({}), data wait {:.0f}% -> {:.0f}%)",
                           axis, text(a.params[axis]), text(b.params[axis]), x > 0 ? y / x : 0, format_number(x),
                           format_number(y), a.metric("busy_pct")->value, pattern_text(a),
                           b.metric("busy_pct")->value, pattern_text(b),
                           a.metric("data_wait_pct")->value, b.metric("data_wait_pct")->value),
               x > 0 ? std::optional<double>(y / x) : std::nullopt,
               json{{"axis", axis}, {"from", a.params[axis]}, {"to", b.params[axis]}}});
        }
      }
    }
  }

 private:
  RunContext& ctx_;
  // the points of a sweep train one dataset; about 80 B a sequence: its length and its share of the plan
  pk::DatasetLengths dataset_{"train", 80};
};

}  // namespace

extern const Scenario train_scenario;
const Scenario train_scenario{
    "train",
    "every step-level cause in one training loop (loader, padding, dtype, attention, micro batch)",
    "the training loop end to end: loader -> collate (padded or packed) -> copy -> decoder step: real tokens/s",
    {
        ParamSpec{.name = "collate", .type = ParamType::choice, .default_value = "pad-longest,pack",
                  .help = "pad-longest: each batch padded to its longest row (rounded to pad_multiple); pad-max: to "
                          "seq_len (pad_to_sequence_len); pack: best-fit-decreasing into seq_len rows "
                          "(sample_packing)",
                  .choices = kCollateNames.names()},
        ParamSpec{.name = "lengths", .type = ParamType::text, .default_value = "lognormal:64,1.0",
                  .help = "the dataset's sequence lengths: fixed:N | uniform:LO,HI | lognormal:MEAN,SIGMA | @FILE "
                          "(lengths, or CSV length,count)",
                  .gpu_default = "lognormal:256,1.0",
                  .check = [](const std::string& t) { (void)packing::parse_lengths(t); }},
        ParamSpec{.name = "sequences", .type = ParamType::integer, .default_value = "2048",
                  .help = "examples in the dataset (for @FILE: 0 = all); the loop cycles through its batches",
                  .unit = "sequences", .min = 0, .max = 1 << 26, .quick_default = "512"},
        ParamSpec{.name = "seq_len", .type = ParamType::integer, .default_value = "256",
                  .help = "max_len: the trainer's sequence_len (the longest a row holds)", .unit = "tokens", .min = 8,
                  .max = 1 << 20, .gpu_default = "1024"},
        ParamSpec{.name = "micro_batch", .type = ParamType::integer, .default_value = "4",
                  .help = "rows per micro step (micro_batch_size)", .unit = "rows", .min = 1, .max = 4096},
        ParamSpec{.name = "grad_accum", .type = ParamType::integer, .default_value = "1",
                  .help = "micro steps per optimizer step (gradient_accumulation_steps)", .unit = "steps", .min = 1,
                  .max = 1024},
        ParamSpec{.name = "pad_multiple", .type = ParamType::integer, .default_value = "64",
                  .help = "pad-longest: padded lengths rounded up to this (the collator's pad_to_multiple_of; "
                          "Axolotl's trainer sets 64)",
                  .unit = "tokens", .min = 1, .max = 1 << 20},
        batch::d_model_param("64", "1024"),
        batch::heads_param("2", "16"),
        batch::d_ff_param(),
        batch::kv_heads_param(),
        batch::layers_param("2"),
        batch::dtype_param("compute dtype (autocast; fp32 masters and gradients)"),
        batch::attn_param(),
        ParamSpec{.name = "workers", .type = ParamType::integer, .default_value = "0",
                  .help = "loader worker threads (dataloader_num_workers); 0 loads inline, in series with the step",
                  .unit = "threads", .min = 0, .max = 64},
        ParamSpec{.name = "prefetch", .type = ParamType::integer, .default_value = "2",
                  .help = "dataloader_prefetch_factor: prefetch x workers batches in flight", .unit = "batches", .min = 1,
                  .max = 64},
        ParamSpec{.name = "pin", .type = ParamType::choice, .default_value = "pinned",
                  .help = "host staging memory (dataloader_pin_memory): pinned or pageable",
                  .choices = kPinNames.names()},
        ParamSpec{.name = "load_us_per_token", .type = ParamType::real, .default_value = "2",
                  .help = "the loader's CPU work per real token (real work, not sleep): an assumption about the "
                          "loader",
                  .unit = "us", .min = 0, .max = 1e6},
        batch::dispatch_us_param(),
        trials_param("12", "6"),
        ParamSpec{.name = "min_time_s", .type = ParamType::real, .default_value = "0",
                  .help = "after `trials` timed steps, more until the timed steps span this long (at most 2000): a "
                          "fast configuration measured over as long as a slow one",
                  .unit = "s", .min = 0, .max = 3600, .workload = false},
    },
    [](RunContext& ctx) { return std::make_unique<TrainRun>(ctx); },
    false,
    [](const ParamSet& ps, const RunContext&) {
      batch::validate_decoder_shape(ps);
      // as packing: 0 means every length of a file, and a distribution has no "every"
      if (ps.get_int("sequences") == 0 && ps.get_str("lengths").rfind("@", 0) != 0)
        throw UsageError(fmt::format("sequences=0 means every length of a file; lengths={} generates lengths, so "
                                     "give sequences >= 1",
                                     ps.get_str("lengths")));
      // a sequence is at most 4 x seq_len (longer ones are clipped) and split into seq_len pieces, a row
      // each at most: a dataset of under a quarter as many sequences as a micro batch's rows can never
      // fill one (a file's count is known only once read)
      if (ps.get_int("sequences") > 0 && 4 * ps.get_int("sequences") < ps.get_int("micro_batch") &&
          ps.get_str("lengths").rfind("@", 0) != 0)
        throw UsageError(fmt::format("sequences={} cannot fill one micro batch of {} rows: raise sequences or lower "
                                     "micro_batch",
                                     ps.get_int("sequences"), ps.get_int("micro_batch")));
    }};

}  // namespace sb
