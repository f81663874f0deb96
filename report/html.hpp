// diagnose's HTML report (html.cpp): one self-contained file over the result JSON (inline CSS and SVG
// bars; no script, nothing fetched), readable offline and attachable to an issue. It reads only the
// Result, so a result written by another machine reports the same.
#pragma once

#include <string>  // std::string

#include "harness/result.hpp"  // Result, Point

namespace sb::report {

// The diagnose or watch result as one HTML page.
std::string format_html(const Result& r);

// The summary point's MFU line ("MFU: 6.2% now, 12% with the fixes (real tokens, over ...)"), or "" where
// it has no MFU now and after: the text report and the HTML say it in the same words.
std::string mfu_line(const Point& summary);

}  // namespace sb::report
