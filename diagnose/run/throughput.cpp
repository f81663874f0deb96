// The logged throughput, corrected and held against the GPU (throughput.hpp).
#include "diagnose/run/throughput.hpp"

#include <algorithm>  // std::max
#include <cctype>     // std::tolower
#include <cmath>      // std::llround, std::abs, std::isfinite

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/dtype.hpp"     // DType, parse_dtype
#include "harness/errors.hpp"    // UsageError
#include "harness/expected.hpp"  // load_expected_files

namespace sb::diagnose {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool gpu_file(const ExpectedFile& f) { return f.doc.value("/hardware/class"_json_pointer, std::string()) == "gpu"; }

// The run's dtype for the peak: training_args.bin's mixed precision, else config.json's saved dtype
// (bfloat16: a bf16 run, most likely), else bf16 assumed (what fine-tunes on these GPUs run).
std::pair<DType, std::string> run_dtype(const TrainingArgs* a, const std::string& saved, const TrainConfig* axo) {
  if (a && a->bf16.value_or(false)) return {DType::bf16, "training_args.bin bf16"};
  if (a && a->fp16.value_or(false)) return {DType::fp16, "training_args.bin fp16"};
  if (a && a->bf16 && a->fp16) {
    if (a->tf32.value_or(false)) return {DType::tf32, "training_args.bin: no mixed precision, tf32 on"};
    return {DType::fp32, "training_args.bin: no mixed precision"};
  }
  if (axo && (axo->bf16 || axo->bfloat16)) return {DType::bf16, "the Axolotl config's bf16"};
  if (axo && (axo->fp16 || axo->float16)) return {DType::fp16, "the Axolotl config's fp16"};
  if (axo) return {axo->tf32 ? DType::tf32 : DType::fp32, "the Axolotl config: no half precision"};
  if (saved == "bfloat16") return {DType::bf16, "config.json torch_dtype bfloat16 (no training_args.bin)"};
  if (saved == "float16") return {DType::fp16, "config.json torch_dtype float16 (no training_args.bin)"};
  return {DType::bf16, "assumed bf16 (neither training_args.bin nor config.json says)"};
}

// The largest dense peak of any GPU file, any dtype but fp8 (what no count of model FLOPs can pass).
double best_peak_tflops(const std::vector<ExpectedFile>& files) {
  double best = 0;
  for (const auto& f : files)
    if (gpu_file(f))
      for (DType t : {DType::bf16, DType::fp16, DType::tf32, DType::fp32})
        if (const auto p = f.peak_tflops(t)) best = std::max(best, p->first);
  return best;
}

// find_gpu_file over files already loaded
std::string gpu_file_in(const std::string& name, const std::vector<ExpectedFile>& files) {
  const std::string want = lower(name);
  if (want.empty()) return {};
  std::vector<std::string> hits;
  for (const auto& f : files) {
    if (!gpu_file(f)) continue;
    const std::string id = lower(f.id());
    bool hit = id.rfind(want, 0) == 0 || lower(f.doc.value("/hardware/name"_json_pointer, std::string())).find(want) !=
                                             std::string::npos;
    const auto& m = f.doc.value("/hardware/match/name_contains"_json_pointer, nlohmann::ordered_json::array());
    for (const auto& s : m)
      if (s.is_string() && want.find(lower(s.get<std::string>())) != std::string::npos) hit = true;
    if (hit) hits.push_back(f.id());
  }
  if (hits.size() > 1) {
    for (const auto& h : hits)
      if (lower(h) == want) return h;
    throw UsageError(fmt::format("--gpu {}: fits {} (name one)", name, fmt::join(hits, ", ")));
  }
  return hits.empty() ? std::string() : hits.front();
}

}  // namespace

std::string find_gpu_file(const std::string& name) { return gpu_file_in(name, load_expected_files()); }

double hf_counted_params(const ModelDims& d) {
  const double h = double(d.hidden_size);
  const double kvw = double(d.kv_heads()) * h / double(std::max<std::int64_t>(1, d.num_attention_heads));
  const double attn = h * (h + 2.0 * kvw) + h * h;
  const double mlp = (d.gated_mlp ? 3.0 : 2.0) * h * double(d.weight_intermediate());
  const double router = d.moe() ? h * double(d.num_experts) : 0.0;
  return double(d.num_hidden_layers) * (attn + mlp + router) + (d.tie_word_embeddings ? 0.0 : h * double(d.vocab_size));
}

