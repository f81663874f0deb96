#include "harness/memory_ledger.hpp"

#include "harness/kineto_trace.hpp"  // KinetoTrace

#include <algorithm>  // std::min, std::max

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // OutOfMemory
#include "harness/units.hpp"   // format_bytes

namespace sb {

MemoryReservation& MemoryReservation::operator=(MemoryReservation&& o) noexcept {
  if (this != &o) {
    MemoryReservation old(std::move(*this));
    ledger_ = std::move(o.ledger_);
    bytes_ = o.bytes_;
    o.bytes_ = 0;
  }
  return *this;
}

MemoryReservation::~MemoryReservation() {
  if (ledger_ && bytes_) ledger_->release(bytes_);
}

std::uint64_t MemoryLedger::effective_limit(std::string* source) const {
  if (limit_ && (!capacity_ || limit_ <= capacity_)) {
    if (source) *source = "the memory limit (mem_limit_gb)";
    return limit_;
  }
  if (capacity_ && source) *source = capacity_source_.empty() ? "the device's capacity" : capacity_source_;
  return capacity_;
}

void MemoryLedger::check_locked(std::uint64_t bytes, const std::string& what) const {
  std::string source;
  const std::uint64_t limit = effective_limit(&source);
  if (limit != 0 && (bytes > limit || in_use_ > limit - bytes)) {
    // A limit is given in GB (mem_limit_gb=1.2): said in GB too, beside the binary size.
    const bool set = limit_ && limit == limit_;
    throw OutOfMemory(fmt::format("{}: out of memory: {} needs {} but {} is {}{} ({} already in use)", device_, what,
                                  format_bytes(double(bytes)), source, format_bytes(double(limit)),
                                  set ? fmt::format(" ({:.3g} GB)", double(limit) / 1e9) : std::string(),
                                  format_bytes(double(in_use_))));
  }
}

void MemoryLedger::check(std::uint64_t bytes, const std::string& what) const {
  std::lock_guard lk(mu_);
  check_locked(bytes, what);
}

void MemoryLedger::book(std::uint64_t bytes, const std::string& what) {
  std::lock_guard lk(mu_);
  check_locked(bytes, what);
  in_use_ += bytes;  // booked before the allocation, so two threads cannot both pass the limit
  peak_ = std::max(peak_, in_use_);
  traced_locked();
}

void MemoryLedger::traced_locked() const {
  if (KinetoTrace* t = trace_.load(std::memory_order_acquire))
    t->memory(t->now_us(), std::int64_t(in_use_), std::int64_t(in_use_), std::int64_t(effective_limit(nullptr)));
}

MemoryReservation MemoryLedger::reserve(std::uint64_t bytes, const std::string& what) {
  if (bytes == 0) return {};
  book(bytes, what);
  return MemoryReservation(shared_from_this(), bytes);
}

void MemoryLedger::release(std::uint64_t bytes) {
  std::lock_guard lk(mu_);
  in_use_ -= std::min(bytes, in_use_);
  traced_locked();
}

Device::MemoryStats MemoryLedger::stats(std::string source) const {
  std::lock_guard lk(mu_);
  return {std::size_t(in_use_), std::size_t(peak_), std::size_t(effective_limit(nullptr)), std::move(source)};
}

void MemoryLedger::reset_peak() {
  std::lock_guard lk(mu_);
  peak_ = in_use_;
}

void MemoryLedger::set_limit(std::uint64_t bytes) {
  std::lock_guard lk(mu_);
  limit_ = bytes;
  if (KinetoTrace* t = trace_.load(std::memory_order_acquire)) t->set_capacity(std::int64_t(effective_limit(nullptr)));
}

std::uint64_t MemoryLedger::in_use() const {
  std::lock_guard lk(mu_);
  return in_use_;
}

}  // namespace sb
