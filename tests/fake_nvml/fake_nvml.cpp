// A fake libnvidia-ml.so.1 for the tests of `stallbench watch`: the NVML
// entry points watch/nvml_session.cpp resolves, answering from a recorded
// series instead of a GPU. Loaded through LD_LIBRARY_PATH in place of the
// driver's library; the ABI is kernels/nvml/nvml_abi.hpp's (NVML's own layouts).
//
// FAKE_NVML_SERIES names a JSON file:
//   {"driver": "570.86.15", "advance": "call" | "time", "period_ms": 100, "end": "hold" | "loop",
//    "gpus": [{"name": "NVIDIA H200", "uuid": "GPU-...", "mem_total_mib": 143771,
//              "sm_clock_max_mhz": 1980, "power_limit_w": 700,
//              "rows": [{"util": 97, "mem_util": 40, "sm_clock_mhz": 1980, "power_w": 640,
//                        "mem_used_mib": 70000, "reasons": 0, "pcie_tx_kb_s": 1000,
//                        "pcie_rx_kb_s": 2000, "temp_c": 60, "procs": [[4242, 69000]]}, ...]}]}
// "advance": "call" moves a GPU to its next row at each nvmlDeviceGetUtilizationRates
// call on it (deterministic: one watch sample, one row); "time" at each period_ms
// since nvmlInit_v2. After the last row a GPU holds it ("hold") or starts again ("loop").
// A field absent from a row answers NVML_ERROR_NOT_SUPPORTED.
// FAKE_NVML_FAIL: "init" (nvmlInit_v2 fails: driver not loaded), "nogpu" (count 0),
// "lost@N" (utilization fails with NVML_ERROR_GPU_IS_LOST from the Nth call on).
//
// The compute processes ("procs": [[pid, MiB or -1 for hidden], ...]) are answered by
// the three versions of the query, each with its driver's record (kernels/nvml/nvml_abi.hpp):
// nvmlDeviceGetComputeRunningProcesses 16 bytes, _v2 24 bytes, _v3 24 bytes or, for a
// "driver" of 535.43 through 535.86 (535.54.03), 32 bytes as those drivers wrote it.
// FAKE_NVML_ABSENT lists entry points the library does not export (comma-separated
// names, read at each dlsym: the three are GNU indirect functions whose resolver answers
// null), as 535.98 lacks _v3 and R430 _v2. A guard: a process query writes no byte past
// the array it was given (its malloc_usable_size: the caller's array must come from the
// heap); the bytes it would have written past are counted instead, for the tests to read
// through fake_nvml_overflow_bytes().
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <malloc.h>  // malloc_usable_size
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/nvml/nvml_abi.hpp"

using namespace sb::nvml_abi;
using json = nlohmann::json;

namespace {

struct Gpu {
  json spec;
  std::size_t calls = 0;  // utilization calls so far
};

struct State {
  std::mutex mu;
  bool initialized = false;
  json doc;
  std::vector<Gpu> gpus;
  std::chrono::steady_clock::time_point t0;
  std::string fail;
  std::size_t overflow_bytes = 0;  // what process queries would have written past their arrays
};

State& st() {
  static State s;
  return s;
}

Gpu* gpu_of(DeviceHandle h) {
  State& s = st();
  const auto i = reinterpret_cast<std::uintptr_t>(h);
  if (i == 0 || i > s.gpus.size()) return nullptr;
  return &s.gpus[i - 1];
}

// The row a GPU is at now (utilization calls advance it, in "call" mode).
const json* row(Gpu& g) {
  State& s = st();
  const json& rows = g.spec["rows"];
  if (!rows.is_array() || rows.empty()) return nullptr;
  std::size_t i = 0;
  if (s.doc.value("advance", std::string("call")) == "time") {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s.t0).count();
    i = std::size_t(ms / std::max(1.0, s.doc.value("period_ms", 100.0)));
  } else {
    i = g.calls == 0 ? 0 : g.calls - 1;
  }
  if (i >= rows.size()) i = s.doc.value("end", std::string("hold")) == "loop" ? i % rows.size() : rows.size() - 1;
  return &rows[i];
}

