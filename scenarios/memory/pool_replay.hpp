// The memory scenario's fragmentation probe replays one sequence of mallocs and frees (the steps of a
// training loop at varying lengths) through two allocators: scenarios/memory/caching_allocator (PyTorch's
// caching allocator's rules) and, on cuda, the device's stream-ordered pool (cudaMallocAsync's). This
// is the second replay and the comparison made from it, apart from any device so a test can run it
// on a pool of its own: the cuda pool's attributes are the device's, the logic around them is here.
#pragma once

#include <cstddef>     // std::size_t
#include <cstdint>     // std::uint64_t
#include <functional>  // std::function
#include <memory>      // std::unique_ptr
#include <optional>    // std::optional
#include <string>      // std::string
#include <vector>      // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/device.hpp"  // StreamPool
#include "harness/result.hpp"  // Point

namespace sb::memory {

// One event of the sequence: an allocation into a slot, its free, or a mark the caching replay reads
// (a stats note, the end of a forward, a step's bounds: step_begin's and step_end's slot is the step).
struct AllocOp {
  enum Kind { alloc, free, note, forward_end, step_begin, step_end } kind;
  std::size_t slot = 0;
  std::uint64_t bytes = 0;
  const char* what = "";
};

struct PoolRun {
  bool ok = true;
  int failed_step = -1;  // the step whose allocation failed (-1: before the first step)
  std::uint64_t reserved_high = 0, used_high = 0;  // the pool's own high-water marks after the run
  std::string error, impl;
};

// The sequence through `pool`: every alloc and free in order. An OutOfMemory ends the run (the blocks
// still held are freed to the pool) and is its status; any other error propagates.
PoolRun replay_on_pool(StreamPool& pool, const std::vector<AllocOp>& ops, std::size_t slots);

// The comparison: the sequence through make(0) (the pool unconstrained), then, if that ran, through
// make(caching_needed) (capped at what the caching allocator needed). Adds async_pool_overhead_pct to
// `p` (the unconstrained pool's reserved high-water mark over `peak_need`) and returns what goes under
// info.fragmentation.async_pool; nullopt where make(0) gives no pool (a device without one).
std::optional<nlohmann::ordered_json> compare_stream_pool(
    const std::function<std::unique_ptr<StreamPool>(std::size_t)>& make, const std::vector<AllocOp>& ops,
    std::size_t slots, std::uint64_t peak_need, std::uint64_t caching_needed, Point& p);

}  // namespace sb::memory
