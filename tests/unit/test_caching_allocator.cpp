// The caching allocator against PyTorch's CUDACachingAllocator rules: size
// rounding and segment sizes at the boundaries, the small pool's shared 2 MiB
// segments, reuse and merging, the split thresholds, best fit, the
// fragmentation OOM (reserved minus allocated would fit the request, the
// request fails all the same), the release-and-retry path, empty_cache,
// max_split_size, invalid frees and destruction with live blocks. The backing
// is a counter with a capacity over real host buffers, so every segment the
// allocator holds is checked against the backing's own count (and ASan sees
// the buffers).
#include <algorithm>
#include <cstddef>
#include <iterator>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "scenarios/memory/caching_allocator.hpp"
#include "harness/errors.hpp"

namespace sb {
namespace {

constexpr std::size_t KiB = std::size_t(1) << 10;
constexpr std::size_t MiB = std::size_t(1) << 20;

// A backing with a capacity: refuses (OutOfMemory) past it; each owner gives
// its bytes back when destroyed.
struct Backing {
  struct State {
    std::size_t capacity = 0, held = 0, segments = 0;
    std::size_t calls = 0, refusals = 0;
  };
  std::shared_ptr<State> st = std::make_shared<State>();

  explicit Backing(std::size_t capacity) { st->capacity = capacity; }
  SegmentSource source() const {
    auto s = st;
    return [s](std::size_t bytes) -> std::shared_ptr<void> {
      ++s->calls;
      if (s->held + bytes > s->capacity) {
        ++s->refusals;
        throw OutOfMemory("backing: no room for " + std::to_string(bytes) + " bytes");
      }
      void* p = ::operator new(bytes);
      s->held += bytes;
      ++s->segments;
      return std::shared_ptr<void>(p, [s, bytes](void* q) {
        ::operator delete(q);
        s->held -= bytes;
        --s->segments;
      });
    };
  }
};

// stats.reserved and stats.segments against the backing's own count.
void expect_matches_backing(const CachingAllocator& a, const Backing& b) {
  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.reserved, b.st->held);
  EXPECT_EQ(s.segments, b.st->segments);
}

char* ptr(const CachingAllocator& a, const CachingAllocator::Block& b) { return static_cast<char*>(a.data(b)); }

TEST(CachingAllocator, RoundingAndSegmentSizesAtTheBoundaries) {
  using A = CachingAllocator;
  EXPECT_EQ(A::round_size(0), 512u);
  EXPECT_EQ(A::round_size(1), 512u);
  EXPECT_EQ(A::round_size(511), 512u);
  EXPECT_EQ(A::round_size(512), 512u);
  EXPECT_EQ(A::round_size(513), 1024u);
  EXPECT_EQ(A::round_size(1 * MiB), 1 * MiB);
  EXPECT_EQ(A::round_size(1 * MiB + 1), 1 * MiB + 512);
  EXPECT_EQ(A::round_size(10 * MiB - 512), 10 * MiB - 512);
  EXPECT_EQ(A::round_size(10 * MiB), 10 * MiB);
  EXPECT_EQ(A::round_size(10 * MiB + 1), 10 * MiB + 512);

  // small (<= 1 MiB): a 2 MiB segment
  EXPECT_EQ(A::segment_size(A::round_size(1)), 2 * MiB);
  EXPECT_EQ(A::segment_size(A::round_size(513)), 2 * MiB);
  EXPECT_EQ(A::segment_size(A::round_size(1 * MiB)), 2 * MiB);
  // large under 10 MiB: a 20 MiB segment
  EXPECT_EQ(A::segment_size(A::round_size(1 * MiB + 1)), 20 * MiB);
  EXPECT_EQ(A::segment_size(A::round_size(10 * MiB - 512)), 20 * MiB);
  // 10 MiB and above: the size rounded up to 2 MiB
  EXPECT_EQ(A::segment_size(A::round_size(10 * MiB)), 10 * MiB);
  EXPECT_EQ(A::segment_size(A::round_size(10 * MiB + 1)), 12 * MiB);
  EXPECT_EQ(A::segment_size(A::round_size(13 * MiB)), 14 * MiB);
}

TEST(CachingAllocator, PoolsFollowTheRoundedSize) {
  Backing back(1024 * MiB);
  CachingAllocator a(back.source());
  auto s1 = a.malloc(1 * MiB, "largest small");  // small pool: a 2 MiB segment
  EXPECT_EQ(a.stats().reserved, 2 * MiB);
  auto l1 = a.malloc(1 * MiB + 1, "smallest large");  // large pool: a 20 MiB segment
  EXPECT_EQ(a.stats().reserved, 22 * MiB);
  EXPECT_EQ(l1.size, 1 * MiB + 512);
  // The small segment's free 1 MiB does not serve a large request, nor the
  // large segment's free 19 MiB a small one.
  auto s2 = a.malloc(1 * MiB, "small again");
  EXPECT_EQ(a.stats().reserved, 22 * MiB);  // the small segment's other half
  auto s3 = a.malloc(512, "small, third");
  EXPECT_EQ(a.stats().reserved, 24 * MiB);  // a second small segment, not the large one
  EXPECT_EQ(back.st->calls, 3u);
  expect_matches_backing(a, back);
  for (auto b : {s1, l1, s2, s3}) a.free(b);
}

TEST(CachingAllocator, SmallRequestsShareOneSegmentReuseAndMerge) {
  Backing back(64 * MiB);
  CachingAllocator a(back.source());
  auto b1 = a.malloc(1000, "a");
  auto b2 = a.malloc(1000, "b");
  auto b3 = a.malloc(1000, "c");
  auto b4 = a.malloc(1000, "d");
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.segments, 1u);
  EXPECT_EQ(s.reserved, 2 * MiB);
  EXPECT_EQ(s.allocated, 4 * 1024u);
  EXPECT_EQ(s.requested, 4000u);
  EXPECT_EQ(s.active_blocks, 4u);
  EXPECT_EQ(s.free_blocks, 1u);  // the segment's tail
  EXPECT_EQ(s.largest_free_block, 2 * MiB - 4 * 1024);
  // carved from one segment, one after another
  EXPECT_EQ(ptr(a, b2) - ptr(a, b1), 1024);
  EXPECT_EQ(ptr(a, b3) - ptr(a, b2), 1024);

