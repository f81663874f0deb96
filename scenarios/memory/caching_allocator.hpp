// A caching device-memory allocator that reproduces the policy of PyTorch's
// CUDACachingAllocator (c10/cuda/CUDACachingAllocator.cpp, the "native"
// backend without expandable segments), so the `memory` scenario can show the
// allocator's fragmentation: reserved memory far above allocated memory, and
// an allocation that fails although the free bytes it holds would fit it.
// It reproduces a policy, like a naive baseline kernel: it is not a
// general-purpose allocator and it is not thread-safe (one caller at a time).
//
// PyTorch's rules it follows, with PyTorch's constants:
//   - round_size: a request under kMinBlockSize (512 B) becomes 512 B; any
//     other rounds up to a multiple of 512 B.
//   - Two pools: small (rounded size <= kSmallSize, 1 MiB) and large.
//   - A new segment (get_allocation_size): a small request gets kSmallBuffer
//     (2 MiB); a large one under kMinLargeAlloc (10 MiB) gets kLargeBuffer
//     (20 MiB); a larger one gets its size rounded up to kRoundLarge (2 MiB).
//   - get_free_block: best fit in the request's pool, the smallest free block
//     >= the size, ties by address (segments get increasing addresses).
//     With max_split_size set: a request under it never takes a cached block
//     of max_split_size or more, and a request of max_split_size or more
//     never takes a block of size + kLargeBuffer or more.
//   - should_split: the small pool splits when the remainder is >= 512 B; the
//     large pool when the request is under max_split_size and the remainder
//     is > kSmallSize (1 MiB). Otherwise the whole block is handed out
//     (allocated counts the whole block, requested the caller's bytes).
//   - No fitting block: ask the backing for a segment. If it refuses
//     (OutOfMemory), release every entirely free segment of both pools
//     (release_cached_blocks), count a retry (num_alloc_retries) and ask once
//     more; a second refusal throws OutOfMemory with the numbers.
//   - free: the block goes back to its pool and merges with free neighbours
//     in its segment. empty_cache releases every entirely free segment.
//
// Left out: expandable segments, streams and per-stream pools (one stream),
// CUDA-graph private pools, events (a free is reusable at once), the
// garbage-collection threshold, roundup_power2_divisions, the memory
// fraction, free-memory callbacks, and release_available_cached_blocks (the
// step that, with max_split_size set, first frees only enough oversize
// blocks): here a refusal always releases every free segment.
#pragma once

#include <cstddef>        // std::size_t
#include <cstdint>        // std::uint64_t, SIZE_MAX
#include <functional>     // std::function
#include <map>            // std::map: blocks and segments by address
#include <memory>         // std::shared_ptr
#include <set>            // std::set: the free pools ordered by (size, address)
#include <string>         // std::string
#include <unordered_map>  // std::unordered_map: live block ids
#include <utility>        // std::pair

namespace sb {

struct CachingAllocatorConfig {
  std::size_t max_split_size = SIZE_MAX;  // PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb, in bytes
};

// The backing: gives a segment of `bytes` (throws sb::OutOfMemory when it
// cannot) as an owner whose destruction returns it. On cpu the scenario
// passes real ledger-accounted buffers; a test can pass a counter. The
// allocator never dereferences the pointer (it may be null).
using SegmentSource = std::function<std::shared_ptr<void>(std::size_t bytes)>;

struct AllocatorStats {
  std::size_t allocated = 0;  // bytes of blocks handed out (rounded, whole blocks)
  std::size_t requested = 0;  // bytes the callers asked for
  std::size_t reserved = 0;   // bytes of segments held from the backing
  std::size_t peak_allocated = 0, peak_reserved = 0;
  std::size_t segments = 0, active_blocks = 0, free_blocks = 0;
  std::size_t largest_free_block = 0;  // over both pools
  // reserved but unallocated, by pool: a request uses only its own pool's blocks (small: up to 1 MiB)
  std::size_t small_pool_free = 0, large_pool_free = 0;
  std::uint64_t alloc_retries = 0;     // times the cache was released to retry the backing
  std::uint64_t ooms = 0;              // OutOfMemory thrown
};

class CachingAllocator {
 public:
  static constexpr std::size_t kMinBlockSize = 512;                // all sizes are multiples of this
  static constexpr std::size_t kSmallSize = std::size_t(1) << 20;  // the largest small request: 1 MiB
  static constexpr std::size_t kSmallBuffer = std::size_t(2) << 20;   // a small pool segment: 2 MiB
  static constexpr std::size_t kMinLargeAlloc = std::size_t(10) << 20;  // large requests under this share...
  static constexpr std::size_t kLargeBuffer = std::size_t(20) << 20;    // ...a 20 MiB segment
  static constexpr std::size_t kRoundLarge = std::size_t(2) << 20;      // other segments round up to 2 MiB

  explicit CachingAllocator(SegmentSource source, CachingAllocatorConfig cfg = {});
  // Releases every segment; blocks still allocated are the caller's bug and
  // are released all the same (no throw).
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A handed-out block: its id (never reused) and its size (rounded, the
  // whole block, which may exceed the request when it was not split).
  struct Block {
    std::uint64_t id = 0;
    std::size_t size = 0;
  };

  // Throws OutOfMemory (message like PyTorch's, with the numbers).
  Block malloc(std::size_t bytes, const std::string& what);
  // Throws std::logic_error for an unknown id, a double free or a size that
  // is not the block's.
  void free(Block b);
  void empty_cache();
  AllocatorStats stats() const;
  // The block's memory: the segment owner's pointer plus the block's offset;
  // nullptr when the backing gave a null pointer. Throws std::logic_error
  // for a block not allocated.
  void* data(const Block& b) const;

  static std::size_t round_size(std::size_t bytes);
  // The segment a new request of `rounded` bytes gets (get_allocation_size).
  static std::size_t segment_size(std::size_t rounded);

 private:
  struct Segment {
    std::size_t size = 0;
    std::shared_ptr<void> owner;
    bool small = false;
  };
  struct BlockRec {
    std::size_t segment = 0;  // the segment's address (key in segments_)
    std::size_t size = 0;
    std::size_t requested = 0;
    std::uint64_t id = 0;     // 0 while free
    bool allocated = false;
  };
  using FreeSet = std::set<std::pair<std::size_t, std::size_t>>;  // (size, address)

  FreeSet& pool(bool small) { return small ? small_free_ : large_free_; }
  // get_free_block: the address of the block taken from the pool, or npos.
  std::size_t find_free_block(bool small, std::size_t size);
  // Asks the backing for a segment; its address, or npos when refused (the
  // refusal's text in *why).
  std::size_t new_segment(std::size_t bytes, bool small, std::string* why);
  // release_cached_blocks: every entirely free segment back to the backing.
  void release_cached_segments();
  void bump_peaks();

  static constexpr std::size_t npos = SIZE_MAX;

  SegmentSource source_;
  CachingAllocatorConfig cfg_;
  std::map<std::size_t, Segment> segments_;  // by address
  std::map<std::size_t, BlockRec> blocks_;   // every block, free or not, by address
  FreeSet small_free_, large_free_;
  std::unordered_map<std::uint64_t, std::size_t> live_;  // id -> address
  std::size_t next_address_ = 0;  // segments get increasing, non-overlapping addresses
  std::uint64_t next_id_ = 1;
  AllocatorStats st_;
};

}  // namespace sb
