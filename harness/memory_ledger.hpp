// Device-memory accounting, one class for every device (cpu, cuda, sim):
// bytes in use, the high-water mark, and a limit that makes the device
// behave like a smaller one. A request past the limit throws OutOfMemory
// naming what asked, the bytes, the limit and what is in use: a point status
// `oom`, never a crash. Each device adds only its allocator (cpu: aligned
// host memory; cuda: cudaMalloc; sim: nothing, or host memory for buffers).
//
// Shared (shared_ptr) with every buffer and op that holds some of it, so a
// release after the device is gone still settles the account.
#pragma once

#include <cstdint>  // std::uint64_t
#include <atomic>  // std::atomic
#include <memory>   // std::shared_ptr
#include <mutex>    // std::mutex
#include <string>   // std::string

#include "harness/device.hpp"  // Device::MemoryStats

namespace sb {

class KinetoTrace;

class MemoryLedger;

// `bytes` of a ledger, held until destroyed. Move-only.
class MemoryReservation {
 public:
  MemoryReservation() = default;
  MemoryReservation(std::shared_ptr<MemoryLedger> l, std::uint64_t bytes) : ledger_(std::move(l)), bytes_(bytes) {}
  MemoryReservation(MemoryReservation&& o) noexcept : ledger_(std::move(o.ledger_)), bytes_(o.bytes_) { o.bytes_ = 0; }
  MemoryReservation& operator=(MemoryReservation&& o) noexcept;
  MemoryReservation(const MemoryReservation&) = delete;
  MemoryReservation& operator=(const MemoryReservation&) = delete;
  ~MemoryReservation();
  std::uint64_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<MemoryLedger> ledger_;
  std::uint64_t bytes_ = 0;
};

class MemoryLedger : public std::enable_shared_from_this<MemoryLedger> {
 public:
  // capacity 0: none (the host's memory bounds a cpu device; see
  // harness/host_memory.hpp). capacity_source says where it comes from.
  explicit MemoryLedger(std::string device, std::uint64_t capacity = 0, std::string capacity_source = {})
      : device_(std::move(device)), capacity_(capacity), capacity_source_(std::move(capacity_source)) {}

  // Throws OutOfMemory when `bytes` more would pass the limit.
  void check(std::uint64_t bytes, const std::string& what) const;
  // Checks and books `bytes`.
  MemoryReservation reserve(std::uint64_t bytes, const std::string& what);
  // The same, for an owner that releases by count (a cudaMalloc'ed buffer).
  void book(std::uint64_t bytes, const std::string& what);
  void release(std::uint64_t bytes);

  Device::MemoryStats stats(std::string source) const;
  void reset_peak();
  // 0 removes the limit (the capacity, if any, still holds).
  void set_limit(std::uint64_t bytes);
  std::uint64_t in_use() const;
  // --trace: each change of the bytes in use is a [memory] sample (null: none).
  void set_trace(KinetoTrace* t) { trace_.store(t, std::memory_order_release); }

 private:
  // The limit in force and where it comes from; mu_ held.
  std::uint64_t effective_limit(std::string* source) const;
  void check_locked(std::uint64_t bytes, const std::string& what) const;

  std::string device_;
  std::uint64_t capacity_;
  std::string capacity_source_;
  mutable std::mutex mu_;
  std::uint64_t in_use_ = 0, peak_ = 0, limit_ = 0;
  std::atomic<KinetoTrace*> trace_{nullptr};
  void traced_locked() const;  // a [memory] sample, mu_ held
};

}  // namespace sb
