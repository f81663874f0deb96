// The input of `stallbench diagnose`: an Axolotl-style YAML config, a Hugging
// Face config.json and a dataset-lengths file, each value with its source.
// Every bad input is a UsageError naming file, line and key (exit 2).
#include "diagnose/config.hpp"

#include "harness/text.hpp"  // trim

#include <algorithm>     // std::max_element, std::min_element, std::count
#include <cctype>        // std::tolower, std::toupper
#include <map>           // std::map
#include <vector>        // std::vector
#include <charconv>      // std::from_chars
#include <cstdlib>       // std::strtod
#include <numeric>       // std::accumulate
#include <optional>      // std::optional
#include <string_view>   // std::string_view
#include <system_error>  // std::errc
#include <utility>       // std::move

#include <fmt/format.h>      // fmt::format
#include <yaml.h>  // libyaml (PyYAML's parser): the document, nodes with their lines

#include "harness/errors.hpp"     // sb::UsageError
#include "harness/files.hpp"      // read_regular_file, first_invalid_utf8, quoted_text
#include "harness/json_read.hpp"  // parse_json_text, JsonRef, reading_file
#include "workloads/lengths.hpp"  // parse_lengths, generate_lengths: the @FILE grammar

namespace sb::diagnose {

namespace {

using json = nlohmann::ordered_json;

// A histogram file is expanded, then shuffled with this seed: a dataset is
// consumed in random order, and the same file gives the same order each run.
constexpr std::uint64_t kLengthsSeed = 1;

constexpr std::string_view kDefault = "default";

// Every key of TrainConfig, in the order sources and to_json list them.
constexpr std::string_view kKeys[] = {
    "model.hidden_size", "model.num_hidden_layers", "model.num_attention_heads", "model.num_key_value_heads",
    "model.intermediate_size", "model.gated_mlp", "model.vocab_size", "model.tie_word_embeddings",
    "model.num_experts", "model.num_experts_per_tok", "model.moe_intermediate_size",
    "model.shared_expert_intermediate_size", "micro_batch_size", "gradient_accumulation_steps",
    "sequence_len", "sample_packing", "pad_to_sequence_len", "bf16", "fp16", "tf32",
    "flash_attention", "sdp_attention", "dataloader_num_workers", "dataloader_pin_memory",
    "dataloader_prefetch_factor", "gradient_checkpointing", "lengths"};

// The current value of every key but lengths, by its sources name.
json values_of(const TrainConfig& c) {
  json v;
  v["model.hidden_size"] = c.model.hidden_size;
  v["model.num_hidden_layers"] = c.model.num_hidden_layers;
  v["model.num_attention_heads"] = c.model.num_attention_heads;
  v["model.num_key_value_heads"] = c.model.kv_heads();
  v["model.intermediate_size"] = c.model.intermediate_size;
  v["model.gated_mlp"] = c.model.gated_mlp;
  v["model.vocab_size"] = c.model.vocab_size;
  v["model.tie_word_embeddings"] = c.model.tie_word_embeddings;
  v["model.num_experts"] = c.model.num_experts;
  v["model.num_experts_per_tok"] = c.model.num_experts_per_tok;
  v["model.moe_intermediate_size"] = c.model.moe_intermediate_size;
  v["model.shared_expert_intermediate_size"] = c.model.shared_expert_intermediate_size;
  v["micro_batch_size"] = c.micro_batch_size;
  v["gradient_accumulation_steps"] = c.gradient_accumulation_steps;
  v["sequence_len"] = c.sequence_len;
  v["sample_packing"] = c.sample_packing;
  v["pad_to_sequence_len"] = c.pad_to_sequence_len;
  v["bf16"] = c.bf16;
  v["fp16"] = c.fp16;
  v["tf32"] = c.tf32;
  v["flash_attention"] = c.flash_attention;
  v["sdp_attention"] = c.sdp_attention;
  v["dataloader_num_workers"] = c.dataloader_num_workers;
  v["dataloader_pin_memory"] = c.dataloader_pin_memory;
  v["dataloader_prefetch_factor"] = c.dataloader_prefetch_factor;
  v["gradient_checkpointing"] = c.gradient_checkpointing;
  return v;
}

// The sources name of a YAML key ("model.hidden_size" for "hidden_size"), or
// "" for a key this reader does not know.
std::string sources_name(std::string_view key) {
  for (const auto k : kKeys) {
    if (k == "lengths") continue;  // from --lengths, never the YAML
    if (k == key) return std::string(k);
    if (k.substr(0, 6) == "model." && k.substr(6) == key) return std::string(k);
  }
  return {};
}


// User text in a message: at most 40 bytes, control bytes and invalid UTF-8 (an escape in a quoted scalar,
// "\uD800", decodes to bytes that are not) shown as \xNN.
std::string printable(std::string_view s) { return quoted_text(s, 40); }

using text::trim;

// ---- YAML ---------------------------------------------------------------------

// A YAML node as the reader needs it, built from libyaml's document (the
// parser PyYAML, and so Axolotl, reads configs with). yaml-cpp 0.7 was used
// first: fuzzing found it looping for ever on two inputs of 10 and 28
// malformed bytes, which libyaml rejects or reads at once.
enum class YType { Null, Scalar, Sequence, Map };
struct YMark {
  int line = 0;  // 0-based
};
struct YNode {
  YType type = YType::Null;
  std::string scalar;
  bool quoted = false;  // a quoted scalar: a string, never null
  YMark mark;
  std::vector<YNode> keys, values;  // Map, in file order (a repeated key appears twice)
  std::vector<YNode> items;         // Sequence
  YType Type() const { return type; }
  bool IsNull() const { return type == YType::Null; }
  bool IsScalar() const { return type == YType::Scalar; }
  bool IsMap() const { return type == YType::Map; }
  const std::string& Scalar() const { return scalar; }
  std::string Tag() const { return quoted ? "!" : "?"; }
  YMark Mark() const { return mark; }
};

// libyaml's node n as a YNode. Aliases are libyaml's references to the
// anchored node; a file whose aliases would expand past a million nodes, or
// that nests deeper than 256, is not a training config (and is exit 2).
YNode to_ynode(yaml_document_t* doc, yaml_node_t* n, int depth, std::size_t& count, const std::string& path) {
  if (++count > 1000000)
    throw UsageError(fmt::format("{}: over a million YAML nodes once aliases are expanded: not a training config", path));
  if (depth > 256) throw UsageError(fmt::format("{}:{}: nested deeper than 256: not a training config", path, n->start_mark.line + 1));
  YNode y;
  y.mark.line = int(n->start_mark.line);
  switch (n->type) {
    case YAML_SCALAR_NODE: {
      y.scalar.assign(reinterpret_cast<const char*>(n->data.scalar.value), n->data.scalar.length);
      y.quoted = n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE && n->data.scalar.style != YAML_ANY_SCALAR_STYLE;
      const bool null_word = y.scalar.empty() || y.scalar == "~" || y.scalar == "null" || y.scalar == "Null" ||
                             y.scalar == "NULL";
      y.type = !y.quoted && null_word ? YType::Null : YType::Scalar;
      break;
    }
    case YAML_SEQUENCE_NODE:
      y.type = YType::Sequence;
      for (yaml_node_item_t* i = n->data.sequence.items.start; i < n->data.sequence.items.top; ++i)
        if (yaml_node_t* c = yaml_document_get_node(doc, *i)) y.items.push_back(to_ynode(doc, c, depth + 1, count, path));
      break;
    case YAML_MAPPING_NODE:
      y.type = YType::Map;
      for (yaml_node_pair_t* pr = n->data.mapping.pairs.start; pr < n->data.mapping.pairs.top; ++pr) {
        yaml_node_t* k = yaml_document_get_node(doc, pr->key);
        yaml_node_t* v = yaml_document_get_node(doc, pr->value);
        if (k && v) {
          y.keys.push_back(to_ynode(doc, k, depth + 1, count, path));
          y.values.push_back(to_ynode(doc, v, depth + 1, count, path));
        }
      }
      break;
    default: break;
  }
  return y;
}

// The file's documents: none (empty), one, or the line where a second starts.
struct YDocs {
  std::optional<YNode> first;
  std::optional<int> second_line;  // 0-based
};
YDocs load_yaml(const std::string& text, const std::string& path) {
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser)) throw Error(ErrorKind::runtime, "libyaml: cannot initialize a parser");
  yaml_parser_set_input_string(&parser, reinterpret_cast<const unsigned char*>(text.data()), text.size());
  YDocs out;
  std::string problem;
  for (int i = 0; i < 2 && problem.empty(); ++i) {
    yaml_document_t doc;
    if (!yaml_parser_load(&parser, &doc)) {
      problem = fmt::format("{}:{}:{}: not YAML: {}{}", path, parser.problem_mark.line + 1,
                            parser.problem_mark.column + 1, parser.problem ? parser.problem : "a syntax error",
                            parser.context ? fmt::format(" ({})", parser.context) : std::string());
      break;
    }
    yaml_node_t* root = yaml_document_get_root_node(&doc);
    try {
      if (root && i == 0) {
        std::size_t count = 0;
        out.first = to_ynode(&doc, root, 0, count, path);
      } else if (root) {
        out.second_line = int(root->start_mark.line);
      }
    } catch (...) {
      yaml_document_delete(&doc);
      yaml_parser_delete(&parser);
      throw;
    }
    yaml_document_delete(&doc);
    if (!root) break;  // the end of the stream
  }
  yaml_parser_delete(&parser);
  if (!problem.empty()) throw UsageError(problem);
  return out;
}

