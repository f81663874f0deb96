// training_args.bin (training_args.hpp): the zip's data.pkl through the strict pickle reader with
// this file's allow-list, then the fields read by name with their types checked.
#include "readers/training_args.hpp"

#include <iterator>  // std::size
#include <cmath>   // std::isfinite
#include <limits>  // std::numeric_limits

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // UsageError
#include "harness/files.hpp"   // read_regular_file
#include "readers/torch_zip.hpp"  // zip_entries, zip_read

namespace sb {

namespace {

using Call = PickleGlobal::Call;
using Ref = PickleDoc::Ref;

// What a training_args.bin names, by the transformers, accelerate, TRL and Axolotl modules that
// define them. Recorded, never imported: a class here is only a name on an object.
constexpr PickleGlobal kArgsClasses[] = {
    {"transformers.training_args", "TrainingArguments", Call::object},
    {"transformers.training_args_seq2seq", "Seq2SeqTrainingArguments", Call::object},
    {"trl.trainer.sft_config", "SFTConfig", Call::object},
    {"trl.trainer.dpo_config", "DPOConfig", Call::object},
    {"trl.trainer.orpo_config", "ORPOConfig", Call::object},
    {"trl.trainer.kto_config", "KTOConfig", Call::object},
    {"trl.trainer.cpo_config", "CPOConfig", Call::object},
    {"trl.trainer.grpo_config", "GRPOConfig", Call::object},
    {"trl.trainer.reward_config", "RewardConfig", Call::object},
    // TRL 1.x moved ORPO and CPO under trl.experimental (checked with trl 1.16.0's classes' __module__)
    {"trl.experimental.orpo.orpo_config", "ORPOConfig", Call::object},
    {"trl.experimental.cpo.cpo_config", "CPOConfig", Call::object},
    {"axolotl.core.training_args", "AxolotlTrainingArguments", Call::object},
    {"axolotl.core.trainer_builder", "AxolotlTrainingArguments", Call::object},
    // Axolotl 0.19.0's RL configs (its wheel's axolotl/core/training_args.py and core/trainers/*/args.py)
    {"axolotl.core.training_args", "AxolotlORPOConfig", Call::object},
    {"axolotl.core.training_args", "AxolotlKTOConfig", Call::object},
    {"axolotl.core.training_args", "AxolotlCPOConfig", Call::object},
    {"axolotl.core.training_args", "AxolotlRewardConfig", Call::object},
    {"axolotl.core.training_args", "AxolotlPRMConfig", Call::object},
    {"axolotl.core.trainers.dpo.args", "AxolotlDPOConfig", Call::object},
    {"axolotl.core.trainers.grpo.args", "AxolotlGRPOConfig", Call::object},
};
static_assert(std::size(kArgsClasses) == 20, "kArgsGlobals lists every class of kArgsClasses");
constexpr PickleGlobal kArgsGlobals[] = {
    kArgsClasses[0], kArgsClasses[1], kArgsClasses[2], kArgsClasses[3], kArgsClasses[4], kArgsClasses[5],
    kArgsClasses[6], kArgsClasses[7], kArgsClasses[8], kArgsClasses[9], kArgsClasses[10], kArgsClasses[11],
    kArgsClasses[12], kArgsClasses[13], kArgsClasses[14], kArgsClasses[15], kArgsClasses[16], kArgsClasses[17],
    kArgsClasses[18], kArgsClasses[19],
    // Axolotl's image_resize_algorithm, when a multimodal config sets it (PIL's enum)
    {"PIL.Image", "Resampling", Call::enum_value},
    // the dataclasses and state objects among the fields
    {"transformers.trainer_pt_utils", "AcceleratorConfig", Call::object},
    {"accelerate.state", "PartialState", Call::object},
    {"torch", "device", Call::object},
    // the enums among the fields (an Enum pickles as its class called with its value)
    {"transformers.trainer_utils", "IntervalStrategy", Call::enum_value},
    {"transformers.trainer_utils", "SaveStrategy", Call::enum_value},
    {"transformers.trainer_utils", "HubStrategy", Call::enum_value},
    {"transformers.trainer_utils", "SchedulerType", Call::enum_value},
    {"transformers.trainer_utils", "FSDPOption", Call::enum_value},
    {"transformers.trainer_utils", "EvaluationStrategy", Call::enum_value},
    {"transformers.training_args", "OptimizerNames", Call::enum_value},
    {"transformers.training_args", "ParallelMode", Call::enum_value},
    {"transformers.debug_utils", "DebugOption", Call::enum_value},
    {"accelerate.utils.dataclasses", "DistributedType", Call::enum_value},
};

bool is_args_class(const PickleGlobal* g) {
  if (!g) return false;
  for (const PickleGlobal& c : kArgsClasses)
    if (c.module == g->module && c.name == g->name) return true;
  return false;
}

std::string describe(const Ref& v) {
  if (v.is_null()) return "None";
  if (v.is_bool()) return v.integer() ? "True" : "False";
  if (v.is_int()) return fmt::format("the integer {}", v.integer());
  if (v.is_real()) return fmt::format("the float {}", v.real());
  if (v.is_str()) return fmt::format("the string '{}'", v.str().substr(0, 40));
  if (v.is_seq()) return "a list";
  if (v.is_dict()) return "a dict";
  if (const PickleGlobal* g = v.global()) return fmt::format("a {}.{}", g->module, g->name);
  return "a value";
}

// The fields of the state dict, each read once by its type, its source recorded.
class Fields {
 public:
  Fields(Ref state, const std::string& path, TrainingArgs& out) : state_(state), path_(path), out_(out) {}
  [[noreturn]] void fail(std::string_view key, const std::string& what) const {
    throw UsageError(fmt::format("{}: TrainingArguments.{}: {}", path_, key, what));
  }
  // The field's value; nullopt when absent or None (an unset optional field).
  std::optional<Ref> get(std::string_view key) {
    const auto v = state_.find(key, &hint_);
    if (!v || v->is_null()) return std::nullopt;
    out_.sources.emplace_back(std::string(key), fmt::format("TrainingArguments.{}", key));
    return v;
  }
  void integer(std::string_view key, std::optional<std::int64_t>& to, std::int64_t lo, std::int64_t hi) {
    const auto v = get(key);
    if (!v) return;
    if (!v->is_int()) fail(key, "expected an integer, got " + describe(*v));
    if (v->integer() < lo || v->integer() > hi) fail(key, fmt::format("{} is outside {} to {}", v->integer(), lo, hi));
    to = v->integer();
  }
  void boolean(std::string_view key, std::optional<bool>& to) {
    const auto v = get(key);
    if (!v) return;
    if (!v->is_bool()) fail(key, "expected True or False, got " + describe(*v));
    to = v->integer() != 0;
  }
  void real(std::string_view key, std::optional<double>& to, double lo, double hi) {
    const auto v = get(key);
    if (!v) return;
    if (!v->is_real() && !v->is_int()) fail(key, "expected a number, got " + describe(*v));
    const double x = v->is_real() ? v->real() : double(v->integer());
    if (!std::isfinite(x)) fail(key, fmt::format("{} is not a finite number", x));
    if (x < lo || x > hi) fail(key, fmt::format("{} is outside {} to {}", x, lo, hi));
    to = x;
  }
  // A string, or an enum whose value is one (SchedulerType('cosine') -> "cosine").
  void text(std::string_view key, std::optional<std::string>& to) {
    const auto v = get(key);
    if (!v) return;
    if (v->is_str()) return void(to = std::string(v->str().substr(0, 4096)));
    if (v->is_object() && v->global()->call == Call::enum_value && v->state() && v->state()->is_str())
      return void(to = std::string(v->state()->str().substr(0, 4096)));
    fail(key, "expected a string or an enum of one, got " + describe(*v));
  }
  // A field that was a bool and became a string ("true"/"false" for the bool).
  void text_or_bool(std::string_view key, std::optional<std::string>& to) {
    const auto v = state_.find(key, &hint_);
    if (v && v->is_bool()) {
      out_.sources.emplace_back(std::string(key), fmt::format("TrainingArguments.{}", key));
      return void(to = v->integer() ? "true" : "false");
    }
    text(key, to);
  }
  bool has(std::string_view key) { return state_.find(key, &hint_).has_value(); }

