// `diagnose DIR` with a run's settings and event files (diagnose/run/run_diagnose, run_settings,
// curves' schedule): the real Trainer runs of tests/data/run (transformers 4.46.3 and 5.25.0: a
// plateau at a learning rate of 1e-7, fp32, no loader workers), the same runs with only their event
// files, a bf16 run with gradient checkpointing whose curves turn NaN, and a run directory whose
// training_args.bin names a forbidden global (exit 2, never executed).
#include <cstdio>      // std::fopen
#include <filesystem>  // std::filesystem
#include <string>      // std::string

#include <fmt/format.h>  // fmt::format
#include <gtest/gtest.h>

#include "diagnose/config.hpp"            // axolotl_card, parse_axolotl_yaml_text, source_of
#include "diagnose/run/curves.hpp"        // scheduled_lr
#include "diagnose/run/run_diagnose.hpp"  // diagnose_run, looks_like_run
#include "harness/errors.hpp"             // UsageError
#include "shared_data.hpp"                // sb::test::shared_data

namespace sb {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

const std::string kData = SB_TEST_DATA "/run";
const char* kVersions[] = {"transformers-4.46.3", "transformers-5.25.0"};

const json kMeta = json{{"device", {{"id", "cpu"}}}};

const Finding* finding(const Result& r, const std::string& check) {
  for (const auto& f : r.findings)
    if (f.evidence.value("check", std::string()) == check) return &f;
  return nullptr;
}
const Point* point(const Result& r, const std::string& check) {
  for (const auto& p : r.points)
    if (p.params.value("check", std::string()) == check) return &p;
  return nullptr;
}
std::string figures(const Finding& f) { return f.evidence.value("figures", json::array()).dump(); }

// A scratch directory, removed at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / fs::path("sb-run-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                                                "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

TEST(RunDiagnose, ARealRunsSettingsAndItsPlateauAtATinyLearningRate) {
  for (const char* v : kVersions) {
    SCOPED_TRACE(v);
    const std::string dir = kData + "/" + v + "/tiny_run";
    ASSERT_TRUE(diagnose::looks_like_run(dir));
    const Result r = diagnose::diagnose_run(dir, kMeta);
    const json& ta = r.meta["run"]["training_args"];
    EXPECT_EQ(ta["class"], "transformers.training_args.TrainingArguments");
    EXPECT_EQ(ta["fields"]["learning_rate"]["value"], 1e-7);
    EXPECT_EQ(ta["fields"]["learning_rate"]["source"], "TrainingArguments.learning_rate");
    EXPECT_EQ(ta["fields"]["world_size"]["source"], "TrainingArguments.distributed_state.num_processes");
    EXPECT_EQ(ta["fields"]["per_device_train_batch_size"]["value"], 4);
    EXPECT_EQ(r.meta["run"]["model"]["torch_dtype"], "float32");
    EXPECT_EQ(r.meta["run"]["trainer_state"], dir + "/trainer_state.json");
    // the plateau names the configured rate and schedule
    const Finding* p = finding(r, "plateau");
    ASSERT_TRUE(p) << to_json(r).dump(1);
    EXPECT_EQ(p->cause, "numerical stall: a learning rate too low");
    EXPECT_NE(figures(*p).find("configured (training_args.bin): learning_rate 1e-07, lr_scheduler_type constant, "
                               "warm-up 0 steps of 48"),
              std::string::npos)
        << figures(*p);
    EXPECT_NE(figures(*p).find("100x under even a full fine-tune's usual 1e-5"), std::string::npos) << figures(*p);
    // what the settings prove: fp32 throughout (config.json float32), no loader workers; no recompute
    const Finding* d = finding(r, "dtype");
    ASSERT_TRUE(d);
    EXPECT_EQ(d->summary.rfind("assumed gain", 0), 0u) << d->summary;
    EXPECT_NE(d->summary.find("fp32 throughout"), std::string::npos) << d->summary;
    const Finding* l = finding(r, "loader");
    ASSERT_TRUE(l);
    EXPECT_EQ(l->summary.rfind("assumed cost", 0), 0u) << l->summary;
    EXPECT_EQ(l->evidence["command"], "stallbench run dataloader -p workers=0,2,4 --device cpu");
    EXPECT_FALSE(finding(r, "recompute"));
    const Point* s = point(r, "settings");
    ASSERT_TRUE(s);
    EXPECT_NE(s->info["reading"].get<std::string>().find("no mixed precision"), std::string::npos);
    // tokens/s from the Trainer's FLOP count over the parameters of the run's config.json (GPT-2, 2 layers of
    // 32): the run fed 48 steps x 4 samples x 32 tokens; the count left out biases and norms (about 4% here)
    const Point* t = point(r, "throughput");
    ASSERT_TRUE(t && t->metric("samples_per_s") && t->metric("tokens_per_s") && t->metric("model_tflops"))
        << to_json(r).dump(1);
    const double runtime = t->metric("train_runtime_s")->value;
    EXPECT_NEAR(t->metric("tokens_per_s")->value, 48 * 4 * 32 / runtime, 0.05 * 48 * 4 * 32 / runtime);
    EXPECT_EQ(r.meta["run"]["dims"]["hidden_size"], 32);
    const std::string reading = t->info["reading"].get<std::string>();
    EXPECT_NE(reading.find("about 33 tokens per sample"), std::string::npos) << reading;
    EXPECT_NE(reading.find("MFU: name the GPU (--gpu h100)"), std::string::npos) << reading;
    EXPECT_FALSE(t->metric("mfu_pct"));  // on the cpu device, no GPU named
    // the event file is there, and said not read (the state holds the same log)
    EXPECT_NE(r.meta["run"]["not_read"].dump().find("events.out.tfevents.*: trainer_state.json holds the same log"),
              std::string::npos);
  }
}

TEST(RunDiagnose, TheSameRunFromItsEventFilesAlone) {
  for (const char* v : kVersions) {
    SCOPED_TRACE(v);
    const std::string dir = kData + "/" + v + "/tiny_run_tb_only";
    ASSERT_TRUE(diagnose::looks_like_run(dir));
    const Result r = diagnose::diagnose_run(dir, kMeta);
    EXPECT_EQ(r.meta["run"]["curves"], dir + "/runs/tiny/events.out.tfevents.0.tiny");
    EXPECT_EQ(r.meta["run"]["trainer_state"], "");
    EXPECT_EQ(r.meta["run"]["training_logs"], 24);
    EXPECT_EQ(r.meta["run"]["max_steps"], 48);  // from training_args.bin: the events do not say
    const Finding* p = finding(r, "plateau");
    ASSERT_TRUE(p);
    EXPECT_EQ(p->cause, "numerical stall: a learning rate too low");
    const Point* best = point(r, "best");
    ASSERT_TRUE(best);
    EXPECT_EQ(best->status, Status::skipped);
    EXPECT_NE(best->reason.find("event files"), std::string::npos);
    const Point* t = point(r, "throughput");
    ASSERT_TRUE(t && t->metric("samples_per_s"));
  }
}

TEST(RunDiagnose, ABf16RunWithCheckpointingWhoseCurvesTurnNaN) {
  const TempDir tmp;
  fs::create_directories(tmp.path / "runs" / "x");
  fs::copy_file(kData + "/transformers-5.25.0/bf16_w4_gc.bin", tmp.path / "training_args.bin");
  fs::copy_file(kData + "/hf_tags_nan.tfevents", tmp.path / "runs" / "x" / "events.out.tfevents.1.host");
  const Result r = diagnose::diagnose_run(tmp.path.string(), kMeta);
  const Finding* n = finding(r, "nan");
  ASSERT_TRUE(n);
  EXPECT_EQ(n->evidence["step"], 25);
  EXPECT_EQ(n->summary.rfind("grad_norm is NaN at step 25, and the loss is NaN from step 30 (12 of 40 logs", 0), 0u)
      << n->summary;
  EXPECT_NE(figures(*n).find("no loss scaler"), std::string::npos) << figures(*n);
  EXPECT_EQ(n->evidence["change"].get<std::string>().find("instead of fp16"), std::string::npos);
  EXPECT_FALSE(finding(r, "dtype"));
  EXPECT_FALSE(finding(r, "loader"));
  const Finding* g = finding(r, "recompute");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->summary.rfind("modelled cost", 0), 0u);
  EXPECT_NE(point(r, "settings")->info["reading"].get<std::string>().find("bf16 mixed precision"), std::string::npos);
  // the curve findings first, by step, then the settings'
  EXPECT_EQ(r.findings.front().evidence["check"], "nan");
  EXPECT_EQ(r.findings.back().evidence["check"], "recompute");
}

