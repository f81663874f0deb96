#include "watch/nvml_session.hpp"

#include <dlfcn.h>  // dlopen, dlsym, dladdr

#include <algorithm>  // std::min
#include <array>      // std::array
#include <chrono>     // std::chrono::steady_clock
#include <cstring>    // std::memcpy

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // throw_call_failure
#include "kernels/nvml/nvml_abi.hpp"  // the NVML types, declared locally

namespace sb::watch {

using namespace nvml_abi;

namespace {
constexpr const char* kLibrary = "libnvidia-ml.so.1";
constexpr unsigned kMaxProcesses = 64;
}  // namespace

// The entry points, resolved per session. Required: init, shutdown, count,
// handle by index, utilization; the rest leave their field empty when absent.
struct NvmlSession::Impl {
  void* lib = nullptr;
  std::vector<DeviceHandle> handles;
  Return (*init)() = nullptr;
  Return (*shutdown)() = nullptr;
  const char* (*error_string)(Return) = nullptr;
  Return (*count)(unsigned*) = nullptr;
  Return (*handle_by_index)(unsigned, DeviceHandle*) = nullptr;
  Return (*name)(DeviceHandle, char*, unsigned) = nullptr;
  Return (*uuid)(DeviceHandle, char*, unsigned) = nullptr;
  Return (*driver_version)(char*, unsigned) = nullptr;
  Return (*utilization)(DeviceHandle, Utilization*) = nullptr;
  Return (*clock)(DeviceHandle, int, unsigned*) = nullptr;
  Return (*max_clock)(DeviceHandle, int, unsigned*) = nullptr;
  Return (*power)(DeviceHandle, unsigned*) = nullptr;        // mW
  Return (*power_limit)(DeviceHandle, unsigned*) = nullptr;  // mW, enforced
  Return (*memory)(DeviceHandle, Memory*) = nullptr;
  Return (*pcie)(DeviceHandle, int, unsigned*) = nullptr;  // KB/s
  Return (*reasons)(DeviceHandle, unsigned long long*) = nullptr;
  Return (*temperature)(DeviceHandle, int, unsigned*) = nullptr;
  // ..._ComputeRunningProcesses: an array of records whose size depends on the
  // version (choose_process_query); void* as the caller allocates it in bytes.
  using Processes = Return (*)(DeviceHandle, unsigned*, void*);
  Processes processes_v1 = nullptr, processes_v2 = nullptr, processes_v3 = nullptr;
  Processes processes = nullptr;  // the one chosen
  ProcessQuery process_query;

