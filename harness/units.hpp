// How a number or a memory size reads in tables, messages and findings. Small
// on purpose: devices include it without the printer.
#pragma once

#include <string>  // std::string

namespace sb {

// A number with about four significant digits and no exponent for the
// magnitudes results use ("1681", "297.4", "0.2974").
std::string format_number(double v);
// "4.3 GiB", "512.0 MiB", "96 B": a memory size as OOM messages and notes show it.
std::string format_bytes(double bytes);

}  // namespace sb
