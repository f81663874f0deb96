// The batch scenario's workload: a training step of a small decoder stack on
// a device's TrainOps and AttentionOp. Per layer (pre-norm, no biases, as
// Llama-style blocks are):
//   u1 = rmsnorm(x); qkv = u1 Wqkv^T; a = attention(q, k, v) (causal);
//   x' = x + a Wo^T; u2 = rmsnorm(x'); h = gelu(u2 W1^T); x'' = x' + h W2^T
// then an MSE loss on the last x, the backward of all of it, and the
// optimizer (AdamW or SGD over fp32 masters, or none) once per
// accumulation window. Gradients accumulate in fp32 (beta = 1, zeroed before
// a window: optimizer.zero_grad), the loss of each micro step divided by
// grad_accum: the window's gradient is the big batch's.
//
// Attention runs as the device's own op (flash on cpu, cuDNN SDPA on cuda)
// on its own Q, K, V buffers: its time is real, its values are not wired
// into the projections (a stand-in tensor takes its place), so the
// gradients of Wqkv are zero and those of Wo see a zero input. Every GEMM,
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
#include "harness/train_ops.hpp"  // TrainOps, DTensor, TrainGraph

namespace sb::batch {

struct DecoderConfig {
  std::int64_t micro_batch = 1, seq = 64, d_model = 64, heads = 4;
  int layers = 2;
  DType dtype = DType::fp32;
  AttnImpl attention = AttnImpl::flash;
};

enum class OptKind { adamw, sgd, none };

class DecoderStep {
 public:
  // Allocates every tensor (throws OutOfMemory, UnsupportedError).
  DecoderStep(Device& dev, TrainOps& ops, const DecoderConfig& cfg, std::uint64_t seed,
              std::function<void()> before_submit);
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
  void set_input(std::span<const float> x, std::span<const float> target);

 private:
  struct Layer {
    DTensor w[4], wc[4], g[4], m[4], v[4];  // masters, compute copies, fp32 grads, AdamW moments
    DTensor x, u1, r1, qkv, att, o, xm, u2, r2, hp, h, y;  // activations
    DTensor dxm, du2, dhp, dh, datt, dqkv, du1, dx;        // gradients
    std::unique_ptr<AttentionOp> attn;
  };
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
  DTensor out_, target_, loss_, dout_;
  std::vector<Piece> pieces_;
  float pieces_mult_ = 0;
  bool graphs_ = false, capturing_ = false, moments_ = false;
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
