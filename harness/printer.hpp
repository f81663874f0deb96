// The terminal table: a printer over the same Result that goes to JSON.
#pragma once

#include <string>  // std::string

#include "harness/result.hpp"  // Result, Point

namespace sb {

// Whole result: header (scenario, device, simulated label), one row per
// point, then findings.
std::string format_result_table(const Result& r);

// One line per point, for live progress while a sweep runs.
std::string format_point_line(const Point& p);

// A number with about four significant digits and no exponent for the
// magnitudes results use ("1681", "297.4", "0.2974").
std::string format_number(double v);

}  // namespace sb
