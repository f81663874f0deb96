// The `sim` backend: one simulated accelerator per gpu-class expected file
// (results/expected/<gpu>.json), named sim:<hardware.id>. Its operation times
// come from the file's roofline (kernels/sim/sim_model.hpp) and are spent as
// timed waits, so host-side causes can be studied on any machine. Every
// figure it yields is labelled simulated. Host-only: needs no CUDA.
#pragma once

#include "harness/device.hpp"  // Backend

namespace sb {

// list(): one DeviceInfo per gpu-class expected file, in file-name order
// (id "sim:h100-sxm"); open(i) opens the i-th of them. open_device() in
// kernels/backends.cpp resolves a sim:<name> spec (exact id or unique prefix).
Backend make_sim_backend();

}  // namespace sb