  // A freed block is reused: no new segment, the same memory.
  char* p2 = ptr(a, b2);
  a.free(b2);
  auto b5 = a.malloc(900, "e");
  EXPECT_EQ(ptr(a, b5), p2);
  EXPECT_EQ(back.st->calls, 1u);

  // Merging. The segment is [b1][b5][b3][b4][tail]; free b1 and b3: no neighbour free.
  a.free(b1);
  a.free(b3);
  s = a.stats();
  EXPECT_EQ(s.free_blocks, 3u);  // [b1], [b3], [tail]
  a.free(b5);                    // merges with b1 before and b3 after
  s = a.stats();
  EXPECT_EQ(s.free_blocks, 2u);  // [b1 b5 b3], [tail]
  EXPECT_EQ(s.largest_free_block, 2 * MiB - 4 * 1024);
  a.free(b4);  // merges with both neighbours: one block, the whole segment
  s = a.stats();
  EXPECT_EQ(s.free_blocks, 1u);
  EXPECT_EQ(s.largest_free_block, 2 * MiB);
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(s.requested, 0u);
  EXPECT_EQ(s.active_blocks, 0u);
  EXPECT_EQ(s.reserved, 2 * MiB);  // still cached
  EXPECT_EQ(s.peak_allocated, 4 * 1024u);
  expect_matches_backing(a, back);
}

TEST(CachingAllocator, SmallPoolSplitsDownTo512Bytes) {
  Backing back(64 * MiB);
  CachingAllocator a(back.source());
  auto x = a.malloc(1 * MiB, "half");
  auto y = a.malloc(1 * MiB - 512, "almost the rest");  // remainder 512 >= 512: split
  EXPECT_EQ(y.size, 1 * MiB - 512);
  auto z = a.malloc(1, "the last 512");
  EXPECT_EQ(z.size, 512u);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.allocated, 2 * MiB);
  EXPECT_EQ(s.free_blocks, 0u);
  EXPECT_EQ(s.segments, 1u);
  for (auto b : {x, y, z}) a.free(b);
  EXPECT_EQ(a.stats().largest_free_block, 2 * MiB);
}