// Reads one YAML file's keys into cfg; `line` arguments are 1-based.
class YamlReader {
 public:
  YamlReader(const std::string& path, TrainConfig& cfg) : path_(path), cfg_(cfg) {}

  [[noreturn]] void fail(int line, std::string_view key, std::string_view what) const {
    throw UsageError(fmt::format("{}:{}: {}: {}", path_, line, key, what));
  }
  std::string where(int line) const { return fmt::format("{}:{}", path_, line); }

  // What a value is, for a message: 'abc', the string '2', a list, ...
  static std::string describe(const YNode& v) {
    switch (v.Type()) {
      case YType::Null: return "nothing";
      case YType::Sequence: return "a list";
      case YType::Map: return "a mapping";
      case YType::Scalar:
        return (v.Tag() == "!" ? "the string '" : "'") + printable(v.Scalar()) + "'";
      default: return "an undefined value";
    }
  }

  // An integer in [lo, hi]. A plain YAML integer in decimal; a quoted string
  // is taken when it holds one ("2" is 2): Axolotl validates its config with
  // pydantic, whose lax mode turns "2" into 2, so such a config runs there.
  std::int64_t integer(int line, std::string_view key, const YNode& v, std::int64_t lo,
                       std::int64_t hi) const {
    if (!v.IsScalar()) fail(line, key, "expected an integer, got " + describe(v));
    std::string_view s = trim(v.Scalar());
    const std::string_view digits = !s.empty() && s.front() == '+' ? s.substr(1) : s;
    std::int64_t x = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), x);
    const bool whole = !digits.empty() && end == digits.data() + digits.size();
    if (whole && ec == std::errc::result_out_of_range)
      fail(line, key, fmt::format("expected an integer in [{}, {}], got {}", lo, hi, describe(v)));
    if (!whole || ec != std::errc()) {
      // "2.5", "2.0", "1e3": a number, but not an integer.
      const std::string text(s);
      char* stop = nullptr;
      (void)std::strtod(text.c_str(), &stop);
      const bool number = !text.empty() && stop == text.c_str() + text.size();
      fail(line, key, fmt::format("expected an integer, got {}{}", describe(v),
                                  number ? " (not a whole number)" : ""));
    }
    const std::string_view magnitude = digits.substr(digits.front() == '-' ? 1 : 0);
    if (magnitude.size() > 1 && magnitude.front() == '0')
      fail(line, key, fmt::format("expected a decimal integer without leading zeros (YAML 1.1, which "
                                  "Axolotl's PyYAML reads, takes 010 as octal 8), got {}", describe(v)));
    if (x < lo)
      fail(line, key, lo == 1 ? fmt::format("expected a positive integer, got {}", x)
                              : fmt::format("expected an integer >= {}, got {}", lo, x));
    if (x > hi) fail(line, key, fmt::format("expected at most {}, got {}", hi, x));
    return x;
  }

  // What yaml-cpp took as a boolean: true/false, yes/no, on/off, y/n, in
  // lower, Capitalised or UPPER case, quoted or not (pydantic's lax mode,
  // Axolotl's validation, takes these strings too). Not 0 or 1.
  std::optional<bool> maybe_boolean(const YNode& v) const {
    if (!v.IsScalar()) return std::nullopt;
    const std::string& w = v.Scalar();
    // lower, Capitalised or UPPER case only ("tRUE" is not a boolean)
    std::string low;
    for (char c : w) low += char(std::tolower(static_cast<unsigned char>(c)));
    std::string cap = low, up;
    if (!cap.empty()) cap[0] = char(std::toupper(static_cast<unsigned char>(cap[0])));
    for (char c : low) up += char(std::toupper(static_cast<unsigned char>(c)));
    if (w != low && w != cap && w != up) return std::nullopt;
    if (low == "y" || low == "yes" || low == "true" || low == "on") return true;
    if (low == "n" || low == "no" || low == "false" || low == "off") return false;
    return std::nullopt;
  }
  bool boolean(int line, std::string_view key, const YNode& v) const {
    if (const auto b = maybe_boolean(v)) return *b;
    fail(line, key, "expected true or false, got " + describe(v));
  }

  void read(const YNode& doc);

 private:
  bool read_key(const std::string& key, int line, const YNode& v);
  // The keys that say what the trainer does with the rest (diagnose/trainer.hpp reads them): the model,
  // the attention, the precision, adapters, RL, packing and batch forms. false: not one of them.
  bool read_trainer_key(const std::string& key, int line, const YNode& v);
  void set_source(const std::string& key, int line) { cfg_.sources[key] = Source{where(line)}; }

  const std::string& path_;
  TrainConfig& cfg_;
  std::map<std::string, int> line_of_;  // sources name -> line that set it
  std::string bf16_word_;               // "auto" or "full" when bf16 was given so
  std::string tf32_word_;               // "auto" when tf32 was
};

