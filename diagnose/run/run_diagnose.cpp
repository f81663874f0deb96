// diagnose on a run directory (run_diagnose.hpp): find the run's files, read its curves and settings,
// report.
#include "diagnose/run/run_diagnose.hpp"

#include <algorithm>     // std::sort
#include <cstdint>       // std::int64_t, SIZE_MAX
#include <filesystem>    // std::filesystem
#include <optional>      // std::optional
#include <system_error>  // std::error_code

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "diagnose/run/curves.hpp"        // analyze_curves, logged_throughput
#include "diagnose/run/event_curves.hpp"  // state_from_events
#include "diagnose/run/run_settings.hpp"  // settings_findings, training_args_json
#include "diagnose/run/throughput.hpp"    // read_throughput, hf_counted_params
#include "diagnose/config.hpp"            // default_config, apply_model_config_text
#include "diagnose/hf_cache.hpp"          // hf_cache_dirs, find_model_config
#include "diagnose/trainer.hpp"           // resolve_axolotl, parse_version
#include "diagnose/trace/job_diagnose.hpp"  // diagnose_job
#include "diagnose/trace/trace_diagnose.hpp"  // diagnose_trace
#include "harness/errors.hpp"             // UsageError
#include "harness/files.hpp"              // read_regular_file
#include "harness/json_read.hpp"          // parse_json_text
#include "harness/text.hpp"               // parse_whole
#include "readers/tfevents.hpp"           // read_tfevents, is_tfevents_name
#include "readers/trainer_state.hpp"      // read_trainer_state
#include "readers/training_args.hpp"      // read_training_args

namespace sb::diagnose {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

constexpr const char* kStateFile = "trainer_state.json";
constexpr const char* kArgsFile = "training_args.bin";
constexpr std::size_t kMaxEventFiles = 256;

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

bool ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The run's trainer_state.json: the directory's own (written when training ends), else the newest
// checkpoint-N/'s (N the largest), else "".
std::string state_file(const std::string& path) {
  if (is_file(path)) return ends_with(fs::path(path).filename().string(), kStateFile) ? path : std::string();
  if (!is_dir(path)) return {};
  if (is_file(fs::path(path) / kStateFile)) return (fs::path(path) / kStateFile).string();
  std::int64_t best = -1;
  std::string out;
  std::error_code ec;
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

// Event files in `dir` and up to `depth` levels under it (runs/<name>/), sorted by path.
void find_events(const fs::path& dir, int depth, std::vector<std::string>& out) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (out.size() >= kMaxEventFiles) return;
    const std::string name = e.path().filename().string();
    if (is_tfevents_name(name) && is_file(e.path())) out.push_back(e.path().string());
    else if (depth > 0 && !e.is_symlink(ec) && is_dir(e.path())) find_events(e.path(), depth - 1, out);
  }
}

std::vector<std::string> event_files(const std::string& path) {
  std::vector<std::string> out;
  if (is_file(path)) {
    if (is_tfevents_name(fs::path(path).filename().string())) out.push_back(path);
    return out;
  }
  if (!is_dir(path)) return out;
  find_events(path, 2, out);
  // a checkpoint-N/ holds none: its output directory's runs/ has them
  const fs::path dir = fs::path(path).lexically_normal();
  const fs::path self = dir.filename().empty() ? dir.parent_path() : dir;
  if (out.empty() && self.filename().string().rfind("checkpoint-", 0) == 0 && is_dir(self.parent_path() / "runs"))
    find_events(self.parent_path() / "runs", 1, out);
  std::sort(out.begin(), out.end());
  return out;
}

// The profiler's traces in the run's directory and up to 3 levels under it (tensorboard_trace_handler writes
// <dir>/<worker>.<ts>.pt.trace.json[.gz]), sorted; at most 64.
void find_traces(const fs::path& dir, int depth, std::vector<std::string>& out) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (out.size() >= 64) return;
    const std::string name = e.path().filename().string();
    if ((ends_with(name, ".pt.trace.json") || ends_with(name, ".pt.trace.json.gz")) && is_file(e.path()))
      out.push_back(e.path().string());
    else if (depth > 0 && !e.is_symlink(ec) && is_dir(e.path()))
      find_traces(e.path(), depth - 1, out);
  }
}

