// The input layer of `stallbench diagnose` (diagnose/config.hpp) on
// real files: an Axolotl LoRA config read key by key with its source lines,
// Axolotl's non-boolean spellings (bf16: auto, gradient_checkpointing:
// unsloth), every bad value refused with "FILE:LINE: KEY:", files that are
// not YAML or not a mapping, Hugging Face config.json files (Llama-2-7B,
// Llama-3-8B with grouped-query attention, a wrong type), dataset lengths
// (one a line, a histogram, a bad row, the cap), and the report's JSON.
// Test data: tests/data/diagnose (its README.md says what each file is).
#include <gtest/gtest.h>

#include <unistd.h>  // ::getpid

#include <algorithm>   // std::sort, std::count
#include <cstdint>     // std::int32_t, std::int64_t
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream, std::ofstream
#include <map>         // std::map
#include <stdexcept>   // std::runtime_error
#include <string>      // std::string
#include <vector>      // std::vector

#include <fmt/format.h>  // fmt::format

#include "tests/unit/usage_error.hpp"  // usage_error
#include "harness/errors.hpp"  // sb::UsageError
#include "workloads/decoder.hpp"     // DecoderConfig
#include "diagnose/config.hpp"
#include "diagnose/diagnose.hpp"  // full_depth_footprint
#include "diagnose/offload.hpp"   // offload_setting, offload_cost, offload_finding
#include "diagnose/trainer.hpp"   // resolve_axolotl, TrainerSpec

