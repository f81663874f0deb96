// `stallbench analyze-hang DIR`: reads the per-rank flight-recorder dumps
// (flight_recorder.hpp), aligns the ranks by sequence number, and names the
// first collective where they disagree, the kind of disagreement and the
// culprit rank(s). The order of checks follows PyTorch's Flight Recorder
// analyzer: op, then count (size), then dtype, then root; then ranks missing
// from a collective.
//
// Aligning by seq is what finds the true first divergence: a rank that skips
// a call or swaps two is often paired silently with the wrong calls by the
// library (Open MPI does), and the job hangs or fails much later.
#pragma once

#include <cstdint>  // std::int64_t
#include <functional>  // std::function: analyze_hang_files' reader
#include <string>   // std::string
#include <utility>  // std::pair: wrong_data_from
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/text.hpp"  // text::rank_ranges

#include "readers/flight_recorder.hpp"  // FlightEntry, DumpHeader
#include "harness/names.hpp"  // NameTable: to_string, parse and choices from one table

namespace sb {

struct RankDump {
  DumpHeader header;
  std::string reason, where;
  std::int64_t time_us = 0;
  std::int64_t last_enqueued_seq = -1, last_completed_seq = -1;
  std::int64_t dropped = 0;
  std::vector<FlightEntry> entries;  // oldest first
  std::string path;                  // the file it came from
};

// Throws UsageError naming `file` and the field's path when j is not a
// flight-recorder dump, or when its counters do not match its entries.
RankDump rank_dump_from_json(const nlohmann::ordered_json& j, const std::string& file = "flight-recorder dump");

enum class DivergenceKind {
  none,     // every rank issued the same calls
  op,       // different collectives at one seq
  count,    // same op, different element count
  dtype,    // same op and count, different dtype
  root,     // same op, count and dtype, different root
  missing,  // some ranks never issued this seq
  state,    // same call everywhere, but not every rank got as far with it (PyTorch dumps)
};
inline constexpr NameTable<DivergenceKind, 7> kDivergenceKindNames{{{{DivergenceKind::none, "none"}, {DivergenceKind::op, "op"}, {DivergenceKind::count, "count"}, {DivergenceKind::dtype, "dtype"}, {DivergenceKind::root, "root"}, {DivergenceKind::missing, "missing"}, {DivergenceKind::state, "state"}}}};
inline std::string_view to_string(DivergenceKind v) { return kDivergenceKindNames.name(v); }

struct HangReport {
  // "stallbench-flight-recorder" (our collective's dumps) or
  // "pytorch-flight-recorder" (torch_fr.hpp: a real job's dumps).
  std::string format = "stallbench-flight-recorder";
  std::string dir;
  std::string run_id;
  int size = 0;                       // from the dumps' headers
  std::vector<int> ranks_found;       // ranks with a dump of this run
  std::vector<int> ranks_missing;     // ranks 0..size-1 without one
  std::vector<std::string> warnings;  // stale dumps of other runs, unreadable files, ...

  // The first seq at which the ranks disagree (none: they never did within
  // the rings' common window).
  DivergenceKind kind = DivergenceKind::none;
  std::string pattern;  // refinement: "skip", "order" (calls swapped), "" when none applies
  std::int64_t seq = -1;
  int step = -1, call_index = -1;  // the program position the majority (or the reference) had there
  std::vector<int> culprits;
  std::string expected;                    // "all_reduce count=1024 fp32" the others issued
  std::vector<std::string> per_rank_call;  // what each rank issued at seq ("-" none), by rank

  // Each rank's last completed and last enqueued seq (-1: none), by rank
  // (-2 when the rank's dump is missing), and its `where`.
  std::vector<std::int64_t> last_completed, last_enqueued;
  std::vector<std::string> where;
  // Ranks whose exact data check failed, and the first seq where it did:
  // evidence that the library paired mismatched calls silently.
  std::vector<std::pair<int, std::int64_t>> wrong_data_from;

  // When every rank issued the same calls: the slowest arrival. For the seq
  // with the largest spread of in-collective time, the rank that spent the
  // least time inside it arrived last; the others lost the difference.
  std::int64_t stall_seq = -1;
  int stall_rank = -1;
  double stall_lost_ms = 0;  // the most any other rank waited for it

  std::string summary;  // one line: "seq 10 (step 5 call 0): rank 1 skipped all_reduce count=... fp32"

  // PyTorch dumps only: the process group the divergence is in, the name
  // PyTorch's analyzer (fr_trace) gives the same finding, the last
  // collective every rank of the group completed, and the culprit's Python
  // frames at the divergent entry ("func (file:line)", innermost first).
  std::string process_group;
  std::string torch_match_state;
  std::int64_t last_all_completed_seq = -1;
  std::string last_all_completed;
  std::vector<std::string> culprit_frames;

  // PyTorch dumps, pattern "no dump": the ranks without a dump are the suspects, not proven
  // culprits. How sure (high: two or more dumps wait in the same call; medium: one dump only, or
  // the suspects are most of the group), the evidence (each dump's wait: the call, since when),
  // and what would settle it.
  std::string confidence;
  std::vector<std::string> evidence;
  std::vector<std::string> decides;

  // PyTorch dumps, a `missing` finding: the ranks that wait on each other in a ring through the
  // culprit, across calls and process groups (a collective some member never reached, a send or recv
  // its peer never answered), each with the call it waits in and the rank it waits for (the next
  // one's). Empty when the waits end at a rank that waits on nobody. With every rank blocked in its
  // call, none of them can go on: a deadlock, whichever rank's order of calls is the wrong one.
  struct WaitStep {
    int rank = -1;
    std::string call;           // "all_reduce in [8] Float ..." as the table writes calls
    std::string process_group;
    bool p2p = false;
    std::int64_t seq = -1;      // collective seq, or p2p seq when p2p
    int waits_for = -1;         // the next rank of the cycle
    std::string where;          // "process group 0 collective seq 2 (nccl:all_reduce)"
  };
  std::vector<WaitStep> wait_cycle;
};

// Reads every *.json in dir that is a flight-recorder dump. With dumps of
// several runs, analyses the newest run and warns about the rest. Throws
// UsageError when dir is missing or holds no dump.
HangReport analyze_hang_dir(const std::string& dir);
// The same on files already listed (in name order), each read by `read`
// (read_json_file for analyze_hang_dir): a file that read throws a
// UsageError for, or that is not a dump of this format, is a warning.
HangReport analyze_hang_files(const std::string& dir, const std::vector<std::string>& files,
                              const std::function<nlohmann::ordered_json(const std::string&)>& read);
// The analysis itself, on dumps already read (all of one run_id).
HangReport analyze_dumps(const std::vector<RankDump>& dumps);

std::string format_hang_report(const HangReport& r);  // readable, several lines
// "0, 2-5, 9" of sorted ranks ("none" for none): harness/text.hpp's.
using text::rank_ranges;
nlohmann::ordered_json to_json(const HangReport& r);

}  // namespace sb
