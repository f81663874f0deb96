// The numerics scenario's model: an MLP trained for real through a device's
// TrainOps (harness/train_ops.hpp), so the same step runs on cpu and cuda.
//
//   h_{-1} = x                                   [batch, in]
//   u_l = norm ? rmsnorm(h_{l-1}) : h_{l-1}       (not for l = 0: x is data)
//   z_l = u_l W_l^T + b_l                         [batch, width]
//   h_l = act(z_l) + (residual && l > 0 ? h_{l-1} : 0)        l = 0 .. depth-1
//   y   = u_depth W_depth^T + b_depth             [batch, out]  (no activation)
//
// Layers are numbered 0 .. depth (the output Linear is layer `depth`), as a
// PyTorch nn.ModuleList numbers them. Mixed precision is torch.autocast's:
// W and b are fp32 masters, cast each step to the compute dtype; activations,
// their gradients and dW, db are in the compute dtype; the optimizer updates
// the masters in fp32 with the gradients times grad_scale.
#pragma once

#include <cstdint>  // std::int64_t
#include <memory>   // std::unique_ptr
#include <string>   // std::string
#include <vector>   // std::vector

#include "harness/train_ops.hpp"  // TrainOps, DTensor, Act

namespace sb::numerics {

enum class Task { regression, classification };

struct MlpConfig {
  std::int64_t in = 32, width = 128, out = 16;
  int depth = 4;  // hidden layers
  Act act = Act::relu;
  bool residual = false, norm = false;
  double init_gain = 1.0;  // times the default init's scale (He for relu/gelu, Xavier otherwise)
  Task task = Task::regression;
  DType dtype = DType::fp32;
  std::int64_t batch = 128;
};

// Where a fault is injected: the output of layer `layer` in the forward
// (activation), or in the backward the gradient at that layer's Linear
// output, dz (gradient): element 0 either way.
enum class InjectInto { activation, gradient };
struct Injection {
  bool active = false;
  float value = 0;  // NaN or +inf
  int step = 0, layer = 0;
  InjectInto into = InjectInto::activation;
};

// Stats slots (TensorStats, harness/train_ops.hpp) a step writes:
// grads first (what a per-step finite check reads), then the loss, then the
// activations (what locates a fault in the forward).
struct StatsLayout {
  int layers = 0;  // depth + 1
  int dw(int l) const { return l; }
  int db(int l) const { return layers + l; }
  int loss() const { return 2 * layers; }
  int act(int l) const { return 2 * layers + 1 + l; }
  int grad_slots() const { return 2 * layers; }
  int total() const { return 3 * layers + 1; }
};

class Mlp {
 public:
  Mlp(TrainOps& ops, const MlpConfig& cfg, std::uint64_t seed);
  const MlpConfig& config() const { return cfg_; }
  int layers() const { return cfg_.depth + 1; }
  std::int64_t in_of(int l) const { return l == 0 ? cfg_.in : cfg_.width; }
  std::int64_t out_of(int l) const { return l == cfg_.depth ? cfg_.out : cfg_.width; }
  std::int64_t parameters() const;
  const StatsLayout& layout() const { return layout_; }

  // The batch's inputs [batch, in] and targets ([batch, out] values, or
  // [batch] class indices as fp32), from host fp32. Synchronous.
  void set_batch(std::span<const float> x, std::span<const float> target);
  // Enqueue: cast masters, forward, loss (dy scaled by loss_scale), backward.
  // `inj` pokes its value at its step/layer when step == inj.step.
  void forward_backward(float loss_scale, int step, const Injection& inj);
  // Enqueue the forward and the loss only (an evaluation).
  void forward_loss();
  // Enqueue the stats of the grads (slots 0 .. grad_slots-1) or of the loss
  // and activations (the rest) into stats().
  void grad_stats();
  void act_stats();
  // Enqueue the optimizer over every layer.
  void sgd(float lr, float weight_decay, float grad_scale);
  void adamw(float lr, float beta1, float beta2, float eps, float weight_decay, int step, float grad_scale);

  DTensor& stats() { return stats_; }
  DTensor& loss() { return loss_; }

  // Host access for tests: master weights (fp32) and gradients of layer l.
  void get_weights(int l, std::vector<float>& w, std::vector<float>& b);
  void set_weights(int l, std::span<const float> w, std::span<const float> b);
  void get_grads(int l, std::vector<float>& dw, std::vector<float>& db);

 private:
  struct Layer {
    DTensor w, b;        // fp32 masters
    DTensor wc, bc;      // compute-dtype copies
    DTensor m_w, v_w, m_b, v_b;  // AdamW moments (allocated on first use)
    DTensor u;           // rmsnorm output (norm and l > 0), else unused
    DTensor rstd;        // rmsnorm's 1/rms per row
    DTensor z, h;        // pre-activation (bias added) and output
    DTensor dw, db;      // gradients, compute dtype
    DTensor dz, du, dh;  // gradient at z, at u, and at h (dh of layer l: what layer l+1 sends back)
  };
  const DTensor& input_of(int l) const;  // u_l, h_{l-1} or x
  void ensure_moments();

  TrainOps& ops_;
  MlpConfig cfg_;
  StatsLayout layout_;
  std::vector<Layer> ls_;
  DTensor x_, target_, loss_, stats_;
  bool moments_ = false;
};

// Default init: U(-a, a) with a = gain * sqrt(6 / fan_in) for relu/gelu
// (He/Kaiming uniform) and gain * sqrt(6 / (fan_in + fan_out)) otherwise
// (Xavier/Glorot uniform); biases zero.
float init_bound(Act act, std::int64_t fan_in, std::int64_t fan_out, double gain);

}  // namespace sb::numerics