ThroughputReading read_throughput(const TrainerState& s, const TrainingArgs* args, const ModelDims* dims,
                                  bool adapters, const std::string& saved_dtype, const ThroughputOptions& o,
                                  const TrainConfig* axolotl) {
  ThroughputReading t;
  if (!s.train_runtime_s || !(*s.train_runtime_s > 0) || !std::isfinite(*s.train_runtime_s)) return t;
  const std::vector<ExpectedFile> files = load_expected_files();  // read once: the peaks and the GPU named
  t.present = true;
  t.runtime_s = *s.train_runtime_s;
  t.logged_samples_per_s = s.train_samples_per_second.value_or(0);
  t.logged_steps_per_s = s.train_steps_per_second.value_or(0);
  t.samples_per_s = t.logged_samples_per_s;
  t.steps_per_s = t.logged_steps_per_s;
  if (!std::isfinite(t.samples_per_s) || t.samples_per_s < 0) t.samples_per_s = t.logged_samples_per_s = 0;
  if (!std::isfinite(t.steps_per_s) || t.steps_per_s < 0) t.steps_per_s = t.logged_steps_per_s = 0;

  // The planned steps the summary divides: steps/s x runtime is max_steps (to the summary's 3 decimals)
  const double planned = t.logged_steps_per_s * t.runtime_s;
  const bool of_plan = s.max_steps > 0 && std::abs(planned - double(s.max_steps)) <= 0.02 * double(s.max_steps) + 1.0;
  const double samples = t.logged_samples_per_s * t.runtime_s;
  if (of_plan && s.max_steps > 0 && samples > 0) {
    t.global_batch = std::llround(samples / double(s.max_steps));
  } else if (t.logged_steps_per_s > 0 && t.logged_samples_per_s > 0) {
    t.global_batch = std::llround(t.logged_samples_per_s / t.logged_steps_per_s);
  }
  if (t.global_batch && *t.global_batch < 1) t.global_batch.reset();
  if (of_plan && !s.resumed && s.global_step > 0 && double(s.global_step) < 0.98 * double(s.max_steps)) {
    t.stopped_early = true;
    t.steps_per_s = double(s.global_step) / t.runtime_s;
    t.samples_per_s = t.global_batch ? t.steps_per_s * double(*t.global_batch)
                                     : t.logged_samples_per_s * double(s.global_step) / double(s.max_steps);
    t.notes.push_back(fmt::format(
        "the run stopped at step {} of max_steps {}, and the Trainer's summary divides the planned run by the time "
        "it took: {:.4g} steps/s and {:.4g} samples/s really ({:.4g} and {:.4g} logged, {:.1f}x over)",
        s.global_step, s.max_steps, t.steps_per_s, t.samples_per_s, t.logged_steps_per_s, t.logged_samples_per_s,
        double(s.max_steps) / double(s.global_step)));
  }
  if (s.resumed)
    t.caveats.push_back("the run was resumed (its step goes back in the log): the Trainer divides the whole run's "
                        "samples and FLOPs by the resumed part's time, so samples/s and the FLOP rate overstate");

  // The job's processes
  const std::int64_t per_device = s.train_batch_size.value_or(
      args && args->per_device_train_batch_size ? *args->per_device_train_batch_size
      : axolotl                                 ? axolotl->micro_batch_size
                                                : 0);
  const std::optional<std::int64_t> accum = args && args->gradient_accumulation_steps ? args->gradient_accumulation_steps
                                            : axolotl ? std::optional<std::int64_t>(axolotl->gradient_accumulation_steps)
                                                      : std::nullopt;
  if (o.world_size > 0) {
    t.world = o.world_size;
    t.world_source = "--world-size";
  } else if (args && args->world_size && *args->world_size > 0) {
    t.world = *args->world_size;
    t.world_source = "training_args.bin (accelerate's num_processes)";
  } else if (t.global_batch && per_device > 0 && accum && *accum > 0 && *t.global_batch % (per_device * *accum) == 0) {
    t.world = *t.global_batch / (per_device * *accum);
    t.world_source = fmt::format("inferred: {} samples per step / (per-device batch {} x accumulation {})",
                                 *t.global_batch, per_device, *accum);
  } else if (t.global_batch && per_device > 0 && *t.global_batch >= per_device) {
    t.world_max = *t.global_batch / per_device;
    t.world_source = t.world_max == 1 ? fmt::format("one: the per-device batch {} is the step's {} samples", per_device,
                                                    *t.global_batch)
                                      : fmt::format("1 to {}: {} samples per step over a per-device batch of {}, the "
                                                    "accumulation unknown (--world-size N)",
                                                    t.world_max, *t.global_batch, per_device);
    if (t.world_max == 1) {
      t.world = 1;
      t.world_max = 0;
    }
  } else {
    t.world_source = "unknown (--world-size N)";
  }
  if (t.world && o.world_size > 0 && args && args->world_size && *args->world_size != o.world_size)
    t.notes.push_back(fmt::format("--world-size {} where training_args.bin says {}: --world-size used", o.world_size,
                                  *args->world_size));

  // The model FLOP rate, the Trainer's count
  if (!s.total_flos || !std::isfinite(*s.total_flos) || *s.total_flos <= 0) {
    t.flops_note = s.total_flos ? "total_flos is 0: this trainer does not count FLOPs (TRL's DPO and other "
                                  "trainers that override the step)"
                                : "no total_flos in the log";
  } else if (s.resumed) {
    t.flops_note = "not used: total_flos counts the steps before the resume, train_runtime does not";
  } else {
    const double rate = *s.total_flos / t.runtime_s / 1e12;
    const double best = best_peak_tflops(files);
    const std::int64_t most = t.world ? *t.world : t.world_max;
    if (most > 0 && best > 0 && rate / double(most) > best) {
      t.flops_note = fmt::format(
          "not model FLOPs: total_flos / train_runtime is {:.4g} TFLOP/s on at most {} GPU{}, past any GPU's peak "
          "({:.4g}); the Trainer counts the main input's elements as tokens, so a model whose input is audio "
          "features or pixels (Whisper, TrOCR, ViT) counts those",
          rate, most, most == 1 ? "" : "s", best);
    } else {
      t.model_tflops = rate;
      t.flops_note = fmt::format("total_flos / train_runtime: the Trainer's count of 6 x the non-embedding parameters "
                                 "x the input tokens, padding included{}",
                                 adapters ? "; a PEFT run's frozen base computes no weight gradients, so about 2/3 "
                                            "of the counted work was done (the MFU overstates by up to 1.5x)"
                                          : "");
      if (dims) {
        const double n = hf_counted_params(*dims);
        if (n > 0) {
          t.tokens_per_s = *s.total_flos / (6.0 * n) / t.runtime_s;
          t.tokens_source = fmt::format("total_flos / (6 x {:.4g} parameters, the model's config.json) / train_runtime",
                                        n);
          if (t.samples_per_s > 0)
            t.notes.push_back(fmt::format("about {:.0f} tokens per sample (padding included)",
                                          *t.tokens_per_s / t.samples_per_s));
        }
      }
    }
  }

  // The GPU and its peak for the run's dtype
  if (!o.gpu.empty()) {
    const std::string id = gpu_file_in(o.gpu, files);
    if (id.empty()) {
      std::vector<std::string> ids;
      for (const auto& f : files)
        if (gpu_file(f)) ids.push_back(f.id());
      t.caveats.push_back(fmt::format("{} {}: no expected numbers for that GPU (known: {})", o.gpu_from, o.gpu,
                                      fmt::join(ids, ", ")));
    } else {
      const auto [dt, dt_src] = run_dtype(args, saved_dtype, axolotl);
      for (const auto& f : files) {
        if (f.id() != id) continue;
        const auto p = f.peak_tflops(dt);
        if (!p) {
          t.caveats.push_back(fmt::format("{} has no {} peak", id, to_string(dt)));
          break;
        }
        t.gpu = GpuPeak{id, f.doc.value("/hardware/name"_json_pointer, id), std::string(to_string(dt)), dt_src,
                        p->first, p->second};
      }
    }
  }
  if (t.gpu && t.model_tflops) {
    const std::int64_t least = t.world ? *t.world : 1;
    t.mfu_pct = 100.0 * *t.model_tflops / (double(least) * t.gpu->tflops);
    t.mfu_is_bound = !t.world;
    if (!t.world && t.world_max > 1) t.mfu_min_pct = 100.0 * *t.model_tflops / (double(t.world_max) * t.gpu->tflops);
    if (*t.mfu_pct > 100.0 && t.world) {
      t.caveats.push_back(fmt::format("{:.0f}% of {}'s {} peak on {} GPU{}: more than the GPUs can do, so the GPU, "
                                      "the world size or the Trainer's count is not the run's",
                                      *t.mfu_pct, t.gpu->id, t.gpu->dtype, *t.world, *t.world == 1 ? "" : "s"));
      t.mfu_pct.reset();
    }
  }
  return t;
}

}  // namespace sb::diagnose
