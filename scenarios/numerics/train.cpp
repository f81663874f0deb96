// The numerics training loop and its detectors (definitions in train.hpp).
#include "scenarios/numerics/train.hpp"

#include <algorithm>  // std::max, std::nth_element
#include <chrono>     // std::chrono
#include <cmath>      // std::isfinite, std::sqrt, std::log
#include <limits>     // std::numeric_limits
#include <numeric>    // std::accumulate

#include "harness/device.hpp"  // Device, EventPtr
#include "harness/random.hpp"  // uniform_pm1

namespace sb::numerics {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const std::size_t k = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(k), v.end());
  return v[k];
}

// The mean of a window's finite values (a step skipped for a non-finite loss, as GradScaler or
// skip_nonfinite skips it, is not the window's trend: with it in, one NaN blinded the plateau detector for
// two windows); NaN when fewer than half are finite.
double mean_of(const std::vector<double>& v, std::size_t from, std::size_t to) {
  double s = 0;
  std::size_t n = 0;
  for (std::size_t i = from; i < to; ++i)
    if (std::isfinite(v[i])) s += v[i], ++n;
  return 2 * n >= to - from && n > 0 ? s / double(n) : std::numeric_limits<double>::quiet_NaN();
}

// A box-Muller normal from two counter-based uniforms.
double normal(std::uint64_t seed, std::uint64_t i) {
  const double u1 = (double(uniform_pm1(seed, 2 * i)) + 1.0) * 0.5 + 1e-12;
  const double u2 = (double(uniform_pm1(seed, 2 * i + 1)) + 1.0) * 0.5;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace

Dataset make_dataset(const TrainSpec& spec, int batches, std::uint64_t teacher_seed, std::uint64_t seed) {
  const MlpConfig& m = spec.model;
  Dataset d;
  d.rows = m.batch * batches;
  const std::int64_t hidden = 64;
  std::vector<double> w1(std::size_t(hidden * m.in)), w2(std::size_t(m.out * hidden));
  for (std::size_t i = 0; i < w1.size(); ++i) w1[i] = 2.0 * uniform_pm1(teacher_seed ^ 0x7eac4e5, i) / std::sqrt(double(m.in));
  for (std::size_t i = 0; i < w2.size(); ++i) w2[i] = 2.0 * uniform_pm1(teacher_seed ^ 0x7eac4e6, i) / std::sqrt(double(hidden));
  d.x.resize(std::size_t(d.rows * m.in));
  for (std::size_t i = 0; i < d.x.size(); ++i) d.x[i] = uniform_pm1(seed ^ 0xda7a, i);
  std::vector<double> out(std::size_t(d.rows * m.out));
  std::vector<double> h(static_cast<std::size_t>(hidden));
  for (std::int64_t r = 0; r < d.rows; ++r) {
    for (std::int64_t j = 0; j < hidden; ++j) {
      double s = 0;
      for (std::int64_t i = 0; i < m.in; ++i) s += w1[std::size_t(j * m.in + i)] * d.x[std::size_t(r * m.in + i)];
      h[std::size_t(j)] = std::tanh(s);
    }
    for (std::int64_t o = 0; o < m.out; ++o) {
      double s = 0;
      for (std::int64_t j = 0; j < hidden; ++j) s += w2[std::size_t(o * hidden + j)] * h[std::size_t(j)];
      out[std::size_t(r * m.out + o)] = s;
    }
  }
  if (m.task == Task::regression) {
    double ss = 0, mu = 0;
    for (double v : out) mu += v;
    mu /= double(out.size());
    for (double v : out) ss += (v - mu) * (v - mu);
    const double sd = std::sqrt(ss / double(out.size())) + 1e-12;
    d.y.resize(out.size());
    for (std::size_t i = 0; i < out.size(); ++i)
      d.y[i] = float(spec.target_scale * ((out[i] - mu) / sd + spec.label_noise * normal(seed ^ 0x4015e, i)));
  } else {
    d.y.resize(std::size_t(d.rows));
    for (std::int64_t r = 0; r < d.rows; ++r) {
      std::int64_t best = 0;
      for (std::int64_t o = 1; o < m.out; ++o)
        if (out[std::size_t(r * m.out + o)] > out[std::size_t(r * m.out + best)]) best = o;
      d.y[std::size_t(r)] = float(best);
    }
  }
  return d;
}

TrainRecord train(TrainOps& ops, Device& dev, const TrainSpec& spec, std::int64_t timeout_ms,
                  const std::function<void(int)>& progress) {
  const MlpConfig& mc = spec.model;
  Mlp mlp(ops, mc, spec.seed);
  const StatsLayout& lay = mlp.layout();
  const int L = mlp.layers();
  const Dataset data = make_dataset(spec, spec.dataset_batches, spec.seed + 1000, spec.seed + 2000);
  // the eval set: the same teacher, other inputs
  const Dataset eval = spec.eval_every > 0 ? make_dataset(spec, 2, spec.seed + 1000, spec.seed + 3000) : Dataset{};
  const std::int64_t xb = mc.batch * mc.in, yb = mc.task == Task::regression ? mc.batch * mc.out : mc.batch;
  auto batch_of = [&](const Dataset& d, int i, const std::vector<float>& v, std::int64_t per) {
    const std::size_t n = std::size_t(d.rows / mc.batch);
    const std::size_t k = std::size_t(i) % n;
    return std::span<const float>(v.data() + k * std::size_t(per), std::size_t(per));
  };

  TrainRecord rec;
  rec.layer_norm.assign(std::size_t(L), {});
  rec.zero_frac.assign(std::size_t(L), 0.0);
  rec.tiny_frac.assign(std::size_t(L), 0.0);
  std::vector<float> st(std::size_t(lay.total()) * kStatsPerTensor);
  std::vector<float> lossv(1);
  std::vector<double> step_ms, check_ms, locate_ms;
  double scale = spec.loss_scaling ? spec.init_scale : 1.0;
  int growth = 0, opt_step = 0, evals_bad = 0;
  double best_eval = std::numeric_limits<double>::infinity();
  bool weights_poisoned = false;
  const auto t0 = std::chrono::steady_clock::now();
  int s = 0;
  bool have_initial = false;  // a finite loss seen: initial_loss holds the first
  int initial_step = 0;
  for (; s < spec.max_steps; ++s) {
    if (s % 50 == 0) progress(s);
    mlp.set_batch(batch_of(data, s, data.x, xb), batch_of(data, s, data.y, yb));
    const EventPtr e0 = dev.record();
    mlp.forward_backward(float(scale * spec.loss_mult), s, spec.inject);
    const EventPtr e1 = dev.record();
    mlp.grad_stats();
    const EventPtr e2 = dev.record();
    mlp.act_stats();
    const EventPtr e3 = dev.record();
    ops.download(mlp.stats(), st, timeout_ms);
    ops.download(mlp.loss(), lossv, timeout_ms);
    const double loss = lossv[0];
    rec.loss.push_back(loss);
    rec.loss_scale.push_back(scale);
    // the first finite loss: the divergence test's reference (a NaN at step 0, injected and skipped,
    // turned that test off for the rest of the run)
    if (!have_initial && std::isfinite(loss)) {
      rec.initial_loss = loss;
      have_initial = true;
      initial_step = s;
    }

    // what the stats say
    bool grads_finite = true;
    double sumsq = 0;
    for (int l = 0; l < L; ++l) {
      const TensorStats w = read_stats(st, lay.dw(l)), b = read_stats(st, lay.db(l));
      grads_finite = grads_finite && w.nonfinite == 0 && b.nonfinite == 0;
      sumsq += w.sumsq + b.sumsq;
      const double n = double(mlp.out_of(l) * mlp.in_of(l));
      rec.layer_norm[std::size_t(l)].push_back(w.nonfinite == 0 ? std::sqrt(w.sumsq) / scale
                                                                  : std::numeric_limits<double>::quiet_NaN());
      rec.zero_frac[std::size_t(l)] += w.zero / n;
      rec.tiny_frac[std::size_t(l)] += w.tiny / n;
    }
    const double gnorm = grads_finite ? std::sqrt(sumsq) / scale : std::numeric_limits<double>::quiet_NaN();
    rec.grad_norm.push_back(gnorm);
    if (!grads_finite && rec.grad_check_step < 0) rec.grad_check_step = s;
    if (!std::isfinite(loss) && rec.loss_nan_step < 0) rec.loss_nan_step = s;
    if (rec.first_nonfinite.step < 0) {
      for (int l = 0; l < L && rec.first_nonfinite.step < 0; ++l)
        if (read_stats(st, lay.act(l)).nonfinite > 0) rec.first_nonfinite = {s, l, "activation"};
      for (int l = L - 1; l >= 0 && rec.first_nonfinite.step < 0; --l)
        if (read_stats(st, lay.dw(l)).nonfinite > 0 || read_stats(st, lay.db(l)).nonfinite > 0)
          rec.first_nonfinite = {s, l, "gradient"};
    }

    // the update: GradScaler's rules, or a plain skip of non-finite steps
    bool skip = false;
    if (!grads_finite && (spec.loss_scaling || spec.skip_nonfinite)) {
      skip = true;
      ++rec.skipped_steps;
      if (spec.loss_scaling) {
        scale *= 0.5;
        growth = 0;
      }
    }
    const EventPtr e4 = dev.record();
    if (!skip) {
      double coef = 1.0;
      // a finite gradient whose norm overflowed fp32 (over 1.8e19): no finite coefficient clips it, so the
      // update is dropped (coef 0) rather than applied unclipped
      if (spec.clip > 0) coef = std::isfinite(gnorm) ? std::min(1.0, spec.clip / (gnorm + 1e-6)) : 0.0;
      const float gs = float(coef / scale);
      ++opt_step;
      if (spec.optimizer == Optimizer::sgd)
        mlp.sgd(float(spec.lr), float(spec.weight_decay), gs);
      else
        mlp.adamw(float(spec.lr), 0.9f, 0.999f, 1e-8f, float(spec.weight_decay), opt_step, gs);
      if (!grads_finite) weights_poisoned = true;
      if (spec.loss_scaling && ++growth >= spec.growth_interval) {
        scale *= 2.0;
        growth = 0;
      }
    }
    const EventPtr e5 = dev.record();
    dev.synchronize(std::chrono::milliseconds(timeout_ms));
    step_ms.push_back(dev.elapsed_ms(e0, e1) + dev.elapsed_ms(e4, e5));
    check_ms.push_back(dev.elapsed_ms(e1, e2));
    locate_ms.push_back(dev.elapsed_ms(e2, e3));

    // detectors that end the run
    if (!std::isfinite(loss) && weights_poisoned) {
      rec.outcome = spec.inject.active ? "nan" : "diverged";
      if (!spec.inject.active) rec.diverged_step = s;
      rec.outcome_step = s;
      ++s;
      break;
    }
    if (std::isfinite(loss) && have_initial && s > initial_step && loss > 10.0 * rec.initial_loss) {
      rec.outcome = "diverged";
      rec.diverged_step = rec.outcome_step = s;
      break;
    }
    if (!std::isfinite(loss) && !spec.inject.active && !spec.loss_scaling && !spec.skip_nonfinite) {
      rec.outcome = "diverged";
      rec.diverged_step = rec.outcome_step = s;
      break;
    }
    if (spec.target_loss > 0 && std::isfinite(loss) && loss <= spec.target_loss && rec.target_step < 0) {
      rec.target_step = s;
      if (spec.eval_every == 0) {
        rec.outcome = "target";
        rec.outcome_step = s;
        ++s;
        break;
      }
    }
    const int W = spec.plateau_window;
    if (W > 0 && spec.eval_every == 0 && s + 1 >= 2 * W && (s + 1) % 10 == 0) {
      const std::size_t n = rec.loss.size();
      const double cur = mean_of(rec.loss, n - std::size_t(W), n), prev = mean_of(rec.loss, n - 2 * std::size_t(W), n - std::size_t(W));
      if (std::isfinite(cur) && std::isfinite(prev) && prev > 0 && (prev - cur) / prev < spec.plateau_tol) {
        rec.plateau_step = s;
        const double r = std::log(prev / cur) / double(W);
        rec.est_steps_to_target = r > 0 && spec.target_loss > 0 ? std::log(cur / spec.target_loss) / r
                                                                  : std::numeric_limits<double>::infinity();
        rec.outcome = "stalled";
        rec.outcome_step = s;
        ++s;
        break;
      }
    }
    if (spec.eval_every > 0 && (s + 1) % spec.eval_every == 0) {
      double ev = 0;
      const int nb = int(eval.rows / mc.batch);
      for (int i = 0; i < nb; ++i) {
        mlp.set_batch(batch_of(eval, i, eval.x, xb), batch_of(eval, i, eval.y, yb));
        mlp.forward_loss();
        ops.download(mlp.loss(), lossv, timeout_ms);
        ev += lossv[0] / nb;
      }
      if (ev < best_eval - spec.min_delta) {
        best_eval = ev;
        rec.best_step = s;
        rec.best_eval = ev;
        evals_bad = 0;
      } else if (++evals_bad >= spec.patience) {
        rec.stop_step = s;
        rec.stop_eval = ev;
        rec.outcome = "stopped";
        rec.outcome_step = s;
        ++s;
        break;
      }
    }
  }
  rec.steps = int(rec.loss.size());
  rec.next_scale = scale;
  if (rec.outcome.empty()) {
    rec.outcome = "max-steps";
    rec.outcome_step = rec.steps - 1;
  }
  if (rec.loss_nan_step >= 0) {
    const int E = std::max(1, spec.epoch_steps);
    rec.epoch_check_step = (rec.loss_nan_step / E + 1) * E - 1;
  }
  const double steps = double(std::max<std::size_t>(1, rec.loss.size()));
  for (int l = 0; l < L; ++l) {
    rec.zero_frac[std::size_t(l)] /= steps;
    rec.tiny_frac[std::size_t(l)] /= steps;
  }
  rec.final_loss = rec.loss.empty() ? 0 : rec.loss.back();
  rec.best_loss = std::numeric_limits<double>::infinity();
  for (double v : rec.loss)
    if (std::isfinite(v)) rec.best_loss = std::min(rec.best_loss, v);
  rec.step_ms = median(step_ms);
  rec.check_ms = median(check_ms);
  rec.locate_ms = median(locate_ms);
  rec.wall_step_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
  return rec;
}

}  // namespace sb::numerics
