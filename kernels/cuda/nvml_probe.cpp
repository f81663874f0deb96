#include "kernels/cuda/nvml_probe.hpp"

#include <dlfcn.h>  // dlopen, dlsym, dlerror

#include <algorithm>  // std::clamp
#include <chrono>     // std::chrono::milliseconds
#include <cstdint>    // std::uint64_t
#include <mutex>      // std::mutex, std::lock_guard

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // throw_call_failure, ErrorKind

#include "kernels/nvml/nvml_abi.hpp"  // the NVML types, declared locally (no nvml.h needed), shared with watch/

namespace sb {
namespace {

using namespace nvml_abi;

constexpr const char* kLibrary = "libnvidia-ml.so.1";

// The NVML entry points, resolved once per process. The library stays loaded
// for the life of the process (dlclose during exit could unmap code a
// sampler thread is still running).
struct Library {
  std::string error;  // why loading failed, or ""
  Return (*init)() = nullptr;                                                   // nvmlInit_v2
  Return (*shutdown)() = nullptr;                                               // nvmlShutdown
  const char* (*error_string)(Return) = nullptr;                                // nvmlErrorString
  Return (*system_driver_version)(char*, unsigned) = nullptr;                   // nvmlSystemGetDriverVersion
  Return (*handle_by_pci_bus_id)(const char*, DeviceHandle*) = nullptr;         // ..._v2
  Return (*utilization)(DeviceHandle, Utilization*) = nullptr;                  // nvmlDeviceGetUtilizationRates
  Return (*clock_info)(DeviceHandle, int, unsigned*) = nullptr;                 // nvmlDeviceGetClockInfo
  Return (*power_usage)(DeviceHandle, unsigned*) = nullptr;                     // nvmlDeviceGetPowerUsage (mW)
  Return (*clock_event_reasons)(DeviceHandle, unsigned long long*) = nullptr;  // ...ClocksEventReasons
  const char* clock_event_reasons_name = "";

  std::string name(Return r) const {
    const char* s = error_string ? error_string(r) : nullptr;
    return s ? fmt::format("{} ({})", s, r) : fmt::format("NVML error {}", r);
  }
};

template <class Fn>
bool resolve(void* lib, const char* symbol, Fn& fn) {
  fn = reinterpret_cast<Fn>(::dlsym(lib, symbol));
  return fn != nullptr;
}

const Library& library() {
  static const Library lib = [] {
    Library l;
    void* h = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = ::dlerror();
      l.error = fmt::format("dlopen({}) failed: {}", kLibrary, e ? e : "unknown error");
      return l;
    }
    std::string missing;
    auto need = [&](const char* symbol, auto& fn) {
      if (!resolve(h, symbol, fn)) missing += (missing.empty() ? "" : ", ") + std::string(symbol);
    };
    need("nvmlInit_v2", l.init);
    need("nvmlShutdown", l.shutdown);
    need("nvmlDeviceGetHandleByPciBusId_v2", l.handle_by_pci_bus_id);
    need("nvmlDeviceGetUtilizationRates", l.utilization);
    if (!missing.empty()) {
      l.error = fmt::format("{} lacks {}", kLibrary, missing);
      return l;
    }
    // Optional: a sample leaves the matching field empty without them.
    resolve(h, "nvmlErrorString", l.error_string);
    resolve(h, "nvmlSystemGetDriverVersion", l.system_driver_version);
    resolve(h, "nvmlDeviceGetClockInfo", l.clock_info);
    resolve(h, "nvmlDeviceGetPowerUsage", l.power_usage);
    // Renamed in driver 535 (CUDA 12.2); older drivers have only the old name.
    if (resolve(h, "nvmlDeviceGetCurrentClocksEventReasons", l.clock_event_reasons))
      l.clock_event_reasons_name = "nvmlDeviceGetCurrentClocksEventReasons";
    else if (resolve(h, "nvmlDeviceGetCurrentClocksThrottleReasons", l.clock_event_reasons))
      l.clock_event_reasons_name = "nvmlDeviceGetCurrentClocksThrottleReasons";
    return l;
  }();
  return lib;
}

// nvmlInit_v2 on the first acquire and nvmlShutdown on the last release, so
// every cuda device and probe in the process shares one initialization.
std::mutex g_init_mu;
int g_init_count = 0;

std::string acquire_init() {
  const Library& lib = library();
  if (!lib.error.empty()) return lib.error;
  std::lock_guard lk(g_init_mu);
  if (g_init_count == 0) {
    const Return r = lib.init();
    if (r != kSuccess) return fmt::format("nvmlInit_v2 failed: {}", lib.name(r));
  }
  ++g_init_count;
  return "";
}

void release_init() {
  std::lock_guard lk(g_init_mu);
  if (--g_init_count == 0) (void)library().shutdown();  // nothing useful to do if it fails
}

class NvmlProbe final : public UtilProbe {
 public:
  explicit NvmlProbe(std::shared_ptr<const NvmlGpu> gpu) : gpu_(std::move(gpu)) {}
  UtilSample sample() override;
  std::string source() const override { return "nvml"; }
  // NVML's utilization is the fraction of its own sample period (between
  // 1/6 s and 1 s depending on the product) in which a kernel ran, so reading
  // faster repeats values; 50 ms still follows clock and power changes
  // closely and costs next to nothing.
  std::chrono::milliseconds period() const override { return std::chrono::milliseconds(50); }

