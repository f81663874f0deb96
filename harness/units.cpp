#include "harness/units.hpp"

#include <cmath>  // std::fabs, std::floor

#include <fmt/format.h>  // fmt::format

namespace sb {

std::string format_number(double v) {
  const double a = std::fabs(v);
  if (a == 0) return "0";
  // A whole number prints whole: a count of launches read "49.00", a micro batch "17.00".
  if (a < 1e15 && v == std::floor(v)) return fmt::format("{:.0f}", v);
  if (a >= 1000) return fmt::format("{:.0f}", v);
  if (a >= 100) return fmt::format("{:.1f}", v);
  if (a >= 10) return fmt::format("{:.2f}", v);
  return fmt::format("{:.4g}", v);
}

std::string format_bytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024.0) return fmt::format("{:.0f} B", bytes);
  int u = 0;
  while (bytes >= 1024.0 && u < 5) {
    bytes /= 1024.0;
    ++u;
  }
  return fmt::format("{:.1f} {}", bytes, kUnits[u]);
}

}  // namespace sb
