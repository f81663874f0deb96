// analyze-hang on PyTorch dumps where some rank left none: when every rank that dumped waits in
// the same call of a group, the ranks of that group without a dump are the ones they wait for.
// PyTorch's fr_trace stops at "Missing dump files from ranks {..}"; this says who the suspect is,
// how sure, on what evidence, and what settles it.
#pragma once

#include <cstdint>  // std::int64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include "diagnose/hang/hang_analysis.hpp"  // HangReport
#include "readers/torch_fr.hpp"              // TorchFrEntry

namespace sb {

// One dumped rank's newest call in the group: where it waits, unless done.
struct DumpWait {
  int rank = -1;
  std::int64_t seq = -1;
  bool done = false;            // completed or retired: not waiting
  std::string call;             // "all_reduce in [8] Float ..." as the report writes calls
  std::string state;            // scheduled (not started) or started
  std::int64_t created_ns = 0;  // time_created_ns: wall clock, ns since the epoch; 0 unknown
  std::int64_t timeout_ms = 0;  // the process group's timeout for it; 0 unknown
};

DumpWait dump_wait(int rank, const TorchFrEntry& newest);

// When every dumped rank of group pg waits in the same call and some member of it left no dump:
// r becomes a `missing` finding (pattern "no dump") at that call, its suspects the members
// without a dump, explained (explain_missing_dumps), and true is returned. Else r is untouched.
bool name_missing_dumps(HangReport& r, const std::string& pg, const std::vector<DumpWait>& waits,
                        const std::vector<int>& members, std::int64_t newest_ns);

// Fills r.culprits (the missing ranks that are members of the group), r.confidence, r.evidence
// and r.decides. newest_ns: the newest time any dump records (a lower bound on when they were
// written), 0 when unknown.
void explain_missing_dumps(HangReport& r, const std::string& pg, const std::vector<DumpWait>& waits,
                           const std::vector<int>& members, std::int64_t newest_ns);

// "2026-11-30 12:34:56.789 UTC" for ns since the epoch; "" for 0 or a time past year 9999.
std::string utc_ms_text(std::int64_t ns);

}  // namespace sb
