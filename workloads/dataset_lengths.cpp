// DatasetLengths (lengths.hpp): kept out of lengths.cpp, which the fuzz
// targets link without the host-memory budget.
#include <fmt/format.h>  // fmt::format

#include "harness/host_memory.hpp"       // reserve_host_memory
#include "workloads/lengths.hpp"

namespace sb::packing {

const std::vector<std::int32_t>& DatasetLengths::get(const std::string& text, std::int64_t sequences,
                                                     std::int32_t max_len) {
  auto key = std::make_tuple(text, sequences, max_len);
  if (!lengths_ || key_ != key) {
    const LengthSpec spec = parse_lengths(text);
    lengths_.reset();
    memory_ = {};
    // the count asked, else the file's own
    std::uint64_t count = std::uint64_t(sequences);
    if (sequences == 0 && spec.kind == LengthSpec::Kind::file_lengths) count = spec.lengths.size();
    if (sequences == 0 && spec.kind == LengthSpec::Kind::file_histogram)
      for (const auto& hc : spec.histogram) count += std::uint64_t(hc.count);
    memory_ = reserve_host_memory(count * bytes_per_sequence_,
                                  fmt::format("{}: the lengths of {} sequences", owner_, count));
    lengths_ = generate_lengths(spec, sequences, 1234, 4 * max_len, &clipped_);
    key_ = std::move(key);
  }
  return *lengths_;
}

}  // namespace sb::packing
