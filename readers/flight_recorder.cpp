#include "readers/flight_recorder.hpp"

#include <algorithm>  // std::max, std::any_of

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // UsageError

namespace sb {

namespace {

using json = nlohmann::ordered_json;

}  // namespace

namespace {

constexpr int kMaxInt32 = 2147483647;

}  // namespace

json to_json(const FlightEntry& e) {
  json j;
  j["seq"] = e.seq;
  j["step"] = e.step;
  j["call"] = e.call_index;
  j["op"] = to_string(e.call.op);
  j["count"] = e.call.count;
  j["dtype"] = to_string(e.call.dtype);
  j["root"] = e.call.root;
  j["reduce"] = to_string(e.call.reduce);
  j["state"] = to_string(e.state);
  j["t_enqueue_us"] = e.t_enqueue_us;
  j["t_start_us"] = e.t_start_us;
  j["t_complete_us"] = e.t_complete_us;
  j["wrong"] = e.wrong;
  j["error"] = e.error;
  return j;
}

FlightEntry flight_entry_from_json(const JsonRef& j) {
  j.object();
  FlightEntry e;
  e.seq = j.at("seq").integer(0, kMaxDumpSeq);
  e.step = j.at("step").int32(-1, kMaxInt32);
  e.call_index = j.at("call").int32(-1, kMaxInt32);
  e.call.op = j.at("op").choice(kCollOpNames);
  e.call.count = j.at("count").integer(0, kMaxDumpSeq);
  e.call.dtype = j.at("dtype").choice(kCommDtypeNames);
  e.call.root = j.at("root").int32(-1, kMaxInt32);
  e.call.reduce = j.at("reduce").choice(kReduceOpNames);
  e.state = j.at("state").choice(kCallStateNames);
  e.t_enqueue_us = j.at("t_enqueue_us").integer(0, kMaxDumpTimeUs);
  e.t_start_us = j.at("t_start_us").integer(0, kMaxDumpTimeUs);
  e.t_complete_us = j.at("t_complete_us").integer(0, kMaxDumpTimeUs);
  e.wrong = j.at("wrong").integer(-1, kMaxDumpSeq);
  e.error = j.at("error").str();
  return e;
}

FlightEntry flight_entry_from_json(const json& j, const std::string& file) {
  return reading_file(file, [&] { return flight_entry_from_json(JsonRef(j, file)); });
}

std::int64_t now_us() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

FlightRecorder::FlightRecorder(std::size_t capacity)
    : capacity_(capacity), last_progress_(std::chrono::steady_clock::now()) {
  if (capacity_ < 1) throw UsageError("flight recorder: capacity must be >= 1, got 0");
  ring_.reserve(capacity_);
}

// seq s lives in slot s % capacity_ while it is among the last capacity_ issued.
FlightEntry* FlightRecorder::find(std::int64_t seq) {
  const auto held = static_cast<std::int64_t>(ring_.size());
  if (seq < 0 || seq >= next_seq_ || seq < next_seq_ - held) return nullptr;
  return &ring_[static_cast<std::size_t>(seq) % capacity_];
}

std::int64_t FlightRecorder::enqueue(const CollCall& c, int step, int call_index) {
  FlightEntry e;
  e.call = c;
  e.step = step;
  e.call_index = call_index;
  e.t_enqueue_us = now_us();
  std::lock_guard lock(mu_);
  e.seq = next_seq_++;
  if (ring_.size() < capacity_)
    ring_.push_back(std::move(e));
  else
    ring_[static_cast<std::size_t>(e.seq) % capacity_] = std::move(e);
  return next_seq_ - 1;
}

void FlightRecorder::started(std::int64_t seq) {
  const std::int64_t t = now_us();
  std::lock_guard lock(mu_);
  FlightEntry* e = find(seq);
  if (!e) return;
  e->t_start_us = t;
  if (e->state == CallState::enqueued) e->state = CallState::started;
}

void FlightRecorder::completed(std::int64_t seq) {
  const std::int64_t t = now_us();
  std::lock_guard lock(mu_);
  // Progress counts even when the entry was already overwritten: the call did finish.
  if (seq >= 0 && seq < next_seq_) {
    last_completed_ = std::max(last_completed_, seq);
    last_progress_ = std::chrono::steady_clock::now();
  }
  FlightEntry* e = find(seq);
  if (!e) return;
  if (e->t_start_us == 0) e->t_start_us = t;  // a call seen done at its first poll
  e->t_complete_us = t;
  e->state = CallState::completed;
}

void FlightRecorder::failed(std::int64_t seq, const std::string& error) {
  const std::int64_t t = now_us();
  std::lock_guard lock(mu_);
  FlightEntry* e = find(seq);
  if (!e) return;
  e->t_complete_us = t;
  e->state = CallState::failed;
  e->error = error;
}

void FlightRecorder::set_wrong(std::int64_t seq, std::int64_t wrong) {
  std::lock_guard lock(mu_);
  if (FlightEntry* e = find(seq)) e->wrong = wrong;
}

void FlightRecorder::set_where(const std::string& where) {
  std::lock_guard lock(mu_);
  where_ = where;
}

std::int64_t FlightRecorder::last_enqueued() const {
  std::lock_guard lock(mu_);
  return next_seq_ - 1;
}

std::int64_t FlightRecorder::last_completed() const {
  std::lock_guard lock(mu_);
  return last_completed_;
}

void FlightRecorder::touch() {
  std::lock_guard lk(mu_);
  last_progress_ = std::chrono::steady_clock::now();
}

std::chrono::steady_clock::time_point FlightRecorder::last_progress() const {
  std::lock_guard lock(mu_);
  return last_progress_;
}

bool FlightRecorder::in_flight() const {
  std::lock_guard lock(mu_);
  return std::any_of(ring_.begin(), ring_.end(), [](const FlightEntry& e) {
    return e.state == CallState::enqueued || e.state == CallState::started;
  });
}

std::vector<FlightEntry> FlightRecorder::ring_copy() const {
  std::vector<FlightEntry> out;
  out.reserve(ring_.size());
  const std::int64_t first = next_seq_ - static_cast<std::int64_t>(ring_.size());
  for (std::int64_t s = first; s < next_seq_; ++s)
    out.push_back(ring_[static_cast<std::size_t>(s) % capacity_]);
  return out;
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::lock_guard lock(mu_);
  return ring_copy();
}

std::string FlightRecorder::where() const {
  std::lock_guard lock(mu_);
  return where_;
}

json FlightRecorder::dump(const DumpHeader& h, const std::string& reason) const {
  // Copied under one lock (so the entries and the seqs agree), serialized
  // outside it: the main thread keeps recording meanwhile.
  std::vector<FlightEntry> es;
  std::int64_t last_enq, last_done, dropped;
  std::string where_now;
  {
    std::lock_guard lock(mu_);
    dropped = next_seq_ - static_cast<std::int64_t>(ring_.size());
    es = ring_copy();
    last_enq = next_seq_ - 1;
    last_done = last_completed_;
    where_now = where_;
  }
  json j;
  j["format"] = kFlightRecorderFormat;
  j["version"] = kFlightRecorderVersion;
  j["run_id"] = h.run_id;
  j["rank"] = h.rank;
  j["size"] = h.size;
  j["local_rank"] = h.local_rank;
  j["host"] = h.host;
  j["pid"] = h.pid;
  j["backend"] = h.backend;
  j["device"] = h.device;
  j["reason"] = reason;
  j["where"] = where_now;
  j["time_us"] = now_us();
  j["timeout_s"] = h.timeout_s;
  j["capacity"] = capacity_;
  j["dropped"] = dropped;
  j["last_enqueued_seq"] = last_enq;
  j["last_completed_seq"] = last_done;
  json arr = json::array();
  for (const auto& e : es) arr.push_back(to_json(e));
  j["entries"] = std::move(arr);
  return j;
}

}  // namespace sb
