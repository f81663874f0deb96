// numerics: training that stalls without an error — NaN/inf propagation,
// fp16 without loss scaling, exploding and vanishing gradients, a learning
// rate too low, an early-stopping patience too high.
//
// Each `case` is a real (small) training run of an MLP on a teacher task
// (train.hpp) with one fault, and with its fix (`fix=on`); the detectors say
// when and where each fault shows. `case=custom` takes every model and
// fault parameter from the command line instead of a preset.
#include <cmath>    // std::isfinite, std::log10
#include <map>      // std::map
#include <regex>    // std::regex: inject=KIND@STEP:LAYER

#include <fmt/format.h>  // fmt::format

#include "harness/host_cpus.hpp"  // HostCpuForHost
#include "harness/errors.hpp"    // UsageError, UnsupportedError
#include "harness/printer.hpp"   // format_number
#include "harness/sampler.hpp"   // sparkline
#include "harness/scenario.hpp"  // Scenario, ScenarioRun
#include "harness/train_ops.hpp"          // TrainOps
#include "scenarios/numerics/train.hpp"   // train, TrainSpec, TrainRecord

namespace sb {
extern const Scenario numerics_scenario;
namespace {

using json = nlohmann::ordered_json;
using namespace numerics;

enum class Case { nan, inf, fp16, bf16, explode, vanish, lr_low, patience, custom };
inline constexpr NameTable<Case, 9> kCaseNames{{{{Case::nan, "nan"},
                                                 {Case::inf, "inf"},
                                                 {Case::fp16, "fp16"},
                                                 {Case::bf16, "bf16"},
                                                 {Case::explode, "explode"},
                                                 {Case::vanish, "vanish"},
                                                 {Case::lr_low, "lr-low"},
                                                 {Case::patience, "patience"},
                                                 {Case::custom, "custom"}}}};
inline constexpr NameTable<Task, 2> kTaskNames{{{{Task::regression, "regression"}, {Task::classification, "classification"}}}};
inline constexpr NameTable<Optimizer, 2> kOptNames{{{{Optimizer::sgd, "sgd"}, {Optimizer::adamw, "adamw"}}}};
inline constexpr NameTable<InjectInto, 2> kIntoNames{{{{InjectInto::activation, "activation"}, {InjectInto::gradient, "gradient"}}}};

// inject=none | nan@STEP:LAYER | inf@STEP:LAYER
Injection parse_inject(const std::string& text) {
  Injection inj;
  if (text == "none" || text.empty()) return inj;
  static const std::regex re(R"(^(nan|inf|-inf)@([0-9]{1,7}):([0-9]{1,4})$)");
  std::smatch m;
  if (!std::regex_match(text, m, re))
    throw UsageError(fmt::format("inject={}: expected none, nan@STEP:LAYER or inf@STEP:LAYER (e.g. nan@50:2)", text));
  inj.active = true;
  inj.value = m[1] == "nan" ? std::numeric_limits<float>::quiet_NaN()
              : m[1] == "inf" ? std::numeric_limits<float>::infinity()
                              : -std::numeric_limits<float>::infinity();
  inj.step = std::stoi(m[2]);
  inj.layer = std::stoi(m[3]);
  return inj;
}
void check_inject(const std::string& text) { (void)parse_inject(text); }

std::string inject_text(const Injection& i) {
  if (!i.active) return "none";
  return fmt::format("{}@{}:{} ({})", std::isnan(i.value) ? "nan" : (i.value > 0 ? "inf" : "-inf"), i.step, i.layer,
                     i.into == InjectInto::activation ? "activation" : "gradient");
}

// The base every preset starts from: a 4-layer relu MLP, AdamW, fp32.
TrainSpec base_spec() {
  TrainSpec s;
  s.model = MlpConfig{.in = 32, .width = 128, .out = 16, .depth = 4, .act = Act::relu, .residual = false,
                      .norm = false, .init_gain = 1.0, .task = Task::regression, .dtype = DType::fp32, .batch = 128};
  s.optimizer = Optimizer::adamw;
  s.lr = 1e-3;
  s.max_steps = 600;
  s.target_loss = 0.08;
  return s;
}

// What fault and fix mean per case. The text says it in the user's terms.
struct Preset {
  TrainSpec spec;
  std::string fault, fix;
};

Preset preset(Case c, bool fix) {
  Preset p{base_spec(), "", ""};
  TrainSpec& s = p.spec;
  switch (c) {
    case Case::nan:
    case Case::inf:
      s.inject.active = true;
      s.inject.value = c == Case::nan ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
      s.inject.step = 50;
      s.inject.layer = c == Case::nan ? 2 : 3;
      s.inject.into = c == Case::nan ? InjectInto::activation : InjectInto::gradient;
      s.skip_nonfinite = fix;
      p.fault = fmt::format("one {} in layer {}'s {} at step {}", c == Case::nan ? "NaN" : "inf", s.inject.layer,
                            c == Case::nan ? "output" : "gradient", s.inject.step);
      p.fix = "skip a step whose gradients are not finite (a finite check before optimizer.step)";
      break;
    case Case::fp16:
    case Case::bf16:
      s.model.dtype = c == Case::fp16 ? DType::fp16 : DType::bf16;
      s.loss_mult = 1.0 / 16384;
      s.loss_scaling = fix;
      p.fault = fmt::format("{} autocast, no loss scaling, gradients as small as a language model's: the loss (a "
                            "mean over 2048 values) divided by 16384 (an LM's mean over 16k tokens of a vocabulary's "
                            "logits makes them smaller still)",
                            to_string(s.model.dtype));
      p.fix = "dynamic loss scaling (GradScaler: 2^16, x0.5 and skip on inf/NaN, x2 after 2000 clean steps)";
      break;
    case Case::explode:
      s.optimizer = Optimizer::sgd;
      s.lr = 0.2;
      s.model.depth = 6;
      s.model.init_gain = 1.5;
      s.clip = fix ? 1.0 : 0.0;
      p.fault = "SGD lr 0.2 on a 6-layer relu MLP initialised 1.5x He";
      p.fix = "clip the gradients' global norm at 1.0 (clip_grad_norm_, max_grad_norm: 1.0)";
      break;
    case Case::vanish:
      s.optimizer = Optimizer::sgd;
      s.lr = 0.1;
      s.model.depth = 12;
      s.model.act = fix ? Act::relu : Act::sigmoid;
      s.model.norm = fix;
      s.model.residual = fix;
      p.fault = "12 sigmoid layers, SGD";
      p.fix = "relu with RMSNorm and residual connections";
      break;
    case Case::lr_low:
      s.lr = fix ? 1e-3 : 1e-7;
      p.fault = "AdamW lr 1e-7";
      p.fix = "AdamW lr 1e-3";
      break;
    case Case::patience:
      s.label_noise = 0.5;
      s.target_loss = 0;
      s.plateau_window = 0;
      s.eval_every = 10;
      s.patience = fix ? 5 : 50;
      s.max_steps = 4000;
      p.fault = "early stopping with patience 50 evals (every 10 steps) on a task whose loss floors at the label noise";
      p.fix = "patience 5 evals";
      break;
    case Case::custom: break;
  }
  return p;
}

std::int64_t parameter_count(const MlpConfig& m) {
  std::int64_t n = 0;
  for (int l = 0; l <= m.depth; ++l) {
    const std::int64_t in = l == 0 ? m.in : m.width, out = l == m.depth ? m.out : m.width;
    n += out * in + out;
  }
  return n;
}

std::string loss_sparkline(const std::vector<double>& loss, std::size_t width = 60) {
  if (loss.empty()) return "";
  double lo = INFINITY, hi = -INFINITY;
  for (double v : loss)
    if (std::isfinite(v) && v > 0) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  if (!std::isfinite(lo)) return "";
  const std::size_t n = std::min(width, loss.size());
  std::vector<double> u(n);
  for (std::size_t b = 0; b < n; ++b) {
    const std::size_t from = b * loss.size() / n, to = std::max(from + 1, (b + 1) * loss.size() / n);
    double s = 0;
    bool bad = false;
    for (std::size_t i = from; i < to; ++i) {
      if (!std::isfinite(loss[i])) bad = true;
      s += std::isfinite(loss[i]) ? loss[i] : 0;
    }
    const double v = s / double(to - from);
    u[b] = bad || hi <= lo ? 1.0 : (std::log(std::max(v, lo)) - std::log(lo)) / (std::log(hi) - std::log(lo));
  }
  return sparkline(u, width);
}

double median_first(const std::vector<double>& v, std::size_t n) {
  std::vector<double> w;
  for (std::size_t i = 0; i < v.size() && w.size() < n; ++i)
    if (std::isfinite(v[i])) w.push_back(v[i]);
  if (w.empty()) return NAN;
  std::nth_element(w.begin(), w.begin() + std::ptrdiff_t(w.size() / 2), w.end());
  return w[w.size() / 2];
}

std::string outcome_text(const TrainRecord& r) {
  if (r.outcome == "target") return fmt::format("target loss at step {}", r.outcome_step);
  if (r.outcome == "nan") return fmt::format("loss NaN from step {}", r.loss_nan_step);
  if (r.outcome == "diverged") return fmt::format("diverged at step {}", r.outcome_step);
  if (r.outcome == "stalled") return fmt::format("stalled at step {} (loss {})", r.outcome_step, format_number(r.final_loss));
  if (r.outcome == "stopped")
    return fmt::format("stopped at step {}, {} steps after the best eval loss (step {})", r.stop_step,
                       r.stop_step - r.best_step, r.best_step);
  return fmt::format("target not reached in {} steps (loss {})", r.steps, format_number(r.final_loss));
}

class NumericsRun : public ScenarioRun {
 public:
  explicit NumericsRun(RunContext& ctx) : ctx_(ctx) {}

