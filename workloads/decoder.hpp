// The batch scenario's workload: a training step of a small decoder stack on
// a device's TrainOps and AttentionOp. Per layer (pre-norm, no biases, as
// Llama-style blocks are):
//   u1 = rmsnorm(x); qkv = u1 Wqkv^T; a = attention(q, k, v) (causal);
// with Wqkv (d_model + 2 kv_heads head_dim) x d_model: K and V at the model's
// K/V heads (grouped-query attention; kv_heads = heads unless given),
//   x' = x + a Wo^T; u2 = rmsnorm(x'); h = gelu(u2 W1^T); x'' = x' + h W2^T
// with W1 d_ff x d_model and W2 d_model x d_ff (d_ff 4 x d_model unless
// given: a gated MLP of intermediate size I, Llama's SwiGLU, has the FLOPs
// and weights of this one at d_ff = 1.5 I, which is how diagnose runs one)
// then an MSE loss on the last x, the backward of all of it, and the
// optimizer (AdamW or SGD over fp32 masters, or none) once per
// accumulation window. Gradients accumulate in fp32 (beta = 1, zeroed before
// a window: optimizer.zero_grad), the loss of each micro step divided by
// grad_accum: the window's gradient is the big batch's.
//
// Memory: the backward's activation gradients are one set shared by every
// layer (a layer's are dead once the next lower layer starts, as a
// framework frees them), with two input-gradient buffers in turn. With
// checkpointing (torch.utils.checkpoint around each layer, Axolotl's
// gradient_checkpointing), only each layer's input is kept from the forward:
// the layer's activations and its attention op are one set shared by every
// layer, and the backward of a layer first runs its forward again into it.
//
// Attention runs as the device's own op (flash on cpu, cuDNN SDPA on cuda)
// on its own Q, K, V buffers: its time is real, its values are not wired
// into the projections (a stand-in tensor takes its place), so the
// gradients of Wqkv are zero and those of Wo see a zero input. It runs at
// the query heads (its FLOPs are theirs; K and V inside it at every head,
// as an eager step's repeat_kv expands them): with grouped-query attention
// only the projections and their activations shrink. Every GEMM,
// norm, activation and the optimizer do the real work on real data.
//
// Every submission (a TrainOps call, an attention call, a graph replay)
// goes through `before_submit`, where the scenario models the framework's
// per-op dispatch cost and counts launches.
#pragma once

#include <cstdint>     // std::int64_t
#include <functional>  // std::function
#include <memory>      // std::unique_ptr
#include <string>      // std::string
#include <vector>      // std::vector

#include "harness/device.hpp"     // Device, AttentionOp
#include "harness/params.hpp"     // ParamSet
#include "harness/train_ops.hpp"  // TrainOps, DTensor, TrainGraph

