// Axolotl's and transformers' defaults, by version (trainer.hpp). Sources are Axolotl's tags
// (axolotl-ai-cloud/axolotl, path:line at the tag) and transformers' release wheels.
#include "diagnose/trainer.hpp"

#include <algorithm>  // std::find, std::any_of
#include <array>      // std::array
#include <cctype>     // std::tolower

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // UsageError
#include "harness/text.hpp"    // parse_whole

namespace sb::diagnose {

namespace {

bool explicit_key(const TrainConfig& c, const std::string& key) {
  const auto it = c.sources.find(key);
  return it != c.sources.end() && it->second.where != "default";
}

std::string where(const TrainConfig& c, const std::string& key) {
  const auto it = c.sources.find(key);
  return it == c.sources.end() ? std::string("default") : it->second.where;
}

// transformers' _supports_sdpa by model_type, as of 4.45-5.14 (the Axolotl pins of 0.8-0.18): the
// families whose PreTrainedModel sets it, and those that do not (eager). gemma2: SDPA since 4.50
// (4.45 forced eager, 5.25 turned it off for softcapping): taken as the pinned versions have it.
constexpr std::string_view kSdpa[] = {
    "llama",  "mistral", "mixtral", "qwen2",  "qwen2_moe", "qwen3",     "qwen3_moe", "phi",     "phi3",
    "gemma",  "gemma2",  "gemma3",  "gemma3_text", "falcon", "gpt2",   "gpt_neox", "opt",     "bert",
    "starcoder2", "stablelm", "olmo", "olmo2", "cohere", "cohere2", "deepseek_v2", "deepseek_v3",
    "granite", "llama4",  "glm",     "glm4",   "smollm3", "gpt_bigcode", "nemotron", "mllama"};
constexpr std::string_view kEager[] = {"gptj", "bloom", "mpt", "t5", "gpt_neo", "codegen", "mamba", "rwkv"};

// SUPPORTED_MULTIPACK_MODEL_TYPES (src/axolotl/monkeypatch/multipack.py) at v0.5.0, with what v0.8.0,
// v0.11.0 and v0.18.0 added; before v0.5.0 the inline list of utils/models.py:461 plus llama and
// mistral's patches.
constexpr std::string_view kMultipack040[] = {"llama", "mistral", "mixtral", "qwen2", "falcon", "phi"};
constexpr std::string_view kMultipack050[] = {"mllama_text_model", "llama", "mistral", "mixtral", "qwen2",
                                              "qwen2_moe", "falcon", "phi", "phi3", "gemma", "gemma2",
                                              "gemmoe", "starcoder2", "deepseek_v2"};
constexpr std::string_view kMultipack080[] = {"gemma3", "gemma3_text", "cohere", "cohere2", "deepseek_v3"};
constexpr std::string_view kMultipack0110[] = {"llama4", "qwen3", "qwen3_moe", "glm", "glm4", "smollm3"};
constexpr std::string_view kMultipack0180[] = {
    "apertus", "qwen3_next", "qwen3_5", "qwen3_5_moe", "glm4_moe", "glm_moe_dsa", "granite", "granitemoe",
    "granitemoeshared", "granitemoehybrid", "hunyuan_v1_dense", "hunyuan_v1_moe", "gpt_oss", "arcee", "seed_oss",
    "lfm2", "lfm2_moe", "ernie4_5", "ernie4_5_moe", "olmo", "olmo2", "olmo3", "ministral", "ministral3",
    "mistral4", "afmoe", "nemotron", "nemotron_h", "falcon_h1", "minimax_m2"};

template <std::size_t N>
bool in(const std::string_view (&list)[N], std::string_view x) {
  return std::find(std::begin(list), std::end(list), x) != std::end(list);
}

std::string lower(std::string_view s) {
  std::string out;
  for (const char c : s) out += char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// An attention implementation that runs a fused kernel (no S x S matrix in memory).
bool fused(std::string_view impl) { return impl != "eager" && !impl.empty(); }

void resolve_batch(TrainConfig& cfg) {
  if (cfg.batch_size <= 0) return;
  if (explicit_key(cfg, "gradient_accumulation_steps"))
    throw UsageError(fmt::format("{}: batch_size ({}) and gradient_accumulation_steps ({}) are both set: Axolotl "
                                 "refuses the config (\"please set only one of gradient_accumulation_steps or "
                                 "batch_size\", utils/schemas/validation.py); keep one",
                                 where(cfg, "batch_size"), cfg.batch_size, where(cfg, "gradient_accumulation_steps")));
  // normalize_config: gradient_accumulation_steps = batch_size // micro_batch_size (no world size in it)
  const std::int64_t gas = std::max<std::int64_t>(1, cfg.batch_size / cfg.micro_batch_size);
  cfg.gradient_accumulation_steps = gas;
  cfg.sources["gradient_accumulation_steps"] =
      Source{fmt::format("batch_size {} / micro_batch_size {} (Axolotl's normalize_config)", cfg.batch_size,
                         cfg.micro_batch_size)};
  cfg.notes.push_back(fmt::format(
      "batch_size: {} ({}) without gradient_accumulation_steps: {} steps of accumulation, as Axolotl's "
      "normalize_config divides it by micro_batch_size {} (utils/config/__init__.py; Axolotl 0.5+'s schema fills "
      "gradient_accumulation_steps with 1 before that runs, which would make it 1: read from the code, not run)",
      cfg.batch_size, where(cfg, "batch_size"), gas, cfg.micro_batch_size));
}

void resolve_precision(TrainConfig& cfg, const TrainerSpec& t) {
  const Version v = t.axolotl;
  // bf16 unset: the schema's default "auto" from 0.5.0 (utils/schemas/config.py); before it, None (off)
  if (cfg.bf16_word.empty() && v >= Version{0, 5, 0}) {
    // auto is skipped where fp16 is given (0.9.1+: resolve_dtype runs it only `if not cfg.fp16`)
    if (!cfg.fp16 && !cfg.float16) {
      cfg.bf16 = true;
      cfg.sources["bf16"] = Source{fmt::format("Axolotl {}+ default (bf16: auto)", v >= Version{0, 9, 1} ? "0.9.1" : "0.5.0")};
      cfg.notes.push_back(
          "bf16 not set: Axolotl's default is auto (utils/schemas/config.py), which trains in bf16 on a GPU that "
          "has it (Ampere and later: is_torch_bf16_gpu_available); set bf16: false for fp32");
    }
  }
  // Before 0.9.1 an explicit fp16: true beside bf16: auto became bf16 on a GPU with it (resolve_dtype ran
  // auto first and then set fp16 false)
  if (cfg.bf16_word == "auto" && cfg.fp16 && v < Version{0, 9, 1}) {
    cfg.bf16 = true;
    cfg.fp16 = false;
    cfg.sources["bf16"] = Source{"Axolotl < 0.9.1: bf16: auto wins over fp16: true"};
    cfg.notes.push_back(fmt::format("bf16: auto and fp16: true: Axolotl {} trains in bf16 on a GPU that has it "
                                    "(fp16 was honoured from 0.9.1)", to_string(v)));
  }
  // bfloat16 / float16: the weights loaded in that dtype (torch_dtype); bfloat16 also turns bf16 AMP on from
  // 0.10.0 (core/builders/base.py). Either way the GEMMs run in half precision.
  if (cfg.bfloat16 && !cfg.bf16) {
    cfg.bf16 = true;
    cfg.fp16 = false;
    cfg.sources["bf16"] = Source{where(cfg, "bfloat16") + " (bfloat16: the weights in bf16)"};
    cfg.notes.push_back(fmt::format("bfloat16: true ({}): the model is loaded in bf16 (torch_dtype){}: its GEMMs "
                                    "run in bf16",
                                    where(cfg, "bfloat16"),
                                    v >= Version{0, 10, 0} ? ", and bf16 mixed precision is on (0.10+)"
                                                           : ", without mixed precision (before 0.10)"));
  } else if ((cfg.float16 || (cfg.load_in_8bit && cfg.adapter == "lora")) && !cfg.bf16 && !cfg.fp16) {
    cfg.fp16 = true;
    const std::string why = cfg.float16 ? "float16" : "load_in_8bit";
    cfg.sources["fp16"] = Source{where(cfg, why) + " (" + why + ": the weights in fp16)"};
    cfg.notes.push_back(fmt::format("{}: true ({}): Axolotl's resolve_dtype loads the model in fp16 (torch_dtype), "
                                    "so its GEMMs run in fp16, without mixed precision",
                                    why, where(cfg, why)));
  }
}

// The attention implementation Axolotl `v` passes to from_pretrained for the config's keys, or "" for
// none (then transformers chooses).
std::string requested_attention(TrainConfig& cfg, Version v) {
  const bool flash = cfg.flash_attention, sdp = cfg.sdp_attention;
  const bool legacy = flash || sdp || cfg.xformers_attention || cfg.flex_attention || cfg.eager_attention;
  if (!cfg.attn_implementation.empty()) {
    if (v < Version{0, 12, 0}) {
      cfg.notes.push_back(fmt::format("attn_implementation ({}) is read from Axolotl 0.12.0 on; Axolotl {} ignores "
                                      "it (pass --axolotl-version if yours is newer)",
                                      where(cfg, "attn_implementation"), to_string(v)));
      cfg.attn_implementation.clear();
    } else {
      if (legacy && v >= Version{0, 17, 0})
        throw UsageError(fmt::format(
            "{}: attn_implementation and a legacy attention key (flash_attention, sdp_attention, xformers_attention, "
            "flex_attention, eager_attention) are both set: Axolotl {} refuses the config "
            "(normalize_attn_implementation, utils/schemas/config.py); keep attn_implementation",
            where(cfg, "attn_implementation"), to_string(v)));
      return cfg.attn_implementation == "fp8" ? "sdpa" : cfg.attn_implementation;  // fp8 loads as sdpa
    }
  }
  const bool llama_like = cfg.model_family == "llama" || cfg.model_family == "mistral";
  if (v < Version{0, 5, 0}) {  // 0.4.x: utils/models.py:450-470 and its monkeypatches
    if (flash) {
      if (!cfg.sample_packing || in(kMultipack040, cfg.model_family)) return "flash_attention_2";
      if (!cfg.model_family.empty()) {
        cfg.notes.push_back(fmt::format("flash_attention with sample_packing on model_type {}: Axolotl 0.4 loads it "
                                        "as eager (its list: mixtral, qwen2, falcon, phi; llama and mistral patched)",
                                        cfg.model_family));
        return "eager";
      }
      return "flash_attention_2";
    }
    if ((sdp || cfg.xformers_attention) && llama_like) return sdp ? "sdpa" : "xformers";
    return {};
  }
  if (cfg.flex_attention && v >= Version{0, 8, 1}) return "flex_attention";
  if (flash) return "flash_attention_2";
  if (cfg.xformers_attention) {
    // 0.9.1+ with packing: the FA2 slot with xformers' kernel; otherwise llama's patch (before 0.17)
    if ((cfg.sample_packing && v >= Version{0, 9, 1}) || v >= Version{0, 17, 0} || llama_like) return "xformers";
    return {};
  }
  if (sdp) return "sdpa";
  if (cfg.eager_attention) return "eager";
  return {};
}

void resolve_attention(TrainConfig& cfg, const TrainerSpec& t) {
  std::string impl = requested_attention(cfg, t.axolotl);
  std::string source;
  if (!impl.empty()) {
    source = explicit_key(cfg, "attn_implementation") ? where(cfg, "attn_implementation") : "the config's attention key";
  } else {
    impl = default_attention(cfg.model_family);
    if (impl.empty()) {
      impl = "sdpa";
      source = "assumed: transformers' default (SDPA) for a model whose family is not known here";
      cfg.notes.push_back(
          "no attention key: transformers then loads SDPA where the model's class supports it (most decoder "
          "families since 4.36), eager where not; the family is not known here (no config.json, no base_model "
          "name to go by), so SDPA is assumed");
    } else {
      source = fmt::format("transformers' default for model_type {} ({})", cfg.model_family,
                           impl == "sdpa" ? "_supports_sdpa" : "no SDPA: eager");
      cfg.notes.push_back(fmt::format("no attention key: Axolotl passes none, and transformers loads model_type {} "
                                      "with {}",
                                      cfg.model_family, impl == "sdpa" ? "SDPA (fused)" : "eager attention (its class has no SDPA)"));
    }
  }
  cfg.attn_implementation = impl;
  cfg.sources["attn_implementation"] = Source{source};
  if (impl == "xformers" && default_attention(cfg.model_family) == "eager")
    cfg.notes.push_back(fmt::format("xformers attention on model_type {}: Axolotl registers it through transformers' "
                                    "attention interface, which a class without SDPA may not call; taken as fused "
                                    "(assumed), so no attention finding is made",
                                    cfg.model_family));
  // the checks' two flags: flash (a varlen-capable kernel, what packing needs) and fused at all
  cfg.flash_attention = impl.find("flash") != std::string::npos || impl == "xformers" || impl == "sage" ||
                        impl.find('/') != std::string::npos;
  cfg.sdp_attention = fused(impl) && !cfg.flash_attention;
  cfg.sources["flash_attention"] = cfg.sources["sdp_attention"] = Source{"attn_implementation " + impl + " (" + source + ")"};
}

void resolve_dataloader(TrainConfig& cfg, const TrainerSpec& t) {
  const bool any = explicit_key(cfg, "dataloader_num_workers") || explicit_key(cfg, "dataloader_pin_memory") ||
                   explicit_key(cfg, "dataloader_prefetch_factor");
  if (any) {
    // With workers and no prefetch_factor, torch's DataLoader prefetches 2 a worker (HF passes None).
    return;
  }
  if (t.axolotl >= Version{0, 11, 0}) {
    // default_dataloader_opts (utils/schemas/config.py, v0.11.0:1132-1144): all three unset -> WORLD_SIZE
    // workers, pinned, prefetch 256
    cfg.dataloader_num_workers = t.world_size;
    cfg.dataloader_pin_memory = true;
    cfg.dataloader_prefetch_factor = 256;
    const std::string src = fmt::format("Axolotl 0.11.0+ default (default_dataloader_opts: WORLD_SIZE={})", t.world_size);
    for (const char* k : {"dataloader_num_workers", "dataloader_pin_memory", "dataloader_prefetch_factor"})
      cfg.sources[k] = Source{src};
    cfg.notes.push_back(fmt::format(
        "no dataloader_* key: Axolotl {} sets {} worker(s) per rank (WORLD_SIZE; --world-size), pinned memory and "
        "prefetch_factor 256 (default_dataloader_opts, since 0.11.0)",
        to_string(t.axolotl), t.world_size));
  } else {
    cfg.notes.push_back(fmt::format("no dataloader_* key: Axolotl {} passes none, so the Trainer's defaults load in "
                                    "the main process (dataloader_num_workers 0, pinned memory)",
                                    to_string(t.axolotl)));
    cfg.sources["dataloader_num_workers"] = Source{"transformers' TrainingArguments default"};
  }
}

void resolve_packing(TrainConfig& cfg, const TrainerSpec& t) {
  const Version v = t.axolotl;
  if (cfg.max_packed_sequence_len > 0) {
    if (v >= Version{0, 4, 0})
      throw UsageError(fmt::format("{}: max_packed_sequence_len is no longer supported from Axolotl 0.4.0, which "
                                   "refuses it (utils/config.py); use sample_packing: true (or pass "
                                   "--axolotl-version 0.3.0 for a config of that era)",
                                   where(cfg, "max_packed_sequence_len")));
    if (cfg.sample_packing)
      throw UsageError(fmt::format("{}: max_packed_sequence_len and sample_packing together: Axolotl {} refuses the "
                                   "config; keep one",
                                   where(cfg, "max_packed_sequence_len"), to_string(v)));
    cfg.sample_packing = true;
    cfg.sources["sample_packing"] = Source{where(cfg, "max_packed_sequence_len") + " (concatenation packing)"};
    cfg.notes.push_back(fmt::format("max_packed_sequence_len: {}: Axolotl {} concatenates samples into rows of that "
                                    "length before training (no attention isolation): read as packed",
                                    cfg.max_packed_sequence_len, to_string(v)));
  }
  if (!cfg.rl.empty()) {
    if (cfg.sample_packing)
      throw UsageError(fmt::format("{}: sample_packing with rl: {}: Axolotl refuses the config (\"sample_packing: "
                                   "true does not work with RLHF training\", check_sample_packing_w_rl, since 0.4.0)",
                                   where(cfg, "sample_packing"), cfg.rl));
    cfg.packing_unavailable = fmt::format("rl: {}: Axolotl refuses sample_packing with RL training", cfg.rl);
    return;
  }
  if (!cfg.model_family.empty() && !multipack_supported(cfg.model_family, v)) {
    cfg.packing_unavailable = fmt::format(
        "Axolotl {} has no multipack for model_type {}: sample_packing there concatenates samples under one "
        "attention mask (samples attend across each other, at full quadratic cost; a warning only)",
        to_string(v), cfg.model_family);
    return;
  }
  if (cfg.sample_packing && !cfg.flash_attention && v >= Version{0, 5, 0})
    cfg.notes.push_back(fmt::format("sample_packing with {} attention: Axolotl's per-sample packing needs a varlen "
                                    "kernel (flash_attention_2/3, flex_attention, xformers, sage); with {} it packs "
                                    "under one mask (samples attend across each other)",
                                    cfg.attn_implementation, cfg.attn_implementation));
  // pad_to_sequence_len turns on with packing from 0.9.1 (utils/schemas/validation.py)
  if (cfg.sample_packing && !explicit_key(cfg, "pad_to_sequence_len") && v >= Version{0, 9, 1}) {
    cfg.pad_to_sequence_len = true;
    cfg.sources["pad_to_sequence_len"] = Source{"Axolotl 0.9.1+ default with sample_packing"};
  }
}

}  // namespace

std::optional<Version> parse_version(std::string_view text) {
  if (!text.empty() && (text.front() == 'v' || text.front() == 'V')) text.remove_prefix(1);
  std::array<int, 3> n{0, 0, 0};
  std::size_t part = 0;
  while (!text.empty() && part < 3) {
    const auto dot = text.find('.');
    const std::string_view field = text.substr(0, dot);
    const auto x = text::parse_whole<int>(field);
    if (!x || *x < 0 || *x > 10000) return part >= 2 ? std::optional<Version>(Version{n[0], n[1], n[2]}) : std::nullopt;
    n[part++] = *x;
    if (dot == std::string_view::npos) break;
    text.remove_prefix(dot + 1);
  }
  if (part < 2) return std::nullopt;  // "0" alone is not a release
  return Version{n[0], n[1], n[2]};
}

std::string to_string(Version v) { return fmt::format("{}.{}.{}", v.major, v.minor, v.patch); }

std::string default_attention(std::string_view family) {
  if (in(kSdpa, family)) return "sdpa";
  if (in(kEager, family)) return "eager";
  return {};
}

bool multipack_supported(std::string_view family, Version v) {
  if (v < Version{0, 5, 0}) return in(kMultipack040, family);
  return in(kMultipack050, family) || (v >= Version{0, 8, 0} && in(kMultipack080, family)) ||
         (v >= Version{0, 11, 0} && in(kMultipack0110, family)) || (v >= Version{0, 18, 0} && in(kMultipack0180, family));
}

std::string family_from_name(std::string_view hub_id) {
  std::string name = lower(hub_id.substr(hub_id.rfind('/') == std::string_view::npos ? 0 : hub_id.rfind('/') + 1));
  // most specific first: "mixtral" before "mistral", "phi-3" before "phi", "gemma-2" before "gemma"
  static constexpr std::pair<std::string_view, std::string_view> kNames[] = {
      {"mixtral", "mixtral"}, {"mistral", "mistral"}, {"codellama", "llama"}, {"llama", "llama"},
      {"qwen2.5", "qwen2"}, {"qwen2-moe", "qwen2_moe"}, {"qwen2", "qwen2"}, {"qwen3", "qwen3"},
      {"phi-3", "phi3"}, {"phi3", "phi3"}, {"phi-2", "phi"}, {"phi-1", "phi"}, {"gemma-2", "gemma2"},
      {"gemma2", "gemma2"}, {"gemma-3", "gemma3"}, {"gemma", "gemma"}, {"falcon", "falcon"}, {"gpt-j", "gptj"},
      {"gptj", "gptj"}, {"gpt-neox", "gpt_neox"}, {"pythia", "gpt_neox"}, {"gpt2", "gpt2"}, {"mamba", "mamba"},
      {"bloom", "bloom"}, {"mpt-", "mpt"}, {"opt-", "opt"}, {"starcoder2", "starcoder2"}, {"t5", "t5"},
      {"deepseek-v2", "deepseek_v2"}, {"deepseek-v3", "deepseek_v3"}, {"olmo", "olmo"}, {"smollm3", "smollm3"},
      {"tinyllama", "llama"}};
  for (const auto& [needle, fam] : kNames)
    if (name.find(needle) != std::string::npos) return std::string(fam);
  return {};
}

void resolve_axolotl(TrainConfig& cfg, const TrainerSpec& t) {
  cfg.world_size = std::max(1, t.world_size);
  if (!t.version_given)
    cfg.notes.push_back(fmt::format("read as Axolotl {} reads it, the newest whose defaults are encoded here "
                                    "(--axolotl-version for yours)",
                                    to_string(t.axolotl)));
  if (cfg.model_family.empty() && !cfg.base_model.empty()) {
    cfg.model_family = family_from_name(cfg.base_model);
    if (!cfg.model_family.empty()) {
      cfg.sources["model_type"] = Source{fmt::format("guessed from base_model {}'s name", cfg.base_model)};
      cfg.notes.push_back(fmt::format("model_type {} guessed from base_model {}'s name (no config.json read: "
                                      "--model-config, or the model in the Hugging Face cache, would say)",
                                      cfg.model_family, cfg.base_model));
    }
  }
  resolve_batch(cfg);
  resolve_precision(cfg, t);
  resolve_attention(cfg, t);
  resolve_dataloader(cfg, t);
  resolve_packing(cfg, t);
  if (!cfg.adapter.empty()) {
    const bool q4 = cfg.load_in_4bit && cfg.adapter == "qlora", q8 = cfg.load_in_8bit && cfg.adapter == "lora";
    cfg.notes.push_back(fmt::format(
        "adapter: {}{}: a frozen base{} with small trainable adapters, not a full fine-tune: the step's GEMMs "
        "run over the same shapes (the frozen base's backward included), and the memory check counts the base "
        "frozen and the adapters trained (lora_r, lora_target_linear / lora_target_modules)",
        cfg.adapter, q4 ? " with load_in_4bit" : q8 ? " with load_in_8bit" : "",
        q4 ? " in 4 bits (bitsandbytes nf4)" : q8 ? " in 8 bits" : ""));
  }
  if (cfg.fsdp_offload_params || !cfg.deepspeed.empty())
    cfg.notes.push_back(fmt::format("{}: parameters or optimizer state move between the GPU and the CPU every step; "
                                    "the memory check models what it moves over PCIe",
                                    cfg.fsdp_offload_params ? "fsdp offload_params" : "deepspeed " + cfg.deepspeed));
}

}  // namespace sb::diagnose