  std::string err(Return r) const {
    const char* s = error_string ? error_string(r) : nullptr;
    return s ? fmt::format("{} ({})", s, r) : fmt::format("NVML error {}", r);
  }
  ~Impl() {
    // dlclose is not called: a library that started threads of its own may
    // still run code from it while the process exits.
    if (shutdown) (void)shutdown();
  }
};

std::unique_ptr<NvmlSession> NvmlSession::open(std::string& why) {
  auto impl = std::make_unique<Impl>();
  impl->lib = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (!impl->lib) {
    const char* e = ::dlerror();
    why = fmt::format("dlopen({}) failed: {} (no NVIDIA driver on this machine?)", kLibrary, e ? e : "unknown error");
    return nullptr;
  }
  std::string missing;
  auto get = [&](const char* symbol, auto& fn, bool required) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(impl->lib, symbol));
    if (!fn && required) missing += (missing.empty() ? "" : ", ") + std::string(symbol);
    return fn != nullptr;
  };
  get("nvmlInit_v2", impl->init, true);
  get("nvmlShutdown", impl->shutdown, true);
  get("nvmlDeviceGetCount_v2", impl->count, true);
  get("nvmlDeviceGetHandleByIndex_v2", impl->handle_by_index, true);
  get("nvmlDeviceGetUtilizationRates", impl->utilization, true);
  if (!missing.empty()) {
    why = fmt::format("{} lacks {}", kLibrary, missing);
    impl->shutdown = nullptr;  // never initialized
    return nullptr;
  }
  get("nvmlErrorString", impl->error_string, false);
  get("nvmlDeviceGetName", impl->name, false);
  get("nvmlDeviceGetUUID", impl->uuid, false);
  get("nvmlSystemGetDriverVersion", impl->driver_version, false);
  get("nvmlDeviceGetClockInfo", impl->clock, false);
  get("nvmlDeviceGetMaxClockInfo", impl->max_clock, false);
  get("nvmlDeviceGetPowerUsage", impl->power, false);
  get("nvmlDeviceGetEnforcedPowerLimit", impl->power_limit, false);
  get("nvmlDeviceGetMemoryInfo", impl->memory, false);
  get("nvmlDeviceGetPcieThroughput", impl->pcie, false);
  get("nvmlDeviceGetTemperature", impl->temperature, false);
  get("nvmlDeviceGetComputeRunningProcesses", impl->processes_v1, false);
  get("nvmlDeviceGetComputeRunningProcesses_v2", impl->processes_v2, false);
  get("nvmlDeviceGetComputeRunningProcesses_v3", impl->processes_v3, false);
  // Renamed in driver 535; older drivers have only the old name.
  if (!get("nvmlDeviceGetCurrentClocksEventReasons", impl->reasons, false))
    get("nvmlDeviceGetCurrentClocksThrottleReasons", impl->reasons, false);

  const auto init = impl->init;
  if (const Return r = init(); r != kSuccess) {
    why = fmt::format("nvmlInit_v2 failed: {}", impl->err(r));
    impl->shutdown = nullptr;
    return nullptr;
  }
  unsigned n = 0;
  if (const Return r = impl->count(&n); r != kSuccess) {
    why = fmt::format("nvmlDeviceGetCount_v2 failed: {}", impl->err(r));
    return nullptr;
  }
  if (n == 0) {
    why = "NVML sees no GPU";
    return nullptr;
  }
  std::unique_ptr<NvmlSession> s(new NvmlSession());
  for (unsigned i = 0; i < n; ++i) {
    DeviceHandle h = nullptr;
    if (const Return r = impl->handle_by_index(i, &h); r != kSuccess) {
      // A GPU NVML cannot open (no permission, lost): the others are still watched.
      why += fmt::format("{}GPU {}: nvmlDeviceGetHandleByIndex_v2 failed: {}", why.empty() ? "" : "; ", i,
                         impl->err(r));
      continue;
    }
    GpuIdentity g;
    g.index = int(i);
    std::array<char, kNameSize> name{};
    if (impl->name && impl->name(h, name.data(), kNameSize) == kSuccess) g.name = name.data();
    std::array<char, kUuidSize> uuid{};
    if (impl->uuid && impl->uuid(h, uuid.data(), kUuidSize) == kSuccess) g.uuid = uuid.data();
    unsigned v = 0;
    if (impl->max_clock && impl->max_clock(h, kClockSm, &v) == kSuccess) g.sm_clock_max_mhz = v;
    if (impl->power_limit && impl->power_limit(h, &v) == kSuccess) g.power_limit_w = v / 1000.0;
    Memory m{};
    if (impl->memory && impl->memory(h, &m) == kSuccess) g.mem_total_mib = double(m.total) / (1 << 20);
    impl->handles.push_back(h);
    s->gpus_.push_back(std::move(g));
  }
  if (s->gpus_.empty()) return nullptr;  // why says each GPU's failure
  std::array<char, kDriverVersionSize> drv{};
  if (impl->driver_version && impl->driver_version(drv.data(), kDriverVersionSize) == kSuccess)
    s->driver_ = drv.data();
  impl->process_query = choose_process_query(impl->processes_v1, impl->processes_v2, impl->processes_v3, s->driver_);
  const int v = impl->process_query.version;
  impl->processes = v == 2 ? impl->processes_v2 : v == 3 ? impl->processes_v3 : v == 1 ? impl->processes_v1 : nullptr;
  s->impl_ = std::move(impl);
  return s;
}

ProcessQuery choose_process_query(bool has_v1, bool has_v2, bool has_v3, const std::string& driver) {
  if (has_v2) return {2, "nvmlDeviceGetComputeRunningProcesses_v2", sizeof(ProcessInfoV2)};
  // _v3's record is the v2 one, or 32 bytes on 535.43-535.86: unknown without the driver's version
  if (const unsigned size = process_info_v3_size(driver.c_str()); has_v3 && size > 0)
    return {3, "nvmlDeviceGetComputeRunningProcesses_v3", size};
  if (has_v1) return {1, "nvmlDeviceGetComputeRunningProcesses", sizeof(ProcessInfoV1)};
  return {};
}

NvmlSession::~NvmlSession() = default;

std::string NvmlSession::process_query() const { return impl_->process_query.symbol; }

