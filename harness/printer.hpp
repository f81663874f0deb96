// The terminal table: a printer over the same Result that goes to JSON.
#pragma once

#include <string>  // std::string

#include "harness/result.hpp"  // Result, Point

namespace sb {

// Whole result: header (scenario, device, simulated label), one row per
// point, then findings.
std::string format_result_table(const Result& r);

// One line per point, for live progress while a sweep runs: the swept axes
// (those of `axes` with more than one value), the status and the metrics.
std::string format_point_line(const Point& p, const nlohmann::ordered_json& axes);

// A number with about four significant digits and no exponent for the
// magnitudes results use ("1681", "297.4", "0.2974").
std::string format_number(double v);
// "4.3 GiB", "512.0 MiB", "96 B": a memory size as OOM messages and notes show it.
std::string format_bytes(double bytes);

}  // namespace sb
