#include "kernels/cpu/detail/compute_stream.hpp"

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // HangError

namespace sb::cpu {

ComputeStream::ComputeStream() : thread_([this] { loop(); }) {}

ComputeStream::~ComputeStream() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  thread_.join();
}

void ComputeStream::enqueue(std::string label, std::function<void()> work) {
  {
    std::lock_guard lk(mu_);
    queue_.push_back(Item{std::move(label), std::move(work)});
    ++submitted_;
  }
  cv_work_.notify_one();
}

void ComputeStream::synchronize(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  const std::uint64_t target = submitted_;
  if (!cv_done_.wait_for(lk, timeout, [&] { return completed_ >= target; }))
    throw HangError(fmt::format("cpu: compute stream made no progress within {:.1f} s; running: {} ({} items queued)",
                                double(timeout.count()) / 1e3, running_.empty() ? "nothing" : running_,
                                queue_.size()));
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void ComputeStream::loop() {
  std::unique_lock lk(mu_);
  while (true) {
    cv_work_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained
    Item item = std::move(queue_.front());
    queue_.pop_front();
    running_ = item.label;
    lk.unlock();
    busy_.store(true, std::memory_order_relaxed);
    std::exception_ptr err;
    try {
      item.work();
    } catch (...) {
      err = std::current_exception();
    }
    busy_.store(false, std::memory_order_relaxed);
    lk.lock();
    if (err && !error_) error_ = err;
    running_.clear();
    ++completed_;
    cv_done_.notify_all();
  }
}

}  // namespace sb::cpu
