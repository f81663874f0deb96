// What limits a micro batch in the batch scenario's points: the diagnose
// batch check's reading and the batch scenario's own finding.
#pragma once

#include <cstdint>  // std::int64_t
#include <string>   // std::string

#include "harness/result.hpp"  // Point

namespace sb::batch {

// What limits a micro batch, read from the batch scenario's points at the
// user's micro batch (`base`) and at the knee of the sweep (`knee`), each
// with `seq` tokens per sequence:
//   "launch-bound": HTA's rule held at `base` (info.launch_bound: less device
//     work per submission than host time, the device idle over half the time);
//   "steady-low": not launch-bound, but under 90% busy and flat (the pattern);
//   "device-efficiency": neither: the device is kept fed, and a larger micro
//     batch can buy only its own efficiency per token.
// `cause` is the finding's cause for that kind; `reading` says it with the
// figures (busy, device and host time per submission, device time per token
// at both points).
struct BatchLimit {
  std::string kind, cause, reading;
};
BatchLimit batch_limit(const Point& base, const Point& knee, std::int64_t seq);

}  // namespace sb::batch
