// The lengths file reader, as `-p lengths=@FILE` uses it: the bytes parsed
// (parse_length_file_text, behind parse_lengths("@FILE")), then lengths drawn
// from the spec as the packing scenario does.
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint8_t

#include "workloads/lengths.hpp"  // parse_length_file_text, generate_lengths
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string file = "fuzz-lengths.csv";
  sb::fuzz::usage_errors_only(file, [&] {
    const auto spec = sb::packing::parse_length_file_text(std::string(sb::fuzz::as_text(data, size)), file);
    const auto some = sb::packing::generate_lengths(spec, 256, 7, 4 * 2048);
    sb::fuzz::require(some.size() == 256, "generate_lengths gives the count asked for");
    for (auto len : some) sb::fuzz::require(len >= 1 && len <= 4 * 2048, "lengths are clipped to [1, cap]");
    // sequences=0: every length of the file, as the scenario draws them. A
    // histogram's counts may sum to 2^31 sequences (8 GiB): the scenario
    // reserves that memory first (an oom point), so here only small sums.
    std::int64_t total = std::int64_t(spec.lengths.size());
    for (const auto& c : spec.histogram) total += c.count;
    if (total <= (std::int64_t(1) << 20)) {
      const auto all = sb::packing::generate_lengths(spec, 0, 7, 4 * 2048);
      sb::fuzz::require(std::int64_t(all.size()) == total, "sequences=0 gives every sequence of the file");
    }
  });
  return 0;
}
