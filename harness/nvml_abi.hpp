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
struct ProcessInfo {  // nvmlProcessInfo_t (= _v2_t), what ..._ComputeRunningProcesses_v3 fills
  unsigned int pid;
  unsigned long long used_gpu_memory;  // bytes; NVML_VALUE_NOT_AVAILABLE (all ones) when hidden
  unsigned int gpu_instance_id, compute_instance_id;
};

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
static_assert(sizeof(nvmlProcessInfo_t) == sizeof(sb::nvml_abi::ProcessInfo));
static_assert(nvmlClocksEventReasonSwPowerCap == sb::nvml_abi::kReasonSwPowerCap);
static_assert(nvmlClocksEventReasonHwPowerBrakeSlowdown == sb::nvml_abi::kReasonHwPowerBrake);
#endif
