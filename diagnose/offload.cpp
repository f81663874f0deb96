// Offload to the CPU: the setting and its modelled cost (offload.hpp).
#include "diagnose/offload.hpp"

#include <algorithm>   // std::max
#include <filesystem>  // std::filesystem::path
#include <system_error>  // std::error_code

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/files.hpp"      // read_regular_file
#include "harness/json_read.hpp"  // parse_json_text

namespace sb::diagnose {

namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

bool offloaded(const json& zero, const char* key) {
  if (!zero.is_object() || !zero.contains(key) || !zero[key].is_object()) return false;
  const json& d = zero[key].value("device", json());
  return d.is_string() && (d.get<std::string>() == "cpu" || d.get<std::string>() == "nvme");
}

// The figure of an expected file for a scenario's metric, where given.
std::optional<std::pair<double, std::string>> figure(const ExpectedFile& f, const std::string& scenario,
                                                     const std::string& metric, const json& params) {
  for (const json& x : f.figures_for(scenario, metric, params))
    if (x.contains("value") && x["value"].is_number())
      return std::make_pair(x["value"].get<double>(), x.value("source", std::string("?")));
  return std::nullopt;
}

}  // namespace

OffloadSetting offload_setting(const TrainConfig& c) {
  OffloadSetting s;
  if (c.fsdp_offload_params) {
    s.params = s.optimizer = true;
    s.what = "fsdp offload_params";
    s.read_from = "the config (FSDP's CPUOffload: parameters, gradients and the optimizer step on the CPU)";
    return s;
  }
  if (c.deepspeed.empty()) return s;
  // the JSON beside the config (Axolotl resolves the path from where it runs; the config's directory is the
  // likeliest), else its name
  std::string where = source_of(c, "deepspeed");
  if (const auto colon = where.rfind(':'); colon != std::string::npos) where.resize(colon);
  const fs::path file = fs::path(c.deepspeed).is_absolute() ? fs::path(c.deepspeed)
                                                            : fs::path(where).parent_path() / c.deepspeed;
  std::error_code ec;
  if (fs::is_regular_file(file, ec)) {
    try {
      const json j = parse_json_text(read_regular_file(file.string(), "DeepSpeed config", 1 << 20), file.string());
      const json zero = j.is_object() ? j.value("zero_optimization", json()) : json();
      s.params = offloaded(zero, "offload_param");
      s.optimizer = offloaded(zero, "offload_optimizer");
      if (zero.is_object() && zero.contains("stage") && zero["stage"].is_number_integer())
        s.zero_stage = std::clamp(zero["stage"].get<int>(), 0, 3);
      s.read_from = file.string();
    } catch (const std::exception& e) {
      s.read_from = fmt::format("{} not read ({}): judged by its name", file.string(), e.what());
    }
  }
  if (s.read_from.empty() || s.read_from.find("judged by its name") != std::string::npos) {
    const std::string name = fs::path(c.deepspeed).filename().string();
    for (int st = 1; st <= 3; ++st)
      if (name.find(fmt::format("zero{}", st)) != std::string::npos) s.zero_stage = st;
    if (name.find("cpuoffload_params") != std::string::npos) {
      s.params = true;
    } else if (name.find("cpuoffload") != std::string::npos) {  // _all, zero3_cpuoffload: both
      s.params = s.optimizer = true;
    }
    if (s.read_from.empty())
      s.read_from = fmt::format("{} is not beside the config: judged by its name, as Axolotl's deepspeed_configs/ "
                                "names them",
                                file.string());
  }
  if (s.on())
    s.what = fmt::format("deepspeed {}: {}{}{}", fs::path(c.deepspeed).filename().string(),
                         s.params ? "offload_param cpu" : "", s.params && s.optimizer ? ", " : "",
                         s.optimizer ? "offload_optimizer cpu" : "");
  return s;
}

