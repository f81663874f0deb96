// `stallbench analyze-hang DIR` on a real PyTorch job: its Flight Recorder
// dumps, one file per rank (TORCH_FR_DUMP_TEMP_FILE / the older
// TORCH_NCCL_DEBUG_INFO_TEMP_FILE + rank), written by the NCCL or gloo
// process group's watchdog on a timeout, or by _dump_fr_trace(_json)().
// Both forms: the pickle (harness/pickle_read, never executed) and the JSON.
//
// The analysis follows PyTorch's own analyzer (torch.distributed.
// flight_recorder.fr_trace): per process group, the ranks' collectives are
// aligned by collective_seq_id (p2p calls by p2p_seq_id apart), and the
// first seq where they disagree is reported, checked in this order: ranks
// that never joined it (missing), collective type, size (input and output
// sizes; all-gather and reduce-scatter counts against the group size),
// dtype, state. The culprit is the minority (on a tie, the ranks that differ
// from the group's lowest rank). Also: the last collective every rank
// completed, the culprit's Python frames, and the slowest arrival when
// nothing diverges. A missing dump is named and the rest is analysed.
#pragma once

#include <cstddef>     // std::size_t
#include <cstdint>     // std::int64_t
#include <functional>  // std::function: frames_of
#include <string>      // std::string
#include <vector>      // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "scenarios/collective/hang_analysis.hpp"  // HangReport

namespace sb {

inline constexpr const char* kTorchFlightRecorderFormat = "pytorch-flight-recorder";

struct TorchFrEntry {
  std::int64_t record_id = -1;
  std::string pg_name, pg_desc;  // process_group: (name, desc)
  std::int64_t collective_seq_id = -1, p2p_seq_id = -1, op_id = -1;
  bool is_p2p = false;
  std::string profiling_name;  // "nccl:all_reduce", "gloo:broadcast"
  std::vector<std::vector<std::int64_t>> input_sizes, output_sizes;
  std::vector<std::string> input_dtypes, output_dtypes;
  std::string state;  // scheduled, started, completed
  bool retired = false;  // the process group let go of the work: it finished (gloo leaves state at scheduled)
  std::int64_t time_created_ns = 0, time_started_ns = 0, time_completed_ns = 0;  // 0: not reached
  double duration_ms = -1;
  std::int64_t timeout_ms = 0;
  std::size_t index = 0;            // its position in the dump's entries
  std::vector<std::string> frames;  // "name (file:line)"; empty: read through TorchFrDump::frames_of
};

// Completed, as far as the dump can tell.
inline bool torch_fr_done(const TorchFrEntry& e) { return e.state == "completed" || e.retired; }

struct TorchFrDump {
  int rank = -1;  // from the file name's trailing number, as PyTorch names them
  std::string path, version;
  // Process groups by name: the global ranks in each.
  struct Group {
    std::string name, desc;
    std::vector<int> ranks;
  };
  std::vector<Group> groups;
  std::vector<TorchFrEntry> entries;
  // The Python frames of entries[i], read from the dump only when asked
  // (the culprit's): a 20,000-entry dump has 160,000 of them. Throws
  // UsageError for a malformed frame. Empty for hand-made dumps.
  std::function<std::vector<std::string>(std::size_t)> frames_of;
};

// True when a parsed JSON document is a PyTorch Flight Recorder dump.
bool is_torch_fr_json(const nlohmann::ordered_json& j);
// Reads one dump (the pickle or the JSON form, decided by its bytes).
// Throws UsageError naming the file and the field (or the pickle offset).
TorchFrDump read_torch_fr_file(const std::string& path, std::string bytes);
TorchFrDump torch_fr_from_json(nlohmann::ordered_json j, const std::string& path, int rank);
// The trailing decimal number of a file's name ("rank_12", "nccl_trace_rank_3.json"), or -1.
int rank_from_file_name(const std::string& path);

// The analysis. Ranks of the job without a dump are named.
HangReport analyze_torch_fr(const std::vector<TorchFrDump>& dumps);

}  // namespace sb
