// The detectors of curves.hpp over a real run's log: figures first, then the decision.
#include "diagnose/run/curves.hpp"

#include <algorithm>  // std::nth_element, std::max_element, std::min
#include <cmath>      // std::isfinite, std::isnan, std::fabs, std::cos
#include <optional>   // std::optional

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

namespace sb::diagnose {

namespace {

// The thresholds of the definitions in curves.hpp.
constexpr double kDivergeFactor = 3.0;
constexpr double kExplodingNorm = 1e3;
constexpr double kVanishingNorm = 1e-6;
constexpr double kPlateauChange = 0.02;
constexpr double kPlateauFloor = 0.05;
constexpr double kLowPeakLr = 2e-5;
constexpr int kEvalsPastBest = 3;
constexpr std::size_t kSpikeLogs = 5;  // logs in a row over 3x that make a recovered spike divergence

constexpr double kPi = 3.14159265358979323846;

std::string num(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  return fmt::format("{:.4g}", x);
}

bool finite(const std::optional<double>& x) { return x && std::isfinite(*x); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const auto mid = v.begin() + std::ptrdiff_t(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

std::vector<const TrainerLogEntry*> training(const TrainerState& s) {
  std::vector<const TrainerLogEntry*> out;
  for (const auto& e : s.log)
    if (e.is_train()) out.push_back(&e);
  return out;
}

std::string lr_at(const TrainerLogEntry& e) { return e.learning_rate ? num(*e.learning_rate) : "not logged"; }

// What training_args.bin says of the precision: "fp16", "bf16", "none", "" (no file, or not said).
std::string amp_of(const CurveContext& ctx) {
  if (!ctx.args) return "";
  if (ctx.args->fp16.value_or(false)) return "fp16";
  if (ctx.args->bf16.value_or(false)) return "bf16";
  return ctx.args->fp16 && ctx.args->bf16 ? "none" : "";
}

// Why the logged loss is finite beside a non-finite grad_norm: the filter, as the run set it.
std::string nan_filter_line(const CurveContext& ctx) {
  if (!ctx.args || !ctx.args->logging_nan_inf_filter)
    return "the Trainer's logging_nan_inf_filter (on by default) keeps non-finite losses out of the logged loss, so "
           "grad_norm is the evidence";
  if (*ctx.args->logging_nan_inf_filter)
    return "logging_nan_inf_filter is True in training_args.bin: non-finite losses are left out of the logged "
           "loss, so grad_norm is the evidence";
  return "logging_nan_inf_filter is False in training_args.bin: a non-finite loss would have been logged as one; "
         "the losses logged are finite, so the forward pass stayed finite and the backward overflowed";
}

std::optional<CurveFinding> nonfinite(const std::vector<const TrainerLogEntry*>& t, const CurveContext& ctx) {
  std::vector<const TrainerLogEntry*> bad;
  bool loss_bad = false;
  for (const auto* e : t) {
    const bool l = e->loss && !std::isfinite(*e->loss), g = e->grad_norm && !std::isfinite(*e->grad_norm);
    if (l || g) bad.push_back(e);
    loss_bad = loss_bad || l;
  }
  if (bad.empty()) return std::nullopt;
  const TrainerLogEntry& first = *bad.front();
  std::vector<std::string> steps;
  for (std::size_t i = 0; i < bad.size() && i < 8; ++i) steps.push_back(std::to_string(bad[i]->step));
  if (bad.size() > 8) steps.push_back("...");
  CurveFinding f;
  f.kind = "nan";
  f.cause = "numerical stall: NaN or Inf";
  f.step = first.step;
  f.basis = "measured";
  const bool early_few = !loss_bad && bad.size() <= 3 && t.size() >= 20 && bad.back()->step <= t[t.size() / 10]->step;
  if (loss_bad) {
    // the first log whose loss is bad; a grad_norm may have gone bad before it
    const TrainerLogEntry* first_loss = nullptr;
    for (const auto* e : bad)
      if (!first_loss && e->loss && !std::isfinite(*e->loss)) first_loss = e;
    f.summary = fmt::format("{}the loss is {} from step {} ({} of {} logs: steps {})",
                            first_loss == &first ? "" : fmt::format("grad_norm is {} at step {}, and ", num(*first.grad_norm), first.step),
                            num(*first_loss->loss), first_loss->step, bad.size(), t.size(), fmt::join(steps, ", "));
    f.change = amp_of(ctx) == "bf16"
                   ? "find the first bad batch or layer (torch.autograd.detect_anomaly on a short run); max_grad_norm: "
                     "1.0; a lower learning_rate"
                   : "find the first bad batch or layer (torch.autograd.detect_anomaly on a short run); max_grad_norm: "
                     "1.0; bf16: true instead of fp16";
    f.reproduce = "stallbench run numerics -p case=nan,inf -p fix=off,on";
  } else {
    f.summary = fmt::format("grad_norm is {} at step {} ({} of {} logs: steps {}) while the loss stays finite: the "
                            "optimizer skipped {}",
                            num(*first.grad_norm), first.step, bad.size(), t.size(), fmt::join(steps, ", "),
                            bad.size() == 1 ? "that step" : "those steps");
    const std::string amp = amp_of(ctx);
    f.change = amp == "bf16"   ? "bf16 has no loss scaler to skip a step: find the batch or layer that overflows "
                                 "(torch.autograd.detect_anomaly on a short run); a lower learning_rate; max_grad_norm: 1.0"
               : early_few && amp == "fp16" ? "nothing: a few skipped steps at the start are fp16's loss scaler "
                                              "calibrating; bf16: true avoids them"
               : early_few ? "nothing, if the job trains in fp16: a few skipped steps at the start are its loss scaler "
                             "calibrating; bf16: true avoids them"
                           : "bf16: true instead of fp16 (no overflow to skip); else a lower learning_rate and "
                             "max_grad_norm: 1.0";
    f.reproduce = "stallbench run numerics -p case=fp16 -p fix=off,on";
  }
  for (std::size_t i = 0; i < bad.size() && i < 5; ++i)
    f.evidence.push_back(fmt::format("step {}: loss {}, grad_norm {}, learning_rate {}", bad[i]->step,
                                     bad[i]->loss ? num(*bad[i]->loss) : "not logged",
                                     bad[i]->grad_norm ? num(*bad[i]->grad_norm) : "not logged", lr_at(*bad[i])));
  const std::string amp = amp_of(ctx);
  if (early_few && amp == "fp16")
    f.evidence.push_back(fmt::format("all {} within the first tenth of the run and the loss finite, and the run trains "
                                     "in fp16 (training_args.bin): fp16's GradScaler finding its scale",
                                     bad.size()));
  else if (early_few && amp.empty())
    f.evidence.push_back(fmt::format("all {} within the first tenth of the run and the loss finite: the pattern of fp16's "
                                     "GradScaler finding its scale (assumed: the log does not say the dtype)",
                                     bad.size()));
  else if (amp == "bf16" || amp == "none")
    f.evidence.push_back(fmt::format("the run trains {} (training_args.bin): no loss scaler skips steps, so each is a "
                                     "real overflow or a bad batch",
                                     amp == "bf16" ? "in bf16" : "without mixed precision"));
  if (!loss_bad) f.evidence.push_back(nan_filter_line(ctx));
  return f;
}

std::optional<CurveFinding> divergence(const std::vector<const TrainerLogEntry*>& t) {
  std::vector<const TrainerLogEntry*> v;
  for (const auto* e : t)
    if (finite(e->loss)) v.push_back(e);
  double lo = v.empty() ? 0 : *v.front()->loss;
  std::int64_t lo_step = v.empty() ? 0 : v.front()->step;
  for (std::size_t i = 1; i + 1 < v.size(); ++i) {
    if (lo > 0 && *v[i]->loss > kDivergeFactor * lo && *v[i + 1]->loss > kDivergeFactor * lo) {
      const TrainerLogEntry& e = *v[i];
      std::vector<double> tail;
      for (std::size_t k = v.size() - std::min<std::size_t>(5, v.size()); k < v.size(); ++k) tail.push_back(*v[k]->loss);
      const double end = median(tail);
      std::size_t run = 0;  // logs in a row over the threshold
      while (i + run < v.size() && *v[i + run]->loss > kDivergeFactor * lo) ++run;
      // a spike the run recovered from (back under 1.5x its lowest at the end, under 5 logs) is noise, not
      // divergence: small-batch losses jump
      if (end <= 1.5 * lo && run < kSpikeLogs) {
        lo = std::min(lo, *v[i]->loss);
        continue;
      }
      double peak = 0;
      std::int64_t peak_step = e.step;
      for (std::size_t k = i; k < v.size(); ++k)
        if (*v[k]->loss > peak) peak = *v[k]->loss, peak_step = v[k]->step;
      CurveFinding f;
      f.kind = "divergence";
      f.cause = "numerical stall: divergence";
      f.step = e.step;
      f.basis = "measured";
      f.summary = fmt::format("the loss diverges at step {}: {} against {} at step {} ({:.1f}x), and stays up at the "
                              "next log; {}",
                              e.step, num(*e.loss), num(lo), lo_step, *e.loss / lo,
                              end > 1.5 * lo ? fmt::format("it ends at {} ({:.1f}x its lowest)", num(end), end / lo)
                                             : fmt::format("it comes back down (ends at {})", num(end)));
      f.evidence.push_back(fmt::format("step {}: loss {}, grad_norm {}, learning_rate {}", e.step, num(*e.loss),
                                       e.grad_norm ? num(*e.grad_norm) : "not logged", lr_at(e)));
      f.evidence.push_back(fmt::format("the highest loss after it: {} at step {}", num(peak), peak_step));
      if (i > 0 && v[i - 1]->grad_norm && e.grad_norm)
        f.evidence.push_back(fmt::format("grad_norm {} at the log before -> {}", num(*v[i - 1]->grad_norm), num(*e.grad_norm)));
      f.change = e.learning_rate ? fmt::format("a lower learning_rate (it was {} there); warmup_steps; max_grad_norm: 1.0",
                                               num(*e.learning_rate))
                                 : "a lower learning_rate; warmup_steps; max_grad_norm: 1.0";
      f.reproduce = "stallbench run numerics -p case=explode -p fix=off,on";
      return f;
    }
    lo = std::min(lo, *v[i]->loss);
    if (lo == *v[i]->loss) lo_step = v[i]->step;
  }
  return std::nullopt;
}

std::optional<CurveFinding> gradients(const std::vector<const TrainerLogEntry*>& t) {
  std::vector<const TrainerLogEntry*> g;
  for (const auto* e : t)
    if (finite(e->grad_norm)) g.push_back(e);
  std::vector<double> norms;
  for (const auto* e : g) norms.push_back(*e->grad_norm);
  const double med = median(norms);
  // vanishing: every logged norm ~0 (or no norm and every loss exactly 0)
  bool all_zero_loss = !t.empty();
  for (const auto* e : t) all_zero_loss = all_zero_loss && e->loss && *e->loss == 0.0;
  const bool no_grad = !g.empty() && *std::max_element(norms.begin(), norms.end()) < kVanishingNorm;
  if ((no_grad && g.size() >= 5) || (g.empty() && all_zero_loss && t.size() >= 5)) {
    CurveFinding f;
    f.kind = "vanishing";
    f.cause = "numerical stall: vanishing gradients";
    f.step = t.front()->step;
    f.basis = "measured";
    double lr_max = 0;
    for (const auto* e : t)
      if (finite(e->learning_rate)) lr_max = std::max(lr_max, *e->learning_rate);
    f.summary = fmt::format("no gradient: grad_norm {} in all {} logs{}, while the learning rate moves (up to {}): "
                            "nothing is learned",
                            g.empty() ? "not logged" : "under " + num(kVanishingNorm), t.size(),
                            all_zero_loss ? " and the loss exactly 0" : "", num(lr_max));
    if (all_zero_loss)
      f.evidence.push_back("a loss of exactly 0 from the first step: no token counts toward it (every label -100: the "
                           "prompt masked and the answer cut off by sequence_len, or a template that masks the "
                           "answer), or the adapters are not attached to trainable weights (assumed: the log cannot "
                           "tell which)");
    f.change = "check one batch's labels (any not -100?) and that the adapter's parameters require grad";
    f.reproduce = "stallbench run numerics -p case=vanish -p fix=off,on";
    return f;
  }
  const auto big = std::find_if(g.begin(), g.end(), [](const TrainerLogEntry* e) { return *e->grad_norm > kExplodingNorm; });
  if (big == g.end()) return std::nullopt;
  const auto top = std::max_element(g.begin(), g.end(), [](auto* a, auto* b) { return *a->grad_norm < *b->grad_norm; });
  CurveFinding f;
  f.kind = "exploding";
  f.cause = "numerical stall: exploding gradients";
  f.step = (*big)->step;
  f.basis = "measured";
  f.summary = fmt::format("grad_norm {} at step {}{} (median {} over {} logs, highest {} at step {})", num(*(*big)->grad_norm),
                          (*big)->step, big == g.begin() ? ", the first log" : "", num(med), g.size(),
                          num(*(*top)->grad_norm), (*top)->step);
  std::vector<double> losses;
  for (const auto* e : t)
    if (finite(e->loss)) losses.push_back(*e->loss);
  if (losses.size() >= 2 && losses.back() < losses.front())
    f.evidence.push_back(fmt::format("the loss still falls ({} -> {}): grad_norm is logged before clipping, and "
                                     "max_grad_norm (1.0 by default) bounds each update; a norm this size says the "
                                     "loss or inputs are unnormalized (assumed)",
                                     num(losses.front()), num(losses.back())));
  f.change = "max_grad_norm: 1.0 (check it is not 0 or huge); a lower learning_rate; normalize the inputs";
  f.reproduce = "stallbench run numerics -p case=explode -p fix=off,on";
  return f;
}

// The configured schedule beside a plateau (training_args.bin): the peak, the scheduler, the warm-up
// and, where the log has no learning rate there, what the schedule gives where the loss flattened.
void schedule_evidence(const TrainingArgs& a, std::int64_t total, std::int64_t flat_step, bool logged_there,
                       CurveFinding& f) {
  const std::int64_t warm = warmup_of(a, total);
  f.evidence.push_back(fmt::format("configured (training_args.bin): learning_rate {}, lr_scheduler_type {}, warm-up "
                                   "{} steps{}",
                                   a.learning_rate ? num(*a.learning_rate) : "not recorded",
                                   a.lr_scheduler_type.value_or("not recorded"), warm,
                                   total > 0 ? fmt::format(" of {}", total) : ""));
  const auto at = scheduled_lr(a, total, flat_step);
  if (!at || !a.learning_rate || *a.learning_rate <= 0 || logged_there) return;  // the log says it already
  const double share = *at / *a.learning_rate;
  f.evidence.push_back(fmt::format("the schedule gives {} at step {}, where it flattened ({:.0f}% of the peak){}",
                                   num(*at), flat_step, 100 * share,
                                   flat_step < warm ? ": still warming up"
                                   : share < 0.1    ? ": the schedule had decayed it, so the flat end may be the "
                                                      "schedule's, not the rate's level"
                                                    : ""));
}

std::optional<CurveFinding> plateau(const std::vector<const TrainerLogEntry*>& t, const CurveContext& ctx,
                                    std::int64_t state_max_steps) {
  std::vector<const TrainerLogEntry*> v;
  for (const auto* e : t)
    if (finite(e->loss)) v.push_back(e);
  if (v.size() < 8) return std::nullopt;
  const std::size_t half = v.size() / 2, q = std::max<std::size_t>(1, (v.size() - half) / 4);
  std::vector<double> a, b;
  for (std::size_t i = half; i < half + q; ++i) a.push_back(*v[i]->loss);
  for (std::size_t i = v.size() - q; i < v.size(); ++i) b.push_back(*v[i]->loss);
  const double ma = median(a), mb = median(b);
  if (ma <= kPlateauFloor || std::fabs(ma - mb) / ma >= kPlateauChange) return std::nullopt;
  // where it flattened: the first log within the plateau's band (2% over its end)
  std::size_t from = 0;
  while (from < v.size() && *v[from]->loss > mb * (1 + kPlateauChange)) ++from;
  if (from == v.size()) from = half;
  double peak_lr = 0, lr_flat = -1, lr_end = -1;
  for (const auto* e : v)
    if (finite(e->learning_rate)) peak_lr = std::max(peak_lr, *e->learning_rate);
  if (finite(v[from]->learning_rate)) lr_flat = *v[from]->learning_rate;
  if (finite(v.back()->learning_rate)) lr_end = *v.back()->learning_rate;
  // the log without learning_rate (or all 0): the configured peak, from training_args.bin
  const bool configured = peak_lr <= 0 && ctx.args && ctx.args->learning_rate && *ctx.args->learning_rate > 0;
  if (configured) peak_lr = *ctx.args->learning_rate;
  const bool low = peak_lr > 0 && peak_lr < kLowPeakLr;
  CurveFinding f;
  f.kind = "plateau";
  f.cause = low ? "numerical stall: a learning rate too low" : "numerical stall: plateau";
  f.step = v[from]->step;
  f.basis = low ? "assumed" : "measured";
  f.summary = fmt::format("the loss is flat from step {}: {} -> {} over the second half ({:+.1f}%){}", v[from]->step,
                          num(*v[from]->loss), num(*v.back()->loss), (mb - ma) / ma * 100,
                          peak_lr > 0 ? fmt::format(", at a learning rate of {} peak{}{}", num(peak_lr),
                                                    configured ? " (configured)" : "",
                                                    lr_end >= 0 && lr_end < 0.99 * peak_lr ? " decaying to " + num(lr_end)
                                                                                           : "")
                                      : "");
  f.evidence.push_back(fmt::format("median loss {} over the first quarter of the second half, {} over its last",
                                   num(ma), num(mb)));
  if (low && ctx.adapters)
    f.evidence.push_back(fmt::format("this run trains adapters ({}, adapter_config.json): they usually train at 1e-4 to "
                                     "2e-4, so a peak of {} is {:.0f}x under the low end: the likely limit (assumed)",
                                     ctx.adapter_text, num(peak_lr), 1e-4 / peak_lr));
  else if (low && peak_lr < kLowPeakLr / 10)
    f.evidence.push_back(fmt::format("a peak of {} is {:.0f}x under even a full fine-tune's usual 1e-5 (adapters train "
                                     "at 1e-4 to 2e-4): the likely limit (assumed)",
                                     num(peak_lr), 1e-5 / peak_lr));
  else if (low)
    f.evidence.push_back(fmt::format("a peak learning rate under {} is a full fine-tune's rate; LoRA adapters usually "
                                     "train at 1e-4 to 2e-4: if this run trains adapters, the likely limit (assumed: "
                                     "the log does not say what it trains)",
                                     num(kLowPeakLr)));
  else
    f.evidence.push_back(fmt::format("the learning rate is not low (peak {}): the data or the model's capacity may be "
                                     "the limit, or the run has converged",
                                     num(peak_lr)));
  if (lr_flat >= 0) f.evidence.push_back(fmt::format("learning_rate {} where it flattened", num(lr_flat)));
  const std::int64_t total =
      ctx.args && ctx.args->max_steps.value_or(0) > 0 ? *ctx.args->max_steps : state_max_steps;
  if (ctx.args) schedule_evidence(*ctx.args, total, v[from]->step, lr_flat >= 0, f);
  f.change = low ? fmt::format("learning_rate: 10x higher ({}{}), then compare the first few hundred steps",
                               num(10 * peak_lr), ctx.args && warmup_of(*ctx.args, total) == 0 ? ", with warmup_steps" : "")
                 : "stop earlier (the curve has nothing left), or more data";
  f.reproduce = "stallbench run numerics -p case=lr-low -p fix=off,on";
  return f;
}

std::optional<CurveFinding> past_best(const TrainerState& s) {
  if (!s.best_global_step) return std::nullopt;
  const std::int64_t best = *s.best_global_step;
  std::int64_t last = s.global_step;
  std::vector<const TrainerLogEntry*> evals_after;
  const TrainerLogEntry* at_best = nullptr;
  const TrainerLogEntry* last_eval = nullptr;
  for (const auto& e : s.log) {
    last = std::max(last, e.step);
    if (!e.is_eval()) continue;
    if (e.step > best) evals_after.push_back(&e);
    if (e.step == best) at_best = &e;
    last_eval = &e;
  }
  const bool stopped = s.early_stopping_patience && s.early_stopping_patience_counter &&
                       *s.early_stopping_patience_counter >= *s.early_stopping_patience;
  if (!stopped && int(evals_after.size()) < kEvalsPastBest) return std::nullopt;
  CurveFinding f;
  f.step = best;
  f.basis = "measured";
  const std::int64_t wasted = last - best;
  const double share = last > 0 ? 100.0 * double(wasted) / double(last) : 0;
  const std::string metric = s.best_metric ? fmt::format("best_metric {}", num(*s.best_metric)) : "its best metric";
  if (stopped) {
    f.kind = "early_stopping";
    f.cause = "numerical stall: patience too high";
    f.summary = fmt::format("EarlyStoppingCallback stopped the run at step {}{}: the best evaluation ({}) was at step "
                            "{}, {} evaluations and {} steps ({:.0f}% of the run) before",
                            last, s.max_steps > 0 ? fmt::format(" of {}", s.max_steps) : "", metric, best,
                            evals_after.size(), wasted, share);
    f.evidence.push_back(fmt::format("early_stopping_patience {} (counter {}){}", *s.early_stopping_patience,
                                     *s.early_stopping_patience_counter,
                                     s.eval_steps ? fmt::format(", eval_steps {}: at least {} steps past the best "
                                                                "before it can stop",
                                                                *s.eval_steps, *s.eval_steps * *s.early_stopping_patience)
                                                  : ""));
    f.change = fmt::format("early_stopping_patience: {} (or evaluate more often) stops that much sooner",
                           std::max<std::int64_t>(1, *s.early_stopping_patience / 2));
  } else {
    f.kind = "past_best";
    f.cause = "numerical stall: patience too high";
    f.summary = fmt::format("trained {} steps ({:.0f}% of the run) past its best evaluation: {} at step {}, then {} "
                            "evaluations to step {} without improving, and no early stopping",
                            wasted, share, metric, best, evals_after.size(), last);
    f.change = fmt::format("EarlyStoppingCallback(early_stopping_patience={}) with load_best_model_at_end: true and "
                           "metric_for_best_model: it would have stopped by step {}",
                           kEvalsPastBest, kEvalsPastBest <= int(evals_after.size()) ? evals_after[kEvalsPastBest - 1]->step : last);
  }
  if (at_best && at_best->eval_loss && last_eval && last_eval->eval_loss && last_eval != at_best)
    f.evidence.push_back(fmt::format("eval_loss {} at the best step, {} at step {}", num(*at_best->eval_loss),
                                     num(*last_eval->eval_loss), last_eval->step));
  f.reproduce = "stallbench run numerics -p case=patience -p fix=off,on";
  return f;
}

}  // namespace

std::int64_t warmup_of(const TrainingArgs& a, std::int64_t total) {
  // transformers: warmup_steps when over 0 (in 5, a value under 1 is a ratio), else ceil(warmup_ratio x total)
  if (a.warmup_steps && *a.warmup_steps >= 1) return std::int64_t(*a.warmup_steps);
  const double ratio = a.warmup_steps && *a.warmup_steps > 0 ? *a.warmup_steps : a.warmup_ratio.value_or(0);
  return ratio > 0 && total > 0 ? std::int64_t(std::ceil(ratio * double(total))) : 0;
}

// transformers' optimization.py: get_linear_schedule_with_warmup, get_cosine_schedule_with_warmup
// (num_cycles 0.5), get_constant_schedule (no warm-up), get_constant_schedule_with_warmup.
std::optional<double> scheduled_lr(const TrainingArgs& a, std::int64_t total, std::int64_t step) {
  if (!a.learning_rate || !a.lr_scheduler_type) return std::nullopt;
  const std::string& kind = *a.lr_scheduler_type;
  const double peak = *a.learning_rate;
  if (kind == "constant") return peak;
  const std::int64_t warm = warmup_of(a, total);
  if (step < warm && (kind == "linear" || kind == "cosine" || kind == "constant_with_warmup"))
    return peak * double(step) / double(std::max<std::int64_t>(1, warm));
  if (kind == "constant_with_warmup") return peak;
  if (total <= 0) return std::nullopt;
  const double progress = double(step - warm) / double(std::max<std::int64_t>(1, total - warm));
  if (kind == "linear") return peak * std::max(0.0, 1.0 - progress);
  if (kind == "cosine") return peak * std::max(0.0, 0.5 * (1.0 + std::cos(kPi * progress)));
  return std::nullopt;
}

std::vector<CurveFinding> analyze_curves(const TrainerState& s, const CurveContext& ctx) {
  const auto t = training(s);
  std::vector<CurveFinding> out;
  if (auto f = nonfinite(t, ctx)) out.push_back(*f);
  const auto g = gradients(t);
  if (g) out.push_back(*g);
  const auto d = divergence(t);
  if (d) out.push_back(*d);
  // a flat curve after a divergence, or at a loss of 0 without gradients, is that cause's, not a plateau's
  if (!d && !(g && g->kind == "vanishing"))
    if (auto f = plateau(t, ctx, s.max_steps)) out.push_back(*f);
  if (auto f = past_best(s)) out.push_back(*f);
  std::stable_sort(out.begin(), out.end(), [](const CurveFinding& a, const CurveFinding& b) { return a.step < b.step; });
  return out;
}

LoggedThroughput logged_throughput(const TrainerState& s) {
  LoggedThroughput t;
  if (!s.train_samples_per_second && !s.train_runtime_s) {
    t.caveats.push_back("no final summary in this file (a checkpoint-N/trainer_state.json has none; the output "
                        "directory's own has it once training ends)");
    return t;
  }
  t.present = true;
  t.samples_per_s = s.train_samples_per_second.value_or(0);
  t.steps_per_s = s.train_steps_per_second.value_or(0);
  t.runtime_s = s.train_runtime_s.value_or(0);
  if (s.resumed)
    t.caveats.push_back("the run was resumed (its step goes back in the log): the Trainer divides the whole run's "
                        "samples by the resumed part's time, so samples/s overstates");
  return t;
}

}  // namespace sb::diagnose
