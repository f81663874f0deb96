// The batch scenario's decoder step (equations in decoder.hpp).
#include "workloads/decoder.hpp"

#include <algorithm>  // std::max
#include <chrono>     // std::chrono::minutes
#include <cmath>      // std::sqrt

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // UsageError
#include "harness/host_memory.hpp"  // reserve_host_memory: host staging is budgeted too
#include "harness/random.hpp"  // uniform_pm1

namespace sb::batch {

std::int64_t DecoderStep::in_of(int w) const { return w == 3 ? cfg_.ff() : cfg_.d_model; }
std::int64_t DecoderStep::out_of(int w) const {
  switch (w) {
    case 0: return cfg_.qkv_out();
    case 2: return cfg_.ff();
    default: return cfg_.d_model;
  }
}

namespace {
// The device's bytes in use (its allocator's account); 0 where none is kept.
std::uint64_t in_use(const Device& dev) { return dev.memory_stats().in_use; }
}  // namespace

void spin_for(double us) {
  if (us <= 0) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(std::int64_t(us * 1000.0));
  while (std::chrono::steady_clock::now() < until) {
  }
}

void validate_decoder_shape(const ParamSet& ps) {
  if (ps.get_int("d_model") % ps.get_int("heads") != 0)
    throw UsageError(fmt::format("d_model={} is not a multiple of heads={}", ps.get_int("d_model"),
                                 ps.get_int("heads")));
  if (ps.has("kv_heads")) {
    const std::int64_t kv = ps.get_int("kv_heads"), h = ps.get_int("heads");
    if (kv > h || (kv > 0 && h % kv != 0))
      throw UsageError(fmt::format("kv_heads={} does not divide heads={}: each K/V head serves a whole group of "
                                   "query heads (0: one per head)",
                                   kv, h));
  }
}

ParamSpec d_model_param(std::string cpu_default, std::string gpu_default) {
  return ParamSpec{.name = "d_model", .type = ParamType::integer, .default_value = std::move(cpu_default),
                   .help = "hidden size", .unit = "features", .min = 8, .max = 65536,
                   .gpu_default = std::move(gpu_default)};
}

ParamSpec heads_param(std::string cpu_default, std::string gpu_default) {
  return ParamSpec{.name = "heads", .type = ParamType::integer, .default_value = std::move(cpu_default),
                   .help = "attention heads", .min = 1, .max = 1024, .gpu_default = std::move(gpu_default)};
}

ParamSpec d_ff_param() {
  return ParamSpec{.name = "d_ff", .type = ParamType::integer, .default_value = "0",
                   .help = "the MLP's width (W1's outputs, W2's inputs); 0: 4 x d_model. A gated (SwiGLU) MLP of "
                           "intermediate size I has the FLOPs and weights of this one at d_ff = 1.5 I",
                   .unit = "features", .min = 0, .max = 262144};
}

ParamSpec kv_heads_param() {
  return ParamSpec{.name = "kv_heads", .type = ParamType::integer, .default_value = "0",
                   .help = "K/V heads (grouped-query attention: num_key_value_heads), a divisor of heads; 0: heads. "
                           "K and V project to kv_heads x head_dim; the attention itself runs at every query head",
                   .unit = "heads", .min = 0, .max = 1024};
}

ParamSpec layers_param(std::string cpu_default, std::string gpu_default) {
  return ParamSpec{.name = "layers", .type = ParamType::integer, .default_value = std::move(cpu_default),
                   .help = "decoder layers", .min = 1, .max = 256, .gpu_default = std::move(gpu_default)};
}

ParamSpec dtype_param(std::string help) {
  return ParamSpec{.name = "dtype", .type = ParamType::choice, .default_value = "fp32", .help = std::move(help),
                   .choices = {"fp32", "bf16", "fp16"}, .gpu_default = "bf16"};
}

ParamSpec attn_param() {
  return ParamSpec{.name = "attn", .type = ParamType::choice, .default_value = "fused",
                   .help = "fused: the device's fused attention (flash on cpu, cuDNN on cuda); naive: eager, the "
                           "S x S scores kept (no flash_attention / sdp_attention)",
                   .choices = {"fused", "naive"}};
}

ParamSpec dispatch_us_param() {
  return ParamSpec{.name = "dispatch_us", .type = ParamType::real, .default_value = "10",
                   .help = "modelled framework cost per submission, spent on the host (PyTorch eager: 5-20 us per op)",
                   // 10 ms per op is 500x eager PyTorch's; a second per op (the old bound) made
                   // one step minutes long and --quick no quicker.
                   .unit = "us", .min = 0, .max = 1e4};
}

DecoderConfig decoder_config(const ParamSet& ps, const Device& dev) {
  DecoderConfig cfg;
  cfg.micro_batch = ps.get_int("micro_batch");
  cfg.seq = ps.get_int("seq_len");
  cfg.d_model = ps.get_int("d_model");
  cfg.heads = ps.get_int("heads");
  if (ps.has("d_ff")) cfg.d_ff = ps.get_int("d_ff");
  if (ps.has("kv_heads")) cfg.kv_heads = ps.get_int("kv_heads");
  cfg.layers = int(ps.get_int("layers"));
  cfg.dtype = ps.get_choice("dtype", kDTypeNames);
  if (cfg.dtype != DType::fp32 && cfg.dtype != DType::bf16 && cfg.dtype != DType::fp16)
    throw UsageError(fmt::format("dtype={}: the step trains in fp32, bf16 or fp16", to_string(cfg.dtype)));
  cfg.attention = AttnImpl::flash;
  if (dev.attention_unsupported(AttnImpl::flash, cfg.dtype) && !dev.attention_unsupported(AttnImpl::cudnn, cfg.dtype))
    cfg.attention = AttnImpl::cudnn;
  // attn=naive: the eager path (two GEMMs and a softmax, the S x S scores kept), as a
  // job without flash_attention / sdp_attention runs it
  if (ps.has("attn") && ps.get_str("attn") == "naive") cfg.attention = AttnImpl::naive;
  if (auto why = dev.attention_unsupported(cfg.attention, cfg.dtype)) throw UnsupportedError(*why);
  return cfg;
}

// A non-owning view of a tensor another step owns: its first numel elements (at most its own; -1: all).
DTensor DecoderStep::view_of(const DTensor& t, std::int64_t numel) {
  if (numel < 0) numel = t.numel;
  if (numel > t.numel) throw std::logic_error("a decoder step borrows a buffer smaller than it needs");
  return DTensor{Buffer(t.data(), t.buf.bytes(), t.buf.kind(), {}), t.dtype, numel};
}

void DecoderStep::alloc_acts(Acts& a, const std::string& n, const Acts* from) {
  const std::int64_t T = tokens(), d = cfg_.d_model, f = cfg_.ff();
  const DType t = cfg_.dtype;
  auto get = [&](DTensor Acts::*m, std::int64_t numel, DType dt, const std::string& what) {
    return from ? view_of(from->*m, numel) : ops_.alloc(numel, dt, n + " " + what);
  };
  a.u1 = get(&Acts::u1, T * d, t, "norm1");
  a.r1 = get(&Acts::r1, T, DType::fp32, "norm1 1/rms");
  a.qkv = get(&Acts::qkv, T * cfg_.qkv_out(), t, "qkv");
  a.att = get(&Acts::att, T * d, t, "attention output (stand-in)");
  a.o = get(&Acts::o, T * d, t, "o-proj");
  a.xm = get(&Acts::xm, T * d, t, "x + attention");
  a.u2 = get(&Acts::u2, T * d, t, "norm2");
  a.r2 = get(&Acts::r2, T, DType::fp32, "norm2 1/rms");
  a.hp = get(&Acts::hp, T * f, t, "mlp pre-activation");
  a.h = get(&Acts::h, T * f, t, "mlp activation");
  a.y = get(&Acts::y, T * d, t, "mlp output");
}

DecoderStep::DecoderStep(Device& dev, TrainOps& ops, const DecoderConfig& cfg, std::uint64_t seed,
                         std::function<void()> before_submit, DecoderStep* share)
    : DecoderStep(dev, ops, cfg, seed, std::move(before_submit), share, false) {}

DecoderStep::DecoderStep(Device& dev, TrainOps& ops, const DecoderConfig& cfg, std::uint64_t seed, ParametersOnly)
    : DecoderStep(dev, ops, cfg, seed, [] {}, nullptr, true) {}

DecoderStep::DecoderStep(Device& dev, TrainOps& ops, const DecoderConfig& cfg, std::uint64_t seed,
                         std::function<void()> before_submit, DecoderStep* share, bool parameters_only)
    : dev_(dev),
      ops_(ops),
      cfg_(cfg),
      before_submit_(std::move(before_submit)),
      parameters_only_(parameters_only),
      share_(share) {
  if (cfg.d_model % cfg.heads != 0)
    throw UsageError(fmt::format("d_model {} is not a multiple of heads {}", cfg.d_model, cfg.heads));
  if (cfg.d_ff < 0) throw UsageError(fmt::format("d_ff {} is negative", cfg.d_ff));
  if (cfg.kv_heads < 0 || cfg.kv() > cfg.heads || cfg.heads % cfg.kv() != 0)
    throw UsageError(fmt::format("kv_heads {} does not divide heads {}", cfg.kv_heads, cfg.heads));
  if (share && (share->cfg_.d_model != cfg.d_model || share->cfg_.ff() != cfg.ff() || share->cfg_.heads != cfg.heads ||
                share->cfg_.kv() != cfg.kv() || share->cfg_.layers != cfg.layers || share->cfg_.dtype != cfg.dtype))
    throw UsageError("a decoder step can share the parameters of a step of the same model only (d_model, d_ff, "
                     "heads, kv_heads, layers, dtype)");
  const std::int64_t T = tokens(), d = cfg.d_model, f = cfg.ff();
  const DType t = cfg.dtype;
  const int nl = cfg.layers;
  ls_.resize(std::size_t(nl));
  static const char* names[4] = {"Wqkv", "Wo", "W1", "W2"};
  // Each part is allocated as one group, the allocator read around it. A
  // device may free in stream order (cpu): what an earlier owner dropped is
  // settled first, so that no release lands inside a part's reading.
  dev.synchronize(std::chrono::minutes(5));
  std::uint64_t mark = in_use(dev);
  auto measured = [&](std::uint64_t& part) {
    const std::uint64_t now = in_use(dev);
    part += now - mark;
    mark = now;
  };
  for (int l = 0; l < nl && share; ++l)
    for (int w = 0; w < 4; ++w) {
      const Layer& S = share->ls_[std::size_t(l)];
      Layer& L = ls_[std::size_t(l)];
      L.w[w] = view_of(S.w[w]);
      if (t != DType::fp32) L.wc[w] = view_of(S.wc[w]);
      L.g[w] = view_of(S.g[w]);
    }
  // Weights and inputs get values only on a device that computes (TrainOps::computes): a simulated
  // one spends time and computes nothing, and drawing them took 65% of a sim:h100 memory run
  // (d_model 2048, 8 layers: 400M weights and 155M inputs per step built), which ran past 15 minutes.
  for (int l = 0; l < nl && !share; ++l) {
    Layer& L = ls_[std::size_t(l)];
    const std::string n = fmt::format("layer {}", l);
    for (int w = 0; w < 4; ++w) {
      const std::int64_t cnt = in_of(w) * out_of(w);
      L.w[w] = ops.alloc(cnt, DType::fp32, fmt::format("{} {} (fp32 master)", n, names[w]));
      if (t != DType::fp32) L.wc[w] = ops.alloc(cnt, t, fmt::format("{} {} (compute copy)", n, names[w]));
      if (!ops.computes()) continue;  // values only where something is computed with them
      const float a = float(std::sqrt(6.0 / double(in_of(w) + out_of(w))));
      // the host staging copy counts against the host's memory too
      const HostReservation staging = reserve_host_memory(std::uint64_t(cnt) * 4, n + " weights (host staging)");
      std::vector<float> host(static_cast<std::size_t>(cnt));
      for (std::size_t i = 0; i < host.size(); ++i) host[i] = a * uniform_pm1(seed + std::uint64_t(l * 4 + w), i);
      ops.upload(L.w[w], host);
    }
  }
  measured(measured_.weights);
  for (int l = 0; l < nl && !share; ++l)
    for (int w = 0; w < 4; ++w)
      ls_[std::size_t(l)].g[w] =
          ops.alloc(in_of(w) * out_of(w), DType::fp32, fmt::format("layer {} {} grad (fp32)", l, names[w]));
  measured(measured_.gradients);
  if (parameters_only) return;
  // A step that shares another's parameters runs only while that one does not (one micro step at a
  // time), so it also takes that step's activation and gradient buffers where they hold as many tokens
  // (the train scenario's longest padded length owns them): a framework's caching allocator reuses one
  // set of memory for each length's step, where a set per length held the sum of them all (2 layers of
  // a 43008-wide MLP with eager attention at 32 padded lengths ran out of an H100's 80 GB, simulated).
  // The attention ops stay each step's own: their buffers follow their shape.
  const DecoderStep* lend =
      share && !share->parameters_only_ && share->tokens() >= T && share->cfg_.checkpointing == cfg.checkpointing
          ? share
          : nullptr;
  auto take = [&](const DTensor* theirs, std::int64_t numel, DType dt, const std::string& what) {
    return theirs ? view_of(*theirs, numel) : ops.alloc(numel, dt, what);
  };
  for (int l = 0; l < nl; ++l) {
    Layer& L = ls_[std::size_t(l)];
    const std::string n = fmt::format("layer {}", l);
    const Layer* S = lend ? &lend->ls_[std::size_t(l)] : nullptr;
    L.x = take(S ? &S->x : nullptr, T * d, t, n + " input");
    if (!cfg.checkpointing) alloc_acts(L.own, n, S ? &S->own : nullptr);
    L.a = cfg.checkpointing ? &shared_acts_ : &L.own;
  }
  if (cfg.checkpointing) alloc_acts(shared_acts_, "checkpointed layers' (recomputed)", lend ? &lend->shared_acts_ : nullptr);
  out_ = take(lend ? &lend->out_ : nullptr, T * d, t, "stack output");
  measured(measured_.activations);
  AttnShape as;
  as.batch = cfg.micro_batch;
  as.heads = cfg.heads;
  as.seq = cfg.seq;
  as.head_dim = d / cfg.heads;
  as.causal = true;
  for (int l = 0; l < (cfg.checkpointing ? 1 : nl); ++l)
    attn_.push_back(dev.make_attention(as, cfg.attention, t, seed + 99 + std::uint64_t(l)));
  for (int l = 0; l < nl; ++l) ls_[std::size_t(l)].attn = attn_[cfg.checkpointing ? 0 : std::size_t(l)].get();
  measured(measured_.attention);
  const Grads* G = lend ? &lend->bg_ : nullptr;
  bg_.dxm = take(G ? &G->dxm : nullptr, T * d, t, "d(x + attention)");
  bg_.du2 = take(G ? &G->du2 : nullptr, T * d, t, "d norm2");
  bg_.dhp = take(G ? &G->dhp : nullptr, T * f, t, "d mlp pre-activation");
  bg_.dh = take(G ? &G->dh : nullptr, T * f, t, "d mlp activation");
  bg_.datt = take(G ? &G->datt : nullptr, T * d, t, "d attention output");
  bg_.dqkv = take(G ? &G->dqkv : nullptr, T * cfg.qkv_out(), t, "d qkv (stand-in)");
  bg_.du1 = take(G ? &G->du1 : nullptr, T * d, t, "d norm1");
  for (int i = 0; i < 2; ++i)
    dx_[i] = take(lend ? &lend->dx_[i] : nullptr, T * d, t, fmt::format("d layer input ({})", i));
  target_ = take(lend ? &lend->target_ : nullptr, T * d, DType::fp32, "targets");
  loss_ = take(lend ? &lend->loss_ : nullptr, 1, DType::fp32, "loss");
  dout_ = take(lend ? &lend->dout_ : nullptr, T * d, t, "d output");
  measured(measured_.backward);
  ops.reserve_gemm_workspace(step_gemm_workspace(ops, cfg));
  measured(measured_.workspace);
  if (!ops.computes()) return;  // nor inputs
  const HostReservation staging = reserve_host_memory(std::uint64_t(T * d) * 8, "inputs and targets (host staging)");
  std::vector<float> x(std::size_t(T * d)), y(std::size_t(T * d));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = uniform_pm1(seed ^ 0xda7a, i);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = 0.5f * uniform_pm1(seed ^ 0x7a26e7, i);
  set_input(x, y);
}

std::vector<GemmCall> step_gemms(const DecoderConfig& cfg) {
  const std::int64_t T = cfg.micro_batch * cfg.seq, d = cfg.d_model, f = cfg.ff(), q = cfg.qkv_out();
  return {
      // forward (and the recompute): qkv, o-proj, W1, W2
      {false, true, T, q, d}, {false, true, T, d, d}, {false, true, T, f, d}, {false, true, T, d, f},
      // backward: dW2, dh, dW1, du2, dWo, datt, dWqkv, du1
      {true, false, d, f, T, true}, {false, false, T, f, d}, {true, false, f, d, T, true},
      {false, false, T, d, f}, {true, false, d, d, T, true}, {false, false, T, d, d},
      {true, false, q, d, T, true}, {false, false, T, d, q},
  };
}

std::size_t step_gemm_workspace(TrainOps& ops, const DecoderConfig& cfg) {
  std::size_t ws = 0;
  for (const GemmCall& g : step_gemms(cfg))
    ws = std::max(ws, ops.gemm_workspace_bytes(g.ta, g.tb, g.m, g.n, g.k, cfg.dtype));
  return ws;
}

MemoryParts predict_footprint(const DecoderConfig& cfg, OptKind opt, std::uint64_t granule,
                              std::uint64_t attention_op_bytes, std::uint64_t gemm_workspace_bytes) {
  const std::uint64_t g = std::max<std::uint64_t>(granule, 1);
  const auto T = std::uint64_t(cfg.micro_batch * cfg.seq), d = std::uint64_t(cfg.d_model),
             f = std::uint64_t(cfg.ff()), q = std::uint64_t(cfg.qkv_out());
  const auto e = std::uint64_t(storage_bytes(cfg.dtype));
  const auto L = std::uint64_t(cfg.layers);
  auto r = [g](std::uint64_t bytes) { return (bytes + g - 1) / g * g; };
  const std::uint64_t p[4] = {d * q, d * d, d * f, f * d};  // Wqkv (d + 2 kv head_dim outputs), Wo, W1, W2
  MemoryParts m;
  for (std::uint64_t n : p) {
    m.weights += L * (r(4 * n) + (cfg.dtype != DType::fp32 ? r(e * n) : 0));
    m.gradients += L * r(4 * n);
    if (opt == OptKind::adamw) m.optimizer += L * 2 * r(4 * n);
  }
  // u1, att, o, xm, u2, y: T x d; qkv: T x (d + 2 kv head_dim); hp, h: T x d_ff; r1, r2: T fp32
  const std::uint64_t acts = 6 * r(e * T * d) + r(e * T * q) + 2 * r(e * T * f) + 2 * r(4 * T);
  m.activations = L * r(e * T * d) + (cfg.checkpointing ? 1 : L) * acts + r(e * T * d);  // inputs, sets, output
  m.attention = (cfg.checkpointing ? 1 : L) * attention_op_bytes;
  // dxm, du2, datt, du1, dx x2, dout: T x d; dhp, dh: T x d_ff; dqkv: T x (d + 2 kv head_dim); targets fp32;
  // the loss
  m.backward = 7 * r(e * T * d) + 2 * r(e * T * f) + r(e * T * q) + r(4 * T * d) + r(4);
  m.workspace = gemm_workspace_bytes ? r(gemm_workspace_bytes) : 0;
  return m;
}

void DecoderStep::set_input(std::span<const float> x, std::span<const float> target) {
  if (parameters_only_) throw UsageError("a parameters-only decoder step has no inputs: share it with a step");
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

// One layer's forward into its activation set. next: where the block's
// output goes (the next layer's input); nullptr when recomputing for the
// backward (the next input is kept, the recompute stops at the MLP output).
void DecoderStep::forward_layer(std::vector<std::function<void()>>& run, Layer* L, DTensor* next,
                                const std::function<void(int, bool)>& attention, int l) {
  const std::int64_t T = tokens(), d = cfg_.d_model, f = cfg_.ff();
  Acts* A = L->a;
  run.push_back([this, L, A, T, d] { op().rmsnorm(L->x, A->u1, A->r1, T, d, 1e-6f); });
  const std::int64_t q = cfg_.qkv_out();
  run.push_back([this, L, A, T, d, q] { op().gemm(false, true, T, q, d, 1.0f, A->u1, wuse(*L, 0), 0.0f, A->qkv); });
  attention(l, false);
  run.push_back([this, L, A, T, d] { op().gemm(false, true, T, d, d, 1.0f, A->att, wuse(*L, 1), 0.0f, A->o); });
  run.push_back([this, L, A, T, d] { op().bias_act(A->o, nullptr, Act::none, &L->x, A->xm, T, d); });
  run.push_back([this, A, T, d] { op().rmsnorm(A->xm, A->u2, A->r2, T, d, 1e-6f); });
  run.push_back([this, L, A, T, d, f] { op().gemm(false, true, T, f, d, 1.0f, A->u2, wuse(*L, 2), 0.0f, A->hp); });
  run.push_back([this, A, T, f] { op().bias_act(A->hp, nullptr, Act::gelu, nullptr, A->h, T, f); });
  run.push_back([this, L, A, T, d, f] { op().gemm(false, true, T, d, f, 1.0f, A->h, wuse(*L, 3), 0.0f, A->y); });
  if (next) run.push_back([this, A, T, d, next] { op().bias_act(A->y, nullptr, Act::none, &A->xm, *next, T, d); });
}

// The micro step as pieces: runs of TrainOps calls (one graph each when
// graphs are on) between the attention calls, which stay outside graphs.
void DecoderStep::build_pieces(float loss_mult) {
  pieces_.clear();
  pieces_mult_ = loss_mult;
  const std::int64_t T = tokens(), d = cfg_.d_model, f = cfg_.ff();
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
    forward_layer(run, L, next, attention, l);
  }
  run.push_back([this, T, d, loss_mult] { op().mse_loss(out_, target_, loss_, dout_, T * d, loss_mult); });
  // backward
  Grads* G = &bg_;
  for (int l = nl - 1; l >= 0; --l) {
    Layer* L = &ls_[std::size_t(l)];
    Acts* A = L->a;
    // checkpointing: the layer's forward again, from its kept input, into the shared set
    if (cfg_.checkpointing) forward_layer(run, L, nullptr, attention, l);
    const DTensor* dnext = l + 1 < nl ? &dx_[std::size_t(l + 1) % 2] : &dout_;
    DTensor* dx = &dx_[std::size_t(l) % 2];
    // MLP: y = h W2^T; h = gelu(hp); hp = u2 W1^T; u2 = rmsnorm(xm); residual
    run.push_back([this, L, A, T, d, f, dnext] { op().gemm(true, false, d, f, T, 1.0f, *dnext, A->h, 1.0f, L->g[3]); });
    run.push_back([this, L, G, T, d, f, dnext] { op().gemm(false, false, T, f, d, 1.0f, *dnext, wuse(*L, 3), 0.0f, G->dh); });
    run.push_back([this, A, G, T, f] { op().act_backward(G->dh, A->hp, Act::gelu, G->dhp, T * f); });
    run.push_back([this, L, A, G, T, d, f] { op().gemm(true, false, f, d, T, 1.0f, G->dhp, A->u2, 1.0f, L->g[2]); });
    run.push_back([this, L, G, T, d, f] { op().gemm(false, false, T, d, f, 1.0f, G->dhp, wuse(*L, 2), 0.0f, G->du2); });
    run.push_back([this, A, G, T, d] { op().rmsnorm_backward(G->du2, A->u2, A->r2, G->dxm, T, d); });
    run.push_back([this, G, T, d, dnext] { op().bias_act(G->dxm, nullptr, Act::none, dnext, G->dxm, T, d); });
    // attention block: o = att Wo^T; the attention's own backward; qkv = u1 Wqkv^T
    run.push_back([this, L, A, G, T, d] { op().gemm(true, false, d, d, T, 1.0f, G->dxm, A->att, 1.0f, L->g[1]); });
    run.push_back([this, L, G, T, d] { op().gemm(false, false, T, d, d, 1.0f, G->dxm, wuse(*L, 1), 0.0f, G->datt); });
    attention(l, true);
    const std::int64_t q = cfg_.qkv_out();
    run.push_back([this, L, A, G, T, d, q] { op().gemm(true, false, q, d, T, 1.0f, G->dqkv, A->u1, 1.0f, L->g[0]); });
    run.push_back([this, L, G, T, d, q] { op().gemm(false, false, T, d, q, 1.0f, G->dqkv, wuse(*L, 0), 0.0f, G->du1); });
    run.push_back([this, A, G, T, d, dx] { op().rmsnorm_backward(G->du1, A->u1, A->r1, *dx, T, d); });
    run.push_back([this, G, T, d, dx] { op().bias_act(*dx, nullptr, Act::none, &G->dxm, *dx, T, d); });
  }
  flush();
}

void DecoderStep::micro_step(float loss_mult) {
  if (parameters_only_) throw UsageError("a parameters-only decoder step does not run: share it with a step");
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
        AttentionOp* attn = ls_[std::size_t(p.layer)].attn;
        if (p.backward)
          attn->backward();
        else
          attn->forward();
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

void DecoderStep::prepare_optimizer(OptKind kind) {
  if (kind != OptKind::adamw || moments_) return;
  if (share_) {  // the owner's moments, made there once
    share_->prepare_optimizer(kind);
    for (std::size_t l = 0; l < ls_.size(); ++l)
      for (int w = 0; w < 4; ++w) {
        ls_[l].m[w] = view_of(share_->ls_[l].m[w]);
        ls_[l].v[w] = view_of(share_->ls_[l].v[w]);
      }
    moments_ = true;
    return;
  }
  // once: settle stream-ordered frees, then read the allocator around the moments
  dev_.synchronize(std::chrono::minutes(5));
  const std::uint64_t before = in_use(dev_);
  for (std::size_t l = 0; l < ls_.size(); ++l)
    for (int w = 0; w < 4; ++w) {
      ls_[l].m[w] = ops_.alloc(ls_[l].w[w].numel, DType::fp32, fmt::format("layer {} AdamW m", l));
      ls_[l].v[w] = ops_.alloc(ls_[l].w[w].numel, DType::fp32, fmt::format("layer {} AdamW v", l));
    }
  moments_ = true;
  measured_.optimizer = in_use(dev_) - before;
}

void DecoderStep::optimizer(OptKind kind, float lr, int step) {
  ++opt_calls_;
  if (kind == OptKind::none) return;
  prepare_optimizer(kind);  // the first call, unless the owner made the moments up front
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
