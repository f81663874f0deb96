// The `cuda` backend: devices cuda:0..N-1 driven through the CUDA runtime and
// cuBLASLt. Host-only and free of CUDA headers, so the CLI and scenarios can
// include it without nvcc or the toolkit's include path.
#pragma once

#include "harness/device.hpp"  // Backend

namespace sb {

// With no usable GPU (no driver, no device) list() is empty, unavailable()
// says why, and versions() still answers without throwing.
Backend make_cuda_backend();

}  // namespace sb
