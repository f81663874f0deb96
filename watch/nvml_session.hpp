// NVML for `stallbench watch`: every GPU of the machine, sampled the way
// nvidia-smi reads them (utilization, SM clock against its maximum, power
// against the enforced limit, memory used, PCIe throughput, clock event
// (throttle) reasons, temperature, the compute processes). libnvidia-ml.so.1
// is loaded with dlopen and never linked, so stallbench runs where no driver
// is installed; the tests put a fake NVML (tests/fake_nvml) in its place
// through LD_LIBRARY_PATH. No CUDA or NVML header is needed.
#pragma once

#include <memory>  // std::unique_ptr
#include <optional>  // std::optional
#include <string>  // std::string
#include <vector>  // std::vector

#include "readers/telemetry.hpp"  // telemetry::Sample

namespace sb::watch {

struct GpuProcess {
  unsigned pid = 0;
  double used_mib = -1;  // -1: NVML hides it (a container without the PID namespace)
};

struct GpuIdentity {
  int index = 0;
  std::string name, uuid;
  double mem_total_mib = 0, sm_clock_max_mhz = 0, power_limit_w = 0;  // 0: not reported
};

struct LiveSample {
  telemetry::Sample s;
  std::vector<GpuProcess> processes;
  bool processes_known = false;  // the process query answered (this time or, cached, within a second)
  int error = 0;                 // the utilization query's NVML error (0: the sample is good)
  std::string error_text;        // its name, "GPU is lost (15)"
  bool lost = false;             // NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus
};

// Which of NVML's ..._ComputeRunningProcesses functions to call, and the size
// of the record it writes (kernels/nvml/nvml_abi.hpp: three layouts, and one
// function whose record changed with the driver).
struct ProcessQuery {
  int version = 0;               // 1, 2, 3; 0: none, the process list is not read
  const char* symbol = "";       // its name, "" for none
  unsigned record_size = 0;      // bytes per record
};
// _v2 where the library exports it (one layout on every driver), else _v3
// where the driver's version tells its record (nvml_abi::process_info_v3_size),
// else the unversioned v1. `driver` as nvmlSystemGetDriverVersion gives it.
ProcessQuery choose_process_query(bool has_v1, bool has_v2, bool has_v3, const std::string& driver);

class NvmlSession {
 public:
  // Loads and initializes NVML and opens every GPU. On failure returns
  // nullptr and says why in `why` (no libnvidia-ml.so.1, no driver, no GPU).
  static std::unique_ptr<NvmlSession> open(std::string& why);
  ~NvmlSession();  // nvmlShutdown
  NvmlSession(const NvmlSession&) = delete;
  NvmlSession& operator=(const NvmlSession&) = delete;

  const std::vector<GpuIdentity>& gpus() const { return gpus_; }
  std::string driver_version() const { return driver_; }
  std::string library() const;  // the path dlopen found, from dladdr
  // The process query chosen (choose_process_query), "" when the library has none.
  std::string process_query() const;
  // One reading of GPU `slot` (an index into gpus()), t_s left at 0 for the
  // caller to set. A field NVML does not report stays empty. When the
  // utilization query fails, error says how and the rest is not read.
  // PCIe throughput (NVML measures it over 20 ms per call) and the process
  // list are read at most once a second per GPU; between, the last values.
  LiveSample sample(std::size_t slot);

  struct Impl;

 private:
  NvmlSession() = default;
  std::unique_ptr<Impl> impl_;
  std::vector<GpuIdentity> gpus_;
  std::string driver_;
  struct Slow {  // the once-a-second readings of a GPU
    double at = -1e9;
    std::optional<double> tx, rx;
    std::vector<GpuProcess> processes;
    bool processes_known = false;
  };
  std::vector<Slow> slow_;
};

}  // namespace sb::watch