TEST(CachingAllocator, LargeBlockWithSmallRemainderIsHandedOutWhole) {
  Backing back(64 * MiB);
  CachingAllocator a(back.source());
  // 19.5 MiB from a fresh 20 MiB segment: remainder 0.5 MiB <= 1 MiB, whole block.
  auto b = a.malloc(19 * MiB + 512 * KiB, "whole");
  EXPECT_EQ(b.size, 20 * MiB);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.allocated, 20 * MiB);
  EXPECT_EQ(s.requested, 19 * MiB + 512 * KiB);
  EXPECT_GT(s.allocated, s.requested);
  EXPECT_EQ(s.free_blocks, 0u);
  a.free(b);

  // Remainder exactly 1 MiB: still not split (PyTorch splits when > kSmallSize).
  auto c = a.malloc(19 * MiB, "remainder exactly 1 MiB");
  EXPECT_EQ(c.size, 20 * MiB);
  EXPECT_EQ(a.stats().requested, 19 * MiB);
  a.free(c);

  // Remainder 1 MiB + 512: split.
  auto d = a.malloc(19 * MiB - 512, "remainder just over 1 MiB");
  EXPECT_EQ(d.size, 19 * MiB - 512);
  s = a.stats();
  EXPECT_EQ(s.allocated, 19 * MiB - 512);
  EXPECT_EQ(s.free_blocks, 1u);
  EXPECT_EQ(s.largest_free_block, 1 * MiB + 512);
  EXPECT_EQ(back.st->calls, 1u);  // one segment throughout
  a.free(d);
}

TEST(CachingAllocator, BestFitPicksTheSmallestFittingBlock) {
  Backing back(64 * MiB);
  CachingAllocator a(back.source());
  // One 20 MiB segment: [3 A][2 s1][5 B][2 s2][4 C][4 s3]
  auto A = a.malloc(3 * MiB, "A");
  auto s1 = a.malloc(2 * MiB, "s1");
  auto B = a.malloc(5 * MiB, "B");
  auto s2 = a.malloc(2 * MiB, "s2");
  auto C = a.malloc(4 * MiB, "C");
  auto s3 = a.malloc(4 * MiB, "s3");
  ASSERT_EQ(a.stats().segments, 1u);
  ASSERT_EQ(a.stats().free_blocks, 0u);
  char* pA = ptr(a, A);
  char* pB = ptr(a, B);
  char* pC = ptr(a, C);
  a.free(A);
  a.free(B);
  a.free(C);
  ASSERT_EQ(a.stats().free_blocks, 3u);

  // 3.5 MiB fits B (5) and C (4): the smallest, C, handed out whole (0.5 MiB left).
  auto D = a.malloc(3 * MiB + 512 * KiB, "D");
  EXPECT_EQ(ptr(a, D), pC);
  EXPECT_EQ(D.size, 4 * MiB);
  // 3 MiB fits A exactly.
  auto E = a.malloc(3 * MiB, "E");
  EXPECT_EQ(ptr(a, E), pA);
  // 2 MiB: only B is left; split (3 MiB remainder > 1 MiB).
  auto F = a.malloc(2 * MiB, "F");
  EXPECT_EQ(ptr(a, F), pB);
  EXPECT_EQ(F.size, 2 * MiB);
  EXPECT_EQ(a.stats().largest_free_block, 3 * MiB);
  EXPECT_EQ(back.st->calls, 1u);
  for (auto b : {D, E, F, s1, s2, s3}) a.free(b);
  EXPECT_EQ(a.stats().free_blocks, 1u);
}

TEST(CachingAllocator, BestFitTiesGoToTheLowerAddress) {
  Backing back(64 * MiB);
  CachingAllocator a(back.source());
  std::vector<CachingAllocator::Block> bs;
  for (int i = 0; i < 6; ++i) bs.push_back(a.malloc(4096, "x"));
  // Free 3, 1 and 5: two equal 4 KiB holes (1 and 3); 5 merges with the segment's tail.
  a.free(bs[3]);
  a.free(bs[1]);
  a.free(bs[5]);
  auto y = a.malloc(4096, "y");
  EXPECT_EQ(ptr(a, y), ptr(a, bs[0]) + 4096);  // bs[1]'s place, the lowest address
  auto z = a.malloc(4096, "z");
  EXPECT_EQ(ptr(a, z), ptr(a, bs[0]) + 3 * 4096);  // then bs[3]'s
  for (auto b : {bs[0], bs[2], bs[4], y, z}) a.free(b);
}