// A log without learning_rate: the plateau takes the configured peak, and the schedule says where it was.
TEST(RunDiagnose, APlateauWithoutALoggedRateTakesTheConfiguredSchedule) {
  const TempDir tmp;
  fs::copy_file(kData + "/transformers-4.46.3/bf16_w4_gc.bin", tmp.path / "training_args.bin");  // cosine, warm-up 100 of 1000
  std::string log = "{\"global_step\": 900, \"max_steps\": 1000, \"log_history\": [";
  for (int step = 500; step <= 900; step += 10)
    log += fmt::format("{}{{\"step\": {}, \"epoch\": 1.0, \"loss\": {}}}", step == 500 ? "" : ",", step,
                       1.0 + 0.001 * (step % 20 == 0));
  std::FILE* f = std::fopen((tmp.path / "trainer_state.json").c_str(), "w");
  ASSERT_TRUE(f);
  std::fputs((log + "]}").c_str(), f);
  std::fclose(f);
  const Result r = diagnose::diagnose_run(tmp.path.string(), kMeta);
  const Finding* p = finding(r, "plateau");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->cause, "numerical stall: plateau");  // 2e-4 is no low rate
  EXPECT_NE(p->summary.find("at a learning rate of 0.0002 peak (configured)"), std::string::npos) << p->summary;
  // cosine after 100 warm-up steps of 1000: at step 500, 0.5 (1 + cos(pi 400/900)) = 58.7% of the peak
  EXPECT_NE(figures(*p).find("the schedule gives 0.0001174 at step 500, where it flattened (59% of the peak)"),
            std::string::npos)
      << figures(*p);
}

