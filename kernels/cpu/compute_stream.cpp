#include "kernels/cpu/detail/compute_stream.hpp"

#include <fmt/format.h>  // fmt::format

#include <cstdlib>  // std::strtoll
#include <utility>  // std::pair
#include <vector>   // std::vector

#include "harness/errors.hpp"        // HangError
#include "harness/kineto_trace.hpp"  // KinetoTrace

namespace sb::cpu {

namespace {
// The phases the running item marked (stream_mark), while it is traced.
thread_local std::vector<std::pair<std::string, double>>* t_marks = nullptr;
thread_local KinetoTrace* t_trace = nullptr;
thread_local std::pair<double, double>* t_interval = nullptr;  // a modelled interval, when the item set one

// How an item shows in a Kineto trace: the runtime call that launched it and
// the device event it ran as (no device event: the call only).
struct Shown {
  const char* runtime = nullptr;  // null: the item is the stream's own (not written)
  KinetoTrace::Kind kind = KinetoTrace::Kind::kernel;
  std::string name;
  std::int64_t bytes = -1;
  bool device = true;
};
bool starts(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }
bool has(const std::string& s, const char* p) { return s.find(p) != std::string::npos; }
std::int64_t bytes_in(const std::string& s) {  // "..., 1234 bytes)"
  const auto at = s.find(" bytes");
  if (at == std::string::npos) return -1;
  auto b = s.rfind(' ', at - 1);
  b = b == std::string::npos ? 0 : b + 1;
  return std::strtoll(s.c_str() + b, nullptr, 10);
}
Shown shown(const std::string& label) {
  using K = KinetoTrace::Kind;
  Shown s;
  s.device = false;  // the stream's own items: not written
  if (label == "gate" || label == "free" || label == "pin the compute thread" || starts(label, "sim: ")) return s;
  s.device = true;
  if (label == "event") return {"cudaEventRecord", K::kernel, "", -1, false};
  if (has(label, "h2d copy")) {
    const bool pageable = has(label, "pageable");
    return {"cudaMemcpyAsync", K::memcpy,
            pageable ? "Memcpy HtoD (Pageable -> Device)" : "Memcpy HtoD (Pinned -> Device)", bytes_in(label), true};
  }
  if (has(label, "upload")) return {"cudaMemcpyAsync", K::memcpy, "Memcpy HtoD (Pinned -> Device)", -1, true};
  if (starts(label, "zero")) return {"cudaMemsetAsync", K::memset, "Memset (Device)", -1, true};
  if (has(label, "graph replay")) return {"cudaGraphLaunch", K::kernel, label, -1, true};
  // the fused attention kernels under the names their CUDA counterparts have
  if (has(label, "flash attention") || has(label, "cudnn attention"))
    return {"cudaLaunchKernel", K::kernel,
            std::string(has(label, "flash") ? "flash_" : "cudnn_sdpa_") + (has(label, "bwd") || has(label, "backward") ? "bwd" : "fwd") +
                "_kernel [" + label + "]",
            -1, true};
  return {"cudaLaunchKernel", K::kernel, label, -1, true};
}
}  // namespace

bool stream_marking() { return t_marks != nullptr; }

void stream_interval(std::chrono::steady_clock::time_point start, std::chrono::steady_clock::time_point end) {
  if (t_interval) *t_interval = {t_trace->at_us(start), t_trace->at_us(end)};
}

void stream_mark(std::string name) {
  if (t_marks) t_marks->emplace_back(std::move(name), t_trace->now_us());
}

namespace {
std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

ComputeStream::ComputeStream(std::string device_name) : name_(std::move(device_name)), thread_([this] { loop(); }) {}

ComputeStream::~ComputeStream() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  thread_.join();
}

std::uint64_t ComputeStream::enqueue(std::string label, std::function<void()> work) {
  KinetoTrace* trace = trace_.load(std::memory_order_acquire);
  const Shown how = trace ? shown(label) : Shown{};
  const double t0 = how.runtime ? trace->now_us() : 0;
  const std::int64_t corr = how.runtime ? trace->next_correlation() : -1;
  std::uint64_t seq;
  {
    std::lock_guard lk(mu_);
    queue_.push_back(Item{std::move(label), std::move(work), how.device ? trace : nullptr, corr, how.name, how.bytes,
                          std::uint8_t(how.kind)});
    seq = ++submitted_;
  }
  cv_work_.notify_one();
  if (how.runtime) trace->host(KinetoTrace::Kind::runtime, how.runtime, t0, trace->now_us() - t0, corr);
  return seq;
}

void ComputeStream::record(const Item& item, double start_us, double end_us) {
  KinetoTrace& t = *item.trace;
  const auto kind = KinetoTrace::Kind(item.shown_kind);
  if (!t_marks || t_marks->empty()) {
    t.device(kind, item.shown_name, start_us, end_us - start_us, item.correlation, item.shown_bytes);
    return;
  }
  // phases: [start, mark 1) keeps the item's name, then each mark to the next
  const auto& m = *t_marks;
  if (m.front().second > start_us) t.device(kind, item.shown_name, start_us, m.front().second - start_us, item.correlation);
  for (std::size_t i = 0; i < m.size(); ++i) {
    const double b = m[i].second, e = i + 1 < m.size() ? m[i + 1].second : end_us;
    t.device(KinetoTrace::Kind::kernel, m[i].first, b, e - b, item.correlation);
  }
}

void ComputeStream::wait_for(std::uint64_t target, std::chrono::milliseconds timeout,
                             std::unique_lock<std::mutex>& lk) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool done = completed_ >= target;
  if (!done) {
    const auto it = targets_.insert(target);
    done = cv_done_.wait_until(lk, deadline, [&] { return completed_ >= target; });
    targets_.erase(it);
  }
  if (!done)
    throw HangError(fmt::format("{}: stream made no progress within {:.1f} s; running: {} ({} items queued)", name_,
                                double(timeout.count()) / 1e3, running_.empty() ? "nothing" : running_,
                                queue_.size()));
}

