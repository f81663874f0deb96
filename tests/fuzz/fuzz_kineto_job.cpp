// libFuzzer target: the Kineto trace reader, and what diagnose --trace builds on what it read: the HTA
// figures, one trace's diagnosis, a job of several ranks (the collectives matched across them) and a pair
// compared (--baseline). The input is up to three traces separated by a line "#RANK#"; each is parsed as a
// Kineto trace. A trace that is not one must end as a UsageError naming the file; the analyses must not
// crash on whatever the reader accepted, and a job's figures must be finite.
#include <cmath>    // std::isfinite
#include <string>   // std::string
#include <vector>   // std::vector

#include "diagnose/trace/job_analysis.hpp"    // analyze_job
#include "diagnose/trace/trace_analysis.hpp"  // analyze
#include "diagnose/trace/trace_diagnose.hpp"  // TraceRead, diagnose_read
#include "diagnose/trace/trace_diff.hpp"      // diagnose_diff
#include "fuzz_common.hpp"                    // usage_errors_only, require
#include "readers/kineto.hpp"                 // parse_kineto

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const std::string text(sb::fuzz::as_text(data, size));
  std::vector<std::string> parts;
  for (std::size_t at = 0; parts.size() < 3;) {
    const std::size_t sep = text.find("\n#RANK#\n", at);
    parts.push_back(text.substr(at, sep == std::string::npos ? std::string::npos : sep - at));
    if (sep == std::string::npos) break;
    at = sep + 8;
  }
  std::vector<sb::diagnose::TraceRead> reads;
  for (const auto& p : parts)
    sb::fuzz::usage_errors_only("trace", [&] {
      sb::readers::ReadOptions ro;
      ro.python_functions = true;
      sb::readers::Trace t = sb::readers::parse_kineto(p, ro);
      reads.push_back({"trace", std::move(t), 0, 0});
    });
  std::vector<sb::readers::TraceAnalysis> an;
  for (const auto& r : reads) an.push_back(sb::readers::analyze(r.trace));
  const nlohmann::ordered_json meta = {{"device", {{"id", "cpu"}}}};
  if (!reads.empty()) (void)sb::diagnose::diagnose_read(reads[0], an[0], meta);
  if (reads.size() >= 2) {
    std::vector<sb::diagnose::JobRank> ranks;
    for (std::size_t i = 0; i < reads.size(); ++i) ranks.push_back({&reads[i].trace, &an[i], std::int64_t(i)});
    const sb::diagnose::JobAnalysis j = sb::diagnose::analyze_job(ranks);
    for (const auto& f : j.ranks)
      sb::fuzz::require(std::isfinite(f.wait_us) && std::isfinite(f.late_us) && f.wait_us >= 0,
                        "a rank's wait and lateness are finite and the wait not negative");
    (void)sb::diagnose::diagnose_diff(reads[1], reads[0], meta);
  }
  return 0;
}
