#include "scenarios/memory/pool_replay.hpp"

#include <utility>  // std::exchange

#include "harness/errors.hpp"  // OutOfMemory

namespace sb::memory {

PoolRun replay_on_pool(StreamPool& pool, const std::vector<AllocOp>& ops, std::size_t slots) {
  PoolRun r;
  r.impl = pool.impl();
  std::vector<void*> ptrs(slots, nullptr);
  int step = -1;
  try {
    for (const AllocOp& op : ops) {
      if (op.kind == AllocOp::alloc) ptrs.at(op.slot) = pool.malloc(std::size_t(op.bytes));
      if (op.kind == AllocOp::free) pool.free(std::exchange(ptrs.at(op.slot), nullptr));
      if (op.kind == AllocOp::step_begin) step = int(op.slot);
    }
  } catch (const OutOfMemory& ex) {
    r.ok = false;
    r.failed_step = step;
    r.error = ex.what();
    for (void*& q : ptrs)
      if (q) pool.free(std::exchange(q, nullptr));
  }
  r.reserved_high = pool.reserved_high();
  r.used_high = pool.used_high();
  return r;
}

std::optional<nlohmann::ordered_json> compare_stream_pool(
    const std::function<std::unique_ptr<StreamPool>(std::size_t)>& make, const std::vector<AllocOp>& ops,
    std::size_t slots, std::uint64_t peak_need, std::uint64_t caching_needed, Point& p) {
  using json = nlohmann::ordered_json;
  auto pool = make(0);
  if (!pool) return std::nullopt;
  const PoolRun free_pool = replay_on_pool(*pool, ops, slots);
  pool.reset();  // destroyed (its memory back to the device) before the capped one is made
  json a{{"impl", free_pool.impl}, {"ran", free_pool.ok}};
  if (!free_pool.ok) {
    a["error"] = free_pool.error;
    a["failed_step"] = free_pool.failed_step;
    return a;
  }
  a["reserved_high_bytes"] = free_pool.reserved_high;
  a["used_high_bytes"] = free_pool.used_high;
  if (peak_need > 0)
    p.add({"async_pool_overhead_pct", 100.0 * (double(free_pool.reserved_high) / double(peak_need) - 1.0), "%",
           Direction::lower, std::nullopt,
           "the stream-ordered pool's reserved bytes at its peak (cudaMemPoolAttrReservedMemHigh), unconstrained, "
           "above the steps' peak need: beside frag_overhead_pct"});
  if (auto capped = make(std::size_t(caching_needed))) {
    const PoolRun at = replay_on_pool(*capped, ops, slots);
    a["at_caching_needed"] = json{{"capacity", caching_needed}, {"ran", at.ok},
                                  {"failed_step", at.failed_step}, {"error", at.error},
                                  {"reserved_high_bytes", at.reserved_high},
                                  // the pool's maxSize may be rounded up to the driver's granularity: a run
                                  // that held more than the cap did not run under it
                                  {"cap_exceeded", at.reserved_high > caching_needed}};
  }
  return a;
}

}  // namespace sb::memory
