// The cpu device's memory ledger: every allocation the device makes for ops
// and buffers (GEMM and attention operands, workspaces, oneDNN scratchpads,
// allocate()) goes through it, so in-use and peak bytes are exact and a
// limit makes the host behave like a smaller device: a request past it
// throws OutOfMemory naming the bytes, never crashes.
//
// Every block is also reserved against the process's host-memory budget
// (harness/host_memory.hpp: MemAvailable, the memory cgroups' limits,
// RLIMIT_AS), limit or no limit: on Linux a huge malloc succeeds and the
// process is killed later, when the pages are touched.
#pragma once

#include <atomic>  // std::atomic: keep_freed_

#include <cstddef>   // std::size_t
#include <cstdlib>   // std::aligned_alloc, std::free
#include <memory>    // std::shared_ptr, std::enable_shared_from_this
#include <mutex>     // std::mutex
#include <string>    // std::string
#include <utility>   // std::exchange

#include <fmt/format.h>  // fmt::format

#include "harness/device.hpp"  // Device::MemoryStats, Buffer
#include "harness/errors.hpp"       // OutOfMemory
#include "harness/host_memory.hpp"  // reserve_host_memory, check_host_memory
#include "harness/units.hpp"        // format_bytes

namespace sb::cpu {

class MemLedger;

// One accounted allocation, 64-byte aligned; returns its bytes on destruction.
class LedgerBlock {
 public:
  LedgerBlock() = default;
  LedgerBlock(std::shared_ptr<MemLedger> l, void* p, std::size_t bytes, HostReservation host)
      : ledger_(std::move(l)), p_(p), bytes_(bytes), host_(std::move(host)) {}
  LedgerBlock(LedgerBlock&& o) noexcept
      : ledger_(std::move(o.ledger_)), p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)),
        host_(std::move(o.host_)) {}
  LedgerBlock& operator=(LedgerBlock&& o) noexcept {
    LedgerBlock tmp(std::move(o));
    std::swap(ledger_, tmp.ledger_);
    std::swap(p_, tmp.p_);
    std::swap(bytes_, tmp.bytes_);
    std::swap(host_, tmp.host_);
    return *this;
  }
  LedgerBlock(const LedgerBlock&) = delete;
  LedgerBlock& operator=(const LedgerBlock&) = delete;
  ~LedgerBlock();
  void* data() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<MemLedger> ledger_;
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
  HostReservation host_;  // the same bytes in the process's host-memory budget
};

class MemLedger : public std::enable_shared_from_this<MemLedger> {
 public:
  explicit MemLedger(std::string device = "cpu") : device_(std::move(device)) {}

  // Throws OutOfMemory when `bytes` more would not fit; `what` names the
  // request and how its size arises ("naive attention ... (S = B*H*S*S fp32 ...)").
  void require(std::size_t bytes, const std::string& what) const {
    {
      std::lock_guard lk(mu_);
      require_locked(bytes, what);
    }
    check_host_memory(bytes, fmt::format("{}: {}", device_, what));
  }

  // Checks, allocates and accounts. Size 0 gives an empty block.
  LedgerBlock alloc(std::size_t bytes, const std::string& what) {
    if (bytes == 0) return {};
    const std::size_t rounded = (bytes + 63) / 64 * 64;  // aligned_alloc needs a multiple of the alignment
    {
      std::lock_guard lk(mu_);
      require_locked(rounded, what);
      in_use_ += rounded;  // reserved before the call, so two threads cannot both pass the limit
      peak_ = std::max(peak_, in_use_);
    }
    HostReservation host;
    try {
      host = reserve_host_memory(rounded, fmt::format("{}: {}", device_, what));
    } catch (...) {
      release(rounded);
      throw;
    }
    void* p = std::aligned_alloc(64, rounded);
    if (!p) {
      release(rounded);
      throw OutOfMemory(fmt::format("{}: {} needs {} and the allocator refused it", device_, what,
                                    format_bytes(bytes)));
    }
    return LedgerBlock(shared_from_this(), p, rounded, std::move(host));
  }

  // After a wait on the device's stream timed out, an operation may still be
  // running (or queued) on blocks its owner is about to free while
  // unwinding. From then on a freed block is kept, not returned: a bounded
  // leak for a run that is ending, instead of a write into freed memory.
  void keep_freed_blocks() { keep_freed_.store(true, std::memory_order_release); }
  bool keeps_freed_blocks() const { return keep_freed_.load(std::memory_order_acquire); }

  void release(std::size_t bytes) {
    std::lock_guard lk(mu_);
    in_use_ -= std::min(bytes, in_use_);
  }

  Device::MemoryStats stats() const {
    std::lock_guard lk(mu_);
    return {in_use_, peak_, limit_, "allocator"};
  }
  void reset_peak() {
    std::lock_guard lk(mu_);
    peak_ = in_use_;
  }
  void set_limit(std::size_t bytes) {
    std::lock_guard lk(mu_);
    limit_ = bytes;
  }

 private:
  void require_locked(std::size_t bytes, const std::string& what) const {
    if (limit_ != 0) {
      if (bytes > limit_ || in_use_ > limit_ - bytes)
        throw OutOfMemory(fmt::format("{}: {} needs {} but the memory limit is {} ({} already in use)", device_,
                                      what, format_bytes(bytes), format_bytes(limit_), format_bytes(in_use_)));
    }
  }

  std::string device_;
  std::atomic<bool> keep_freed_{false};
  mutable std::mutex mu_;
  std::size_t in_use_ = 0, peak_ = 0, limit_ = 0;
};

inline LedgerBlock::~LedgerBlock() {
  if (p_ && !ledger_->keeps_freed_blocks()) {
    std::free(p_);
    ledger_->release(bytes_);
  }
}

}  // namespace sb::cpu