TEST(RunDiagnose, AForbiddenGlobalInTheRunIsExit2NamingIt) {
  const TempDir tmp;
  fs::copy_file(kData + "/forbidden_global.bin", tmp.path / "training_args.bin");
  fs::copy_file(kData + "/transformers-5.25.0/tiny_run/trainer_state.json", tmp.path / "trainer_state.json");
  try {
    diagnose::diagnose_run(tmp.path.string(), kMeta);
    FAIL() << "read";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("global os.system refused"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("at offset 2"), std::string::npos) << e.what();
  }
}

TEST(RunDiagnose, WhatIsARun) {
  const TempDir tmp;
  EXPECT_FALSE(diagnose::looks_like_run(tmp.path.string()));
  EXPECT_THROW(diagnose::diagnose_run(tmp.path.string(), kMeta), UsageError);
  fs::copy_file(kData + "/transformers-4.46.3/defaults.bin", tmp.path / "training_args.bin");
  EXPECT_TRUE(diagnose::looks_like_run(tmp.path.string()));
  // settings only: the curve checks skipped, the settings' findings made
  const Result r = diagnose::diagnose_run(tmp.path.string(), kMeta);
  EXPECT_EQ(point(r, "nan")->status, Status::skipped);
  EXPECT_TRUE(finding(r, "loader"));
  EXPECT_NE(finding(r, "dtype")->summary.find("unless the model was loaded in half precision"), std::string::npos);
}

