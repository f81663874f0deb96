// The input of `stallbench diagnose`: the user's own training config. Reads an
// Axolotl-style YAML file (the keys below; every other key is ignored and
// listed), a Hugging Face config.json for the model's layer shape, and a file
// of dataset lengths; says where every value came from, for the report.
//
// Every bad input is a sb::UsageError (the CLI's exit 2) whose message names
// the file, the line (1-based) and the key: "config.yml:12: micro_batch_size:
// expected an integer, got 'abc'". Nothing else escapes these functions
// (std::bad_alloc aside).
#pragma once

#include <cstdint>  // std::int32_t, std::int64_t
#include <map>      // std::map
#include <optional>  // std::optional
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

namespace sb::diagnose {

// Where a value came from: "config.yml:12" (the YAML key's line), the path of
// the config.json, "--lengths FILE", or "default".
struct Source {
  std::string where;
};

// A decoder layer's shape: from a Hugging Face config.json, or explicit YAML
// keys of the same names. The defaults are Llama-2-7B's.
struct ModelDims {
  std::int64_t hidden_size = 4096, num_hidden_layers = 32, num_attention_heads = 32,
               intermediate_size = 11008, vocab_size = 32000;
  // Grouped-query attention (Llama 3, Mistral, Qwen): the K and V heads, a
  // divisor of num_attention_heads; 0 = as many as the attention heads.
  std::int64_t num_key_value_heads = 0;
  std::int64_t kv_heads() const { return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads; }
  // The MLP: gated (Llama's SwiGLU and its kin: gate, up and down, three
  // hidden x intermediate matrices) or plain (GPT-2, GPT-NeoX, BERT: up and
  // down, two). From a config.json's model_type, or the YAML key gated_mlp;
  // gated by default, as the Llama family the default config is.
  bool gated_mlp = true;
  // Whether the LM head is the embedding's matrix (tie_word_embeddings; from a config.json, its
  // family's Hugging Face default where the file leaves it out: GPT-2, OPT, BLOOM, Falcon, MPT and
  // Gemma tie, Llama, Qwen2, GPT-NeoX and GPT-J do not). false: two vocab x hidden matrices.
  bool tie_word_embeddings = false;
  // A mixture of experts (Mixtral, Qwen-MoE, OLMoE, PhiMoE): num_experts MLPs of moe_intermediate_size
  // each (0: intermediate_size, as Mixtral's config.json gives it), num_experts_per_tok of them run for
  // each token, and a shared expert of shared_expert_intermediate_size run for every token beside them
  // (0: none). num_experts 0: a dense MLP.
  std::int64_t num_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0,
               shared_expert_intermediate_size = 0;
  bool moe() const { return num_experts > 0; }
  std::int64_t expert_intermediate() const { return moe_intermediate_size > 0 ? moe_intermediate_size : intermediate_size; }
  // The MLP width one token runs through: intermediate_size, or its routed experts' and the shared one's
  std::int64_t active_intermediate() const {
    return moe() ? num_experts_per_tok * expert_intermediate() + shared_expert_intermediate_size : intermediate_size;
  }
  // The MLP width whose weights a layer holds: every expert's and the shared one's
  std::int64_t weight_intermediate() const {
    return moe() ? num_experts * expert_intermediate() + shared_expert_intermediate_size : intermediate_size;
  }
  // the measured step's MLP width: the plain MLP with the FLOPs of this one for a token (and, dense, its
  // weights)
  std::int64_t step_ffn() const { return gated_mlp ? active_intermediate() * 3 / 2 : active_intermediate(); }
};

struct TrainConfig {
  ModelDims model;
  std::int64_t micro_batch_size = 1, gradient_accumulation_steps = 1, sequence_len = 2048;
  bool sample_packing = false, pad_to_sequence_len = false;
  bool bf16 = false, fp16 = false, tf32 = false;  // bf16/tf32 "auto" and bf16 "full" count as true (noted)
  std::string bf16_word;  // bf16 as written: "auto", "full", "true", "false"; "" not in the file
  bool flash_attention = false, sdp_attention = false;
  int dataloader_num_workers = 0;     // Axolotl/HF default 0
  bool dataloader_pin_memory = true;  // HF TrainingArguments default true
  int dataloader_prefetch_factor = 2; // torch default when workers > 0
  bool gradient_checkpointing = false;  // true also for "unsloth", "offload", "offload_disk" (noted)
  std::vector<std::int32_t> lengths;    // dataset lengths (tokens), empty = none given

