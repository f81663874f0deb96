// diagnose's plain-text report: what the terminal shows for `diagnose` and `diagnose --trace`, read
// from the result alone (the same result the HTML report and the JSON carry).
#pragma once

#include <string>  // std::string

#include "harness/result.hpp"  // Result

namespace sb::report {

std::string format_text(const Result& r);

}  // namespace sb::report