// The throughput of real runs (../shared/trainer-logs), read as the Trainer computed it: each file copied
// into a run directory of its own as trainer_state.json.
std::string real_log(const std::string& prefix) {
  const std::string dir = test::shared_data("trainer-logs");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(prefix, 0) == 0) return e.path().string();
  return {};
}
struct RealRun {
  TempDir tmp;
  bool ok = false;
  explicit RealRun(const std::string& prefix) {
    const std::string f = real_log(prefix);
    if (f.empty()) return;
    fs::copy_file(f, tmp.path / "trainer_state.json");
    ok = true;
  }
  Result diagnose(const std::string& gpu = "", std::int64_t world = 0) const {
    diagnose::RunOptions o;
    o.gpu = gpu;
    o.world_size = world;
    return diagnose::diagnose_run(tmp.path.string(), kMeta, o);
  }
};
// Why a test of a real run skips: the logs are not in the repository.
std::string no_real_logs() {
  return "the real trainer logs are expected in " + test::shared_data("trainer-logs");
}

// Whisper stopped early at step 1500 of max_steps 10990: the Trainer's summary divides the planned run's
// steps and samples by the time the run took (12.276 samples/s, 0.384 steps/s); really 1500 steps in
// 28624.551 s at 32 samples a step. Its total_flos counts the log-mel features as tokens: 5694 TFLOP/s on
// its one GPU (the per-device batch is the step's 32 samples), past any GPU: not model FLOPs, said, no MFU.
TEST(RunThroughput, AnEarlyStoppedRunIsReadOverTheStepsItTrained) {
  RealRun run("ByErenOzer__Whisper_Finetune");
  if (!run.ok) GTEST_SKIP() << no_real_logs();
  const Result r = run.diagnose("h100");
  const Point* t = point(r, "throughput");
  ASSERT_TRUE(t && t->metric("steps_per_s") && t->metric("samples_per_s_logged")) << to_json(r).dump(1);
  EXPECT_NEAR(t->metric("steps_per_s")->value, 1500 / 28624.551, 1e-9);
  EXPECT_NEAR(t->metric("samples_per_s")->value, 32 * 1500 / 28624.551, 1e-9);
  EXPECT_DOUBLE_EQ(t->metric("samples_per_s_logged")->value, 12.276);
  EXPECT_NE(t->info["warning"].get<std::string>().find("stopped at step 1500 of max_steps 10990"), std::string::npos);
  EXPECT_NE(t->info["warning"].get<std::string>().find("7.3x over"), std::string::npos);
  EXPECT_FALSE(t->metric("model_tflops"));
  EXPECT_FALSE(t->metric("mfu_pct"));
  EXPECT_EQ(t->info["flops"].get<std::string>().rfind("not model FLOPs", 0), 0u) << t->info["flops"];
  EXPECT_FALSE(finding(r, "mfu"));
  EXPECT_TRUE(finding(r, "early_stopping"));  // the curves' own finding is unchanged
}

