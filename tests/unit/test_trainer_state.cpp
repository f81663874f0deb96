// A Trainer's trainer_state.json (readers/trainer_state) and the numerics detectors on its curves
// (diagnose/run/curves): hostile and version-shaped files made here, then the twelve real runs of
// ../shared/trainer-logs (STALLBENCH_SHARED_DATA overrides the place), each held to what its
// README says it shows. Those tests skip, naming the place, where the data is absent.
#include <algorithm>   // std::any_of
#include <cmath>       // std::isnan, std::isinf
#include <cstdlib>     // std::getenv
#include <filesystem>  // std::filesystem::exists
#include <string>      // std::string

#include <gtest/gtest.h>

#include "diagnose/run/curves.hpp"    // analyze_curves, logged_throughput
#include "harness/errors.hpp"         // UsageError
#include "readers/trainer_state.hpp"  // parse_trainer_state
#include "shared_data.hpp"  // sb::test::shared_data

namespace sb {
namespace {

using diagnose::analyze_curves;
using diagnose::CurveFinding;
using diagnose::logged_throughput;

std::string usage_error(const std::string& text) {
  try {
    parse_trainer_state(text, "ts.json");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// A log of training entries {step, loss, grad_norm, lr} as the Trainer writes it.
std::string log_of(const std::vector<std::tuple<int, std::string, std::string, double>>& rows,
                   const std::string& extra = "") {
  std::string s = "{\n  \"global_step\": " + std::to_string(rows.empty() ? 0 : std::get<0>(rows.back())) +
                  ",\n  \"log_history\": [\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& [step, loss, gn, lr] = rows[i];
    s += "    {\"epoch\": 0.1, \"grad_norm\": " + gn + ", \"learning_rate\": " + std::to_string(lr) +
         ", \"loss\": " + loss + ", \"step\": " + std::to_string(step) + "}" + (i + 1 < rows.size() ? ",\n" : "\n");
  }
  return s + "  ]" + extra + "\n}\n";
}

TEST(TrainerStateReader, NonFiniteTokensAreNumbersAndStringsStayStrings) {
  std::size_t n = 0;
  EXPECT_EQ(quote_nonfinite_tokens(R"({"a": NaN, "b": [Infinity,-Infinity], "c": "NaN is a word"})", &n),
            R"({"a": "NaN", "b": ["Infinity","-Infinity"], "c": "NaN is a word"})");
  EXPECT_EQ(n, 3u);
  EXPECT_EQ(quote_nonfinite_tokens(R"({"x": NaNa, "y": "say \"NaN\""})", &n), R"({"x": NaNa, "y": "say \"NaN\""})");
  EXPECT_EQ(n, 0u);
  const TrainerState s = parse_trainer_state(log_of({{1, "NaN", "Infinity", 1e-4}, {2, "0.5", "-Infinity", 1e-4}}), "ts.json");
  ASSERT_EQ(s.log.size(), 2u);
  EXPECT_TRUE(std::isnan(*s.log[0].loss));
  EXPECT_TRUE(std::isinf(*s.log[0].grad_norm));
  EXPECT_LT(*s.log[1].grad_norm, 0);
}

TEST(TrainerStateReader, HostileFilesAreExit2NamingTheFileAndField) {
  EXPECT_NE(usage_error("{\"log_history\": [").find("ts.json"), std::string::npos);  // truncated
  EXPECT_NE(usage_error("{\"global_step\": 3}").find("no log_history"), std::string::npos);
  EXPECT_NE(usage_error("[1, 2]").find("ts.json"), std::string::npos);
  EXPECT_NE(usage_error(R"({"log_history": [{"step": "five", "loss": 1}]})").find("step"), std::string::npos);
  EXPECT_NE(usage_error(R"({"log_history": [{"step": 5, "loss": "high"}]})").find("loss"), std::string::npos);
  EXPECT_NE(usage_error(R"({"log_history": [{"step": -5, "loss": 1}]})").find("step"), std::string::npos);
  EXPECT_NE(usage_error(R"({"log_history": [{"step": 1e400}]})").find("ts.json"), std::string::npos);
  EXPECT_NE(usage_error(R"({"log_history": {}})").find("log_history"), std::string::npos);
  EXPECT_EQ(usage_error(R"({"log_history": []})"), "");  // an empty log is a log
}

TEST(TrainerStateReader, TheSummaryTheBestCheckpointAndEarlyStopping) {
  const TrainerState s = parse_trainer_state(R"({
    "best_metric": 0.2317, "best_model_checkpoint": "/x/output/checkpoint-800/", "global_step": 2200,
    "max_steps": 2315, "eval_steps": 200,
    "stateful_callbacks": {"EarlyStoppingCallback": {"args": {"early_stopping_patience": 5,
                           "early_stopping_threshold": 0.0}, "attributes": {"early_stopping_patience_counter": 2}}},
    "log_history": [
      {"epoch": 1.0, "learning_rate": 1e-5, "loss": 0.5, "step": 100},
      {"epoch": 1.0, "eval_loss": 0.3, "eval_accuracy": 0.9, "eval_runtime": 3.0, "step": 100},
      {"epoch": 2.0, "step": 200, "train_runtime": 100.5, "train_samples_per_second": 12.5,
       "train_steps_per_second": 0.4, "train_loss": 0.45, "total_flos": 1e18}]})",
                                             "ts.json");
  EXPECT_EQ(*s.best_global_step, 800);  // from the checkpoint's name where best_global_step is absent
  EXPECT_EQ(*s.early_stopping_patience, 5);
  EXPECT_EQ(*s.early_stopping_patience_counter, 2);
  ASSERT_EQ(s.log.size(), 2u);  // the summary is no log entry
  EXPECT_TRUE(s.log[1].is_eval());
  EXPECT_EQ(s.log[1].eval.count("eval_accuracy"), 1u);
  EXPECT_EQ(s.log[1].eval.count("eval_runtime"), 0u);
  EXPECT_DOUBLE_EQ(*s.train_samples_per_second, 12.5);
  EXPECT_TRUE(logged_throughput(s).present);
}

const CurveFinding* kind(const std::vector<CurveFinding>& f, const std::string& k) {
  for (const auto& x : f)
    if (x.kind == k) return &x;
  return nullptr;
}

TEST(Curves, ARecoveredSpikeIsNoDivergenceAndASustainedOneIs) {
  std::vector<std::tuple<int, std::string, std::string, double>> rows;
  for (int i = 1; i <= 40; ++i) rows.push_back({i, std::to_string(2.0 / i + 0.3), "1.0", 1e-4});
  std::get<1>(rows[20]) = "3.0";  // one log over 3x: noise
  std::get<1>(rows[21]) = "3.0";  // and a second: still back down at the end, under 5 logs
  EXPECT_EQ(kind(analyze_curves(parse_trainer_state(log_of(rows), "a")), "divergence"), nullptr);
  for (int i = 20; i < 40; ++i) std::get<1>(rows[std::size_t(i)]) = "9.0";
  const auto f = analyze_curves(parse_trainer_state(log_of(rows), "b"));
  ASSERT_NE(kind(f, "divergence"), nullptr);
  EXPECT_EQ(kind(f, "divergence")->step, 21);
  EXPECT_EQ(kind(f, "plateau"), nullptr);  // a flat curve after a divergence is the divergence's
}

TEST(Curves, APlateauNeedsAFlatSecondHalfAboveZero) {
  std::vector<std::tuple<int, std::string, std::string, double>> rows;
  for (int i = 1; i <= 20; ++i) rows.push_back({i * 50, i < 5 ? "2.0" : "1.0", "1.0", 5e-6});
  const auto f = analyze_curves(parse_trainer_state(log_of(rows), "a"));
  ASSERT_NE(kind(f, "plateau"), nullptr);
  EXPECT_EQ(kind(f, "plateau")->step, 250);
  EXPECT_EQ(kind(f, "plateau")->basis, "assumed");  // the low learning rate as the cause is a judgement
  // with adapters known (adapter_config.json), the reading says so and by how much the rate is under
  const auto lora = analyze_curves(parse_trainer_state(log_of(rows), "a"), {true, "LORA r=16 on q_proj, v_proj"});
  ASSERT_NE(kind(lora, "plateau"), nullptr);
  const auto& ev = kind(lora, "plateau")->evidence;
  EXPECT_TRUE(std::any_of(ev.begin(), ev.end(), [](const std::string& e) {
    return e.find("LORA r=16 on q_proj, v_proj") != std::string::npos && e.find("20x under") != std::string::npos;
  })) << ev[1];
  for (auto& r : rows) std::get<1>(r) = "0.001";  // converged to ~0: no plateau to fix
  EXPECT_EQ(kind(analyze_curves(parse_trainer_state(log_of(rows), "b")), "plateau"), nullptr);
}

// ---- the real runs -------------------------------------------------------------------------------

std::string shared_logs() { return test::shared_data("trainer-logs"); }

struct Real {
  const char* file;
  const char* first_kind;  // "" = nothing found (a healthy run)
  std::int64_t first_step;
  double samples_per_s;  // 0 = no summary
};

// What each file's README row says it shows (../shared/trainer-logs/README.md).
const Real kReal[] = {
    {"5hiri__Fine-Tuning-LLM-Test__unsloth-gradnorm-nan-inf", "nan", 5, 0},
    {"ByErenOzer__Whisper_Finetune__whisper-earlystop-patience5", "early_stopping", 250, 12.276},
    {"ChenguangYang96UCR__KG-LLM__fp16-gradnorm-nan", "nan", 1, 1.684},
    {"Francis-xsc__BERT_Weibo_Rumor__bert-healthy-old", "", -1, 277.239},
    {"Rishikarpe__LoRA-Fine-Tuning__zero-loss-zero-grad", "vanishing", 10, 0},
    {"ShashankBommana__DNABERT-2__best800-last2200", "past_best", 800, 0},
    {"Silver-8ce__llamaTest__trl-dpo-lr5e-7", "", -1, 8.826},
    {"TANGHULU6__Llama3-8B-Mob__lr-rewarm-divergence", "divergence", 8, 0},
    {"armenkarakashian__TrOcr-Number-Line-Fraction-Recognition__trocr-gradnorm-millions", "exploding", 2, 0},
    {"poludmik__qlora-fine-tune__lr5-divergence", "divergence", 2, 0.577},
    {"syGOAT__Mistral-v0.2-Translator-bf16__mistral-sft-healthy", "", -1, 6.796},
    {"yevvonlim__CAS4133-hw2__flat-loss-lr1e-5", "plateau", 450, 0},
};

TEST(CurvesOnRealRuns, EachNamesWhatItsReadmeSaysAtTheRealStep) {
  const std::string dir = shared_logs();
  if (!std::filesystem::exists(dir))
    GTEST_SKIP() << "the real trainer logs are expected in " << dir << " (../shared/trainer-logs; set "
                 << "STALLBENCH_SHARED_DATA to the folder that holds trainer-logs/)";
  for (const Real& r : kReal) {
    SCOPED_TRACE(r.file);
    const TrainerState s = read_trainer_state(dir + "/" + r.file + ".trainer_state.json");
    const auto f = analyze_curves(s);
    if (*r.first_kind == '\0') {
      EXPECT_TRUE(f.empty()) << f.front().kind << ": " << f.front().summary;
    } else {
      ASSERT_FALSE(f.empty());
      EXPECT_EQ(f.front().kind, r.first_kind) << f.front().summary;
      EXPECT_EQ(f.front().step, r.first_step) << f.front().summary;
      EXPECT_FALSE(f.front().reproduce.empty());
    }
    const auto t = logged_throughput(s);
    EXPECT_EQ(t.present, r.samples_per_s > 0);
    if (t.present) EXPECT_DOUBLE_EQ(t.samples_per_s, r.samples_per_s);
  }
}

TEST(CurvesOnRealRuns, TheFiguresTheReadmeGives) {
  const std::string dir = shared_logs();
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "the real trainer logs are expected in " << dir;
  // 5hiri: NaN at 5 and Infinity at 18
  auto f = analyze_curves(read_trainer_state(dir + "/5hiri__Fine-Tuning-LLM-Test__unsloth-gradnorm-nan-inf.trainer_state.json"));
  EXPECT_NE(f.front().summary.find("steps 5, 18"), std::string::npos) << f.front().summary;
  // TANGHULU: resumed at 1500 (the epoch goes back), grad_norm's highest 2.2e7, best eval at 1500
  const TrainerState t = read_trainer_state(dir + "/TANGHULU6__Llama3-8B-Mob__lr-rewarm-divergence.trainer_state.json");
  EXPECT_TRUE(t.resumed);
  f = analyze_curves(t);
  ASSERT_NE(kind(f, "exploding"), nullptr);
  EXPECT_NE(kind(f, "exploding")->summary.find("2.215e+07"), std::string::npos) << kind(f, "exploding")->summary;
  ASSERT_NE(kind(f, "past_best"), nullptr);
  EXPECT_EQ(kind(f, "past_best")->step, 1500);
  // Whisper: the callback's patience 5 fired, 1250 steps after the best
  f = analyze_curves(read_trainer_state(dir + "/ByErenOzer__Whisper_Finetune__whisper-earlystop-patience5.trainer_state.json"));
  EXPECT_NE(f.front().summary.find("1250 steps"), std::string::npos) << f.front().summary;
  // lr5: 7.2x at step 2
  f = analyze_curves(read_trainer_state(dir + "/poludmik__qlora-fine-tune__lr5-divergence.trainer_state.json"));
  EXPECT_NE(f.front().summary.find("(7.2x)"), std::string::npos) << f.front().summary;
}

}  // namespace
}  // namespace sb