namespace sb::diagnose {
namespace {

namespace fs = std::filesystem;

// tests/data: meson passes it (-DSB_TEST_DATA, as for test_torch_fr); a
// standalone compile run from the repository root finds it from this file.
#ifdef SB_TEST_DATA
const std::string kData = std::string(SB_TEST_DATA) + "/diagnose";
#else
const std::string kData = (fs::path(__FILE__).parent_path() / ".." / "data" / "diagnose").lexically_normal().string();
#endif

std::string data(const std::string& name) {
  const std::string p = kData + "/" + name;
  // Committed test data: its absence is a failure, not a skip.
  EXPECT_TRUE(fs::exists(p)) << p << " is missing (run from the repository root, or set SB_TEST_DATA)";
  return p;
}

// The 1-based line on which `key:` begins in a file (0 if none).
int line_of(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n)
    if (line.rfind(key + ":", 0) == 0) return n;
  return 0;
}


bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
bool has_note(const TrainConfig& c, const std::string& part) {
  return std::any_of(c.notes.begin(), c.notes.end(), [&](const std::string& n) { return contains(n, part); });
}

// Files written by a test, removed with it.
class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : dir_(fs::temp_directory_path() / fmt::format("sb_diagnose_{}_{}", ::getpid(), name)) {
    fs::create_directories(dir_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  fs::path dir_;
};

const char* const kAllKeys[] = {
    "model.hidden_size", "model.num_hidden_layers", "model.num_attention_heads", "model.num_key_value_heads",
    "model.intermediate_size", "model.gated_mlp", "model.vocab_size", "model.tie_word_embeddings",
    "model.num_experts", "model.num_experts_per_tok", "model.moe_intermediate_size",
    "model.shared_expert_intermediate_size", "micro_batch_size",
    "gradient_accumulation_steps", "sequence_len", "sample_packing", "pad_to_sequence_len", "bf16", "fp16", "tf32",
    "flash_attention", "sdp_attention", "dataloader_num_workers", "dataloader_pin_memory",
    "dataloader_prefetch_factor", "gradient_checkpointing", "lengths"};

// ---- defaults -------------------------------------------------------------------

TEST(DiagnoseConfig, DefaultIsLlama2_7BAtTheDocumentedDefaults) {
  const TrainConfig c = default_config();
  EXPECT_EQ(c.model.hidden_size, 4096);
  EXPECT_EQ(c.model.num_hidden_layers, 32);
  EXPECT_EQ(c.model.num_attention_heads, 32);
  EXPECT_EQ(c.model.intermediate_size, 11008);
  EXPECT_EQ(c.model.vocab_size, 32000);
  EXPECT_EQ(c.micro_batch_size, 1);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.sequence_len, 2048);
  EXPECT_FALSE(c.sample_packing);
  EXPECT_FALSE(c.pad_to_sequence_len);
  EXPECT_FALSE(c.bf16);
  EXPECT_FALSE(c.fp16);
  EXPECT_FALSE(c.tf32);
  EXPECT_FALSE(c.flash_attention);
  EXPECT_FALSE(c.sdp_attention);
  EXPECT_EQ(c.dataloader_num_workers, 0);
  EXPECT_TRUE(c.dataloader_pin_memory);
  EXPECT_EQ(c.dataloader_prefetch_factor, 2);
  EXPECT_FALSE(c.gradient_checkpointing);
  EXPECT_TRUE(c.lengths.empty());
  EXPECT_TRUE(c.unknown_keys.empty());
  EXPECT_TRUE(c.notes.empty());
  ASSERT_EQ(c.sources.size(), std::size(kAllKeys));
  for (const char* k : kAllKeys) {
    ASSERT_TRUE(c.sources.count(k)) << k;
    EXPECT_EQ(c.sources.at(k).where, "default") << k;
  }
}

// ---- a real Axolotl config ------------------------------------------------------------

TEST(DiagnoseConfig, ReadsEveryKeyOfAnAxolotlLoraConfigWithItsLine) {
  const std::string path = data("tinyllama_lora.yml");
  const TrainConfig c = read_axolotl_yaml(path);
  EXPECT_EQ(c.model.hidden_size, 2048);
  EXPECT_EQ(c.model.num_hidden_layers, 22);
  EXPECT_EQ(c.model.num_attention_heads, 32);
  EXPECT_EQ(c.model.kv_heads(), 4);
  EXPECT_EQ(c.model.intermediate_size, 5632);
  EXPECT_EQ(c.model.vocab_size, 32000);
  EXPECT_EQ(c.micro_batch_size, 2);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  EXPECT_EQ(c.sequence_len, 4096);
  EXPECT_TRUE(c.sample_packing);
  EXPECT_TRUE(c.pad_to_sequence_len);
  EXPECT_TRUE(c.bf16);  // auto
  EXPECT_FALSE(c.fp16);
  EXPECT_TRUE(c.tf32);
  EXPECT_TRUE(c.flash_attention);
  EXPECT_FALSE(c.sdp_attention);
  EXPECT_EQ(c.dataloader_num_workers, 4);
  EXPECT_FALSE(c.dataloader_pin_memory);
  EXPECT_EQ(c.dataloader_prefetch_factor, 8);
  EXPECT_TRUE(c.gradient_checkpointing);
  EXPECT_TRUE(c.lengths.empty());

  // Every key's source is its line in the file; lengths (not a YAML key) is the default. The trainer's
  // keys the file gives (the model, its quantized load, the adapter, the attention flag) have theirs too.
  const char* const trainer_keys[] = {"base_model", "model_type", "load_in_8bit", "load_in_4bit", "adapter",
                                      "xformers_attention", "lora_r", "lora_target_linear"};
  ASSERT_EQ(c.sources.size(), std::size(kAllKeys) + std::size(trainer_keys));
  for (const std::string k : trainer_keys) EXPECT_EQ(c.sources.at(k).where, fmt::format("{}:{}", path, line_of(path, k))) << k;
  for (const std::string k : kAllKeys) {
    // lengths is not a YAML key; TinyLlama is no mixture of experts
    if (k == "lengths" || k == "model.num_experts" || k == "model.num_experts_per_tok" ||
        k == "model.moe_intermediate_size" || k == "model.shared_expert_intermediate_size") {
      EXPECT_EQ(c.sources.at(k).where, "default") << k;
      continue;
    }
    const std::string yaml_key = starts_with(k, "model.") ? k.substr(6) : k;
    const int line = line_of(path, yaml_key);
    ASSERT_GT(line, 0) << yaml_key << " is not in " << path;
    EXPECT_EQ(c.sources.at(k).where, fmt::format("{}:{}", path, line)) << k;
  }

  // Unknown keys: every other top-level key, in file order, with its line,
  // including those with empty values; none of the known ones.
  // (base_model, model_type, load_in_8bit/4bit, adapter, xformers_attention: the trainer's keys, read)
  const std::vector<std::string> first = {"tokenizer_type", "strict", "datasets", "dataset_prepared_path"};
  ASSERT_GE(c.unknown_keys.size(), first.size());
  for (std::size_t i = 0; i < first.size(); ++i)
    EXPECT_EQ(c.unknown_keys[i], fmt::format("{} (line {})", first[i], line_of(path, first[i])));
  for (const char* k : {"lora_alpha", "learning_rate", "optimizer", "lr_scheduler", "num_epochs",
                        "eval_sample_packing", "lora_model_dir", "special_tokens"})
    EXPECT_EQ(std::count(c.unknown_keys.begin(), c.unknown_keys.end(),
                         fmt::format("{} (line {})", k, line_of(path, k))), 1) << k;
  for (const auto& u : c.unknown_keys)
    for (const std::string k : kAllKeys) EXPECT_FALSE(starts_with(u, k + " (")) << u;
  EXPECT_EQ(c.unknown_keys.back(), fmt::format("special_tokens (line {})", line_of(path, "special_tokens")));
  int previous = 0;  // file order
  for (const auto& u : c.unknown_keys) {
    const int line = std::stoi(u.substr(u.rfind("(line ") + 6));
    EXPECT_GT(line, previous) << u;
    previous = line;
  }
}

TEST(DiagnoseConfig, Bf16AutoIsTrueWithANote) {
  const std::string path = data("tinyllama_lora.yml");
  const TrainConfig c = read_axolotl_yaml(path);
  EXPECT_TRUE(c.bf16);
  EXPECT_TRUE(has_note(c, fmt::format("bf16: auto (line {}) taken as true", line_of(path, "bf16"))));
  EXPECT_FALSE(has_note(c, "gradient_checkpointing"));  // a plain true needs no note
}

TEST(DiagnoseConfig, UnslothCheckpointingAndFullBf16AreTrueWithNotes) {
  const std::string path = data("unsloth_checkpointing.yml");
  const TrainConfig c = read_axolotl_yaml(path);
  EXPECT_TRUE(c.gradient_checkpointing);
  EXPECT_EQ(c.sources.at("gradient_checkpointing").where, path + ":4");
  EXPECT_TRUE(has_note(c, "gradient_checkpointing: unsloth (line 4) taken as true"));
  EXPECT_TRUE(c.bf16);
  EXPECT_TRUE(has_note(c, "bf16: full (line 5) taken as true"));
  EXPECT_TRUE(c.unknown_keys.empty());  // base_model (line 2) is read: the model's hub id
  EXPECT_EQ(c.sources.at("base_model").where, path + ":2");
}

// ---- what is accepted beyond the plain forms -------------------------------------------------

TEST(DiagnoseConfig, AcceptedSpellings) {
  TempDir dir("spellings");
  {
    // A quoted integer is taken when it is one (pydantic's lax mode does);
    // YAML 1.1 booleans in yaml-cpp's spellings; a leading '+'.
    const TrainConfig c = read_axolotl_yaml(dir.write("a.yml",
        "micro_batch_size: \"3\"\n"
        "gradient_accumulation_steps: +8\n"
        "sample_packing: yes\n"
        "pad_to_sequence_len: On\n"
        "flash_attention: TRUE\n"
        "dataloader_pin_memory: off\n"
        "sdp_attention: 'true'\n"
        "dataloader_num_workers: 0\n"
        "gradient_checkpointing: offload\n"
        "tf32: auto\n"));
    EXPECT_EQ(c.micro_batch_size, 3);
    EXPECT_EQ(c.gradient_accumulation_steps, 8);
    EXPECT_TRUE(c.sample_packing);
    EXPECT_TRUE(c.pad_to_sequence_len);
    EXPECT_TRUE(c.flash_attention);
    EXPECT_FALSE(c.dataloader_pin_memory);
    EXPECT_TRUE(c.sdp_attention);
    EXPECT_EQ(c.dataloader_num_workers, 0);
    EXPECT_EQ(c.sources.at("dataloader_num_workers").where, dir.path("a.yml") + ":8");
    EXPECT_TRUE(c.gradient_checkpointing);
    EXPECT_TRUE(has_note(c, "gradient_checkpointing: offload (line 9) taken as true"));
    EXPECT_TRUE(c.tf32);
    EXPECT_TRUE(has_note(c, "tf32: auto (line 10) taken as true"));
    EXPECT_TRUE(c.unknown_keys.empty());
  }
  {
    // An empty value keeps the default (noted); a repeated key: the last wins (noted).
    const std::string p = dir.write("b.yml",
        "sequence_len:\n"
        "micro_batch_size: 4\n"
        "dataloader_prefetch_factor: ~\n"
        "micro_batch_size: 6\n"
        "lora_alpha: 8\n"
        "lora_alpha: 16\n");
    const TrainConfig c = read_axolotl_yaml(p);
    EXPECT_EQ(c.sequence_len, 2048);
    EXPECT_EQ(c.sources.at("sequence_len").where, "default");
    EXPECT_TRUE(has_note(c, "sequence_len: empty at line 1; the default 2048 kept"));
    EXPECT_EQ(c.dataloader_prefetch_factor, 2);
    EXPECT_EQ(c.micro_batch_size, 6);
    EXPECT_EQ(c.sources.at("micro_batch_size").where, p + ":4");
    EXPECT_TRUE(has_note(c, "micro_batch_size: given at line 2 and again at line 4; the last is used"));
    EXPECT_EQ(c.unknown_keys, (std::vector<std::string>{"lora_alpha (line 5)", "lora_alpha (line 6)"}));
  }
  {
    // bf16: auto beside fp16: true means fp16 (auto picks bf16 only where the GPU has it).
    const TrainConfig c = read_axolotl_yaml(dir.write("c.yml", "bf16: auto\nfp16: true\n"));
    EXPECT_FALSE(c.bf16);
    EXPECT_TRUE(c.fp16);
    EXPECT_TRUE(has_note(c, "bf16: auto (line 1) taken as false: fp16 is true (line 2)"));
    EXPECT_FALSE(has_note(c, "taken as true"));
  }
  {
    // attn_implementation (Axolotl 0.12+, transformers' own key): kept as named; what it loads, and the
    // flash/sdp flags, are resolve_axolotl's (test_trainer_defaults).
    const TrainConfig c = read_axolotl_yaml(dir.write("d.yml", "attn_implementation: flash_attention_2\n"));
    EXPECT_EQ(c.attn_implementation, "flash_attention_2");
    EXPECT_TRUE(c.unknown_keys.empty());
    EXPECT_EQ(c.sources.at("attn_implementation").where, dir.path("d.yml") + ":1");
    const TrainConfig s = read_axolotl_yaml(dir.write("e.yml", "micro_batch_size: 2\nattn_implementation: sdpa\n"));
    EXPECT_EQ(s.attn_implementation, "sdpa");
    const TrainConfig hub = read_axolotl_yaml(dir.write("f.yml", "attn_implementation: kernels-community/flash-attn3\n"));
    EXPECT_EQ(hub.attn_implementation, "kernels-community/flash-attn3");
    const std::string bad = usage_error([&] { read_axolotl_yaml(dir.write("g.yml", "\nattn_implementation: magic\n")); });
    EXPECT_NE(bad.find("g.yml:2"), std::string::npos) << bad;
    EXPECT_NE(bad.find("attn_implementation"), std::string::npos) << bad;
    EXPECT_NE(bad.find("'magic'"), std::string::npos) << bad;
  }
}

// ---- bad values ----------------------------------------------------------------------------------

TEST(DiagnoseConfig, EveryBadValueNamesFileLineAndKey) {
  TempDir dir("bad");
  struct Case {
    std::string body;  // after two lines of other keys
    int line;          // of the key named
    std::string key;
    std::string says;
  };
  const Case cases[] = {
      {"micro_batch_size: abc\n", 3, "micro_batch_size", "expected an integer, got 'abc'"},
      {"micro_batch_size: \"abc\"\n", 3, "micro_batch_size", "expected an integer, got the string 'abc'"},
      {"micro_batch_size: 2.5\n", 3, "micro_batch_size", "expected an integer, got '2.5' (not a whole number)"},
      {"micro_batch_size: 2.0\n", 3, "micro_batch_size", "expected an integer, got '2.0'"},
      {"micro_batch_size: [1, 2]\n", 3, "micro_batch_size", "expected an integer, got a list"},
      {"micro_batch_size: true\n", 3, "micro_batch_size", "expected an integer, got 'true'"},
      {"micro_batch_size: 010\n", 3, "micro_batch_size", "without leading zeros"},
      {"micro_batch_size: 0x10\n", 3, "micro_batch_size", "expected an integer"},
      {"micro_batch_size: -1\n", 3, "micro_batch_size", "expected a positive integer, got -1"},
      {"micro_batch_size: 99999999999999999999999\n", 3, "micro_batch_size", "expected an integer in [1, 65536]"},
      {"gradient_accumulation_steps: 0\n", 3, "gradient_accumulation_steps", "expected a positive integer, got 0"},
      {"sequence_len: 2048\nsequence_len: 2097152\n", 4, "sequence_len", "expected at most 1048576, got 2097152"},
      {"sequence_len: 1048577\n", 3, "sequence_len", "expected at most 1048576"},
      {"vocab_size: 1.5e5\n", 3, "vocab_size", "(not a whole number)"},
      {"num_hidden_layers: 0\n", 3, "num_hidden_layers", "expected a positive integer"},
      {"intermediate_size: {a: 1}\n", 3, "intermediate_size", "expected an integer, got a mapping"},
      {"dataloader_num_workers: -1\n", 3, "dataloader_num_workers", "expected an integer >= 0, got -1"},
      {"dataloader_prefetch_factor: 0\n", 3, "dataloader_prefetch_factor", "expected a positive integer, got 0"},
      {"sample_packing: maybe\n", 3, "sample_packing", "expected true or false, got 'maybe'"},
      {"sample_packing: 1\n", 3, "sample_packing", "expected true or false, got '1'"},
      {"fp16: auto\n", 3, "fp16", "expected true or false, got 'auto'"},
      {"bf16: sometimes\n", 3, "bf16", "expected true, false, auto or full"},
      {"tf32: full\n", 3, "tf32", "expected true, false or auto"},
      {"gradient_checkpointing: sometimes\n", 3, "gradient_checkpointing",
       "expected true, false, offload, offload_disk or unsloth"},
      // Cross-key checks: at the line of the key that breaks them.
      {"num_attention_heads: 3\n", 3, "num_attention_heads", "3 does not divide hidden_size 4096 (default)"},
      {"hidden_size: 4090\n", 3, "hidden_size", "4090 is not a multiple of num_attention_heads 32 (default)"},
      {"hidden_size: 4096\nnum_attention_heads: 48\n", 4, "num_attention_heads", "does not divide"},
      {"num_key_value_heads: 5\n", 3, "num_key_value_heads", "5 does not divide num_attention_heads 32 (default)"},
      {"num_key_value_heads: 0\n", 3, "num_key_value_heads", "expected a positive integer"},
      {"num_key_value_heads: 8\nnum_attention_heads: 12\nhidden_size: 768\n", 3, "num_key_value_heads",
       "8 does not divide num_attention_heads 12"},
      {"bf16: true\nfp16: true\n", 4, "fp16", "true, and bf16 is true too (line 3); expected at most one of bf16 and fp16"},
      {"fp16: yes\nbf16: true\n", 4, "bf16", "true, and fp16 is true too (line 3)"},
  };
  int n = 0;
  for (const auto& c : cases) {
    const std::string p = dir.write(fmt::format("case{}.yml", n++),
                                    "base_model: NousResearch/Llama-2-7b-hf\nlearning_rate: 0.0002\n" + c.body);
    const std::string msg = usage_error([&] { (void)read_axolotl_yaml(p); });
    const std::string prefix = fmt::format("{}:{}: {}: ", p, c.line, c.key);
    EXPECT_TRUE(starts_with(msg, prefix)) << "got: " << msg << "\nwanted a start: " << prefix;
    EXPECT_TRUE(contains(msg, c.says)) << "got: " << msg << "\nwanted: " << c.says;
  }
}

TEST(DiagnoseConfig, NotYamlNamesFileLineAndColumn) {
  const std::string path = data("not_yaml.yml");
  const std::string msg = usage_error([&] { (void)read_axolotl_yaml(path); });
  // libyaml finds the unclosed '[' of line 2 where the flow sequence cannot
  // go on: line 3's "micro_batch_size: 2" (a map value inside it).
  EXPECT_TRUE(starts_with(msg, path + ":3:")) << msg;
  EXPECT_TRUE(contains(msg, ": not YAML: ")) << msg;

  TempDir dir("notyaml");
  const std::string unclosed = dir.write("u.yml", "key: [unclosed\n");
  const std::string m2 = usage_error([&] { (void)read_axolotl_yaml(unclosed); });
  EXPECT_TRUE(starts_with(m2, unclosed + ":2:")) << m2;  // at the end of the input
  // libyaml (PyYAML's parser) checks the syntax first: its words
  EXPECT_TRUE(contains(m2, "not YAML: did not find expected ',' or ']'")) << m2;
  const std::string tab = dir.write("t.yml", "a: 1\nb: c: d\n");
  EXPECT_TRUE(starts_with(usage_error([&] { (void)read_axolotl_yaml(tab); }), tab + ":2:"));
  // found by fuzzing: yaml-cpp 0.7 alone allocates nodes for ever on these 28 bytes; libyaml rejects them
  const std::string loop = dir.write("loop.yml", ", no loautoAfputoAutoAfputoA");
  EXPECT_TRUE(starts_with(usage_error([&] { (void)read_axolotl_yaml(loop); }), loop + ":1:1: not YAML: "));
  // and a second one (an anchor): libyaml reads it at once, as a string
  const std::string anchor = dir.write("anchor.yml", "&nnul?lu,l");
  EXPECT_TRUE(contains(usage_error([&] { (void)read_axolotl_yaml(anchor); }), anchor)) ;
  // and text that is not UTF-8 never reaches the report's JSON
  const std::string bytes = dir.write("bytes.yml", "sequence_len: 256\nfoo\xff: 1\n");
  EXPECT_TRUE(starts_with(usage_error([&] { (void)read_axolotl_yaml(bytes); }), bytes + ":2: not UTF-8")) ;
}

TEST(DiagnoseConfig, NotAMappingEmptyTwoDocumentsMissingAreUsageErrors) {
  const std::string list = data("top_level_list.yml");
  const std::string m = usage_error([&] { (void)read_axolotl_yaml(list); });
  EXPECT_TRUE(starts_with(m, list + ":1: the top level is a list; expected a mapping")) << m;

  TempDir dir("shapes");
  const std::string scalar = dir.write("s.yml", "just some words\n");
  EXPECT_TRUE(contains(usage_error([&] { (void)read_axolotl_yaml(scalar); }), "the top level is 'just some words'"));
  const std::string empty = dir.write("e.yml", "# nothing but a comment\n");
  EXPECT_TRUE(starts_with(usage_error([&] { (void)read_axolotl_yaml(empty); }), empty + ": empty"));
  const std::string two = dir.write("two.yml", "micro_batch_size: 1\n---\nmicro_batch_size: 2\n");
  EXPECT_TRUE(starts_with(usage_error([&] { (void)read_axolotl_yaml(two); }), two + ":3: a second YAML document"));

  const std::string missing = dir.path("no_such.yml");
  EXPECT_TRUE(contains(usage_error([&] { (void)read_axolotl_yaml(missing); }), missing));
  EXPECT_TRUE(contains(usage_error([&] { (void)read_axolotl_yaml(kData); }), "is a directory"));
}

// diagnose's other files, given where the training config goes: named, never read as a config of
// unknown keys and run on the defaults.
TEST(DiagnoseConfig, ATraceOrAModelConfigGivenAsTheTrainingConfigSaysWhichOptionReadsIt) {
  const std::string model = data("llama2_7b_config.json");
  const std::string m = usage_error([&] { (void)read_axolotl_yaml(model); });
  EXPECT_TRUE(contains(m, "a Hugging Face model config.json")) << m;
  EXPECT_TRUE(contains(m, "--model-config " + model)) << m;

  TempDir dir("others");
  const std::string trace = dir.write("t.json", R"({"schemaVersion": 1, "traceEvents": []})");
  const std::string t = usage_error([&] { (void)read_axolotl_yaml(trace); });
  EXPECT_TRUE(contains(t, "a PyTorch profiler trace")) << t;
  EXPECT_TRUE(contains(t, "--trace " + trace)) << t;
  const std::string gz = dir.write("t.json.gz", std::string("\x1f\x8b\x08\x00rest", 8));
  const std::string g = usage_error([&] { (void)read_axolotl_yaml(gz); });
  EXPECT_TRUE(contains(g, "gzip-compressed")) << g;

  // An Axolotl config names its model_type and may give dims: still a training config.
  const std::string yml = dir.write("a.yml", "model_type: LlamaForCausalLM\nhidden_size: 256\nmicro_batch_size: 2\n");
  EXPECT_EQ(read_axolotl_yaml(yml).micro_batch_size, 2);

  // A stallbench result, or a mapping with no key diagnose reads: refused, not run on the defaults.
  const std::string res = dir.write("r.json", R"({"schema_version": 1, "kind": "result", "points": []})");
  const std::string r = usage_error([&] { (void)read_axolotl_yaml(res); });
  EXPECT_TRUE(contains(r, "a stallbench document")) << r;
  const std::string none = dir.write("n.yml", "foo: 1\nlora_alpha: 8\n");
  const std::string n = usage_error([&] { (void)read_axolotl_yaml(none); });
  EXPECT_TRUE(contains(n, "none of its 2 key(s) is one diagnose reads")) << n;
}

// ---- Hugging Face config.json -------------------------------------------------------------------

TEST(DiagnoseConfig, Llama2ConfigJsonSetsTheDims) {
  const std::string path = data("llama2_7b_config.json");
  TrainConfig c = default_config();
  apply_model_config(c, path);
  EXPECT_EQ(c.model.hidden_size, 4096);
  EXPECT_EQ(c.model.num_hidden_layers, 32);
  EXPECT_EQ(c.model.num_attention_heads, 32);
  EXPECT_EQ(c.model.intermediate_size, 11008);
  EXPECT_EQ(c.model.vocab_size, 32000);
  for (const char* k : {"model.hidden_size", "model.num_hidden_layers", "model.num_attention_heads",
                        "model.intermediate_size", "model.vocab_size"})
    EXPECT_EQ(c.sources.at(k).where, path) << k;
  EXPECT_EQ(c.sources.at("micro_batch_size").where, "default");
  EXPECT_TRUE(c.notes.empty());  // kv heads == heads; every key present; defaults replaced silently

  // Over a YAML's explicit dims: the config.json wins, and says what it replaced.
  const std::string yml = data("tinyllama_lora.yml");
  TrainConfig t = read_axolotl_yaml(yml);
  apply_model_config(t, path);
  EXPECT_EQ(t.model.hidden_size, 4096);
  EXPECT_EQ(t.model.num_hidden_layers, 32);
  EXPECT_EQ(t.model.intermediate_size, 11008);
  EXPECT_EQ(t.sources.at("model.hidden_size").where, path);
  EXPECT_TRUE(has_note(t, fmt::format("{}: hidden_size 4096 replaces 2048 from {}:{}", path, yml,
                                      line_of(yml, "hidden_size"))));
  EXPECT_TRUE(has_note(t, fmt::format("{}: num_key_value_heads 32 replaces 4 from {}:{}", path, yml,
                                      line_of(yml, "num_key_value_heads"))));
  EXPECT_FALSE(has_note(t, "vocab_size 32000 replaces"));  // the same value
  EXPECT_EQ(t.micro_batch_size, 2);                        // the rest untouched
}

TEST(DiagnoseConfig, Llama3ConfigJsonIsGroupedQueryAttention) {
  const std::string path = data("llama3_8b_config.json");
  TrainConfig c = default_config();
  apply_model_config(c, path);
  EXPECT_EQ(c.model.hidden_size, 4096);
  EXPECT_EQ(c.model.num_hidden_layers, 32);
  EXPECT_EQ(c.model.num_attention_heads, 32);
  EXPECT_EQ(c.model.intermediate_size, 14336);
  EXPECT_EQ(c.model.vocab_size, 128256);
  EXPECT_EQ(c.sources.at("model.vocab_size").where, path);
  EXPECT_EQ(c.model.kv_heads(), 8);  // the memory check's model has grouped-query attention
  EXPECT_EQ(c.sources.at("model.num_key_value_heads").where, path);
  EXPECT_EQ(to_json(c)["model"]["num_key_value_heads"]["value"].get<std::int64_t>(), 8);
  EXPECT_TRUE(has_note(c, "num_key_value_heads 8 differs from num_attention_heads 32"));
  EXPECT_TRUE(has_note(c, "4x smaller"));
}

// The MLP's kind: gated (SwiGLU: three hidden x intermediate matrices) for the Llama family and its kin,
// plain (two) for GPT-NeoX and the other two-matrix families, from model_type; the measured step runs a
// two-matrix MLP of the same FLOPs and weights (1.5 x intermediate wide when gated).
TEST(DiagnoseConfig, TheMlpKindComesFromModelType) {
  TrainConfig d = default_config();
  EXPECT_TRUE(d.model.gated_mlp);  // Llama 2 7B's
  EXPECT_EQ(d.model.step_ffn(), 11008 * 3 / 2);

  TrainConfig l2 = default_config();
  apply_model_config(l2, data("llama2_7b_config.json"));
  EXPECT_TRUE(l2.model.gated_mlp);
  EXPECT_EQ(l2.sources.at("model.gated_mlp").where, data("llama2_7b_config.json"));

  const std::string pythia = data("pythia_1b_config.json");
  TrainConfig py = default_config();
  apply_model_config(py, pythia);
  EXPECT_FALSE(py.model.gated_mlp);
  EXPECT_EQ(py.model.step_ffn(), 8192);  // its own intermediate size: up and down
  EXPECT_EQ(py.sources.at("model.gated_mlp").where, pythia);
  EXPECT_TRUE(has_note(py, pythia + ": model_type gpt_neox: a plain MLP (up and down, two hidden x 8192"));
  EXPECT_EQ(to_json(py)["model"]["gated_mlp"]["value"], false);

  TrainConfig qw = default_config();
  apply_model_config(qw, data("qwen2_7b_config.json"));
  EXPECT_TRUE(qw.model.gated_mlp);
  EXPECT_EQ(qw.model.step_ffn(), 28416);  // 1.5 x 18944: 7.9x the hidden size, where the old step ran 4x
  EXPECT_EQ(qw.model.kv_heads(), 4);

  // The YAML key, with its line; a config.json's model_type replaces it, and says so.
  TempDir dir("mlp");
  const std::string yml = dir.write("m.yml", "micro_batch_size: 2\ngated_mlp: false\n");
  TrainConfig y = read_axolotl_yaml(yml);
  EXPECT_FALSE(y.model.gated_mlp);
  EXPECT_EQ(y.sources.at("model.gated_mlp").where, yml + ":2");
  apply_model_config(y, data("llama2_7b_config.json"));
  EXPECT_TRUE(y.model.gated_mlp);
  EXPECT_TRUE(has_note(y, "model_type llama sets gated_mlp true, replacing false from " + yml + ":2"));
  // A bad value names the key and its line.
  const std::string bad = usage_error([&] { (void)read_axolotl_yaml(dir.write("b.yml", "\ngated_mlp: swiglu\n")); });
  EXPECT_TRUE(contains(bad, ":2: gated_mlp: expected")) << bad;
  // A config.json without model_type keeps what was there, and says so.
  TrainConfig n = read_axolotl_yaml(yml);
  const std::string no_type = dir.write("config.json", R"({"hidden_size": 512, "num_hidden_layers": 4,
      "num_attention_heads": 8, "intermediate_size": 2048, "vocab_size": 1000})");
  apply_model_config(n, no_type);
  EXPECT_FALSE(n.model.gated_mlp);
  EXPECT_TRUE(has_note(n, no_type + ": no model_type; gated_mlp false (" + yml + ":2) kept"));
  // model_type that is not a string: a broken config.json, exit 2 naming the key; cfg unchanged
  const std::string num_type = dir.write("num.json", R"({"hidden_size": 768, "model_type": 5})");
  const std::string e = usage_error([&] { apply_model_config(n, num_type); });
  EXPECT_TRUE(contains(e, "model_type")) << e;
  EXPECT_EQ(n.model.hidden_size, 512);
  EXPECT_FALSE(n.model.gated_mlp);
  // a multimodal config: its text_config's family, not the wrapper's
  TrainConfig mm = default_config();
  apply_model_config(mm, dir.write("mm.json", R"({"model_type": "llava", "text_config": {"model_type": "gpt_neox",
      "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8, "intermediate_size": 4096,
      "vocab_size": 1000}})"));
  EXPECT_FALSE(mm.model.gated_mlp);
}

