#include "kernels/cpu/detail/stream_device.hpp"

#include <filesystem>  // std::filesystem::directory_iterator
#include <fstream>     // std::ifstream
#include <string>      // std::string, std::stoull

namespace sb::cpu {

std::size_t last_level_cache_bytes(std::size_t fallback) {
  // sysfs names each cache of cpu0 (index0..N) with its level and a size such
  // as "32768K"; the largest level wins. Containers and VMs may hide it.
  namespace fs = std::filesystem;
  int best_level = 0;
  std::size_t best = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/sys/devices/system/cpu/cpu0/cache", ec)) {
    if (e.path().filename().string().rfind("index", 0) != 0) continue;
    std::ifstream lf(e.path() / "level"), sf(e.path() / "size");
    int level = 0;
    std::string size;
    if (!(lf >> level) || !(sf >> size) || size.empty()) continue;
    std::size_t mult = 1;
    if (size.back() == 'K') mult = 1024;
    if (size.back() == 'M') mult = 1024 * 1024;
    try {
      const std::size_t bytes = std::stoull(size) * mult;
      if (level > best_level || (level == best_level && bytes > best)) best_level = level, best = bytes;
    } catch (...) {
      continue;
    }
  }
  return best > 0 ? best : fallback;
}

}  // namespace sb::cpu
