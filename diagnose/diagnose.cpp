// diagnose (equations and order in diagnose.hpp).
#include "diagnose/diagnose.hpp"

#include "diagnose/offload.hpp"  // offload_finding
#include "diagnose/plan.hpp"     // skipped_by_config

#include <algorithm>  // std::sort, std::min, std::max
#include <chrono>     // std::chrono
#include <cmath>      // std::llround
#include <sstream>    // std::ostringstream

#include <map>
#include <functional>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join

#include "harness/errors.hpp"           // UsageError
#include "harness/host_load.hpp"        // read_cpu_ticks, host_load: what else ran while a check measured
#include "harness/host_memory.hpp"      // read_host_memory: a cpu device's capacity
#include "harness/printer.hpp"          // format_number
#include "harness/runner.hpp"           // run_scenario
#include "scenarios/registry.hpp"  // find_scenario, all_scenarios
#include "harness/stats.hpp"            // summarize: a pass's median over its rounds
#include "harness/units.hpp"            // format_bytes
#include "workloads/decoder.hpp"  // predict_footprint

namespace sb::diagnose {
namespace {

using json = nlohmann::ordered_json;
using clk = std::chrono::steady_clock;

// A fix is named when it measured at least this gain: below it, a short
// run's noise on a shared machine can make one up.
constexpr double kMinGain = 1.10;
// The loader's assumed cost in their training loop (the applied check): a
// batch takes the loader this share of the device time of the loop with
// every other line applied. Inline (num_workers 0) that is in series with
// the step; with workers, beside it.
constexpr double kLoadShare = 0.5;
// Their collator's pad_to_multiple_of without packing (Axolotl's trainer sets 64): the padding check and
// their loop both pad each batch to its longest rounded up to it (the loop at loop_pad_multiple's scaled
// multiple where it draws generated lengths at a reduced sequence).
constexpr int kPadMultiple = 64;
// Rounds of the applied check's runs in each of its two passes: a pass's gain
// for a line is the median of its rounds' gains (see applied()).
constexpr int kRounds = 3;
// A run of their loop during which the hypervisor took this share of the
// machine (steal, /proc/stat) or more is run again (see applied()); the same
// 10% over which a run's table notes the steal.
constexpr double kStealRetryPct = 10;

std::string dtype_name(const TrainConfig& c) { return c.bf16 ? "bf16" : c.fp16 ? "fp16" : "fp32"; }

const Metric* metric(const Point& p, const std::string& name) { return p.metric(name); }

// One sub-run: a scenario at the given parameters, with the command that reproduces it.
struct Sub {
  Result r;
  std::string command;
  bool ok() const {
    if (r.points.empty()) return false;
    for (const Point& p : r.points)
      if (p.status != Status::ok) return false;
    return true;
  }
  const Point* point(const std::string& key, const std::string& value) const {
    for (const Point& p : r.points)
      if (p.params.contains(key) && p.params[key].is_string() && p.params[key].get<std::string>() == value) return &p;
    return nullptr;
  }
  const Point* point_int(const std::string& key, std::int64_t value) const {
    for (const Point& p : r.points)
      if (p.params.contains(key) && p.params[key].is_number_integer() && p.params[key].get<std::int64_t>() == value)
        return &p;
    return nullptr;
  }
};

class Diagnosis {
 public:
  Diagnosis(RunContext& ctx, const Options& opt, const json& meta)
      : ctx_(ctx), opt_(opt), meta_(meta), shape_(measured_shape(opt.cfg, ctx.device.info())), t0_(clk::now()) {}

  Result run() {
    Result res;
    res.scenario = "diagnose";
    res.meta = meta_;
    res.params = json::object();
    res.params["check"] =
        json::array({"utilization", "loader", "dtype", "padding", "attention", "batch", "memory", "applied"});
    const std::string dev = ctx_.device.info().id;
    res.meta["diagnose"] = json{{"config", to_json(opt_.cfg)},
                                {"measured_shape", json{{"micro_batch", shape_.micro_batch},
                                                        {"seq_len", shape_.seq},
                                                        {"hidden", shape_.hidden},
                                                        {"intermediate", shape_.intermediate},
                                                        {"gated_mlp", shape_.gated},
                                                        {"d_ff", shape_.ffn},
                                                        {"heads", shape_.heads},
                                                        {"kv_heads", shape_.kv_heads},
                                                        {"layers", 2},
                                                        {"reduced", shape_.reduced},
                                                        {"note", shape_.note}}}};
    checks_ = 8;
    // The checks in the standard order; each one's wall seconds in its point, the whole run's in meta: what
    // --budget bought, measured.
    for (Point (Diagnosis::*check)() : {&Diagnosis::utilization, &Diagnosis::loader, &Diagnosis::dtype,
                                         &Diagnosis::padding, &Diagnosis::attention, &Diagnosis::batch,
                                         &Diagnosis::memory, &Diagnosis::applied}) {
      const auto from = clk::now();
      const CpuTicks ticks = read_cpu_ticks();
      const std::size_t found_before = found_.size();
      Point p = (this->*check)();
      if (!p.info.is_object()) p.info = json::object();
      p.info["wall_s"] = std::chrono::duration<double>(clk::now() - from).count();
      judge_host_load(p, ticks, found_before);
      res.points.push_back(std::move(p));
    }
    res.points.push_back(summary());
    res.meta["diagnose"]["wall_s"] = std::chrono::duration<double>(clk::now() - t0_).count();
    if (const auto load = host_load(run_ticks_, read_cpu_ticks()))
      res.meta["diagnose"]["host_cpu"] = json{{"other_pct", load->other_pct}, {"steal_pct", load->steal_pct},
                                              {"window_s", load->window_s}};
    if (!busy_checks_.empty()) res.meta["diagnose"]["busy_checks"] = busy_checks_;
    // findings, ranked by what their loop showed (confirmed first), then by measured gain
    std::stable_sort(found_.begin(), found_.end(), [](const Finding& a, const Finding& b) {
      const int ra = verdict_rank(a), rb = verdict_rank(b);
      return ra != rb ? ra < rb : a.speedup.value_or(0) > b.speedup.value_or(0);
    });
    res.findings = found_;
    if (res.findings.empty())
      res.findings.push_back({"none found",
                              "none of the checked causes costs this config measurable throughput on this device "
                              "(each check's evidence is in its point)",
                              std::nullopt, json::object()});
    if (ctx_.device.info().simulated)
      for (Finding& f : res.findings) f.summary += " [simulated, not measured]";
    return res;
  }

 private:
  // What else the machine ran while a check measured (/proc/stat over the check's whole wall: a --quick
  // point is too short for the runner's own reading, which needs 0.1 s). With a second diagnose on the
  // other vCPU, fp32 and bf16 GEMMs read 0.017 TFLOP/s alike (0.35 and 2.2 alone) and the report said
  // "bf16 is not faster than fp32 on this device" without a word of the other process. A check over the
  // runner's thresholds (other processes 25%, steal 10%) carries a warning, its findings a caveat, and
  // the report names it.
  CpuTicks run_ticks_ = read_cpu_ticks();
  json busy_checks_ = json::array();
  void judge_host_load(Point& p, const CpuTicks& before, std::size_t found_before) {
    const auto load = host_load(before, read_cpu_ticks());
    if (!load) return;
    p.info["host_cpu"] = json{{"other_pct", load->other_pct}, {"steal_pct", load->steal_pct},
                              {"window_s", load->window_s}};
    if (load->other_pct < kOtherWarnPct && load->steal_pct < kStealWarnPct) return;
    const std::string name = p.params.value("check", std::string());
    const std::string w = fmt::format(
        "while this check ran, {}: its figures may be wrong; run diagnose again on a quiet machine",
        load->other_pct >= kOtherWarnPct
            ? fmt::format("other processes took {:.0f}% of this machine's CPUs{}", load->other_pct,
                          load->steal_pct >= kStealWarnPct
                              ? fmt::format(" and the hypervisor {:.0f}% of them (steal)", load->steal_pct)
                              : "")
            : fmt::format("the hypervisor took {:.0f}% of this machine's CPUs (steal)", load->steal_pct));
    add_warning(p, w);
    busy_checks_.push_back(json{{"check", name}, {"other_pct", load->other_pct}, {"steal_pct", load->steal_pct}});
    for (std::size_t i = found_before; i < found_.size(); ++i) append_text(found_[i].evidence, "caveat", w);
  }

  // Runs a scenario with assignments; the command line that reproduces it.
  Sub sub(const std::string& scenario, std::vector<std::string> assigns) {
    const Scenario* sc = find_scenario(scenario);
    if (!sc) throw Error(ErrorKind::runtime, "diagnose: no scenario " + scenario);
    Sub s;
    std::string cmd = fmt::format("stallbench run {} --device {}", scenario, ctx_.device.info().id);
    if (opt_.quick) cmd += " --quick";
    for (const auto& a : assigns) cmd += " -p " + a;
    s.command = cmd;
    if (hung_) {  // a wedged stream: nothing more runs on it
      Point p;
      p.status = Status::skipped;
      p.reason = "not run: an earlier check hung (" + hung_what_ + ")";
      s.r.points.push_back(p);
      return s;
    }
    RunOptions ro{assigns, opt_.quick};
    try {
      s.r = run_scenario(*sc, ctx_, ro, meta_);
    } catch (const UsageError& e) {
      // the config was valid but this check's scenario cannot take a size from it (a GEMM over its
      // bound, too many workers): the check says so, the others run
      Point p;
      p.status = Status::skipped;
      p.reason = fmt::format("the {} scenario cannot run this shape: {}", scenario, e.what());
      s.r.points.push_back(p);
      return s;
    }
    finish_findings(s.r, *sc, ctx_.device.info().simulated);
    for (const Point& p : s.r.points)
      if (p.status == Status::hang) hung_ = true, hung_what_ = scenario + ": " + p.reason;
    return s;
  }

  void step(const std::string& what) {
    ++done_;
    const double so_far = std::chrono::duration<double>(clk::now() - t0_).count();
    // The checks before the last take about as long as each other; the last
    // (the applied runs of their loop) takes its --budget, whatever came before.
    const int measured = std::min(done_, checks_) - 1;  // checks finished, the applied one never among them
    const double per = measured > 0 ? so_far / double(measured) : 0;
    const double left = done_ > 1 ? per * double(std::max(0, checks_ - done_)) + opt_.budget_s : 0;
    opt_.say(fmt::format("diagnose [{}/{}] {} ({:.0f} s so far{})", done_, checks_, what, so_far,
                         done_ > 1 ? fmt::format(", about {:.0f} s left", left) : ""));
    ctx_.progress("diagnose: " + what);
  }

  Point check_point(const std::string& name) {
    Point p;
    p.params = json{{"check", name}};
    return p;
  }

  // A check whose cause the config itself excludes (plan.cpp's rule, the one --plan prints): its point,
  // skipped with the reason; nothing when the check runs.
  std::optional<Point> excluded(const std::string& name) {
    const auto why = skipped_by_config(name, opt_.cfg);
    if (!why) return std::nullopt;
    Point p = check_point(name);
    p.status = Status::skipped;
    p.reason = *why;
    return p;
  }

  // A sub-run's points, compact, for the evidence.
  static json compact(const Sub& s) {
    json pts = json::array();
    for (const Point& p : s.r.points) {
      json m = json::object();
      for (const Metric& x : p.metrics) m[x.name] = x.value;
      json q{{"params", p.params}, {"status", std::string(to_string(p.status))}, {"metrics", m}};
      json info = json::object();  // what a check reads besides the figures (batch: its limit)
      for (const char* k : {"pattern", "launch_bound"})
        if (p.info.contains(k)) info[k] = p.info[k];
      if (p.info.contains("host_cpu"))  // the hypervisor's share while it ran, and other processes'
        for (const char* k : {"steal_pct", "other_pct"})
          if (p.info["host_cpu"].contains(k)) info[k] = p.info["host_cpu"][k];
      if (!info.empty()) q["info"] = std::move(info);
      pts.push_back(std::move(q));
    }
    return json{{"command", s.command}, {"points", pts}};
  }

