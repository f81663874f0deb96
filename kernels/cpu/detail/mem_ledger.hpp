// The cpu device's allocator: every allocation the device makes for ops and
// buffers (GEMM and attention operands, workspaces, oneDNN scratchpads,
// allocate()) goes through it, so in-use and peak bytes are exact. The
// accounting (in use, peak, the limit that makes the host behave like a
// smaller device) is the shared sb::MemoryLedger every device uses; this adds
// the 64-byte-aligned host memory behind it.
//
// Every block is also reserved against the process's host-memory budget
// (harness/host_memory.hpp: MemAvailable, the memory cgroups' limits,
// RLIMIT_AS), limit or no limit: on Linux a huge malloc succeeds and the
// process is killed later, when the pages are touched.
#pragma once

#include <atomic>   // std::atomic: keep_freed_
#include <cstddef>  // std::size_t
#include <cstdlib>  // std::aligned_alloc, std::free
#include <memory>   // std::shared_ptr, std::enable_shared_from_this
#include <string>   // std::string
#include <utility>  // std::exchange

#include <fmt/format.h>  // fmt::format

#include "harness/device.hpp"         // Device::MemoryStats
#include "harness/errors.hpp"         // OutOfMemory
#include "harness/host_memory.hpp"    // reserve_host_memory, check_host_memory
#include "harness/memory_ledger.hpp"  // MemoryLedger, MemoryReservation
#include "harness/units.hpp"          // format_bytes

namespace sb::cpu {

class MemLedger;

// One accounted allocation, 64-byte aligned; returns its bytes on destruction.
class LedgerBlock {
 public:
  LedgerBlock() = default;
  LedgerBlock(std::shared_ptr<MemLedger> l, void* p, std::size_t bytes, MemoryReservation device,
              HostReservation host)
      : ledger_(std::move(l)), p_(p), bytes_(bytes), device_(std::move(device)), host_(std::move(host)) {}
  LedgerBlock(LedgerBlock&& o) noexcept
      : ledger_(std::move(o.ledger_)), p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)),
        device_(std::move(o.device_)), host_(std::move(o.host_)) {}
  LedgerBlock& operator=(LedgerBlock&& o) noexcept {
    LedgerBlock tmp(std::move(o));
    std::swap(ledger_, tmp.ledger_);
    std::swap(p_, tmp.p_);
    std::swap(bytes_, tmp.bytes_);
    std::swap(device_, tmp.device_);
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
  MemoryReservation device_;  // the bytes in the device's account
  HostReservation host_;      // the same bytes in the process's host-memory budget
};

class MemLedger : public std::enable_shared_from_this<MemLedger> {
 public:
  explicit MemLedger(std::string device = "cpu")
      : device_(device), account_(std::make_shared<MemoryLedger>(std::move(device))) {}

  // Throws OutOfMemory when `bytes` more would not fit; `what` names the
  // request and how its size arises ("naive attention ... (S = B*H*S*S fp32 ...)").
  void require(std::size_t bytes, const std::string& what) const {
    account_->check(bytes, what);
    check_host_memory(bytes, fmt::format("{}: {}", device_, what));
  }

  // Checks, allocates and accounts. Size 0 gives an empty block.
  LedgerBlock alloc(std::size_t bytes, const std::string& what) {
    if (bytes == 0) return {};
    const std::size_t rounded = (bytes + 63) / 64 * 64;  // aligned_alloc needs a multiple of the alignment
    MemoryReservation device = account_->reserve(rounded, what);
    HostReservation host = reserve_host_memory(rounded, fmt::format("{}: {}", device_, what));
    void* p = std::aligned_alloc(64, rounded);
    if (!p)
      throw OutOfMemory(fmt::format("{}: {} needs {} and the allocator refused it", device_, what,
                                    format_bytes(double(bytes))));
    return LedgerBlock(shared_from_this(), p, rounded, std::move(device), std::move(host));
  }

  // An allocation inside an op's run whose peak the op reserved against the
  // host budget up front (eager attention's per-op tensors): accounted in the
  // device's ledger (in use, peak, limit) and taken from the same allocator
  // as alloc(), without re-reading /proc for every tensor. Untouched: the
  // page faults of a fresh tensor are part of what an eager op costs.
  LedgerBlock alloc_in_reserved(std::size_t bytes, const std::string& what) {
    if (bytes == 0) return {};
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    MemoryReservation device = account_->reserve(rounded, what);
    void* p = std::aligned_alloc(64, rounded);
    if (!p)
      throw OutOfMemory(fmt::format("{}: {} needs {} and the allocator refused it", device_, what,
                                    format_bytes(double(bytes))));
    return LedgerBlock(shared_from_this(), p, rounded, std::move(device), HostReservation{});
  }

  // After a wait on the device's stream timed out, an operation may still be
  // running (or queued) on blocks its owner is about to free while
  // unwinding. From then on a freed block is kept, not returned: a bounded
  // leak for a run that is ending, instead of a write into freed memory.
  void keep_freed_blocks() { keep_freed_.store(true, std::memory_order_release); }
  bool keeps_freed_blocks() const { return keep_freed_.load(std::memory_order_acquire); }

  Device::MemoryStats stats() const { return account_->stats("allocator"); }
  void reset_peak() { account_->reset_peak(); }
  void set_limit(std::size_t bytes) { account_->set_limit(bytes); }
  MemoryLedger& account() { return *account_; }

 private:
  std::string device_;
  std::shared_ptr<MemoryLedger> account_;
  std::atomic<bool> keep_freed_{false};
};

inline LedgerBlock::~LedgerBlock() {
  if (p_ && !ledger_->keeps_freed_blocks()) std::free(p_);
}

}  // namespace sb::cpu