void ComputeStream::abandon_queued() {
  std::deque<Item> dropped;  // destroyed outside the lock: their captures may be large
  {
    std::lock_guard lk(mu_);
    dropped.swap(queue_);
    completed_ += dropped.size();
  }
  cv_done_.notify_all();
}

void ComputeStream::drain(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // submitted_ may grow while this waits: each round waits for the count
  // seen when it began (the stream wakes a waiter only at its target).
  while (completed_ < submitted_) {
    const auto it = targets_.insert(submitted_);
    const std::uint64_t target = submitted_;
    const bool done = cv_done_.wait_until(lk, deadline, [&] { return completed_ >= target; });
    targets_.erase(it);
    if (!done) return;
  }
}

void ComputeStream::synchronize(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  wait_for(submitted_, timeout, lk);
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void ComputeStream::wait_done(std::uint64_t seq, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  wait_for(seq, timeout, lk);
}

std::chrono::nanoseconds ComputeStream::wait_time() const {
  while (true) {  // the same sequence lock as busy_time
    const std::uint64_t s1 = seq_.load(std::memory_order_acquire);
    if (s1 & 1) continue;
    const std::int64_t since = wait_since_ns_.load(std::memory_order_acquire);
    const std::int64_t done = wait_done_ns_.load(std::memory_order_acquire);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (seq_.load(std::memory_order_relaxed) == s1)
      return std::chrono::nanoseconds(done + (since ? now_ns() - since : 0));
  }
}

std::chrono::nanoseconds ComputeStream::busy_time() const {
  // The two counters change together when an item starts or ends; a reader
  // in between would count an item twice or not at all (and the sampler's
  // next window would lose that time). A sequence lock: the stream thread
  // makes seq_ odd while it updates them; a reader retries until it saw an
  // even seq_ that did not change across its reads.
  while (true) {
    const std::uint64_t s1 = seq_.load(std::memory_order_acquire);
    if (s1 & 1) continue;
    const std::int64_t since = busy_since_ns_.load(std::memory_order_acquire);
    const std::int64_t done = busy_done_ns_.load(std::memory_order_acquire);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (seq_.load(std::memory_order_relaxed) == s1)
      return std::chrono::nanoseconds(done + (since ? now_ns() - since : 0));
  }
}

void ComputeStream::loop() {
  std::unique_lock lk(mu_);
  while (true) {
    if (queue_.empty() && !stop_) {
      // Waiting for work: counted, so that busy + waiting + the stream's own
      // per-item cost account for the thread's time (the batch scenario checks it).
      const std::int64_t ws = now_ns();
      seq_.fetch_add(1, std::memory_order_acq_rel);
      wait_since_ns_.store(ws, std::memory_order_release);
      seq_.fetch_add(1, std::memory_order_acq_rel);
      cv_work_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      seq_.fetch_add(1, std::memory_order_acq_rel);
      wait_done_ns_.fetch_add(now_ns() - ws, std::memory_order_acq_rel);
      wait_since_ns_.store(0, std::memory_order_release);
      seq_.fetch_add(1, std::memory_order_acq_rel);
    }
    if (queue_.empty()) return;  // stop_ and drained
    Item item = std::move(queue_.front());
    queue_.pop_front();
    running_ = item.label;
    lk.unlock();
    const std::int64_t start = now_ns();
    seq_.fetch_add(1, std::memory_order_acq_rel);  // odd: updating
    busy_since_ns_.store(start, std::memory_order_release);
    seq_.fetch_add(1, std::memory_order_acq_rel);  // even: consistent
    std::exception_ptr err;
    std::vector<std::pair<std::string, double>> marks;
    std::pair<double, double> interval{-1, -1};
    const double start_us = item.trace ? item.trace->now_us() : 0;
    if (item.trace) t_marks = &marks, t_trace = item.trace, t_interval = &interval;
    try {
      item.work();
    } catch (...) {
      err = std::current_exception();
    }
    if (item.trace) {
      if (interval.first >= 0) record(item, interval.first, interval.second);
      else record(item, start_us, item.trace->now_us());
      t_marks = nullptr;
      t_trace = nullptr;
      t_interval = nullptr;
    }
    // Publish the finished interval before clearing "running", so a reader
    // never sees the interval counted twice or not at all for long.
    seq_.fetch_add(1, std::memory_order_acq_rel);
    busy_done_ns_.fetch_add(now_ns() - start, std::memory_order_acq_rel);
    busy_since_ns_.store(0, std::memory_order_release);
    seq_.fetch_add(1, std::memory_order_acq_rel);
    lk.lock();
    if (err && !error_) error_ = err;
    running_.clear();
    ++completed_;
    if (!targets_.empty() && completed_ >= *targets_.begin()) cv_done_.notify_all();
  }
}

}  // namespace sb::cpu
