// The event files' scalars as a Trainer's log (event_curves.hpp).
#include "diagnose/run/event_curves.hpp"

#include <algorithm>    // std::stable_sort, std::max
#include <cstdint>      // std::uint32_t
#include <string_view>  // std::string_view

namespace sb::diagnose {

namespace {

// One scalar of one file, with its place in the merged order.
struct Item {
  double wall = 0;
  std::int64_t step = 0;
  std::size_t order = 0;  // file order, then the tag's order in its file
  std::string_view tag;
  double value = 0;
};

// The bit of a training log's key in an entry's mask (a key seen twice at one step starts a new entry).
std::uint32_t train_bit(std::string_view key) {
  if (key == "loss") return 1;
  if (key == "grad_norm") return 2;
  if (key == "learning_rate") return 4;
  if (key == "epoch") return 8;
  if (key == "num_input_tokens_seen") return 16;
  return 0;
}

void set_train(TrainerLogEntry& e, std::string_view key, double v) {
  if (key == "loss") e.loss = v;
  else if (key == "grad_norm") e.grad_norm = v;
  else if (key == "learning_rate") e.learning_rate = v;
  else if (key == "epoch") e.epoch = v;
  else if (key == "num_input_tokens_seen" && v >= 0 && v < 9e18) e.num_input_tokens_seen = std::int64_t(v);
}

// The final summary's keys (train/train_*): true when the tag was one.
bool set_summary(TrainerState& s, std::string_view key, double v) {
  if (key == "train_runtime") s.train_runtime_s = v;
  else if (key == "train_samples_per_second") s.train_samples_per_second = v;
  else if (key == "train_steps_per_second") s.train_steps_per_second = v;
  else if (key == "train_loss") s.train_loss = v;
  else if (key == "total_flos") s.total_flos = v;
  else return false;
  return true;
}

}  // namespace

TrainerState state_from_events(const std::vector<TfEvents>& files, const std::string& label) {
  std::vector<Item> items;
  std::size_t order = 0;
  for (const TfEvents& f : files)
    for (const auto& [tag, series] : f.scalars)
      for (const TfScalar& x : series) items.push_back({x.wall_time, x.step, order++, tag, x.value});
  // wall time orders the files of a resumed run; within a time, the step, then the file's order
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.wall != b.wall) return a.wall < b.wall;
    if (a.step != b.step) return a.step < b.step;
    return a.order < b.order;
  });
  TrainerState s;
  s.path = label;
  std::size_t train = SIZE_MAX, eval = SIZE_MAX;  // the open entries
  std::uint32_t train_mask = 0;
  std::int64_t last_train_step = -1;
  for (const Item& it : items) {
    s.global_step = std::max(s.global_step, it.step);
    if (it.tag.rfind("train/", 0) == 0) {
      const std::string_view key = it.tag.substr(6);
      if (set_summary(s, key, it.value)) continue;
      const std::uint32_t bit = train_bit(key);
      if (!bit) continue;  // total_flos and the like
      if (train == SIZE_MAX || s.log[train].step != it.step || (train_mask & bit)) {
        s.log.emplace_back();
        s.log.back().step = it.step;
        train = s.log.size() - 1;
        train_mask = 0;
        if (it.step < last_train_step) s.resumed = true;
        last_train_step = it.step;
      }
      train_mask |= bit;
      set_train(s.log[train], key, it.value);
    } else if (it.tag.rfind("eval/", 0) == 0) {
      const std::string key = "eval_" + std::string(it.tag.substr(5));
      if (key == "eval_runtime" || key == "eval_samples_per_second" || key == "eval_steps_per_second") continue;
      if (key == "eval_epoch") continue;
      if (eval == SIZE_MAX || s.log[eval].step != it.step ||
          (key == "eval_loss" ? s.log[eval].eval_loss.has_value() : s.log[eval].eval.count(key) > 0)) {
        s.log.emplace_back();
        s.log.back().step = it.step;
        eval = s.log.size() - 1;
      }
      if (key == "eval_loss") s.log[eval].eval_loss = it.value;
      else s.log[eval].eval[key] = it.value;
    }
  }
  // an entry of only an epoch (the summary's log carries one) is neither a training nor an evaluation log
  std::erase_if(s.log, [](const TrainerLogEntry& e) { return !e.is_train() && !e.is_eval(); });
  return s;
}

}  // namespace sb::diagnose