  // A two-way comparison (their setting against the fix) in kRounds rounds, the second with the two in the
  // other order: the gain is the median of the rounds' own ratios, and the Sub returned is the median
  // round's, so the figures a finding quotes divide to the gain it claims. One round of a few trials read
  // eager attention at 2.25 ms and then 3.96 ms in two diagnose runs (a 2-vCPU AMD EPYC, 2026-12-03;
  // 1.68-3.10 ms in six runs of its own), 0.89x and 1.52x against a steady fused kernel: the check named the
  // cause in one run and not the other. A round that fails is returned as it is (the caller's checks see it).
  // A first round long enough that three would pass 10 s (--quick) or 20 s is the only one: its trials are
  // long, so steady (eager attention at 2048 tokens, 0.7 s a call: three rounds of 10 trials took 30 s of a
  // 116 s --quick run).
  struct Paired {
    Sub s;
    json rounds = json::array();  // each round's gain, in order
    double first_s = 0;           // the first round's wall
    double most_s = 0;            // the wall three rounds may take
    bool one_round = false;       // the first round was too long for three
    int failed_round = 0;         // 1-based: the round that did not complete (its Sub is `s`), 0: none
    // the check's evidence: the quoted round's points, every round's gain, and how they were run
    json info() const {
      const std::string note =
          failed_round ? fmt::format("round {} of {} did not complete: its points are the evidence", failed_round,
                                     kRounds)
          : one_round ? fmt::format("the gain of one round only: it took {:.1f} s, and {} rounds would pass the "
                                    "{:.0f} s limit",
                                    first_s, kRounds, most_s)
                      : fmt::format("the gain in each of {} rounds (the second in the other order); the figures "
                                    "are the median round's",
                                    rounds.size());
      return json{{"sub", compact(s)}, {"rounds", rounds}, {"rounds_note", note}};
    }
    // why the check could not compare: the point of theirs or of the fix that did not run
    static std::string failed(const Point* theirs, const Point* fix, const std::string& theirs_name,
                              const std::string& otherwise) {
      if (fix && fix->status != Status::ok) return fix->reason;
      if (theirs && theirs->status != Status::ok) return theirs_name + ": " + theirs->reason;
      return otherwise;
    }
  };
  Paired paired(const std::string& scenario, const std::vector<std::string>& assigns, const std::string& key,
                const std::string& theirs, const std::string& fix, const std::string& figure, bool lower_is_better) {
    Paired out;
    out.most_s = opt_.quick ? 10.0 : 20.0;
    std::vector<std::pair<double, Sub>> got;
    for (int r = 0; r < kRounds; ++r) {
      if (r == 1 && double(kRounds) * out.first_s > out.most_s) {
        out.one_round = true;
        break;
      }
      auto a = assigns;
      a.push_back(key + "=" + (r % 2 ? fix + "," + theirs : theirs + "," + fix));
      const auto r0 = clk::now();
      Sub s = sub(scenario, a);
      if (r == 0) out.first_s = std::chrono::duration<double>(clk::now() - r0).count();
      const Point* x = s.point(key, theirs);
      const Point* y = s.point(key, fix);
      const Metric* mx = x && x->status == Status::ok ? x->metric(figure) : nullptr;
      const Metric* my = y && y->status == Status::ok ? y->metric(figure) : nullptr;
      if (!mx || !my || mx->value <= 0 || my->value <= 0) {
        out.s = std::move(s);
        out.failed_round = r + 1;
        return out;
      }
      const double g = lower_is_better ? mx->value / my->value : my->value / mx->value;
      out.rounds.push_back(g);
      got.emplace_back(g, std::move(s));
    }
    // the lower median (1 or 3 rounds run: the median); the command is that round's own, in its order
    std::stable_sort(got.begin(), got.end(), [](const auto& l, const auto& r) { return l.first < r.first; });
    out.s = std::move(got[(got.size() - 1) / 2].second);
    return out;
  }
  void add_gain(Point& p, double base, double fixed, const std::string& unit, const std::string& what) {
    p.add({"baseline", base, unit, Direction::higher, std::nullopt, "the user's setting: " + what});
    p.add({"with_fix", fixed, unit, Direction::higher, std::nullopt, "the recommended setting: " + what});
    p.add({"gain", base > 0 ? fixed / base : 0, "x", Direction::higher, std::nullopt, "with_fix / baseline"});
  }

  void find(const std::string& cause, const std::string& check, double gain, const std::string& evidence,
            const std::string& line, const std::string& command) {
    const char* scope = check == "padding"  ? "on the packing scenario's layer"
                        : check == "batch"  ? "on the step"
                        : check == "loader" ? "on a modelled loader"
                        : check == "dtype"                          ? "on the GEMM alone"
                                                                    : "on attention alone";
    found_.push_back({cause,
                      fmt::format("{}: {:.2f}x {} {} -> {}{}", check, gain,
                                  ctx_.device.info().simulated ? "modelled" : "measured", scope, line,
                                  evidence.empty() ? "" : " (" + evidence + ")"),
                      gain,
                      json{{"check", check}, {"config_line", line}, {"command", command}, {"evidence", evidence}}});
  }

  // The checks of work per token that stays cheap on a CPU at the user's
  // sequence length (attention alone, packing's rows): it, up to 2048.
  std::int64_t long_seq() const {
    return ctx_.device.info().kind == DeviceKind::cpu ? std::min<std::int64_t>(opt_.cfg.sequence_len, 2048)
                                                      : opt_.cfg.sequence_len;
  }

  // The loop's pad_to_multiple_of. Their collator's 64 at their lengths (a --lengths file: the padding check
  // and the loop read the same lengths). Generated lengths (lognormal, mean a quarter of the sequence) are
  // drawn at the loop's reduced sequence (256 for 2048 on a CPU), a scale of the padding check's: 64 at a
  // mean of 64 padded 37.7% of the default config's loop at micro batch 1, where 64 at their scale (the
  // check's, mean 512) pads about 4%. The multiple scales with the lengths, to at least 16: each padded
  // length is a decoder step the train scenario warms once a run, and 8's 32 lengths at 256 tokens cost
  // 0.7 s a run (72 runs at the default budget) against 0.26 s for 16's 16. At 16 the default config's
  // loop pads 11% at micro batch 1 (5.6% at 8, 38% at 64).
  std::int64_t loop_pad_multiple() const {
    return diagnose::loop_pad_multiple(kPadMultiple, !opt_.lengths_path.empty(), long_seq(), shape_.seq);
  }

  // The attention their step runs: eager unless the config turns a fused one on.
  std::string user_attn() const { return opt_.cfg.flash_attention || opt_.cfg.sdp_attention ? "fused" : "naive"; }

  std::vector<std::string> shape_params(bool with_batch) const {
    std::vector<std::string> a{fmt::format("seq_len={}", shape_.seq), fmt::format("d_model={}", shape_.hidden),
                               fmt::format("d_ff={}", shape_.ffn), fmt::format("heads={}", shape_.heads),
                               fmt::format("kv_heads={}", shape_.kv_heads), "layers=2",
                               fmt::format("dtype={}", dtype_name(opt_.cfg)), "attn=" + user_attn()};
    if (with_batch) a.push_back(fmt::format("micro_batch={}", shape_.micro_batch));
    return a;
  }

  // 1. their step: tokens/s, busy, pattern
  Point utilization() {
    step("utilization: their step");
    Point p = check_point("utilization");
    auto a = shape_params(true);
    a.push_back("grad_accum=1");
    a.push_back("trials=3");
    const Sub s = sub("batch", a);
    p.info = json{{"sub", compact(s)}};
    if (!s.ok()) {
      p.status = s.r.points.empty() ? Status::error : s.r.points.front().status;
      p.reason = s.r.points.empty() ? "no point" : s.r.points.front().reason;
      return p;
    }
    const Point& q = s.r.points.front();
    tokens_per_s_ = metric(q, "tokens_per_s")->value;
    step_ms_ = metric(q, "step_ms")->value;
    const double busy = metric(q, "busy_pct")->value;
    const std::string pattern = q.info.value("pattern", std::string());
    p.add({"tokens_per_s", tokens_per_s_, "tokens/s", Direction::higher, std::nullopt,
           "their step at the measured shape, device work only (no loader)"});
    p.add({"busy_pct", busy, "%", Direction::higher, std::nullopt, "device busy over the step"});
    p.info["pattern"] = pattern;
    p.info["launch_bound"] = q.info.value("launch_bound", false);
    p.info["reading"] = pattern == "steady-low"
                            ? "steady-low: the step itself leaves the device idle (a small batch, launches, dtype): "
                              "see batch and dtype"
                            : pattern == "spiky" ? "spiky: the device waits for something between bursts (loader)"
                                                 : "the device is busy through the step: look at the loader and the "
                                                   "work per token (dtype, padding, attention)";
    return p;
  }