TEST(CachingAllocator, FragmentationFailsAlthoughTheFreeTotalWouldFit) {
  Backing back(60 * MiB);
  CachingAllocator a(back.source());
  // Three 20 MiB segments, each [6 a][6 b][6 c][2 free].
  std::vector<CachingAllocator::Block> middle, kept;
  for (int seg = 0; seg < 3; ++seg) {
    kept.push_back(a.malloc(6 * MiB, "activation"));
    middle.push_back(a.malloc(6 * MiB, "activation"));
    kept.push_back(a.malloc(6 * MiB, "activation"));
  }
  ASSERT_EQ(a.stats().segments, 3u);
  ASSERT_EQ(a.stats().reserved, 60 * MiB);
  for (auto b : middle) a.free(b);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.allocated, 36 * MiB);
  EXPECT_EQ(s.reserved - s.allocated, 24 * MiB);  // 3 x (6 + 2), in 6 pieces
  EXPECT_EQ(s.largest_free_block, 6 * MiB);
  EXPECT_EQ(s.free_blocks, 6u);

  // 8 MiB: less than the 24 MiB reserved but unallocated, yet no block fits
  // and the backing has no room for a fourth segment.
  try {
    a.malloc(8 * MiB, "grad bucket");
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("Tried to allocate 8.0 MiB (grad bucket)"), std::string::npos) << m;
    EXPECT_NE(m.find("Reserved by the allocator: 60.0 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("allocated: 36.0 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("reserved but unallocated: 24.0 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("largest free block: 6.0 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("the backing refused a new segment of 20.0 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("this is fragmentation"), std::string::npos) << m;
    EXPECT_NE(m.find("expandable_segments:True"), std::string::npos) << m;
    EXPECT_NE(m.find("max_split_size_mb"), std::string::npos) << m;
  }
  s = a.stats();
  EXPECT_EQ(s.alloc_retries, 1u);  // the cache was released (nothing entirely free) and the backing asked again
  EXPECT_EQ(s.ooms, 1u);
  EXPECT_EQ(back.st->refusals, 2u);
  EXPECT_EQ(s.reserved, 60 * MiB);  // nothing could be released
  EXPECT_EQ(s.allocated, 36 * MiB);
  expect_matches_backing(a, back);

  // A request larger than the unallocated total fails without the fragmentation hint.
  try {
    a.malloc(30 * MiB, "too big");
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("Tried to allocate 30.0 MiB (too big)"), std::string::npos) << m;
    EXPECT_EQ(m.find("fragmentation"), std::string::npos) << m;
  }
  EXPECT_EQ(a.stats().ooms, 2u);
  EXPECT_EQ(a.stats().alloc_retries, 2u);

  // Still usable: a 6 MiB request takes a hole.
  auto ok = a.malloc(6 * MiB, "fits a hole");
  EXPECT_EQ(a.stats().segments, 3u);
  a.free(ok);
  for (auto b : kept) a.free(b);
}

TEST(CachingAllocator, FragmentationHintWhenUnallocatedEqualsTheRequest) {
  Backing back(20 * MiB);
  CachingAllocator a(back.source());
  // One 20 MiB segment as five 4 MiB blocks; free the 2nd and 4th: 8 MiB
  // reserved but unallocated, in two 4 MiB pieces.
  std::vector<CachingAllocator::Block> bs;
  for (int i = 0; i < 5; ++i) bs.push_back(a.malloc(4 * MiB, "layer"));
  ASSERT_EQ(a.stats().segments, 1u);
  a.free(bs[1]);
  a.free(bs[3]);
  try {
    a.malloc(8 * MiB, "exactly the free total");
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("reserved but unallocated: 8.0 MiB, largest free block: 4.0 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("this is fragmentation"), std::string::npos) << m;
  }
  for (int i : {0, 2, 4}) a.free(bs[i]);
}

// A large request cannot use the small pool's blocks: free bytes held there are no fragmentation of it.
// A 512 B request takes a 2 MiB small segment; a 1.5 MiB request needs a 20 MiB large one, which a 21 MiB
// backing refuses with about 2 MiB reserved but unallocated, every byte of it in the small pool: the
// segment size is what did not fit (the hint said "this is fragmentation").
TEST(CachingAllocator, FreeBytesInTheOtherPoolAreNoFragmentation) {
  Backing back(21 * MiB);
  CachingAllocator a(back.source());
  const auto tiny = a.malloc(512, "a norm's output");
  try {
    a.malloc(3 * MiB / 2, "an activation");
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("reserved but unallocated: 2.0 MiB"), std::string::npos) << m;
    EXPECT_EQ(m.find("fragmentation"), std::string::npos) << m;
  }
  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.small_pool_free, 2 * MiB - 512);
  EXPECT_EQ(s.large_pool_free, 0u);
  a.free(tiny);
  EXPECT_EQ(a.stats().small_pool_free, 2 * MiB);
}