// Mistral-7B SFT in bf16 (the healthy run): total_flos 2.3807e18 over 20387.7 s is 116.8 TFLOP/s of model
// FLOPs. 16 samples a step over a per-device batch of 1: 1 to 16 GPUs, unknown without training_args.bin.
// On an H100 that is at most 11.8% MFU (one GPU; more only lower it): a finding, measured. On an A100
// (312 TFLOP/s bf16) up to 37%: not low enough to say without the GPUs' count; with --world-size 4 it is 9.4%.
TEST(RunThroughput, TheTrainersFlopCountOverTheGpusPeakIsTheMfu) {
  RealRun run("syGOAT__Mistral-v0.2");
  if (!run.ok) GTEST_SKIP() << no_real_logs();
  const double rate = 2.380746355434848e18 / 20387.7129 / 1e12;
  {
    const Result r = run.diagnose("h100");
    const Point* t = point(r, "throughput");
    ASSERT_TRUE(t && t->metric("model_tflops") && t->metric("mfu_pct") && t->metric("mfu_pct_min"));
    EXPECT_NEAR(t->metric("model_tflops")->value, rate, 1e-9);
    EXPECT_NEAR(t->metric("mfu_pct")->value, 100 * rate / 989.4, 1e-6);
    EXPECT_NEAR(t->metric("mfu_pct_min")->value, 100 * rate / (16 * 989.4), 1e-6);
    EXPECT_EQ(t->info["gpus"], "1 to 16: 16 samples per step over a per-device batch of 1, the accumulation unknown "
                               "(--world-size N)");
    EXPECT_EQ(t->info["gpu"]["dtype_from"], "assumed bf16 (neither training_args.bin nor config.json says)");
    const Finding* f = finding(r, "mfu");
    ASSERT_TRUE(f);
    EXPECT_EQ(f->cause, "low model FLOPs utilization");
    EXPECT_EQ(f->summary, "measured: MFU at most 11.8% on h100-sxm (bf16); tuned training reaches 38-43%: a trace "
                          "names why");
    EXPECT_EQ(f->evidence["basis"].get<std::string>().rfind("measured", 0), 0u);
    EXPECT_EQ(r.findings.front().cause, f->cause);  // a healthy run: the only finding
  }
  {
    const Result r = run.diagnose("a100");
    const Point* t = point(r, "throughput");
    ASSERT_TRUE(t && t->metric("mfu_pct"));
    EXPECT_NEAR(t->metric("mfu_pct")->value, 100 * rate / 312, 1e-6);
    EXPECT_FALSE(finding(r, "mfu"));
  }
  {
    const Result r = run.diagnose("a100", 4);
    const Point* t = point(r, "throughput");
    ASSERT_TRUE(t && t->metric("mfu_pct"));
    EXPECT_NEAR(t->metric("mfu_pct")->value, 100 * rate / (4 * 312), 1e-6);
    EXPECT_FALSE(t->metric("mfu_pct_min"));
    EXPECT_EQ(t->info["gpus"], "--world-size");
    EXPECT_TRUE(finding(r, "mfu"));
  }
  {
    const Result r = run.diagnose();  // no GPU named, the cpu device: the rate, and how to get the MFU
    const Point* t = point(r, "throughput");
    ASSERT_TRUE(t && t->metric("model_tflops"));
    EXPECT_FALSE(t->metric("mfu_pct"));
    EXPECT_FALSE(finding(r, "mfu"));
  }
  {  // the device names the GPU when it is one (sim:h100)
    diagnose::RunOptions o;
    const Result r = diagnose::diagnose_run(run.tmp.path.string(), json{{"device", {{"id", "sim:h100-sxm"}}}}, o);
    const Point* t = point(r, "throughput");
    ASSERT_TRUE(t && t->metric("mfu_pct"));
    EXPECT_EQ(t->info["gpu"]["named_by"], "--device sim:h100-sxm");
  }
  EXPECT_THROW(run.diagnose("h"), UsageError);  // h100-sxm and h200-sxm: name one
  const Result unknown = run.diagnose("mi300x");
  EXPECT_NE(point(unknown, "throughput")->info["warning"].get<std::string>().find("no expected numbers for that GPU"),
            std::string::npos);
}