// The run's directory: `path`, or the directory of the file given.
fs::path run_dir(const std::string& path) { return is_dir(path) ? fs::path(path) : fs::path(path).parent_path(); }

// A file of the run beside its curves: the state's directory, the run's directory, then, for a
// checkpoint-N/, its output directory.
std::string beside(const std::string& path, const std::string& state, const char* name) {
  std::vector<fs::path> dirs;
  if (!state.empty()) dirs.push_back(fs::path(state).parent_path());
  const fs::path dir = run_dir(path).lexically_normal();
  dirs.push_back(dir);
  const fs::path self = dir.filename().empty() ? dir.parent_path() : dir;
  if (self.filename().string().rfind("checkpoint-", 0) == 0) dirs.push_back(self.parent_path());
  for (const fs::path& d : dirs)
    if (is_file(d / name)) return (d / name).string();
  return {};
}

// PEFT's adapter_config.json beside the state (the checkpoint's, else the output directory's): what
// the run trains. Read only for the reading it sharpens; a file that is not one is ignored, said in meta.
json adapter_of_run(const fs::path& dir, CurveContext& ctx) {
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

// config.json's torch_dtype (dtype from transformers 5): the dtype save_pretrained saw the model in.
// Anything else of the file is the config checks' (diagnose CONFIG --model-config); a file that is not
// one is ignored, said in meta.
// The run's config.json, read once for saved_model and read_dims: its text, or why it could not be read.
struct ConfigFile {
  std::string file, text, error;
};
ConfigFile read_config_file(const std::string& file) {
  ConfigFile c{file, {}, {}};
  if (file.empty()) return c;
  try {
    c.text = read_regular_file(file, "config.json", 4 << 20);
  } catch (const std::exception& e) {
    c.error = e.what();
  }
  return c;
}

SavedModel saved_model(const ConfigFile& cf, json& meta) {
  SavedModel m;
  const std::string& file = cf.file;
  if (file.empty()) return m;
  try {
    if (!cf.error.empty()) throw UsageError(cf.error);
    const json j = parse_json_text(cf.text, file);
    for (const char* key : {"torch_dtype", "dtype"})
      if (j.is_object() && j.contains(key) && j[key].is_string()) {
        m.file = file;
        m.torch_dtype = j[key].get<std::string>().substr(0, 64);
        meta = json{{"file", file}, {"torch_dtype", m.torch_dtype}, {"source", fmt::format("config.json {}", key)}};
        return m;
      }
    meta = json{{"file", file}, {"ignored", "no torch_dtype"}};
  } catch (const std::exception& e) {
    meta = json{{"file", file}, {"ignored", e.what()}};
  }
  return m;
}

// Everything read of the run.
struct RunRead {
  TrainerState state;
  std::string curves_from;  // "trainer_state.json" or "events.out.tfevents.*"; "" neither
  json events = json();     // the event files read, their records and tags
  std::optional<TrainingArgs> args;
  SavedModel model;
  json adapter, model_meta;
  std::optional<ModelDims> dims;  // the model's shape: the run's config.json, else the adapter's base in the HF cache
  json dims_meta;
  std::optional<TrainConfig> axolotl;  // the Axolotl config of the model card (README.md), resolved by its release
  std::string axolotl_file;
  json axolotl_meta;
  CurveContext ctx;
};

// Axolotl's model card in the run (README.md, the output directory's: the checkpoint's parent's too): the
// config the run was launched with, resolved with the defaults of the release the card names. A card
// whose config cannot be read is said in meta, not fatal to the run's reading.
void read_axolotl_card(const fs::path& dir, RunRead& rr) {
  for (const fs::path& p : {dir / "README.md", dir.parent_path() / "README.md"}) {
    if (!is_file(p)) continue;
    std::string text;
    try {
      text = read_regular_file(p.string(), "model card", 4 << 20);
    } catch (const UsageError& e) {
      rr.axolotl_meta = json{{"file", p.string()}, {"ignored", e.what()}};
      return;
    }
    if (text.find("See axolotl config") == std::string::npos) continue;
    try {
      TrainConfig cfg = parse_axolotl_yaml_text(text, p.string());
      TrainerSpec t;
      if (const auto v = parse_version(cfg.card_axolotl_version)) {
        t.axolotl = std::clamp(*v, Version{0, 1, 0}, kNewestAxolotl);
        t.version_given = true;
      }
      if (rr.args && rr.args->world_size && *rr.args->world_size > 0 && *rr.args->world_size < (1 << 20))
        t.world_size = int(*rr.args->world_size);
      resolve_axolotl(cfg, t);
      rr.axolotl_file = p.string();
      rr.axolotl_meta = json{{"file", p.string()},
                             {"axolotl_version", cfg.card_axolotl_version},
                             {"defaults_of", to_string(t.axolotl)},
                             {"base_model", cfg.base_model},
                             {"adapter", cfg.adapter},
                             {"sequence_len", cfg.sequence_len},
                             {"sample_packing", cfg.sample_packing},
                             {"micro_batch_size", cfg.micro_batch_size},
                             {"gradient_accumulation_steps", cfg.gradient_accumulation_steps},
                             {"bf16", cfg.bf16},
                             {"fp16", cfg.fp16},
                             {"attn_implementation", cfg.attn_implementation},
                             {"dataloader_num_workers", cfg.dataloader_num_workers}};
      rr.axolotl = std::move(cfg);
    } catch (const std::exception& e) {
      rr.axolotl_meta = json{{"file", p.string()}, {"ignored", e.what()}};
    }
    return;
  }
}

// The model's dims, as diagnose --model-config reads them (a family it cannot read is said, not
// replaced by a default): the run's config.json, else the HF cache's for a PEFT adapter's base model.
void read_dims(const ConfigFile& cf, RunRead& rr) {
  std::string file = cf.file;
  std::string from = "the run's config.json";
  std::string base, base_from;
  if (rr.adapter.is_object() && !rr.adapter.value("base_model", std::string()).empty()) {
    base = rr.adapter["base_model"].get<std::string>();
    base_from = "adapter_config.json";
  } else if (rr.axolotl && !rr.axolotl->base_model.empty()) {
    base = rr.axolotl->base_model;
    base_from = "the Axolotl config";
  }
  if (file.empty() && !base.empty()) {
    file = find_model_config(base, hf_cache_dirs());
    from = fmt::format("base_model {} ({}) in the Hugging Face cache", base, base_from);
    if (file.empty()) {
      rr.dims_meta = json{{"source", from}, {"ignored", "not in the Hugging Face cache"}};
      return;
    }
  }
  if (file.empty()) return;
  try {
    TrainConfig cfg = default_config();
    if (file == cf.file && !cf.error.empty()) throw UsageError(cf.error);
    apply_model_config_text(cfg, file == cf.file ? cf.text : read_regular_file(file, "config.json", 4 << 20), file);
    rr.dims = cfg.model;
    rr.dims_meta = json{{"file", file},
                        {"source", from},
                        {"hidden_size", cfg.model.hidden_size},
                        {"num_hidden_layers", cfg.model.num_hidden_layers},
                        {"vocab_size", cfg.model.vocab_size},
                        {"parameters_counted", hf_counted_params(cfg.model)}};
  } catch (const std::exception& e) {  // a family whose layer is not read: said, no default put in its place
    rr.dims_meta = json{{"file", file}, {"source", from}, {"ignored", e.what()}};
  }
}

json events_meta(const std::vector<TfEvents>& files) {
  json list = json::array(), tags = json::object();
  std::size_t records = 0;
  for (const TfEvents& f : files) {
    list.push_back(f.truncated_at ? json{{"file", f.path}, {"truncated_at", *f.truncated_at}} : json{{"file", f.path}});
    records += f.records;
    for (const auto& [tag, v] : f.scalars) tags[tag] = tags.value(tag, std::size_t(0)) + v.size();
  }
  return json{{"files", list}, {"records", records}, {"scalars", tags}};
}

RunRead read_run(const std::string& path) {
  RunRead rr;
  const std::string state = state_file(path);
  const std::vector<std::string> events = state.empty() ? event_files(path) : std::vector<std::string>();
  const std::string args = is_file(path) && fs::path(path).filename() == kArgsFile ? path : beside(path, state, kArgsFile);
  if (state.empty() && events.empty() && args.empty())
    throw UsageError(fmt::format("{}: no {}, {} or events.out.tfevents.* here (or in a checkpoint-N/ or runs/ inside "
                                 "it): not a Hugging Face Trainer's output directory (diagnose CONFIG.yml reads a "
                                 "config; --trace a profiler trace)",
                                 path, kStateFile, kArgsFile));
  if (!state.empty()) {
    rr.state = read_trainer_state(state);
    rr.curves_from = state;
  } else if (!events.empty()) {
    std::vector<TfEvents> files;
    for (const auto& f : events) files.push_back(read_tfevents(f));
    rr.state = state_from_events(files, events.size() == 1 ? events.front() : fmt::format("{} event files", events.size()));
    rr.curves_from = rr.state.path;
    rr.events = events_meta(files);
  }
  if (!args.empty()) {
    rr.args = read_training_args(args);  // ctx.args is set where rr ends up (diagnose_run)
    if (rr.state.max_steps <= 0 && rr.args->max_steps.value_or(0) > 0) rr.state.max_steps = *rr.args->max_steps;
  }
  const fs::path dir = state.empty() ? run_dir(path) : fs::path(state).parent_path();
  rr.adapter = adapter_of_run(dir, rr.ctx);
  const ConfigFile config_json = read_config_file(beside(path, state, "config.json"));
  rr.model = saved_model(config_json, rr.model_meta);
  read_axolotl_card(dir, rr);
  read_dims(config_json, rr);
  return rr;
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

void curve_points(const RunRead& rr, const std::vector<CurveFinding>& found, Result& r) {
  const TrainerState& s = rr.state;
  std::size_t train_logs = 0;
  bool any_norm = false;
  for (const auto& e : s.log) {
    train_logs += e.is_train() ? 1 : 0;
    any_norm = any_norm || e.grad_norm.has_value();
  }
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
    const std::string name = spec.name;
    if (rr.curves_from.empty()) {
      p.status = Status::skipped;
      p.reason = "no curves: no trainer_state.json or event file in the run";
    } else if (name == "gradients" && train_logs > 0 && !any_norm && !hit) {
      p.status = Status::skipped;
      p.reason = "no grad_norm in the log (transformers before ~4.38 does not log it)";
    } else if (name == "best" && !s.best_global_step && !hit) {
      p.status = Status::skipped;
      p.reason = rr.events.is_null() ? "no best checkpoint recorded (no evaluation with metric_for_best_model, or "
                                       "load_best_model_at_end off)"
                                     : "the event files do not record the best checkpoint (trainer_state.json does)";
    } else {
      p.info["reading"] = hit ? hit->summary : spec.none;
      if (hit) p.info["evidence"] = hit->summary;
    }
    r.points.push_back(std::move(p));
  }
}

// The throughput the trainer logged, corrected where the summary overstates (throughput.hpp); tokens/s
// from the tokens it counted, else from its FLOP count over the model's parameters, else samples/s x the
// sequence length the settings record (an upper bound without packing); the model FLOP rate and the MFU
// on the GPU named. A low MFU is a finding (low_mfu, filled in here).
Point throughput_point(const RunRead& rr, const ThroughputOptions& o, std::optional<CurveFinding>& low_mfu) {
  Point tp = check("throughput");
  const ThroughputReading t =
      read_throughput(rr.state, rr.args ? &*rr.args : nullptr, rr.dims ? &*rr.dims : nullptr,
                      rr.ctx.adapters || (rr.axolotl && !rr.axolotl->adapter.empty()), rr.model.torch_dtype, o,
                      rr.axolotl ? &*rr.axolotl : nullptr);
  if (!t.present) {
    const LoggedThroughput lt = logged_throughput(rr.state);
    tp.status = Status::skipped;
    tp.reason = lt.caveats.empty() ? "no final summary" : lt.caveats.front();
    return tp;
  }
  const char* src = rr.events.is_null() ? "the Trainer's own summary" : "the Trainer's summary, from the event file";
  const std::string fixed = t.stopped_early ? std::string(src) + ", over the steps really trained" : std::string(src);
  tp.add({"samples_per_s", t.samples_per_s, "samples/s", Direction::higher, std::nullopt, fixed});
  tp.add({"steps_per_s", t.steps_per_s, "steps/s", Direction::higher, std::nullopt, fixed});
  if (t.stopped_early) {
    tp.add({"samples_per_s_logged", t.logged_samples_per_s, "samples/s", Direction::higher, std::nullopt,
            std::string(src) + ": the planned run over the time it took"});
    tp.add({"steps_per_s_logged", t.logged_steps_per_s, "steps/s", Direction::higher, std::nullopt,
            std::string(src) + ": the planned run over the time it took"});
  }
  tp.add({"train_runtime_s", t.runtime_s, "s", Direction::lower, std::nullopt, src});
  std::vector<std::string> parts{fmt::format("{:.4g} samples/s, {:.4g} steps/s over {:.0f} s (logged by the Trainer{})",
                                             t.samples_per_s, t.steps_per_s, t.runtime_s,
                                             t.stopped_early ? ", corrected for its early stop" : "")};
  std::optional<std::int64_t> seen;
  for (const auto& e : rr.state.log)
    if (e.num_input_tokens_seen) seen = e.num_input_tokens_seen;
  const TrainingArgs* a = rr.args ? &*rr.args : nullptr;
  if (seen && *seen > 0) {
    const double tps = double(*seen) / t.runtime_s;
    tp.add({"tokens_per_s", tps, "tokens/s", Direction::higher, std::nullopt,
            "num_input_tokens_seen / train_runtime (the Trainer's count)"});
    parts.push_back(fmt::format("{:.4g} tokens/s ({} input tokens seen / {:.0f} s)", tps, *seen, t.runtime_s));
  } else if (t.tokens_per_s) {
    tp.add({"tokens_per_s", *t.tokens_per_s, "tokens/s", Direction::higher, std::nullopt, t.tokens_source});
    parts.push_back(fmt::format("about {:.4g} tokens/s ({})", *t.tokens_per_s, t.tokens_source));
  } else if (a && a->max_seq_length && t.samples_per_s > 0) {
    const double tps = t.samples_per_s * double(*a->max_seq_length);
    const bool packed = a->packing.value_or(false);
    tp.add({"tokens_per_s_upper", tps, "tokens/s", Direction::higher, std::nullopt,
            fmt::format("samples/s x max_seq_length {} (training_args.bin)", *a->max_seq_length)});
    parts.push_back(fmt::format("{} {:.4g} tokens/s (samples/s x max_seq_length {}{})", packed ? "about" : "at most", tps,
                                *a->max_seq_length,
                                packed ? ", packed: each sample that long" : ": unpacked samples are shorter"));
  } else if (rr.axolotl && t.samples_per_s > 0) {
    const double tps = t.samples_per_s * double(rr.axolotl->sequence_len);
    const bool packed = rr.axolotl->sample_packing;
    tp.add({"tokens_per_s_upper", tps, "tokens/s", Direction::higher, std::nullopt,
            fmt::format("samples/s x sequence_len {} (the Axolotl config)", rr.axolotl->sequence_len)});
    parts.push_back(fmt::format("{} {:.4g} tokens/s (samples/s x sequence_len {}{})", packed ? "about" : "at most", tps,
                                rr.axolotl->sequence_len,
                                packed ? ", packed: each sample a packed sequence that long" : ": unpacked samples are shorter"));
  } else if (!t.model_tflops) {
    parts.push_back(a ? "tokens/s needs the sequence length, which training_args.bin does not record "
                        "(TrainingArguments has none; TRL's SFTConfig and Axolotl's do), or the model's config.json "
                        "beside a FLOP count: diagnose the config for tokens/s and MFU"
                      : "tokens/s and MFU need the sequence length and the model: diagnose the config for those");
  }
  if (t.model_tflops) {
    tp.add({"model_tflops", *t.model_tflops, "TFLOP/s", Direction::higher, std::nullopt,
            "total_flos / train_runtime, the whole job (the Trainer's count)"});
    parts.push_back(fmt::format("{:.4g} TFLOP/s of model FLOPs for the job (the Trainer's count)", *t.model_tflops));
  } else if (!t.flops_note.empty()) {
    parts.push_back("no model FLOP rate: " + t.flops_note);
  }
  if (t.global_batch) parts.push_back(fmt::format("{} samples per optimizer step", *t.global_batch));
  parts.push_back("GPUs: " + t.world_source);
  if (t.gpu && t.mfu_pct) {
    const std::string how = fmt::format("model FLOPs per GPU over {}'s {} peak {} TFLOP/s ({}; the dtype from {})",
                                        t.gpu->id, t.gpu->dtype, t.gpu->tflops, t.gpu->source, t.gpu->dtype_source);
    tp.add({"mfu_pct", *t.mfu_pct, "%", Direction::higher, std::nullopt,
            t.mfu_is_bound ? how + ": on one GPU, the most it can be" : how});
    if (t.mfu_min_pct)
      tp.add({"mfu_pct_min", *t.mfu_min_pct, "%", Direction::higher, std::nullopt,
              fmt::format("{}: on {} GPUs, the least it can be", how, t.world_max)});
    parts.push_back(fmt::format("MFU {}{:.1f}% of {}'s {} peak ({} TFLOP/s per GPU){}", t.mfu_is_bound ? "at most " : "",
                                *t.mfu_pct, t.gpu->id, t.gpu->dtype, t.gpu->tflops,
                                t.mfu_min_pct ? fmt::format(", {:.2g}% on {} GPUs", *t.mfu_min_pct, t.world_max) : ""));
    if (*t.mfu_pct < kLowMfuPct) {
      CurveFinding f;
      f.kind = "mfu";
      f.cause = "low model FLOPs utilization";
      f.basis = t.mfu_is_bound ? "measured (the Trainer's FLOP count over its runtime), on one GPU: more GPUs only lower it"
                               : "measured (the Trainer's FLOP count over its runtime; the GPUs " + t.world_source + ")";
      f.summary = fmt::format("measured: MFU {}{:.1f}% on {} ({}); tuned training reaches 38-43%: a trace names why",
                              t.mfu_is_bound ? "at most " : "", *t.mfu_pct, t.gpu->id, t.gpu->dtype);
      f.evidence = {fmt::format("total_flos {:.4g} over train_runtime {:.0f} s: {:.4g} TFLOP/s for the job, {:.4g} per "
                                "GPU{}",
                                *rr.state.total_flos, t.runtime_s, *t.model_tflops,
                                *t.model_tflops / double(t.world ? *t.world : 1), t.world ? "" : " if on one"),
                    "GPUs: " + t.world_source, how, t.flops_note,
                    fmt::format("expected: 38-43% MFU for bf16 training on H100 (Llama 3 405B, 'The Llama 3 Herd of "
                                "Models' Table 4), 46.2% for PaLM 540B (its Table 3); under {:.0f}% (stallbench's "
                                "threshold) half the throughput is left to a cause the logs do not name",
                                kLowMfuPct)};
      for (const auto& n : t.notes) f.evidence.push_back(n);
      f.change = "torch.profiler over a few steps (tensorboard_trace_handler), then stallbench diagnose --trace DIR";
      f.reproduce = "stallbench diagnose --trace <the profiler's output directory>";
      if (rr.axolotl) {  // what the config itself has that the checks measure (diagnose CONFIG)
        const TrainConfig& c = *rr.axolotl;
        std::vector<std::string> cand;
        if (!c.sample_packing && c.packing_unavailable.empty()) cand.push_back("sample_packing off");
        if (c.attn_implementation.empty() || c.attn_implementation == "eager") cand.push_back("eager attention");
        if (c.dataloader_num_workers == 0) cand.push_back("no loader workers");
        if (c.micro_batch_size == 1) cand.push_back("micro_batch_size 1");
        if (c.gradient_checkpointing) cand.push_back("gradient checkpointing (about 1.33x the compute, not in the MFU)");
        if (!cand.empty())
          f.evidence.push_back(fmt::format("in the Axolotl config, what the checks measure: {}", fmt::join(cand, ", ")));
        f.reproduce = "stallbench diagnose " + rr.axolotl_file + " (each cause of its config, measured)";
      }
      low_mfu = f;
    }
  } else if (t.model_tflops && !t.gpu) {
    parts.push_back(o.gpu.empty() ? "MFU: name the GPU (--gpu h100)" : "MFU: no peak for that GPU");
  }
  for (std::size_t i = t.stopped_early ? 1 : 0; i < t.notes.size(); ++i) parts.push_back(t.notes[i]);  // [0]: the warning
  for (std::size_t i = !t.stopped_early && !t.caveats.empty() ? 1 : 0; i < t.caveats.size(); ++i)
    parts.push_back(t.caveats[i]);
  tp.info["reading"] = fmt::format("{}", fmt::join(parts, "; "));
  if (t.stopped_early) tp.info["warning"] = t.notes.front();
  else if (!t.caveats.empty()) tp.info["warning"] = t.caveats.front();
  tp.info["flops"] = t.flops_note;
  tp.info["gpus"] = t.world_source;
  if (t.gpu) tp.info["gpu"] = json{{"id", t.gpu->id}, {"dtype", t.gpu->dtype}, {"dtype_from", t.gpu->dtype_source},
                                   {"peak_tflops", t.gpu->tflops}, {"source", t.gpu->source}, {"named_by", o.gpu_from}};
  return tp;
}

json run_meta(const std::string& path, const RunRead& rr) {
  const TrainerState& s = rr.state;
  std::size_t train_logs = 0, eval_logs = 0;
  for (const auto& e : s.log) {
    train_logs += e.is_train() ? 1 : 0;
    eval_logs += e.is_eval() ? 1 : 0;
  }
  json not_read = json::array();
  if (!rr.axolotl) not_read.push_back("an Axolotl config: no model card (README.md) with one");
  if (!rr.events.is_null() || rr.curves_from.empty()) not_read.push_back("trainer_state.json: none found");
  else if (!event_files(path).empty())
    not_read.push_back("events.out.tfevents.*: trainer_state.json holds the same log");
  return json{{"trainer_state", rr.events.is_null() ? rr.curves_from : std::string()},
              {"curves", rr.curves_from.empty() ? json() : json(rr.curves_from)},
              {"events", rr.events},
              {"global_step", s.global_step},
              {"max_steps", s.max_steps},
              {"training_logs", train_logs},
              {"evaluation_logs", eval_logs},
              {"resumed", s.resumed},
              {"training_args", rr.args ? training_args_json(*rr.args) : json("none found")},
              {"model", rr.model_meta},
              {"dims", rr.dims_meta},
              {"axolotl", rr.axolotl_meta},
              {"adapter", rr.adapter},
              {"not_read", not_read}};
}

Finding to_finding(const CurveFinding& f) {
  Finding out;
  out.cause = f.cause;
  out.summary = f.summary;
  out.evidence = json{{"check", f.kind}, {"basis", f.basis}, {"figures", f.evidence},
                      {"change", f.change}, {"command", f.reproduce}};
  if (f.step >= 0) out.evidence["step"] = f.step;
  return out;
}

// The profiler traces the run left (find_traces), diagnosed as diagnose --trace does (one file, or one
// job's ranks in one directory) and their findings added, marked as the trace's. A trace that cannot be
// read is said in meta.run.traces, not fatal to the run's own reading.
void add_traces(const std::string& path, const json& meta, Result& r) {
  std::vector<std::string> files;
  find_traces(run_dir(path), 3, files);
  std::sort(files.begin(), files.end());
  json info{{"files", files}};
  Point p = check("trace");
  if (files.empty()) {
    p.status = Status::skipped;
    p.reason = "no *.pt.trace.json(.gz) in the run's directory: profile a few steps (torch.profiler with "
               "tensorboard_trace_handler) and diagnose --trace names the slow step's cause";
    r.points.push_back(std::move(p));
    r.meta["run"]["traces"] = info;
    return;
  }
  // one directory's traces: the last directory's (a job's ranks sit side by side)
  const fs::path last_dir = fs::path(files.back()).parent_path();
  std::vector<std::string> one;
  for (const auto& f : files)
    if (fs::path(f).parent_path() == last_dir) one.push_back(f);
  Result t;
  try {
    t = one.size() == 1 ? diagnose_trace(one[0], meta) : diagnose_job(one, last_dir.string(), meta);
  } catch (const UsageError& e) {
    if (one.size() == 1) throw;  // a lone trace that is not one: exit 2, as diagnose --trace says
    t = diagnose_trace(one.back(), meta);  // several traces of one rank (ranks said twice): the newest name
    info["note"] = std::string("not one job's ranks (") + e.what() + "): the last file read alone";
    one = {one.back()};
  }
  info["read"] = one;
  info["first_finding"] = t.findings.empty() ? json(nullptr) : json(t.findings.front().cause);
  p.info["reading"] = fmt::format("{} ({} file{}): {}", last_dir.string(), one.size(), one.size() == 1 ? "" : "s",
                                  t.findings.empty() ? "none found" : t.findings.front().summary);
  r.points.push_back(std::move(p));
  for (Finding f : t.findings) {
    if (f.cause == "none found") continue;
    f.summary = "(the profiler trace) " + f.summary;
    f.evidence["source"] = "trace";
    if (!f.evidence.contains("basis")) f.evidence["basis"] = "estimated from the trace";
    r.findings.push_back(std::move(f));
  }
  r.meta["run"]["traces"] = info;
}

}  // namespace