TEST(DiagnoseConfig, KeyValueHeadsFromTheYamlUntilAConfigJsonWithoutThem) {
  TempDir dir("kv");
  const std::string yml = dir.write("kv.yml", "num_attention_heads: 32\nnum_key_value_heads: 8\n");
  TrainConfig c = read_axolotl_yaml(yml);
  EXPECT_EQ(c.model.kv_heads(), 8);
  EXPECT_EQ(c.sources.at("model.num_key_value_heads").where, fmt::format("{}:2", yml));
  // default: one K/V head per attention head
  EXPECT_EQ(default_config().model.kv_heads(), default_config().model.num_attention_heads);
  // a config.json without the key is a model without grouped-query attention (Hugging Face's reading)
  const std::string no_kv = dir.write("config.json", R"({"hidden_size": 4096, "num_hidden_layers": 32,
      "num_attention_heads": 32, "intermediate_size": 11008, "vocab_size": 32000})");
  apply_model_config(c, no_kv);
  EXPECT_EQ(c.model.kv_heads(), 32);
  EXPECT_TRUE(has_note(c, "no num_key_value_heads: one K/V head per attention head, not the 8 of")) << c.notes.size();
}

TEST(DiagnoseConfig, ConfigJsonErrorsNameTheKeyAndLeaveTheConfig) {
  const std::string path = data("bad_type_config.json");
  TrainConfig c = default_config();
  const TrainConfig before = c;
  const std::string m = usage_error([&] { apply_model_config(c, path); });
  EXPECT_TRUE(starts_with(m, path + ": intermediate_size: expected integer")) << m;
  EXPECT_TRUE(contains(m, "\"11008\"")) << m;
  EXPECT_EQ(c.model.hidden_size, before.model.hidden_size);
  EXPECT_EQ(c.sources.at("model.hidden_size").where, "default");  // unchanged: nothing half-applied

  TempDir dir("json");
  const auto error_of = [&](const std::string& name, const std::string& text) {
    const std::string p = dir.write(name, text);
    TrainConfig d = default_config();
    return std::make_pair(p, usage_error([&] { apply_model_config(d, p); }));
  };
  {
    const auto [p, e] = error_of("float.json", R"({"hidden_size": 4096.0})");
    EXPECT_TRUE(starts_with(e, p + ": hidden_size: expected integer")) << e;
  }
  {
    const auto [p, e] = error_of("zero.json", R"({"num_hidden_layers": 0})");
    EXPECT_TRUE(starts_with(e, p + ": num_hidden_layers: ")) << e;
  }
  {
    const auto [p, e] = error_of("kv.json", R"({"num_attention_heads": 32, "num_key_value_heads": 5})");
    EXPECT_TRUE(starts_with(e, p + ": num_key_value_heads: expected a divisor of num_attention_heads 32")) << e;
  }
  {
    const auto [p, e] = error_of("heads.json", R"({"hidden_size": 4096, "num_attention_heads": 48})");
    EXPECT_TRUE(starts_with(e, p + ": num_attention_heads: 48")) << e;
    EXPECT_TRUE(contains(e, "does not divide hidden_size 4096")) << e;
  }
  {
    const auto [p, e] = error_of("list.json", "[1, 2]");
    EXPECT_TRUE(contains(e, p)) << e;
  }
  {
    const auto [p, e] = error_of("broken.json", "{\"hidden_size\": 4096,\n");
    EXPECT_TRUE(starts_with(e, p + " is not valid JSON")) << e;
  }
  const std::string missing = dir.path("none.json");
  EXPECT_TRUE(contains(usage_error([&] {
                TrainConfig d = default_config();
                apply_model_config(d, missing);
              }),
              missing));
}