 private:
  Ref state_;
  const std::string& path_;
  TrainingArgs& out_;
  std::size_t hint_ = 0;
};

constexpr std::int64_t kMaxBatch = std::int64_t(1) << 20, kMaxSteps = std::int64_t(1) << 40;

void read_fields(Fields& f, TrainingArgs& a) {
  f.integer("per_device_train_batch_size", a.per_device_train_batch_size, 1, kMaxBatch);
  f.integer("gradient_accumulation_steps", a.gradient_accumulation_steps, 1, kMaxBatch);
  f.boolean("bf16", a.bf16);
  f.boolean("fp16", a.fp16);
  f.boolean("tf32", a.tf32);
  f.integer("dataloader_num_workers", a.dataloader_num_workers, 0, 1 << 16);
  f.boolean("dataloader_pin_memory", a.dataloader_pin_memory);
  f.integer("dataloader_prefetch_factor", a.dataloader_prefetch_factor, 0, 1 << 20);
  // transformers 5 names it activation_checkpointing too (gradient_checkpointing kept, deprecated): either on is on
  std::optional<bool> activation;
  f.boolean("gradient_checkpointing", a.gradient_checkpointing);
  f.boolean("activation_checkpointing", activation);
  if (activation) a.gradient_checkpointing = *activation || a.gradient_checkpointing.value_or(false);
  f.text("optim", a.optim);
  f.real("learning_rate", a.learning_rate, 0, 1e6);
  f.text("lr_scheduler_type", a.lr_scheduler_type);
  f.real("warmup_steps", a.warmup_steps, 0, double(kMaxSteps));  // transformers 5: a fraction under 1 is a ratio
  f.real("warmup_ratio", a.warmup_ratio, 0, 1);
  f.integer("max_steps", a.max_steps, -1, kMaxSteps);
  f.real("num_train_epochs", a.num_train_epochs, 0, 1e9);
  f.real("logging_steps", a.logging_steps, 0, double(kMaxSteps));
  f.integer("seed", a.seed, std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max());
  f.boolean("logging_nan_inf_filter", a.logging_nan_inf_filter);
  f.boolean("torch_compile", a.torch_compile);
  f.text_or_bool("include_num_input_tokens_seen", a.include_num_input_tokens_seen);
  f.real("max_grad_norm", a.max_grad_norm, 0, 1e30);
  f.real("weight_decay", a.weight_decay, 0, 1e6);
  f.text("output_dir", a.output_dir);
  f.text("logging_dir", a.logging_dir);
  f.integer("max_seq_length", a.max_seq_length, 1, std::int64_t(1) << 24);  // TRL's SFTConfig (older), Axolotl's
  if (!a.max_seq_length) f.integer("max_length", a.max_seq_length, 1, std::int64_t(1) << 24);  // TRL's, newer
  f.boolean("sample_packing", a.packing);  // Axolotl's
  if (!a.packing) f.boolean("packing", a.packing);  // TRL's
  f.text("transformers_version", a.transformers_version);  // no release writes it today; read if one does
  // which release wrote it, from the fields it has (not recorded in the file)
  if (f.has("activation_checkpointing")) a.version_hint = "transformers 5 or later (it has activation_checkpointing)";
  else if (f.has("eval_strategy")) a.version_hint = "transformers 4.41 to 4.x (it has eval_strategy, no activation_checkpointing)";
  else if (f.has("evaluation_strategy")) a.version_hint = "transformers before 4.41 (evaluation_strategy, no eval_strategy)";
}

// The world size: accelerate's PartialState (distributed_state) once the Trainer set the device up.
void read_world_size(Ref state, const std::string& path, TrainingArgs& a) {
  const auto ds = state.find("distributed_state");
  if (!ds || ds->is_null()) return;
  if (!ds->is_object() || !ds->state() || !ds->state()->is_dict())
    throw UsageError(fmt::format("{}: TrainingArguments.distributed_state: expected accelerate's PartialState, got {}",
                                 path, describe(*ds)));
  const auto n = ds->state()->find("num_processes");
  if (!n || n->is_null()) return;
  if (!n->is_int() || n->integer() < 1 || n->integer() > (std::int64_t(1) << 24))
    throw UsageError(fmt::format("{}: TrainingArguments.distributed_state.num_processes: expected a count of "
                                 "processes, got {}",
                                 path, describe(*n)));
  a.world_size = n->integer();
  a.sources.emplace_back("world_size", "TrainingArguments.distributed_state.num_processes");
}

// The torch.save archive's data.pkl: `<archive>/data.pkl`, the archive named as the file was.
std::string data_pkl(std::string_view bytes, const std::string& path, std::string* entry) {
  // torch.save before PyTorch 1.6 (or _use_new_zipfile_serialization=False): pickles back to back,
  // the first the magic number 0x1950a86a20f9469cfc6c as a 10-byte LONG1
  if (looks_like_pickle(bytes) && bytes.size() > 4 && static_cast<unsigned char>(bytes[2]) == 0x8a && bytes[3] == 10)
    throw UsageError(fmt::format("{}: the legacy torch.save format (before PyTorch 1.6): not read; re-save it with a "
                                 "current torch",
                                 path));
  if (!looks_like_zip(bytes))
    throw UsageError(fmt::format("{}: not a torch.save file (no zip header at offset 0)", path));
  for (const ZipEntry& e : zip_entries(bytes, path)) {
    const auto slash = e.name.find('/');
    if (slash != std::string::npos && e.name.substr(slash) == "/data.pkl") {
      *entry = e.name;
      return zip_read(bytes, e, path);
    }
  }
  throw UsageError(fmt::format("{}: a zip without <archive>/data.pkl: not a torch.save file", path));
}

}  // namespace

PickleAllow training_args_globals() {
  return {kArgsGlobals, "the TrainingArguments classes of transformers, TRL and Axolotl, their enums (IntervalStrategy, "
                        "SchedulerType, OptimizerNames, ...), AcceleratorConfig, accelerate's PartialState and "
                        "torch.device"};
}

TrainingArgs parse_training_args(std::string_view bytes, const std::string& path) {
  std::string entry;
  const std::string pkl = data_pkl(bytes, path, &entry);
  // offsets in the pickle's messages are data.pkl's: the entry is named with the file
  const std::string where = fmt::format("{} ({})", path, entry);
  const PickleDoc doc(pkl, where, nullptr, training_args_globals());
  const Ref root = doc.root();
  if (!root.is_object() || !is_args_class(root.global()))
    throw UsageError(fmt::format("{}: holds {}, not a TrainingArguments", where, describe(root)));
  const auto state = root.state();
  if (!state || !state->is_dict())
    throw UsageError(fmt::format("{}: a {} without its fields (no BUILD of a dict)", where, root.global()->name));
  TrainingArgs a;
  a.path = path;
  a.class_name = fmt::format("{}.{}", root.global()->module, root.global()->name);
  Fields f(*state, path, a);
  read_fields(f, a);
  read_world_size(*state, path, a);
  return a;
}

TrainingArgs read_training_args(const std::string& path) {
  const std::string bytes = read_regular_file(path, "training_args.bin", std::size_t(64) << 20);
  return parse_training_args(bytes, path);
}

}  // namespace sb
