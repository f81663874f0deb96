// trainer_state.json (trainer_state.hpp): transformers' TrainerState.save_to_json is json.dumps of
// the dataclass, indent 2, sort_keys, so non-finite floats come out as bare NaN / Infinity.
#include "readers/trainer_state.hpp"

#include <cmath>    // std::isfinite
#include <limits>   // std::numeric_limits
#include <string_view>  // std::string_view

#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/errors.hpp"     // UsageError
#include "harness/files.hpp"      // read_regular_file
#include "harness/json_read.hpp"  // parse_json_text, JsonRef, reading_file
#include "harness/text.hpp"       // parse_whole

namespace sb {

namespace {

using json = nlohmann::ordered_json;

bool delimiter(char c) {
  return c == ',' || c == ']' || c == '}' || c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == ':';
}

// A number, or one of the strings quote_nonfinite_tokens made of a non-finite token. A string that
// names no number is the field's type error.
double number_or_nonfinite(const JsonRef& r) {
  const json& v = r.raw();
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
  }
  r.fail("expected a number (or NaN, Infinity), got " + r.describe());
}

std::optional<double> opt_number(const JsonRef& obj, std::string_view key) {
  const auto f = obj.find(key);
  if (!f || f->raw().is_null()) return std::nullopt;
  return number_or_nonfinite(*f);
}

std::optional<std::int64_t> opt_integer(const JsonRef& obj, std::string_view key, std::int64_t lo = 0) {
  const auto f = obj.find(key);
  if (!f || f->raw().is_null()) return std::nullopt;
  return f->integer(lo);
}

// checkpoint-800 -> 800 (best_model_checkpoint names a directory; older files have no best_global_step)
std::optional<std::int64_t> step_of_checkpoint(std::string_view path) {
  const auto at = path.rfind("checkpoint-");
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view digits = path.substr(at + 11);
  while (!digits.empty() && (digits.back() == '/' || digits.back() == '\\')) digits.remove_suffix(1);
  return text::parse_whole<std::int64_t>(digits);
}

TrainerLogEntry read_entry(const JsonRef& e) {
  e.object();
  TrainerLogEntry out;
  out.step = e.at("step").integer(0);
  out.epoch = opt_number(e, "epoch").value_or(0.0);
  out.loss = opt_number(e, "loss");
  out.grad_norm = opt_number(e, "grad_norm");
  out.learning_rate = opt_number(e, "learning_rate");
  out.num_input_tokens_seen = opt_integer(e, "num_input_tokens_seen");
  out.eval_loss = opt_number(e, "eval_loss");
  for (const auto& [k, v] : e.members()) {
    if (k.rfind("eval_", 0) != 0 || k == "eval_loss") continue;
    if (k == "eval_runtime" || k == "eval_samples_per_second" || k == "eval_steps_per_second") continue;
    if (v.raw().is_number() || v.raw().is_string()) {
      // a non-numeric string (a TRL text) is no metric
      if (v.raw().is_string()) {
        const std::string& s = v.raw().get_ref<const std::string&>();
        if (s != "NaN" && s != "Infinity" && s != "-Infinity") continue;
      }
      out.eval[k] = number_or_nonfinite(v);
    }
  }
  return out;
}

}  // namespace

std::string quote_nonfinite_tokens(const std::string& text, std::size_t* replaced) {
  std::string out;
  out.reserve(text.size() + 64);
  std::size_t n = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) out += text[++i];
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
      out += c;
      continue;
    }
    const bool start = i == 0 || delimiter(text[i - 1]) || text[i - 1] == '[';
    for (const std::string_view tok : {std::string_view("-Infinity"), std::string_view("Infinity"), std::string_view("NaN")}) {
      if (start && text.compare(i, tok.size(), tok) == 0 &&
          (i + tok.size() == text.size() || delimiter(text[i + tok.size()]))) {
        out += '"';
        out += tok;
        out += '"';
        i += tok.size() - 1;
        ++n;
        goto next;
      }
    }
    out += c;
  next:;
  }
  if (replaced) *replaced = n;
  return out;
}

TrainerState parse_trainer_state(const std::string& text, const std::string& path) {
  const json doc = parse_json_text(quote_nonfinite_tokens(text), path);
  return reading_file(path, [&] {
    const JsonRef root(doc, path);
    root.object();
    if (!root.find("log_history"))
      throw UsageError(fmt::format("{}: no log_history: not a Hugging Face Trainer's trainer_state.json", path));
    TrainerState s;
    s.path = path;
    s.global_step = opt_integer(root, "global_step").value_or(0);
    s.max_steps = opt_integer(root, "max_steps").value_or(0);
    s.logging_steps = opt_integer(root, "logging_steps");
    s.eval_steps = opt_integer(root, "eval_steps");
    s.train_batch_size = opt_integer(root, "train_batch_size");
    s.num_train_epochs = opt_integer(root, "num_train_epochs");
    s.best_metric = opt_number(root, "best_metric");
    s.total_flos = opt_number(root, "total_flos");
    if (const auto b = root.find("best_model_checkpoint"); b && b->raw().is_string()) s.best_model_checkpoint = b->str();
    s.best_global_step = opt_integer(root, "best_global_step");
    if (!s.best_global_step && !s.best_model_checkpoint.empty()) s.best_global_step = step_of_checkpoint(s.best_model_checkpoint);
    if (const auto cbs = root.find("stateful_callbacks"); cbs && cbs->raw().is_object()) {
      if (const auto es = cbs->find("EarlyStoppingCallback"); es && es->raw().is_object()) {
        if (const auto args = es->find("args"); args && args->raw().is_object()) {
          s.early_stopping_patience = opt_integer(*args, "early_stopping_patience");
          s.early_stopping_threshold = opt_number(*args, "early_stopping_threshold");
        }
        if (const auto at = es->find("attributes"); at && at->raw().is_object())
          s.early_stopping_patience_counter = opt_integer(*at, "early_stopping_patience_counter");
      }
    }
    const JsonRef log = root.at("log_history");
    log.array();
    std::int64_t last_train_step = -1;
    double last_epoch = -1;
    for (std::size_t i = 0; i < log.size(); ++i) {
      const JsonRef e = log.at(i);
      e.object();
      if (e.find("train_runtime")) {  // the final summary
        s.train_runtime_s = opt_number(e, "train_runtime");
        s.train_samples_per_second = opt_number(e, "train_samples_per_second");
        s.train_steps_per_second = opt_number(e, "train_steps_per_second");
        s.train_loss = opt_number(e, "train_loss");
        if (const auto f = opt_number(e, "total_flos")) s.total_flos = f;
        continue;
      }
      TrainerLogEntry entry = read_entry(e);
      if (entry.is_train()) {
        // resumed: the step goes back, or the epoch does (a resume under a new schedule keeps counting steps)
        if (entry.step < last_train_step || entry.epoch + 1e-9 < last_epoch) s.resumed = true;
        last_train_step = entry.step;
        last_epoch = entry.epoch;
      }
      s.log.push_back(std::move(entry));
    }
    return s;
  });
}

TrainerState read_trainer_state(const std::string& path) {
  return parse_trainer_state(read_regular_file(path, "trainer_state.json"), path);
}

}  // namespace sb