TEST(DiagnoseConfig, ConfigJsonMissingShapeIsRefusedUnlessTheConfigGaveIt) {
  TempDir dir("partial");
  // A Llama-family file with only some dims (another family's names are not read for Llama's): the
  // shape is not silently the 7B default's
  const std::string p = dir.write("config.json",
      R"({"model_type": "llama", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
          "num_attention_heads": null})");
  TrainConfig c = default_config();
  const std::string e = usage_error([&] { apply_model_config(c, p); });
  EXPECT_TRUE(contains(e, "no hidden_size")) << e;
  EXPECT_TRUE(contains(e, "give hidden_size, num_hidden_layers")) << e;
  EXPECT_EQ(c.model.vocab_size, 32000);  // on an error cfg is unchanged
  // where the training config gave the shape, the file's missing keys keep it, noted
  TrainConfig y = parse_axolotl_yaml_text("hidden_size: 768\nnum_hidden_layers: 12\nnum_attention_heads: 12\n", "y.yml");
  apply_model_config(y, p);
  EXPECT_EQ(y.model.vocab_size, 50257);
  EXPECT_EQ(y.sources.at("model.vocab_size").where, p);
  EXPECT_EQ(y.model.hidden_size, 768);
  EXPECT_TRUE(has_note(y, p + ": no hidden_size; 768 (y.yml:1) kept"));
  EXPECT_TRUE(has_note(y, p + ": no num_attention_heads; 12 (y.yml:3) kept"));  // null counts as missing
  EXPECT_TRUE(has_note(y, p + ": no intermediate_size"));
  // T5's own names (an encoder-decoder, said so) and the 2023 remote-code phi-2's
  TrainConfig t = default_config();
  apply_model_config(t, dir.write("t5.json", R"({"model_type": "t5", "d_model": 768, "num_layers": 12,
      "num_heads": 12, "d_ff": 3072, "vocab_size": 32128})"));
  EXPECT_EQ(t.model.hidden_size, 768);
  EXPECT_EQ(t.model.intermediate_size, 3072);
  EXPECT_FALSE(t.model.gated_mlp);
  EXPECT_TRUE(has_note(t, "an encoder-decoder"));
  TrainConfig phi = default_config();
  apply_model_config(phi, dir.write("phi2.json", R"({"model_type": "phi-msft", "n_embd": 2560, "n_layer": 32,
      "n_head": 32, "n_inner": null, "vocab_size": 51200})"));
  EXPECT_EQ(phi.model.hidden_size, 2560);
  EXPECT_EQ(phi.model.intermediate_size, 4 * 2560);  // a plain MLP without its width: 4 x hidden
}

TEST(DiagnoseConfig, ConfigJsonTextConfig) {
  TempDir dir("textconfig");
  // A multimodal config keeps the language model's dims in text_config.
  const std::string mm = dir.write("mm.json",
      R"({"model_type": "llava", "text_config": {"hidden_size": 5120, "num_hidden_layers": 40,
          "num_attention_heads": 40, "num_key_value_heads": 8, "intermediate_size": 13824, "vocab_size": 32064}})");
  TrainConfig m = default_config();
  apply_model_config(m, mm);
  EXPECT_EQ(m.model.hidden_size, 5120);
  EXPECT_EQ(m.model.num_attention_heads, 40);
  EXPECT_EQ(m.model.vocab_size, 32064);
  EXPECT_TRUE(has_note(m, "read from its text_config"));
  EXPECT_TRUE(has_note(m, "num_key_value_heads 8 differs from num_attention_heads 40"));
}

// ---- dataset lengths --------------------------------------------------------------------------

TEST(DiagnoseConfig, LengthsOnePerLine) {
  const std::string path = data("lengths_per_line.txt");
  TrainConfig c = default_config();
  read_lengths(c, path);
  EXPECT_EQ(c.lengths, (std::vector<std::int32_t>{412, 1024, 87, 2048, 3, 999, 1500, 256}));  // file order
  EXPECT_EQ(c.sources.at("lengths").where, "--lengths " + path);
}

TEST(DiagnoseConfig, LengthsHistogramExpandsToItsCounts) {
  const std::string path = data("lengths_hist.csv");
  TrainConfig c = default_config();
  read_lengths(c, path);
  ASSERT_EQ(c.lengths.size(), 1000u);  // 400 + 300 + 200 + 80 + 20 + 0
  std::map<std::int32_t, std::int64_t> counts;
  for (const auto len : c.lengths) ++counts[len];
  EXPECT_EQ(counts, (std::map<std::int32_t, std::int64_t>{{128, 400}, {256, 300}, {512, 200}, {1024, 80}, {2048, 20}}));
  EXPECT_FALSE(std::is_sorted(c.lengths.begin(), c.lengths.end()));  // shuffled, as a dataset is consumed
  EXPECT_TRUE(has_note(c, "lengths: 1000 sequences from a 6-row histogram"));
  TrainConfig again = default_config();
  read_lengths(again, path);
  EXPECT_EQ(again.lengths, c.lengths);  // the same order every run
}

