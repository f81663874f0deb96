// The batch scenario's decoder step (equations in decoder.hpp).
#include "scenarios/batch/decoder.hpp"

#include <cmath>  // std::sqrt

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // UsageError
#include "harness/host_memory.hpp"  // reserve_host_memory: host staging is budgeted too
#include "harness/random.hpp"  // uniform_pm1

namespace sb::batch {

std::int64_t DecoderStep::in_of(int w) const { return w == 3 ? 4 * cfg_.d_model : cfg_.d_model; }
std::int64_t DecoderStep::out_of(int w) const {
  switch (w) {
    case 0: return 3 * cfg_.d_model;
    case 2: return 4 * cfg_.d_model;
    default: return cfg_.d_model;
  }
}

DecoderStep::DecoderStep(Device& dev, TrainOps& ops, const DecoderConfig& cfg, std::uint64_t seed,
                         std::function<void()> before_submit)
    : dev_(dev), ops_(ops), cfg_(cfg), before_submit_(std::move(before_submit)) {
  if (cfg.d_model % cfg.heads != 0)
    throw UsageError(fmt::format("d_model {} is not a multiple of heads {}", cfg.d_model, cfg.heads));
  const std::int64_t T = tokens(), d = cfg.d_model;
  const DType t = cfg.dtype;
  ls_.resize(std::size_t(cfg.layers));
  for (int l = 0; l < cfg.layers; ++l) {
    Layer& L = ls_[std::size_t(l)];
    const std::string n = fmt::format("layer {}", l);
    static const char* names[4] = {"Wqkv", "Wo", "W1", "W2"};
    for (int w = 0; w < 4; ++w) {
      const std::int64_t cnt = in_of(w) * out_of(w);
      L.w[w] = ops.alloc(cnt, DType::fp32, fmt::format("{} {} (fp32 master)", n, names[w]));
      if (t != DType::fp32) L.wc[w] = ops.alloc(cnt, t, fmt::format("{} {} (compute copy)", n, names[w]));
      L.g[w] = ops.alloc(cnt, DType::fp32, fmt::format("{} {} grad (fp32)", n, names[w]));
      const float a = float(std::sqrt(6.0 / double(in_of(w) + out_of(w))));
      // the host staging copy counts against the host's memory too
      const HostReservation staging = reserve_host_memory(std::uint64_t(cnt) * 4, n + " weights (host staging)");
      std::vector<float> host(static_cast<std::size_t>(cnt));
      for (std::size_t i = 0; i < host.size(); ++i) host[i] = a * uniform_pm1(seed + std::uint64_t(l * 4 + w), i);
      ops.upload(L.w[w], host);
    }
    L.x = ops.alloc(T * d, t, n + " input");
    L.u1 = ops.alloc(T * d, t, n + " norm1");
    L.r1 = ops.alloc(T, DType::fp32, n + " norm1 1/rms");
    L.qkv = ops.alloc(T * 3 * d, t, n + " qkv");
    L.att = ops.alloc(T * d, t, n + " attention output (stand-in)");
    L.o = ops.alloc(T * d, t, n + " o-proj");
    L.xm = ops.alloc(T * d, t, n + " x + attention");
    L.u2 = ops.alloc(T * d, t, n + " norm2");
    L.r2 = ops.alloc(T, DType::fp32, n + " norm2 1/rms");
    L.hp = ops.alloc(T * 4 * d, t, n + " mlp pre-activation");
    L.h = ops.alloc(T * 4 * d, t, n + " mlp activation");
    L.y = ops.alloc(T * d, t, n + " mlp output");
    L.dxm = ops.alloc(T * d, t, n + " d(x + attention)");
    L.du2 = ops.alloc(T * d, t, n + " d norm2");
    L.dhp = ops.alloc(T * 4 * d, t, n + " d mlp pre-activation");
    L.dh = ops.alloc(T * 4 * d, t, n + " d mlp activation");
    L.datt = ops.alloc(T * d, t, n + " d attention output");
    L.dqkv = ops.alloc(T * 3 * d, t, n + " d qkv (stand-in)");
    L.du1 = ops.alloc(T * d, t, n + " d norm1");
    L.dx = ops.alloc(T * d, t, n + " d input");
    AttnShape as;
    as.batch = cfg.micro_batch;
    as.heads = cfg.heads;
    as.seq = cfg.seq;
    as.head_dim = d / cfg.heads;
    as.causal = true;
    L.attn = dev.make_attention(as, cfg.attention, t == DType::fp32 ? DType::fp32 : t, seed + 99 + std::uint64_t(l));
  }
  out_ = ops.alloc(T * d, t, "stack output");
  target_ = ops.alloc(T * d, DType::fp32, "targets");
  loss_ = ops.alloc(1, DType::fp32, "loss");
  dout_ = ops.alloc(T * d, t, "d output");
  const HostReservation staging = reserve_host_memory(std::uint64_t(T * d) * 8, "inputs and targets (host staging)");
  std::vector<float> x(std::size_t(T * d)), y(std::size_t(T * d));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = uniform_pm1(seed ^ 0xda7a, i);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = 0.5f * uniform_pm1(seed ^ 0x7a26e7, i);
  set_input(x, y);
}

void DecoderStep::set_input(std::span<const float> x, std::span<const float> target) {
  ops_.upload(ls_.front().x, x);
  ops_.upload(target_, target);
}

std::int64_t DecoderStep::parameters() const {
  std::int64_t n = 0;
  for (int w = 0; w < 4; ++w) n += in_of(w) * out_of(w);
  return n * cfg_.layers;
}
double DecoderStep::gemm_flops() const { return 3.0 * 2.0 * double(tokens()) * double(parameters()); }
double DecoderStep::attention_flops() const {
  AttnShape as;
  as.batch = cfg_.micro_batch;
  as.heads = cfg_.heads;
  as.seq = cfg_.seq;
  as.head_dim = cfg_.d_model / cfg_.heads;
  as.causal = true;
  return 3.5 * as.fwd_flops() * cfg_.layers;
}

TrainOps& DecoderStep::op() {
  if (!capturing_) before_submit_();
  return ops_;
}

std::size_t DecoderStep::graph_nodes() const {
  std::size_t n = 0;
  for (const Piece& p : pieces_)
    if (p.graph) n += p.graph->nodes();
  return n;
}

// The micro step as pieces: runs of TrainOps calls (one graph each when
// graphs are on) between the attention calls, which stay outside graphs.
void DecoderStep::build_pieces(float loss_mult) {
  pieces_.clear();
  pieces_mult_ = loss_mult;
  const std::int64_t T = tokens(), d = cfg_.d_model;
  const int nl = cfg_.layers;
  std::vector<std::function<void()>> run;
  auto flush = [&] {
    if (run.empty()) return;
    Piece p;
    p.ops = [fns = run] {
      for (const auto& f : fns) f();
    };
    pieces_.push_back(std::move(p));
    run.clear();
  };
  auto attention = [&](int l, bool bwd) {
    flush();
    Piece p;
    p.layer = l;
    p.backward = bwd;
    pieces_.push_back(std::move(p));
  };
  // forward
  for (int l = 0; l < nl; ++l) {
    Layer* L = &ls_[std::size_t(l)];
    DTensor* next = l + 1 < nl ? &ls_[std::size_t(l + 1)].x : &out_;
    if (cfg_.dtype != DType::fp32)
      for (int w = 0; w < 4; ++w) run.push_back([this, L, w] { op().cast(L->w[w], L->wc[w], L->w[w].numel); });
    run.push_back([this, L, T, d] { op().rmsnorm(L->x, L->u1, L->r1, T, d, 1e-6f); });
    run.push_back([this, L, T, d] { op().gemm(false, true, T, 3 * d, d, 1.0f, L->u1, wuse(*L, 0), 0.0f, L->qkv); });
    attention(l, false);
    run.push_back([this, L, T, d] { op().gemm(false, true, T, d, d, 1.0f, L->att, wuse(*L, 1), 0.0f, L->o); });
    run.push_back([this, L, T, d] { op().bias_act(L->o, nullptr, Act::none, &L->x, L->xm, T, d); });
    run.push_back([this, L, T, d] { op().rmsnorm(L->xm, L->u2, L->r2, T, d, 1e-6f); });
    run.push_back([this, L, T, d] { op().gemm(false, true, T, 4 * d, d, 1.0f, L->u2, wuse(*L, 2), 0.0f, L->hp); });
    run.push_back([this, L, T, d] { op().bias_act(L->hp, nullptr, Act::gelu, nullptr, L->h, T, 4 * d); });
    run.push_back([this, L, T, d] { op().gemm(false, true, T, d, 4 * d, 1.0f, L->h, wuse(*L, 3), 0.0f, L->y); });
    run.push_back([this, L, T, d, next] { op().bias_act(L->y, nullptr, Act::none, &L->xm, *next, T, d); });
  }
  run.push_back([this, T, d, loss_mult] { op().mse_loss(out_, target_, loss_, dout_, T * d, loss_mult); });
  // backward
  for (int l = nl - 1; l >= 0; --l) {
    Layer* L = &ls_[std::size_t(l)];
    const DTensor* dnext = l + 1 < nl ? &ls_[std::size_t(l + 1)].dx : &dout_;
    // MLP: y = h W2^T; h = gelu(hp); hp = u2 W1^T; u2 = rmsnorm(xm); residual
    run.push_back([this, L, T, d, dnext] { op().gemm(true, false, d, 4 * d, T, 1.0f, *dnext, L->h, 1.0f, L->g[3]); });
    run.push_back([this, L, T, d, dnext] { op().gemm(false, false, T, 4 * d, d, 1.0f, *dnext, wuse(*L, 3), 0.0f, L->dh); });
    run.push_back([this, L, T, d] { op().act_backward(L->dh, L->hp, Act::gelu, L->dhp, T * 4 * d); });
    run.push_back([this, L, T, d] { op().gemm(true, false, 4 * d, d, T, 1.0f, L->dhp, L->u2, 1.0f, L->g[2]); });
    run.push_back([this, L, T, d] { op().gemm(false, false, T, d, 4 * d, 1.0f, L->dhp, wuse(*L, 2), 0.0f, L->du2); });
    run.push_back([this, L, T, d] { op().rmsnorm_backward(L->du2, L->u2, L->r2, L->dxm, T, d); });
    run.push_back([this, L, T, d, dnext] { op().bias_act(L->dxm, nullptr, Act::none, dnext, L->dxm, T, d); });
    // attention block: o = att Wo^T; the attention's own backward; qkv = u1 Wqkv^T
    run.push_back([this, L, T, d] { op().gemm(true, false, d, d, T, 1.0f, L->dxm, L->att, 1.0f, L->g[1]); });
    run.push_back([this, L, T, d] { op().gemm(false, false, T, d, d, 1.0f, L->dxm, wuse(*L, 1), 0.0f, L->datt); });
    attention(l, true);
    run.push_back([this, L, T, d] { op().gemm(true, false, 3 * d, d, T, 1.0f, L->dqkv, L->u1, 1.0f, L->g[0]); });
    run.push_back([this, L, T, d] { op().gemm(false, false, T, d, 3 * d, 1.0f, L->dqkv, wuse(*L, 0), 0.0f, L->du1); });
    run.push_back([this, L, T, d] { op().rmsnorm_backward(L->du1, L->u1, L->r1, L->dx, T, d); });
    run.push_back([this, L, T, d] { op().bias_act(L->dx, nullptr, Act::none, &L->dxm, L->dx, T, d); });
  }
  flush();
}

void DecoderStep::micro_step(float loss_mult) {
  if (pieces_.empty() || pieces_mult_ != loss_mult) build_pieces(loss_mult);
  std::int64_t subs = 0;
  const std::function<void()> outer = before_submit_;
  before_submit_ = [&subs, outer] {
    ++subs;
    outer();
  };
  try {
    for (Piece& p : pieces_) {
      if (p.layer >= 0) {
        before_submit_();
        Layer& L = ls_[std::size_t(p.layer)];
        if (p.backward)
          L.attn->backward();
        else
          L.attn->forward();
        continue;
      }
      if (!graphs_) {
        p.ops();
        continue;
      }
      if (!p.graph) {
        ops_.begin_capture();
        capturing_ = true;
        try {
          p.ops();
        } catch (...) {
          capturing_ = false;
          (void)ops_.end_capture();
          throw;
        }
        p.graph = ops_.end_capture();
        capturing_ = false;
      }
      before_submit_();  // one launch: the graph
      p.graph->replay();
    }
  } catch (...) {
    before_submit_ = outer;
    throw;
  }
  before_submit_ = outer;
  last_subs_ = subs;
  ++micro_steps_;
}

void train_window(DecoderStep& step, int grad_accum, OptKind opt, float lr, const std::function<void()>& before_opt,
                  const std::function<void()>& after_opt, const std::function<void()>& after_zero) {
  if (grad_accum < 1) throw UsageError("grad_accum must be at least 1");
  step.zero_grad();
  after_zero();
  for (int i = 0; i < grad_accum; ++i) step.micro_step(1.0f / float(grad_accum));
  before_opt();
  step.optimizer(opt, lr, step.optimizer_calls() + 1);
  after_opt();
}

void DecoderStep::zero_grad() {
  for (Layer& L : ls_)
    for (int w = 0; w < 4; ++w) op().zero(L.g[w]);
}

void DecoderStep::optimizer(OptKind kind, float lr, int step) {
  ++opt_calls_;
  if (kind == OptKind::none) return;
  if (kind == OptKind::adamw && !moments_) {
    for (std::size_t l = 0; l < ls_.size(); ++l)
      for (int w = 0; w < 4; ++w) {
        ls_[l].m[w] = ops_.alloc(ls_[l].w[w].numel, DType::fp32, fmt::format("layer {} AdamW m", l));
        ls_[l].v[w] = ops_.alloc(ls_[l].w[w].numel, DType::fp32, fmt::format("layer {} AdamW v", l));
      }
    moments_ = true;
  }
  for (Layer& L : ls_)
    for (int w = 0; w < 4; ++w) {
      if (kind == OptKind::adamw)
        op().adamw(L.w[w], L.g[w], L.m[w], L.v[w], L.w[w].numel, lr, 0.9f, 0.999f, 1e-8f, 0.01f, step, 1.0f);
      else
        op().sgd(L.w[w], L.g[w], L.w[w].numel, lr, 0.0f, 1.0f);
    }
}

std::vector<float> DecoderStep::weight(int layer, int which) {
  Layer& L = ls_.at(std::size_t(layer));
  std::vector<float> h(std::size_t(L.w[which].numel));
  ops_.download(L.w[which], h);
  return h;
}

std::vector<float> DecoderStep::grad(int layer, int which) {
  Layer& L = ls_.at(std::size_t(layer));
  std::vector<float> h(std::size_t(L.g[which].numel));
  ops_.download(L.g[which], h);
  return h;
}

}  // namespace sb::batch
