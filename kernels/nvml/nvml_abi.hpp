// The NVML types and constants stallbench uses (watch/, the cuda device's
// probe in kernels/cuda/nvml_probe.cpp), declared here so that neither the
// build nor the fake NVML of the tests (tests/fake_nvml) needs nvml.h (the
// CUDA toolkit ships it only with its nvml-dev component, absent here). The
// layouts are NVML's own (nvml.h of CUDA 12/13, driver 535 and later); where
// the header is present they are checked against it.
#pragma once

namespace sb::nvml_abi {

using Return = int;                   // nvmlReturn_t
using DeviceHandle = struct Opaque*;  // nvmlDevice_t

inline constexpr Return kSuccess = 0;            // NVML_SUCCESS
inline constexpr Return kErrorUninitialized = 1;  // NVML_ERROR_UNINITIALIZED
inline constexpr Return kErrorInvalidArgument = 2;  // NVML_ERROR_INVALID_ARGUMENT
inline constexpr Return kErrorNotSupported = 3;   // NVML_ERROR_NOT_SUPPORTED
inline constexpr Return kErrorNoPermission = 4;   // NVML_ERROR_NO_PERMISSION
inline constexpr Return kErrorInsufficientSize = 7;  // NVML_ERROR_INSUFFICIENT_SIZE
inline constexpr Return kErrorDriverNotLoaded = 9;   // NVML_ERROR_DRIVER_NOT_LOADED
inline constexpr Return kErrorGpuIsLost = 15;        // NVML_ERROR_GPU_IS_LOST
inline constexpr Return kErrorUnknown = 999;         // NVML_ERROR_UNKNOWN

inline constexpr int kClockSm = 1;         // NVML_CLOCK_SM (nvmlClockType_t)
inline constexpr int kTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU (nvmlTemperatureSensors_t)
inline constexpr int kPcieTxBytes = 0;     // NVML_PCIE_UTIL_TX_BYTES (nvmlPcieUtilCounter_t)
inline constexpr int kPcieRxBytes = 1;     // NVML_PCIE_UTIL_RX_BYTES
inline constexpr unsigned kNameSize = 96;  // NVML_DEVICE_NAME_V2_BUFFER_SIZE
inline constexpr unsigned kUuidSize = 96;  // NVML_DEVICE_UUID_V2_BUFFER_SIZE
inline constexpr unsigned kDriverVersionSize = 80;  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE

struct Utilization {  // nvmlUtilization_t
  unsigned int gpu;     // % of the sample period in which a kernel ran
  unsigned int memory;  // % of it in which device memory was read or written
};
struct Memory {  // nvmlMemory_t (v1): bytes
  unsigned long long total, free, used;
};
// The compute process records, one per version of ..._ComputeRunningProcesses.
// The caller allocates the array and the driver fills it, so a record size
// that differs from the caller's shifts every record after the first (and
// writes past the end of a full array): nvmlProcessInfo_t has had three
// layouts under two function names (NVIDIA's nvidia-settings history of
// nvml.h, as nvitop PRs #79 and #89 trace it):
//   - nvmlDeviceGetComputeRunningProcesses (v1): nvmlProcessInfo_v1_t, 16 bytes;
//   - _v2: nvmlProcessInfo_v2_t, 24 bytes (old drivers lack it: R430, pynvml#43);
//   - _v3 (since R510): the v2 record, except drivers 535.43.02 through
//     535.86.x, whose _v3 writes a 32-byte record (usedGpuCcProtectedMemory
//     added without a version bump: NVIDIA/go-nvml#75, 535.54.03); 535.98
//     removed _v3 and 535.104.05 brought it back with the 24-byte record.
struct ProcessInfoV1 {  // nvmlProcessInfo_v1_t
  unsigned int pid;
  unsigned long long used_gpu_memory;  // bytes; NVML_VALUE_NOT_AVAILABLE (all ones) when hidden
};
struct ProcessInfoV2 {  // nvmlProcessInfo_v2_t; what _v3 fills outside 535.43-535.86
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id, compute_instance_id;  // 0xFFFFFFFF without MIG
};
struct ProcessInfoV3Cc {  // what _v3 of drivers 535.43.02-535.86.x fills
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id, compute_instance_id;
  unsigned long long used_gpu_cc_protected_memory;  // confidential computing
};
static_assert(sizeof(ProcessInfoV1) == 16 && sizeof(ProcessInfoV2) == 24 && sizeof(ProcessInfoV3Cc) == 32);
// The largest record any driver writes: an array of N records is given N x this many bytes, so no
// driver, whichever record it uses, can write past it.
inline constexpr unsigned kProcessInfoMaxSize = sizeof(ProcessInfoV3Cc);

// The record size of ..._ComputeRunningProcesses_v3 for a driver version as
// nvmlSystemGetDriverVersion gives it ("535.54.03"): 32 for 535.43 through
// 535.86, 24 for the others, 0 when the version does not parse (unknown).
inline unsigned process_info_v3_size(const char* driver) {
  auto number = [](const char*& p, unsigned& v) {  // up to 6 digits
    const char* from = p;
    for (v = 0; *p >= '0' && *p <= '9' && p - from < 6; ++p) v = v * 10 + unsigned(*p - '0');
    return p > from;
  };
  const char* p = driver;
  unsigned major = 0, minor = 0;
  if (!p || !number(p, major) || *p++ != '.' || !number(p, minor)) return 0;
  return major == 535 && minor >= 43 && minor <= 86 ? unsigned(sizeof(ProcessInfoV3Cc)) : unsigned(sizeof(ProcessInfoV2));
}

// nvmlClocksEventReasons (nvmlClocksThrottleReasons before driver 535): bits.
inline constexpr unsigned long long kReasonGpuIdle = 0x1;
inline constexpr unsigned long long kReasonAppClocks = 0x2;
inline constexpr unsigned long long kReasonSwPowerCap = 0x4;
inline constexpr unsigned long long kReasonHwSlowdown = 0x8;
inline constexpr unsigned long long kReasonSyncBoost = 0x10;
inline constexpr unsigned long long kReasonSwThermal = 0x20;
inline constexpr unsigned long long kReasonHwThermal = 0x40;
inline constexpr unsigned long long kReasonHwPowerBrake = 0x80;
inline constexpr unsigned long long kReasonDisplayClocks = 0x100;
// The reasons that lower clocks under load (idle, application clocks, sync
// boost and display clocks are not a throttle of a busy GPU).
inline constexpr unsigned long long kThrottleReasons =
    kReasonSwPowerCap | kReasonHwSlowdown | kReasonSwThermal | kReasonHwThermal | kReasonHwPowerBrake;

inline constexpr unsigned long long kValueNotAvailable = ~0ULL;  // NVML_VALUE_NOT_AVAILABLE

}  // namespace sb::nvml_abi

