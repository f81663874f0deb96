// A run's curves from its TensorBoard event files (readers/tfevents), for a run directory without
// trainer_state.json: Hugging Face's TensorBoardCallback writes each log the Trainer makes as
// scalars named by transformers' rewrite_logs, at the log's global step:
//   train/<key>  a training log's loss, grad_norm, learning_rate, epoch, num_input_tokens_seen, and
//                at the end train/train_runtime, train/train_samples_per_second,
//                train/train_steps_per_second, train/train_loss (the final summary);
//   eval/<key>   an evaluation's eval_<key> (eval/loss is eval_loss).
// The scalars of every file are merged in wall-time order (a resumed run writes a new file), one log
// entry per step and kind, so the same detectors run on them as on trainer_state.json's log_history.
#pragma once

#include <string>  // std::string
#include <vector>  // std::vector

#include "readers/tfevents.hpp"       // TfEvents
#include "readers/trainer_state.hpp"  // TrainerState

namespace sb::diagnose {

// The log as trainer_state.json would hold it; `label` is its path in messages and the report.
// max_steps is 0 (the event files do not record it), best_* unset.
TrainerState state_from_events(const std::vector<TfEvents>& files, const std::string& label);

}  // namespace sb::diagnose