 private:
  std::shared_ptr<const NvmlGpu> gpu_;  // keeps NVML initialized
};

}  // namespace

struct NvmlGpu::Impl {
  DeviceHandle device = nullptr;
  std::string pci_bus_id;
};

NvmlGpu::NvmlGpu(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NvmlGpu::~NvmlGpu() { release_init(); }

std::shared_ptr<NvmlGpu> NvmlGpu::open(const std::string& pci_bus_id, std::string& why) {
  if (why = acquire_init(); !why.empty()) return nullptr;
  const Library& lib = library();
  auto impl = std::make_unique<Impl>();
  impl->pci_bus_id = pci_bus_id;
  Return r = lib.handle_by_pci_bus_id(pci_bus_id.c_str(), &impl->device);
  if (r != kSuccess) {
    why = fmt::format("nvmlDeviceGetHandleByPciBusId_v2({}) failed: {}", pci_bus_id, lib.name(r));
    release_init();
    return nullptr;
  }
  // Some configurations (a MIG instance, some vGPUs) have no utilization:
  // then there is nothing to probe.
  Utilization u{};
  if (r = lib.utilization(impl->device, &u); r != kSuccess) {
    why = fmt::format("nvmlDeviceGetUtilizationRates({}) failed: {}", pci_bus_id, lib.name(r));
    release_init();
    return nullptr;
  }
  // From here the NvmlGpu owns the acquired initialization.
  return std::shared_ptr<NvmlGpu>(new NvmlGpu(std::move(impl)));
}

std::unique_ptr<UtilProbe> NvmlGpu::probe(std::shared_ptr<const NvmlGpu> gpu) {
  if (!gpu) return nullptr;
  return std::make_unique<NvmlProbe>(std::move(gpu));
}

nlohmann::ordered_json NvmlGpu::describe() const {
  const Library& lib = library();
  nlohmann::ordered_json j{{"status", "ok"}, {"library", kLibrary}, {"pci_bus_id", impl_->pci_bus_id}};
  char version[kDriverVersionSize] = {};
  if (lib.system_driver_version && lib.system_driver_version(version, kDriverVersionSize) == kSuccess)
    j["driver"] = std::string(version);
  if (*lib.clock_event_reasons_name) j["clock_event_reasons"] = lib.clock_event_reasons_name;
  return j;
}

namespace {
UtilSample NvmlProbe::sample() {
  const Library& lib = library();
  const DeviceHandle dev = gpu_->impl().device;
  UtilSample s;
  Utilization u{};
  if (const Return r = lib.utilization(dev, &u); r != kSuccess)
    throw_call_failure(ErrorKind::runtime, "NVML", "nvmlDeviceGetUtilizationRates(device, &util)", lib.name(r),
                       __FILE__, __LINE__);
  s.util = std::clamp(double(u.gpu) / 100.0, 0.0, 1.0);
  // The rest is best effort: a field stays empty where the GPU or driver
  // does not report it (NVML_ERROR_NOT_SUPPORTED).
  unsigned mhz = 0, milliwatts = 0;
  unsigned long long reasons = 0;
  if (lib.clock_info && lib.clock_info(dev, kClockSm, &mhz) == kSuccess) s.sm_clock_mhz = double(mhz);
  if (lib.power_usage && lib.power_usage(dev, &milliwatts) == kSuccess) s.power_w = double(milliwatts) / 1000.0;
  if (lib.clock_event_reasons && lib.clock_event_reasons(dev, &reasons) == kSuccess)
    s.clock_event_reasons = std::uint64_t(reasons);
  return s;
}
}  // namespace

}  // namespace sb