  // 2. loader: their workers/pinning against the recommended
  Point loader() {
    step("loader: workers, pinning, prefetch");
    Point p = check_point("loader");
    const TrainConfig& c = opt_.cfg;
    const int rec = std::min(64, std::max(2, c.dataloader_num_workers));  // the dataloader scenario's bound
    if (auto skipped = excluded("loader")) return *skipped;
    // the step the loader must feed: their step's time; a sample: seq_len tokens of input_ids,
    // attention_mask and labels (int64 each)
    // (the model is a ratio, supply, and scale-free: the emulated step is capped at 50 ms, 20 ms with --quick,
    // so a slow step on a CPU does not make this check take minutes; their loop, in the applied check, runs at
    // their step's time. The four runs at 50 ms took 11.2 s with --quick, at 20 ms 4.5 s, 2-vCPU Xeon.)
    const double step_ms = std::clamp(step_ms_ > 0 ? step_ms_ : 20.0, 1.0, opt_.quick ? 20.0 : 50.0);
    const int theirs = std::min(64, c.dataloader_num_workers);
    // kRounds rounds of 20 steps each (10 with --quick): a third of the scenario's own 60, half of its 20 with
    // --quick (the wall of one run at the default, 1.5x it with --quick); the second round in the other
    // order; the gain is the median of the rounds' own paired gains, the figures the median round's. One run of four points read the modelled loader at 1.10x (all_causes.yml, a 2-vCPU
    // Xeon, 2026-12-05): its first point's step took 34.8 ms of the 30.5 asked and the other three 27.0-27.6,
    // and workers=0 with pinned memory, the third point, gained as much as 2 workers did.
    auto round_args = [&](bool reversed) {
      auto two = [&](const std::string& x, const std::string& y) { return reversed ? y + "," + x : x + "," + y; };
      std::vector<std::string> a{theirs == rec ? fmt::format("workers={}", rec)
                                               : "workers=" + two(std::to_string(theirs), std::to_string(rec)),
                                 fmt::format("batch={}", shape_.micro_batch),
                                 fmt::format("sample_bytes={}", shape_.seq * 24),
                                 fmt::format("step_ms={:.3f}", step_ms),
                                 fmt::format("prefetch={}", std::clamp(c.dataloader_prefetch_factor, 1, 64)),
                                 fmt::format("steps={}", opt_.quick ? 10 : 20)};
      if (!c.dataloader_pin_memory) a.push_back("pin=" + two("pageable", "pinned"));
      return a;
    };
    // their setting's point and the fix's in one round's Sub
    auto pair_of = [&](const Sub& r) {
      std::pair<const Point*, const Point*> bf{nullptr, nullptr};
      for (const Point& q : r.r.points) {
        if (q.status != Status::ok || !metric(q, "samples_per_s") || metric(q, "samples_per_s")->value <= 0) continue;
        const bool mine = q.params.value("workers", -1) == theirs &&
                          (c.dataloader_pin_memory || q.params.value("pin", std::string("pinned")) == "pageable");
        if (mine && !bf.first) bf.first = &q;
        if (q.params.value("workers", -1) == rec && q.params.value("pin", std::string("pinned")) == "pinned")
          bf.second = &q;
      }
      return bf;
    };
    std::vector<std::pair<double, Sub>> got;
    json rounds = json::array();
    Sub failed;
    for (int r = 0; r < kRounds && (r == 0 || !hung_); ++r) {
      Sub one = sub("dataloader", round_args(r % 2 == 1));
      const auto [x, y] = pair_of(one);
      if (!x || !y) {
        failed = std::move(one);
        break;
      }
      const double g = metric(*y, "samples_per_s")->value / metric(*x, "samples_per_s")->value;
      rounds.push_back(g);
      got.emplace_back(g, std::move(one));
    }
    p.info = json{{"assumption", "the loader's cost per sample is the dataloader scenario's supply=0.5 (one worker "
                                 "delivers half of what the step consumes): a model of a collating, tokenizing "
                                 "loader, not a measurement of yours"}};
    if (got.size() < std::size_t(kRounds)) {
      // the round that failed, or where it has no point to show, the last that completed
      p.info["sub"] = compact(failed.r.points.empty() && !got.empty() ? got.back().second : failed);
      p.info["rounds"] = rounds;
      p.status = Status::error;
      p.reason = fmt::format("the loader runs did not complete (round {} of {})", got.size() + 1, kRounds);
      return p;
    }
    std::stable_sort(got.begin(), got.end(), [](const auto& l, const auto& r) { return l.first < r.first; });
    const Sub& s = got[(got.size() - 1) / 2].second;  // the median round: its command is its own, in its order
    p.info["sub"] = compact(s);
    p.info["rounds"] = rounds;
    p.info["rounds_note"] = fmt::format("the gain in each of {} rounds (the second in the other order); the figures "
                                        "are the median round's",
                                        rounds.size());
    const auto [base, best] = pair_of(s);
    const double b = metric(*base, "samples_per_s")->value, f = metric(*best, "samples_per_s")->value;
    add_gain(p, b, f, "samples/s", "samples delivered per second with the step running");
    p.info["pattern_baseline"] = base->info.value("pattern", std::string());
    p.info["pattern_fixed"] = best->info.value("pattern", std::string());
    // Named when the modelled loader gains, or when the loader runs inline: then, under the same
    // assumption, it loads in series with their step (the applied check measures what that costs
    // their training loop; a 2-core machine's dataloader run cannot show it, its step takes a core)
    if (b > 0 && (f / b >= kMinGain || c.dataloader_num_workers == 0)) {
      std::string line = fmt::format("dataloader_num_workers: {}", rec);
      if (!c.dataloader_pin_memory) line += ", dataloader_pin_memory: true";
      std::vector<std::pair<std::string, std::string>> change{{"workers", std::to_string(rec)}};
      if (!c.dataloader_pin_memory) change.push_back({"pin", "pinned"});
      applied_.push_back({"loader", change});
      // Named for the inline loader alone when the model gained nothing here: then its busy figures are not
      // evidence (on a 2-core machine the workers slow the emulated step itself, which raises busy% without a
      // sample more per second), and the finding says what it rests on.
      std::string drift = best->info.value("warning", std::string());
      if (const std::string d0 = base->info.value("warning", std::string()); !d0.empty())
        drift = "yours: " + d0 + (drift.empty() ? "" : "; the fix's: " + drift);
      find("slow host dataloader", "loader", f / b,
           f / b >= kMinGain
               ? fmt::format("a modelled loader (the dataloader scenario's supply=0.5, not yours): busy {:.0f}% ({}) "
                             "with {} worker(s) -> {:.0f}% ({}) with {}",
                             metric(*base, "busy_pct")->value, p.info["pattern_baseline"].get<std::string>(),
                             c.dataloader_num_workers, metric(*best, "busy_pct")->value,
                             p.info["pattern_fixed"].get<std::string>(), rec)
               : fmt::format("dataloader_num_workers: 0 loads every batch in series with the step; the modelled "
                             "loader (supply=0.5, not yours) gained only {:.2f}x here, where {}{}: the applied check "
                             "below measures the line on your loop",
                             f / b, workers_room(*best, rec), drift.empty() ? "" : " (" + drift + ")"),
           line, s.command);
    }
    return p;
  }

  // Why more workers bought the modelled loader little: the dataloader scenario gives the step its own CPUs and
  // the loader the rest, so on a 2-core machine 2 workers share 1 CPU (supply=0.5 of one worker stays 0.5).
  static std::string workers_room(const Point& q, int workers) {
    const json split = q.info.value("cpu_split", json::object());
    const auto n = [&](const char* k) { return split.contains(k) && split[k].is_array() ? split[k].size() : 0; };
    if (n("loader_cpus") == 0 || n("compute_cpus") == 0) return "its workers share the machine's CPUs with the step";
    return fmt::format("its {} worker(s) share the {} CPU(s) left beside the step's {} (of {})", workers,
                       n("loader_cpus"), n("compute_cpus"), n("loader_cpus") + n("compute_cpus"));
  }

  // 3. dtype at their MLP GEMM
  Point dtype() {
    step("dtype: fp32 against bf16 at their GEMM shape");
    Point p = check_point("dtype");
    if (auto skipped = excluded("dtype")) return *skipped;
    const bool has_bf16 = !ctx_.device.gemm_unsupported(DType::bf16);
    const std::string to = has_bf16 ? "bf16" : "fp16";
    if (!has_bf16 && ctx_.device.gemm_unsupported(DType::fp16)) {
      p.status = Status::skipped;
      p.reason = fmt::format("this device has no bf16 or fp16 GEMM ({}): the dtype cannot be measured here; run "
                             "diagnose on the GPU the job uses",
                             *ctx_.device.gemm_unsupported(DType::bf16));
      return p;
    }
    const std::int64_t m = std::min<std::int64_t>(shape_.micro_batch * shape_.seq, 32768);  // precision's bound
    const Paired pr = paired("precision",
                             {fmt::format("m={}", m), fmt::format("n={}", shape_.intermediate),
                              fmt::format("k={}", shape_.hidden), "trials=3"},
                             "dtype", "fp32", to, "tflops", false);
    const Sub& s = pr.s;
    p.info = pr.info();
    const Point* a = s.point("dtype", "fp32");
    const Point* b = s.point("dtype", to);
    if (!a || !b || a->status != Status::ok || b->status != Status::ok || !metric(*a, "tflops") ||
        !metric(*b, "tflops")) {
      p.status = Status::skipped;
      p.reason = Paired::failed(a, b, "fp32", "no " + to + " GEMM here");
      return p;
    }
    const double x = metric(*a, "tflops")->value, y = metric(*b, "tflops")->value;
    add_gain(p, x, y, "TFLOP/s", fmt::format("the MLP GEMM {}x{}x{}", m, shape_.intermediate, shape_.hidden));
    p.info["impl"] = b->info.value("impl", std::string());
    if (y / x >= kMinGain) {
      applied_.push_back({"dtype", {{"dtype", to}}});
      find("fp32 where bf16 would do", "dtype", y / x,
           fmt::format("{} TFLOP/s fp32 -> {} {} at {}x{}x{} ({})", format_number(x), format_number(y), to, m,
                       shape_.intermediate, shape_.hidden, p.info["impl"].get<std::string>()),
           to + ": true", s.command);
    } else
      p.info["reading"] = fmt::format("{} is not faster than fp32 on this device ({:.2f}x): no change recommended "
                                      "here; on a GPU with tensor cores it is",
                                      to, y / x);
    return p;
  }

  // 4. padding: their lengths, padded as configured, against packed
  Point padding() {
    step("padding: padded against packed");
    Point p = check_point("padding");
    const TrainConfig& c = opt_.cfg;
    if (auto skipped = excluded("padding")) return *skipped;
    const std::string base = c.pad_to_sequence_len ? "pad-max" : "pad-longest";
    std::string lengths;
    const std::int64_t seq = long_seq();
    if (!opt_.lengths_path.empty())
      lengths = "@" + opt_.lengths_path;
    else
      lengths = fmt::format("lognormal:{},1.0", std::max<std::int64_t>(8, seq / 4));
    const std::string attn = ctx_.device.info().kind == DeviceKind::cuda ? "cudnn" : "flash";
    const Paired pr = paired("packing",
                             {"lengths=" + lengths, fmt::format("max_len={}", seq),
                              fmt::format("d_model={}", shape_.hidden), fmt::format("d_ff={}", shape_.ffn),
                              fmt::format("heads={}", shape_.heads), fmt::format("kv_heads={}", shape_.kv_heads),
                              fmt::format("dtype={}", dtype_name(c)), fmt::format("rows={}", shape_.micro_batch),
                              "attn=" + attn, fmt::format("sequences={}", opt_.quick ? 256 : 1024),
                              // as their loop's collator pads (train's pad-longest): each batch to its longest
                              // rounded up to 64, Axolotl's pad_to_multiple_of
                              fmt::format("pad_multiple={}", kPadMultiple)},
                             "strategy", base, "pack-bfd", "real_tokens_per_s", false);
    const Sub& s = pr.s;
    p.info = pr.info();
    p.info["lengths"] = lengths;
    const Point* a = s.point("strategy", base);
    const Point* b = s.point("strategy", "pack-bfd");
    if (!a || !b || a->status != Status::ok || b->status != Status::ok) {
      p.status = Status::error;
      p.reason = "the packing runs did not complete";
      return p;
    }
    const double x = metric(*a, "real_tokens_per_s")->value, y = metric(*b, "real_tokens_per_s")->value;
    add_gain(p, x, y, "tokens/s", "real (non-pad) tokens per second");
    if (y / x >= kMinGain) {
      applied_.push_back({"padding", {{"collate", "pack"}}});
      find("batches padded instead of packed", "padding", y / x,
           fmt::format("{} real tokens/s {} -> {} packed", format_number(x), base, format_number(y)),
           "sample_packing: true", s.command);
    }
    return p;
  }

  // 5. attention: eager against fused
  Point attention() {
    step("attention: eager against fused");
    Point p = check_point("attention");
    const TrainConfig& c = opt_.cfg;
    if (auto skipped = excluded("attention")) return *skipped;
    const std::string fused = ctx_.device.info().kind == DeviceKind::cuda ? "cudnn" : "flash";
    // 10 trials a round up to 512 tokens (3 took 10 ms at 256 tokens on 2 cores: three rounds cost under a
    // second there), 3 past it (the measure's own minimum; eager at 2048 tokens is 0.7 s a call on 2 cores)
    const std::string trials = long_seq() <= 512 ? "trials=10" : "trials=3";
    const Paired pr = paired("attention",
                             {fmt::format("seq_len={}", long_seq()), fmt::format("heads={}", shape_.heads),
                              fmt::format("head_dim={}", shape_.hidden / shape_.heads),
                              fmt::format("batch={}", shape_.micro_batch), fmt::format("dtype={}", dtype_name(c)),
                              "pass=fwd+bwd", "causal=true", trials},
                             "impl", "naive", fused, "ms", true);
    const Sub& s = pr.s;
    p.info = pr.info();
    const Point* a = s.point("impl", "naive");
    const Point* b = s.point("impl", fused);
    if (!a || !b || a->status != Status::ok || b->status != Status::ok) {
      p.status = Status::skipped;
      p.reason = Paired::failed(a, b, "naive", "no fused attention here");
      return p;
    }
    const double x = metric(*a, "ms")->value, y = metric(*b, "ms")->value;
    add_gain(p, 1e3 / x, 1e3 / y, "calls/s", "attention forward+backward calls per second");
    if (x / y >= kMinGain) {
      applied_.push_back({"attention", {{"attn", "fused"}}});
      find("attention without a fused kernel", "attention", x / y,
           fmt::format("{} ms eager -> {} ms {} per layer", format_number(x), format_number(y), fused),
           ctx_.device.info().kind == DeviceKind::cuda
               ? "attn_implementation: flash_attention_2 (or sdpa; flash_attention: true before Axolotl 0.12)"
               : "attn_implementation: sdpa (flash_attention_2 on a GPU; flash_attention: true before Axolotl 0.12)",
           s.command);
    }
    return p;
  }