#if __has_include(<nvml.h>)
#include <nvml.h>  // types and enums only, to check the declarations above; never linked
static_assert(NVML_SUCCESS == sb::nvml_abi::kSuccess);
static_assert(NVML_ERROR_NOT_SUPPORTED == sb::nvml_abi::kErrorNotSupported);
static_assert(NVML_ERROR_INSUFFICIENT_SIZE == sb::nvml_abi::kErrorInsufficientSize);
static_assert(NVML_CLOCK_SM == sb::nvml_abi::kClockSm);
static_assert(NVML_PCIE_UTIL_RX_BYTES == sb::nvml_abi::kPcieRxBytes);
static_assert(sizeof(nvmlUtilization_t) == sizeof(sb::nvml_abi::Utilization));
static_assert(sizeof(nvmlDevice_t) == sizeof(sb::nvml_abi::DeviceHandle));
static_assert(sizeof(nvmlReturn_t) == sizeof(sb::nvml_abi::Return));
static_assert(NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE == sb::nvml_abi::kDriverVersionSize);
static_assert(sizeof(nvmlMemory_t) == sizeof(sb::nvml_abi::Memory));
// nvmlProcessInfo_t is not checked: it is the 32-byte record in the headers of 535.43-535.86.
static_assert(sizeof(nvmlProcessInfo_v1_t) == sizeof(sb::nvml_abi::ProcessInfoV1));
static_assert(sizeof(nvmlProcessInfo_v2_t) == sizeof(sb::nvml_abi::ProcessInfoV2));
static_assert(nvmlClocksEventReasonSwPowerCap == sb::nvml_abi::kReasonSwPowerCap);
static_assert(nvmlClocksEventReasonHwPowerBrakeSlowdown == sb::nvml_abi::kReasonHwPowerBrake);
#endif
