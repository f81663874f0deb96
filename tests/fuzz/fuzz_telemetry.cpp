// The recorded-telemetry reader, as `watch --from FILE` uses it: the bytes
// parsed as an nvidia-smi --query-gpu CSV or a dcgmi dmon log
// (parse_telemetry), then every sample fed to watch's analysis and summarized.
#include <cmath>    // std::isfinite
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint8_t
#include <map>      // std::map

#include "readers/telemetry.hpp"  // parse_telemetry
#include "tests/fuzz/fuzz_common.hpp"
#include "watch/analysis.hpp"  // GpuTracker

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string file = "fuzz-telemetry.log";
  sb::fuzz::usage_errors_only(file, [&] {
    const auto rec = sb::telemetry::parse_telemetry(sb::fuzz::as_text(data, size), file, 100);
    sb::fuzz::require(!rec.samples.empty(), "a parsed recording has samples");
    sb::watch::Options opt;
    opt.window_s = 5;
    opt.summary_window_s = 1;
    opt.stuck_after_s = 2;
    std::map<int, sb::watch::GpuTracker> trackers;
    for (const auto& s : rec.samples) {
      sb::fuzz::require(std::isfinite(s.t_s) && s.t_s >= 0, "times are finite and from the first sample");
      if (trackers.size() >= 64 && !trackers.count(s.gpu)) continue;
      trackers.try_emplace(s.gpu, s.gpu, opt).first->second.add(s);
    }
    for (auto& [gpu, t] : trackers) {
      t.finish();
      const auto sum = t.summary();
      double total = 0;
      for (const auto& [k, v] : sum["pattern_share_pct"].items()) total += v.get<double>();
      sb::fuzz::require(total == 0 || std::abs(total - 100) < 1e-6, "pattern shares add up to 100%");
      sb::fuzz::require(t.throttled_s() <= t.duration_s() + 1e-9, "throttled time within the recording");
    }
  });
  return 0;
}