template <class T>
Return field(DeviceHandle h, const char* key, T* out, double scale = 1) {
  std::lock_guard lk(st().mu);
  if (!st().initialized) return kErrorUninitialized;
  Gpu* g = gpu_of(h);
  if (!g || !out) return kErrorInvalidArgument;
  const json* r = row(*g);
  if (!r || !r->contains(key) || !(*r)[key].is_number()) return kErrorNotSupported;
  *out = T((*r)[key].get<double>() * scale);
  return kSuccess;
}

Return spec_field(DeviceHandle h, const char* key, unsigned* out, double scale) {
  std::lock_guard lk(st().mu);
  if (!st().initialized) return kErrorUninitialized;
  Gpu* g = gpu_of(h);
  if (!g || !out) return kErrorInvalidArgument;
  if (!g->spec.contains(key)) return kErrorNotSupported;
  *out = unsigned(g->spec[key].get<double>() * scale);
  return kSuccess;
}

Return copy_string(const std::string& v, char* buf, unsigned n) {
  if (!buf) return kErrorInvalidArgument;
  if (v.size() + 1 > n) return kErrorInsufficientSize;
  std::memcpy(buf, v.c_str(), v.size() + 1);
  return kSuccess;
}

}  // namespace

#define FAKE_API extern "C" __attribute__((visibility("default")))

FAKE_API Return nvmlInit_v2() {
  State& s = st();
  std::lock_guard lk(s.mu);
  const char* fail = std::getenv("FAKE_NVML_FAIL");
  s.fail = fail ? fail : "";
  if (s.fail == "init") return kErrorDriverNotLoaded;
  const char* path = std::getenv("FAKE_NVML_SERIES");
  if (!path) return kErrorUnknown;
  std::ifstream f(path);
  s.doc = json::parse(f, nullptr, false);
  if (s.doc.is_discarded() || !s.doc.contains("gpus")) return kErrorUnknown;
  s.gpus.clear();
  if (s.fail != "nogpu")
    for (const auto& g : s.doc["gpus"]) s.gpus.push_back({g, 0});
  s.t0 = std::chrono::steady_clock::now();
  s.initialized = true;
  return kSuccess;
}

FAKE_API Return nvmlShutdown() {
  std::lock_guard lk(st().mu);
  if (!st().initialized) return kErrorUninitialized;
  st().initialized = false;
  return kSuccess;
}

FAKE_API const char* nvmlErrorString(Return r) {
  switch (r) {
    case kSuccess: return "Success";
    case kErrorUninitialized: return "Uninitialized";
    case kErrorInvalidArgument: return "Invalid Argument";
    case kErrorNotSupported: return "Not Supported";
    case kErrorInsufficientSize: return "Insufficient Size";
    case kErrorDriverNotLoaded: return "Driver Not Loaded";
    case kErrorGpuIsLost: return "GPU is lost";
    default: return "Unknown Error";
  }
}

FAKE_API Return nvmlSystemGetDriverVersion(char* buf, unsigned n) {
  std::lock_guard lk(st().mu);
  return copy_string(st().doc.value("driver", std::string("0.0 (fake)")), buf, n);
}

FAKE_API Return nvmlDeviceGetCount_v2(unsigned* n) {
  std::lock_guard lk(st().mu);
  if (!st().initialized) return kErrorUninitialized;
  if (!n) return kErrorInvalidArgument;
  *n = unsigned(st().gpus.size());
  return kSuccess;
}

FAKE_API Return nvmlDeviceGetHandleByIndex_v2(unsigned i, DeviceHandle* h) {
  std::lock_guard lk(st().mu);
  if (!st().initialized) return kErrorUninitialized;
  if (!h || i >= st().gpus.size()) return kErrorInvalidArgument;
  *h = reinterpret_cast<DeviceHandle>(std::uintptr_t(i + 1));
  return kSuccess;
}

FAKE_API Return nvmlDeviceGetName(DeviceHandle h, char* buf, unsigned n) {
  std::lock_guard lk(st().mu);
  Gpu* g = gpu_of(h);
  if (!g) return kErrorInvalidArgument;
  return copy_string(g->spec.value("name", std::string("Fake GPU")), buf, n);
}

