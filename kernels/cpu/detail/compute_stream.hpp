// A "stream" made of one dedicated thread running enqueued work in order: the
// cpu device's stream (real compute) and the sim device's (timed waits).
// Device busy time is time this thread spends inside work items.
#pragma once

#include <atomic>              // std::atomic
#include <chrono>              // std::chrono
#include <condition_variable>  // std::condition_variable
#include <cstdint>             // std::uint64_t, std::int64_t
#include <deque>               // std::deque
#include <exception>           // std::exception_ptr
#include <functional>          // std::function
#include <mutex>               // std::mutex
#include <set>                 // std::multiset
#include <string>              // std::string
#include <thread>              // std::thread

namespace sb {
class KinetoTrace;
}

namespace sb::cpu {

// Inside a work item: the phase named `name` begins now. With --trace each
// phase of the item is written as its own kernel (the first one keeps the
// item's name up to the first mark); without, nothing is recorded.
// stream_marking() says whether the running item is traced (a caller can
// skip building the name).
bool stream_marking();
void stream_mark(std::string name);
// Inside a work item: the device time the item stands for, when it is not
// the time the thread spent in it (the sim device's modelled interval: its
// thread sleeps only when the model runs ahead). --trace writes this interval.
void stream_interval(std::chrono::steady_clock::time_point start, std::chrono::steady_clock::time_point end);

class ComputeStream {
 public:
  explicit ComputeStream(std::string device_name = "cpu");
  ~ComputeStream();
  ComputeStream(const ComputeStream&) = delete;
  ComputeStream& operator=(const ComputeStream&) = delete;

  // Returns the item's sequence number (1, 2, ...).
  std::uint64_t enqueue(std::string label, std::function<void()> work);
  // Waits until everything enqueued so far has run. Throws HangError (naming
  // the item running) when timeout passes first; rethrows the first
  // exception a work item threw since the last synchronize.
  void synchronize(std::chrono::milliseconds timeout);
  // Waits until item `seq` has run; HangError on timeout.
  void wait_done(std::uint64_t seq, std::chrono::milliseconds timeout);
  // Drops the items not yet started (the one running goes on): after a hang
  // they would only prolong the wait of the destructor, which joins the
  // thread. Their sequence numbers count as completed.
  void abandon_queued();
  // Waits, at most `timeout`, until nothing runs or is queued; never throws.
  // After a hang an op's destructor uses it so that nothing it owns is freed
  // under its running work item (the harness watchdog bounds the process).
  void drain(std::chrono::milliseconds timeout);
  // True while a work item runs.
  bool busy() const { return busy_since_ns_.load(std::memory_order_acquire) != 0; }
  // Total time spent inside work items, including the one running now.
  std::chrono::nanoseconds busy_time() const;
  // Total time the thread waited on an empty queue, including a wait now.
  std::chrono::nanoseconds wait_time() const;
  // --trace: every item enqueued from now is recorded (its launch on the
  // calling thread, its run on the device); null stops recording.
  void set_trace(KinetoTrace* t) { trace_.store(t, std::memory_order_release); }
  // The OpenMP team the stream's thread runs (set where the device pins it,
  // before the pinning item is enqueued; 0: OpenMP's default, never set).
  // Primitives made on another thread for this stream are made for it
  // (omp_team.hpp).
  void set_team(int n) { team_.store(n, std::memory_order_release); }
  int team() const { return team_.load(std::memory_order_acquire); }

 private:
  void loop();
  void wait_for(std::uint64_t target, std::chrono::milliseconds timeout, std::unique_lock<std::mutex>& lk);
  struct Item {
    std::string label;
    std::function<void()> work;
    KinetoTrace* trace = nullptr;  // --trace: how the item shows there (compute_stream.cpp)
    std::int64_t correlation = -1;
    std::string shown_name;
    std::int64_t shown_bytes = -1;
    std::uint8_t shown_kind = 0;
  };
  void record(const Item& item, double start_us, double end_us);
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  std::deque<Item> queue_;
  std::uint64_t submitted_ = 0, completed_ = 0;
  // The completion counts that threads blocked in wait_for wait for. The
  // stream wakes them only when the smallest is reached: a notify per item
  // woke a host blocked in synchronize() once per op (a futex wake and a
  // context switch each, 2.9 us per item measured on 2 cores: 13% of a small
  // training step charged to the "device").
  std::multiset<std::uint64_t> targets_;
  std::string running_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::atomic<std::int64_t> busy_since_ns_{0};  // steady_clock ns when the running item began; 0 = idle
  std::atomic<std::int64_t> busy_done_ns_{0};   // busy time of finished items
  std::atomic<std::int64_t> wait_since_ns_{0};  // when the current wait for work began; 0 = not waiting
  std::atomic<std::int64_t> wait_done_ns_{0};   // time of finished waits
  std::atomic<std::uint64_t> seq_{0};           // odd while the pairs above change (busy_time's and wait_time's lock)
  std::atomic<KinetoTrace*> trace_{nullptr};
  std::atomic<int> team_{0};
  std::thread thread_;
};

}  // namespace sb::cpu
