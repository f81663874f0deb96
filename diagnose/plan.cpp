// The plan (plan.hpp): the settings with their sources and the checks' config-side skips.
#include "diagnose/plan.hpp"

#include <sstream>  // std::ostringstream

#include <fmt/format.h>  // fmt::format

namespace sb::diagnose {

using json = nlohmann::ordered_json;

std::optional<std::string> skipped_by_config(std::string_view check, const TrainConfig& c) {
  if (check == "loader") {
    if (c.dataloader_num_workers >= 2 && c.dataloader_pin_memory)
      return fmt::format("already {} workers, pinned memory", c.dataloader_num_workers);
    // The trainer's own defaults that keep a GPU fed (Axolotl 0.11+: a worker a rank, pinned, prefetch
    // 256): whether they keep up depends on what a sample costs to load, which a config does not say.
    // Nothing here measures their loader, so nothing is claimed; how to measure it is.
    const std::string src = source_of(c, "dataloader_num_workers");
    if (c.dataloader_num_workers >= 1 && src.find("default_dataloader_opts") != std::string::npos)
      return fmt::format(
          "{} worker(s), pinned memory, prefetch_factor {}: the trainer's default ({}), which prefetches far "
          "ahead; whether it keeps up depends on what one sample costs to load (decode, tokenize), which the "
          "config does not say: measure it on the job (stallbench watch --exec -- <your train command>: a spiky "
          "pattern is the loader's, or diagnose --trace on a torch.profiler trace: the loader's share of each step)",
          c.dataloader_num_workers, c.dataloader_prefetch_factor, src);
  } else if (check == "dtype") {
    if (c.bf16 || c.fp16) {
      const char* d = c.bf16 ? "bf16" : "fp16";
      const std::string src = source_of(c, d);
      return fmt::format("already {}{}", d, src == "default" ? std::string() : " (" + src + ")");
    }
  } else if (check == "padding") {
    if (c.sample_packing) return std::string("sample_packing is on");
    if (!c.packing_unavailable.empty()) return c.packing_unavailable;  // advice the trainer cannot take
  } else if (check == "attention") {
    if (c.flash_attention || c.sdp_attention)
      return c.attn_implementation.empty()
                 ? std::string(c.flash_attention ? "flash_attention is on" : "sdp_attention is on")
                 : fmt::format("the model loads with {} attention, a fused kernel ({})", c.attn_implementation,
                               source_of(c, "attn_implementation"));
  }
  return std::nullopt;
}

std::string format_plan(const TrainConfig& c, const std::string& config_path, const std::string& device, bool quick,
                        double budget_s) {
  std::ostringstream o;
  o << fmt::format("diagnose --plan {} on {} (nothing measured)\n\nsettings, as the checks will use them:\n",
                   config_path.empty() ? "(the default config)" : config_path, device);
  const json j = to_json(c);
  auto row = [&](const std::string& name, const json& e) {
    if (!e.is_object() || !e.contains("value")) return;
    const json& v = e["value"];
    std::string text = v.is_string() ? v.get<std::string>() : v.dump();
    if (text.empty()) text = "-";
    o << fmt::format("  {:<30} {:<18} {}\n", name, text, e.value("source", std::string()));
  };
  for (const auto& [k, v] : j["model"].items()) row("model." + k, v);
  for (const auto& [k, v] : j.items())
    if (k != "model" && k != "lengths" && k != "unknown_keys" && k != "notes" && k != "packing_unavailable") row(k, v);
  if (j["lengths"].value("count", 0) > 0)
    o << fmt::format("  {:<30} {} sequences       {}\n", "lengths", j["lengths"]["count"].get<std::int64_t>(),
                     j["lengths"].value("source", std::string()));
  o << "\nthe checks, in the standard order:\n";
  const bool sim = device.rfind("sim:", 0) == 0, cpu = device == "cpu";
  const std::string how = sim ? "modelled (simulated device)" : "measured here";
  struct Check {
    const char* name;
    const char* runs;
  };
  const Check checks[] = {
      {"utilization", "the batch scenario at your step's shape: tokens/s, busy %, the pattern"},
      {"loader", "the dataloader scenario with your workers, pinning and prefetch against 2+ workers pinned (a "
                 "modelled loader: its gain is said so)"},
      {"dtype", "the precision scenario at your MLP's GEMM: fp32 against bf16"},
      {"padding", "the packing scenario on your lengths (--lengths) or generated ones: your padding against "
                  "best-fit packing"},
      {"attention", "the attention scenario at your sequence length: eager against fused"},
      {"batch", "the batch scenario's micro batch sweep from yours, your global batch held"},
      {"memory", "the footprint at full depth against the device's memory (not measured)"},
      {"applied", "the train scenario (your loop) with each recommended line applied, measured twice"},
  };
  for (const Check& k : checks) {
    const auto skip = skipped_by_config(k.name, c);
    if (skip)
      o << fmt::format("  {:<12} skipped: {}\n", k.name, *skip);
    else
      o << fmt::format("  {:<12} {}: {}\n", k.name, std::string(k.name) == "memory" ? "modelled" : how, k.runs);
  }
  // the applied check's runs take the budget; the checks before it took 9-20 s (--quick) to about a minute
  // on 2 cores (docs/commands/diagnose.md "How long it takes")
  o << fmt::format("\nabout {:.0f}-{:.0f} s in all: {:.0f} s for your loop with each line applied (--budget), and "
                   "{} for the checks before it{}\n",
                   budget_s + (quick ? 10 : 30), budget_s + (quick ? 40 : 120), budget_s,
                   quick ? "10-40 s" : "30-120 s", cpu ? " (a CPU runs them at a reduced shape)" : "");
  if (!c.notes.empty()) {
    o << "\nnotes:\n";
    for (const auto& n : c.notes) o << "  " << n << "\n";
  }
  if (!c.unknown_keys.empty()) o << fmt::format("\n{} key(s) of the config not used here\n", c.unknown_keys.size());
  return o.str();
}

}  // namespace sb::diagnose