  // 6. batch: the knee from their micro batch
  Point batch() {
    step("batch: micro batch sweep");
    Point p = check_point("batch");
    const std::int64_t mb = shape_.micro_batch;
    // Their global batch held: micro batch 1 x 8 accumulated against 8 x 1, so the optimizer runs as often
    // per token at every size (a sweep at grad_accum 1 credited the larger micro batch with the optimizer's
    // amortization, which their gradient_accumulation_steps already gives them).
    const std::int64_t global = std::max<std::int64_t>(1, opt_.cfg.micro_batch_size) *
                                std::max<std::int64_t>(1, opt_.cfg.gradient_accumulation_steps);
    // Twice their micro batch always; 4x and 8x while a point's estimated wall stays under 3 s (--quick) or
    // 8 s: a point is a warm-up and 3 optimizer steps of max(global batch, micro batch) sequences, each
    // micro batch timed at most their step's time per sequence (the utilization check's; the lines above
    // only make it faster). A cap of 16,384 tokens let micro batch 8 x 256 tokens (fp32, eager, 2-vCPU
    // EPYC) sweep to 64: 106 s of a --quick run, 4 s a step. Without their step's time, that token cap.
    constexpr int kSweepTrials = 3;  // optimizer steps timed a point, after one of warm-up
    const double per_seq_s = step_ms_ > 0 ? step_ms_ / 1e3 / double(std::max<std::int64_t>(1, mb)) : 0;
    const double most_point_s = opt_.quick ? 3.0 : 8.0;
    const std::int64_t most_tokens = opt_.quick ? std::max<std::int64_t>(16384, 2 * mb * shape_.seq) : INT64_MAX;
    std::vector<std::int64_t> sizes{mb};
    for (std::int64_t f : {2, 4, 8}) {
      const std::int64_t x = mb * f;
      const double est_s = double(1 + kSweepTrials) * per_seq_s * double(std::max(global, x));
      const bool fits = per_seq_s > 0 ? est_s <= most_point_s : x * shape_.seq <= most_tokens;
      if (x <= 4096 && (f == 2 || fits)) sizes.push_back(x);
    }
    std::string sizes_note;
    if (per_seq_s > 0)
      sizes_note = fmt::format("micro batches {} swept: 2x theirs always (up to 4096), 4x and 8x while a "
                                         "point's estimated wall (a warm-up and 3 steps at their step's {:.1f} ms "
                                         "per sequence) stays under {:.0f} s",
                                         fmt::join(sizes, ", "), 1e3 * per_seq_s, most_point_s);
    // In the standard order: with the lines named above it applied (bf16, a
    // fused attention), as the user would have them when they reach this
    // step. A step dominated by eager attention or fp32 GEMMs hides the
    // launch overhead a small batch costs once those are fixed.
    auto a = shape_params(false);
    std::string with;
    for (const Applied& x : applied_)
      if (x.check == "dtype" || x.check == "attention")
        for (const auto& [k, v] : x.change) {
          for (std::string& arg : a)
            if (arg.rfind(k + "=", 0) == 0) arg = k + "=" + v;
          with += (with.empty() ? "" : ", ") + k + "=" + v;
        }
    a.push_back("grad_accum=1");
    a.push_back(fmt::format("global_batch={}", global));
    a.push_back(fmt::format("trials={}", kSweepTrials));
    a.push_back("bare=off");  // the step's GEMMs alone, back to back: a figure this check does not read
    // Three sweeps, the second backward (8,4,2,1): its gain near 1.10x (1.12-1.45x at micro batch 2-8 over
    // four runs on a 2-vCPU Xeon) fell on either side of the threshold with one sweep (micro batch 4 read
    // under 2 in one).
    std::vector<Sub> sweeps;
    for (int r = 0; r < kRounds && (r == 0 || !hung_); ++r) {  // after a hang, sub() says "not run" once
      auto ar = a;
      auto order = sizes;
      if (r % 2) std::reverse(order.begin(), order.end());
      ar.push_back(fmt::format("micro_batch={}", fmt::join(order, ",")));
      sweeps.push_back(sub("batch", ar));
    }
    // Each micro batch's gain over theirs is the median of its sweeps' own ratios (a sweep's sizes ran
    // within seconds of each other: a machine that drifts between sweeps moves both), and the figures quoted
    // are the sweep's whose gain at the knee is that median, so they divide to the claim.
    std::map<std::int64_t, std::vector<std::pair<double, std::size_t>>> ratios;  // size -> (gain, sweep)
    json per_round = json::object(), gains_json = json::object();
    for (const std::int64_t x : sizes) {
      json tps = json::array(), gs = json::array();
      for (std::size_t w = 0; w < sweeps.size(); ++w) {
        const Point* q = sweeps[w].point_int("micro_batch", x);
        const Point* b0 = sweeps[w].point_int("micro_batch", mb);
        const Metric* t = q && q->status == Status::ok ? metric(*q, "tokens_per_s") : nullptr;
        const Metric* t0 = b0 && b0->status == Status::ok ? metric(*b0, "tokens_per_s") : nullptr;
        tps.push_back(t ? json(t->value) : json(nullptr));
        if (t && t0 && t0->value > 0) {
          ratios[x].emplace_back(t->value / t0->value, w);
          gs.push_back(t->value / t0->value);
        } else
          gs.push_back(nullptr);
      }
      per_round[std::to_string(x)] = tps;
      gains_json[std::to_string(x)] = gs;
    }
    for (auto& [x, v] : ratios)
      std::stable_sort(v.begin(), v.end(), [](const auto& l, const auto& r) { return l.first < r.first; });
    // the lower median: with a sweep lost (a hang, an error) two are left, and the larger of them would lean
    // toward naming a cause
    auto med = [&](std::int64_t x) -> const std::pair<double, std::size_t>& {
      const auto& v = ratios.at(x);
      return v[(v.size() - 1) / 2];
    };
    auto gain_of = [&](std::int64_t x) { return med(x).first; };
    p.info = json{{"rounds", per_round},
                  {"round_gains", gains_json},
                  {"rounds_note", fmt::format("tokens/s of each micro batch in each of {} sweeps (the second "
                                              "backward), and its gain over micro batch {} in the same sweep; a "
                                              "micro batch's gain is the median of its sweeps', the figures quoted "
                                              "the sweep's whose gain at the knee is that median",
                                              sweeps.size(), mb)}};
    if (!sizes_note.empty()) p.info["sizes_note"] = sizes_note;
    if (!ratios.count(mb)) {
      p.info["sub"] = compact(sweeps.front());
      p.status = Status::error;
      p.reason = "the batch runs did not complete";
      return p;
    }
    double best = 0;
    std::int64_t best_mb = mb;
    for (const auto& [x, v] : ratios)
      if (gain_of(x) > best) best = gain_of(x), best_mb = x;
    // The knee: the smallest micro batch within 90% of the best that also gains what names a cause (with
    // the best at 1.17x, 90% of it let micro batch 2 at 1.099x be the knee, and no cause was named).
    std::int64_t knee = best_mb;
    for (auto x : sizes)
      if (ratios.count(x) && gain_of(x) >= std::max(0.9 * best, std::min(best, kMinGain))) {
        knee = x;
        break;
      }
    const std::size_t w_med = med(knee).second;
    Sub s = sweeps[w_med];  // its command is its own, in its order: what the quoted figures ran as
    p.info["sub"] = compact(s);
    p.info["sweep_quoted"] = int(w_med) + 1;
    const Point* base = s.point_int("micro_batch", mb);
    const Point& kq = *s.point_int("micro_batch", knee);
    const double b = metric(*base, "tokens_per_s")->value;
    const double f = metric(kq, "tokens_per_s")->value;
    add_gain(p, b, f, "tokens/s", "tokens per second of the step");
    p.info["knee"] = knee;
    if (!with.empty()) p.info["with_lines_above"] = with;
    p.info["global_batch"] = global;
    // What limits their micro batch, from the step's own figures: launch-bound (HTA's rule: less device
    // work per submission than host time, the device idle more than half the time), steady-low (the
    // device idles between submissions), or neither: then a larger micro batch buys only the device's
    // own efficiency per token, and the finding must not call it launch-bound.
    const BatchLimit lim = batch_limit(*base, kq, shape_.seq);
    p.info["limit"] = lim.kind;
    p.info["reading"] = lim.reading;
    if (knee > mb && f / b >= kMinGain) {
      const std::int64_t ga = std::max<std::int64_t>(1, global / std::max<std::int64_t>(1, knee));
      applied_.push_back({"batch",
                          {{"micro_batch", std::to_string(knee)}, {"grad_accum", std::to_string(loop_grad_accum(ga))}},
                          knee});
      find(lim.cause, "batch", f / b,
           fmt::format("{} tokens/s at micro batch {} -> {} at {} ({}; the smallest "
                       "within 90% of the best swept and 1.10x of yours, your global batch of {} held{}); {}",
                       format_number(b), mb, format_number(f), knee,
                       ratios.at(knee).size() == 1 ? std::string("one sweep's gain")
                                                   : fmt::format("the median of {} sweeps' gains", ratios.at(knee).size()),
                       global,
                       with.empty() ? "" : "; with the lines above applied: " + with, lim.reading),
           fmt::format("micro_batch_size: {}, gradient_accumulation_steps: {} (a global batch of {} for your {}, "
                       "if it fits: see memory){}",
                       knee, ga, knee * ga, global,
                       shape_.seq != opt_.cfg.sequence_len
                           ? fmt::format("; measured at {} tokens per sequence, not your {}: the knee in tokens is {}",
                                         shape_.seq, opt_.cfg.sequence_len, knee * shape_.seq)
                           : ""),
           s.command);
    }
    return p;
  }