namespace sb::batch {

struct DecoderConfig {
  std::int64_t micro_batch = 1, seq = 64, d_model = 64, heads = 4;
  std::int64_t d_ff = 0;  // the MLP's width; 0: 4 x d_model
  std::int64_t ff() const { return d_ff > 0 ? d_ff : 4 * d_model; }
  std::int64_t kv_heads = 0;  // K/V heads (grouped-query attention); 0: heads
  std::int64_t kv() const { return kv_heads > 0 ? kv_heads : heads; }
  // Wqkv's outputs: Q at every head, K and V at kv heads, head_dim = d_model / heads each
  std::int64_t qkv_out() const { return d_model + 2 * kv() * (d_model / heads); }
  int layers = 2;
  DType dtype = DType::fp32;
  AttnImpl attention = AttnImpl::flash;
  bool checkpointing = false;  // full activation checkpointing, one segment per layer
};

// The training footprint by part, in bytes.
//   weights: fp32 masters, plus the compute-dtype copies under mixed precision
//   gradients: fp32, one per weight
//   optimizer: AdamW's m and v (fp32), made at the first optimizer step
//   activations: what the forward keeps for the backward (each layer's input,
//     its intermediates; with checkpointing one shared set) and the output
//   attention: the attention ops' own buffers (Q, K, V, O, their gradients,
//     workspace), one op per layer (one with checkpointing)
//   backward: the shared activation-gradient set, the loss's buffers
//   workspace: the training ops' GEMM workspace, made before the first step
//     (the largest any of the step's GEMMs needs)
//   transient: allocated inside ops during a step, above the rest (0 when
//     the step allocates nothing while it runs)
struct MemoryParts {
  std::uint64_t weights = 0, gradients = 0, optimizer = 0, activations = 0, attention = 0, backward = 0,
                workspace = 0, transient = 0;
  std::uint64_t total() const {
    return weights + gradients + optimizer + activations + attention + backward + workspace + transient;
  }
};
inline constexpr int kMemoryParts = 8;
inline constexpr const char* kMemoryPartNames[kMemoryParts] = {"weights",   "gradients", "optimizer", "activations",
                                                               "attention", "backward",  "workspace", "transient"};
inline std::uint64_t part(const MemoryParts& m, int i) {
  const std::uint64_t v[kMemoryParts] = {m.weights,   m.gradients, m.optimizer, m.activations,
                                         m.attention, m.backward,  m.workspace, m.transient};
  return v[i];
}

// One GEMM of the step: C[m,n] = op(A) op(B), as TrainOps::gemm takes it.
struct GemmCall {
  bool ta = false, tb = false;
  std::int64_t m = 0, n = 0, k = 0;
  bool accumulate = false;  // a weight gradient: C fp32, beta 1 (else C in the step's dtype, beta 0)
};
// Every GEMM shape a micro step runs (forward, backward; the recompute of
// checkpointing repeats the forward's).
std::vector<GemmCall> step_gemms(const DecoderConfig& cfg);
// The GEMM workspace the step reserves: the largest any of its GEMMs needs.
std::size_t step_gemm_workspace(TrainOps& ops, const DecoderConfig& cfg);


enum class OptKind { adamw, sgd, none };

// The framework's per-op dispatch cost, spent as real host CPU work (a spin
// on the clock), as PyTorch eager spends it in the dispatcher: what the
// batch and train scenarios' before_submit does.
void spin_for(double us);

// The step's shape from a scenario's parameters (micro_batch, seq_len,
// d_model, d_ff and kv_heads where declared, heads, layers, dtype; the batch and memory scenarios share them)
// and the fused attention this device has (flash, else cuDNN). UsageError
// for a dtype the step cannot train in; UnsupportedError without a fused
// attention for the dtype.
DecoderConfig decoder_config(const ParamSet& ps, const Device& dev);
// A scenario's validate for the step's shape: UsageError (exit 2 before any point runs) when
// heads does not divide d_model, or kv_heads (where declared) does not divide heads.
void validate_decoder_shape(const ParamSet& ps);

// The step's parameters as the scenarios that build it (batch, memory, train)
// declare them, each with its own defaults (gpu_default "": the cpu's).
ParamSpec d_model_param(std::string cpu_default, std::string gpu_default);
ParamSpec heads_param(std::string cpu_default, std::string gpu_default);
ParamSpec d_ff_param();  // default 0: 4 x d_model
ParamSpec kv_heads_param();  // default 0: heads (multi-head attention)
ParamSpec layers_param(std::string cpu_default, std::string gpu_default = "");
ParamSpec dtype_param(std::string help);  // fp32 on cpu, bf16 on a GPU
ParamSpec attn_param();
ParamSpec dispatch_us_param();

// The footprint the model predicts, in closed form from the config: every
// tensor the step allocates, each rounded up to `granule` bytes (the
// allocator's alignment: 64 on cpu). What depends on the device's own
// implementation is given: the bytes of one attention op (the memory
// scenario probes them) and the GEMM workspace (step_gemm_workspace asks the
// training ops, allocating nothing). The transient part is predicted 0.
MemoryParts predict_footprint(const DecoderConfig& cfg, OptKind opt, std::uint64_t granule,
                              std::uint64_t attention_op_bytes, std::uint64_t gemm_workspace_bytes);

class DecoderStep {
 public:
  // Allocates every tensor (throws OutOfMemory, UnsupportedError).
  // share: another step of the same model (d_model, heads, layers, dtype) at
  // another shape (micro_batch, seq): this one trains *its* weights, compute
  // copies, gradients and AdamW moments (non-owning views, nothing
  // allocated for them), as one model runs batches of different padded
  // lengths; where `share` holds at least as many tokens (and checkpoints
  // alike), its activation and gradient buffers too (their first rows: the
  // two never run at once). `share` must outlive this step. UsageError when
  // the models differ.
  DecoderStep(Device& dev, TrainOps& ops, const DecoderConfig& cfg, std::uint64_t seed,
              std::function<void()> before_submit, DecoderStep* share = nullptr);
  // The model alone: weights, compute copies and gradients (and the AdamW
  // moments at prepare_optimizer), nothing that a micro batch sizes, as a
  // training process holds them between steps; steps at any shape share it.
  // It does not run a micro step itself (UsageError).
  struct ParametersOnly {};
  DecoderStep(Device& dev, TrainOps& ops, const DecoderConfig& cfg, std::uint64_t seed, ParametersOnly);
  const DecoderConfig& config() const { return cfg_; }
  std::int64_t tokens() const { return cfg_.micro_batch * cfg_.seq; }
  std::int64_t parameters() const;
  // FLOPs of one micro step's GEMMs (forward and backward: 3x the forward's
  // 2*T*params) and of its attention (forward + backward, causal).
  double gemm_flops() const;
  double attention_flops() const;