TEST(CachingAllocator, RetryReleasesEntirelyFreeSegmentsAndSucceeds) {
  Backing back(60 * MiB);
  CachingAllocator a(back.source());
  auto small = a.malloc(1000, "small");  // a 2 MiB small segment
  auto x = a.malloc(18 * MiB, "x");      // 18 MiB segments (>= 10 MiB: rounded to 2 MiB)
  auto y = a.malloc(18 * MiB, "y");
  auto z = a.malloc(18 * MiB, "z");
  ASSERT_EQ(a.stats().reserved, 56 * MiB);
  a.free(small);
  a.free(x);
  a.free(z);
  EXPECT_EQ(a.stats().reserved, 56 * MiB);  // cached
  EXPECT_EQ(a.stats().allocated, 18 * MiB);

  // 30 MiB: no cached block fits; 56 + 30 > 60 is refused; the three entirely
  // free segments (both pools) go back and the retry gets 30 MiB.
  auto big = a.malloc(30 * MiB, "big");
  EXPECT_EQ(big.size, 30 * MiB);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.alloc_retries, 1u);
  EXPECT_EQ(s.ooms, 0u);
  EXPECT_EQ(s.segments, 2u);
  EXPECT_EQ(s.reserved, 48 * MiB);
  EXPECT_EQ(s.peak_reserved, 56 * MiB);
  EXPECT_EQ(s.free_blocks, 0u);
  EXPECT_EQ(back.st->refusals, 1u);
  expect_matches_backing(a, back);
  a.free(big);
  a.free(y);
}

TEST(CachingAllocator, EmptyCacheReturnsOnlyEntirelyFreeSegments) {
  Backing back(256 * MiB);
  CachingAllocator a(back.source());
  auto whole = a.malloc(12 * MiB, "whole");      // a 12 MiB segment
  auto part = a.malloc(6 * MiB, "partly used");  // a 20 MiB segment, 14 MiB free in it
  auto s1 = a.malloc(4096, "small");             // a 2 MiB segment
  auto s2 = a.malloc(4096, "small");
  a.free(whole);
  a.free(s1);
  a.free(s2);
  EXPECT_EQ(a.stats().reserved, 34 * MiB);
  expect_matches_backing(a, back);

  a.empty_cache();
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.reserved, 20 * MiB);
  EXPECT_EQ(s.segments, 1u);
  EXPECT_EQ(s.free_blocks, 1u);
  EXPECT_EQ(s.largest_free_block, 14 * MiB);  // the partly used segment keeps its free part
  EXPECT_EQ(s.allocated, 6 * MiB);
  EXPECT_EQ(s.alloc_retries, 0u);  // empty_cache is not a retry
  expect_matches_backing(a, back);

  a.free(part);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, 0u);
  EXPECT_EQ(a.stats().free_blocks, 0u);
  expect_matches_backing(a, back);
  EXPECT_EQ(back.st->held, 0u);
}

