// The collective scenario's findings, from its result rows: the peak bus
// bandwidth and latency floor per op and dtype, what check=fingerprint costs
// per size, and each mismatch run's analysis.
#pragma once

#include <cstdint>  // std::int64_t
#include <string>   // std::string

#include "harness/result.hpp"  // Result

namespace sb {

inline constexpr const char* kCollectiveCause = "collectives that do not match across ranks";

// "256 KiB", "1020 B": a message size as people read it.
std::string bytes_text(std::int64_t bytes);

// Adds the ranks and bytes axes and the findings to r. A pure function of the
// result: the job's size is the one its rows recorded (params.ranks; 1 when
// no row did), never the live process group, so a published result reads
// the same wherever it is analysed.
void collective_findings(Result& r);

}  // namespace sb
