#include "scenarios/memory/caching_allocator.hpp"

#include <iterator>   // std::prev, std::next
#include <stdexcept>  // std::logic_error, std::length_error
#include <vector>     // std::vector

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // OutOfMemory
#include "harness/units.hpp"   // format_bytes

namespace sb {

namespace {
// Requests above this cannot be rounded to a segment without overflow.
constexpr std::size_t kMaxRequest = SIZE_MAX / 4;
}  // namespace

CachingAllocator::CachingAllocator(SegmentSource source, CachingAllocatorConfig cfg)
    : source_(std::move(source)), cfg_(cfg) {
  if (!source_) throw std::logic_error("CachingAllocator: no segment source");
}

CachingAllocator::~CachingAllocator() {
  // The owners return the segments as they go; live blocks are dropped with them.
  live_.clear();
  blocks_.clear();
  small_free_.clear();
  large_free_.clear();
  segments_.clear();
}

std::size_t CachingAllocator::round_size(std::size_t bytes) {
  if (bytes > kMaxRequest) throw std::length_error(fmt::format("CachingAllocator: request of {} bytes", bytes));
  if (bytes < kMinBlockSize) return kMinBlockSize;
  return kMinBlockSize * ((bytes + kMinBlockSize - 1) / kMinBlockSize);
}

std::size_t CachingAllocator::segment_size(std::size_t rounded) {
  if (rounded > kMaxRequest) throw std::length_error(fmt::format("CachingAllocator: segment for {} bytes", rounded));
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
}

void CachingAllocator::bump_peaks() {
  if (st_.allocated > st_.peak_allocated) st_.peak_allocated = st_.allocated;
  if (st_.reserved > st_.peak_reserved) st_.peak_reserved = st_.reserved;
}

std::size_t CachingAllocator::find_free_block(bool small, std::size_t size) {
  FreeSet& p = pool(small);
  auto it = p.lower_bound({size, 0});  // the smallest block >= size, lowest address first
  if (it == p.end()) return npos;
  const std::size_t found = it->first;
  // PyTorch's get_free_block with max_split_size: a request under it does not
  // take an oversize block; an oversize request takes one only within kLargeBuffer.
  if (size < cfg_.max_split_size && found >= cfg_.max_split_size) return npos;
  if (size >= cfg_.max_split_size && found >= size + kLargeBuffer) return npos;
  const std::size_t addr = it->second;
  p.erase(it);
  return addr;
}

std::size_t CachingAllocator::new_segment(std::size_t bytes, bool small, std::string* why) {
  if (bytes > SIZE_MAX - 1 - next_address_) {  // the reproduction's address space, not the device's
    *why = "the allocator's address space is exhausted";
    return npos;
  }
  std::shared_ptr<void> owner;
  try {
    owner = source_(bytes);
  } catch (const OutOfMemory& e) {
    *why = e.what();
    return npos;
  }
  const std::size_t addr = next_address_;
  segments_.emplace(addr, Segment{bytes, std::move(owner), small});
  blocks_.emplace(addr, BlockRec{addr, bytes, 0, 0, false});
  next_address_ += bytes;
  ++st_.segments;
  st_.reserved += bytes;
  bump_peaks();
  return addr;
}

void CachingAllocator::release_cached_segments() {
  // A free block that covers its whole segment: the segment is unsplit.
  std::vector<std::size_t> whole;
  for (const FreeSet* p : {&small_free_, &large_free_})
    for (const auto& [size, addr] : *p) {
      const BlockRec& b = blocks_.at(addr);
      if (b.segment == addr && segments_.at(addr).size == size) whole.push_back(addr);
    }
  for (std::size_t addr : whole) {
    auto seg = segments_.find(addr);
    pool(seg->second.small).erase({seg->second.size, addr});
    blocks_.erase(addr);
    st_.reserved -= seg->second.size;
    --st_.segments;
    segments_.erase(seg);  // the owner gives the memory back
  }
}

CachingAllocator::Block CachingAllocator::malloc(std::size_t bytes, const std::string& what) {
  if (bytes > kMaxRequest) {
    ++st_.ooms;
    throw OutOfMemory(fmt::format("caching allocator out of memory. Tried to allocate {} ({}): larger than any "
                                  "segment the allocator can describe",
                                  format_bytes(double(bytes)), what));
  }
  const std::size_t size = round_size(bytes);
  const bool small = size <= kSmallSize;

  std::size_t addr = find_free_block(small, size);
  if (addr == npos) {
    const std::size_t seg_bytes = segment_size(size);
    std::string why;
    addr = new_segment(seg_bytes, small, &why);
    if (addr == npos) {
      // PyTorch's release_cached_blocks, then one more cudaMalloc (a retry).
      release_cached_segments();
      ++st_.alloc_retries;
      addr = new_segment(seg_bytes, small, &why);
    }
    if (addr == npos) {
      ++st_.ooms;
      const AllocatorStats s = stats();
      const std::size_t unallocated = s.reserved - s.allocated;
      std::string msg = fmt::format(
          "caching allocator out of memory. Tried to allocate {} ({}). Reserved by the allocator: {}, allocated: {}, "
          "reserved but unallocated: {}, largest free block: {}; the backing refused a new segment of {} ({})",
          format_bytes(double(size)), what, format_bytes(double(s.reserved)), format_bytes(double(s.allocated)),
          format_bytes(double(unallocated)), format_bytes(double(s.largest_free_block)),
          format_bytes(double(seg_bytes)), why);
      // fragmentation only where the request's own pool holds the bytes free (a large request cannot use
      // the small pool's 2 MiB segments, and the other way round)
      if ((small ? s.small_pool_free : s.large_pool_free) >= size)
        msg += "; reserved but unallocated memory in its pool is large: this is fragmentation (PyTorch: "
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True or max_split_size_mb)";
      throw OutOfMemory(msg);
    }
  }

