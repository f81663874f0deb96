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

}  // namespace sb