bool YamlReader::read_key(const std::string& key, int line, const YNode& v) {
  struct IntField {
    std::string_view name;
    std::int64_t* field;
    std::int64_t lo, hi;
  };
  const IntField ints[] = {
      {"hidden_size", &cfg_.model.hidden_size, 1, kMaxHidden},
      {"num_hidden_layers", &cfg_.model.num_hidden_layers, 1, kMaxLayers},
      {"num_attention_heads", &cfg_.model.num_attention_heads, 1, kMaxHidden},
      {"num_key_value_heads", &cfg_.model.num_key_value_heads, 1, kMaxHidden},
      {"intermediate_size", &cfg_.model.intermediate_size, 1, kMaxIntermediate},
      {"vocab_size", &cfg_.model.vocab_size, 1, kMaxVocab},
      {"num_experts", &cfg_.model.num_experts, 1, kMaxExperts},
      {"num_experts_per_tok", &cfg_.model.num_experts_per_tok, 1, kMaxExperts},
      {"moe_intermediate_size", &cfg_.model.moe_intermediate_size, 1, kMaxIntermediate},
      {"shared_expert_intermediate_size", &cfg_.model.shared_expert_intermediate_size, 1, kMaxIntermediate},
      {"micro_batch_size", &cfg_.micro_batch_size, 1, kMaxMicroBatch},
      {"gradient_accumulation_steps", &cfg_.gradient_accumulation_steps, 1, kMaxAccumulation},
      {"sequence_len", &cfg_.sequence_len, 1, kMaxSequenceLen},
  };
  struct SmallIntField {
    std::string_view name;
    int* field;
    int lo, hi;
  };
  const SmallIntField small_ints[] = {
      {"dataloader_num_workers", &cfg_.dataloader_num_workers, 0, kMaxWorkers},
      {"dataloader_prefetch_factor", &cfg_.dataloader_prefetch_factor, 1, kMaxWorkers},
  };
  struct BoolField {
    std::string_view name;
    bool* field;
  };
  const BoolField bools[] = {
      {"sample_packing", &cfg_.sample_packing}, {"pad_to_sequence_len", &cfg_.pad_to_sequence_len},
      {"fp16", &cfg_.fp16}, {"flash_attention", &cfg_.flash_attention},
      {"sdp_attention", &cfg_.sdp_attention}, {"dataloader_pin_memory", &cfg_.dataloader_pin_memory},
      {"gated_mlp", &cfg_.model.gated_mlp},  {"tie_word_embeddings", &cfg_.model.tie_word_embeddings},
  };
  const std::string name = sources_name(key);
  if (name.empty()) return false;

  if (v.IsNull()) {  // `key:`, `key: ~`, `key: null`: Axolotl's None, the default
    cfg_.notes.push_back(fmt::format("{}: empty at line {}; the default {} kept", key, line,
                                     values_of(cfg_)[name].dump()));
    return true;
  }
  for (const auto& f : ints)
    if (key == f.name) *f.field = integer(line, key, v, f.lo, f.hi);
  for (const auto& f : small_ints)
    if (key == f.name) *f.field = int(integer(line, key, v, f.lo, f.hi));
  for (const auto& f : bools)
    if (key == f.name) *f.field = boolean(line, key, v);

  const std::string word = v.IsScalar() ? v.Scalar() : std::string();
  if (key == "bf16") {
    // Axolotl: bool, "auto" (bf16 where the GPU has it) or "full" (pure bf16,
    // bf16_full_eval). Both train in bf16 on any GPU worth diagnosing.
    bf16_word_.clear();
    cfg_.bf16_word = word == "auto" || word == "full" ? word : maybe_boolean(v).value_or(false) ? "true" : "false";
    if (word == "auto" || word == "full") {
      cfg_.bf16 = true;
      bf16_word_ = word;
    } else if (const auto b = maybe_boolean(v)) {
      cfg_.bf16 = *b;
    } else {
      fail(line, key, "expected true, false, auto or full, got " + describe(v));
    }
  } else if (key == "tf32") {
    // Newer Axolotl: bool or "auto" (tf32 where the GPU has it).
    tf32_word_.clear();
    if (word == "auto") {
      cfg_.tf32 = true;
      tf32_word_ = word;
    } else if (const auto b = maybe_boolean(v)) {
      cfg_.tf32 = *b;
    } else {
      fail(line, key, "expected true, false or auto, got " + describe(v));
    }
  } else if (key == "gradient_checkpointing") {
    // Axolotl: bool, "offload" / "offload_disk" (checkpoints moved to host
    // memory or disk), and in 2024's releases "unsloth" (Unsloth's offloaded
    // checkpointing). Each recomputes the forward: checkpointing is on.
    if (word == "unsloth" || word == "offload" || word == "offload_disk") {
      cfg_.gradient_checkpointing = true;
      cfg_.notes.push_back(fmt::format(
          "gradient_checkpointing: {} (line {}) taken as true: activations are recomputed, and {}", word,
          line, word == "offload_disk" ? "the checkpoints go to disk" : "the checkpoints go to host memory"));
    } else if (const auto b = maybe_boolean(v)) {
      cfg_.gradient_checkpointing = *b;
    } else {
      fail(line, key, "expected true, false, offload, offload_disk or unsloth, got " + describe(v));
    }
  }
  set_source(name, line);
  line_of_[name] = line;
  return true;
}