  // 7. memory at full depth: the model, not measured
  Point memory() {
    step("memory: the footprint at full depth");
    Point p = check_point("memory");
    const TrainConfig& c = opt_.cfg;
    batch::DecoderConfig d;
    d.micro_batch = c.micro_batch_size;
    d.seq = c.sequence_len;
    d.d_model = c.model.hidden_size;
    d.d_ff = c.model.step_ffn();
    d.heads = c.model.num_attention_heads;
    d.kv_heads = c.model.kv_heads();
    d.layers = int(c.model.num_hidden_layers);
    d.dtype = c.bf16 ? DType::bf16 : c.fp16 ? DType::fp16 : DType::fp32;
    d.checkpointing = c.gradient_checkpointing;
    const Adapter ad = adapter_of(c);  // what it trains: every weight, or LoRA adapters over a frozen base
    const Sharding sh = sharding_of(c);  // ZeRO / FSDP as configured: the states per GPU
    const FullDepthFootprint full = full_depth_footprint(c.model, d, ad, sh);
    std::uint64_t capacity = 0;
    std::string cap_source;
    if (auto lim = ctx_.device.memory_stats().limit; lim > 0) {
      capacity = lim;
      cap_source = "the device's capacity";
    } else if (ctx_.device.info().props.contains("memory_bytes")) {
      capacity = ctx_.device.info().props["memory_bytes"].get<std::uint64_t>();
      cap_source = "the GPU's memory";
    } else {
      const auto bound = read_host_memory().tightest();
      capacity = bound ? bound->available : 0;
      cap_source = bound ? "the host memory available (" + bound->what + ")" : "unknown";
    }
    p.add({"footprint_gib", double(full.total) / double(1ull << 30), "GiB", Direction::lower, std::nullopt,
           fmt::format("modelled: the decoder stack at full depth ({}) with the embedding and LM head{}, {}, AdamW",
                       c.model.moe()       ? fmt::format("a mixture of {} experts, every one's weights", c.model.num_experts)
                       : c.model.gated_mlp ? std::string("a gated MLP")
                                           : std::string("a plain MLP"),
                       c.model.tie_word_embeddings ? " (tied)" : "",
                       ad.on ? fmt::format("LoRA rank {} over a {}-bit frozen base ({} trainable parameters)", ad.rank,
                                           ad.base_bits, full.trainable)
                             : std::string("full fine-tuning"))});
    p.add({"capacity_gib", double(capacity) / double(1ull << 30), "GiB", Direction::higher, std::nullopt, cap_source});
    p.info = json{{"parts", full.parts},
                  {"parameters", full.parameters},
                  {"trainable", full.trainable},
                  {"note", ad.on ? "modelled, not measured: the adapters trained in fp32 with AdamW, the base frozen "
                                   "(bitsandbytes' 4-bit at 4.127 bits a weight); activations as a full fine-tune's"
                                 : "modelled, not measured: full fine-tuning (every weight trained, AdamW state for each)"}};
    if (capacity == 0) p.info["capacity"] = "unknown: no limit, GPU memory or host bound was found";
    if (!full.sharded.empty()) p.info["sharded"] = full.sharded;
    if (auto f = offload_finding(c, ad, full.parameters, ctx_.expected ? &*ctx_.expected : nullptr)) found_.push_back(*f);
    if (capacity > 0 && full.total > capacity) {
      batch::DecoderConfig ck = d;
      ck.checkpointing = true;
      const FullDepthFootprint with_ck = full_depth_footprint(c.model, ck, ad, sh);
      std::string line = with_ck.total <= capacity ? "gradient_checkpointing: true" : "";
      if (line.empty()) {
        for (std::int64_t mb = d.micro_batch / 2; mb >= 1; mb /= 2) {
          batch::DecoderConfig s2 = ck;
          s2.micro_batch = mb;
          if (full_depth_footprint(c.model, s2, ad, sh).total <= capacity) {
            line = fmt::format("gradient_checkpointing: true, micro_batch_size: {}", mb);
            break;
          }
        }
      }
      found_.push_back({"memory pressure and out-of-memory recovery",
                        fmt::format("memory: the config needs about {} of {} ({}){}{}{} -> {}",
                                    format_bytes(double(full.total)) + (full.sharded.empty() ? "" : " per GPU (" + full.sharded + ")"),
                                    // in GB too: the explore line's mem_limit_gb is in GB
                                    fmt::format("{} ({:.3g} GB)", format_bytes(double(capacity)), double(capacity) / 1e9),
                                    cap_source,
                                    ad.on ? fmt::format("; already LoRA over a {}-bit base", ad.base_bits) : "",
                                    c.model.moe() ? fmt::format("; every one of the {} experts' weights is in it (the "
                                                                "explore line's dense step holds a token's {} of them)",
                                                                c.model.num_experts, c.model.num_experts_per_tok)
                                                  : std::string(),
                                    with_ck.total <= capacity
                                        ? fmt::format("; with checkpointing about {}", format_bytes(double(with_ck.total)))
                                        : "",
                                    line.empty() ? memory_remedy(c, ad) : line),
                        std::nullopt,
                        json{{"check", "memory"},
                             {"config_line", line},
                             {"explore", fmt::format("stallbench run memory --device {} -p micro_batch={} -p seq_len={} "
                                                     "-p d_model={} -p d_ff={} -p heads={} -p kv_heads={} -p layers={} "
                                                     "-p dtype={} -p mem_limit_gb={:.3g}",
                                                     ctx_.device.info().id, d.micro_batch, d.seq, d.d_model, d.d_ff, d.heads,
                                                     d.kv(),
                                                     d.layers, to_string(d.dtype),
                                                     ctx_.device.info().kind == DeviceKind::cpu ? double(capacity) / 1e9
                                                                                                : 0.0)},
                             {"evidence", full.parts}}});
    }
    return p;
  }

  // The training loop as configured (the train scenario): their loader,
  // collation, dtype, attention and micro batch at the measured shape.
  std::map<std::string, std::string> loop_params() const {
    const TrainConfig& c = opt_.cfg;
    std::map<std::string, std::string> m{
        {"seq_len", std::to_string(shape_.seq)},
        {"d_model", std::to_string(shape_.hidden)},
        {"d_ff", std::to_string(shape_.ffn)},
        {"heads", std::to_string(shape_.heads)},
        {"kv_heads", std::to_string(shape_.kv_heads)},
        {"layers", "2"},
        {"grad_accum", std::to_string(loop_grad_accum(c.gradient_accumulation_steps))},
        {"dtype", dtype_name(c)},
        {"attn", user_attn()},
        {"micro_batch", std::to_string(shape_.micro_batch)},
        {"collate", c.sample_packing ? "pack" : c.pad_to_sequence_len ? "pad-max" : "pad-longest"},
        {"pad_multiple", std::to_string(loop_pad_multiple())},
        {"workers", std::to_string(std::min(64, c.dataloader_num_workers))},
        {"prefetch", std::to_string(std::clamp(c.dataloader_prefetch_factor, 1, 64))},
        {"pin", c.dataloader_pin_memory ? "pinned" : "pageable"},
        {"lengths", !opt_.lengths_path.empty() ? "@" + opt_.lengths_path
                                               : fmt::format("lognormal:{},1.0", std::max<std::int64_t>(8, shape_.seq / 4))},
        {"sequences", std::to_string(loop_sequences())},
        {"trials", "3"}};
    return m;
  }
  // Their gradient_accumulation_steps in the loop, at most 8: the optimizer runs once per that many micro
  // batches, as in their job (at 1 a micro batch 1 loop ran AdamW 8x as often per token as theirs at 8, and
  // a larger micro batch was credited with amortizing it). Past 8 its share is small and every run would
  // time whole steps of 16+ micro batches.
  static constexpr int kMostLoopAccum = 8;
  static int loop_grad_accum(std::int64_t ga) { return int(std::clamp<std::int64_t>(ga, 1, kMostLoopAccum)); }

  // The loop's dataset: enough sequences for 8 micro batches of the largest micro batch any line runs,
  // packed (a row holds about seq_len / their mean length of them): quick's 512 sequences packed into
  // 109 rows, fewer than one micro batch of 128, and the applied check failed. Their --lengths file is
  // cycled past its end when it is shorter (0: all of it, once).
  std::int64_t loop_sequences() const {
    const TrainConfig& c = opt_.cfg;
    std::int64_t most_mb = shape_.micro_batch;
    for (const Applied& x : applied_) most_mb = std::max(most_mb, x.micro_batch);
    double mean = double(std::max<std::int64_t>(8, shape_.seq / 4));
    if (!c.lengths.empty()) {
      double sum = 0;
      for (std::int32_t l : c.lengths) sum += double(std::min<std::int64_t>(l, shape_.seq));
      mean = std::max(1.0, sum / double(c.lengths.size()));
    }
    const double per_row = std::max(1.0, double(shape_.seq) / mean);
    const auto need = std::min<std::int64_t>(std::int64_t(std::ceil(8.0 * double(most_mb) * per_row)), 1 << 26);
    if (!opt_.lengths_path.empty()) return std::int64_t(c.lengths.size()) >= need ? 0 : need;
    return std::max<std::int64_t>(opt_.quick ? 512 : 2048, need);
  }
  static std::vector<std::string> assigns(const std::map<std::string, std::string>& m) {
    std::vector<std::string> a;
    for (const auto& [k, v] : m) a.push_back(k + "=" + v);
    return a;
  }
  static std::optional<double> loop_tokens(const Sub& s) {
    if (!s.ok()) return std::nullopt;
    const Metric* m = s.r.points.front().metric("real_tokens_per_s");
    return m && m->value > 0 ? std::optional<double>(m->value) : std::nullopt;
  }