FAKE_API Return nvmlDeviceGetUUID(DeviceHandle h, char* buf, unsigned n) {
  std::lock_guard lk(st().mu);
  Gpu* g = gpu_of(h);
  if (!g) return kErrorInvalidArgument;
  return copy_string(g->spec.value("uuid", std::string("GPU-00000000-fake")), buf, n);
}

FAKE_API Return nvmlDeviceGetUtilizationRates(DeviceHandle h, Utilization* u) {
  State& s = st();
  std::lock_guard lk(s.mu);
  if (!s.initialized) return kErrorUninitialized;
  Gpu* g = gpu_of(h);
  if (!g || !u) return kErrorInvalidArgument;
  ++g->calls;
  if (s.fail.rfind("lost@", 0) == 0 && g->calls >= std::strtoull(s.fail.c_str() + 5, nullptr, 10))
    return kErrorGpuIsLost;
  const json* r = row(*g);
  if (!r || !r->contains("util")) return kErrorNotSupported;
  u->gpu = (*r)["util"].get<unsigned>();
  u->memory = r->value("mem_util", 0u);
  return kSuccess;
}

FAKE_API Return nvmlDeviceGetClockInfo(DeviceHandle h, int type, unsigned* mhz) {
  if (type != kClockSm) return kErrorNotSupported;
  return field(h, "sm_clock_mhz", mhz);
}

FAKE_API Return nvmlDeviceGetMaxClockInfo(DeviceHandle h, int type, unsigned* mhz) {
  if (type != kClockSm) return kErrorNotSupported;
  return spec_field(h, "sm_clock_max_mhz", mhz, 1);
}

FAKE_API Return nvmlDeviceGetPowerUsage(DeviceHandle h, unsigned* mw) { return field(h, "power_w", mw, 1000); }

FAKE_API Return nvmlDeviceGetEnforcedPowerLimit(DeviceHandle h, unsigned* mw) {
  return spec_field(h, "power_limit_w", mw, 1000);
}

FAKE_API Return nvmlDeviceGetTemperature(DeviceHandle h, int sensor, unsigned* c) {
  if (sensor != kTemperatureGpu) return kErrorNotSupported;
  return field(h, "temp_c", c);
}

FAKE_API Return nvmlDeviceGetMemoryInfo(DeviceHandle h, Memory* m) {
  std::lock_guard lk(st().mu);
  if (!st().initialized) return kErrorUninitialized;
  Gpu* g = gpu_of(h);
  if (!g || !m) return kErrorInvalidArgument;
  const double total = g->spec.value("mem_total_mib", 0.0);
  const json* r = row(*g);
  const double used = r ? r->value("mem_used_mib", 0.0) : 0.0;
  m->total = (unsigned long long)(total * (1 << 20));
  m->used = (unsigned long long)(used * (1 << 20));
  m->free = m->total > m->used ? m->total - m->used : 0;
  return kSuccess;
}

FAKE_API Return nvmlDeviceGetPcieThroughput(DeviceHandle h, int counter, unsigned* kb_s) {
  if (counter == kPcieTxBytes) return field(h, "pcie_tx_kb_s", kb_s);
  if (counter == kPcieRxBytes) return field(h, "pcie_rx_kb_s", kb_s);
  return kErrorInvalidArgument;
}

FAKE_API Return nvmlDeviceGetCurrentClocksEventReasons(DeviceHandle h, unsigned long long* reasons) {
  return field(h, "reasons", reasons);
}