TEST(DiagnoseConfig, LengthsBadRowsNameTheLine) {
  const std::string path = data("lengths_bad_row.csv");
  TrainConfig c = default_config();
  const std::string m = usage_error([&] { read_lengths(c, path); });
  EXPECT_TRUE(starts_with(m, path + ":4: expected 'length,count'")) << m;
  EXPECT_TRUE(contains(m, "got '512,-5'")) << m;
  EXPECT_TRUE(c.lengths.empty());
  EXPECT_EQ(c.sources.at("lengths").where, "default");

  TempDir dir("lengths");
  const std::string zero = dir.write("zero.txt", "12\n0\n");
  EXPECT_TRUE(starts_with(usage_error([&] { read_lengths(c, zero); }), zero + ":2: expected one length per line"));
  const std::string mixed = dir.write("mixed.txt", "# lengths\n12\n13,4\n");
  EXPECT_TRUE(starts_with(usage_error([&] { read_lengths(c, mixed); }), mixed + ":3: "));
  const std::string over = dir.write("over.csv", "length,count\n512,10000001\n");
  const std::string mo = usage_error([&] { read_lengths(c, over); });
  EXPECT_TRUE(starts_with(mo, over + ": 10000001 sequences in all, over the limit of 10000000")) << mo;
  const std::string none = dir.write("none.csv", "length,count\n512,0\n");
  EXPECT_TRUE(contains(usage_error([&] { read_lengths(c, none); }), "holds no lengths"));
  const std::string missing = dir.path("missing.txt");
  EXPECT_TRUE(contains(usage_error([&] { read_lengths(c, missing); }), missing));
  EXPECT_TRUE(c.lengths.empty());
}

// ---- the report's JSON -------------------------------------------------------------------------

TEST(DiagnoseConfig, ToJsonCarriesEveryValueWithItsSource) {
  TrainConfig c = read_axolotl_yaml(data("tinyllama_lora.yml"));
  apply_model_config(c, data("llama3_8b_config.json"));
  read_lengths(c, data("lengths_per_line.txt"));
  const nlohmann::ordered_json j = to_json(c);

  // Every source back from the JSON, and nothing more.
  std::map<std::string, std::string> back;
  for (const auto& [k, v] : j.items()) {
    if (k == "model") {
      for (const auto& [mk, mv] : v.items()) back["model." + mk] = mv.at("source").get<std::string>();
    } else if (v.is_object()) {
      back[k] = v.at("source").get<std::string>();
    }
  }
  std::map<std::string, std::string> want;
  for (const auto& [k, s] : c.sources) want[k] = s.where;
  EXPECT_EQ(back, want);

  EXPECT_EQ(j["model"]["intermediate_size"]["value"], 14336);
  EXPECT_EQ(j["micro_batch_size"]["value"], 2);
  EXPECT_EQ(j["bf16"]["value"], true);
  EXPECT_EQ(j["dataloader_pin_memory"]["value"], false);
  EXPECT_EQ(j["lengths"]["count"], 8);
  EXPECT_EQ(j["lengths"]["tokens"], 412 + 1024 + 87 + 2048 + 3 + 999 + 1500 + 256);
  EXPECT_EQ(j["lengths"]["min"], 3);
  EXPECT_EQ(j["lengths"]["max"], 2048);
  EXPECT_EQ(j["unknown_keys"].size(), c.unknown_keys.size());
  EXPECT_EQ(j["notes"].size(), c.notes.size());
  // The order of the report: the model first, then TrainConfig's order.
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  EXPECT_EQ(keys.front(), "model");
  EXPECT_EQ(keys.back(), "notes");

  // With no lengths: a count of 0 and the default source.
  const nlohmann::ordered_json d = to_json(default_config());
  EXPECT_EQ(d["lengths"], (nlohmann::ordered_json{{"count", 0}, {"source", "default"}}));
  EXPECT_EQ(d["model"]["hidden_size"], (nlohmann::ordered_json{{"value", 4096}, {"source", "default"}}));
}


// ---- the memory check's model at full depth ------------------------------------------------------

sb::batch::DecoderConfig full_depth(const TrainConfig& c) {
  sb::batch::DecoderConfig d;
  d.micro_batch = 1;
  d.seq = 2048;
  d.d_model = c.model.hidden_size;
  d.heads = c.model.num_attention_heads;
  d.layers = int(c.model.num_hidden_layers);
  d.dtype = sb::DType::bf16;
  return d;
}

// The published parameter counts: Llama 2 7B 6.74 billion, Llama 3 8B 8.03 billion (grouped-query
// attention: 8 K/V heads of 32; K and V in full would make it 8.84).
TEST(DiagnoseFootprint, ParametersAreThePublishedModelsWithGroupedQueryAttention) {
  TrainConfig l2 = default_config();
  apply_model_config(l2, data("llama2_7b_config.json"));
  const auto f2 = sb::diagnose::full_depth_footprint(l2.model, full_depth(l2));
  EXPECT_NEAR(double(f2.parameters) / 1e9, 6.738, 0.001);

  TrainConfig l3 = default_config();
  apply_model_config(l3, data("llama3_8b_config.json"));
  const auto f3 = sb::diagnose::full_depth_footprint(l3.model, full_depth(l3));
  EXPECT_NEAR(double(f3.parameters) / 1e9, 8.030, 0.001);
  // bf16 mixed precision: fp32 master, bf16 copy, fp32 gradient, AdamW's two fp32 moments = 18 B a parameter
  const auto& p = f3.parts;
  const std::uint64_t weight_bound = p["weights"].get<std::uint64_t>() + p["gradients"].get<std::uint64_t>() +
                                     p["optimizer"].get<std::uint64_t>() +
                                     p["embedding_and_head"].get<std::uint64_t>();
  EXPECT_NEAR(double(weight_bound) / double(f3.parameters), 18.0, 0.01);

  TrainConfig mha = l3;
  mha.model.num_key_value_heads = 0;  // the same model with a K/V head per attention head
  const auto fm = sb::diagnose::full_depth_footprint(mha.model, full_depth(mha));
  EXPECT_NEAR(double(fm.parameters) / 1e9, 8.835, 0.001);
  EXPECT_GT(fm.total, f3.total);
}

// Beyond Llama: a plain MLP (Pythia 1B, GPT-NeoX: 1.0118 billion published, biases and norms included) and
// a wide gated one (Qwen2 7B: 7.6156 billion, 4 K/V heads of 28). The step's d_ff does not move the
// count: the footprint scales its weight-bound parts to the model's own layer at any d_ff.
TEST(DiagnoseFootprint, ParametersOfAPlainAndAWideGatedMlp) {
  TrainConfig py = default_config();
  apply_model_config(py, data("pythia_1b_config.json"));
  auto dp = full_depth(py);
  EXPECT_NEAR(double(sb::diagnose::full_depth_footprint(py.model, dp).parameters) / 1e9, 1.0118, 0.001);
  dp.d_ff = py.model.step_ffn();
  EXPECT_NEAR(double(sb::diagnose::full_depth_footprint(py.model, dp).parameters) / 1e9, 1.0118, 0.001);

  TrainConfig qw = default_config();
  apply_model_config(qw, data("qwen2_7b_config.json"));
  auto dq = full_depth(qw);
  dq.d_ff = qw.model.step_ffn();
  const auto fq = sb::diagnose::full_depth_footprint(qw.model, dq);
  EXPECT_NEAR(double(fq.parameters) / 1e9, 7.6156, 0.001);
  // at d_ff = 1.5 intermediate the step's MLP holds the model's MLP weights exactly: only K and V scale
  const double h = 3584, kv_share = 4.0 / 28.0;
  const double layer_step = 4 * h * h + 2 * h * double(dq.d_ff), layer_model = (2 + 2 * kv_share) * h * h + 3 * h * 18944;
  const std::uint64_t predicted_w = sb::batch::predict_footprint(dq, sb::batch::OptKind::adamw, 1, 0, 0).weights;
  EXPECT_NEAR(fq.parts["weights"].get<double>() / double(predicted_w), layer_model / layer_step, 1e-6);

  // With K and V at the model's 4 K/V heads as well (the memory check's step), the step's layer is the
  // model's: the scale is 1, the weights are the step's own, and the count does not move.
  dq.kv_heads = qw.model.kv_heads();
  ASSERT_EQ(dq.qkv_out(), 3584 + 2 * 4 * 128);
  const auto fk = sb::diagnose::full_depth_footprint(qw.model, dq);
  EXPECT_NEAR(double(fk.parameters) / 1e9, 7.6156, 0.001);  // the published count (biases and norms in it)
  // exactly: 28 layers of Q, K and V at 4 x 128, O, and three 3584 x 18944 matrices, with the
  // embedding and the LM head (152,064 x 3584 each)
  const double exact = 28.0 * (3584.0 * (3584 + 2 * 512) + 3584.0 * 3584 + 3 * 3584.0 * 18944) + 2 * 152064.0 * 3584;
  EXPECT_NEAR(double(fk.parameters), exact, 2.0);
  const std::uint64_t predicted_kv = sb::batch::predict_footprint(dq, sb::batch::OptKind::adamw, 1, 0, 0).weights;
  EXPECT_NEAR(fk.parts["weights"].get<double>() / double(predicted_kv), 1.0, 1e-9);
  EXPECT_LT(predicted_kv, predicted_w);  // K and V at 4 of 28 heads: fewer weights than in full
}