  // 8. each recommended line applied to their training loop, and measured
  // again. The loop is the train scenario: their loader, collation, dtype,
  // attention and micro batch in one loop, its figure real tokens/s. Each
  // line is applied alone and all together; the gain a finding claims (and is
  // ranked by) is its gain on the whole loop, its part-alone figure kept as
  // evidence. Then every configuration runs a second time, in runs of their
  // own, and a claim holds when the two agree within 15%.
  Point applied() {
    step("applied: each line on their training loop, then measured again");
    Point p = check_point("applied");
    if (applied_.empty()) {
      p.status = Status::skipped;
      p.reason = found_.empty() ? "nothing to apply: no cause named" : "no line changes the training loop";
      return p;
    }
    // The loader's cost, an assumption: one worker delivers exactly what
    // their loop consumes once every other line is applied (a loader that
    // is enough only beside the step, never in series with it), made a CPU
    // cost per real token from a run of that loop without loader work. Per
    // real token, so a packed batch, with more of them, costs the loader
    // more, as it does a real one.
    std::map<std::string, std::string> base = loop_params();
    auto calib = base;
    for (const Applied& x : applied_)
      if (x.check != "loader")
        for (const auto& [k, v] : x.change) calib[k] = v;
    calib["load_us_per_token"] = "0";
    calib["workers"] = "0";
    const Sub c = sub("train", assigns(calib));
    p.info["calibration"] = compact(c);
    if (!c.ok()) {
      p.status = c.r.points.empty() ? Status::error : c.r.points.front().status;
      p.reason = "their training loop did not run: " + (c.r.points.empty() ? std::string("no point") : c.r.points.front().reason);
      return p;
    }
    const Point& cp = c.r.points.front();
    const double dev_ms = cp.metric("device_ms_per_batch")->value;
    const double real_per_batch = double(cp.info.value("real_tokens", std::int64_t(0))) /
                                  double(std::max<std::int64_t>(1, cp.info.value("batches", std::int64_t(1))));
    const double us_per_token = real_per_batch > 0 ? dev_ms * 1e3 * kLoadShare / real_per_batch : 0;
    base["load_us_per_token"] = fmt::format("{:.4g}", us_per_token);
    p.add({"load_us_per_token", us_per_token, "us", Direction::none, std::nullopt,
           fmt::format("the loader's CPU work per real token in the loop, an assumption about their loader: one "
                       "worker delivers {:.0f}% of what their loop consumes with every other line applied",
                       100 / kLoadShare)});

    // The configurations: each line alone, all together, each left out of all the others (what it
    // adds once they are applied: a loader that keeps up with a slow step falls behind a fast one).
    using Params = std::map<std::string, std::string>;
    auto all = base;
    std::vector<Params> alone;
    for (const Applied& x : applied_) {
      auto one = base;
      for (const auto& [k, v] : x.change) one[k] = v, all[k] = v;
      alone.push_back(one);
    }
    const bool several = applied_.size() > 1;
    auto without = [&](const Applied& x) {
      auto w = all;
      for (const auto& [k, v] : x.change) w[k] = base[k];
      return w;
    };
    // A pass: rounds of their loop before each line and after the last (T X1 T X2 T ... Xn T), each
    // line's gain in a round over the geometric mean of the runs of their loop on either side of it, so a
    // machine that drifts (a noisy neighbour, a clock) moves a line and its base together; a pass's gain
    // is the median over its rounds. One round a pass let a line's two gains differ by 16-32% here
    // (2 vCPUs, 2026-12-03: their loop read 1050-1436 real tokens/s over eight runs of 0.7 s in a row;
    // one of six bf16 runs 14% under the others). The second pass's rounds are runs of their own,
    // alternating with the first's; the lines together and each left out run after both.
    const std::size_t n = applied_.size();
    const double runs = double(2 * kRounds * (2 * n + 1) + (several ? n + 1 : 0));
    // The budget is time: every run of the loop spans about the same wall time, so a line that makes the
    // step 20x faster is measured over 20x the steps (5 steps of 50 ms moved 18-27% between passes). A run's
    // span is its share of --budget less its untimed part (building the steps, a warm-up micro step, the
    // loader's head start of workers + 1 steps: estimated as workers + 2 of their steps); at least 3 timed
    // steps whatever the span. One span for every run, so both passes measure alike (a span recomputed
    // from what was left of the budget shrank to 0.3 s by the second pass's end).
    const double their_step_s = std::max(step_ms_, 1.0) / 1e3;
    const double span = std::clamp(
        opt_.budget_s / runs -
            double(std::max(std::max(opt_.cfg.dataloader_num_workers, 2) + 2,
                            loop_grad_accum(opt_.cfg.gradient_accumulation_steps) + 1)) *
                their_step_s,
        0.5, 60.0);
    // Timed, at least: 3 micro batches in whole optimizer steps of the run's grad_accum, fewer (one step at
    // least) once an earlier run of the same configuration measured a micro batch over a third of the span:
    // three of them are no steadier than the span's worth, and none.yml's line at micro batch 64 x 256
    // tokens (1.1 s a micro batch on 2 vCPUs) ran 3.4 s a run, its loop 97 s under --budget 20.
    constexpr int kLeastMicroBatches = 3;
    std::map<std::string, double> micro_s;  // a configuration (its assignments) -> seconds per micro batch
    int runs_done = 0, retried = 0;
    double untimed_s = 0, spans_sum = 0;  // over the runs done: wall outside the timed span, and the spans
    struct Pass {
      std::map<std::string, double> gain;                // check -> the median of its rounds' gains
      std::map<std::string, std::vector<double>> gains;  // check -> its gain in each round, in order
      std::vector<double> theirs;                        // their loop's runs, in order
      double base = 0;                                   // their runs' geometric mean
      std::optional<double> together;                    // all the lines, real tokens/s
      std::map<std::string, double> last;                // check -> together / without it
    };
    auto one_run = [&](json& evidence, const std::string& name, Params m) -> std::optional<double> {
      const double left_runs = runs - runs_done;
      // a run's wall so far, its retries included (its timed part is whole optimizer steps: it can pass the
      // span), else a guess
      const double per_run = runs_done > 0 ? (untimed_s + spans_sum) / runs_done : span + 3 * their_step_s;
      const int ga = std::max(1, std::stoi(m.at("grad_accum")));
      const std::string key = fmt::format("{}", fmt::join(assigns(m), " "));  // before trials, min_time_s
      const int least = micro_s.count(key) && micro_s.at(key) > 0
                            ? int(std::clamp(span / micro_s.at(key), 1.0, double(kLeastMicroBatches)))
                            : kLeastMicroBatches;
      m["trials"] = std::to_string((least + ga - 1) / ga);
      m["min_time_s"] = fmt::format("{:.3g}", span);
      ++runs_done;
      opt_.say(fmt::format("diagnose [{}/{}] applied: run {} of {:.0f}, {}, timed over {:.1f} s ({:.0f} s so far, "
                           "about {:.0f} s left)",
                           done_, checks_, runs_done, runs, name, span,
                           std::chrono::duration<double>(clk::now() - t0_).count(), left_runs * per_run));
      // A run the hypervisor took 10% or more of the machine from is run again (once, and at most a
      // quarter of the runs so far): on this VM a run of their loop read 22,256 real tokens/s at 43%
      // steal and 80,588 at 1% (sim:h100, the host side real); the run kept is the second.
      Sub r;
      for (int attempt = 0;; ++attempt) {
        const auto r0 = clk::now();
        r = sub("train", assigns(m));
        const double wall = std::chrono::duration<double>(clk::now() - r0).count();
        double timed = 0, steal = 0;
        if (r.ok()) {
          const Point& q = r.r.points.front();
          if (const Metric* st = q.metric("step_ms")) {
            timed = st->value / 1e3 * double(q.info.value("steps", 0));
            micro_s[key] = st->value / 1e3 / double(ga);
          }
          if (q.info.contains("host_cpu")) steal = q.info["host_cpu"].value("steal_pct", 0.0);
        }
        untimed_s += std::max(0.0, wall - timed);
        spans_sum += timed;
        // once a run, and no more than a quarter of the runs so far: a steal that lasts would spend it all
        // on the first runs of a pass
        if (!r.ok() || steal < kStealRetryPct || attempt >= 1 || retried >= std::max(1, runs_done / 4)) break;
        ++retried;
        evidence[fmt::format("{} (run again: {:.0f}% steal)", name, steal)] = compact(r);
        opt_.say(fmt::format("diagnose [{}/{}] applied: run {} again: the hypervisor took {:.0f}% of the machine "
                             "while it ran",
                             done_, checks_, runs_done, steal));
      }
      evidence[name] = compact(r);
      return loop_tokens(r);
    };
    // One round of a pass: T X1 T X2 ... Xn T, in the order given.
    auto one_round = [&](Pass& out, json& evidence, int round, bool reverse) {
      // a pass's first round keeps the plain names ("theirs", "dtype", "theirs after dtype")
      const std::string tag = round == 0 ? "" : fmt::format(" #{}", round + 1);
      std::vector<std::size_t> order(n);
      for (std::size_t i = 0; i < n; ++i) order[i] = reverse ? n - 1 - i : i;
      std::vector<std::optional<double>> ts{one_run(evidence, "theirs" + tag, base)};
      std::vector<std::optional<double>> xs;
      for (const std::size_t i : order) {
        xs.push_back(one_run(evidence, applied_[i].check + tag, alone[i]));
        ts.push_back(one_run(evidence, "theirs after " + applied_[i].check + tag, base));
      }
      for (const auto& t : ts)
        if (t) out.theirs.push_back(*t);
      for (std::size_t k = 0; k < n; ++k)
        if (xs[k] && ts[k] && ts[k + 1])
          out.gains[applied_[order[k]].check].push_back(*xs[k] / std::sqrt(*ts[k] * *ts[k + 1]));
    };
    auto settle_pass = [](Pass& out) {
      double logsum = 0;
      for (double t : out.theirs) logsum += std::log(t);
      if (!out.theirs.empty()) out.base = std::exp(logsum / double(out.theirs.size()));
      for (const auto& [check, g] : out.gains) out.gain[check] = summarize(g).median;
    };
    // The two passes' rounds alternate (first, second, first, ...), so a machine that changes between
    // one minute and the next (the spread of a line's gain between back-to-back passes was 16% here,
    // its rounds within a pass 4-8%) moves both measurements alike; each pass's rounds run the lines
    // forward, backward, forward.
    json first_ev = json::object(), second_ev = json::object();
    Pass t1, t2;
    for (int r = 0; r < 2 * kRounds; ++r) {
      const bool second = r % 2 == 1;
      one_round(second ? t2 : t1, second ? second_ev : first_ev, r / 2, (r / 2) % 2 == 1);
    }
    settle_pass(t1);
    settle_pass(t2);
    if (several) {
      t1.together = one_run(first_ev, "together", all);
      for (const Applied& x : applied_)
        if (const auto w = one_run(first_ev, "without " + x.check, without(x)); w && t1.together)
          t1.last[x.check] = *t1.together / *w;
    }
    const int executed = runs_done + retried;  // the retried runs ran too: their walls are in the sums
    p.add({"timed_span_s", executed ? spans_sum / executed : 0.0, "s", Direction::none, std::nullopt,
           fmt::format("the mean timed wall of a run of the loop (min_time_s, at least {} micro batches in whole "
                       "optimizer steps, or one step once a micro batch of that configuration measured over a third "
                       "of it): {} runs "
                       "sharing --budget {:.0f} s, less their untimed parts (mean {:.2f} s a run)",
                       kLeastMicroBatches, executed, opt_.budget_s, executed ? untimed_s / executed : 0.0)});
    p.add({"runs_retried", double(retried), "runs", Direction::none, std::nullopt,
           fmt::format("runs of the loop run again because the hypervisor took {:.0f}% or more of the machine "
                       "while they ran (once each, at most a quarter of the runs so far)",
                       kStealRetryPct)});
    p.info["runs"] = first_ev;
    p.info["repeat"] = second_ev;
    if (t1.base <= 0) {
      p.status = Status::error;
      p.reason = "their training loop did not complete";
      return p;
    }
    loop_now_ = t1.base;
    if (!several) {
      if (t1.gain.count(applied_.front().check))
        together_ = t1.gain.at(applied_.front().check), loop_after_ = *together_ * t1.base;
    } else if (t1.together) {
      together_ = *t1.together / t1.base, loop_after_ = *t1.together;
    }
    auto list = [](const std::vector<double>& v) {
      std::string o;
      for (double x : v) o += (o.empty() ? "" : ", ") + format_number(x);
      return o;
    };
    p.info["drift"] = fmt::format("their loop, run before each line and after the last, {} rounds a pass: {} real "
                                  "tokens/s in the first pass, {} in the second",
                                  kRounds, list(t1.theirs), list(t2.theirs));
    json lines = json::array();
    auto opt = [](const std::map<std::string, double>& m, const std::string& k) {
      return m.count(k) ? std::optional<double>(m.at(k)) : std::nullopt;
    };
    for (const Applied& x : applied_) {
      Finding* f = finding(x.check);
      const auto g = opt(t1.gain, x.check);
      if (!f || !g) continue;
      std::string param;
      for (const auto& [k, v] : x.change) param += (param.empty() ? "" : ", ") + k + "=" + v;
      settle(*f, f->speedup.value_or(0), *g, opt(t2.gain, x.check), param, opt(t1.last, x.check),
             x.check == "batch" ? batch_padding_note(*f, first_ev, x.micro_batch) : std::string());
      // each round's gain, whose median the claim and its repeat are
      if (t1.gains.count(x.check)) f->evidence["step_gains"] = t1.gains.at(x.check);
      if (t2.gains.count(x.check)) f->evidence["repeat_gains"] = t2.gains.at(x.check);
      lines.push_back(line_json(*f));
    }
    p.add({"real_tokens_per_s_theirs", loop_now_, "tokens/s", Direction::higher, std::nullopt,
           "their training loop as configured (loader, collation, step), real tokens per second: the geometric "
           "mean of its runs in the first pass (before each line and after the last)"});
    if (loop_after_ > 0)
      p.add({"real_tokens_per_s_fixed", loop_after_, "tokens/s", Direction::higher, std::nullopt,
             "the same loop with every recommended line applied"});
    int held = 0, measured = 0, confirmed = 0, no_gain = 0;
    for (const auto& l : lines) {
      if (l.contains("holds")) ++measured, held += l["holds"].get<bool>();
      const std::string v = l.value("verdict", std::string());
      confirmed += v == kConfirmed;
      no_gain += v == kNoGain;
    }
    p.add({"lines_applied", double(lines.size()), "lines", Direction::none, std::nullopt,
           "recommended lines measured with the line applied"});
    p.add({"claims_held", double(held), "lines", Direction::higher, std::nullopt,
           "a second run within 15% of the claimed gain"});
    if (together_)
      p.add({"step_gain_together", *together_, "x", Direction::higher, std::nullopt,
             "their training loop with every recommended line applied at once"});
    p.info["lines"] = lines;
    p.add({"lines_confirmed", double(confirmed), "lines", Direction::none, std::nullopt,
           "lines with at least 1.10x on their loop alone, in both passes"});
    p.info["reading"] = fmt::format("{} of {} claims held when measured again (within 15%); {} confirmed on their "
                                    "loop{}",
                                    held, measured, confirmed,
                                    no_gain ? fmt::format(", {} with no gain on it here", no_gain) : std::string());
    return p;
  }

