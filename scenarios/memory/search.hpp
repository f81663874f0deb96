// The largest size for which a monotone test holds: doubling from 1 until it
// fails (or passes `max`), then bisection between the last pass and the
// first failure. A real step is the test in the memory scenario, so each
// size is tried at most once (the caller's test may memoise; this never asks
// twice) and the number of tries is about 2 log2(answer).
#pragma once

#include <algorithm>   // std::min
#include <cstdint>     // std::int64_t
#include <functional>  // std::function

namespace sb::memory {

struct LargestFit {
  std::int64_t largest = 0;  // 0: not even 1 passes
  bool capped = false;       // every size up to max passed
  int tries = 0;
};

inline LargestFit largest_fitting(const std::function<bool(std::int64_t)>& fits, std::int64_t max) {
  LargestFit r;
  auto test = [&](std::int64_t n) {
    ++r.tries;
    return fits(n);
  };
  std::int64_t lo = 0, hi = 1;
  while (hi <= max && test(hi)) {
    lo = hi;
    if (hi > max / 2) {  // the next doubling passes max
      hi = max + 1;
      break;
    }
    hi *= 2;
  }
  if (lo == max) {
    r.largest = max;
    r.capped = true;
    return r;
  }
  hi = std::min(hi, max + 1);
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (test(mid) ? lo : hi) = mid;
  }
  r.largest = lo;
  r.capped = lo == max;
  return r;
}

}  // namespace sb::memory