std::optional<OffloadCost> offload_cost(const TrainConfig& c, const OffloadSetting& s, std::uint64_t parameters,
                                        const Adapter& ad, const ExpectedFile* gpu) {
  if (!s.on() || parameters == 0) return std::nullopt;
  std::optional<ExpectedFile> ref;
  if (!gpu)
    for (auto& f : load_expected_files())
      if (f.id() == "h100-sxm") ref = f;
  const ExpectedFile* g = gpu ? gpu : ref ? &*ref : nullptr;
  if (!g) return std::nullopt;
  const auto h2d = figure(*g, "dataloader", "h2d_gbs", json{{"pin", "pinned"}});
  const DType dt = c.bf16 ? DType::bf16 : c.fp16 ? DType::fp16 : DType::fp32;
  auto mm = dt == DType::fp32 ? std::nullopt
                              : figure(*g, "precision", "tflops", json{{"dtype", "bf16"}, {"size", 8192}});
  if (!mm)
    if (const auto pk = g->peak_tflops(dt)) mm = std::make_pair(pk->first, pk->second + ", the datasheet peak");
  if (!h2d || !mm || !(h2d->first > 0) || !(mm->first > 0)) return std::nullopt;

  OffloadCost k;
  k.gpu = g->id() + (gpu ? "" : " (this device is no GPU: the H100's rates)");
  const double w = double(std::max(1, c.world_size));
  const double n = double(parameters);
  const double wbytes = dt == DType::fp32 ? 4.0 : 2.0;  // the weights the passes use; their gradients too
  const double ga = double(std::max<std::int64_t>(1, c.gradient_accumulation_steps));
  double bytes = 0;
  std::vector<std::string> parts;
  if (s.params) {
    bytes += 2.0 * ga * n / w * wbytes;
    parts.push_back(fmt::format("the weights host-to-device for each micro-step's forward and backward: 2 x {} x "
                                "{:.3g} parameters / {} GPUs x {} bytes",
                                ga, n, w, wbytes));
  }
  // the gradients to the CPU optimizer, each micro-step (only the adapters' under LoRA)
  const double trained = ad.on ? 0.0 : n;
  if (s.optimizer && trained > 0) {
    bytes += ga * trained / w * wbytes;
    parts.push_back(fmt::format("the gradients device-to-host each micro-step: {} x {:.3g} / {} x {} bytes", ga,
                                trained, w, wbytes));
    if (!s.params) {
      bytes += trained / w * wbytes;
      parts.push_back("the updated weights host-to-device once a step");
    }
  }
  const double tokens = double(c.micro_batch_size) * double(c.sequence_len) * ga;
  k.gb_per_step = bytes / 1e9;
  k.pcie_s = k.gb_per_step / h2d->first;
  k.compute_s = (ad.on ? 4.0 : 6.0) * n * tokens / (mm->first * 1e12);
  if (!(k.compute_s > 0)) return std::nullopt;
  k.gain_overlapped = std::max(k.compute_s, k.pcie_s) / k.compute_s;
  k.gain_serial = (k.compute_s + k.pcie_s) / k.compute_s;
  k.sharded_gib = (ad.on ? n * wbytes : n * (wbytes * 2 + 12.0)) / w / double(1ull << 30);
  for (const auto& p : parts) k.evidence.push_back(p);
  k.evidence.push_back(fmt::format("{:.3g} GB per GPU a step at {} GB/s pinned host-to-device ({}): {:.3g} s",
                                   k.gb_per_step, h2d->first, h2d->second, k.pcie_s));
  k.evidence.push_back(fmt::format("compute: {} x {:.3g} parameters x {:.0f} tokens (micro batch {} x sequence {} x {} "
                                   "accumulated) / {} TFLOP/s ({}): at least {:.3g} s",
                                   ad.on ? 4 : 6, n, tokens, c.micro_batch_size, c.sequence_len, ga, mm->first,
                                   mm->second, k.compute_s));
  k.evidence.push_back("the CPU's optimizer step is not counted: the gain is a lower bound of what offload costs");
  return k;
}

