// The model-config reader of `stallbench diagnose --model-config FILE`: the
// bytes parsed as a Hugging Face config.json (any family's names for the
// dims, multi-query keys, tied heads, a mixture of experts) over the default
// config, then written back as the report's JSON. The model it leaves must be
// one the step and the memory check can size.
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint8_t

#include "diagnose/config.hpp"  // apply_model_config_text, default_config, to_json
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string file = "fuzz-config.json";
  sb::fuzz::usage_errors_only(file, [&] {
    sb::diagnose::TrainConfig cfg = sb::diagnose::default_config();
    sb::diagnose::apply_model_config_text(cfg, std::string(sb::fuzz::as_text(data, size)), file);
    const auto& m = cfg.model;
    sb::fuzz::require(m.hidden_size >= 1 && m.num_hidden_layers >= 1 && m.num_attention_heads >= 1 &&
                          m.vocab_size >= 1, "dims are positive");
    sb::fuzz::require(m.hidden_size % m.num_attention_heads == 0, "heads divide hidden_size");
    sb::fuzz::require(m.num_attention_heads % m.kv_heads() == 0, "K/V heads divide the heads");
    sb::fuzz::require(m.intermediate_size >= 1 && m.intermediate_size <= sb::diagnose::kMaxIntermediate,
                      "the MLP's width is in range");
    sb::fuzz::require(!m.moe() || (m.num_experts_per_tok >= 1 && m.num_experts_per_tok <= m.num_experts),
                      "a token runs between one and every expert");
    sb::fuzz::require(m.active_intermediate() >= 1 && m.active_intermediate() <= m.weight_intermediate(),
                      "a token's MLP width is at most the layer's");
    (void)sb::diagnose::to_json(cfg).dump();
  });
  return 0;
}
