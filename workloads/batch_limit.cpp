#include "workloads/batch_limit.hpp"

#include <algorithm>  // std::max

#include <fmt/format.h>  // fmt::format

namespace sb::batch {

BatchLimit batch_limit(const Point& base, const Point& knee, std::int64_t seq) {
  auto value = [](const Point& q, const char* name) {
    const Metric* m = q.metric(name);
    return m ? m->value : 0.0;
  };
  // device time per token: the device's span per micro step over its tokens
  auto us_per_token = [&](const Point& q) {
    const double toks = double(q.params.value("micro_batch", std::int64_t(1))) * double(std::max<std::int64_t>(seq, 1));
    return 1e3 * value(q, "micro_step_ms") / toks;
  };
  const std::int64_t mb = base.params.value("micro_batch", std::int64_t(1));
  const std::int64_t kb = knee.params.value("micro_batch", std::int64_t(1));
  const std::string pattern = base.info.value("pattern", std::string());
  const double busy = value(base, "busy_pct"), dev = value(base, "device_us_per_launch"),
               host = value(base, "host_us_per_launch");
  const std::string figures =
      fmt::format("{:.0f}% busy ({}), {:.1f} us of device work per submission against {:.1f} us of host time",
                  busy, pattern.empty() ? "no pattern" : pattern, dev, host);
  const std::string per_token =
      kb != mb ? fmt::format("; device time per token {:.2f} us at micro batch {} -> {:.2f} us at {}", us_per_token(base),
                             mb, us_per_token(knee), kb)
               : "";
  BatchLimit l;
  if (base.info.value("launch_bound", false)) {
    l.kind = "launch-bound";
    l.cause = "a batch that is too small (launch-bound, steady-low utilization)";
    l.reading = fmt::format("launch-bound at micro batch {}: {}{}", mb, figures, per_token);
  } else if (pattern == "steady-low") {
    l.kind = "steady-low";
    l.cause = "a batch that is too small (steady-low utilization)";
    l.reading = fmt::format("steady-low at micro batch {}: {}; the device idles between submissions{}", mb, figures,
                            per_token);
  } else {
    l.kind = "device-efficiency";
    l.cause = "a batch that is too small for the device's efficiency (not launch-bound)";
    l.reading = fmt::format("not launch-bound at micro batch {}: {}; the host keeps the device fed, so a larger micro "
                            "batch buys only the device's own efficiency per token{}",
                            mb, figures, per_token);
  }
  return l;
}

}  // namespace sb::batch