// TRL's DPO trainer counts no FLOPs (total_flos 0); the NaN run keeps its NaN first, the MFU after it.
TEST(RunThroughput, NoCountNoRateAndTheCurvesComeFirst) {
  RealRun dpo("Silver-8ce__llamaTest");
  if (!dpo.ok) GTEST_SKIP() << no_real_logs();
  const Result r = dpo.diagnose("h100");
  const Point* t = point(r, "throughput");
  ASSERT_TRUE(t);
  EXPECT_FALSE(t->metric("model_tflops"));
  EXPECT_NE(t->info["flops"].get<std::string>().find("does not count FLOPs"), std::string::npos);
  RealRun nan("ChenguangYang96UCR__KG-LLM");
  if (!nan.ok) GTEST_SKIP() << no_real_logs();
  const Result n = nan.diagnose("h100");
  ASSERT_GE(n.findings.size(), 2u);
  EXPECT_EQ(n.findings.front().evidence["check"], "nan");
  EXPECT_TRUE(finding(n, "mfu"));
}

// Axolotl's model card (README.md in output_dir; Axolotl's setup_model_card embeds the config it ran with,
// "axolotl version: `X`" and a ```yaml block under "See axolotl config", as Hub cards of Axolotl runs show).
// tests/data/run/axolotl-card/README.md is one in that shape, written for the real Mistral SFT log: 16
// samples a step over micro batch 1 x 4 accumulated is 4 GPUs; bf16: auto is bf16.
TEST(AxolotlCard, TheConfigInTheModelCardIsReadAtItsLines) {
  const std::string file = kData + "/axolotl-card/README.md";
  std::FILE* f = std::fopen(file.c_str(), "rb");
  ASSERT_TRUE(f);
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  const auto card = diagnose::axolotl_card(text);
  ASSERT_TRUE(card);
  EXPECT_EQ(card->version, "0.9.1.post1");
  const diagnose::TrainConfig c = diagnose::parse_axolotl_yaml_text(text, file);
  EXPECT_EQ(c.card_axolotl_version, "0.9.1.post1");
  EXPECT_EQ(c.micro_batch_size, 1);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  EXPECT_EQ(c.sequence_len, 1024);
  EXPECT_EQ(c.base_model, "mistralai/Mistral-7B-v0.1");
  // the line a key has in the card, not in the block
  std::size_t line = 1;
  for (std::size_t i = 0; i < text.find("micro_batch_size: 1"); ++i) line += text[i] == '\n';
  EXPECT_EQ(diagnose::source_of(c, "micro_batch_size"), fmt::format("{}:{}", file, line));
  // not a card, a card cut short, a card in a card
  EXPECT_FALSE(diagnose::axolotl_card("# a model\n```yaml\nbf16: true\n```\n"));
  const std::string head = "<details><summary>See axolotl config</summary>\n\naxolotl version: `0.4.1`\n";
  EXPECT_THROW(diagnose::axolotl_card(head + "no block\n"), UsageError);
  EXPECT_THROW(diagnose::axolotl_card(head + "```yaml\nbf16: true\n"), UsageError);
  EXPECT_THROW(diagnose::axolotl_card(head + "```yaml\n" + head + "```yaml\nx: 1\n```\n```\n"), UsageError);
  const auto bare = diagnose::axolotl_card("<summary>See axolotl config</summary>\n```yaml\nbf16: true\n```\n");
  ASSERT_TRUE(bare);
  EXPECT_EQ(bare->version, "");
  EXPECT_EQ(bare->yaml, "\n\nbf16: true\n");  // bf16 on its line of the card, the third
}

