// The `cpu` device: oneDNN matmul (bf16 on AMX where the CPU has it) on a
// dedicated compute thread that stands for the device stream.
#pragma once

#include "harness/device.hpp"  // Backend

namespace sb {
Backend make_cpu_backend();
}
