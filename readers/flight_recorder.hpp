// The flight recorder: each rank's ring of its last N collectives, in the
// order it issued them (like PyTorch's NCCL Flight Recorder). The watchdog
// dumps it as JSON, one file per rank; `stallbench analyze-hang` aligns the
// ranks' rings by sequence number.
//
// Dump format ("format": "stallbench-flight-recorder", "version": 1):
//   run_id, rank, size, local_rank, host, pid, backend, device,
//   reason      why this dump was written ("watchdog: ...", "end of run", ...)
//   where       what the rank's main thread was doing then
//   time_us     when it was written (system clock, µs since the Unix epoch)
//   timeout_s, capacity, dropped (entries overwritten by the ring)
//   last_enqueued_seq, last_completed_seq   (-1: none)
//   entries: [{seq, step, call, op, count, dtype, root, reduce, state,
//              t_enqueue_us, t_start_us, t_complete_us, wrong, error}]
// seq counts the workload collectives this rank issued on the communicator,
// from 0 (the fingerprint check's own all-reduces are not counted). step and
// call are the program position: the training step and the call's index in
// it (-1 outside a step loop). state: enqueued (issued to the library),
// started (running: a GPU event before it passed, or the MPI request posted),
// completed, failed (the library returned an error, or the fingerprint check
// refused it: error says which). Times are 0 until reached. wrong: elements
// that failed the exact data check after completion (-1: not checked).
#pragma once

#include <chrono>       // std::chrono::steady_clock
#include <cstdint>      // std::int64_t
#include <mutex>        // std::mutex
#include <optional>     // std::optional: parse_call_state
#include <string>       // std::string
#include <string_view>  // std::string_view: to_string(CallState)
#include <vector>       // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/comm.hpp"  // CollCall
#include "harness/json_read.hpp"  // JsonRef
#include "harness/names.hpp"  // NameTable: to_string, parse and choices from one table

namespace sb {

inline constexpr const char* kFlightRecorderFormat = "stallbench-flight-recorder";
inline constexpr int kFlightRecorderVersion = 1;

enum class CallState { enqueued, started, completed, failed };
inline constexpr NameTable<CallState, 4> kCallStateNames{{{{CallState::enqueued, "enqueued"}, {CallState::started, "started"}, {CallState::completed, "completed"}, {CallState::failed, "failed"}}}};
inline std::string_view to_string(CallState v) { return kCallStateNames.name(v); }
inline std::optional<CallState> parse_call_state(std::string_view s) { return kCallStateNames.parse(s); }

struct FlightEntry {
  std::int64_t seq = 0;
  int step = -1;
  int call_index = -1;  // "call" in JSON
  CollCall call;
  CallState state = CallState::enqueued;
  std::int64_t t_enqueue_us = 0, t_start_us = 0, t_complete_us = 0;
  std::int64_t wrong = -1;
  std::string error;
};

nlohmann::ordered_json to_json(const FlightEntry&);
// Throws UsageError naming the file and the path of the missing, mistyped or
// out-of-range field ("rank-1.json: entries[3].seq: expected integer, got
// string \"x\""). Integers are range-checked, never narrowed: a seq or a time
// is at most kMaxDumpSeq, so arithmetic on them cannot overflow.
FlightEntry flight_entry_from_json(const JsonRef& j);
FlightEntry flight_entry_from_json(const nlohmann::ordered_json& j, const std::string& file = "flight-recorder entry");

// Bounds on what a dump may hold: 2^53 collectives, or microseconds (285
// years after the epoch), is beyond any run.
inline constexpr std::int64_t kMaxDumpSeq = std::int64_t(1) << 53;
inline constexpr std::int64_t kMaxDumpTimeUs = std::int64_t(1) << 53;

// Who a dump belongs to (the header fields of the format above).
struct DumpHeader {
  std::string run_id;
  int rank = 0, size = 1, local_rank = 0;
  std::string host;
  long pid = 0;
  std::string backend, device;
  double timeout_s = 0;
};

std::int64_t now_us();  // system clock, µs since the Unix epoch

// Thread-safe: the main thread records, the watchdog thread reads and dumps.
class FlightRecorder {
 public:
  explicit FlightRecorder(std::size_t capacity);

  // Records a call as enqueued and returns its seq.
  std::int64_t enqueue(const CollCall& c, int step, int call_index);
  void started(std::int64_t seq);
  void completed(std::int64_t seq);
  void failed(std::int64_t seq, const std::string& error);
  void set_wrong(std::int64_t seq, std::int64_t wrong);
  // What the main thread is doing now ("step 5 call 0: all_reduce", "sleeping
  // 3000 ms before step 5 (straggler)").
  void set_where(const std::string& where);

  std::int64_t last_enqueued() const;
  std::int64_t last_completed() const;
  // When the last call completed (or the recorder was made): the watchdog's clock.
  std::chrono::steady_clock::time_point last_progress() const;
  // Local progress that is not a collective (filling or checking buffers
  // between calls): resets the watchdog's clock too.
  void touch();
  // true while some call is enqueued or started and not yet completed.
  bool in_flight() const;
  std::vector<FlightEntry> entries() const;  // oldest first
  std::string where() const;

  nlohmann::ordered_json dump(const DumpHeader& h, const std::string& reason) const;

 private:
  FlightEntry* find(std::int64_t seq);  // null once overwritten; mu_ held
  std::vector<FlightEntry> ring_copy() const;  // oldest first; mu_ held
  mutable std::mutex mu_;
  std::vector<FlightEntry> ring_;
  std::size_t capacity_;
  std::int64_t next_seq_ = 0;
  std::int64_t last_completed_ = -1;
  std::chrono::steady_clock::time_point last_progress_;
  std::string where_ = "starting";
};

}  // namespace sb