// Axolotl's model_type key names a class ("LlamaForCausalLM", "MambaLMHeadModel"); the family is the
// Hugging Face model_type ("llama", "mamba"). AutoModelForCausalLM names none.
std::string family_of_class(std::string_view cls) {
  static constexpr std::pair<std::string_view, std::string_view> kOdd[] = {
      {"GPTJ", "gptj"}, {"GPTNeoX", "gpt_neox"}, {"GPTNeo", "gpt_neo"}, {"GPT2", "gpt2"},
      {"GPTBigCode", "gpt_bigcode"}, {"Qwen2Moe", "qwen2_moe"}, {"Qwen3Moe", "qwen3_moe"},
      {"DeepseekV2", "deepseek_v2"}, {"DeepseekV3", "deepseek_v3"}, {"StableLm", "stablelm"}};
  std::string_view stem = cls;
  for (const std::string_view tail : {"ForCausalLM", "LMHeadModel", "ForConditionalGeneration", "Model"})
    if (stem.size() > tail.size() && stem.substr(stem.size() - tail.size()) == tail) {
      stem = stem.substr(0, stem.size() - tail.size());
      break;
    }
  if (stem.empty() || stem.substr(0, 4) == "Auto") return {};
  for (const auto& [c, f] : kOdd)
    if (stem == c) return std::string(f);
  std::string out;
  for (const char ch : stem) out += char(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

bool YamlReader::read_trainer_key(const std::string& key, int line, const YNode& v) {
  const std::string word = v.IsScalar() ? v.Scalar() : std::string();
  const auto text_key = [&](std::string& field) {
    if (!v.IsNull() && !v.IsScalar()) fail(line, key, "expected a string, got " + describe(v));
    field = v.IsNull() ? std::string() : word;
  };
  const auto bool_key = [&](bool& field) { field = v.IsNull() ? false : boolean(line, key, v); };
  if (key == "base_model") {
    text_key(cfg_.base_model);
  } else if (key == "base_model_config") {
    std::string id;
    text_key(id);
    if (!id.empty()) cfg_.base_model = id;  // the config's own hub id, where the weights are elsewhere
  } else if (key == "model_type") {
    std::string cls;
    text_key(cls);
    const std::string fam = family_of_class(cls);
    if (fam.empty()) return true;  // AutoModelForCausalLM: the family comes from the model's config.json
    cfg_.model_family = fam;
  } else if (key == "attn_implementation") {
    text_key(cfg_.attn_implementation);
    static constexpr std::string_view kKnown[] = {"eager", "sdpa", "flash_attention_2", "flash_attention_3",
                                                  "flex_attention", "xformers", "sage", "fp8"};
    const bool hub_kernel = cfg_.attn_implementation.find('/') != std::string::npos;  // kernels-community/...
    if (!cfg_.attn_implementation.empty() && !hub_kernel &&
        std::find(std::begin(kKnown), std::end(kKnown), cfg_.attn_implementation) == std::end(kKnown))
      fail(line, key,
           fmt::format("'{}' is not an attention implementation Axolotl accepts; expected eager, sdpa, "
                       "flash_attention_2, flash_attention_3, flex_attention, xformers, sage, fp8 or a hub kernel "
                       "(org/name)",
                       printable(cfg_.attn_implementation)));
  } else if (key == "xformers_attention") {
    bool_key(cfg_.xformers_attention);
  } else if (key == "flex_attention") {
    bool_key(cfg_.flex_attention);
  } else if (key == "eager_attention") {
    bool_key(cfg_.eager_attention);
  } else if (key == "bfloat16") {
    bool_key(cfg_.bfloat16);
  } else if (key == "float16") {
    bool_key(cfg_.float16);
  } else if (key == "load_in_8bit") {
    bool_key(cfg_.load_in_8bit);
  } else if (key == "load_in_4bit") {
    bool_key(cfg_.load_in_4bit);
  } else if (key == "gptq") {
    bool_key(cfg_.gptq);
  } else if (key == "adapter") {
    text_key(cfg_.adapter);
  } else if (key == "lora_r") {
    cfg_.lora_r = v.IsNull() ? 0 : integer(line, key, v, 1, kMaxHidden);
  } else if (key == "lora_target_linear") {
    bool_key(cfg_.lora_target_linear);
  } else if (key == "lora_target_modules") {
    cfg_.lora_target_modules.clear();
    if (v.IsScalar()) {
      cfg_.lora_target_modules.push_back(word);
    } else if (v.Type() == YType::Sequence) {
      for (const auto& item : v.items) {
        if (!item.IsScalar()) fail(line, key, "expected a list of module names, got a list holding " + describe(item));
        cfg_.lora_target_modules.push_back(item.Scalar());
      }
    } else if (!v.IsNull()) {
      fail(line, key, "expected a list of module names, got " + describe(v));
    }
  } else if (key == "rl") {
    // rl: dpo | ipo | kto | orpo | simpo | grpo ...; false or empty: supervised
    if (const auto b = maybe_boolean(v); b && !*b) cfg_.rl.clear();
    else text_key(cfg_.rl);
  } else if (key == "batch_size") {
    cfg_.batch_size = v.IsNull() ? 0 : integer(line, key, v, 1, kMaxMicroBatch * kMaxAccumulation);
  } else if (key == "max_packed_sequence_len") {
    cfg_.max_packed_sequence_len = v.IsNull() ? 0 : integer(line, key, v, 1, kMaxSequenceLen);
  } else if (key == "fsdp_offload_params") {
    bool_key(cfg_.fsdp_offload_params);
  } else if (key == "fsdp") {  // Axolotl's list of FSDP options: full_shard, shard_grad_op, auto_wrap, offload
    std::vector<std::string> words;
    if (v.IsScalar()) words.push_back(word);
    else if (v.Type() == YType::Sequence)
      for (const auto& item : v.items)
        if (item.IsScalar()) words.push_back(item.Scalar());
    for (const auto& w : words) {
      if (w.find("shard_grad_op") != std::string::npos) cfg_.fsdp_shard = 2;
      else if ((w.find("full_shard") != std::string::npos || w.find("hybrid_shard") != std::string::npos) &&
               cfg_.fsdp_shard != 2)
        cfg_.fsdp_shard = 3;
      if (w.find("offload") != std::string::npos) cfg_.fsdp_offload_params = true;
    }
  } else if (key == "fsdp_config") {
    if (v.IsMap() && cfg_.fsdp_shard == 0) cfg_.fsdp_shard = 3;  // FSDP's default sharding: full
    // FSDP1's sharding_strategy (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, NO_SHARD), FSDP2's
    // reshard_after_forward: false (the weights kept gathered after the forward: ZeRO-2's division)
    for (std::size_t i = 0; v.IsMap() && i < v.keys.size(); ++i) {
      if (!v.keys[i].IsScalar() || !v.values[i].IsScalar()) continue;
      const std::string k = v.keys[i].Scalar(), val = v.values[i].Scalar();
      if (k == "sharding_strategy" || k == "fsdp_sharding_strategy")
        cfg_.fsdp_shard = val.find("SHARD_GRAD_OP") != std::string::npos ? 2 : val.find("NO_SHARD") != std::string::npos ? 0 : 3;
      if ((k == "reshard_after_forward" || k == "fsdp_reshard_after_forward") && (val == "false" || val == "False"))
        cfg_.fsdp_shard = 2;
    }
    if (v.IsMap())
      for (std::size_t i = 0; i < v.keys.size(); ++i)
        if (v.keys[i].IsScalar() && (v.keys[i].Scalar() == "offload_params" || v.keys[i].Scalar() == "fsdp_offload_params"))
          cfg_.fsdp_offload_params = !v.values[i].IsNull() && boolean(v.keys[i].Mark().line + 1, v.keys[i].Scalar(), v.values[i]);
  } else if (key == "deepspeed") {
    text_key(cfg_.deepspeed);
  } else {
    return false;
  }
  cfg_.sources[key] = Source{where(line)};
  line_of_[key] = line;
  return true;
}

void YamlReader::read(const YNode& doc) {
  struct Entry {
    std::string key;  // "" for a key that is not a string
    int line;
    YNode value;
  };
  std::vector<Entry> entries;
  std::map<std::string, std::size_t> last;  // key -> index of its last entry
  for (std::size_t i = 0; i < doc.keys.size(); ++i) {
    const YNode& k = doc.keys[i];
    const int line = k.Mark().line + 1;
    std::string key = k.IsScalar() ? k.Scalar() : std::string();
    if (!key.empty()) last[key] = entries.size();
    entries.push_back({std::move(key), line, doc.values[i]});
  }
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (e.key.empty()) {
      cfg_.unknown_keys.push_back(fmt::format("<an empty or non-string key> (line {})", e.line));
      continue;
    }
    const std::size_t final_entry = last.at(e.key);
    if (final_entry != i) {
      // PyYAML, which Axolotl reads with, keeps a repeated key's last value.
      if (!sources_name(e.key).empty()) {
        cfg_.notes.push_back(fmt::format("{}: given at line {} and again at line {}; the last is used, as "
                                         "Axolotl (PyYAML) does", e.key, e.line, entries[final_entry].line));
        continue;
      }
    }
    if (read_trainer_key(e.key, e.line, e.value)) continue;
    if (!read_key(e.key, e.line, e.value))
      cfg_.unknown_keys.push_back(fmt::format("{} (line {})", printable(e.key), e.line));
  }

  // Cross-key checks, at the line of the key that breaks them.
  auto& m = cfg_.model;
  if (m.hidden_size % m.num_attention_heads != 0) {
    if (line_of_.count("model.num_attention_heads"))
      fail(line_of_.at("model.num_attention_heads"), "num_attention_heads",
           fmt::format("{} does not divide hidden_size {} ({}); expected a divisor of the hidden size",
                       m.num_attention_heads, m.hidden_size, source_of(cfg_, "model.hidden_size")));
    fail(line_of_.at("model.hidden_size"), "hidden_size",
         fmt::format("{} is not a multiple of num_attention_heads {} ({}); expected a multiple of the heads",
                     m.hidden_size, m.num_attention_heads, source_of(cfg_, "model.num_attention_heads")));
  }
  if (m.num_attention_heads % m.kv_heads() != 0) {
    if (line_of_.count("model.num_key_value_heads"))
      fail(line_of_.at("model.num_key_value_heads"), "num_key_value_heads",
           fmt::format("{} does not divide num_attention_heads {} ({}); expected a divisor of the heads",
                       m.kv_heads(), m.num_attention_heads, source_of(cfg_, "model.num_attention_heads")));
    fail(line_of_.at("model.num_attention_heads"), "num_attention_heads",
         fmt::format("{} is not a multiple of num_key_value_heads {} ({}); expected a multiple of the K/V heads",
                     m.num_attention_heads, m.kv_heads(), source_of(cfg_, "model.num_key_value_heads")));
  }
  // a mixture of experts needs both counts, the routed ones at most the experts
  const bool experts = line_of_.count("model.num_experts") > 0, per_tok = line_of_.count("model.num_experts_per_tok") > 0;
  if (experts != per_tok)
    fail(line_of_.at(experts ? "model.num_experts" : "model.num_experts_per_tok"),
         experts ? "num_experts" : "num_experts_per_tok",
         fmt::format("given without {}; expected both (a mixture of experts: how many, and how many a token runs)",
                     experts ? "num_experts_per_tok" : "num_experts"));
  if (m.num_experts_per_tok > m.num_experts)
    fail(line_of_.at("model.num_experts_per_tok"), "num_experts_per_tok",
         fmt::format("{} is more than num_experts {}; expected at most the experts", m.num_experts_per_tok,
                     m.num_experts));
  if (cfg_.bf16 && cfg_.fp16) {
    const int bf16_line = line_of_.at("bf16"), fp16_line = line_of_.at("fp16");
    if (bf16_word_ == "auto") {
      // Axolotl's auto picks bf16 only where the GPU has it; beside an explicit
      // fp16: true the config means fp16.
      cfg_.bf16 = false;
      cfg_.notes.push_back(fmt::format("bf16: auto (line {}) taken as false: fp16 is true (line {})",
                                       bf16_line, fp16_line));
      bf16_word_.clear();
    } else {
      const bool fp16_later = fp16_line > bf16_line;
      fail(fp16_later ? fp16_line : bf16_line, fp16_later ? "fp16" : "bf16",
           fmt::format("true, and {} is true too (line {}); expected at most one of bf16 and fp16",
                       fp16_later ? "bf16" : "fp16", fp16_later ? bf16_line : fp16_line));
    }
  }
  if (!bf16_word_.empty())
    cfg_.notes.push_back(fmt::format(
        "bf16: {} (line {}) taken as true{}", bf16_word_, line_of_.at("bf16"),
        bf16_word_ == "auto" ? " (Axolotl's auto means bf16 on a GPU that has it: Ampere and later)"
                             : " (full: pure bf16, evaluation in bf16 too)"));
  if (!tf32_word_.empty())
    cfg_.notes.push_back(fmt::format(
        "tf32: auto (line {}) taken as true (Axolotl's auto means tf32 on a GPU that has it)",
        line_of_.at("tf32")));
}

}  // namespace

