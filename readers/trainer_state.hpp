// A Hugging Face Trainer's trainer_state.json (what Trainer, and Axolotl and TRL on top of it, write
// into the output directory and each checkpoint-N/): the log of every logged step and the run's
// summary, typed. Read as real runs write it:
//   - bare NaN / Infinity / -Infinity tokens (Python's json.dump writes them; a strict JSON parser
//     refuses them): read as the non-finite numbers they are;
//   - every field optional by version: grad_norm from transformers ~4.38, num_input_tokens_seen,
//     stateful_callbacks (the early-stopping counter) and best_global_step later; TRL adds its own
//     keys (rewards/*, logps/*), kept by name;
//   - log_history mixes training entries (loss, grad_norm, learning_rate), evaluation entries
//     (eval_*) and the final summary (train_runtime, train_samples_per_second, train_loss), each
//     with step and epoch.
// Nothing is executed. A file that is not one (no log_history) or a field of the wrong type is a
// UsageError naming the file and the field (exit 2).
#pragma once

#include <cstdint>   // std::int64_t
#include <map>       // std::map
#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

namespace sb {

struct TrainerLogEntry {
  std::int64_t step = 0;
  double epoch = 0;
  // training entries (a NaN or infinite value is kept as such)
  std::optional<double> loss, grad_norm, learning_rate;
  std::optional<std::int64_t> num_input_tokens_seen;
  // evaluation entries: eval_loss and every other eval_* number ("eval_accuracy", "eval_wer")
  std::optional<double> eval_loss;
  std::map<std::string, double> eval;
  bool is_eval() const { return eval_loss.has_value() || !eval.empty(); }
  bool is_train() const { return loss.has_value() || grad_norm.has_value(); }
};

struct TrainerState {
  std::string path;
  std::vector<TrainerLogEntry> log;  // file order (the Trainer appends; a resumed run may go back)
  std::int64_t global_step = 0, max_steps = 0;
  std::optional<std::int64_t> logging_steps, eval_steps, train_batch_size, num_train_epochs;
  std::optional<double> best_metric;
  std::optional<std::int64_t> best_global_step;  // newer transformers; else from best_model_checkpoint
  std::string best_model_checkpoint;
  // the final summary entry (only in the top-level file, not in checkpoint-N/)
  std::optional<double> train_runtime_s, train_samples_per_second, train_steps_per_second, train_loss;
  // the Trainer's count of the model FLOPs it ran, summed over the job's processes: 6 x the
  // non-embedding parameters x the main input's elements per step (floating_point_ops; input_ids'
  // tokens, padding included, for a text model); 0 where a trainer does not count (TRL's DPO)
  std::optional<double> total_flos;
  // EarlyStoppingCallback's state (stateful_callbacks, transformers 4.41+)
  std::optional<std::int64_t> early_stopping_patience, early_stopping_patience_counter;
  std::optional<double> early_stopping_threshold;
  // the training entries' step or epoch went backwards: a resumed run (its summary's samples/s then
  // counts only the resumed part's time for the whole run's samples)
  bool resumed = false;
};

// Reads trainer_state.json from its text; `path` names it in messages.
TrainerState parse_trainer_state(const std::string& text, const std::string& path);
TrainerState read_trainer_state(const std::string& path);

// Python's json.dump text with its non-finite tokens (NaN, Infinity, -Infinity outside strings)
// turned into the strings "NaN", "Infinity", "-Infinity", so a strict parser reads it; the count of
// tokens replaced in *replaced.
std::string quote_nonfinite_tokens(const std::string& text, std::size_t* replaced = nullptr);

}  // namespace sb
