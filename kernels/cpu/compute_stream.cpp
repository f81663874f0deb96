#include "kernels/cpu/detail/compute_stream.hpp"

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // HangError

namespace sb::cpu {

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
  std::uint64_t seq;
  {
    std::lock_guard lk(mu_);
    queue_.push_back(Item{std::move(label), std::move(work)});
    seq = ++submitted_;
  }
  cv_work_.notify_one();
  return seq;
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
    try {
      item.work();
    } catch (...) {
      err = std::current_exception();
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
