// Parameters and optimizer state offloaded to the CPU (FSDP's offload_params, DeepSpeed ZeRO's
// offload_param / offload_optimizer): what moves over PCIe every optimizer step, and what that costs
// beside the step's compute, modelled from the config (nothing measured: this machine is not theirs).
//
// Per GPU and optimizer step (gradient_accumulation_steps micro-steps, the model sharded over the
// world size): offloaded parameters are fetched host-to-device for each micro-step's forward and again
// for its backward (ZeRO-3 and FSDP gather a layer from the CPU partitions each pass), each micro-step's
// gradients go device-to-host to the CPU optimizer, and with only the optimizer offloaded the updated
// 16-bit weights come back once a step. The time is those bytes at the GPU's published pinned
// host-to-device rate; the compute, 6 (4 under LoRA: a frozen base computes no weight gradients) x the
// parameters x the step's tokens at the GPU's best achievable matmul rate, so a lower bound: the gain
// of turning offload off is then at most (compute + PCIe) / compute (nothing overlapped) and at least
// max(compute, PCIe) / compute (everything overlapped). The CPU's own optimizer step is not counted.
#pragma once

#include <cstdint>   // std::uint64_t
#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

#include "diagnose/config.hpp"     // TrainConfig
#include "diagnose/footprint.hpp"  // Adapter
#include "harness/expected.hpp"    // ExpectedFile
#include "harness/result.hpp"      // Finding

namespace sb::diagnose {

struct OffloadSetting {
  bool params = false, optimizer = false;
  int zero_stage = 0;     // DeepSpeed's zero_optimization.stage (or its file's name: zero1/2/3), 0 none
  std::string what;       // "fsdp offload_params", "deepspeed zero3_bf16_cpuoffload_all.json: offload_param cpu, ..."
  std::string read_from;  // the DeepSpeed JSON read, or why its settings come from its name
  bool on() const { return params || optimizer; }
};

// From the config: fsdp_offload_params (FSDP's CPUOffload keeps the parameters, their gradients and the
// optimizer step on the CPU), or the DeepSpeed JSON named by `deepspeed:` (read beside the config, as
// Axolotl resolves it; zero_optimization.offload_param / offload_optimizer .device cpu or nvme); a
// DeepSpeed file that is not there is judged by Axolotl's shipped names (..._cpuoffload_all.json,
// ..._cpuoffload_params.json, zero3_cpuoffload.json), said so. The YAML's directory is its key's source.
OffloadSetting offload_setting(const TrainConfig& c);

struct OffloadCost {
  double gb_per_step = 0;    // per GPU and optimizer step, over PCIe
  double pcie_s = 0;         // at the published pinned host-to-device rate
  double compute_s = 0;      // at the best achievable matmul rate: a lower bound
  double gain_overlapped = 0, gain_serial = 0;  // turning offload off
  double sharded_gib = 0;    // ZeRO-3 / FSDP without offload: weights, gradients and AdamW state per GPU
  std::string gpu;           // the expected file the rates are from
  std::vector<std::string> evidence;
};

// nullopt when the setting is off or no GPU file has the two rates. `gpu` the device's expected file
// when it is a GPU, else null (then the H100's, said).
std::optional<OffloadCost> offload_cost(const TrainConfig& c, const OffloadSetting& s, std::uint64_t parameters,
                                        const Adapter& ad, const ExpectedFile* gpu);

// How the config shards and offloads the model's states (footprint.hpp's Sharding): DeepSpeed's ZeRO stage
// and offload, or FSDP's sharding (its CPUOffload: parameters, gradients and optimizer on the CPU), over
// the config's world size.
Sharding sharding_of(const TrainConfig& c);

// What to try where checkpointing and a smaller micro batch are not enough for memory: never what the
// config has (an adapter, a 4-bit base, sharding, a smaller model).
std::string memory_remedy(const TrainConfig& c, const Adapter& ad);

// The finding, where offload is on and costs 1.10x or more (serially): the cause, the line to change, the
// gain modelled from the config, its evidence. `device_file` the device's expected file (a CPU's is not a
// GPU's: the H100's rates then), `device` the device's id for the reproduce line.
std::optional<Finding> offload_finding(const TrainConfig& c, const Adapter& ad, std::uint64_t parameters,
                                       const ExpectedFile* device_file);

}  // namespace sb::diagnose
