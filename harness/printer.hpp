// The terminal table: a printer over the same Result that goes to JSON.
#pragma once

#include <string>  // std::string

#include "harness/result.hpp"  // Result, Point
#include "harness/units.hpp"   // format_number, format_bytes (the table uses them; so may its callers)

namespace sb {

// Whole result: header (scenario, device, simulated label), one row per
// point, then findings. Metric columns past max_width columns (0: no limit)
// go to further blocks, each repeating the swept axes and the status.
std::string format_result_table(const Result& r, std::size_t max_width = 0);

// The width a table printed to fd should keep to: $COLUMNS when it is a
// number, else the terminal's when fd is one, else 120 (a log, a pipe).
std::size_t table_width(int fd);

// One line per point, for live progress while a sweep runs: the swept axes
// (those of `axes` with more than one value), the status and the table's
// metrics (the JSON has the rest).
std::string format_point_line(const Point& p, const nlohmann::ordered_json& axes);

}  // namespace sb
