// The numerics scenario's MLP: forward, backward and optimizer as TrainOps
// calls (the equations are in mlp.hpp).
#include "scenarios/numerics/mlp.hpp"

#include <cmath>  // std::sqrt

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // UsageError
#include "harness/host_memory.hpp"  // reserve_host_memory
#include "harness/random.hpp"  // uniform_pm1

namespace sb::numerics {

float init_bound(Act act, std::int64_t fan_in, std::int64_t fan_out, double gain) {
  const bool he = act == Act::relu || act == Act::gelu;
  return float(gain * (he ? std::sqrt(6.0 / double(fan_in)) : std::sqrt(6.0 / double(fan_in + fan_out))));
}

Mlp::Mlp(TrainOps& ops, const MlpConfig& cfg, std::uint64_t seed) : ops_(ops), cfg_(cfg) {
  if (cfg.depth < 1) throw UsageError("numerics: depth must be at least 1");
  if (cfg.task == Task::classification && cfg.out < 2) throw UsageError("numerics: classification needs out >= 2");
  layout_.layers = layers();
  const DType t = cfg.dtype;
  const std::int64_t B = cfg.batch;
  ls_.resize(std::size_t(layers()));
  for (int l = 0; l < layers(); ++l) {
    Layer& L = ls_[std::size_t(l)];
    const std::int64_t in = in_of(l), out = out_of(l);
    const std::string name = fmt::format("layer {}", l);
    L.w = ops.alloc(out * in, DType::fp32, name + " W (fp32 master)");
    L.b = ops.alloc(out, DType::fp32, name + " b (fp32 master)");
    if (t != DType::fp32) {
      L.wc = ops.alloc(out * in, t, name + " W (compute copy)");
      L.bc = ops.alloc(out, t, name + " b (compute copy)");
    }
    if (cfg.norm && l > 0) {
      L.u = ops.alloc(B * in, t, name + " rmsnorm output");
      L.rstd = ops.alloc(B, DType::fp32, name + " rmsnorm 1/rms");
      L.du = ops.alloc(B * in, t, name + " d(rmsnorm output)");
    }
    L.z = ops.alloc(B * out, t, name + " pre-activation");
    L.h = ops.alloc(B * out, t, name + " output");
    L.dw = ops.alloc(out * in, t, name + " dW");
    L.db = ops.alloc(out, t, name + " db");
    L.dz = ops.alloc(B * out, t, name + " dz");
    L.dh = ops.alloc(B * out, t, name + " dh");
    // weights: counter-based uniform, reproducible on any device
    const float a = init_bound(cfg.act, in, out, cfg.init_gain);
    const HostReservation staging = reserve_host_memory(std::uint64_t(out * in + out) * 4, name + " (host staging)");
    std::vector<float> w(std::size_t(out * in)), b(std::size_t(out), 0.0f);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = a * uniform_pm1(seed + std::uint64_t(l) * 7919, i);
    ops.upload(L.w, w);
  }
  x_ = ops.alloc(B * cfg.in, t, "inputs");
  target_ = ops.alloc(cfg.task == Task::regression ? B * cfg.out : B, DType::fp32, "targets");
  loss_ = ops.alloc(1, DType::fp32, "loss");
  stats_ = ops.alloc(std::int64_t(layout_.total()) * kStatsPerTensor, DType::fp32, "detector stats");
}

std::int64_t Mlp::parameters() const {
  std::int64_t n = 0;
  for (int l = 0; l < layers(); ++l) n += out_of(l) * in_of(l) + out_of(l);
  return n;
}

void Mlp::set_batch(std::span<const float> x, std::span<const float> target) {
  ops_.upload(x_, x);
  ops_.upload(target_, target);
}

const DTensor& Mlp::input_of(int l) const {
  if (l == 0) return x_;
  const Layer& L = ls_[std::size_t(l)];
  return cfg_.norm ? L.u : ls_[std::size_t(l - 1)].h;
}

void Mlp::forward_loss() { forward_backward(1.0f, -1, Injection{}); }

void Mlp::forward_backward(float loss_scale, int step, const Injection& inj) {
  const bool backward = step >= 0;
  const std::int64_t B = cfg_.batch;
  const int last = cfg_.depth;
  const bool cast = cfg_.dtype != DType::fp32;
  auto wof = [&](Layer& L) -> const DTensor& { return cast ? L.wc : L.w; };
  auto bof = [&](Layer& L) -> const DTensor& { return cast ? L.bc : L.b; };
  const bool inject_now = inj.active && inj.step == step;
  // forward
  for (int l = 0; l <= last; ++l) {
    Layer& L = ls_[std::size_t(l)];
    const std::int64_t in = in_of(l), out = out_of(l);
    if (cast) {
      ops_.cast(L.w, L.wc, out * in);
      ops_.cast(L.b, L.bc, out);
    }
    if (cfg_.norm && l > 0) ops_.rmsnorm(ls_[std::size_t(l - 1)].h, L.u, L.rstd, B, in, 1e-6f);
    ops_.gemm(false, true, B, out, in, 1.0f, input_of(l), wof(L), 0.0f, L.z);
    const bool hidden = l < last;
    const DTensor* res = hidden && cfg_.residual && l > 0 ? &ls_[std::size_t(l - 1)].h : nullptr;
    ops_.bias_act(L.z, &bof(L), hidden ? cfg_.act : Act::none, res, L.h, B, out);
    if (inject_now && inj.into == InjectInto::activation && inj.layer == l) ops_.poke(L.h, 0, inj.value);
  }
  Layer& O = ls_[std::size_t(last)];
  if (cfg_.task == Task::regression)
    ops_.mse_loss(O.h, target_, loss_, O.dz, B * cfg_.out, loss_scale);
  else
    ops_.xent_loss(O.h, target_, loss_, O.dz, B, cfg_.out, loss_scale);
  if (!backward) return;
  // backward: layer l receives dh_l (for the output layer, dz = dy directly)
  for (int l = last; l >= 0; --l) {
    Layer& L = ls_[std::size_t(l)];
    const std::int64_t in = in_of(l), out = out_of(l);
    if (l < last) ops_.act_backward(L.dh, L.z, cfg_.act, L.dz, B * out);
    // at dz, the gradient at the Linear's output: a poke at dh could land
    // on a relu unit that is off and be zeroed there
    if (inject_now && inj.into == InjectInto::gradient && inj.layer == l) ops_.poke(L.dz, 0, inj.value);
    ops_.gemm(true, false, out, in, B, 1.0f, L.dz, input_of(l), 0.0f, L.dw);
    ops_.bias_grad(L.dz, L.db, B, out);
    if (l == 0) break;
    Layer& P = ls_[std::size_t(l - 1)];
    if (cfg_.norm) {
      ops_.gemm(false, false, B, in, out, 1.0f, L.dz, wof(L), 0.0f, L.du);
      ops_.rmsnorm_backward(L.du, L.u, L.rstd, P.dh, B, in);
    } else {
      ops_.gemm(false, false, B, in, out, 1.0f, L.dz, wof(L), 0.0f, P.dh);
    }
    // the residual's identity path: dh_{l-1} += dh_l
    if (cfg_.residual && l < last) ops_.bias_act(P.dh, nullptr, Act::none, &L.dh, P.dh, B, in);
  }
}

void Mlp::grad_stats() {
  // slots dw(0..L-1) then db(0..L-1): contiguous, one pass
  std::vector<const DTensor*> ts;
  std::vector<std::int64_t> ns;
  for (const Layer& L : ls_) ts.push_back(&L.dw), ns.push_back(L.dw.numel);
  for (const Layer& L : ls_) ts.push_back(&L.db), ns.push_back(L.db.numel);
  ops_.stats_many(ts, ns, stats_, layout_.dw(0));
}

void Mlp::act_stats() {
  std::vector<const DTensor*> ts{&loss_};
  std::vector<std::int64_t> ns{1};
  for (const Layer& L : ls_) ts.push_back(&L.h), ns.push_back(L.h.numel);
  ops_.stats_many(ts, ns, stats_, layout_.loss());
}

void Mlp::sgd(float lr, float weight_decay, float grad_scale) {
  for (Layer& L : ls_) {
    ops_.sgd(L.w, L.dw, L.w.numel, lr, weight_decay, grad_scale);
    ops_.sgd(L.b, L.db, L.b.numel, lr, 0.0f, grad_scale);
  }
}

void Mlp::ensure_moments() {
  if (moments_) return;
  for (std::size_t l = 0; l < ls_.size(); ++l) {
    Layer& L = ls_[l];
    const std::string name = fmt::format("layer {}", l);
    L.m_w = ops_.alloc(L.w.numel, DType::fp32, name + " AdamW m(W)");
    L.v_w = ops_.alloc(L.w.numel, DType::fp32, name + " AdamW v(W)");
    L.m_b = ops_.alloc(L.b.numel, DType::fp32, name + " AdamW m(b)");
    L.v_b = ops_.alloc(L.b.numel, DType::fp32, name + " AdamW v(b)");
  }
  moments_ = true;
}

void Mlp::adamw(float lr, float beta1, float beta2, float eps, float weight_decay, int step, float grad_scale) {
  ensure_moments();
  for (Layer& L : ls_) {
    ops_.adamw(L.w, L.dw, L.m_w, L.v_w, L.w.numel, lr, beta1, beta2, eps, weight_decay, step, grad_scale);
    ops_.adamw(L.b, L.db, L.m_b, L.v_b, L.b.numel, lr, beta1, beta2, eps, 0.0f, step, grad_scale);
  }
}

void Mlp::get_weights(int l, std::vector<float>& w, std::vector<float>& b) {
  Layer& L = ls_.at(std::size_t(l));
  w.resize(std::size_t(L.w.numel));
  b.resize(std::size_t(L.b.numel));
  ops_.download(L.w, w);
  ops_.download(L.b, b);
}
void Mlp::set_weights(int l, std::span<const float> w, std::span<const float> b) {
  Layer& L = ls_.at(std::size_t(l));
  ops_.upload(L.w, w);
  ops_.upload(L.b, b);
}
void Mlp::get_grads(int l, std::vector<float>& dw, std::vector<float>& db) {
  Layer& L = ls_.at(std::size_t(l));
  dw.resize(std::size_t(L.dw.numel));
  db.resize(std::size_t(L.db.numel));
  ops_.download(L.dw, dw);
  ops_.download(L.db, db);
}

}  // namespace sb::numerics