Sharding sharding_of(const TrainConfig& c) {
  Sharding sh;
  sh.world = std::max(1, c.world_size);
  if (!c.deepspeed.empty()) {
    const OffloadSetting s = offload_setting(c);
    sh.stage = s.zero_stage;
    sh.offload_params = s.params;
    sh.offload_optimizer = s.optimizer;
    sh.what = fmt::format("DeepSpeed ZeRO-{} over {} GPU{}{}", s.zero_stage, sh.world, sh.world == 1 ? "" : "s",
                          s.on() ? ", " + s.what : "");
  } else if (c.fsdp_shard > 0 || c.fsdp_offload_params) {
    sh.stage = c.fsdp_shard > 0 ? c.fsdp_shard : 3;
    sh.offload_params = sh.offload_optimizer = c.fsdp_offload_params;
    sh.what = fmt::format("FSDP {} over {} GPU{}{}", sh.stage == 2 ? "shard_grad_op" : "full_shard", sh.world,
                          sh.world == 1 ? "" : "s", c.fsdp_offload_params ? ", offload_params (on the CPU)" : "");
  }
  return sh;
}

std::string memory_remedy(const TrainConfig& c, const Adapter& ad) {
  std::vector<std::string> ways;
  if (!ad.on) ways.push_back("an adapter (adapter: qlora, load_in_4bit: true)");
  else if (ad.base_bits > 4) ways.push_back("a 4-bit base (adapter: qlora, load_in_4bit: true)");
  if (!c.fsdp_offload_params && c.deepspeed.empty()) ways.push_back("sharding (FSDP/DeepSpeed) over more GPUs");
  ways.push_back("a smaller model");
  return fmt::format("{}", fmt::join(ways, ", or "));
}

std::optional<Finding> offload_finding(const TrainConfig& c, const Adapter& ad, std::uint64_t parameters,
                                       const ExpectedFile* device_file) {
  const OffloadSetting s = offload_setting(c);
  if (!s.on()) return std::nullopt;
  const bool gpu = device_file && device_file->doc.value("/hardware/class"_json_pointer, std::string()) == "gpu";
  const auto k = offload_cost(c, s, parameters, ad, gpu ? device_file : nullptr);
  if (!k || k->gain_serial < 1.10) return std::nullopt;
  std::string line;
  if (c.fsdp_offload_params) {
    line = "fsdp_config: offload_params: false";
  } else {
    std::string name = fs::path(c.deepspeed).filename().string();
    for (const char* cut : {"_cpuoffload_all", "_cpuoffload_params", "_cpuoffload"})
      if (const auto at = name.find(cut); at != std::string::npos) {
        name.erase(at, std::string(cut).size());
        break;
      }
    line = name == fs::path(c.deepspeed).filename().string()
               ? "deepspeed: a ZeRO config without offload_param/offload_optimizer"
               : "deepspeed: " + (fs::path(c.deepspeed).parent_path() / name).string();
  }
  Finding f;
  f.cause = "memory pressure and out-of-memory recovery";
  f.summary = fmt::format(
      "offload: modelled from your config: {} moves {:.3g} GB per GPU each optimizer step over PCIe ({:.3g} s on "
      "{}) beside at least {:.3g} s of compute: {:.2f}x (all of it overlapped) to {:.2f}x (none) without it -> {}, if "
      "{:.3g} GiB of weights, "
      "gradients and AdamW state per GPU fits beside the activations (sharded over {} GPU{})",
      s.what, k->gb_per_step, k->pcie_s, k->gpu, k->compute_s, k->gain_overlapped, k->gain_serial, line,
      k->sharded_gib, c.world_size, c.world_size == 1 ? "" : "s");
  f.speedup = k->gain_overlapped;
  json figures = json::array();
  for (const auto& e : k->evidence) figures.push_back(e);
  figures.push_back("settings from " + s.read_from);
  f.evidence = json{{"check", "offload"},
                    {"basis", "modelled"},
                    {"config_line", line},
                    {"gain_overlapped", k->gain_overlapped},
                    {"gain_serial", k->gain_serial},
                    {"figures", figures}};
  return f;
}

}  // namespace sb::diagnose