TEST(CachingAllocator, MaxSplitSizeKeepsOversizeBlocksWhole) {
  // Default (unlimited): a cached 20 MiB block is split for a 2 MiB request.
  {
    Backing back(256 * MiB);
    CachingAllocator a(back.source());
    a.free(a.malloc(20 * MiB, "big"));
    auto b = a.malloc(2 * MiB, "small large");
    EXPECT_EQ(b.size, 2 * MiB);
    EXPECT_EQ(a.stats().reserved, 20 * MiB);
    EXPECT_EQ(back.st->calls, 1u);
    a.free(b);
  }
  // max_split_size 16 MiB: the cached 20 MiB block is not used for a 2 MiB
  // request (it would be split); a new 20 MiB segment is.
  CachingAllocatorConfig cfg;
  cfg.max_split_size = 16 * MiB;
  {
    Backing back(256 * MiB);
    CachingAllocator a(back.source(), cfg);
    a.free(a.malloc(20 * MiB, "big"));
    auto b = a.malloc(2 * MiB, "small large");
    EXPECT_EQ(b.size, 2 * MiB);  // the new segment is split as usual (2 < 16, 18 MiB left)
    EXPECT_EQ(a.stats().reserved, 40 * MiB);
    EXPECT_EQ(back.st->calls, 2u);
    EXPECT_EQ(a.stats().largest_free_block, 20 * MiB);
    expect_matches_backing(a, back);
    a.free(b);
  }
  // A request at or above max_split_size takes a cached block within
  // kLargeBuffer of it, whole (not split).
  {
    Backing back(256 * MiB);
    CachingAllocator a(back.source(), cfg);
    a.free(a.malloc(30 * MiB, "big"));
    auto c = a.malloc(17 * MiB, "oversize");  // 30 < 17 + 20
    EXPECT_EQ(c.size, 30 * MiB);
    AllocatorStats s = a.stats();
    EXPECT_EQ(s.allocated, 30 * MiB);
    EXPECT_EQ(s.requested, 17 * MiB);
    EXPECT_EQ(s.free_blocks, 0u);
    EXPECT_EQ(back.st->calls, 1u);
    a.free(c);
  }
  // ...but not a cached block of size + 20 MiB or more: 38 MiB for 18 MiB.
  {
    Backing back(256 * MiB);
    CachingAllocator a(back.source(), cfg);
    a.free(a.malloc(38 * MiB, "huge"));
    auto e = a.malloc(18 * MiB, "oversize, far smaller");  // 38 >= 18 + 20: a new segment
    EXPECT_EQ(e.size, 18 * MiB);
    EXPECT_EQ(a.stats().reserved, 56 * MiB);
    EXPECT_EQ(back.st->calls, 2u);
    a.free(e);
  }
  // Without max_split_size the same 18 MiB request splits the 40 MiB block.
  {
    Backing back(256 * MiB);
    CachingAllocator a(back.source());
    a.free(a.malloc(40 * MiB, "huge"));
    auto e = a.malloc(18 * MiB, "split");
    EXPECT_EQ(e.size, 18 * MiB);
    EXPECT_EQ(a.stats().reserved, 40 * MiB);
    EXPECT_EQ(a.stats().largest_free_block, 22 * MiB);
    a.free(e);
  }
}

// A fixed pseudo-random sequence of mallocs and frees (some refused by the
// backing): live blocks never overlap and keep what was written into them,
// the byte counts add up, and the backing's count matches throughout.
TEST(CachingAllocator, RandomSequenceKeepsTheInvariants) {
  Backing back(96 * MiB);
  CachingAllocator a(back.source());
  std::mt19937_64 rng(12345);
  struct Live {
    CachingAllocator::Block b;
    std::size_t bytes;
    unsigned char tag;
  };
  std::vector<Live> live;
  const std::size_t sizes[] = {1, 700, 4096, 100 * KiB, 1 * MiB, 1 * MiB + 1, 3 * MiB, 9 * MiB, 12 * MiB, 25 * MiB};
  auto stamp = [&](const Live& l, bool check) {
    unsigned char* p = static_cast<unsigned char*>(a.data(l.b));
    const std::size_t n = std::min<std::size_t>(l.bytes, 64);
    for (std::size_t i = 0; i < n; ++i) {
      if (check) {
        ASSERT_EQ(p[i], l.tag);
        ASSERT_EQ(p[l.bytes - 1 - i], l.tag);
      } else {
        p[i] = p[l.bytes - 1 - i] = l.tag;
      }
    }
  };
  std::size_t ooms = 0;
  for (int step = 0; step < 3000; ++step) {
    if (live.empty() || rng() % 100 < 55) {
      const std::size_t bytes = sizes[rng() % std::size(sizes)] + rng() % 2048;
      try {
        Live l{a.malloc(bytes, "random"), bytes, static_cast<unsigned char>(rng())};
        EXPECT_GE(l.b.size, CachingAllocator::round_size(bytes));
        stamp(l, false);
        live.push_back(l);
      } catch (const OutOfMemory&) {
        ++ooms;
      }
    } else {
      const std::size_t i = rng() % live.size();
      stamp(live[i], true);
      a.free(live[i].b);
      live[i] = live.back();
      live.pop_back();
    }
    if (step % 500 == 0) a.empty_cache();
    std::size_t allocated = 0, requested = 0;
    std::vector<std::pair<char*, std::size_t>> spans;
    for (const Live& l : live) {
      allocated += l.b.size;
      requested += l.bytes;
      spans.emplace_back(ptr(a, l.b), l.b.size);
    }
    const AllocatorStats s = a.stats();
    ASSERT_EQ(s.allocated, allocated);
    ASSERT_EQ(s.requested, requested);
    ASSERT_EQ(s.active_blocks, live.size());
    ASSERT_LE(s.allocated, s.reserved);
    ASSERT_EQ(s.reserved, back.st->held);
    ASSERT_EQ(s.ooms, ooms);
    std::sort(spans.begin(), spans.end());
    for (std::size_t i = 1; i < spans.size(); ++i)
      ASSERT_LE(spans[i - 1].first + spans[i - 1].second, spans[i].first) << "overlapping blocks";
  }
  EXPECT_GT(ooms, 0u);  // the sequence reaches the capacity
  for (const Live& l : live) {
    stamp(l, true);
    a.free(l.b);
  }
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.free_blocks, s.segments);  // every segment merged back into one block
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, 0u);
  EXPECT_EQ(back.st->held, 0u);
}

