// Counter-based values: value(seed, index) needs no state, so a reference can
// regenerate any element (nccl-tests' idea) and fills parallelise freely.
#pragma once

#include <cstdint>  // std::uint64_t

namespace sb {

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// 64 random bits for (seed, index).
inline std::uint64_t counter_hash(std::uint64_t seed, std::uint64_t index) {
  return splitmix64(seed * 0x100000001b3ULL ^ splitmix64(index));
}

// Uniform in [-1, 1), 24 bits of resolution.
inline float uniform_pm1(std::uint64_t seed, std::uint64_t index) {
  const std::uint64_t h = counter_hash(seed, index);
  return float(double(h >> 40) * (2.0 / 16777216.0) - 1.0);
}

}  // namespace sb
