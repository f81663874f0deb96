// A config read as its trainer reads it. An Axolotl YAML says only what its author changed: the
// rest is Axolotl's defaults for its version, then transformers' for the model's class. Diagnosing
// the keys alone named causes the trainer had already excluded (no dataloader_num_workers read as 0
// workers where Axolotl >= 0.11 sets one per process; no attention key read as eager where
// transformers picks SDPA; fp16 weights read as fp32). resolve_axolotl() applies those rules, each
// value then says where it came from ("Axolotl 0.11.0+ default_dataloader_opts"), and refuses, as
// Axolotl does, the configs Axolotl refuses (exit 2).
//
// The rules and their sources (Axolotl's tags, transformers' wheels; docs/commands/diagnose.md has
// the table): research/axolotl_defaults in the session note of 2026-12-07.
#pragma once

#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "diagnose/config.hpp"  // TrainConfig

namespace sb::diagnose {

struct Version {
  int major = 0, minor = 0, patch = 0;
  auto operator<=>(const Version&) const = default;
};
// "0.11.0", "v0.11", "0.11.0.post1", "0.18": the numbers; nothing for anything else.
std::optional<Version> parse_version(std::string_view text);
std::string to_string(Version v);

// The newest Axolotl whose rules are encoded here (2026-07-17), used when --axolotl-version is not given.
inline constexpr Version kNewestAxolotl{0, 18, 0};

struct TrainerSpec {
  Version axolotl = kNewestAxolotl;
  bool version_given = false;  // false: the newest, said so in a note
  int world_size = 1;          // processes in the job (WORLD_SIZE): Axolotl's default workers per rank
};

// Applies Axolotl `t.axolotl`'s normalization to cfg (which read_axolotl_yaml filled with the file's
// keys and, where given, apply_model_config with the model's): the batch, the precision, the
// attention the model loads with (cfg.attn_implementation; flash_attention / sdp_attention then say
// whether it is fused), the DataLoader's settings, whether the trainer can pack, and the family from
// base_model where no config.json gave it. Each value it sets gets its source and a note. Throws
// UsageError where Axolotl refuses the config: sample_packing with rl, batch_size with
// gradient_accumulation_steps, max_packed_sequence_len after 0.3, attn_implementation beside a legacy
// attention key from 0.17.
void resolve_axolotl(TrainConfig& cfg, const TrainerSpec& t);

// transformers' attention when the model is loaded without attn_implementation (4.36+): "sdpa" for the
// families whose class has _supports_sdpa, "eager" for the others; "" for a family not in the table.
std::string default_attention(std::string_view family);
// Whether Axolotl `v` packs this family with per-sample attention (its multipack list).
bool multipack_supported(std::string_view family, Version v);
// The family a hub id's name says ("meta-llama/Llama-3.2-1B" -> "llama", "EleutherAI/gpt-j-6b" ->
// "gptj"), or "" where it says none: a guess, used only where no config.json is at hand.
std::string family_from_name(std::string_view hub_id);

}  // namespace sb::diagnose