std::string NvmlSession::library() const {
  Dl_info info{};
  if (impl_->init && ::dladdr(reinterpret_cast<void*>(impl_->init), &info) && info.dli_fname) return info.dli_fname;
  return kLibrary;
}

LiveSample NvmlSession::sample(std::size_t slot) {
  const Impl& l = *impl_;
  const DeviceHandle h = l.handles.at(slot);
  const GpuIdentity& g = gpus_.at(slot);
  LiveSample out;
  telemetry::Sample& s = out.s;
  s.gpu = g.index;
  Utilization u{};
  if (const Return r = l.utilization(h, &u); r != kSuccess) {
    out.error = r;
    out.error_text = "nvmlDeviceGetUtilizationRates: " + l.err(r);
    out.lost = r == kErrorGpuIsLost;
    return out;
  }
  s.util_pct = std::min(100u, u.gpu);
  s.mem_util_pct = std::min(100u, u.memory);
  unsigned v = 0;
  if (l.clock && l.clock(h, kClockSm, &v) == kSuccess) s.sm_clock_mhz = v;
  if (g.sm_clock_max_mhz > 0) s.sm_clock_max_mhz = g.sm_clock_max_mhz;
  if (l.power && l.power(h, &v) == kSuccess) s.power_w = v / 1000.0;
  // The enforced limit can change while a job runs (nvidia-smi -pl): read each time.
  if (l.power_limit && l.power_limit(h, &v) == kSuccess) s.power_limit_w = v / 1000.0;
  if (l.temperature && l.temperature(h, kTemperatureGpu, &v) == kSuccess) s.temp_c = v;
  Memory m{};
  if (l.memory && l.memory(h, &m) == kSuccess) {
    s.mem_used_mib = double(m.used) / (1 << 20);
    s.mem_total_mib = double(m.total) / (1 << 20);
  }
  unsigned long long reasons = 0;
  if (l.reasons && l.reasons(h, &reasons) == kSuccess) s.clock_event_reasons = reasons;

  // Once a second: PCIe throughput and the processes.
  if (slow_.size() < gpus_.size()) slow_.resize(gpus_.size());
  Slow& sl = slow_[slot];
  const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  if (now - sl.at >= 1.0) {
    sl.at = now;
    // KB/s over NVML's 20 ms window; MB/s here (1 KB = 1024 bytes in NVML's docs).
    sl.tx.reset();
    sl.rx.reset();
    if (l.pcie && l.pcie(h, kPcieTxBytes, &v) == kSuccess) sl.tx = v * 1024.0 / 1e6;
    if (l.pcie && l.pcie(h, kPcieRxBytes, &v) == kSuccess) sl.rx = v * 1024.0 / 1e6;
    sl.processes.clear();
    sl.processes_known = false;
    if (l.processes) {
      // NVML fills nothing when the array is short (INSUFFICIENT_SIZE, with the
      // count it needs): ask again with that many, a few times at most. The
      // array holds `cap` records of the largest size any driver writes, read at
      // the chosen function's size: a driver whose record is not the one
      // expected gives wrong fields, never a write past the end.
      const std::size_t stride = l.process_query.record_size;
      unsigned cap = kMaxProcesses;
      std::vector<unsigned long long> buf;  // 8-byte aligned, as the records' u64 fields need
      for (int attempt = 0; attempt < 3; ++attempt) {
        buf.assign(std::size_t(cap) * kProcessInfoMaxSize / sizeof(unsigned long long), 0);
        unsigned n = cap;
        const Return r = l.processes(h, &n, buf.data());
        if (r == kSuccess) {
          sl.processes_known = true;
          const auto* bytes = reinterpret_cast<const unsigned char*>(buf.data());
          for (unsigned i = 0; i < std::min(n, cap); ++i) {
            ProcessInfoV1 rec{};  // pid and memory lead every version's record at the same offsets
            std::memcpy(&rec, bytes + i * stride, sizeof rec);
            sl.processes.push_back({rec.pid, rec.used_gpu_memory == kValueNotAvailable
                                                 ? -1.0
                                                 : double(rec.used_gpu_memory) / (1 << 20)});
          }
          break;
        }
        if (r != kErrorInsufficientSize || n <= cap || n > 65536) break;
        cap = n + 8;  // processes may start between the calls
      }
    }
  }
  s.pcie_tx_mb_s = sl.tx;
  s.pcie_rx_mb_s = sl.rx;
  out.processes = sl.processes;
  out.processes_known = sl.processes_known;
  return out;
}

}  // namespace sb::watch
