// Summary statistics of a set of trial times.
#pragma once

#include <span>    // std::span
#include <vector>  // std::vector

namespace sb {

struct Stats {
  int n = 0;
  double median = 0, p10 = 0, p90 = 0, mean = 0, min = 0, max = 0;
  double stdrel = 0;  // sample standard deviation / mean: nvbench's "noise"
};

// Percentile q in [0, 1] with linear interpolation between order statistics
// (numpy's default). Empty input -> 0.
double percentile(std::span<const double> sorted, double q);

Stats summarize(std::span<const double> samples);

// A throughput summary from a time summary: rate = work / seconds / 1e12 for
// each figure (work = FLOPs gives TFLOP/s). The fastest trial gives the
// highest rate, so p10 and p90 (and min and max) swap; the mean is the rate
// at the mean time; stdrel carries over.
Stats rate_from_ms(const Stats& ms, double work);

}  // namespace sb