  // graphs: capture the micro step once (the first call) and replay it.
  void set_graphs(bool on) { graphs_ = on; }
  // Enqueue one micro step: forward, loss (times loss_mult), backward,
  // gradients added to the accumulated ones.
  void micro_step(float loss_mult);
  void zero_grad();
  void optimizer(OptKind kind, float lr, int step);
  // AdamW's moments now (else at the first optimizer call, as PyTorch does):
  // a step whose every tensor exists before it computes.
  void prepare_optimizer(OptKind kind);
  int optimizer_calls() const { return opt_calls_; }
  std::int64_t micro_steps() const { return micro_steps_; }
  // Submissions the last micro_step made (ops, attention calls, replays).
  std::int64_t last_submissions() const { return last_subs_; }
  // Nodes in the captured graphs (0 before capture).
  std::size_t graph_nodes() const;
  // Host access for tests: the accumulated fp32 gradients of layer l's
  // weights (0 Wqkv, 1 Wo, 2 W1, 3 W2).
  std::vector<float> grad(int layer, int which);
  std::vector<float> weight(int layer, int which);  // the fp32 master
  // The device's bytes in use, by part, read from its allocator (memory_stats)
  // around each group of allocations; transient stays 0 (the scenario
  // measures it over a step). Zero where the device reports no memory.
  const MemoryParts& measured_memory() const { return measured_; }
  void set_input(std::span<const float> x, std::span<const float> target);

 private:
  struct Acts {
    DTensor u1, r1, qkv, att, o, xm, u2, r2, hp, h, y;  // a layer's forward intermediates
  };
  struct Layer {
    DTensor w[4], wc[4], g[4], m[4], v[4];  // masters, compute copies, fp32 grads, AdamW moments
    DTensor x;                              // the layer's input (kept with or without checkpointing)
    Acts own;                               // its intermediates (empty with checkpointing)
    Acts* a = nullptr;                      // own, or the shared set
    AttentionOp* attn = nullptr;            // its attention op, or the shared one
  };
  struct Grads {
    DTensor dxm, du2, dhp, dh, datt, dqkv, du1;  // one set for every layer
  };
  // a's tensors, allocated, or views of the first tokens() rows of from's (a step it shares with)
  void alloc_acts(Acts& a, const std::string& n, const Acts* from = nullptr);
  DecoderStep(Device& dev, TrainOps& ops, const DecoderConfig& cfg, std::uint64_t seed,
              std::function<void()> before_submit, DecoderStep* share, bool parameters_only);
  // a non-owning view of t (another step's), its first numel elements (-1: all)
  static DTensor view_of(const DTensor& t, std::int64_t numel = -1);
  void forward_layer(std::vector<std::function<void()>>& run, Layer* L, DTensor* next,
                     const std::function<void(int, bool)>& attention, int l);
  struct Piece {
    int layer = -1;  // >= 0: an attention call on that layer
    bool backward = false;
    std::function<void()> ops;  // otherwise: TrainOps calls
    std::unique_ptr<TrainGraph> graph;
  };
  TrainOps& op();  // before_submit(), then the ops (nothing while capturing)
  void build_pieces(float loss_mult);
  std::int64_t in_of(int w) const;
  std::int64_t out_of(int w) const;
  const DTensor& wuse(Layer& L, int w) { return cfg_.dtype == DType::fp32 ? L.w[w] : L.wc[w]; }

  Device& dev_;
  TrainOps& ops_;
  DecoderConfig cfg_;
  std::function<void()> before_submit_;
  std::vector<Layer> ls_;
  Acts shared_acts_;
  Grads bg_;
  DTensor dx_[2];  // the input gradient of layer l in dx_[l % 2]
  std::vector<std::unique_ptr<AttentionOp>> attn_;
  DTensor out_, target_, loss_, dout_;
  MemoryParts measured_;
  std::vector<Piece> pieces_;
  float pieces_mult_ = 0;
  bool graphs_ = false, capturing_ = false, moments_ = false, parameters_only_ = false;
  DecoderStep* share_ = nullptr;  // the step whose parameters this one trains (views), or none
  std::int64_t last_subs_ = 0;
  int opt_calls_ = 0;
  std::int64_t micro_steps_ = 0;
};

// One optimizer step of a training loop: zero_grad, grad_accum micro steps
// (each loss divided by grad_accum), the optimizer once. after_zero runs
// after zero_grad, before_opt and after_opt around the optimizer (the
// scenario records events there).
void train_window(DecoderStep& step, int grad_accum, OptKind opt, float lr,
                  const std::function<void()>& before_opt = [] {}, const std::function<void()>& after_opt = [] {},
                  const std::function<void()>& after_zero = [] {});

}  // namespace sb::batch