// ---- the public functions ------------------------------------------------------------

std::string source_of(const TrainConfig& c, const std::string& key) {
  const auto it = c.sources.find(key);
  return it == c.sources.end() ? std::string(kDefault) : it->second.where;
}

TrainConfig default_config() {
  TrainConfig c;
  for (const auto key : kKeys) c.sources[std::string(key)] = Source{std::string(kDefault)};
  return c;
}

TrainConfig read_axolotl_yaml(const std::string& path) {
  return parse_axolotl_yaml_text(read_regular_file(path, "training config"), path);
}

TrainConfig parse_axolotl_yaml_text(const std::string& text, const std::string& path) {
  // The other files diagnose reads, given where the training config goes:
  // said so, not read as a config of unknown keys and run on the defaults.
  if (text.size() >= 2 && static_cast<unsigned char>(text[0]) == 0x1f && static_cast<unsigned char>(text[1]) == 0x8b)
    throw UsageError(fmt::format("{}: gzip-compressed, not a YAML training config; a PyTorch profiler trace "
                                 "(.json.gz) is read with `stallbench diagnose --trace {}`",
                                 path, path));
  // YAML is Unicode text; a key or value that is not UTF-8 would reach the report's JSON later
  if (const auto at = first_invalid_utf8(text)) {
    const auto line = 1 + std::count(text.begin(), text.begin() + std::ptrdiff_t(*at), '\n');
    throw UsageError(fmt::format("{}:{}: not UTF-8 text (byte {})", path, line, *at));
  }
  // Axolotl's model card (README.md in output_dir): its embedded config, read as the file
  std::optional<AxolotlCard> card;
  try {
    card = axolotl_card(text);
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("{}: {}", path, e.what()));
  }
  if (card) {
    TrainConfig cfg = parse_axolotl_yaml_text(card->yaml, path);
    cfg.card_axolotl_version = card->version;
    cfg.notes.push_back(fmt::format("the config embedded in Axolotl's model card{}", card->version.empty()
                                                                                        ? std::string()
                                                                                        : " (axolotl version " +
                                                                                              card->version + ")"));
    return cfg;
  }
  const YDocs docs = load_yaml(text, path);
  if (!docs.first || docs.first->IsNull())
    throw UsageError(fmt::format("{}: empty; expected a YAML mapping of config keys (key: value)", path));
  if (docs.second_line)
    throw UsageError(fmt::format("{}:{}: a second YAML document (after ---); expected one mapping of config keys",
                                 path, *docs.second_line + 1));
  const YNode& doc = *docs.first;
  if (!doc.IsMap())
    throw UsageError(fmt::format("{}:{}: the top level is {}; expected a mapping of config keys (key: value)",
                                 path, doc.Mark().line + 1, YamlReader::describe(doc)));
  auto has = [&doc](std::string_view key) {
    for (const YNode& k : doc.keys)
      if (k.IsScalar() && k.Scalar() == key) return true;
    return false;
  };
  if (has("traceEvents"))
    throw UsageError(fmt::format("{}: a PyTorch profiler trace (it has traceEvents), not a training config: "
                                 "`stallbench diagnose --trace {}` reads it",
                                 path, path));
  if (has("architectures") && has("hidden_size") && has("num_hidden_layers"))
    throw UsageError(fmt::format("{}: a Hugging Face model config.json (architectures, hidden_size, "
                                 "num_hidden_layers), not "
                                 "a training config: pass it with --model-config {}",
                                 path, path));
  if (has("schema_version") && has("kind"))
    throw UsageError(fmt::format("{}: a stallbench document (schema_version, kind), not a training config: "
                                 "`stallbench compare` reads results",
                                 path));
  TrainConfig cfg = default_config();
  YamlReader(path, cfg).read(doc);
  // Not one key diagnose reads: the run would diagnose the built-in default and look like an
  // answer about this file.
  if (!doc.keys.empty() && cfg.unknown_keys.size() >= doc.keys.size())
    throw UsageError(fmt::format("{}: none of its {} key(s) is one diagnose reads (micro_batch_size, sequence_len, "
                                 "bf16, ...: `stallbench diagnose --help`); without one it would diagnose the "
                                 "default config, not this file",
                                 path, doc.keys.size()));
  return cfg;
}