  // What the trainer makes of the config beyond the keys above (diagnose/trainer.hpp resolves them
  // as the Axolotl version does; the keys' sources say which were in the file).
  std::string model_family;  // Hugging Face model_type ("llama", "gptj"): config.json, model_type:, base_model
  std::string base_model;    // the hub id or path (base_model:), "" unset
  std::string attn_implementation;  // the attention the model loads with: "eager", "sdpa", "flash_attention_2",
                                    // "flex_attention", "xformers", ...; "" until resolved
  bool xformers_attention = false, flex_attention = false, eager_attention = false;
  bool bfloat16 = false, float16 = false;  // pure half precision: the weights loaded in that dtype
  bool load_in_8bit = false, load_in_4bit = false, gptq = false;
  std::string adapter;  // "lora", "qlora", "" (a full fine-tune)
  std::int64_t lora_r = 0;                       // 0 unset (PEFT's default 8)
  bool lora_target_linear = false;               // every linear layer
  std::vector<std::string> lora_target_modules;  // by name (q_proj, v_proj, ...)
  std::string rl;       // "dpo", "kto", ... "" (supervised)
  std::int64_t batch_size = 0;               // Axolotl's global batch, 0 unset
  std::int64_t max_packed_sequence_len = 0;  // Axolotl <= 0.3's concatenation packing, 0 unset
  bool fsdp_offload_params = false;          // fsdp_config.offload_params (fsdp_offload_params)
  std::string deepspeed;                     // the DeepSpeed config's path, "" none
  int world_size = 1;                        // the job's processes (--world-size), for what sharding divides
  // FSDP as configured: 3 full_shard / hybrid_shard (or an fsdp_config without a list), 2 shard_grad_op,
  // 0 none (fsdp: and fsdp_config: absent)
  int fsdp_shard = 0;
  // Why the trainer cannot pack this config ("" = it can): the finding must not advise it.
  std::string packing_unavailable;
  // Every key above ("model.hidden_size" for the dims, "lengths" too) -> where
  // its value came from.
  std::map<std::string, Source> sources;
  std::vector<std::string> unknown_keys;  // "key (line N)", in file order: ignored, listed
  std::vector<std::string> notes;         // e.g. "bf16: auto (line 40) taken as true"
  // The file was Axolotl's model card (the README.md it writes in output_dir, the config in a ```yaml
  // block under "See axolotl config"): the release it names there ("0.9.1.post1"), "" otherwise.
  std::string card_axolotl_version;
};

// The config Axolotl embeds in the model card it writes (README.md in output_dir, pushed to the Hub
// beside the weights): "<details><summary>See axolotl config</summary>", "axolotl version: `X`", then
// the YAML in a ```yaml fence (Axolotl's setup_model_card since 0.4). nullopt when the text has no such
// block; the yaml is padded with the lines before it, so a line number in it is the card's.
struct AxolotlCard {
  std::string version;  // "" when the card names none
  std::string yaml;
};
std::optional<AxolotlCard> axolotl_card(const std::string& text);

// Value ranges (a value outside is a UsageError). Generous: they exist so that
// the diagnosis's products (hidden * intermediate * layers, tokens * vocab)
// never overflow, and to catch a typo's extra digits.
inline constexpr std::int64_t kMaxSequenceLen = std::int64_t(1) << 20;
inline constexpr std::int64_t kMaxMicroBatch = std::int64_t(1) << 16;
inline constexpr std::int64_t kMaxAccumulation = std::int64_t(1) << 20;
inline constexpr std::int64_t kMaxHidden = std::int64_t(1) << 20;        // hidden_size, num_attention_heads
inline constexpr std::int64_t kMaxLayers = std::int64_t(1) << 16;
inline constexpr std::int64_t kMaxIntermediate = std::int64_t(1) << 22;
inline constexpr std::int64_t kMaxVocab = std::int64_t(1) << 24;
inline constexpr std::int64_t kMaxExperts = std::int64_t(1) << 12;  // num_experts, num_experts_per_tok
inline constexpr int kMaxWorkers = 1024;         // dataloader_num_workers, dataloader_prefetch_factor
inline constexpr std::int64_t kMaxLengths = 10'000'000;  // read_lengths: sequences in all

// Reads an Axolotl-style YAML config: the keys of TrainConfig (and the five
// model dimensions as top-level keys of the same names). Unknown top-level keys
// are ignored and listed (Axolotl configs have dozens: base_model, datasets,
// lora_r, learning_rate, ...). Values:
//   - integers: a YAML integer in decimal, or a quoted string that is one
//     ("2" is 2, as Axolotl's pydantic reads it in lax mode); not 2.5, not 2.0,
//     not 0x10, not 010 (YAML 1.1, hence PyYAML, reads that as octal 8);
//   - booleans: as yaml-cpp took them (true/false, yes/no, on/off, y/n, in
//     lower, Capitalised or UPPER case), quoted or not;
//   - an empty value (`key:`, `~`, `null`) keeps the default (noted);
//   - a key given twice: the last wins, as in PyYAML (noted).
// Errors (UsageError "FILE:LINE: KEY: ..." saying what was expected): a wrong
// type, a count that is negative or zero (dataloader_num_workers may be 0), a
// value over its limit above (sequence_len over 1<<20), num_attention_heads
// not dividing hidden_size, bf16 and fp16 both true (a bf16 "auto" beside
// fp16: true yields, as it would on a GPU without bf16: noted). A file that is
// not YAML: "FILE:LINE:COL: not YAML: <libyaml's message>"; an empty file, a
// second document, or a top level that is not a mapping: UsageError naming
// the file; a missing or unreadable file: UsageError naming it.
TrainConfig read_axolotl_yaml(const std::string& path);
// What read_axolotl_yaml does with the file's contents, once read (the fuzz
// target calls it on bytes in memory); `path` names the file in messages.
TrainConfig parse_axolotl_yaml_text(const std::string& text, const std::string& path);

// The documented default when no config is given: a Llama-2-7B layer shape at
// the defaults above, every source "default".
TrainConfig default_config();

// Overrides the model dims from a Hugging Face config.json (hidden_size,
// num_hidden_layers, num_attention_heads, intermediate_size, vocab_size; a
// multimodal config without them at the top but with a "text_config" object
// is read from there, noted). A missing or null key keeps the current value
// (noted); a value replacing a different one from the YAML is noted.
// num_key_value_heads is read and noted when it differs from the heads
// (grouped-query attention). model_type sets gated_mlp: plain for the
// families whose MLP has two matrices (gpt2, gpt_neox, gpt_bigcode, gptj,
// gpt_neo, bert, roberta, opt, bloom, falcon, mpt, phi, starcoder2, codegen),
// gated for any other; without model_type gated_mlp is kept (noted). A
// family that names its dims its own way is read as its Hugging Face config
// class reads it (GPT-2's n_embd, n_layer, n_head, n_inner; MPT's d_model,
// n_layers, n_heads, expansion_ratio; BLOOM's n_embed; Falcon's n_layer,
// n_head, ffn_hidden_size; OPT's ffn_dim), a plain MLP without a width is
// 4 x hidden, multi-query attention from Falcon's, BigCode's and MPT's own
// keys, tie_word_embeddings or the family's default, and a mixture of
// experts from num_local_experts / num_experts, num_experts_per_tok,
// moe_intermediate_size, shared_expert_intermediate_size. model_types whose
// layer is not the step's (deepseek_v2/v3, dbrx, jamba, mamba, rwkv) are a
// UsageError naming the keys for a stand-in. A wrong type, a value out of
// range, heads not dividing hidden_size or kv heads not dividing heads:
// UsageError "FILE: KEY: ...". On an error cfg is unchanged.
void apply_model_config(TrainConfig& cfg, const std::string& config_json_path);
// What apply_model_config does with the file's contents, once read (the fuzz
// target calls it on bytes in memory); `path` names the file in messages.
void apply_model_config_text(TrainConfig& cfg, const std::string& text, const std::string& path);

// Dataset lengths (tokens) from a file, in the grammar of the packing
// scenario's @FILE (workloads/lengths.hpp, whose parser this uses):
// one length per line, or "length,count" CSV rows with an optional header
// line; blank lines and '#' comments allowed. Lengths >= 1, counts >= 0; a
// histogram is expanded and shuffled with a fixed seed (runs repeat). More
// than kMaxLengths sequences in all, a bad row ("FILE:LINE: expected ..."),
// an empty or unreadable file: UsageError. On an error cfg is unchanged.
void read_lengths(TrainConfig& cfg, const std::string& path);

// Where key's value came from ("config.yml:12", a config.json, "Axolotl 0.11.0+ default ..."), or
// "default".
std::string source_of(const TrainConfig& c, const std::string& key);

// The config for the diagnose report: every value as {"value", "source"}
// (the dims under "model"), the lengths summarised (count, tokens, min, max,
// mean, source: not the list), then unknown_keys and notes.
nlohmann::ordered_json to_json(const TrainConfig& cfg);

}  // namespace sb::diagnose
