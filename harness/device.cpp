#include "harness/device.hpp"

#include <cstdlib>  // std::strtol

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // UsageError

namespace sb {

std::string DeviceSpec::str() const {
  if (automatic) return "auto";
  switch (kind) {
    case DeviceKind::cpu: return "cpu";
    case DeviceKind::cuda: return fmt::format("cuda:{}", index);
    case DeviceKind::sim: return "sim:" + sim;
  }
  return "?";
}

// 4*S^2*D per head and sequence: QK^T and PV, 2*S*S*D each. Causal computes
// half the score matrix (the convention of docs/DESIGN.md, as FlashAttention's
// benchmarks count it).
double AttnShape::fwd_flops() const {
  auto one = [&](double s) { return 4.0 * s * s * double(head_dim) * double(heads) * (causal ? 0.5 : 1.0); };
  if (!varlen()) return double(batch) * one(double(seq));
  double total = 0;
  for (std::size_t i = 1; i < cu_seqlens.size(); ++i) total += one(double(cu_seqlens[i] - cu_seqlens[i - 1]));
  return total;
}

DeviceSpec parse_device_spec(const std::string& text) {
  DeviceSpec s;
  if (text == "auto") {
    s.automatic = true;
    return s;
  }
  if (text == "cpu") return s;
  if (text == "cuda") {
    s.kind = DeviceKind::cuda;
    return s;
  }
  if (text.rfind("cuda:", 0) == 0) {
    const std::string idx = text.substr(5);
    char* end = nullptr;
    const long v = std::strtol(idx.c_str(), &end, 10);
    if (!idx.empty() && *end == '\0' && v >= 0 && v < 1024) {
      s.kind = DeviceKind::cuda;
      s.index = int(v);
      return s;
    }
  }
  if (text.rfind("sim:", 0) == 0 && text.size() > 4) {
    const std::string name = text.substr(4);
    const bool ok = name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") == std::string::npos;
    if (ok) {
      s.kind = DeviceKind::sim;
      s.sim = name;
      return s;
    }
  }
  throw UsageError(fmt::format(
      "unknown device '{}'; valid: auto, cpu, cuda:N (N = 0, 1, ...), sim:<gpu> (e.g. sim:h100)", text));
}

}  // namespace sb
