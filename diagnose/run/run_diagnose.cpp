// diagnose on a run directory (run_diagnose.hpp): find trainer_state.json, read its curves, report.
#include "diagnose/run/run_diagnose.hpp"

#include <filesystem>    // std::filesystem
#include <system_error>  // std::error_code

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "diagnose/run/curves.hpp"    // analyze_curves, logged_throughput
#include "harness/errors.hpp"         // UsageError
#include "harness/files.hpp"          // read_regular_file
#include "harness/json_read.hpp"      // parse_json_text
#include "harness/text.hpp"           // parse_whole
#include "readers/trainer_state.hpp"  // read_trainer_state

namespace sb::diagnose {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

constexpr const char* kStateFile = "trainer_state.json";

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// The run's trainer_state.json: the directory's own (written when training ends), else the newest
// checkpoint-N/'s (N the largest), else "".
std::string state_file(const std::string& path) {
  std::error_code ec;
  if (is_file(path)) return path;  // the file itself: its reader says whether it is one
  if (!fs::is_directory(path, ec)) return {};
  if (is_file(fs::path(path) / kStateFile)) return (fs::path(path) / kStateFile).string();
  std::int64_t best = -1;
  std::string out;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("checkpoint-", 0) != 0) continue;
    const auto n = text::parse_whole<std::int64_t>(std::string_view(name).substr(11));
    if (n && *n > best && is_file(e.path() / kStateFile)) {
      best = *n;
      out = (e.path() / kStateFile).string();
    }
  }
  return out;
}

Point check(const std::string& name) {
  Point p;
  p.params = json{{"check", name}};
  return p;
}

// The checks in the order the report prints them, each the kinds of finding it covers.
struct CheckSpec {
  const char* name;
  std::vector<std::string> kinds;
  const char* none;  // its reading when nothing fired
};

// PEFT's adapter_config.json beside the state (the checkpoint's, else the output directory's): what
// the run trains. Read only for the reading it sharpens; a file that is not one is ignored, said in meta.
json adapter_of_run(const std::string& state_file, CurveContext& ctx) {
  const fs::path dir = fs::path(state_file).parent_path();
  for (const fs::path& p : {dir / "adapter_config.json", dir.parent_path() / "adapter_config.json"}) {
    if (!is_file(p)) continue;
    try {
      const json j = parse_json_text(read_regular_file(p.string(), "adapter_config.json", 1 << 20), p.string());
      if (!j.is_object()) return json{{"file", p.string()}, {"ignored", "not a JSON object"}};
      std::vector<std::string> targets;
      if (j.contains("target_modules") && j["target_modules"].is_array())
        for (const auto& t : j["target_modules"])
          if (t.is_string()) targets.push_back(t.get<std::string>());
      if (j.contains("target_modules") && j["target_modules"].is_string()) targets.push_back(j["target_modules"].get<std::string>());
      const std::string type = j.value("peft_type", std::string("adapter"));
      const std::int64_t r = j.contains("r") && j["r"].is_number_integer() ? j["r"].get<std::int64_t>() : 0;
      ctx.adapters = true;
      ctx.adapter_text = fmt::format("{}{}{}", type, r > 0 ? fmt::format(" r={}", r) : "",
                                     targets.empty() ? "" : fmt::format(" on {}", fmt::join(targets, ", ")));
      return json{{"file", p.string()}, {"peft_type", type}, {"r", r}, {"target_modules", targets},
                  {"base_model", j.value("base_model_name_or_path", std::string())}};
    } catch (const std::exception& e) {  // UsageError, a JSON type error: not an adapter config
      return json{{"file", p.string()}, {"ignored", e.what()}};
    }
  }
  return json();
}

}  // namespace

bool looks_like_run(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return !state_file(path).empty();
  const std::string name = fs::path(path).filename().string();  // trainer_state.json, or a copy named *trainer_state.json
  return name.size() >= 18 && name.compare(name.size() - 18, 18, kStateFile) == 0;
}