bool looks_like_run(const std::string& path) {
  if (is_dir(path)) return !state_file(path).empty() || is_file(fs::path(path) / kArgsFile) || !event_files(path).empty();
  const std::string name = fs::path(path).filename().string();  // trainer_state.json, or a copy named *trainer_state.json
  return ends_with(name, kStateFile) || name == kArgsFile || is_tfevents_name(name);
}

Result diagnose_run(const std::string& path, const json& meta, const RunOptions& opt) {
  RunRead rr = read_run(path);
  rr.ctx.args = rr.args ? &*rr.args : nullptr;
  const std::vector<CurveFinding> found = analyze_curves(rr.state, rr.ctx);
  const std::string device = meta.value("/device/id"_json_pointer, std::string("cpu"));
  const std::vector<CurveFinding> settings =
      rr.args ? settings_findings(*rr.args, rr.model, device) : std::vector<CurveFinding>();
  Result r;
  r.scenario = "diagnose";
  r.meta = meta;
  r.meta["diagnose"] = json{{"source", "run"}, {"run", path}};
  r.meta["run"] = run_meta(path, rr);
  Point sp = check("settings");
  if (rr.args || rr.axolotl) {
    std::vector<std::string> read;
    if (rr.args) read.push_back(settings_reading(*rr.args, rr.model));
    if (rr.axolotl) {
      const TrainConfig& c = *rr.axolotl;
      read.push_back(fmt::format(
          "the Axolotl config of its model card ({}{}): {}{}, sequence_len {}{}, micro batch {} x {} accumulated, {}, "
          "attention {}, {} loader worker{}; its causes measured at these settings: stallbench diagnose {}",
          rr.axolotl_file, c.card_axolotl_version.empty() ? "" : ", axolotl " + c.card_axolotl_version,
          c.adapter.empty() ? "full fine-tune" : c.adapter,
          c.load_in_4bit ? " on a 4-bit base" : c.load_in_8bit ? " on an 8-bit base" : "", c.sequence_len,
          c.sample_packing ? ", packed" : ", not packed", c.micro_batch_size, c.gradient_accumulation_steps,
          c.bf16 ? "bf16" : c.fp16 ? "fp16" : "fp32", c.attn_implementation.empty() ? "as the model loads" : c.attn_implementation,
          c.dataloader_num_workers, c.dataloader_num_workers == 1 ? "" : "s", rr.axolotl_file));
      sp.info["axolotl_command"] = "stallbench diagnose " + rr.axolotl_file;
    }
    sp.info["reading"] = fmt::format("{}", fmt::join(read, "; "));
  } else {
    sp.status = Status::skipped;
    sp.reason = "no training_args.bin beside the curves (the Trainer saves one with each checkpoint)";
  }
  r.points.push_back(std::move(sp));
  curve_points(rr, found, r);
  ThroughputOptions to{opt.gpu, opt.gpu_from, opt.world_size};
  if (to.gpu.empty()) {  // the device diagnose runs on, when a GPU (sim:h100 names one)
    const std::string id = meta.value("/device/id"_json_pointer, std::string());
    const bool gpu = id.rfind("sim:", 0) == 0 || id.rfind("cuda", 0) == 0;
    if (gpu) {
      to.gpu = id.rfind("sim:", 0) == 0 ? id.substr(4) : meta.value("/device/name"_json_pointer, std::string());
      to.gpu_from = "--device " + id;
    }
  }
  std::optional<CurveFinding> low_mfu;
  r.points.push_back(throughput_point(rr, to, low_mfu));
  for (const auto& f : found) r.findings.push_back(to_finding(f));
  for (const auto& f : settings) r.findings.push_back(to_finding(f));
  if (low_mfu) r.findings.push_back(to_finding(*low_mfu));
  add_traces(path, meta, r);
  if (r.findings.empty())
    r.findings.push_back({"none found", "none of the detectors fired on the logged curves (each check's reading is in "
                                        "its point)", std::nullopt, json::object()});
  return r;
}

}  // namespace sb::diagnose
