// A Hugging Face Trainer's training_args.bin (what Trainer, and Axolotl and TRL on top of it, save
// beside each checkpoint): torch.save(args), a zip (readers/torch_zip) whose `<archive>/data.pkl`
// pickles the TrainingArguments object at protocol 2:
//   GLOBAL transformers.training_args TrainingArguments, EMPTY_TUPLE, NEWOBJ, {field: value, ...},
//   BUILD; enums (IntervalStrategy, SchedulerType, OptimizerNames, ...) as GLOBAL + REDUCE of their
//   value; the AcceleratorConfig dataclass as another NEWOBJ + BUILD; once the Trainer has asked for
//   the device, accelerate's PartialState (num_processes: the world size) and torch.device('cpu').
// Read with the strict pickle reader (readers/pickle): the globals on kTrainingArgsGlobals are
// recorded by name and never imported or called; any other (os.system, a class of another
// library) is a UsageError naming it and its byte offset in data.pkl (exit 2), as is a zip or
// pickle that is damaged.
//
// Fields arrive and leave by version: warmup_ratio, logging_dir and evaluation_strategy (before
// 4.41; eval_strategy after) are gone from transformers 5, which adds activation_checkpointing
// beside gradient_checkpointing, mixed_precision, and lets warmup_steps be a fraction. Each is
// optional; a field present with the wrong type, or a number that is NaN, infinite or out of its
// range (a batch of 0, a learning rate under 0), is a UsageError naming the field.
#pragma once

#include <cstdint>   // std::int64_t
#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

#include "readers/pickle.hpp"  // PickleAllow

namespace sb {

struct TrainingArgs {
  std::string path;
  std::string class_name;  // "transformers.training_args.TrainingArguments", "trl.trainer.sft_config.SFTConfig"
  std::optional<std::int64_t> per_device_train_batch_size, gradient_accumulation_steps, dataloader_num_workers,
      dataloader_prefetch_factor, max_steps, seed;
  std::optional<bool> bf16, fp16, tf32, dataloader_pin_memory, gradient_checkpointing, logging_nan_inf_filter,
      torch_compile;
  std::optional<double> learning_rate, warmup_ratio, warmup_steps, num_train_epochs, max_grad_norm, weight_decay;
  std::optional<double> logging_steps;  // under 1: a fraction of the run's steps
  std::optional<std::string> optim, lr_scheduler_type, output_dir, logging_dir;
  // a bool before transformers 5 ("true"/"false" here), then "no", "all" or "non_padding"
  std::optional<std::string> include_num_input_tokens_seen;
  // the processes of the job: accelerate's PartialState.num_processes (saved once the device was set up)
  std::optional<std::int64_t> world_size;
  // the sequence length a subclass records (TRL's SFTConfig max_seq_length / max_length, Axolotl's
  // max_seq_length), and whether it packs (packing / sample_packing)
  std::optional<std::int64_t> max_seq_length;
  std::optional<bool> packing;
  // the transformers release, where the file records one (TrainingArguments itself does not); else
  // what the fields present imply ("5.x (activation_checkpointing)"), said as a guess
  std::optional<std::string> transformers_version;
  std::string version_hint;
  // each field read -> where it came from ("TrainingArguments.bf16", "distributed_state.num_processes")
  std::vector<std::pair<std::string, std::string>> sources;
};

// The globals a training_args.bin may name (the allow-list), and how a refusal describes it.
PickleAllow training_args_globals();

// From the file's bytes; `path` names it in messages.
TrainingArgs parse_training_args(std::string_view bytes, const std::string& path);
TrainingArgs read_training_args(const std::string& path);

}  // namespace sb
