// `stallbench analyze-hang DIR` on a real PyTorch job: its Flight Recorder
// dumps, one file per rank (TORCH_FR_DUMP_TEMP_FILE / the older
// TORCH_NCCL_DEBUG_INFO_TEMP_FILE + rank), written by the NCCL or gloo
// process group's watchdog on a timeout, or by _dump_fr_trace(_json)().
// Both forms: the pickle (readers/pickle, never executed) and the JSON.
// This file reads them; diagnose/hang/torch_fr_analysis analyses them.
//
// The analysis follows PyTorch's own analyzer (torch.distributed.
// flight_recorder.fr_trace): per process group, the ranks' collectives are
// aligned by collective_seq_id (sends and recvs apart, below), and the
// first seq where they disagree is reported, checked in this order: ranks
// that never joined it (missing), collective type, size (input and output
// sizes; all-gather and reduce-scatter counts against the group size),
// dtype, state. The culprit is the minority (on a tie, the ranks that differ
// from the group's lowest rank). Also: the last collective every rank
// completed, the culprit's Python frames, and the slowest arrival when
// nothing diverges. A missing dump is named and the rest is analysed.
// Sends and recvs are paired by peer, direction and per-pair order, batched ops
// (batch_isend_irecv) with batched ops only (p2p_seq_id counts a rank's own p2p
// calls and batches, so it does not pair them). A rank's first call that is not
// completed and is unmatched, or stuck in NCCL's per-pair issue order (a pair's
// plain calls share one queue), is taken as where it waits; following who waits
// on whom names the rank that never sent or received, the rank that left no
// dump, or a cycle (both receiving first: an ordering deadlock). A pair of
// different element counts or dtypes names the side that changed. That finding
// wins when no collective diverges, or when a collective's missing ranks all
// wait at such a call; its seq is then a p2p_seq_id (pattern "p2p...").
// Not modelled: p2p against collective waits, streams shared across pairs,
// gloo's own ordering; a wrapped ring is cut per pair (by collective seq, or by
// the time of its oldest entry) with a warning.
#pragma once

#include <cstddef>     // std::size_t
#include <cstdint>     // std::int64_t
#include <functional>  // std::function: frames_of
#include <initializer_list>  // std::initializer_list
#include <memory>      // std::shared_ptr: TorchFrShared
#include <string>      // std::string
#include <vector>      // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json


namespace sb {

inline constexpr const char* kTorchFlightRecorderFormat = "pytorch-flight-recorder";
// The highest rank a dump may name (a job of a million ranks): past it a number is not a rank.
inline constexpr int kMaxRank = (1 << 20) - 1;

// An immutable list that entries share: a dump's 20,000 entries issue a
// handful of distinct sizes and dtypes, and its reader holds each distinct
// one once (entries then stay small and the analysis, which compares them
// for every seq of every rank, reads few cache lines). Reads as a const T;
// assigned like one (e.input_sizes = {{16}}).
template <class T>
class TorchFrShared {
 public:
  using value_type = typename T::value_type;
  TorchFrShared() = default;
  TorchFrShared(T v) : p_(v.empty() ? nullptr : std::make_shared<const T>(std::move(v))) {}
  TorchFrShared(std::initializer_list<value_type> v) : TorchFrShared(T(v)) {}
  explicit TorchFrShared(std::shared_ptr<const T> p) : p_(p && !p->empty() ? std::move(p) : nullptr) {}
  const T& get() const {
    static const T kEmpty;
    return p_ ? *p_ : kEmpty;
  }
  auto begin() const { return get().begin(); }
  auto end() const { return get().end(); }
  std::size_t size() const { return p_ ? p_->size() : 0; }
  bool empty() const { return !p_; }
  const value_type& operator[](std::size_t i) const { return (*p_)[i]; }
  friend bool operator==(const TorchFrShared& a, const TorchFrShared& b) { return a.p_ == b.p_ || a.get() == b.get(); }

 private:
  std::shared_ptr<const T> p_;  // null: empty
};
using TorchFrSizes = TorchFrShared<std::vector<std::vector<std::int64_t>>>;  // each tensor's dimensions
using TorchFrDtypes = TorchFrShared<std::vector<std::string>>;

struct TorchFrEntry {
  // (what the analysis reads of every entry first, in three cache lines)
  std::string pg_name;         // process_group: (name, desc)
  std::string profiling_name;  // "nccl:all_reduce", "gloo:broadcast"
  std::string state;           // scheduled, started, completed
  std::int64_t collective_seq_id = -1;
  std::int64_t time_created_ns = 0;  // 0: not reached (as the other times)
  bool is_p2p = false;
  bool retired = false;  // the process group let go of the work: it finished (gloo leaves state at scheduled)
  std::int64_t p2p_seq_id = -1;
  TorchFrSizes input_sizes, output_sizes;
  TorchFrDtypes input_dtypes, output_dtypes;
  std::string pg_desc;
  std::int64_t record_id = -1, op_id = -1;
  std::int64_t time_started_ns = 0, time_completed_ns = 0;
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
// A pickle is parsed in storage the calling thread keeps for the next one.
TorchFrDump read_torch_fr_file(const std::string& path, std::string bytes);
TorchFrDump torch_fr_from_json(nlohmann::ordered_json j, const std::string& path, int rank);
// The trailing decimal number of a file's name ("rank_12", "nccl_trace_rank_3.json"), or -1.
int rank_from_file_name(const std::string& path);

}  // namespace sb
