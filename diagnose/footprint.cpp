// The memory check's model (footprint.hpp).
#include "diagnose/footprint.hpp"

#include <algorithm>  // std::min

#include "harness/dtype.hpp"  // storage_bytes

namespace sb::diagnose {

using json = nlohmann::ordered_json;

Adapter adapter_of(const TrainConfig& c) {
  Adapter a;
  if (c.adapter != "lora" && c.adapter != "qlora") return a;
  a.on = true;
  a.base_bits = c.adapter == "qlora" && c.load_in_4bit ? 4 : c.adapter == "lora" && c.load_in_8bit ? 8 : 16;
  if (c.lora_r > 0) a.rank = c.lora_r;
  a.all_linear = c.lora_target_linear;
  a.targets = c.lora_target_modules;
  return a;
}

std::uint64_t adapter_parameters(const ModelDims& model, const Adapter& a) {
  if (!a.on) return 0;
  const double h = double(model.hidden_size), kv = h * double(model.kv_heads()) / double(model.num_attention_heads);
  const double inter = double(model.expert_intermediate()), experts = model.moe() ? double(model.num_experts) : 1.0;
  // each target's in + out, by the names PEFT matches (Llama's, GPT-NeoX's, Falcon's, GPT-2's, Mixtral's)
  struct Target {
    const char* names[4];
    double in_out;
  };
  const Target kTargets[] = {
      {{"q_proj", "query", "q", nullptr}, h + h},
      {{"k_proj", "key", "k", nullptr}, h + kv},
      {{"v_proj", "value", "v", nullptr}, h + kv},
      {{"o_proj", "dense", "out_proj", "wo"}, h + h},
      {{"gate_proj", "w1", nullptr, nullptr}, model.gated_mlp ? experts * (h + inter) : 0.0},
      {{"up_proj", "w3", "fc1", "dense_h_to_4h"}, experts * (h + inter)},
      {{"down_proj", "w2", "fc2", "dense_4h_to_h"}, experts * (h + inter)},
  };
  double per_layer = 0;
  for (const Target& t : kTargets) {
    bool on = a.all_linear;
    const std::vector<std::string> defaults{"q_proj", "v_proj"};
    for (const auto& name : a.targets.empty() ? defaults : a.targets)
      for (const char* n : t.names)
        if (n && name == n) on = true;
    if (on) per_layer += t.in_out;
  }
  return std::uint64_t(double(a.rank) * per_layer * double(model.num_hidden_layers));
}

FullDepthFootprint full_depth_footprint(const ModelDims& model, const batch::DecoderConfig& d, const Adapter& a,
                                        const Sharding& sh) {
  const std::uint64_t e = std::uint64_t(storage_bytes(d.dtype));
  // one attention op's buffers: Q, O, dO, dQ, and K, V, dK, dV at the K/V heads' share (grouped-query
  // attention), and the log-sum-exp (a fused kernel's)
  const double r = double(model.kv_heads()) / double(model.num_attention_heads);
  const std::uint64_t attn_op = std::uint64_t((4.0 + 4.0 * r) * double(d.micro_batch * d.seq * d.d_model)) * e +
                                std::uint64_t(d.micro_batch * d.heads * d.seq) * 4;
  const batch::MemoryParts m = batch::predict_footprint(d, batch::OptKind::adamw, 1, attn_op, 0);
  // embedding + LM head: vocab x hidden weights each, one matrix where the head is tied to the embedding
  // (master, copy, grad, m, v); the logits and their gradient in fp32
  const std::uint64_t vh = (model.tie_word_embeddings ? 1 : 2) * std::uint64_t(model.vocab_size) * std::uint64_t(d.d_model);
  const std::uint64_t embed = vh * (4 + (d.dtype != DType::fp32 ? e : 0) + 4 + 8);
  const std::uint64_t logits = 2 * std::uint64_t(d.micro_batch * d.seq) * std::uint64_t(model.vocab_size) * 4;
  // The decoder's layer holds hidden x (hidden + 2 kv_heads head_dim) + hidden^2 + 2 hidden d_ff weights:
  // Q, K and V (K and V at its kv_heads), O and an MLP of two hidden x d_ff matrices. The model's K and V
  // are hidden x (K/V heads x head size), a share r of the Q's (grouped-query attention), and its MLP is
  // three hidden x intermediate (gated: gate, up, down) or two (plain), every expert's of a mixture of
  // experts with its router (hidden x experts): the weight-bound parts are scaled to that (1 where d is
  // the model's dense layer: kv_heads its, d_ff 1.5 a gated intermediate). The activations are the
  // decoder's at a token's MLP width, and a gated MLP's one more: eager SwiGLU keeps gate, its SiLU, up
  // and their product, 4 x intermediate a token, where the step's two matrices keep their pre-activation
  // and activation at 1.5 x, 3 x intermediate.
  const double hd = double(d.d_model), mlp_mats = model.gated_mlp ? 3.0 : 2.0;
  const double step_layer = double(d.d_model * d.qkv_out() + d.d_model * d.d_model + 2 * d.d_model * d.ff());
  const double model_layer = (2.0 + 2.0 * r) * hd * hd + mlp_mats * hd * double(model.weight_intermediate()) +
                             (model.moe() ? hd * double(model.num_experts) : 0.0);
  const double w_scale = model_layer / step_layer;
  FullDepthFootprint out;
  auto w = std::uint64_t(double(m.weights) * w_scale), g = std::uint64_t(double(m.gradients) * w_scale),
       o = std::uint64_t(double(m.optimizer) * w_scale);
  std::uint64_t embed_held = embed;
  const auto layer_params = std::uint64_t(step_layer * double(d.layers) * w_scale);
  out.trainable = layer_params + vh;
  if (a.on) {
    // the frozen base at its bits, the embedding and head at 16 (bitsandbytes leaves them), and the
    // adapters in fp32: weight, gradient, AdamW's m and v
    const double base_bytes = a.base_bits >= 16 ? double(e) : a.base_bits >= 8 ? 1.0 : 4.127 / 8.0;
    out.trainable = adapter_parameters(model, a);
    w = std::uint64_t(double(layer_params) * base_bytes) + out.trainable * 4;
    g = out.trainable * 4;
    o = out.trainable * 8;
    embed_held = vh * std::min<std::uint64_t>(e, 2);
  }
  const std::uint64_t gate_extra =
      model.gated_mlp ? (d.checkpointing ? 1 : std::uint64_t(d.layers)) * std::uint64_t(d.micro_batch * d.seq) *
                            std::uint64_t(model.active_intermediate()) * e
                      : 0;
  const std::uint64_t acts = m.activations + gate_extra;
  // sharded over the GPUs (the embedding and head with the weights under stage 3), or kept on the CPU
  if (sh.world > 1 || sh.offload_params || sh.offload_optimizer) {
    const std::uint64_t n = std::uint64_t(std::max(1, sh.world));
    if (sh.stage >= 1) o /= n;
    if (sh.stage >= 2) g /= n;
    if (sh.stage >= 3) {
      w /= n;
      embed_held /= n;
    }
    if (sh.offload_optimizer) o = 0;
    if (sh.offload_params) w = 0;  // a layer's gathered weights are the working set (left out)
    out.sharded = sh.what;
  }
  out.total = w + g + o + acts + m.attention + m.backward + embed_held + logits;
  out.parts = json{{"weights", w},         {"gradients", g},      {"optimizer", o},
                   {"activations", acts}, {"attention", m.attention}, {"backward", m.backward},
                   {"embedding_and_head", embed_held},  {"logits", logits}};
  out.parameters = layer_params + vh;
  return out;
}


}  // namespace sb::diagnose
