// diagnose reads a config as Axolotl reads it (diagnose/trainer.hpp). Each config below is written in
// the shape of a real Axolotl example, named with its tag and path (the keys that matter only; no
// file is copied), and each rule is tested at the versions on both sides of where it changed.
#include <filesystem>  // std::filesystem::temp_directory_path
#include <fstream>     // std::ofstream
#include <string>      // std::string

#include <unistd.h>    // getpid

#include <gtest/gtest.h>

#include "diagnose/config.hpp"    // parse_axolotl_yaml_text, apply_model_config_text
#include "diagnose/footprint.hpp" // adapter_of, adapter_parameters, full_depth_footprint
#include "diagnose/hf_cache.hpp"  // find_model_config
#include "diagnose/plan.hpp"      // format_plan, skipped_by_config
#include "diagnose/trainer.hpp"   // resolve_axolotl
#include "harness/errors.hpp"     // UsageError

namespace sb::diagnose {
namespace {

namespace fs = std::filesystem;

TrainConfig resolved(const std::string& yaml, Version v = kNewestAxolotl, int world = 1) {
  TrainConfig c = parse_axolotl_yaml_text(yaml, "t.yml");
  resolve_axolotl(c, TrainerSpec{v, true, world});
  return c;
}

std::string refused(const std::string& yaml, Version v = kNewestAxolotl) {
  try {
    resolved(yaml, v);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

bool has_note(const TrainConfig& c, const std::string& part) {
  for (const auto& n : c.notes)
    if (n.find(part) != std::string::npos) return true;
  return false;
}

// examples/llama-3/lora-1b.yml at v0.18.0: no dataloader_* key, attn_implementation, bf16 auto.
constexpr const char* kLlama32Lora =
    "base_model: NousResearch/Llama-3.2-1B\n"
    "adapter: lora\n"
    "sequence_len: 2048\n"
    "sample_packing: true\n"
    "eval_sample_packing: true\n"
    "gradient_accumulation_steps: 2\n"
    "micro_batch_size: 2\n"
    "bf16: auto\n"
    "tf32: false\n"
    "gradient_checkpointing: true\n"
    "attn_implementation: flash_attention_2\n";

TEST(AxolotlDataloader, NoKeyIsOneWorkerARankPinnedPrefetch256From0110) {
  const TrainConfig c = resolved(kLlama32Lora, {0, 11, 0});
  EXPECT_EQ(c.dataloader_num_workers, 1);
  EXPECT_TRUE(c.dataloader_pin_memory);
  EXPECT_EQ(c.dataloader_prefetch_factor, 256);
  EXPECT_NE(c.sources.at("dataloader_num_workers").where.find("default_dataloader_opts"), std::string::npos);
  // WORLD_SIZE workers a rank, not the node's GPUs
  EXPECT_EQ(resolved(kLlama32Lora, {0, 18, 0}, 8).dataloader_num_workers, 8);
}

TEST(AxolotlDataloader, BeforeThatTheTrainersZeroWorkers) {
  const TrainConfig c = resolved(kLlama32Lora, {0, 10, 1});
  EXPECT_EQ(c.dataloader_num_workers, 0);
  EXPECT_TRUE(has_note(c, "dataloader_num_workers 0"));
}

TEST(AxolotlDataloader, AnyOneKeyTurnsTheDefaultsOff) {
  // default_dataloader_opts fires only when all three are unset
  const TrainConfig c = resolved(std::string(kLlama32Lora) + "dataloader_pin_memory: false\n", {0, 18, 0});
  EXPECT_EQ(c.dataloader_num_workers, 0);
  EXPECT_FALSE(c.dataloader_pin_memory);
}

TEST(AxolotlAttention, NoKeyIsTransformersSdpaForLlamaAndEagerForGptj) {
  // examples/mamba, gptj at v0.8.0 carry no attention key that loads a kernel; llama guessed from its name
  const TrainConfig llama = resolved("base_model: meta-llama/Llama-3.2-1B\nflash_attention: false\n");
  EXPECT_EQ(llama.attn_implementation, "sdpa");
  EXPECT_TRUE(llama.sdp_attention);
  EXPECT_EQ(llama.model_family, "llama");
  // examples/gptj/qlora.yml (v0.8.0): xformers_attention true patches llama only before 0.17
  const TrainConfig gptj = resolved("base_model: EleutherAI/gpt-j-6b\nxformers_attention: true\n", {0, 8, 0});
  EXPECT_EQ(gptj.attn_implementation, "eager");
  EXPECT_FALSE(gptj.sdp_attention || gptj.flash_attention);
  // unknown family: SDPA assumed, said so
  const TrainConfig unknown = resolved("micro_batch_size: 2\n");
  EXPECT_EQ(unknown.attn_implementation, "sdpa");
  EXPECT_TRUE(has_note(unknown, "SDPA is assumed"));
}

TEST(AxolotlAttention, TheKeyFrom0120AndTheLegacyFlagsByPriority) {
  EXPECT_EQ(resolved(kLlama32Lora).attn_implementation, "flash_attention_2");
  EXPECT_TRUE(resolved(kLlama32Lora).flash_attention);
  // before 0.12 attn_implementation is not read: the model family's default
  const TrainConfig old = resolved(kLlama32Lora, {0, 11, 0});
  EXPECT_EQ(old.attn_implementation, "sdpa");
  EXPECT_TRUE(has_note(old, "read from Axolotl 0.12.0 on"));
  EXPECT_EQ(resolved("attn_implementation: eager\n").attn_implementation, "eager");
  EXPECT_EQ(resolved("sdp_attention: true\n").attn_implementation, "sdpa");
  // flex first from 0.8.1
  EXPECT_EQ(resolved("flex_attention: true\nflash_attention: true\n", {0, 8, 1}).attn_implementation, "flex_attention");
  // 0.17 refuses the key beside a legacy flag
  EXPECT_NE(refused("attn_implementation: sdpa\nflash_attention: true\n").find("refuses"), std::string::npos);
  // an unknown name is exit 2 at its line
  EXPECT_THROW(parse_axolotl_yaml_text("\nattn_implementation: magic\n", "t.yml"), UsageError);
}

TEST(AxolotlAttention, FlashWithPackingOnAnUnlistedFamilyWasEagerIn040) {
  const std::string y = "base_model: EleutherAI/pythia-1b\nflash_attention: true\nsample_packing: true\n";
  EXPECT_EQ(resolved(y, {0, 4, 0}).attn_implementation, "eager");
  EXPECT_EQ(resolved(y, {0, 5, 0}).attn_implementation, "flash_attention_2");
}

TEST(AxolotlPrecision, UnsetBf16IsAutoFrom050AndFp32OnlyWhenSaidSo) {
  const TrainConfig c = resolved("micro_batch_size: 1\n");
  EXPECT_TRUE(c.bf16);
  EXPECT_NE(c.sources.at("bf16").where.find("auto"), std::string::npos);
  EXPECT_FALSE(resolved("micro_batch_size: 1\n", {0, 4, 0}).bf16);
  const TrainConfig fp32 = resolved("bf16: false\nfp16: false\n");
  EXPECT_FALSE(fp32.bf16 || fp32.fp16);
}

TEST(AxolotlPrecision, PureHalfAndEightBitLoadsAreNotFp32) {
  const TrainConfig f = resolved("bf16: false\nfloat16: true\n");
  EXPECT_TRUE(f.fp16);
  const TrainConfig b = resolved("bf16: false\nbfloat16: true\n");
  EXPECT_TRUE(b.bf16);
  EXPECT_TRUE(has_note(b, "bf16 mixed precision is on (0.10+)"));
  EXPECT_TRUE(has_note(resolved("bf16: false\nbfloat16: true\n", {0, 9, 0}), "without mixed precision"));
  // examples/llama-3/instruct-dpo-lora-8b.yml (v0.8.0) with bf16 false: load_in_8bit loads fp16
  const TrainConfig q8 = resolved("bf16: false\nload_in_8bit: true\nadapter: lora\n");
  EXPECT_TRUE(q8.fp16);
}

TEST(AxolotlPrecision, AutoBesideFp16WasBf16Before091) {
  EXPECT_TRUE(resolved("bf16: auto\nfp16: true\n", {0, 9, 0}).bf16);
  const TrainConfig now = resolved("bf16: auto\nfp16: true\n", {0, 9, 1});
  EXPECT_FALSE(now.bf16);
  EXPECT_TRUE(now.fp16);
}

TEST(AxolotlPacking, RlForbidsItAndRefusesTheConfigThatAsks) {
  // examples/qwen2/dpo.yaml (v0.18.0)
  const TrainConfig dpo = resolved("base_model: Qwen/Qwen2.5-0.5B\nrl: dpo\nsample_packing: false\n");
  EXPECT_NE(dpo.packing_unavailable.find("rl: dpo"), std::string::npos);
  EXPECT_NE(refused("rl: dpo\nsample_packing: true\n").find("RLHF"), std::string::npos);
}

TEST(AxolotlPacking, NoMultipackForGptjOrMamba) {
  EXPECT_NE(resolved("base_model: EleutherAI/gpt-j-6b\n").packing_unavailable.find("gptj"), std::string::npos);
  EXPECT_NE(resolved("base_model: state-spaces/mamba-2.8b\nmodel_type: MambaLMHeadModel\n").packing_unavailable.find("mamba"),
            std::string::npos);
  EXPECT_EQ(resolved("base_model: mistralai/Mistral-7B-v0.1\n").packing_unavailable, "");
  // phi3 joined the list in 0.5.0
  EXPECT_NE(resolved("base_model: microsoft/Phi-3-mini-4k-instruct\n", {0, 4, 0}).packing_unavailable, "");
  EXPECT_EQ(resolved("base_model: microsoft/Phi-3-mini-4k-instruct\n", {0, 5, 0}).packing_unavailable, "");
}

TEST(AxolotlPacking, MaxPackedSequenceLenWasPackingUntil030) {
  EXPECT_TRUE(resolved("max_packed_sequence_len: 2048\n", {0, 3, 0}).sample_packing);
  EXPECT_NE(refused("max_packed_sequence_len: 2048\n", {0, 4, 0}).find("no longer supported"), std::string::npos);
}

TEST(AxolotlBatch, BatchSizeDefinesTheAccumulation) {
  const TrainConfig c = resolved("batch_size: 32\nmicro_batch_size: 4\n");
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  EXPECT_NE(refused("batch_size: 32\nmicro_batch_size: 4\ngradient_accumulation_steps: 2\n").find("both set"),
            std::string::npos);
}

TEST(Versions, ParseAndOrder) {
  EXPECT_EQ(parse_version("0.11.0"), (Version{0, 11, 0}));
  EXPECT_EQ(parse_version("v0.11"), (Version{0, 11, 0}));
  EXPECT_EQ(parse_version("0.11.0.post1"), (Version{0, 11, 0}));
  EXPECT_FALSE(parse_version("eleven"));
  EXPECT_FALSE(parse_version("0"));
  EXPECT_FALSE(parse_version(""));
  EXPECT_LT((Version{0, 9, 1}), (Version{0, 10, 0}));
}

TEST(HfCache, TheSnapshotRefsMainNamesAndALocalDirectory) {
  const fs::path root = fs::temp_directory_path() / ("sb-hfcache-" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path repo = root / "models--meta-llama--Llama-3.2-1B";
  fs::create_directories(repo / "snapshots" / "aaa");
  fs::create_directories(repo / "snapshots" / "bbb");
  fs::create_directories(repo / "refs");
  std::ofstream(repo / "snapshots" / "aaa" / "config.json") << "{}";
  std::ofstream(repo / "snapshots" / "bbb" / "config.json") << "{}";
  std::ofstream(repo / "refs" / "main") << "aaa\n";
  EXPECT_EQ(find_model_config("meta-llama/Llama-3.2-1B", {root.string()}),
            (repo / "snapshots" / "aaa" / "config.json").string());
  EXPECT_EQ(find_model_config("meta-llama/Llama-3.2-3B", {root.string()}), "");
  EXPECT_EQ(find_model_config("../etc/passwd", {root.string()}), "");
  EXPECT_EQ(find_model_config((repo / "snapshots" / "bbb").string(), {}),
            (repo / "snapshots" / "bbb" / "config.json").string());
  fs::remove_all(root);
}

TEST(HfCache, AConfigJsonNamesTheFamily) {
  TrainConfig c = parse_axolotl_yaml_text("base_model: someone/my-finetune\n", "t.yml");
  apply_model_config_text(c, R"({"model_type": "gptj", "n_embd": 4096, "n_layer": 28, "n_head": 16})", "config.json");
  resolve_axolotl(c, TrainerSpec{});
  EXPECT_EQ(c.model_family, "gptj");
  EXPECT_EQ(c.attn_implementation, "eager");
  EXPECT_NE(c.packing_unavailable, "");
}

TEST(Plan, EverySettingWithItsSourceAndTheChecksTheConfigExcludes) {
  // examples/qwen2/dpo.yaml (v0.18.0): DPO forbids packing, bf16 auto, no loader key
  const TrainConfig c = resolved(
      "base_model: Qwen/Qwen2.5-0.5B\nrl: dpo\nsample_packing: false\nbf16: auto\nmicro_batch_size: 2\n"
      "gradient_accumulation_steps: 4\nattn_implementation: flash_attention_2\n");
  const std::string plan = format_plan(c, "dpo.yaml", "sim:h100", true, 60);
  for (const char* want : {"dataloader_num_workers         1", "default_dataloader_opts", "skipped: rl: dpo",
                           "dtype        skipped: already bf16 (t.yml:4)", "attention    skipped",
                           "micro_batch_size               2                  t.yml:5", "nothing measured"})
    EXPECT_NE(plan.find(want), std::string::npos) << want << "\n" << plan;
  // and the run's checks skip for the same reasons
  EXPECT_EQ(*skipped_by_config("padding", c), c.packing_unavailable);
  EXPECT_FALSE(skipped_by_config("padding", resolved("base_model: Qwen/Qwen2.5-0.5B\n")).has_value());
  EXPECT_TRUE(skipped_by_config("attention", resolved("base_model: EleutherAI/gpt-j-6b\n")) == std::nullopt);
}

TEST(AdapterMemory, LoraCountsTheAdaptersAndAFrozenBase) {
  // Llama-3-8B's config.json dims; LoRA r=16 on every linear layer: PEFT's print_trainable_parameters
  // gives 41,943,040 for it
  TrainConfig c = parse_axolotl_yaml_text(
      "adapter: qlora\nload_in_4bit: true\nlora_r: 16\nlora_target_linear: true\nmicro_batch_size: 1\n"
      "sequence_len: 2048\nbf16: true\nhidden_size: 4096\nnum_hidden_layers: 32\nnum_attention_heads: 32\n"
      "num_key_value_heads: 8\nintermediate_size: 14336\nvocab_size: 128256\n",
      "t.yml");
  const Adapter a = adapter_of(c);
  EXPECT_TRUE(a.on);
  EXPECT_EQ(a.base_bits, 4);
  EXPECT_EQ(adapter_parameters(c.model, a), 41943040u);
  // PEFT's default targets (q_proj, v_proj) at r=8: 8 x (8192 + 5120) x 32 = 3,407,872
  Adapter qv = a;
  qv.all_linear = false;
  qv.rank = 8;
  EXPECT_EQ(adapter_parameters(c.model, qv), 3407872u);
  batch::DecoderConfig d;
  d.micro_batch = 1;
  d.seq = 2048;
  d.d_model = 4096;
  d.d_ff = c.model.step_ffn();
  d.heads = 32;
  d.kv_heads = 8;
  d.layers = 32;
  d.dtype = DType::bf16;
  d.checkpointing = true;
  const auto q = full_depth_footprint(c.model, d, a), full = full_depth_footprint(c.model, d);
  EXPECT_EQ(q.trainable, 41943040u);
  EXPECT_EQ(full.trainable, full.parameters);
  // the 4-bit base: about 7e9 weights at 4.127 bits plus the adapters' 16 bytes each
  EXPECT_NEAR(double(q.parts["weights"].get<std::uint64_t>()), 6.98e9 * 4.127 / 8 + 41943040.0 * 4, 0.2e9);
  EXPECT_LT(q.total * 4, full.total);  // QLoRA needs a small share of a full fine-tune's memory
}

}  // namespace
}  // namespace sb::diagnose