  // Their loop pads each batch to its longest (no sample_packing): a larger micro batch pads to the longest
  // of more sequences, so the batch line can lose on the loop what it gained on the step (the default config
  // read 0.65x: 68.6% of the computed tokens padding at micro batch 8 against 37.7% at 1). Said in the
  // finding, with both figures; empty when the padding did not grow by 5 points.
  std::string batch_padding_note(Finding& f, const json& runs, std::int64_t micro_batch) const {
    auto pad_of = [&runs](const char* name) -> std::optional<double> {
      if (!runs.contains(name)) return std::nullopt;
      const json& r = runs[name];
      if (!r.contains("points") || r["points"].empty()) return std::nullopt;
      const json& m = r["points"][0].value("metrics", json::object());
      if (!m.contains("padding_pct") || !m["padding_pct"].is_number()) return std::nullopt;
      return m["padding_pct"].get<double>();
    };
    const auto now = pad_of("theirs"), with = pad_of("batch");
    if (opt_.cfg.sample_packing || opt_.cfg.pad_to_sequence_len || !now || !with || *with < *now + 5.0) return {};
    f.evidence["loop_padding_pct"] = json{{"theirs", *now}, {"with_line", *with}};
    return fmt::format("; on their loop padding is {:.1f}% of the computed tokens at micro batch {} against {:.1f}% "
                       "at their {} (each batch padded to its longest, rounded up to {}{}): with sample_packing: true "
                       "a larger micro batch pads no more (packed rows pad only each row's tail)",
                       *with, micro_batch, *now, shape_.micro_batch, loop_pad_multiple(),
                       loop_pad_multiple() != kPadMultiple
                           ? fmt::format(": the collator's {}, scaled as the loop's lengths are", kPadMultiple)
                           : std::string());
  }

  Finding* finding(const std::string& check) {
    for (Finding& f : found_)
      if (f.evidence.value("check", std::string()) == check) return &f;
    return nullptr;
  }

  static json line_json(const Finding& f) {
    json j{{"check", f.evidence["check"]}, {"config_line", f.evidence["config_line"]}};
    for (const char* k : {"part_gain", "step_gain", "step_gains", "repeat_gain", "repeat_gains", "holds", "last_gain",
                          "verdict"})
      if (f.evidence.contains(k)) j[k] = f.evidence[k];
    return j;
  }

  // What a check's own figure was measured on.
  static const char* part_name(const std::string& check) {
    return check == "dtype"       ? "the GEMM"
           : check == "attention" ? "attention"
           : check == "loader"    ? "a modelled loader"
           : check == "padding"   ? "the packing scenario's layer"
                                  : "the step";
  }

  // What their loop showed of a line (the applied check), in ranking order. A line whose part gained but
  // whose loop did not is named, but below the lines that are what limits their loop on this device.
  static constexpr const char* kConfirmed = "confirmed on their loop";
  // the loader's loop loads each sample at an assumed cost (its supply), not theirs: never confirmed
  static constexpr const char* kModelled = "modelled on their loop (a per-sample load cost assumed, not theirs)";
  static constexpr const char* kOnceOthers = "a limit once the others are fixed";
  static constexpr const char* kUnsteady = "unsteady on their loop";
  static constexpr const char* kNoGain = "no gain on their loop here";
  static int verdict_rank(const Finding& f) {
    const std::string v = f.evidence.value("verdict", std::string(kConfirmed));  // not applied: its part's figure
    return v == kConfirmed ? 0 : v == kModelled ? 1 : v == kOnceOthers ? 2 : v == kUnsteady ? 3 : 4;
  }
  // confirmed: at least 1.10x alone in both passes; once the others are fixed: under 1.10x alone in both,
  // at least 1.10x added last to every other line (a loader that keeps up with a slow step falls behind a
  // fast one); unsteady: the passes fall on both sides of 1.10x; no gain: under 1.10x every way it ran.
  static const char* verdict_of(double alone, std::optional<double> again, std::optional<double> last) {
    const bool a1 = alone >= kMinGain, a2 = again && *again >= kMinGain, l = last && *last >= kMinGain;
    if (a1 && (!again || a2)) return kConfirmed;
    if (!a1 && !a2 && l) return kOnceOthers;
    if (a1 || a2 || l) return kUnsteady;
    return kNoGain;
  }

  // A finding's claim becomes its gain on the training loop and is
  // checked against a second measurement.
  void settle(Finding& f, double part, double step_gain, std::optional<double> again, const std::string& param,
              std::optional<double> last = std::nullopt, const std::string& note = {}) {
    const std::string check = f.evidence.value("check", std::string());
    const bool step_level = !param.empty();
    if (step_level) {
      f.evidence["part_gain"] = part;
      f.evidence["step_gain"] = step_gain;
      f.evidence["applied"] = param;
      f.speedup = step_gain;
    }
    std::string held;
    if (last) {
      f.evidence["last_gain"] = *last;
      held += fmt::format("; {:.2f}x when added last, to every other line", *last);
    }
    if (again) {
      const bool holds = std::abs(*again / step_gain - 1.0) <= 0.15;
      f.evidence["repeat_gain"] = *again;
      f.evidence["holds"] = holds;
      held += holds ? fmt::format("; alone again: {:.2f}x, within 15%", *again)
                    : fmt::format("; alone again: {:.2f}x, {:.0f}% off: noisy here", *again,
                                  100 * std::abs(*again / step_gain - 1.0));
    }
    // The attention and padding parts ran at their sequence length (up to 2048 tokens on a CPU), the loop at
    // the shape this device runs in the budget (256 for the default config's 2048): the two gains are of two
    // shapes, and eager attention's cost grows with the sequence, so its loop gain understates a job's.
    if (step_level && (check == "attention" || check == "padding") && long_seq() != shape_.seq) {
      f.evidence["part_seq_len"] = long_seq();
      f.evidence["loop_seq_len"] = shape_.seq;
      held += fmt::format("; its part ran at {} tokens per sequence, their loop at {} (the shape this device runs "
                          "in the budget){}",
                          long_seq(), shape_.seq,
                          check == "attention" ? ": eager attention's cost grows with the sequence, so in a job at "
                                                 "the full length it weighs more than on this loop"
                                               : "");
    }
    held += note;
    const std::string line = f.evidence.value("config_line", std::string());
    const std::string evidence = f.evidence.value("evidence", std::string());
    const char* how = ctx_.device.info().simulated ? "modelled" : "measured";
    const char* verdict = step_level ? verdict_of(step_gain, again, last) : kConfirmed;
    if (check == "loader" && verdict == kConfirmed) verdict = kModelled;
    if (step_level) f.evidence["verdict"] = verdict;
    // how the gain was had: the loader's rests on an assumed load cost whatever the loop showed
    f.evidence["basis"] = ctx_.device.info().simulated || check == "loader" || check == "memory" ? "modelled" : "measured";
    if (step_level)
      f.summary = fmt::format("{}: {}{}: {:.2f}x {} on their training loop with {} alone ({:.2f}x on {} alone){} -> {} ({})",
                              check, verdict,
                              verdict != kNoGain ? ""
                              // the loader inline is named whatever its part read (1.01x on a 2-core Xeon): "by its
                              // part" would name a figure that did not gain
                              : check == "loader" && part < kMinGain ? " (named because the loader runs inline, not by its part's gain; on "
                                                  "this device it is not what limits their loop)"
                                                : " (named by its part alone; on this device it is not what limits "
                                                  "their loop)",
                              step_gain, how, param, part, part_name(check), held, line, evidence);
    else if (!held.empty())
      f.summary += held;
  }

  // The rate an MFU is over, per dtype: the expected file's datasheet peak; else (a CPU, whose files have no
  // peaks: two machines of one kind, 2 logical cores each, ran the same bare oneDNN loop at 0.39-0.46 and 1.68
  // TFLOP/s bf16; a GPU with no file) a square GEMM of that dtype measured in this run, on this device: what its
  // GEMM reaches here, not a datasheet figure, and the report says which. Measured once a dtype.
  struct Peak {
    double tflops = 0;
    std::string source;
    bool measured = false;
  };
  std::map<DType, std::optional<Peak>> peaks_;
  json peak_runs_ = json::object();    // dtype -> the ceiling's run, compacted
  json peak_failed_ = json::object();  // dtype -> why its ceiling has no figure
  std::optional<Peak> mfu_peak(DType dt) {
    if (const auto it = peaks_.find(dt); it != peaks_.end()) return it->second;
    std::optional<Peak> out;
    if (ctx_.expected)
      if (auto pk = ctx_.expected->peak_tflops(dt)) out = Peak{pk->first, pk->second, false};
    if (!out && !ctx_.device.info().simulated && !hung_ && !ctx_.device.gemm_unsupported(dt)) {
      const int size = ctx_.device.info().kind == DeviceKind::cuda ? 8192 : 2048;
      const std::string name(to_string(dt));
      opt_.say(fmt::format("diagnose: MFU: no datasheet peak for {} here; measuring a {}^3 {} GEMM", name, size, name));
      const Sub c = sub("precision", {fmt::format("size={}", size), "dtype=" + name, "trials=3"});
      peak_runs_[name] = compact(c);
      const Point* q = c.point("dtype", name);
      if (q && q->status == Status::ok && metric(*q, "tflops") && metric(*q, "tflops")->value > 0) {
        out = Peak{metric(*q, "tflops")->value,
                   fmt::format("this device's {}^3 {} GEMM rate, measured in this run ({}), not a datasheet peak",
                               size, name, c.command),
                   true};
      } else {
        // no MFU for this dtype, and the report says why rather than leaving the line out unexplained
        const std::string why = !q ? std::string("no point")
                                   : fmt::format("{}{}", to_string(q->status), q->reason.empty() ? "" : ": " + q->reason);
        peak_failed_[name] = why;
        opt_.say(fmt::format("diagnose: MFU: the {} GEMM did not run ({}): no MFU over {}", name, why, name));
      }
    }
    peaks_[dt] = out;
    return out;
  }