void read_lengths(TrainConfig& cfg, const std::string& path) {
  packing::LengthSpec spec;
  try {
    spec = packing::parse_lengths("@" + path);
  } catch (const UsageError& e) {
    // The packing parser says "lengths file 'F' line N: expected ..."; the
    // diagnose messages all begin "F:N: ".
    const std::string msg = e.what();
    const std::string prefix = "lengths file '" + path + "' line ";
    if (msg.rfind(prefix, 0) == 0) {
      const auto colon = msg.find(": ", prefix.size());
      const std::string number = msg.substr(prefix.size(), colon == std::string::npos ? 0 : colon - prefix.size());
      if (!number.empty() && number.find_first_not_of("0123456789") == std::string::npos)
        throw UsageError(fmt::format("{}:{}: {}", path, number, msg.substr(colon + 2)));
    }
    throw;
  }
  const bool histogram = spec.kind == packing::LengthSpec::Kind::file_histogram;
  std::int64_t total = std::int64_t(spec.lengths.size());
  for (const auto& row : spec.histogram) total += row.count;  // each <= 2^40, the sum <= 2^50: the parser checks
  if (total > kMaxLengths)
    throw UsageError(fmt::format("{}: {} sequences in all, over the limit of {}; give a sample of the dataset",
                                 path, total, kMaxLengths));
  std::vector<std::int32_t> lengths = packing::generate_lengths(spec, 0, kLengthsSeed);
  if (histogram)
    cfg.notes.push_back(fmt::format("lengths: {} sequences from a {}-row histogram ({}), in a shuffled order "
                                    "(seed {})", lengths.size(), spec.histogram.size(), path, kLengthsSeed));
  cfg.lengths = std::move(lengths);
  cfg.sources["lengths"] = Source{"--lengths " + path};
}