TEST(AxolotlCard, ARunWithItsCardInfersTheGpusAndNamesTheConfigsCandidates) {
  RealRun run("syGOAT__Mistral-v0.2");
  if (!run.ok) GTEST_SKIP() << no_real_logs();
  fs::copy_file(kData + "/axolotl-card/README.md", run.tmp.path / "README.md");
  const Result r = run.diagnose("h100");
  const json& ax = r.meta["run"]["axolotl"];
  EXPECT_EQ(ax["axolotl_version"], "0.9.1.post1");
  EXPECT_EQ(ax["defaults_of"], "0.9.1");
  EXPECT_EQ(ax["attn_implementation"], "sdpa");  // Mistral under flash_attention: false loads SDPA
  EXPECT_EQ(ax["dataloader_num_workers"], 0);     // before 0.11.0, HF's default
  const Point* t = point(r, "throughput");
  ASSERT_TRUE(t && t->metric("mfu_pct") && t->metric("tokens_per_s_upper"));
  const double rate = 2.380746355434848e18 / 20387.7129 / 1e12;
  EXPECT_NEAR(t->metric("mfu_pct")->value, 100 * rate / (4 * 989.4), 1e-6);
  EXPECT_FALSE(t->metric("mfu_pct_min"));
  EXPECT_EQ(t->info["gpus"], "inferred: 16 samples per step / (per-device batch 1 x accumulation 4)");
  EXPECT_EQ(t->info["gpu"]["dtype_from"], "the Axolotl config's bf16");
  EXPECT_NEAR(t->metric("tokens_per_s_upper")->value, 6.796 * 1024, 1e-9);
  const Finding* f = finding(r, "mfu");
  ASSERT_TRUE(f);
  EXPECT_NE(figures(*f).find("sample_packing off, no loader workers, micro_batch_size 1, gradient checkpointing"),
            std::string::npos)
      << figures(*f);
  EXPECT_EQ(f->evidence["command"], "stallbench diagnose " + (run.tmp.path / "README.md").string() +
                                        " (each cause of its config, measured)");
  EXPECT_NE(point(r, "settings")->info["reading"].get<std::string>().find("axolotl 0.9.1.post1"), std::string::npos);
  // a card whose config cannot be read is said, the run still read
  {
    std::FILE* w = std::fopen((run.tmp.path / "README.md").c_str(), "wb");
    ASSERT_TRUE(w);
    std::fputs("<summary>See axolotl config</summary>\n```yaml\nmicro_batch_size: -3\n```\n", w);
    std::fclose(w);
    const Result bad = run.diagnose("h100");
    EXPECT_TRUE(bad.meta["run"]["axolotl"].contains("ignored"));
    EXPECT_TRUE(point(bad, "throughput")->metric("mfu_pct_min"));  // back to a range of GPUs
  }
}

TEST(Schedule, TransformersSchedulersAtTheirSteps) {
  TrainingArgs a;
  a.learning_rate = 1e-4;
  a.warmup_steps = 10;
  a.lr_scheduler_type = "linear";
  EXPECT_DOUBLE_EQ(*diagnose::scheduled_lr(a, 110, 5), 5e-5);
  EXPECT_DOUBLE_EQ(*diagnose::scheduled_lr(a, 110, 60), 5e-5);
  EXPECT_DOUBLE_EQ(*diagnose::scheduled_lr(a, 110, 110), 0.0);
  a.lr_scheduler_type = "cosine";
  EXPECT_NEAR(*diagnose::scheduled_lr(a, 110, 60), 5e-5, 1e-15);
  EXPECT_NEAR(*diagnose::scheduled_lr(a, 110, 10), 1e-4, 1e-15);
  a.lr_scheduler_type = "constant";
  EXPECT_DOUBLE_EQ(*diagnose::scheduled_lr(a, 110, 3), 1e-4);  // constant has no warm-up
  a.lr_scheduler_type = "constant_with_warmup";
  EXPECT_DOUBLE_EQ(*diagnose::scheduled_lr(a, 0, 3), 3e-5);
  a.lr_scheduler_type = "polynomial";
  EXPECT_FALSE(diagnose::scheduled_lr(a, 110, 3));
  // warm-up as a ratio: warmup_ratio (transformers 4), a warmup_steps under 1 (transformers 5)
  a.warmup_steps.reset();
  a.warmup_ratio = 0.1;
  EXPECT_EQ(diagnose::warmup_of(a, 95), 10);
  a.warmup_ratio.reset();
  a.warmup_steps = 0.05;
  EXPECT_EQ(diagnose::warmup_of(a, 200), 10);
}

}  // namespace
}  // namespace sb