Result diagnose_run(const std::string& path, const json& meta) {
  const std::string file = state_file(path);
  if (file.empty())
    throw UsageError(fmt::format("{}: no {} here or in a checkpoint-N/ inside it: not a Hugging Face Trainer's "
                                 "output directory (diagnose CONFIG.yml reads a config; --trace a profiler trace)",
                                 path, kStateFile));
  const TrainerState s = read_trainer_state(file);
  CurveContext ctx;
  const json adapter = adapter_of_run(file, ctx);
  const auto found = analyze_curves(s, ctx);
  Result r;
  r.scenario = "diagnose";
  r.meta = meta;
  std::size_t train_logs = 0, eval_logs = 0;
  for (const auto& e : s.log) {
    train_logs += e.is_train() ? 1 : 0;
    eval_logs += e.is_eval() ? 1 : 0;
  }
  r.meta["diagnose"] = json{{"source", "run"}, {"run", path}};
  r.meta["run"] = json{{"trainer_state", file},
                       {"global_step", s.global_step},
                       {"max_steps", s.max_steps},
                       {"training_logs", train_logs},
                       {"evaluation_logs", eval_logs},
                       {"resumed", s.resumed},
                       {"adapter", adapter},
                       {"not_read", json::array({"training_args.bin", "config.json",
                                                 "the Axolotl config", "events.out.tfevents.*", "profiler traces"})}};
  const CheckSpec specs[] = {
      {"nan", {"nan"}, "no NaN or Inf in the logged loss or grad_norm"},
      {"gradients", {"exploding", "vanishing"}, "grad_norm neither over 1e3 nor all under 1e-6"},
      {"divergence", {"divergence"}, "no loss over 3x its lowest for two logs running"},
      {"plateau", {"plateau"}, "the loss still moves in the second half (or too few logs to tell)"},
      {"best", {"past_best", "early_stopping"}, "no best checkpoint 3 or more evaluations before the end"},
  };
  for (const CheckSpec& spec : specs) {
    Point p = check(spec.name);
    const CurveFinding* hit = nullptr;
    for (const auto& f : found)
      for (const auto& k : spec.kinds)
        if (f.kind == k && !hit) hit = &f;
    if (spec.name == std::string("gradients") && train_logs > 0) {
      bool any = false;
      for (const auto& e : s.log) any = any || e.grad_norm.has_value();
      if (!any && !hit) {
        p.status = Status::skipped;
        p.reason = "no grad_norm in the log (transformers before ~4.38 does not log it)";
        r.points.push_back(std::move(p));
        continue;
      }
    }
    if (spec.name == std::string("best") && !s.best_global_step && !hit) {
      p.status = Status::skipped;
      p.reason = "no best checkpoint recorded (no evaluation with metric_for_best_model, or load_best_model_at_end off)";
      r.points.push_back(std::move(p));
      continue;
    }
    p.info["reading"] = hit ? hit->summary : spec.none;
    if (hit) p.info["evidence"] = hit->summary;
    r.points.push_back(std::move(p));
  }
  Point tp = check("throughput");
  const LoggedThroughput t = logged_throughput(s);
  if (!t.present) {
    tp.status = Status::skipped;
    tp.reason = t.caveats.empty() ? "no final summary" : t.caveats.front();
  } else {
    tp.add({"samples_per_s", t.samples_per_s, "samples/s", Direction::higher, std::nullopt, "the Trainer's own summary"});
    tp.add({"steps_per_s", t.steps_per_s, "steps/s", Direction::higher, std::nullopt, "the Trainer's own summary"});
    tp.add({"train_runtime_s", t.runtime_s, "s", Direction::lower, std::nullopt, "the Trainer's own summary"});
    tp.info["reading"] = fmt::format("{} samples/s, {} steps/s over {:.0f} s (logged by the Trainer; tokens/s and MFU "
                                     "need the sequence length and the model: diagnose the config for those){}",
                                     t.samples_per_s, t.steps_per_s, t.runtime_s,
                                     t.caveats.empty() ? "" : "; " + t.caveats.front());
    if (!t.caveats.empty()) tp.info["warning"] = t.caveats.front();
  }
  r.points.push_back(std::move(tp));
  for (const auto& f : found) {
    Finding out;
    out.cause = f.cause;
    out.summary = f.summary;
    out.evidence = json{{"check", f.kind}, {"step", f.step}, {"basis", f.basis}, {"figures", f.evidence},
                        {"change", f.change}, {"command", f.reproduce}};
    r.findings.push_back(std::move(out));
  }
  if (r.findings.empty())
    r.findings.push_back({"none found", "none of the detectors fired on the logged curves (each check's reading is in "
                                        "its point)", std::nullopt, json::object()});
  return r;
}

}  // namespace sb::diagnose