// Families that name their dims their own way, read as their Hugging Face config classes read them
// (attribute_map, the MLP's width when the file leaves it out, multi-query attention, a tied LM head).
// Each count is exact for the matrices the model holds (no biases, norms or learned positions) and
// beside the published count, which has those too.
TEST(DiagnoseConfig, FamilyNamesAreReadAsTheirConfigClassesReadThem) {
  // GPT-2 (124M): n_embd, n_layer, n_head; n_inner absent: 4 x n_embd; the head tied to the embedding
  TrainConfig g = default_config();
  const std::string gp = data("gpt2_config.json");
  apply_model_config(g, gp);
  EXPECT_EQ(g.model.hidden_size, 768);
  EXPECT_EQ(g.model.num_hidden_layers, 12);
  EXPECT_EQ(g.model.num_attention_heads, 12);
  EXPECT_EQ(g.model.intermediate_size, 3072);
  EXPECT_FALSE(g.model.gated_mlp);
  EXPECT_TRUE(g.model.tie_word_embeddings);
  EXPECT_EQ(g.model.kv_heads(), 12);
  EXPECT_EQ(g.sources.at("model.hidden_size").where, gp + " (n_embd)");
  EXPECT_TRUE(has_note(g, gp + ": hidden_size 768 read from n_embd (gpt2's name for it)"));
  EXPECT_TRUE(has_note(g, "no intermediate_size; 3072 for model_type gpt2: 4 x hidden"));
  EXPECT_FALSE(has_note(g, "no hidden_size"));
  auto dg = full_depth(g);
  dg.d_ff = g.model.step_ffn();
  const auto fg = sb::diagnose::full_depth_footprint(g.model, dg);
  EXPECT_NEAR(double(fg.parameters), 12.0 * (768.0 * 2304 + 768.0 * 768 + 2 * 768.0 * 3072) + 50257.0 * 768, 2.0);
  EXPECT_NEAR(double(fg.parameters) / 124439808.0, 1.0, 0.008);  // published: biases, norms, 1024 positions

  // Falcon 7B: multi_query (true by default in FalconConfig): one K/V head for 71; ffn 4 x hidden; tied
  TrainConfig f = default_config();
  const std::string fp = data("falcon_7b_config.json");
  apply_model_config(f, fp);
  EXPECT_EQ(f.model.hidden_size, 4544);
  EXPECT_EQ(f.model.num_attention_heads, 71);
  EXPECT_EQ(f.model.kv_heads(), 1);
  EXPECT_EQ(f.model.intermediate_size, 4 * 4544);
  EXPECT_TRUE(f.model.tie_word_embeddings);
  EXPECT_TRUE(has_note(f, "1 K/V head(s) for 71 attention heads (multi_query): multi-query attention"));
  auto df = full_depth(f);
  df.d_ff = f.model.step_ffn();
  df.kv_heads = f.model.kv_heads();
  const auto ff = sb::diagnose::full_depth_footprint(f.model, df);
  EXPECT_NEAR(double(ff.parameters), 32.0 * (4544.0 * (4544 + 2 * 64) + 4544.0 * 4544 + 2 * 4544.0 * 18176) +
                                         65024.0 * 4544, 4.0);
  EXPECT_NEAR(double(ff.parameters) / 6921720704.0, 1.0, 0.0001);  // published (norms: 299,904 more)
  // without multi_query in the file: FalconConfig's default, true; with it false: a K/V head per head
  TempDir dir("families");
  TrainConfig f2 = default_config();
  apply_model_config(f2, dir.write("f2.json", R"({"model_type": "falcon", "hidden_size": 2048,
      "num_hidden_layers": 24, "num_attention_heads": 32, "vocab_size": 50304})"));
  EXPECT_EQ(f2.model.kv_heads(), 1);
  EXPECT_TRUE(has_note(f2, "(multi_query, true by default)"));
  TrainConfig f3 = default_config();
  apply_model_config(f3, dir.write("f3.json", R"({"model_type": "falcon", "hidden_size": 2048, "multi_query": false,
      "num_hidden_layers": 24, "num_attention_heads": 32, "vocab_size": 50304})"));
  EXPECT_EQ(f3.model.kv_heads(), 32);
  // the new decoder architecture (Falcon 40B): num_kv_heads, and the old RefinedWeb names
  TrainConfig f4 = default_config();
  apply_model_config(f4, dir.write("f4.json", R"({"model_type": "falcon", "hidden_size": 8192,
      "new_decoder_architecture": true, "num_kv_heads": 8, "num_hidden_layers": 60, "num_attention_heads": 128,
      "vocab_size": 65024})"));
  EXPECT_EQ(f4.model.kv_heads(), 8);
  TrainConfig f5 = default_config();
  apply_model_config(f5, dir.write("f5.json", R"({"model_type": "RefinedWeb", "hidden_size": 8192, "n_head": 128,
      "n_head_kv": 8, "n_layer": 60, "vocab_size": 65024})"));
  EXPECT_EQ(f5.model.num_attention_heads, 128);
  EXPECT_EQ(f5.model.num_hidden_layers, 60);
  EXPECT_EQ(f5.model.kv_heads(), 8);
  const std::string bad_kv = dir.write("f6.json", R"({"model_type": "falcon", "hidden_size": 8192,
      "new_decoder_architecture": true, "num_kv_heads": 7, "num_hidden_layers": 60, "num_attention_heads": 128})");
  TrainConfig f6 = default_config();
  EXPECT_TRUE(starts_with(usage_error([&] { apply_model_config(f6, bad_kv); }),
                          bad_kv + ": num_kv_heads: expected a divisor of num_attention_heads 128, got 7"));

  // MPT 7B: d_model, n_layers, n_heads, expansion_ratio; multi-head attention in attn_config; tied
  TrainConfig m = default_config();
  apply_model_config(m, data("mpt_7b_config.json"));
  EXPECT_EQ(m.model.hidden_size, 4096);
  EXPECT_EQ(m.model.num_hidden_layers, 32);
  EXPECT_EQ(m.model.num_attention_heads, 32);
  EXPECT_EQ(m.model.intermediate_size, 4 * 4096);
  EXPECT_EQ(m.model.kv_heads(), 32);
  EXPECT_TRUE(m.model.tie_word_embeddings);
  EXPECT_TRUE(has_note(m, "expansion_ratio 4 x hidden"));
  auto dm = full_depth(m);
  dm.d_ff = m.model.step_ffn();
  EXPECT_NEAR(double(sb::diagnose::full_depth_footprint(m.model, dm).parameters) / 6649286656.0, 1.0, 0.0001);
  TrainConfig mq = default_config();
  apply_model_config(mq, dir.write("mq.json", R"({"model_type": "mpt", "d_model": 2048, "n_layers": 24,
      "n_heads": 16, "expansion_ratio": 8, "attn_config": {"attn_type": "grouped_query_attention", "kv_n_heads": 4},
      "vocab_size": 50432})"));
  EXPECT_EQ(mq.model.intermediate_size, 8 * 2048);
  EXPECT_EQ(mq.model.kv_heads(), 4);

  // BLOOM 560M: n_layer, n_head (BloomConfig's attribute_map), 4 x hidden, tied; n_embed as old files name it
  TrainConfig b = default_config();
  apply_model_config(b, data("bloom_560m_config.json"));
  EXPECT_EQ(b.model.num_hidden_layers, 24);
  EXPECT_EQ(b.model.num_attention_heads, 16);
  EXPECT_EQ(b.model.intermediate_size, 4096);
  auto db = full_depth(b);
  db.d_ff = b.model.step_ffn();
  EXPECT_NEAR(double(sb::diagnose::full_depth_footprint(b.model, db).parameters) / 559214592.0, 1.0, 0.001);
  TrainConfig b2 = default_config();
  apply_model_config(b2, dir.write("b2.json", R"({"model_type": "bloom", "n_embed": 1024, "n_layer": 24,
      "num_attention_heads": 16, "vocab_size": 250880})"));
  EXPECT_EQ(b2.model.hidden_size, 1024);

  // OPT: ffn_dim; GPT-BigCode: multi_query, true by default; GPT-J: n_inner null, untied by its class
  TrainConfig o = default_config();
  apply_model_config(o, dir.write("opt.json", R"({"model_type": "opt", "hidden_size": 4096, "ffn_dim": 16384,
      "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 50272})"));
  EXPECT_EQ(o.model.intermediate_size, 16384);
  EXPECT_TRUE(o.model.tie_word_embeddings);
  EXPECT_EQ(o.sources.at("model.intermediate_size").where, dir.path("opt.json") + " (ffn_dim)");
  TrainConfig sc = default_config();
  apply_model_config(sc, dir.write("sc.json", R"({"model_type": "gpt_bigcode", "n_embd": 6144, "n_layer": 40,
      "n_head": 48, "n_inner": 24576, "vocab_size": 49152})"));
  EXPECT_EQ(sc.model.kv_heads(), 1);
  EXPECT_EQ(sc.model.intermediate_size, 24576);
  TrainConfig j = default_config();
  apply_model_config(j, dir.write("gptj.json", R"({"model_type": "gptj", "n_embd": 4096, "n_layer": 28,
      "n_head": 16, "n_inner": null, "vocab_size": 50400})"));
  EXPECT_EQ(j.model.intermediate_size, 16384);
  EXPECT_FALSE(j.model.tie_word_embeddings);

  // A Llama-family file says nothing of tying: Llama's class default, untied, without a note; an unknown
  // family keeps the value it had and says so; the file's own key wins over any default
  TrainConfig u = default_config();
  apply_model_config(u, dir.write("u.json", R"({"model_type": "newfamily", "hidden_size": 1024,
      "num_hidden_layers": 2, "num_attention_heads": 8, "intermediate_size": 2816, "vocab_size": 1000})"));
  EXPECT_FALSE(u.model.tie_word_embeddings);
  EXPECT_TRUE(has_note(u, "no tie_word_embeddings; false (default) kept"));
  TrainConfig t = default_config();
  apply_model_config(t, dir.write("t.json", R"({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2,
      "tie_word_embeddings": false, "vocab_size": 1000})"));
  EXPECT_FALSE(t.model.tie_word_embeddings);
}

// A mixture of experts: the step runs a token's width (the routed experts' and the shared one's), the
// memory check holds every expert's weights and the routers.
TEST(DiagnoseConfig, AMixtureOfExpertsRunsATokensWidthAndHoldsEveryExpert) {
  TrainConfig x = default_config();
  const std::string xp = data("mixtral_8x7b_config.json");
  apply_model_config(x, xp);
  EXPECT_TRUE(x.model.moe());
  EXPECT_EQ(x.model.num_experts, 8);
  EXPECT_EQ(x.model.num_experts_per_tok, 2);
  EXPECT_EQ(x.model.active_intermediate(), 2 * 14336);
  EXPECT_EQ(x.model.weight_intermediate(), 8 * 14336);
  EXPECT_EQ(x.model.step_ffn(), 3 * 14336);  // two hidden x 1.5 x (2 x 14336): a token's gated MLP FLOPs
  EXPECT_EQ(x.sources.at("model.num_experts").where, xp + " (num_local_experts)");
  EXPECT_TRUE(has_note(x, "a mixture of experts: 2 of 8 experts of 14336 each run for a token"));
  auto dx = full_depth(x);
  dx.d_ff = x.model.step_ffn();
  dx.kv_heads = x.model.kv_heads();
  const auto fx = sb::diagnose::full_depth_footprint(x.model, dx);
  const double layer = 4096.0 * (4096 + 2 * 1024) + 4096.0 * 4096 + 3 * 4096.0 * 8 * 14336 + 4096.0 * 8;
  EXPECT_NEAR(double(fx.parameters), 32 * layer + 2 * 32000.0 * 4096, 64.0);
  EXPECT_NEAR(double(fx.parameters) / 46702792704.0, 1.0, 0.0001);  // published 46.7 billion (norms in it)

  // Qwen-MoE's own names: num_experts, moe_intermediate_size, a shared expert
  TempDir dir("moe");
  TrainConfig q = default_config();
  apply_model_config(q, dir.write("q.json", R"({"model_type": "qwen2_moe", "hidden_size": 2048,
      "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 5632,
      "moe_intermediate_size": 1408, "num_experts": 60, "num_experts_per_tok": 4,
      "shared_expert_intermediate_size": 5632, "vocab_size": 151936, "tie_word_embeddings": false})"));
  EXPECT_EQ(q.model.active_intermediate(), 4 * 1408 + 5632);
  EXPECT_EQ(q.model.weight_intermediate(), 60 * 1408 + 5632);
  auto dq = full_depth(q);
  dq.d_ff = q.model.step_ffn();
  EXPECT_NEAR(double(sb::diagnose::full_depth_footprint(q.model, dq).parameters) / 14.3e9, 1.0, 0.01);

  // a config.json with experts and no count per token, one with more per token than experts: exit 2
  const std::string no_k = dir.write("nok.json", R"({"model_type": "mixtral", "num_local_experts": 8})");
  TrainConfig a = default_config();
  EXPECT_TRUE(starts_with(usage_error([&] { apply_model_config(a, no_k); }),
                          no_k + ": num_local_experts: given without num_experts_per_tok"));
  const std::string too_many = dir.write("many.json", R"({"model_type": "mixtral", "num_local_experts": 8,
      "num_experts_per_tok": 9})");
  EXPECT_TRUE(starts_with(usage_error([&] { apply_model_config(a, too_many); }), too_many + ": num_experts_per_tok:"));
  // a dense config.json after a YAML's experts: dense, said so
  TrainConfig y = parse_axolotl_yaml_text("num_experts: 8\nnum_experts_per_tok: 2\nhidden_size: 512\n", "m.yml");
  EXPECT_TRUE(y.model.moe());
  apply_model_config(y, data("llama2_7b_config.json"));
  EXPECT_FALSE(y.model.moe());
  EXPECT_TRUE(has_note(y, "no experts: a dense MLP, not the 8 experts of m.yml:1"));
  // the YAML's keys need each other, and a count per token within the experts
  EXPECT_TRUE(starts_with(usage_error([] { parse_axolotl_yaml_text("hidden_size: 512\nnum_experts: 8\n", "e.yml"); }),
                          "e.yml:2: num_experts: given without num_experts_per_tok"));
  EXPECT_TRUE(starts_with(
      usage_error([] { parse_axolotl_yaml_text("num_experts: 4\nnum_experts_per_tok: 5\n", "k.yml"); }),
      "k.yml:2: num_experts_per_tok: 5 is more than num_experts 4"));

  // layers the step is not: refused with the way to a stand-in
  const std::string ds = dir.write("ds.json", R"({"model_type": "deepseek_v3", "hidden_size": 7168,
      "n_routed_experts": 256, "num_experts_per_tok": 8, "kv_lora_rank": 512})");
  TrainConfig d = default_config();
  const std::string e = usage_error([&] { apply_model_config(d, ds); });
  EXPECT_TRUE(starts_with(e, ds + ": model_type deepseek_v3: multi-head latent attention")) << e;
  EXPECT_NE(e.find("give the dims as keys of the training config"), std::string::npos) << e;
}

