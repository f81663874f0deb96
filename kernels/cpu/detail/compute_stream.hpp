// The cpu device's "stream": one dedicated compute thread running enqueued
// work in order. Device busy time is time this thread spends in work items.
#pragma once

#include <atomic>              // std::atomic
#include <chrono>              // std::chrono
#include <condition_variable>  // std::condition_variable
#include <cstdint>             // std::uint64_t
#include <deque>               // std::deque
#include <exception>           // std::exception_ptr
#include <functional>          // std::function
#include <mutex>               // std::mutex
#include <string>              // std::string
#include <thread>              // std::thread

namespace sb::cpu {

class ComputeStream {
 public:
  ComputeStream();
  ~ComputeStream();
  ComputeStream(const ComputeStream&) = delete;
  ComputeStream& operator=(const ComputeStream&) = delete;

  void enqueue(std::string label, std::function<void()> work);
  // Waits until everything enqueued so far has run. Throws HangError (naming
  // the item running) when timeout passes first; rethrows the first
  // exception a work item threw since the last synchronize.
  void synchronize(std::chrono::milliseconds timeout);
  // True while a work item runs: what the utilization sampler reads.
  bool busy() const { return busy_.load(std::memory_order_relaxed); }

 private:
  void loop();
  struct Item {
    std::string label;
    std::function<void()> work;
  };
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  std::deque<Item> queue_;
  std::uint64_t submitted_ = 0, completed_ = 0;
  std::string running_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::atomic<bool> busy_{false};
  std::thread thread_;
};

}  // namespace sb::cpu