  auto it = blocks_.find(addr);
  BlockRec& b = it->second;
  const std::size_t remaining = b.size - size;
  const bool split = small ? remaining >= kMinBlockSize : (size < cfg_.max_split_size && remaining > kSmallSize);
  if (split) {
    blocks_.emplace_hint(std::next(it), addr + size, BlockRec{b.segment, remaining, 0, 0, false});
    pool(small).insert({remaining, addr + size});
    b.size = size;
  }
  b.allocated = true;
  b.requested = bytes;
  b.id = next_id_++;
  live_.emplace(b.id, addr);
  st_.allocated += b.size;
  st_.requested += bytes;
  bump_peaks();
  return Block{b.id, b.size};
}

void CachingAllocator::free(Block blk) {
  auto live = live_.find(blk.id);
  if (live == live_.end())
    throw std::logic_error(fmt::format("CachingAllocator::free: block {} is not allocated (unknown id or double free)",
                                       blk.id));
  auto it = blocks_.find(live->second);
  if (it->second.size != blk.size)
    throw std::logic_error(fmt::format("CachingAllocator::free: block {} has {} bytes, not {}", blk.id,
                                       it->second.size, blk.size));
  live_.erase(live);
  BlockRec& b = it->second;
  const bool small = segments_.at(b.segment).small;
  st_.allocated -= b.size;
  st_.requested -= b.requested;
  b.allocated = false;
  b.requested = 0;
  b.id = 0;
  FreeSet& p = pool(small);
  // Merge with the free neighbour after, then the one before, in the same segment.
  if (auto nx = std::next(it); nx != blocks_.end() && nx->second.segment == b.segment && !nx->second.allocated) {
    p.erase({nx->second.size, nx->first});
    b.size += nx->second.size;
    blocks_.erase(nx);
  }
  if (it != blocks_.begin()) {
    auto pv = std::prev(it);
    if (pv->second.segment == b.segment && !pv->second.allocated) {
      p.erase({pv->second.size, pv->first});
      pv->second.size += b.size;
      blocks_.erase(it);
      it = pv;
    }
  }
  p.insert({it->second.size, it->first});
}

void CachingAllocator::empty_cache() { release_cached_segments(); }

void* CachingAllocator::data(const Block& blk) const {
  auto live = live_.find(blk.id);
  if (live == live_.end()) throw std::logic_error(fmt::format("CachingAllocator::data: block {} is not allocated", blk.id));
  const std::size_t addr = live->second;
  const BlockRec& b = blocks_.at(addr);
  void* base = segments_.at(b.segment).owner.get();
  return base ? static_cast<char*>(base) + (addr - b.segment) : nullptr;
}

AllocatorStats CachingAllocator::stats() const {
  AllocatorStats s = st_;
  s.active_blocks = live_.size();
  s.free_blocks = small_free_.size() + large_free_.size();
  s.largest_free_block = 0;
  if (!small_free_.empty()) s.largest_free_block = small_free_.rbegin()->first;
  if (!large_free_.empty() && large_free_.rbegin()->first > s.largest_free_block)
    s.largest_free_block = large_free_.rbegin()->first;
  for (const auto& [size, addr] : small_free_) s.small_pool_free += size;
  for (const auto& [size, addr] : large_free_) s.large_pool_free += size;
  return s;
}

}  // namespace sb
