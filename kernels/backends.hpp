// The device backends this build has: cpu and sim always, cuda when configured.
#pragma once

#include <memory>  // std::unique_ptr
#include <string>  // std::string
#include <vector>  // std::vector

#include "harness/device.hpp"  // Backend, Device, DeviceSpec

namespace sb {

const std::vector<Backend>& all_backends();

// Opens the device a spec names. "auto" is cuda:0 when a GPU answers, else
// cpu. Throws UsageError naming the valid devices (and why cuda has none).
std::unique_ptr<Device> open_device(const DeviceSpec& spec);

}  // namespace sb