// The memory check's activations of a gated MLP: eager SwiGLU keeps four intermediate-wide tensors a
// token (gate, its SiLU, up, their product), the step's two matrices three: one more per layer (one
// in all with checkpointing, which keeps one layer's set); a plain MLP's are the step's own.
TEST(DiagnoseFootprint, AGatedMlpKeepsOneMoreIntermediateWidthOfActivations) {
  TrainConfig l2 = default_config();
  apply_model_config(l2, data("llama2_7b_config.json"));
  auto d = full_depth(l2);
  d.d_ff = l2.model.step_ffn();
  const std::uint64_t step = sb::batch::predict_footprint(d, sb::batch::OptKind::adamw, 1, 0, 0).activations;
  const auto f = sb::diagnose::full_depth_footprint(l2.model, d);
  EXPECT_EQ(f.parts["activations"].get<std::uint64_t>(), step + 32ull * 2048 * 11008 * 2);  // bf16
  d.checkpointing = true;
  const std::uint64_t step_ck = sb::batch::predict_footprint(d, sb::batch::OptKind::adamw, 1, 0, 0).activations;
  EXPECT_EQ(sb::diagnose::full_depth_footprint(l2.model, d).parts["activations"].get<std::uint64_t>(),
            step_ck + 2048ull * 11008 * 2);
  TrainConfig py = default_config();
  apply_model_config(py, data("pythia_1b_config.json"));
  auto dp = full_depth(py);
  dp.d_ff = py.model.step_ffn();
  EXPECT_EQ(sb::diagnose::full_depth_footprint(py.model, dp).parts["activations"].get<std::uint64_t>(),
            sb::batch::predict_footprint(dp, sb::batch::OptKind::adamw, 1, 0, 0).activations);
}

// The multiple their loop pads at: the collator's 64 where the loop runs the check's sequence or reads
// a lengths file; scaled with generated lengths drawn at a reduced sequence, at least 16, at most 64.
TEST(DiagnoseShape, TheLoopsPadMultipleScalesWithGeneratedLengthsOnly) {
  EXPECT_EQ(loop_pad_multiple(64, false, 256, 256), 64);    // all_causes.yml: 256 both
  EXPECT_EQ(loop_pad_multiple(64, false, 2048, 2048), 64);  // a GPU: the config's own sequence
  EXPECT_EQ(loop_pad_multiple(64, true, 2048, 256), 64);    // --lengths: their own lengths
  EXPECT_EQ(loop_pad_multiple(64, false, 2048, 256), 16);   // 8 scaled, held at 16
  EXPECT_EQ(loop_pad_multiple(64, false, 512, 256), 32);
  EXPECT_EQ(loop_pad_multiple(8, false, 2048, 256), 8);     // never above the collator's own
}

// The shape a CPU runs the checks at keeps the model's grouped-query attention: its share of K/V heads
// (at least one, a divisor of the reduced heads), and the note says so. A GPU runs the model's own.
TEST(DiagnoseShape, TheReducedShapeKeepsTheKvHeadsShare) {
  sb::DeviceInfo cpu;
  cpu.kind = sb::DeviceKind::cpu;
  TrainConfig l3 = default_config();
  apply_model_config(l3, data("llama3_8b_config.json"));  // 32 heads, 8 K/V heads, hidden 4096
  const MeasuredShape s3 = measured_shape(l3, cpu);
  EXPECT_EQ(s3.hidden, 256);
  EXPECT_EQ(s3.heads, 8);
  EXPECT_EQ(s3.kv_heads, 2);  // a quarter, as the model's
  EXPECT_NE(s3.note.find("K/V heads 8 -> 2"), std::string::npos) << s3.note;

  TrainConfig qw = default_config();
  apply_model_config(qw, data("qwen2_7b_config.json"));  // 28 heads, 4 K/V heads: 1/7
  const MeasuredShape sq = measured_shape(qw, cpu);
  EXPECT_EQ(sq.heads, 8);
  EXPECT_EQ(sq.kv_heads, 1);  // 8/7 rounds down to one, which divides 8
  EXPECT_EQ(sq.heads % sq.kv_heads, 0);

  TrainConfig l2 = default_config();
  apply_model_config(l2, data("llama2_7b_config.json"));  // multi-head: K/V at every head, no note
  const MeasuredShape s2 = measured_shape(l2, cpu);
  EXPECT_EQ(s2.kv_heads, s2.heads);
  EXPECT_EQ(s2.note.find("K/V"), std::string::npos) << s2.note;

  // a small GQA model whose heads are kept: only the sequence is reduced, and the note has no K/V line
  TrainConfig small = l3;
  small.model.hidden_size = 256;
  small.model.num_attention_heads = 8;
  small.model.num_key_value_heads = 2;
  small.model.intermediate_size = 688;
  const MeasuredShape ss = measured_shape(small, cpu);
  EXPECT_EQ(ss.heads, 8);
  EXPECT_EQ(ss.kv_heads, 2);
  EXPECT_EQ(ss.note.find("K/V"), std::string::npos) << ss.note;

  sb::DeviceInfo gpu;
  gpu.kind = sb::DeviceKind::cuda;
  const MeasuredShape g3 = measured_shape(l3, gpu);
  EXPECT_EQ(g3.heads, 32);
  EXPECT_EQ(g3.kv_heads, 8);
  EXPECT_FALSE(g3.reduced);
}

// What limits the user's micro batch (diagnose's batch check), read from real
// points of the batch scenario: its finding must not call a step launch-bound
// when the step's own figures say it is not.
Result batch_points() {
  std::ifstream f(kData + "/batch_points.json");
  return result_from_json(nlohmann::ordered_json::parse(f), "batch_points.json");
}

const Point& batch_point(const Result& r, std::int64_t mb, std::int64_t ga) {
  for (const Point& p : r.points)
    if (p.params.value("micro_batch", std::int64_t(0)) == mb && p.params.value("grad_accum", std::int64_t(0)) == ga)
      return p;
  throw std::runtime_error(fmt::format("no point {} x {} in batch_points.json", mb, ga));
}

TEST(DiagnoseBatchLimit, LaunchBoundOnlyWhereTheStepsFiguresSaySo) {
  const Result r = batch_points();
  // 1 x 8: 5.3 us of device work against 12.7 us of host per submission, 41% busy: HTA's rule holds
  const BatchLimit lb = batch_limit(batch_point(r, 1, 8), batch_point(r, 8, 8), 32);
  EXPECT_EQ(lb.kind, "launch-bound");
  EXPECT_NE(lb.cause.find("launch-bound"), std::string::npos);
  EXPECT_NE(lb.reading.find("41% busy (steady-low), 5.3 us of device work per submission against 12.7 us"),
            std::string::npos)
      << lb.reading;
  // device time per token: 0.6218 ms / 32 tokens = 19.43 us at 1; 1.3480 ms / 256 = 5.27 us at 8
  EXPECT_NE(lb.reading.find("19.43 us at micro batch 1 -> 5.27 us at 8"), std::string::npos) << lb.reading;

  // 1 x 1: device work under host time per submission, but 54% busy: not HTA's rule, steady-low
  const BatchLimit sl = batch_limit(batch_point(r, 1, 1), batch_point(r, 4, 1), 32);
  EXPECT_EQ(sl.kind, "steady-low");
  EXPECT_EQ(sl.cause.find("launch-bound"), std::string::npos) << sl.cause;
  EXPECT_NE(sl.reading.find("54% busy (steady-low)"), std::string::npos) << sl.reading;

  // 16 x 8: 98% busy, 61 us of device work against 11 us of host: fed; a larger batch buys efficiency only
  const BatchLimit de = batch_limit(batch_point(r, 16, 8), batch_point(r, 32, 8), 32);
  EXPECT_EQ(de.kind, "device-efficiency");
  EXPECT_NE(de.cause.find("not launch-bound"), std::string::npos) << de.cause;
  EXPECT_NE(de.reading.find("not launch-bound at micro batch 16: 98% busy (healthy)"), std::string::npos)
      << de.reading;
  EXPECT_NE(de.reading.find("6.09 us at micro batch 16 -> 6.20 us at 32"), std::string::npos) << de.reading;

  // the knee at their own micro batch: no per-token comparison to make
  const BatchLimit same = batch_limit(batch_point(r, 16, 8), batch_point(r, 16, 8), 32);
  EXPECT_EQ(same.reading.find("device time per token"), std::string::npos) << same.reading;
}

