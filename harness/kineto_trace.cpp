// The Kineto trace writer (what and why in kineto_trace.hpp).
#include "harness/kineto_trace.hpp"

#include <sys/syscall.h>  // SYS_gettid
#include <unistd.h>       // getpid, syscall

#include <algorithm>  // std::sort
#include <chrono>     // std::chrono

namespace sb {
namespace {
using json = nlohmann::ordered_json;
constexpr std::int64_t kDevice = 0;

double steady_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const char* cat(KinetoTrace::Kind k) {
  switch (k) {
    case KinetoTrace::Kind::kernel: return "kernel";
    case KinetoTrace::Kind::memcpy: return "gpu_memcpy";
    case KinetoTrace::Kind::memset: return "gpu_memset";
    case KinetoTrace::Kind::runtime: return "cuda_runtime";
    case KinetoTrace::Kind::cpu_op: return "cpu_op";
    case KinetoTrace::Kind::user_annotation: return "user_annotation";
  }
  return "cpu_op";
}
bool on_device(KinetoTrace::Kind k) {
  return k == KinetoTrace::Kind::kernel || k == KinetoTrace::Kind::memcpy || k == KinetoTrace::Kind::memset;
}
}  // namespace

KinetoTrace::Kind range_kind(const std::string& name) {
  if (name.rfind("aten::", 0) == 0) return KinetoTrace::Kind::cpu_op;
  return KinetoTrace::Kind::user_annotation;
}

KinetoTrace::KinetoTrace() : pid_(::getpid()) {
  const double wall =
      std::chrono::duration<double, std::micro>(std::chrono::system_clock::now().time_since_epoch()).count();
  epoch_offset_us_ = wall - steady_us();
}

double KinetoTrace::now_us() const {
  return steady_us() + epoch_offset_us_ + (follow_ ? double(follow_->load()) / 1e3 : 0.0);
}

double KinetoTrace::at_us(std::chrono::steady_clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count() + epoch_offset_us_;
}

std::int64_t KinetoTrace::next_correlation() { return correlation_.fetch_add(1, std::memory_order_relaxed) + 1; }

std::int64_t KinetoTrace::this_tid() {
  thread_local const std::int64_t tid = std::int64_t(::syscall(SYS_gettid));  // one syscall per thread
  return tid;
}

void KinetoTrace::host(Kind kind, std::string name, double ts, double dur, std::int64_t correlation) {
  const std::int64_t tid = this_tid();
  std::lock_guard lk(mu_);
  events_.push_back({kind, std::move(name), ts, dur, tid, correlation, -1, 0});
}

void KinetoTrace::host_on(Kind kind, std::string name, double ts, double dur, std::int64_t tid,
                          std::int64_t correlation) {
  std::lock_guard lk(mu_);
  events_.push_back({kind, std::move(name), ts, dur, tid, correlation, -1, 0});
}

void KinetoTrace::device(Kind kind, std::string name, double ts, double dur, std::int64_t correlation,
                         std::int64_t bytes, std::int64_t stream, std::int64_t device) {
  std::lock_guard lk(mu_);
  events_.push_back({kind, std::move(name), ts, dur, stream, correlation, bytes, device});
}

void KinetoTrace::memory(double ts, std::int64_t allocated, std::int64_t reserved, std::int64_t limit) {
  std::lock_guard lk(mu_);
  memory_.push_back({ts, allocated, reserved, limit});
}

void KinetoTrace::push(std::string name) {
  const double t = now_us();
  const std::int64_t tid = this_tid();
  std::lock_guard lk(mu_);
  open_.push_back({tid, std::move(name), t});
}

void KinetoTrace::pop() {
  const double t = now_us();
  const std::int64_t tid = this_tid();
  std::lock_guard lk(mu_);
  for (auto it = open_.rbegin(); it != open_.rend(); ++it)
    if (it->tid == tid) {
      events_.push_back({range_kind(it->name), std::move(it->name), it->ts, t - it->ts, tid, -1, -1, 0});
      open_.erase(std::next(it).base());
      return;
    }
}

void KinetoTrace::set_device(std::string name, std::int64_t total_bytes, int compute_major, std::string note) {
  std::lock_guard lk(mu_);
  device_name_ = std::move(name);
  total_bytes_ = total_bytes;
  compute_major_ = compute_major;
  note_ = std::move(note);
}

void KinetoTrace::set_capacity(std::int64_t total_bytes) {
  std::lock_guard lk(mu_);
  total_bytes_ = std::max(total_bytes_, total_bytes);
}

std::size_t KinetoTrace::size() const {
  std::lock_guard lk(mu_);
  return events_.size() + memory_.size();
}

json KinetoTrace::to_json() const {
  std::lock_guard lk(mu_);
  json evs = json::array();
  evs.push_back(json{{"name", "process_name"}, {"ph", "M"}, {"ts", 0}, {"pid", pid_}, {"tid", 0},
                     {"args", {{"name", "stallbench"}}}});
  evs.push_back(json{{"name", "process_name"}, {"ph", "M"}, {"ts", 0}, {"pid", kDevice}, {"tid", 0},
                     {"args", {{"name", device_name_}}}});
  std::vector<const Ev*> order;
  order.reserve(events_.size());
  for (const Ev& e : events_) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const Ev* a, const Ev* b) { return a->ts < b->ts; });
  for (const Ev* e : order) {
    json j{{"ph", "X"}, {"cat", cat(e->kind)}, {"name", e->name}};
    json args = json::object();
    if (on_device(e->kind)) {
      j["pid"] = e->device;
      j["tid"] = e->tid;
      args["device"] = e->device;
      args["stream"] = e->tid;
      args["correlation"] = e->correlation;
      if (e->bytes >= 0) {
        args["bytes"] = e->bytes;
        if (e->dur > 0) args["memory bandwidth (GB/s)"] = double(e->bytes) / (e->dur * 1e3);
      }
    } else {
      j["pid"] = pid_;
      j["tid"] = e->tid;
      if (e->correlation >= 0) args["correlation"] = e->correlation;
    }
    j["ts"] = e->ts;
    j["dur"] = e->dur;
    j["args"] = args;
    evs.push_back(std::move(j));
  }
  for (const Mem& m : memory_) {
    json args{{"Device Type", 1},
              {"Device Id", kDevice},
              {"Total Allocated", m.allocated},
              {"Total Reserved", m.reserved}};
    if (m.limit > 0) args["Limit"] = m.limit;
    evs.push_back(json{{"ph", "i"},
                       {"cat", "cpu_instant_event"},
                       {"s", "t"},
                       {"name", "[memory]"},
                       {"pid", pid_},
                       {"tid", pid_},
                       {"ts", m.ts},
                       {"args", args}});
  }
  // totalGlobalMem only where it is known: 0 (the cpu device without a limit) divided the TensorBoard
  // plugin's memory rule by zero, and it loaded nothing of the trace
  json dev{{"id", kDevice}, {"name", device_name_}};
  if (total_bytes_ > 0) dev["totalGlobalMem"] = total_bytes_;
  if (compute_major_ > 0) dev["computeMajor"] = compute_major_;
  return json{{"schemaVersion", 1},
              {"deviceProperties", json::array({dev})},
              {"stallbench", {{"note", note_}}},
              {"traceEvents", evs},
              {"displayTimeUnit", "ms"}};
}

}  // namespace sb
