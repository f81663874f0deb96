// NVML, the library behind nvidia-smi, for one GPU: the utilization a user
// sees, SM clock, power and clock-event (throttle) reasons. Loaded at run time
// with dlopen("libnvidia-ml.so.1") and never linked, so the binary runs where
// no driver is installed; nvmlInit/nvmlShutdown are reference-counted per
// process. Host-only: no NVML or CUDA header is needed to include this.
#pragma once

#include <memory>  // std::shared_ptr, std::unique_ptr
#include <string>  // std::string

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/device.hpp"  // UtilProbe

namespace sb {

class NvmlGpu {
 public:
  // Loads NVML, initializes it and finds the GPU with this PCI bus id (as
  // cudaDeviceGetPCIBusId gives it, "0000:19:00.0"), then reads its
  // utilization once. On any failure returns nullptr and says why in `why`.
  static std::shared_ptr<NvmlGpu> open(const std::string& pci_bus_id, std::string& why);

  ~NvmlGpu();  // releases this GPU's share of nvmlInit
  NvmlGpu(const NvmlGpu&) = delete;
  NvmlGpu& operator=(const NvmlGpu&) = delete;

  // A probe whose sample() reads NVML; it keeps NVML initialized while it lives.
  static std::unique_ptr<UtilProbe> probe(std::shared_ptr<const NvmlGpu> gpu);

  // For DeviceInfo.props["nvml"]: status, library, driver version.
  nlohmann::ordered_json describe() const;

  struct Impl;  // the device handle; defined in nvml_probe.cpp
  const Impl& impl() const { return *impl_; }

 private:
  explicit NvmlGpu(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sb