// Offload to the CPU (diagnose/offload.hpp), modelled from the config. Axolotl's shipped DeepSpeed configs
// (deepspeed_configs/zero3_bf16_cpuoffload_all.json: offload_param and offload_optimizer to the CPU;
// ..._cpuoffload_params.json: offload_param only) as a config names them; the file read where it is beside
// the config, judged by its name where it is not. Llama-2-7B (the default dims), bf16, micro batch 1 x 4
// accumulated at 2048 tokens, 8 GPUs: against the H100's published pinned host-to-device 52 GB/s and its
// 794.5 TFLOP/s bf16 matmul (results/expected/h100-sxm.json).
namespace offload_test {

diagnose::TrainConfig config(const TempDir& dir, const std::string& yaml, int world) {
  diagnose::TrainConfig c = diagnose::read_axolotl_yaml(dir.write("cfg.yml", yaml));
  diagnose::TrainerSpec t;
  t.world_size = world;
  diagnose::resolve_axolotl(c, t);
  return c;
}

const char* kBase = "bf16: true\nmicro_batch_size: 1\ngradient_accumulation_steps: 4\nsequence_len: 2048\n";

}  // namespace offload_test

TEST(DiagnoseOffload, ZeroThreeOffloadAllMovesTheWeightsTwiceAndTheGradientsOnceAMicroStep) {
  using namespace offload_test;
  TempDir dir("offload_all");
  const auto c = config(dir, std::string(kBase) + "deepspeed: deepspeed_configs/zero3_bf16_cpuoffload_all.json\n", 8);
  EXPECT_EQ(c.world_size, 8);
  const diagnose::OffloadSetting s = diagnose::offload_setting(c);
  EXPECT_TRUE(s.params && s.optimizer);
  EXPECT_NE(s.read_from.find("judged by its name"), std::string::npos) << s.read_from;
  const diagnose::Adapter none;
  const double n = 6.74e9;
  const auto k = diagnose::offload_cost(c, s, std::uint64_t(n), none, nullptr);
  ASSERT_TRUE(k);
  // weights: 2 passes x 4 micro-steps x n/8 x 2 bytes; gradients: 4 x n/8 x 2 bytes
  EXPECT_NEAR(k->gb_per_step, (2 * 4 * n / 8 * 2 + 4 * n / 8 * 2) / 1e9, 1e-9);
  EXPECT_NEAR(k->pcie_s, k->gb_per_step / 52, 1e-9);
  EXPECT_NEAR(k->compute_s, 6 * n * 4 * 2048 / 794.5e12, 1e-9);
  EXPECT_NEAR(k->gain_serial, (k->compute_s + k->pcie_s) / k->compute_s, 1e-12);
  EXPECT_NEAR(k->gain_overlapped, std::max(k->compute_s, k->pcie_s) / k->compute_s, 1e-12);
  EXPECT_NEAR(k->sharded_gib, n * 16 / 8 / double(1ull << 30), 1e-9);
  EXPECT_NE(k->gpu.find("h100-sxm"), std::string::npos);
  const auto f = diagnose::offload_finding(c, none, std::uint64_t(n), nullptr);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->evidence["check"], "offload");
  EXPECT_EQ(f->evidence["basis"], "modelled");
  EXPECT_EQ(f->evidence["config_line"], "deepspeed: deepspeed_configs/zero3_bf16.json");
  EXPECT_EQ(f->summary.rfind("offload: modelled from your config", 0), 0u) << f->summary;
}

TEST(DiagnoseOffload, TheDeepSpeedFileBesideTheConfigDecidesAndFsdpAndLoraAreTheirOwn) {
  using namespace offload_test;
  TempDir dir("offload_file");
  // the file says offload_optimizer only, whatever its name: the weights stay, the updated ones come back once
  dir.write("ds_cpuoffload_all.json",
            R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}}})");
  const auto c = config(dir, std::string(kBase) + "deepspeed: ds_cpuoffload_all.json\n", 2);
  const diagnose::OffloadSetting s = diagnose::offload_setting(c);
  EXPECT_FALSE(s.params);
  EXPECT_TRUE(s.optimizer);
  EXPECT_EQ(s.read_from, dir.path("ds_cpuoffload_all.json"));
  const double n = 1e9;
  const auto k = diagnose::offload_cost(c, s, std::uint64_t(n), diagnose::Adapter{}, nullptr);
  ASSERT_TRUE(k);
  EXPECT_NEAR(k->gb_per_step, (4 * n / 2 * 2 + n / 2 * 2) / 1e9, 1e-9);
  // a broken file is judged by its name, said
  dir.write("ds_cpuoffload_all.json", "{not json");
  EXPECT_TRUE(diagnose::offload_setting(c).params);
  EXPECT_NE(diagnose::offload_setting(c).read_from.find("not read"), std::string::npos);
  // FSDP's CPUOffload: both; its line is fsdp's own
  const auto fsdp = config(dir, std::string(kBase) + "fsdp_config:\n  offload_params: true\n", 8);
  const auto ff = diagnose::offload_finding(fsdp, diagnose::Adapter{}, 6'740'000'000ull, nullptr);
  ASSERT_TRUE(ff);
  EXPECT_EQ(ff->evidence["config_line"], "fsdp_config: offload_params: false");
  // LoRA: no full gradients to the CPU, 4N of compute
  diagnose::Adapter lora;
  lora.on = true;
  const auto kl = diagnose::offload_cost(fsdp, diagnose::offload_setting(fsdp), std::uint64_t(n), lora, nullptr);
  ASSERT_TRUE(kl);
  EXPECT_NEAR(kl->gb_per_step, 2 * 4 * n / 8 * 2 / 1e9, 1e-9);
  EXPECT_NEAR(kl->compute_s, 4 * n * 4 * 2048 / 794.5e12, 1e-9);
  // no offload: no finding
  EXPECT_FALSE(diagnose::offload_finding(config(dir, kBase, 8), diagnose::Adapter{}, 6'740'000'000ull, nullptr));
  EXPECT_FALSE(diagnose::offload_finding(config(dir, std::string(kBase) + "deepspeed: deepspeed_configs/zero3_bf16.json\n", 8),
                                         diagnose::Adapter{}, 6'740'000'000ull, nullptr));
}

// The memory check per GPU, as the config shards: ZeRO-3 over 8 GPUs divides the weights, gradients, AdamW's
// state and the embedding by 8, ZeRO-2 the gradients and the state, offloaded parts leave the GPU, FSDP's
// list (Axolotl's fsdp: [full_shard, auto_wrap], shard_grad_op) is read; the activations stay whole.
TEST(DiagnoseOffload, TheMemoryCheckCountsTheStatesPerGpuAsTheConfigShards) {
  using namespace offload_test;
  TempDir dir("shard");
  batch::DecoderConfig d;
  d.micro_batch = 1, d.seq = 2048, d.d_model = 4096, d.d_ff = 16512, d.heads = 32, d.kv_heads = 32, d.layers = 32;
  d.dtype = DType::bf16;
  const ModelDims m;
  const FullDepthFootprint whole = full_depth_footprint(m, d);
  auto part = [](const FullDepthFootprint& f, const char* k) { return f.parts[k].get<std::uint64_t>(); };
  const auto z3 = config(dir, std::string(kBase) + "deepspeed: deepspeed_configs/zero3_bf16.json\n", 8);
  const Sharding s3 = sharding_of(z3);
  EXPECT_EQ(s3.stage, 3);
  EXPECT_EQ(s3.world, 8);
  const FullDepthFootprint f3 = full_depth_footprint(m, d, {}, s3);
  EXPECT_EQ(part(f3, "weights"), part(whole, "weights") / 8);
  EXPECT_EQ(part(f3, "gradients"), part(whole, "gradients") / 8);
  EXPECT_EQ(part(f3, "optimizer"), part(whole, "optimizer") / 8);
  EXPECT_EQ(part(f3, "embedding_and_head"), part(whole, "embedding_and_head") / 8);
  EXPECT_EQ(part(f3, "activations"), part(whole, "activations"));
  EXPECT_EQ(f3.sharded, "DeepSpeed ZeRO-3 over 8 GPUs");
  const auto z2 = config(dir, std::string(kBase) + "deepspeed: deepspeed_configs/zero2.json\n", 4);
  const FullDepthFootprint f2 = full_depth_footprint(m, d, {}, sharding_of(z2));
  EXPECT_EQ(part(f2, "weights"), part(whole, "weights"));
  EXPECT_EQ(part(f2, "gradients"), part(whole, "gradients") / 4);
  const auto off = config(dir, std::string(kBase) + "deepspeed: deepspeed_configs/zero3_bf16_cpuoffload_all.json\n", 8);
  const FullDepthFootprint fo = full_depth_footprint(m, d, {}, sharding_of(off));
  EXPECT_EQ(part(fo, "weights"), 0u);
  EXPECT_EQ(part(fo, "optimizer"), 0u);
  EXPECT_LT(fo.total, std::uint64_t(74.5 * (1ull << 30)));  // a 7B full fine-tune fits an H100 so
  EXPECT_GT(whole.total, std::uint64_t(74.5 * (1ull << 30)));  // and not whole on one
  const auto fsdp = config(dir, std::string(kBase) + "fsdp:\n  - shard_grad_op\n  - auto_wrap\n", 2);
  EXPECT_EQ(fsdp.fsdp_shard, 2);
  EXPECT_EQ(sharding_of(fsdp).what, "FSDP shard_grad_op over 2 GPUs");
  const auto full_shard = config(dir, std::string(kBase) + "fsdp: [full_shard, auto_wrap, offload]\n", 8);
  EXPECT_EQ(full_shard.fsdp_shard, 3);
  EXPECT_TRUE(full_shard.fsdp_offload_params);
  EXPECT_FALSE(sharding_of(config(dir, kBase, 8)).stage);  // nothing configured: nothing divided
  // fsdp_config alone: FSDP1's sharding_strategy, FSDP2's reshard_after_forward
  EXPECT_EQ(config(dir, std::string(kBase) + "fsdp_config:\n  fsdp_sharding_strategy: SHARD_GRAD_OP\n", 8).fsdp_shard, 2);
  EXPECT_EQ(config(dir, std::string(kBase) + "fsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n", 8).fsdp_shard, 3);
  EXPECT_EQ(config(dir, std::string(kBase) + "fsdp_version: 2\nfsdp_config:\n  reshard_after_forward: false\n", 8).fsdp_shard, 2);
  EXPECT_EQ(config(dir, std::string(kBase) + "fsdp_config:\n  sharding_strategy: NO_SHARD\n", 8).fsdp_shard, 0);
}

}  // namespace
}  // namespace sb::diagnose