TEST(CachingAllocator, InvalidAndDoubleFreeThrowLogicError) {
  Backing back(64 * MiB);
  CachingAllocator a(back.source());
  auto b = a.malloc(1000, "b");
  EXPECT_THROW(a.free(CachingAllocator::Block{12345, 1024}), std::logic_error);
  EXPECT_THROW(a.free(CachingAllocator::Block{}), std::logic_error);
  EXPECT_THROW(a.free(CachingAllocator::Block{b.id, b.size + 512}), std::logic_error);
  EXPECT_EQ(a.stats().active_blocks, 1u);
  a.free(b);
  EXPECT_THROW(a.free(b), std::logic_error);
  EXPECT_THROW((void)a.data(b), std::logic_error);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.allocated, 0u);
  EXPECT_EQ(s.active_blocks, 0u);
  EXPECT_EQ(s.free_blocks, 1u);
  // The id is not reused: the old handle stays invalid after a new malloc in its place.
  auto c = a.malloc(1000, "c");
  EXPECT_NE(c.id, b.id);
  EXPECT_THROW(a.free(b), std::logic_error);
  a.free(c);
}

TEST(CachingAllocator, DestructionWithLiveBlocksReturnsEverySegment) {
  Backing back(256 * MiB);
  {
    CachingAllocator a(back.source());
    a.malloc(1000, "leaked small");
    a.malloc(5 * MiB, "leaked large");
    a.malloc(30 * MiB, "leaked huge");
    a.free(a.malloc(16 * MiB, "cached"));  // does not fit the 15 MiB left in the 20 MiB segment
    EXPECT_EQ(back.st->segments, 4u);
    EXPECT_EQ(back.st->held, 2 * MiB + 20 * MiB + 30 * MiB + 16 * MiB);
  }
  EXPECT_EQ(back.st->held, 0u);
  EXPECT_EQ(back.st->segments, 0u);
}

TEST(CachingAllocator, OtherBackingErrorsPropagate) {
  CachingAllocator a([](std::size_t) -> std::shared_ptr<void> { throw std::runtime_error("driver gone"); });
  EXPECT_THROW(a.malloc(1000, "x"), std::runtime_error);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.reserved, 0u);
  EXPECT_EQ(s.ooms, 0u);
  EXPECT_EQ(s.alloc_retries, 0u);
}

TEST(CachingAllocator, ARequestTooLargeToDescribeIsOutOfMemory) {
  Backing back(64 * MiB);
  CachingAllocator a(back.source());
  EXPECT_THROW(a.malloc(SIZE_MAX, "absurd"), OutOfMemory);
  EXPECT_EQ(a.stats().ooms, 1u);
  EXPECT_EQ(back.st->calls, 0u);
}

}  // namespace
}  // namespace sb
