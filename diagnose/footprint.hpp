// The memory check's model of what a config holds at full depth (not measured): the decoder step's
// footprint (batch::predict_footprint at d) with its weight-bound parts scaled to the model's layer
// (a gated or plain MLP of intermediate_size, every expert's and the routers for a mixture of
// experts, K and V at num_key_value_heads), the embedding and LM head (one matrix when tied), the
// logits, and eager SwiGLU's fourth intermediate-wide activation. Full fine-tuning with AdamW, or,
// with an adapter, what a LoRA / QLoRA run holds: the base frozen in 16, 8 or 4 bits (bitsandbytes'
// nf4 with double quantization: 4.127 bits a weight; the embedding and head stay 16-bit), and only
// the adapters trained (fp32 as PEFT keeps them: weight, gradient and AdamW's two moments, 16 bytes
// a parameter). Activations are the same either way: the backward still runs through every layer.
#pragma once

#include <cstdint>  // std::uint64_t, std::int64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "diagnose/config.hpp"    // ModelDims, TrainConfig
#include "workloads/decoder.hpp"  // batch::DecoderConfig

namespace sb::diagnose {

// A LoRA adapter as the config gives it (adapter:, load_in_4bit/8bit, lora_r, lora_target_linear,
// lora_target_modules). off: full fine-tuning.
struct Adapter {
  bool on = false;
  int base_bits = 16;           // the frozen base: 16, 8 (load_in_8bit) or 4 (qlora + load_in_4bit)
  std::int64_t rank = 8;        // lora_r (PEFT's default 8)
  bool all_linear = false;      // lora_target_linear: every linear layer of the decoder
  std::vector<std::string> targets;  // lora_target_modules; empty and not all_linear: q_proj, v_proj (PEFT's default)
};
Adapter adapter_of(const TrainConfig& c);

// The adapters' trainable parameters over the model's layers (LoRA: rank x (in + out) a target).
std::uint64_t adapter_parameters(const ModelDims& model, const Adapter& a);

// How the job shards and offloads the model's states (weights, gradients, AdamW's): ZeRO's stage or
// FSDP's (3: all three over the GPUs, 2: gradients and optimizer, 1: optimizer), over `world` GPUs, and
// what it keeps on the CPU instead. The default: nothing sharded, one GPU.
struct Sharding {
  int stage = 0;
  int world = 1;
  bool offload_params = false, offload_optimizer = false;
  std::string what;  // "ZeRO-3 over 8 GPUs, parameters and optimizer on the CPU"; "" none
};

struct FullDepthFootprint {
  std::uint64_t total = 0;  // bytes
  nlohmann::ordered_json parts;
  std::uint64_t parameters = 0;  // the model's, embedding and head included
  std::uint64_t trainable = 0;   // the parameters trained (all, or the adapters')
  std::string sharded;           // how the states are divided (Sharding::what), "" not
};
// Per GPU: the model's states divided as `sh` shards them, and left out where it offloads them.
FullDepthFootprint full_depth_footprint(const ModelDims& model, const batch::DecoderConfig& d, const Adapter& a = {},
                                        const Sharding& sh = {});

}  // namespace sb::diagnose
