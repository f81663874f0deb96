// The machine fingerprint written into every result's meta: host, OS, CPU
// model and the ISA flags that matter for GEMM, GPUs and library versions.
#pragma once

#include <span>    // std::span
#include <string>  // std::string
#include <vector>  // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/device.hpp"  // Backend

namespace sb {

struct CpuInfo {
  std::string model;
  int logical_cores = 0;
  std::vector<std::string> isa;  // present flags among those in isa_flags_of_interest()
  // x86: "vendor_id" (GenuineIntel, AuthenticAMD) and "cpu family" (AMD Zen 3 and 4: 25, Zen 5: 26;
  // Intel's servers: 6). The same flags run differently on each: AVX512-BF16 is slower than fp32 on
  // an Intel Xeon without AMX and twice as fast on a Zen 4. Empty / -1 when /proc/cpuinfo lacks them.
  std::string vendor;
  int family = -1;
};

// avx2, avx512f, avx512_bf16, avx512_fp16, amx_tile, amx_bf16, amx_int8, amx_fp16
const std::vector<std::string>& isa_flags_of_interest();

// Parses /proc/cpuinfo-format text; the model is the first "model name".
CpuInfo parse_cpuinfo(const std::string& text, int logical_cores);
CpuInfo read_cpu_info();

struct BuildInfo {
  std::string version;
  std::string git_sha;
  std::string compiler;
  std::string build_type;
  nlohmann::ordered_json features;  // cuda, cudnn, nccl, mpi: true/false
};
BuildInfo build_info();

// meta.host/os/cpu/gpus/versions for the result document.
nlohmann::ordered_json machine_fingerprint(std::span<const Backend> backends);

}  // namespace sb