json to_json(const TrainConfig& cfg) {
  const json values = values_of(cfg);
  json out;
  json& model = out["model"] = json::object();
  for (const auto key : kKeys) {
    const std::string k(key);
    if (k == "lengths") continue;
    json entry = {{"value", values[k]}, {"source", source_of(cfg, k)}};
    if (k.rfind("model.", 0) == 0)
      model[k.substr(6)] = std::move(entry);
    else
      out[k] = std::move(entry);
  }
  json lengths = {{"count", cfg.lengths.size()}};
  if (!cfg.lengths.empty()) {
    const std::int64_t tokens = std::accumulate(cfg.lengths.begin(), cfg.lengths.end(), std::int64_t(0));
    lengths["tokens"] = tokens;
    lengths["min"] = *std::min_element(cfg.lengths.begin(), cfg.lengths.end());
    lengths["max"] = *std::max_element(cfg.lengths.begin(), cfg.lengths.end());
    lengths["mean"] = double(tokens) / double(cfg.lengths.size());
  }
  lengths["source"] = source_of(cfg, "lengths");
  out["lengths"] = std::move(lengths);
  // what the trainer makes of it (diagnose/trainer.cpp): each key it recorded a source for
  const json trainer = {{"model_type", cfg.model_family},   {"base_model", cfg.base_model},
                        {"attn_implementation", cfg.attn_implementation},
                        {"xformers_attention", cfg.xformers_attention}, {"flex_attention", cfg.flex_attention},
                        {"eager_attention", cfg.eager_attention}, {"bfloat16", cfg.bfloat16},
                        {"float16", cfg.float16},         {"load_in_8bit", cfg.load_in_8bit},
                        {"load_in_4bit", cfg.load_in_4bit}, {"gptq", cfg.gptq},
                        {"adapter", cfg.adapter},         {"rl", cfg.rl},
                        {"lora_r", cfg.lora_r},           {"lora_target_linear", cfg.lora_target_linear},
                        {"lora_target_modules", cfg.lora_target_modules},
                        {"batch_size", cfg.batch_size},   {"max_packed_sequence_len", cfg.max_packed_sequence_len},
                        {"fsdp_offload_params", cfg.fsdp_offload_params}, {"deepspeed", cfg.deepspeed},
                        {"fsdp_shard", cfg.fsdp_shard},
                        {"fsdp_config", {{"offload_params", cfg.fsdp_offload_params}}},
                        {"base_model_config", cfg.base_model}};
  for (const auto& [k, src] : cfg.sources)
    if (!out.contains(k) && k != "lengths" && k.rfind("model.", 0) != 0)
      out[k] = {{"value", trainer.contains(k) ? trainer[k] : json()}, {"source", src.where}};
  if (!cfg.packing_unavailable.empty()) out["packing_unavailable"] = cfg.packing_unavailable;
  out["unknown_keys"] = cfg.unknown_keys;
  out["notes"] = cfg.notes;
  return out;
}

}  // namespace sb::diagnose