  Point run_point(const ParamSet& ps) override {
    Device& dev = ctx_.device;
    const Case c = ps.get_choice("case", kCaseNames);
    const bool fix = ps.get_str("fix") == "on";
    Preset pr = c == Case::custom ? custom(ps) : preset(c, fix);
    TrainSpec& spec = pr.spec;
    if (ps.get_int("steps") > 0) spec.max_steps = int(ps.get_int("steps"));
    spec.seed = std::uint64_t(ps.get_int("seed"));
    if (spec.inject.active && spec.inject.layer > spec.model.depth)
      throw UsageError(fmt::format("inject layer {}: the model has layers 0..{} (the output Linear is {})",
                                   spec.inject.layer, spec.model.depth, spec.model.depth));
    if (dev.info().simulated)
      throw UnsupportedError("a simulated device computes no values: numerics needs real arithmetic (cpu or cuda)");
    // The host thread reads the detectors' stats every step: it keeps a CPU
    // of its own. On a small machine the compute team's spinning workers
    // would otherwise take it (measured on 2 cores: 45 ms wall for a 9 ms step).
    const HostCpuForHost host_cpu(dev);
    auto ops = dev.make_train_ops();
    if (!ops->computes()) throw UnsupportedError("this device's training ops compute nothing");
    const std::string where = fmt::format("numerics case={} fix={}", kCaseNames.name(c), fix ? "on" : "off");
    const std::int64_t timeout_ms = std::int64_t(ctx_.measure.sync_timeout.count());
    const TrainRecord r = train(*ops, dev, spec, timeout_ms, [&](int s) {
      ctx_.progress(fmt::format("{}: step {}/{}", where, s, spec.max_steps));
    });

    Point p;
    if (r.target_step >= 0)
      p.add({"steps_to_target", double(r.target_step), "steps", Direction::lower, std::nullopt,
             fmt::format("first step with loss <= {}", format_number(spec.target_loss))});
    if (std::isfinite(r.final_loss))
      p.add({"final_loss", r.final_loss, spec.model.task == Task::regression ? "MSE" : "nats", Direction::lower, std::nullopt, "training loss at the last step"});
    if (spec.inject.active) {
      if (r.grad_check_step >= 0)
        p.add({"check_latency", double(r.grad_check_step - spec.inject.step), "steps", Direction::lower, std::nullopt,
               "steps from the injection to the per-step finite check of the gradients firing"});
      if (r.epoch_check_step >= 0 && r.grad_check_step >= 0 && r.outcome == "nan")
        p.add({"epoch_check_wasted", double(r.epoch_check_step - r.grad_check_step), "steps", Direction::lower,
               std::nullopt, fmt::format("steps a loss-only check at the end of each {}-step epoch runs on after the "
                                         "per-step check would have stopped", spec.epoch_steps)});
    }
    const double g0 = median_first(r.layer_norm.front(), 20), gl = median_first(r.layer_norm.back(), 20);
    double gmax = 0;
    for (double g : r.grad_norm)
      if (std::isfinite(g)) gmax = std::max(gmax, g);
    p.add({"grad_norm_max", gmax, "L2 norm", Direction::none, std::nullopt, "largest finite global gradient norm (unscaled)"});
    if (std::isfinite(g0) && std::isfinite(gl) && gl > 0)
      p.add({"grad_ratio_first_last", g0 / gl, "x", Direction::none, std::nullopt,
             "||dW|| of layer 0 over the output layer's, median of the first 20 steps: << 1 is vanishing"});
    double zmax = 0;
    for (double z : r.zero_frac) zmax = std::max(zmax, z);
    p.add({"dw_zero_max", 100.0 * zmax, "%", Direction::lower, std::nullopt,
           "largest per-layer share of dW values exactly zero, mean over steps (fp16 underflow shows here)"});
    if (r.skipped_steps > 0)
      p.add({"skipped_steps", double(r.skipped_steps), "steps", Direction::lower, std::nullopt,
             "updates skipped for non-finite gradients"});
    if (r.plateau_step >= 0 && std::isfinite(r.est_steps_to_target))
      p.add({"est_steps_to_target", r.est_steps_to_target, "steps", Direction::lower, std::nullopt,
             "at the loss's rate over the last plateau window (inf: not decreasing)"});
    if (r.stop_step >= 0 && r.best_step >= 0)
      p.add({"steps_after_best", double(r.stop_step - r.best_step), "steps", Direction::lower, std::nullopt,
             "steps early stopping ran after the best eval loss"});
    p.add({"step_ms", r.step_ms, "ms", Direction::lower, std::nullopt,
           "device time of forward, backward and optimizer (median over steps)"});
    p.add({"check_pct", r.step_ms > 0 ? 100.0 * r.check_ms / r.step_ms : 0.0, "%", Direction::lower, std::nullopt,
           "device time of the per-step finite check of the gradients, as a share of step_ms"});

    json layers = json::array();
    for (int l = 0; l < int(r.layer_norm.size()); ++l)
      layers.push_back(json{{"layer", l},
                            {"grad_norm_first20_median", median_first(r.layer_norm[std::size_t(l)], 20)},
                            {"dw_zero_frac", r.zero_frac[std::size_t(l)]},
                            {"dw_tiny_frac", r.tiny_frac[std::size_t(l)]}});
    // series thinned to at most 200 points for the JSON
    auto thin = [](const std::vector<double>& v) {
      json a = json::array();
      const std::size_t stride = std::max<std::size_t>(1, v.size() / 200);
      for (std::size_t i = 0; i < v.size(); i += stride) a.push_back(std::isfinite(v[i]) ? json(v[i]) : json(nullptr));
      return json{{"stride", stride}, {"values", a}};
    };
    p.info = json{{"outcome", r.outcome},
                  {"outcome_step", r.outcome_step},
                  {"outcome_text", outcome_text(r)},
                  {"fault", pr.fault},
                  {"fix", fix ? pr.fix : "off"},
                  {"model", json{{"depth", spec.model.depth}, {"width", spec.model.width}, {"act", to_string(spec.model.act)},
                                 {"norm", spec.model.norm}, {"residual", spec.model.residual},
                                 {"dtype", to_string(spec.model.dtype)}, {"batch", spec.model.batch},
                                 {"parameters", parameter_count(spec.model)}, {"task", kTaskNames.name(spec.model.task)}}},
                  {"optimizer", json{{"name", kOptNames.name(spec.optimizer)}, {"lr", spec.lr}, {"clip", spec.clip},
                                     {"loss_scaling", spec.loss_scaling}, {"skip_nonfinite", spec.skip_nonfinite}}},
                  {"inject", inject_text(spec.inject)},
                  {"steps", r.steps},
                  {"initial_loss", r.initial_loss},
                  {"best_loss", r.best_loss},
                  {"target_loss", spec.target_loss},
                  {"impl", ops->impl()},
                  {"gemm_impl", ops->gemm_impl(spec.model.dtype)},
                  {"wall_step_ms", r.wall_step_ms},
                  {"check_ms", r.check_ms},
                  {"locate_ms", r.locate_ms},
                  {"layers", layers},
                  {"loss_curve", thin(r.loss)},
                  {"grad_norm_curve", thin(r.grad_norm)}};
    host_cpu.record(p);
    if (r.first_nonfinite.step >= 0)
      p.info["first_nonfinite"] = json{{"step", r.first_nonfinite.step}, {"layer", r.first_nonfinite.layer},
                                       {"tensor", r.first_nonfinite.where}};
    if (r.grad_check_step >= 0) p.info["grad_check_step"] = r.grad_check_step;
    if (r.plateau_step >= 0)
      p.info["plateau"] = json{{"step", r.plateau_step},
                               {"est_steps_to_target", std::isfinite(r.est_steps_to_target)
                                                           ? json(r.est_steps_to_target)
                                                           : spec.target_loss <= 0
                                                               ? json("none: no target loss is set (target=0)")
                                                               : json("never: the loss is not decreasing")}};
    if (r.loss_nan_step >= 0) p.info["loss_nan_step"] = r.loss_nan_step;
    if (r.epoch_check_step >= 0) p.info["epoch_check_step"] = r.epoch_check_step;
    // what GradScaler.get_scale() returns after the run's last update (the last step ran at the scale
    // before it: halved after an overflow, doubled after growth_interval clean steps)
    if (spec.loss_scaling) p.info["final_loss_scale"] = r.next_scale;
    if (r.stop_step >= 0) p.info["early_stopping"] = json{{"best_step", r.best_step}, {"best_eval", r.best_eval},
                                                         {"stop_step", r.stop_step}, {"stop_eval", r.stop_eval},
                                                         {"patience", spec.patience}, {"eval_every", spec.eval_every}};
    json lines = json::array();
    lines.push_back(fmt::format("loss {} {}", loss_sparkline(r.loss), outcome_text(r)));
    if (r.first_nonfinite.step >= 0)
      lines.push_back(fmt::format("first non-finite value: step {}, layer {} ({}); per-step gradient check at step {}{}",
                                  r.first_nonfinite.step, r.first_nonfinite.layer, r.first_nonfinite.where,
                                  r.grad_check_step,
                                  r.epoch_check_step >= 0
                                      ? fmt::format(", loss-only epoch check at step {}", r.epoch_check_step)
                                      : std::string()));
    p.info["lines"] = lines;
    return p;
  }

