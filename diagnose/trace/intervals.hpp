// Time intervals [start, end) as the trace analyses use them (HTA's interval arithmetic): sort and merge,
// total length, and the overlap and intersection of two merged lists; and the median of durations.
#pragma once

#include <algorithm>  // std::sort, std::max, std::min
#include <utility>    // std::pair
#include <vector>     // std::vector

namespace sb::readers::intervals {

using Interval = std::pair<double, double>;

// Sorts and merges; the merged intervals (empty ones dropped).
inline std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const auto& iv : v) {
    if (iv.second <= iv.first) continue;
    if (!out.empty() && iv.first <= out.back().second) out.back().second = std::max(out.back().second, iv.second);
    else out.push_back(iv);
  }
  return out;
}

inline double length(const std::vector<Interval>& m) {
  double s = 0;
  for (const auto& [a, b] : m) s += b - a;
  return s;
}

// |a ∩ b| for two merged lists.
inline double overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double s = 0;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const double lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) s += hi - lo;
    if (a[i].second < b[j].second) ++i;
    else ++j;
  }
  return s;
}

// a ∩ b for two merged lists, merged.
inline std::vector<Interval> intersected(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::vector<Interval> out;
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const double lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) out.emplace_back(lo, hi);
    if (a[i].second < b[j].second) ++i;
    else ++j;
  }
  return out;
}

// The median (the mean of the two middle values for an even count); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace sb::readers::intervals
