// A run's settings (run_settings.hpp): its training_args.bin as facts, and the findings they prove.
#include "diagnose/run/run_settings.hpp"

#include <fmt/format.h>  // fmt::format

namespace sb::diagnose {

using json = nlohmann::ordered_json;

namespace {

std::string source_of(const TrainingArgs& a, const std::string& field) {
  for (const auto& [k, s] : a.sources)
    if (k == field) return s;
  return {};
}

// A number as the report prints it (2e-05, not 2.0000000000000002e-05).
std::string num(double x) { return fmt::format("{:.4g}", x); }

std::string precision_of(const TrainingArgs& a) {
  if (a.bf16.value_or(false)) return "bf16 mixed precision";
  if (a.fp16.value_or(false)) return "fp16 mixed precision";
  if (a.bf16 && a.fp16) return "no mixed precision";
  return "precision not recorded";
}

}  // namespace

json training_args_json(const TrainingArgs& a) {
  json fields = json::object();
  auto put = [&](const std::string& name, const json& value) {
    if (value.is_null()) return;
    const std::string src = source_of(a, name == "gradient_checkpointing" && source_of(a, name).empty()
                                             ? "activation_checkpointing"
                                             : name);
    fields[name] = json{{"value", value}, {"source", src.empty() ? "TrainingArguments" : src}};
  };
  auto opt = [](const auto& o) { return o ? json(*o) : json(); };
  put("per_device_train_batch_size", opt(a.per_device_train_batch_size));
  put("gradient_accumulation_steps", opt(a.gradient_accumulation_steps));
  put("world_size", opt(a.world_size));
  put("bf16", opt(a.bf16));
  put("fp16", opt(a.fp16));
  put("tf32", opt(a.tf32));
  put("dataloader_num_workers", opt(a.dataloader_num_workers));
  put("dataloader_pin_memory", opt(a.dataloader_pin_memory));
  put("dataloader_prefetch_factor", opt(a.dataloader_prefetch_factor));
  put("gradient_checkpointing", opt(a.gradient_checkpointing));
  put("optim", opt(a.optim));
  put("learning_rate", opt(a.learning_rate));
  put("lr_scheduler_type", opt(a.lr_scheduler_type));
  put("warmup_steps", opt(a.warmup_steps));
  put("warmup_ratio", opt(a.warmup_ratio));
  put("max_steps", opt(a.max_steps));
  put("num_train_epochs", opt(a.num_train_epochs));
  put("logging_steps", opt(a.logging_steps));
  put("logging_nan_inf_filter", opt(a.logging_nan_inf_filter));
  put("torch_compile", opt(a.torch_compile));
  put("include_num_input_tokens_seen", opt(a.include_num_input_tokens_seen));
  put("max_grad_norm", opt(a.max_grad_norm));
  put("max_seq_length", opt(a.max_seq_length));
  put("packing", opt(a.packing));
  put("logging_dir", opt(a.logging_dir));
  return json{{"file", a.path},
              {"class", a.class_name},
              {"transformers_version", a.transformers_version ? json(*a.transformers_version)
                                                              : json("not recorded in the file")},
              {"version_hint", a.version_hint},
              {"fields", fields}};
}

std::string settings_reading(const TrainingArgs& a, const SavedModel& m) {
  std::string s = precision_of(a);
  if (!m.torch_dtype.empty()) s += fmt::format(" (the model saved as {})", m.torch_dtype);
  if (a.per_device_train_batch_size)
    s += fmt::format(", micro batch {} x {} accumulated", *a.per_device_train_batch_size,
                     a.gradient_accumulation_steps.value_or(1));
  if (a.world_size) s += fmt::format(" on {} process{}", *a.world_size, *a.world_size == 1 ? "" : "es");
  if (a.max_seq_length)  // a subclass's (TRL's max_length, Axolotl's max_seq_length)
    s += fmt::format(", sequences of {} tokens{}", *a.max_seq_length,
                     a.packing ? (*a.packing ? " packed" : " unpacked") : "");
  if (a.dataloader_num_workers && *a.dataloader_num_workers == 0)
    s += ", batches loaded in the training process (0 workers)";
  else if (a.dataloader_num_workers)
    s += fmt::format(", {} loader worker{}{}", *a.dataloader_num_workers, *a.dataloader_num_workers == 1 ? "" : "s",
                     a.dataloader_pin_memory.value_or(true) ? " pinned" : " unpinned");
  if (a.gradient_checkpointing) s += *a.gradient_checkpointing ? ", gradient checkpointing" : ", no gradient checkpointing";
  if (a.optim) s += ", " + *a.optim;
  if (a.learning_rate) s += fmt::format(", learning_rate {} {}", num(*a.learning_rate), a.lr_scheduler_type.value_or(""));
  if (a.torch_compile.value_or(false)) s += ", torch_compile";
  return s + " (training_args.bin)";
}

namespace {

std::optional<CurveFinding> dtype_finding(const TrainingArgs& a, const SavedModel& m, const std::string& device) {
  if (!a.bf16 || !a.fp16 || *a.bf16 || *a.fp16) return std::nullopt;
  // weights loaded in half precision and trained without autocast are no fp32 run
  if (m.torch_dtype == "bfloat16" || m.torch_dtype == "float16") return std::nullopt;
  CurveFinding f;
  f.kind = "dtype";
  f.cause = "fp32 where bf16 would do";
  f.basis = "assumed";
  const bool fp32 = m.torch_dtype == "float32";
  f.summary = fmt::format("assumed gain: no mixed precision (bf16 and fp16 both False in training_args.bin){}: on a "
                          "GPU with bf16 (Ampere or newer: A100, H100, L4, RTX 30xx and later) bf16: true runs the "
                          "matmuls on tensor cores, typically 2x or more over fp32; the GPU this run used is not "
                          "recorded",
                          fp32 ? fmt::format(", and the model saved as float32 ({}): fp32 throughout", m.file)
                               : ": fp32, unless the model was loaded in half precision (torch_dtype), which "
                                 "training_args.bin does not record");
  f.evidence.push_back(fmt::format("bf16 False, fp16 False ({}, {})", source_of(a, "bf16"), source_of(a, "fp16")));
  if (!a.tf32.value_or(false))
    f.evidence.push_back(fmt::format("tf32 {}: on Ampere or newer, tf32: true alone speeds fp32 matmuls without changing "
                                     "the weights' dtype (assumed)",
                                     a.tf32 ? "False" : "not set (torch's default: off for matmuls)"));
  f.change = "bf16: true (TrainingArguments(bf16=True); Axolotl bf16: auto picks it where the GPU has it)";
  f.reproduce = fmt::format("stallbench run precision -p dtype=fp32,bf16 --device {}", device);
  return f;
}

std::optional<CurveFinding> loader_finding(const TrainingArgs& a, const std::string& device) {
  if (!a.dataloader_num_workers || *a.dataloader_num_workers != 0) return std::nullopt;
  CurveFinding f;
  f.kind = "loader";
  f.cause = "the loader in the training process";
  f.basis = "assumed";
  f.summary = "assumed cost: dataloader_num_workers 0 (training_args.bin): every batch is loaded and collated in the "
              "training process between steps, while the GPU waits; how long depends on what one sample costs to load "
              "(decode, tokenize), which no file of the run records";
  f.evidence.push_back(fmt::format("dataloader_num_workers 0, dataloader_pin_memory {} ({})",
                                   a.dataloader_pin_memory ? (*a.dataloader_pin_memory ? "True" : "False")
                                                           : "not recorded",
                                   source_of(a, "dataloader_num_workers")));
  f.evidence.push_back("measure it on the job: stallbench watch --exec -- <your train command> (a spiky utilization "
                       "is the loader's), or diagnose --trace on a torch.profiler trace (the loader's share of each step)");
  f.change = "dataloader_num_workers: 2 or more, dataloader_pin_memory: true";
  f.reproduce = fmt::format("stallbench run dataloader -p workers=0,2,4 --device {}", device);
  return f;
}

std::optional<CurveFinding> recompute_finding(const TrainingArgs& a, const std::string& device) {
  if (!a.gradient_checkpointing.value_or(false)) return std::nullopt;
  CurveFinding f;
  f.kind = "recompute";
  f.cause = "gradient checkpointing's recompute";
  f.basis = "modelled";
  f.summary = "modelled cost: gradient checkpointing is on (training_args.bin): each step runs the forward pass again "
              "in the backward, about 1.33x the compute of a step without it (the forward is a third of forward + "
              "backward); it buys memory, so it costs time only where the batch would fit without it";
  f.evidence.push_back(fmt::format("gradient_checkpointing True ({})", source_of(a, "gradient_checkpointing").empty()
                                                                           ? source_of(a, "activation_checkpointing")
                                                                           : source_of(a, "gradient_checkpointing")));
  f.change = "gradient_checkpointing: false, if the model and batch fit without it (diagnose CONFIG's memory check "
             "models the footprint)";
  f.reproduce = fmt::format("stallbench run memory -p checkpointing=none,full --device {}", device);
  return f;
}

}  // namespace

std::vector<CurveFinding> settings_findings(const TrainingArgs& a, const SavedModel& m, const std::string& device) {
  std::vector<CurveFinding> out;
  if (auto f = dtype_finding(a, m, device)) out.push_back(*f);
  if (auto f = loader_finding(a, device)) out.push_back(*f);
  if (auto f = recompute_finding(a, device)) out.push_back(*f);
  return out;
}

}  // namespace sb::diagnose