  void analyze(Result& res) override {
    // Without a custom case the custom-only parameters ran nowhere: they leave the result's params (each point
    // keeps them), so the table's fixed line no longer says target=0.05 beside presets that used 0.08.
    const bool any_custom = std::any_of(res.points.begin(), res.points.end(), [](const Point& p) {
      return p.params.value("case", std::string()) == "custom";
    });
    if (!any_custom && res.params.is_object())
      for (const ParamSpec& sp : numerics_scenario.params)
        if (sp.help.rfind("custom:", 0) == 0) res.params.erase(sp.name);
    // pair fix=off with fix=on per case
    std::map<std::string, std::pair<const Point*, const Point*>> pairs;
    for (const Point& p : res.points) {
      if (p.status != Status::ok) continue;
      const std::string c = p.params.value("case", "");
      if (c == "custom") continue;
      auto& pr = pairs[c];
      (p.params.value("fix", "off") == "on" ? pr.second : pr.first) = &p;
    }
    auto txt = [](const Point* p) { return p->info.value("outcome_text", std::string("?")); };
    auto outcome = [](const Point* p) { return p->info.value("outcome", std::string()); };
    auto metric = [](const Point* p, const char* m) { return p->metric(m) ? p->metric(m)->value : NAN; };
    for (const auto& [c, pr] : pairs) {
      const Point* off = pr.first;
      const Point* on = pr.second;
      if (!off && !on) continue;
      const Point* any = off ? off : on;
      json ev = json::object();
      std::string summary;
      const std::string fault = any->info.value("fault", std::string());
      const std::string fixt = on ? on->info.value("fix", std::string()) : std::string();
      if (off) ev["fault"] = json{{"outcome", outcome(off)}, {"step", off->info.value("outcome_step", -1)}};
      if (on) ev["fix"] = json{{"outcome", outcome(on)}, {"step", on->info.value("outcome_step", -1)}};
      if (c == "nan" || c == "inf") {
        const Point* p = off ? off : on;
        const json loc = p->info.value("first_nonfinite", json::object());
        summary = fmt::format("{}: first non-finite value located at step {}, layer {} ({})", fault,
                              loc.value("step", -1), loc.value("layer", -1), loc.value("tensor", std::string("?")));
        if (off) {
          summary += fmt::format("; unchecked: {}", txt(off));
          if (off->metric("epoch_check_wasted"))
            summary += fmt::format("; a per-step gradient check stops it at step {}, a loss-only end-of-epoch check "
                                   "only at step {} ({} steps wasted)",
                                   off->info.value("grad_check_step", -1), off->info.value("epoch_check_step", -1),
                                   int(metric(off, "epoch_check_wasted")));
        }
        if (on) summary += fmt::format(" -> {}: {}", fixt, txt(on));
        ev["location"] = loc;
      } else if (c == "fp16" || c == "bf16") {
        summary = fault;
        if (off)
          summary += fmt::format(": {} (up to {:.1f}% of a layer's dW values are exactly 0)", txt(off),
                                 metric(off, "dw_zero_max"));
        if (on)
          summary += fmt::format(" -> {}: {} (final scale {})", fixt, txt(on),
                                 format_number(on->info.value("final_loss_scale", 0.0)));
        if (c == "bf16" && off && outcome(off) == "target")
          summary += "; bf16 has fp32's exponent range and needs no loss scaling";
      } else if (c == "vanish") {
        summary = fmt::format("{}: ||dW|| of layer 0 / output layer = {} ({})", fault,
                              format_number(metric(off ? off : on, "grad_ratio_first_last")), off ? txt(off) : "?");
        if (on)
          summary += fmt::format(" -> {}: ratio {}, {}", fixt, format_number(metric(on, "grad_ratio_first_last")), txt(on));
      } else if (c == "explode") {
        summary = fmt::format("{}: {} (largest gradient norm {})", fault, off ? txt(off) : "?",
                              off ? format_number(metric(off, "grad_norm_max")) : "?");
        if (on) {
          summary += fmt::format(" -> {}: {}", fixt, txt(on));
          if (outcome(on) != "diverged" && outcome(on) != "nan")
            summary += fmt::format("; it trains: loss {} -> {} in {} steps, largest gradient norm {}",
                                   format_number(on->info.value("initial_loss", 0.0)),
                                   format_number(metric(on, "final_loss")), on->info.value("steps", 0),
                                   format_number(metric(on, "grad_norm_max")));
        }
      } else if (c == "lr-low") {
        summary = fmt::format("{}: {}", fault, off ? txt(off) : "?");
        if (off && off->metric("est_steps_to_target"))
          summary += fmt::format(", about {} steps to the target at that rate",
                                 format_number(metric(off, "est_steps_to_target")));
        if (on) summary += fmt::format(" -> {}: {}", fixt, txt(on));
      } else if (c == "patience") {
        summary = fmt::format("{}: {}", fault, off ? txt(off) : "?");
        if (on) summary += fmt::format(" -> {}: {}", fixt, txt(on));
        if (off && on && off->metric("steps_after_best") && on->metric("steps_after_best"))
          ev["steps_saved"] = metric(off, "steps_after_best") - metric(on, "steps_after_best");
      }
      std::optional<double> gain;
      if (off && on && outcome(on) == "target" && off->metric("steps_to_target") && on->metric("steps_to_target") &&
          metric(on, "steps_to_target") > 0)
        gain = metric(off, "steps_to_target") / metric(on, "steps_to_target");
      ev["case"] = c;
      res.findings.push_back({{}, fmt::format("case {}: {}", c, summary), gain, ev});
    }
  }

