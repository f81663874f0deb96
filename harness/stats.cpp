#include "harness/stats.hpp"

#include <algorithm>  // std::sort, std::minmax_element
#include <cmath>      // std::sqrt, std::floor

namespace sb {

double percentile(std::span<const double> sorted, double q) {
  if (sorted.empty()) return 0;
  if (q <= 0) return sorted.front();
  if (q >= 1) return sorted.back();
  const double pos = q * double(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const double frac = pos - double(lo);
  if (lo + 1 >= sorted.size()) return sorted[lo];
  return sorted[lo] + frac * (sorted[lo + 1] - sorted[lo]);
}

Stats summarize(std::span<const double> samples) {
  Stats s;
  s.n = static_cast<int>(samples.size());
  if (samples.empty()) return s;
  std::vector<double> v(samples.begin(), samples.end());
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  s.median = percentile(v, 0.5);
  s.p10 = percentile(v, 0.1);
  s.p90 = percentile(v, 0.9);
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(v.size());
  if (v.size() > 1 && s.mean != 0) {
    double ss = 0;
    for (double x : v) ss += (x - s.mean) * (x - s.mean);
    s.stdrel = std::sqrt(ss / double(v.size() - 1)) / s.mean;
  }
  return s;
}

Stats rate_from_ms(const Stats& ms, double work) {
  auto rate = [&](double t) { return t > 0 ? work / (t * 1e-3) / 1e12 : 0.0; };
  Stats r;
  r.n = ms.n;
  r.median = rate(ms.median);
  r.p10 = rate(ms.p90);
  r.p90 = rate(ms.p10);
  r.min = rate(ms.max);
  r.max = rate(ms.min);
  r.mean = rate(ms.mean);
  r.stdrel = ms.stdrel;
  return r;
}

}  // namespace sb