namespace {

// The record a driver's _v3 writes: 32 bytes on 535.43-535.86 (usedGpuCcProtectedMemory added
// without a version bump), 24 on the others. Read from the "driver" string on its own, not
// through nvml_abi.hpp's rule, so that the test checks that rule against this one.
unsigned v3_record_size(const std::string& driver) {
  unsigned major = 0, minor = 0;
  if (std::sscanf(driver.c_str(), "%u.%u", &major, &minor) != 2) return 24;
  return major == 535 && minor >= 43 && minor <= 86 ? 32 : 24;
}

// One process query: `record` bytes per process, pid at 0, used memory (u64) at 8, as
// every nvmlProcessInfo layout has them.
Return processes(DeviceHandle h, unsigned* n, void* infos, unsigned record) {
  State& s = st();
  std::lock_guard lk(s.mu);
  if (!s.initialized) return kErrorUninitialized;
  Gpu* g = gpu_of(h);
  if (!g || !n) return kErrorInvalidArgument;
  if (record == 0) record = v3_record_size(s.doc.value("driver", std::string()));
  const json* r = row(*g);
  if (!r || !r->contains("procs")) {
    *n = 0;
    return kSuccess;
  }
  const json& procs = (*r)["procs"];
  const unsigned have = unsigned(procs.size());
  if (have > *n || !infos) {
    *n = have;
    return kErrorInsufficientSize;
  }
  const std::size_t room = have ? malloc_usable_size(infos) : 0;
  auto* bytes = static_cast<unsigned char*>(infos);
  for (unsigned i = 0; i < have; ++i) {
    unsigned char rec[32] = {};
    const unsigned pid = procs[i][0].get<unsigned>();
    const double mib = procs[i][1].get<double>();
    const unsigned long long used = mib < 0 ? kValueNotAvailable : (unsigned long long)(mib * (1 << 20));
    const unsigned none = ~0u;  // gpuInstanceId, computeInstanceId without MIG
    std::memcpy(rec, &pid, 4);
    std::memcpy(rec + 8, &used, 8);
    if (record >= 24) {
      std::memcpy(rec + 16, &none, 4);
      std::memcpy(rec + 20, &none, 4);
    }
    const std::size_t at = std::size_t(i) * record;
    const std::size_t fits = at >= room ? 0 : std::min<std::size_t>(record, room - at);
    std::memcpy(bytes + at, rec, fits);
    s.overflow_bytes += record - fits;
  }
  *n = have;
  return kSuccess;
}

using ProcessesFn = Return (*)(DeviceHandle, unsigned*, void*);

Return processes_v1(DeviceHandle h, unsigned* n, void* infos) { return processes(h, n, infos, 16); }
Return processes_v2(DeviceHandle h, unsigned* n, void* infos) { return processes(h, n, infos, 24); }
Return processes_v3(DeviceHandle h, unsigned* n, void* infos) { return processes(h, n, infos, 0); }

// FAKE_NVML_ABSENT names `symbol`: its resolver answers null, and dlsym finds nothing.
ProcessesFn unless_absent(const char* symbol, ProcessesFn fn) {
  const char* absent = std::getenv("FAKE_NVML_ABSENT");
  for (const char* p = absent; p && *p;) {
    const char* e = std::strchr(p, ',');
    const std::size_t len = e ? std::size_t(e - p) : std::strlen(p);
    if (len == std::strlen(symbol) && std::strncmp(p, symbol, len) == 0) return nullptr;
    p = e ? e + 1 : p + len;
  }
  return fn;
}

}  // namespace

extern "C" ProcessesFn fake_resolve_processes_v1() {
  return unless_absent("nvmlDeviceGetComputeRunningProcesses", processes_v1);
}
extern "C" ProcessesFn fake_resolve_processes_v2() {
  return unless_absent("nvmlDeviceGetComputeRunningProcesses_v2", processes_v2);
}
extern "C" ProcessesFn fake_resolve_processes_v3() {
  return unless_absent("nvmlDeviceGetComputeRunningProcesses_v3", processes_v3);
}
FAKE_API Return nvmlDeviceGetComputeRunningProcesses(DeviceHandle, unsigned*, void*)
    __attribute__((ifunc("fake_resolve_processes_v1")));
FAKE_API Return nvmlDeviceGetComputeRunningProcesses_v2(DeviceHandle, unsigned*, void*)
    __attribute__((ifunc("fake_resolve_processes_v2")));
FAKE_API Return nvmlDeviceGetComputeRunningProcesses_v3(DeviceHandle, unsigned*, void*)
    __attribute__((ifunc("fake_resolve_processes_v3")));

// For the tests (dlsym on the loaded fake): bytes process queries would have written past
// the arrays they were given; `reset` non-zero then sets the count back to 0.
FAKE_API std::size_t fake_nvml_overflow_bytes(int reset) {
  std::lock_guard lk(st().mu);
  const std::size_t n = st().overflow_bytes;
  if (reset) st().overflow_bytes = 0;
  return n;
}
