#include "diagnose/hang/missing_dump.hpp"

#include <algorithm>  // std::min_element, std::max_element, std::find, std::none_of
#include <ctime>      // gmtime_r

#include "diagnose/hang/fr_calls.hpp"  // fr::describe

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

namespace sb {

std::string utc_ms_text(std::int64_t ns) {
  // 253402300799 s: 9999-12-31 23:59:59, the last second strftime's %Y writes as four digits
  if (ns <= 0 || ns / 1'000'000'000 > 253402300799LL) return "";
  const std::time_t s = static_cast<std::time_t>(ns / 1'000'000'000);
  std::tm tm{};
  if (!gmtime_r(&s, &tm)) return "";
  char buf[32];
  if (std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm) == 0) return "";
  return fmt::format("{}.{:03d} UTC", buf, static_cast<int>(ns / 1'000'000 % 1000));
}

DumpWait dump_wait(int rank, const TorchFrEntry& e) {
  DumpWait w;
  w.rank = rank;
  w.seq = e.collective_seq_id;
  w.done = torch_fr_done(e);
  w.call = fr::describe(e);
  w.state = e.state;
  w.created_ns = e.time_created_ns;
  w.timeout_ms = e.timeout_ms;
  return w;
}

bool name_missing_dumps(HangReport& r, const std::string& pg, const std::vector<DumpWait>& waits,
                        const std::vector<int>& members, std::int64_t newest_ns) {
  if (waits.empty()) return false;
  for (const DumpWait& w : waits)
    if (w.done || w.seq != waits.front().seq) return false;
  // only a missing rank of this group can be what its members wait for
  if (std::none_of(r.ranks_missing.begin(), r.ranks_missing.end(),
                   [&](int m) { return std::find(members.begin(), members.end(), m) != members.end(); }))
    return false;
  r.kind = DivergenceKind::missing;
  r.pattern = "no dump";
  r.seq = waits.front().seq;
  r.process_group = pg;
  r.torch_match_state = "not all ranks joining the collective";
  r.expected = waits.front().call;
  for (const DumpWait& w : waits)
    if (w.rank >= 0 && std::size_t(w.rank) < r.per_rank_call.size()) r.per_rank_call[std::size_t(w.rank)] = w.call + " waiting";
  explain_missing_dumps(r, pg, waits, members, newest_ns);
  r.summary = fmt::format("process group {} collective seq {}: every rank with a dump waits in it ({}); rank{} {} "
                          "left no dump: the suspect{} ({} confidence), not proven: the dumps cannot show whether {} "
                          "reached the call",
                          pg, r.seq, r.expected, r.culprits.size() == 1 ? "" : "s", rank_ranges(r.culprits),
                          r.culprits.size() == 1 ? "" : "s", r.confidence, r.culprits.size() == 1 ? "it" : "they");
  return true;
}

void explain_missing_dumps(HangReport& r, const std::string& pg, const std::vector<DumpWait>& waits,
                           const std::vector<int>& members, std::int64_t newest_ns) {
  // Only a missing rank of this group can be what its members wait for.
  std::vector<int> suspects;
  for (int m : r.ranks_missing)
    if (std::find(members.begin(), members.end(), m) != members.end()) suspects.push_back(m);
  r.culprits = suspects;
  if (suspects.empty() || waits.empty()) return;

  const auto first = std::min_element(waits.begin(), waits.end(), [](const DumpWait& a, const DumpWait& b) {
    return (a.created_ns > 0 ? a.created_ns : INT64_MAX) < (b.created_ns > 0 ? b.created_ns : INT64_MAX);
  });
  const auto last = std::max_element(waits.begin(), waits.end(), [](const DumpWait& a, const DumpWait& b) {
    return a.created_ns < b.created_ns;
  });
  const std::string who = fmt::format("rank{} {}", suspects.size() == 1 ? "" : "s", fmt::join(suspects, ", "));
  const std::size_t dumped = waits.size();

  // Two or more dumps waiting in one call is a consensus; one dump is one rank's view. Suspects
  // that are most of the group leave few witnesses.
  if (dumped >= 2 && suspects.size() * 2 < members.size()) {
    r.confidence = "high";
  } else {
    r.confidence = "medium";
  }

  r.evidence.clear();
  r.evidence.push_back(fmt::format("{} of the {} ranks of process group {} wrote a dump; each waits in collective seq "
                                   "{} ({}), and none of them completed it",
                                   dumped, members.size(), pg, waits.front().seq, waits.front().call));
  for (const DumpWait& w : waits) {
    const std::string since = utc_ms_text(w.created_ns);
    r.evidence.push_back(fmt::format("rank {}: seq {} {}{}", w.rank, w.seq,
                                     w.state == "started" ? "started, in progress (waiting for its peers)"
                                                          : "enqueued, not started",
                                     since.empty() ? "" : ", since " + since));
  }
  if (first->created_ns > 0 && last->created_ns > first->created_ns)
    r.evidence.push_back(fmt::format("the dumped ranks entered it within {:.1f} ms of each other (rank {} first, rank "
                                     "{} last): they were in step up to it",
                                     double(last->created_ns - first->created_ns) / 1e6, first->rank, last->rank));
  if (newest_ns > 0 && last->created_ns > 0 && newest_ns >= last->created_ns)
    r.evidence.push_back(fmt::format("no dump records anything after it ({} is the newest time in them): the dumped "
                                     "ranks issued nothing more",
                                     utc_ms_text(newest_ns)));
  if (waits.front().timeout_ms > 0)
    r.evidence.push_back(fmt::format("the group's timeout is {} ms: past it PyTorch times the call out (for NCCL, with "
                                     "TORCH_NCCL_DUMP_ON_TIMEOUT=1, its watchdog then writes the dumps)",
                                     waits.front().timeout_ms));
  r.evidence.push_back(fmt::format("{} wrote no dump: a rank that crashed, was killed (out of host memory, a signal) "
                                   "or hangs before the call, or could not write, leaves none",
                                   who));
  if (r.confidence == "medium")
    r.evidence.push_back(dumped < 2 ? "only one rank dumped: nothing confirms its view"
                                    : "the ranks without a dump are most of the group: few witnesses");

  r.decides = {
      fmt::format("{}'s own log or stderr: an exception, a CUDA error, \"Killed\" or a signal before seq {}", who,
                  waits.front().seq),
      "the job's exit codes (torchrun's error file, TORCHELASTIC_ERROR_FILE; Slurm's sacct -j <job> "
      "--format=JobID,ExitCode,State) and the kernel log (dmesg: the OOM killer)",
      fmt::format("while it runs: py-spy dump --pid <pid> of {} (where its Python stands) and of one waiting rank", who),
      "a dump written again from every rank (TORCH_NCCL_DEBUG_INFO_PIPE_FILE, or the Flight Recorder's dump on "
      "timeout): a dump from the suspect that shows it past the call, or at another one, clears it"};
}

}  // namespace sb