  Point summary() {
    Point p = check_point("summary");
    // Every line changes one parameter of their training loop (the applied
    // check): the figure after the fixes is that loop with them all applied,
    // measured. Without it (no line applied, or the loop failed), the step's
    // figure and the product of the claimed gains, said to be an estimate.
    double gain = together_.value_or(1);
    json in_loop = json::array(), outside = json::array();
    for (const Finding& f : found_) {
      if (!f.speedup) continue;
      const std::string check = f.evidence.value("check", std::string());
      if (f.evidence.contains("step_gain"))
        in_loop.push_back(check);
      else {
        outside.push_back(check);
        if (!together_) gain *= std::max(1.0, *f.speedup);
      }
    }
    if (loop_now_ > 0) {
      p.add({"tokens_per_s_now", loop_now_, "tokens/s", Direction::higher, std::nullopt,
             "their training loop as configured (loader, collation, step) at the measured shape: real tokens/s"});
      p.add({"tokens_per_s_after_estimate", loop_after_ > 0 ? loop_after_ : loop_now_ * gain, "tokens/s",
             Direction::higher, std::nullopt,
             loop_after_ > 0 ? (ctx_.device.info().simulated
                                    ? "the same loop with every recommended line applied, modelled (simulated)"
                                    : "the same loop with every recommended line applied, measured")
                             : "estimated: the claimed gains multiplied, as if independent"});
    } else if (tokens_per_s_ > 0) {
      p.add({"tokens_per_s_now", tokens_per_s_, "tokens/s", Direction::higher, std::nullopt,
             "their step at the measured shape (the utilization check): no loader, no padding"});
      p.add({"tokens_per_s_after_estimate", tokens_per_s_ * gain, "tokens/s", Direction::higher, std::nullopt,
             found_.empty() ? "the same: no line to apply" : "estimated: the claimed gains multiplied, as if independent"});
    }
    // Model FLOPs per token, PaLM's definition (its appendix B; nanoGPT's estimate_mfu): 6N for the
    // weights' forward and backward plus 12 L H Q T for attention's scores and values (H Q = hidden,
    // T = the sequence), N the measured layers' 2 x (hidden (hidden + 2 kv) + hidden^2 + 2 hidden d_ff)
    // parameters (Q; K and V at the K/V heads, kv = their heads x head size; O; the MLP's two matrices,
    // d_ff wide: the decoder step's, a gated MLP's FLOPs at 1.5 its intermediate size). Embeddings and the
    // LM head are not in the measured step, so not counted.
    const double h = double(shape_.hidden), ff = double(shape_.ffn), layers = 2.0;
    const double kvw = double(shape_.kv_heads) * h / double(std::max<std::int64_t>(1, shape_.heads));
    const double flops_per_token =
        6.0 * layers * (h * (h + 2.0 * kvw) + h * h + 2.0 * h * ff) + 12.0 * layers * h * double(shape_.seq);
    const std::string mfu_what =
        kvw == h ? fmt::format("{} model FLOPs per token (6N + 12 L H Q T, PaLM's: N = 2 layers x (4 x {}^2 + 2 x {} "
                               "x {}), T = {})",
                               format_number(flops_per_token), shape_.hidden, shape_.hidden, shape_.ffn, shape_.seq)
                 : fmt::format("{} model FLOPs per token (6N + 12 L H Q T, PaLM's: N = 2 layers x ({} x ({} + 2 x {}) "
                               "+ {}^2 + 2 x {} x {}), K and V at {} of {} heads, T = {})",
                               format_number(flops_per_token), shape_.hidden, shape_.hidden, kvw, shape_.hidden,
                               shape_.hidden, shape_.ffn, shape_.kv_heads, shape_.heads, shape_.seq);
    // their dtype, and the one the loop ran in with every line (the dtype line's, where it applied)
    const DType now_dt = opt_.cfg.bf16 ? DType::bf16 : opt_.cfg.fp16 ? DType::fp16 : DType::fp32;
    DType after_dt = now_dt;
    for (const Applied& x : applied_)
      for (const auto& [k, v] : x.change)
        if (k == "dtype") after_dt = v == "bf16" ? DType::bf16 : v == "fp16" ? DType::fp16 : DType::fp32;
    // One MFU figure: real (or, for the step, computed) tokens/s x FLOPs per token over the rate of the dtype
    // it ran in; the rates used say what the line is over, and each loop figure's is kept beside it.
    bool peak_measured = false, peak_datasheet = false;
    json peak_of = json::object();  // figure -> {dtype, tflops}
    auto add_mfu = [&](const char* name, double tps, DType dt, const char* what, const char* tokens) {
      if (tps <= 0) return;
      const auto peak = mfu_peak(dt);
      if (!peak) return;
      (peak->measured ? peak_measured : peak_datasheet) = true;
      peak_of[name] = json{{"dtype", to_string(dt)}, {"tflops", peak->tflops}};
      p.add({name, 100.0 * flops_per_token * tps / 1e12 / peak->tflops, "%", Direction::higher, std::nullopt,
             fmt::format("{}: {} x {} over {} TFLOP/s ({}, {})", what, mfu_what, tokens, format_number(peak->tflops),
                         to_string(dt), peak->source)});
    };
    if (tokens_per_s_ > 0) {
      add_mfu("mfu_pct", tokens_per_s_, now_dt, "their step", "tokens/s");
      // the loop's, in real tokens (model FLOPs count useful tokens only), before and after the fixes, each
      // over the peak of the dtype it ran in
      add_mfu("mfu_now_pct", loop_now_, now_dt, "their loop as configured", "real tokens/s");
      add_mfu("mfu_after_pct", loop_after_, after_dt, "their loop with every line", "real tokens/s");
    }
    p.info = json{{"fixes", found_.size()},
                  {"combined_gain", gain},
                  {"combined_gain_measured", together_.has_value()},
                  {"applied_on_the_loop", in_loop},
                  {"not_applied", outside}};
    if (!peak_of.empty())
      p.info["mfu_over"] = peak_measured && peak_datasheet ? "mixed" : peak_measured ? "measured" : "datasheet";
    if (!peak_of.empty()) p.info["mfu_flops_per_token"] = flops_per_token;
    if (peak_of.contains("mfu_now_pct")) p.info["mfu_peak_now"] = peak_of["mfu_now_pct"];
    if (peak_of.contains("mfu_after_pct")) p.info["mfu_peak_after"] = peak_of["mfu_after_pct"];
    if (!peak_runs_.empty()) p.info["mfu_ceiling_runs"] = peak_runs_;
    if (!peak_failed_.empty()) p.info["mfu_ceiling_failed"] = peak_failed_;
    if (found_.empty()) p.info["no_line_to_apply"] = true;
    if (opt_.observed_tokens_per_s) {
      if (shape_.reduced)
        p.info["observed"] = fmt::format(
            "you report {} tokens/s; this device ran a reduced shape ({}), so its figure is not comparable with "
            "your job's: run diagnose on the GPU the job uses",
            format_number(*opt_.observed_tokens_per_s), shape_.note);
      else if (tokens_per_s_ > 0) {
        // the step ran 2 layers; the job runs num_hidden_layers (the embedding and LM head left out)
        const double full = tokens_per_s_ * 2.0 / double(std::max<std::int64_t>(2, opt_.cfg.model.num_hidden_layers));
        p.info["observed"] = fmt::format(
            "you report {} tokens/s; this device {} {} for 2 layers of this config's step, about {} at your {} layers "
            "(scaled by depth; embedding, LM head and loader left out): {}",
            format_number(*opt_.observed_tokens_per_s), ctx_.device.info().simulated ? "models" : "measured",
            format_number(tokens_per_s_), format_number(full), opt_.cfg.model.num_hidden_layers,
            *opt_.observed_tokens_per_s < full
                ? fmt::format("you leave about {:.0f}% on the table, before the fixes above",
                              100.0 * (1.0 - *opt_.observed_tokens_per_s / full))
                : "your job is at or above it");
      }
    }
    return p;
  }

  RunContext& ctx_;
  const Options& opt_;
  json meta_;
  MeasuredShape shape_;
  clk::time_point t0_;
  int checks_ = 0, done_ = 0;
  bool hung_ = false;
  std::string hung_what_;
  double tokens_per_s_ = 0, step_ms_ = 0;
  std::vector<Finding> found_;
  struct Applied {
    std::string check;                                        // the finding's check
    std::vector<std::pair<std::string, std::string>> change;  // the train scenario's parameters the line sets
    std::int64_t micro_batch = 0;                             // the micro batch it sets (the batch line), else 0
  };
  std::vector<Applied> applied_;
  std::optional<double> together_;
  double loop_now_ = 0, loop_after_ = 0;  // the loop's real tokens/s as configured, and with every line
};

}  // namespace

std::int64_t loop_pad_multiple(std::int64_t multiple, bool lengths_from_file, std::int64_t part_seq,
                               std::int64_t loop_seq) {
  if (lengths_from_file || part_seq <= loop_seq) return multiple;
  return std::min(multiple, std::max<std::int64_t>(16, multiple * loop_seq / part_seq));
}

MeasuredShape measured_shape(const TrainConfig& cfg, const DeviceInfo& dev) {
  MeasuredShape s;
  s.micro_batch = cfg.micro_batch_size;
  s.seq = cfg.sequence_len;
  s.hidden = cfg.model.hidden_size;
  s.intermediate = cfg.model.active_intermediate();  // a mixture of experts: the width a token runs through
  s.gated = cfg.model.gated_mlp;
  s.ffn = cfg.model.step_ffn();
  s.heads = cfg.model.num_attention_heads;
  s.kv_heads = cfg.model.kv_heads();
  // the MLP as the step runs it: a gated one as two matrices of 1.5 its intermediate size
  auto mlp_note = [&] {
    const auto& m = cfg.model;
    const std::string experts =
        m.moe() ? fmt::format(" (a mixture of experts: the {} of {} experts of {} a token runs{})", m.num_experts_per_tok,
                              m.num_experts, m.expert_intermediate(),
                              m.shared_expert_intermediate_size > 0
                                  ? fmt::format(" and the shared one of {}", m.shared_expert_intermediate_size)
                                  : std::string())
                : std::string();
    return s.gated ? fmt::format("; a gated MLP (3 x hidden x {}{}) run as two hidden x {} matrices, the same FLOPs",
                                 s.intermediate, experts, s.ffn)
                   : fmt::format("; a plain MLP (2 x hidden x {}{})", s.intermediate, experts);
  };
  if (dev.kind == DeviceKind::cpu) {
    // a CPU cannot run a 7B layer in the budget: hidden to at most 256 (the heads' count kept when it
    // divides, else 4), the intermediate size in the model's ratio, sequence length to at most 256
    const std::int64_t h = std::min<std::int64_t>(s.hidden, 256);
    std::int64_t heads = std::min<std::int64_t>(s.heads, h / 32 > 0 ? h / 32 : 1);
    while (heads > 1 && h % heads) --heads;
    const std::int64_t inter = std::max<std::int64_t>(h, s.intermediate * h / std::max<std::int64_t>(1, s.hidden));
    const std::int64_t seq = std::min<std::int64_t>(s.seq, 256);
    // the K/V heads in the model's share of the heads (grouped-query attention), at least one, a divisor
    std::int64_t kv = std::max<std::int64_t>(1, heads * s.kv_heads / std::max<std::int64_t>(1, s.heads));
    while (kv > 1 && heads % kv) --kv;
    s.reduced = h != s.hidden || seq != s.seq || heads != s.heads || inter != s.intermediate;
    const std::string kv_note =
        s.kv_heads != s.heads && kv != s.kv_heads ? fmt::format(", K/V heads {} -> {}", s.kv_heads, kv) : std::string();
    s.note = s.reduced ? fmt::format("hidden {} -> {}, intermediate {} -> {}, heads {} -> {}{}, sequence {} -> {}, 2 "
                                     "layers: a CPU cannot run the full shape in the budget",
                                     s.hidden, h, s.intermediate, inter, s.heads, heads, kv_note, s.seq, seq)
                       : "the config's own shape, 2 layers";
    s.kv_heads = kv;
    s.hidden = h;
    s.intermediate = inter;
    s.ffn = s.gated ? inter * 3 / 2 : inter;
    s.heads = heads;
    s.seq = seq;
  } else {
    s.note = "the config's own shape, 2 layers";
  }
  s.note += mlp_note();
  return s;
}

Result run(RunContext& ctx, const Options& opt, const nlohmann::ordered_json& meta) {
  Diagnosis d(ctx, opt, meta);
  return d.run();
}

}  // namespace sb::diagnose