 private:
  Preset custom(const ParamSet& ps) {
    Preset p{base_spec(), "custom", "custom"};
    TrainSpec& s = p.spec;
    s.model.depth = int(ps.get_int("depth"));
    s.model.width = ps.get_int("width");
    s.model.batch = ps.get_int("batch");
    s.model.act = ps.get_choice("act", kActNames);
    s.model.norm = ps.get_bool("norm");
    s.model.residual = ps.get_bool("residual");
    s.model.init_gain = ps.get_real("init_gain");
    s.model.task = ps.get_choice("task", kTaskNames);
    s.model.dtype = ps.get_choice("dtype", kDTypeNames);
    if (s.model.dtype != DType::fp32 && s.model.dtype != DType::bf16 && s.model.dtype != DType::fp16)
      throw UsageError(fmt::format("dtype={}: numerics trains in fp32, bf16 or fp16", to_string(s.model.dtype)));
    s.optimizer = ps.get_choice("optimizer", kOptNames);
    s.lr = ps.get_real("lr");
    s.clip = ps.get_real("clip");
    s.loss_scaling = ps.get_str("loss_scale") == "dynamic";
    s.skip_nonfinite = ps.get_bool("skip_nonfinite");
    s.inject = parse_inject(ps.get_str("inject"));
    s.inject.into = ps.get_choice("inject_into", kIntoNames);
    s.target_loss = ps.get_real("target");
    s.eval_every = int(ps.get_int("eval_every"));
    s.patience = int(ps.get_int("patience"));
    s.epoch_steps = int(ps.get_int("epoch_steps"));
    s.label_noise = ps.get_real("label_noise");
    s.loss_mult = ps.get_real("loss_mult");
    if (s.eval_every > 0) s.plateau_window = 0;
    if (ps.get_str("fix") == "on") {
      // the usual safety net, all at once: skip non-finite steps, clip at 1.0
      // (unless a clip was given), dynamic loss scaling under fp16
      s.skip_nonfinite = true;
      if (s.clip == 0) s.clip = 1.0;
      if (s.model.dtype == DType::fp16) s.loss_scaling = true;
    }
    p.fault = fmt::format("custom: {} {} depth {} width {}, {} lr {}{}{}", to_string(s.model.dtype),
                          to_string(s.model.act), s.model.depth, s.model.width, kOptNames.name(s.optimizer),
                          format_number(s.lr), s.clip > 0 ? fmt::format(", clip {}", s.clip) : "",
                          s.inject.active ? ", inject " + inject_text(s.inject) : "");
    return p;
  }

  RunContext& ctx_;
};

}  // namespace

// The model, optimizer and fault parameters: the custom case's; a preset case sets its own.
const std::pair<std::string, std::string> kCustomOnly{"case", "custom"};

extern const Scenario numerics_scenario;
const Scenario numerics_scenario{
    "numerics",
    "training that stalls without an error (NaN, exploding or vanishing gradients, fp16 underflow, lr, patience)",
    "real small trainings with one fault each and its fix: where a NaN starts, steps each detector wastes, "
    "underflow, gradient norms per layer",
    {
        ParamSpec{.name = "case",
                  .type = ParamType::choice,
                  .default_value = "nan,inf,fp16,bf16,explode,vanish,lr-low,patience",
                  .help = "the fault (a preset model and fault; custom: every parameter below)",
                  .choices = {"nan", "inf", "fp16", "bf16", "explode", "vanish", "lr-low", "patience", "custom"},
                  .quick_default = "nan,fp16"},
        ParamSpec{.name = "fix", .type = ParamType::choice, .default_value = "off,on",
                  .help = "off: the fault as is; on: with the case's fix (custom: skip non-finite steps, clip at 1.0, "
                          "dynamic loss scaling under fp16)", .choices = {"off", "on"}},
        ParamSpec{.name = "steps", .type = ParamType::integer, .default_value = "0",
                  .help = "most training steps (0 = the case's)", .unit = "steps", .min = 0, .max = 1000000},
        ParamSpec{.name = "seed", .type = ParamType::integer, .default_value = "1", .help = "data and init seed",
                  .min = 0, .max = 1e15},
        // custom only
        ParamSpec{.name = "depth", .type = ParamType::integer, .default_value = "4", .help = "custom: hidden layers",
                  .unit = "layers", .min = 1, .max = 256, .only_with = kCustomOnly},
        ParamSpec{.name = "width", .type = ParamType::integer, .default_value = "128", .help = "custom: hidden width",
                  .unit = "features", .min = 2, .max = 16384, .only_with = kCustomOnly},
        ParamSpec{.name = "batch", .type = ParamType::integer, .default_value = "128", .help = "custom: batch size",
                  .unit = "samples", .min = 1, .max = 65536, .only_with = kCustomOnly},
        ParamSpec{.name = "act", .type = ParamType::choice, .default_value = "relu", .help = "custom: activation",
                  .choices = {"relu", "gelu", "sigmoid", "tanh"}, .only_with = kCustomOnly},
        ParamSpec{.name = "norm", .type = ParamType::boolean, .default_value = "false",
                  .help = "custom: RMSNorm before each layer after the first", .only_with = kCustomOnly},
        ParamSpec{.name = "residual", .type = ParamType::boolean, .default_value = "false",
                  .help = "custom: residual connections around hidden layers", .only_with = kCustomOnly},
        ParamSpec{.name = "init_gain", .type = ParamType::real, .default_value = "1",
                  .help = "custom: init scale times He (relu/gelu) or Xavier (sigmoid/tanh)", .min = 1e-6, .max = 1e6, .only_with = kCustomOnly},
        ParamSpec{.name = "task", .type = ParamType::choice, .default_value = "regression",
                  .help = "custom: teacher regression (MSE) or classification (cross-entropy)",
                  .choices = {"regression", "classification"}, .only_with = kCustomOnly},
        ParamSpec{.name = "dtype", .type = ParamType::choice, .default_value = "fp32",
                  .help = "custom: compute dtype (autocast; fp32 masters)", .choices = {"fp32", "bf16", "fp16"}, .only_with = kCustomOnly},
        ParamSpec{.name = "loss_scale", .type = ParamType::choice, .default_value = "none",
                  .help = "custom: none or dynamic (GradScaler's rules)", .choices = {"none", "dynamic"}, .only_with = kCustomOnly},
        ParamSpec{.name = "optimizer", .type = ParamType::choice, .default_value = "adamw", .help = "custom: optimizer",
                  .choices = {"sgd", "adamw"}, .only_with = kCustomOnly},
        ParamSpec{.name = "lr", .type = ParamType::real, .default_value = "0.001", .help = "custom: learning rate",
                  .min = 0, .max = 1e6, .only_with = kCustomOnly},
        ParamSpec{.name = "clip", .type = ParamType::real, .default_value = "0",
                  .help = "custom: clip the global gradient norm at this (0 = off)", .min = 0, .max = 1e12, .only_with = kCustomOnly},
        ParamSpec{.name = "skip_nonfinite", .type = ParamType::boolean, .default_value = "false",
                  .help = "custom: skip updates whose gradients are not finite", .only_with = kCustomOnly},
        ParamSpec{.name = "inject", .type = ParamType::text, .default_value = "none",
                  .help = "custom: none, nan@STEP:LAYER, inf@STEP:LAYER or -inf@STEP:LAYER (layers 0..depth, depth = output)",
                  .check = &check_inject, .only_with = kCustomOnly},
        ParamSpec{.name = "inject_into", .type = ParamType::choice, .default_value = "activation",
                  .help = "custom: the layer's output (forward) or the gradient at it (backward)",
                  .choices = {"activation", "gradient"}, .only_with = kCustomOnly},
        ParamSpec{.name = "target", .type = ParamType::real, .default_value = "0.05",
                  .help = "custom: target training loss (0 = none)", .min = 0, .max = 1e12, .only_with = kCustomOnly},
        ParamSpec{.name = "eval_every", .type = ParamType::integer, .default_value = "0",
                  .help = "custom: early stopping's eval interval (0 = no early stopping)", .unit = "steps", .min = 0,
                  .max = 1000000, .only_with = kCustomOnly},
        ParamSpec{.name = "patience", .type = ParamType::integer, .default_value = "10",
                  .help = "custom: evals without improvement before stopping", .unit = "evals", .min = 1,
                  .max = 1000000, .only_with = kCustomOnly},
        ParamSpec{.name = "epoch_steps", .type = ParamType::integer, .default_value = "100",
                  .help = "custom: steps per epoch (the loss-only check's interval)", .unit = "steps", .min = 1,
                  .max = 1000000, .only_with = kCustomOnly},
        ParamSpec{.name = "loss_mult", .type = ParamType::real, .default_value = "1",
                  .help = "custom: the loss times this before the backward (1/N: a loss divided by N accumulated "
                          "micro-batches)",
                  .min = 1e-12, .max = 1e12, .only_with = kCustomOnly},
        ParamSpec{.name = "label_noise", .type = ParamType::real, .default_value = "0",
                  .help = "custom: std of noise on regression targets (the loss floor is its square)", .min = 0,
                  .max = 1e6, .only_with = kCustomOnly},
    },
    [](RunContext& ctx) { return std::make_unique<NumericsRun>(ctx); },
    false,
    // before any point runs: an injection into a layer the model lacks is exit 2
    [](const ParamSet& ps, const RunContext&) {
      if (ps.get_str("case") != "custom") return;
      const Injection inj = parse_inject(ps.get_str("inject"));
      if (inj.active && inj.layer > ps.get_int("depth"))
        throw UsageError(fmt::format("inject={}: the model has layers 0..{} (depth {}; the output Linear is {})",
                                     ps.get_str("inject"), ps.get_int("depth"), ps.get_int("depth"),
                                     ps.get_int("depth")));
    }};

}  // namespace sb
