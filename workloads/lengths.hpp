// Sequence-length specs of the packing scenario: the grammar, parsing and
// seeded generation. Lengths feed the planners in packing.hpp.
#pragma once

#include <cstdint>   // std::int32_t, std::int64_t, std::uint64_t
#include <optional>  // std::optional
#include <string>    // std::string
#include <tuple>     // std::tuple: DatasetLengths' key
#include <vector>    // std::vector

#include "harness/host_memory.hpp"  // HostReservation

namespace sb::packing {

// One row of a CSV histogram: `count` sequences of `length` tokens.
struct LengthCount {
  std::int32_t length = 0;
  std::int64_t count = 0;
};

// A parsed length spec. Grammar:
//   fixed:N                every sequence N tokens (N >= 1)
//   uniform:LO,HI          integers uniform in [LO, HI], 1 <= LO <= HI
//   lognormal:MEAN,SIGMA   MEAN = mean length in tokens (> 0), SIGMA = sigma of
//                          the underlying normal (>= 0): mu = ln(MEAN) - SIGMA^2/2
//   @FILE                  one length per line, or a CSV histogram "length,count"
//                          with an optional header line; blank lines and '#'
//                          comments allowed. The file is read by parse_lengths.
struct LengthSpec {
  enum class Kind { fixed, uniform, lognormal, file_lengths, file_histogram };
  Kind kind = Kind::fixed;
  std::string text;                    // the spec as given
  std::int64_t lo = 0, hi = 0;         // fixed: lo == hi == N; uniform: [lo, hi]
  double mean = 0, sigma = 0;          // lognormal
  std::vector<std::int32_t> lengths;   // file_lengths, in file order
  std::vector<LengthCount> histogram;  // file_histogram, in file order
};

// Throws sb::UsageError naming the valid forms; for files, the path and the
// 1-based line number of the bad line (or that the file cannot be read).
LengthSpec parse_lengths(const std::string& spec);
// What parse_lengths("@" + path) does with the file's contents, once read
// (the fuzz target calls it on bytes in memory).
LengthSpec parse_length_file_text(std::string text, const std::string& path);

// n lengths from the spec, a pure function of (spec, n, seed): runs repeat.
// Values are clipped to [1, cap] (cap <= 0: no upper clip). The scenario
// passes cap = 4 * max_len so that long sequences reach the planner and its
// Overflow rule decides, without a heavy tail dominating the run.
//   file_lengths:   the file's lengths, cycled/truncated to n (all when n == 0)
//   file_histogram: n draws weighted by count; n == 0 expands the counts
//                   exactly, then shuffles with the seed (a dataset is
//                   consumed in random order, and pad-longest would look
//                   unrealistically good on length-sorted input)
//   fixed/uniform/lognormal: n == 0 gives an empty vector.
// over_cap (when given) counts the values that were above cap and were clipped.
std::vector<std::int32_t> generate_lengths(const LengthSpec& spec, std::int64_t n,
                                           std::uint64_t seed, std::int32_t cap = 0,
                                           std::int64_t* over_cap = nullptr);

// A scenario's dataset of lengths, made once per (lengths, sequences,
// max_len): the points of a sweep train the same dataset (seed 1234, clipped
// to 4 x max_len), and an @FILE of millions of lines is read once, not once a
// point. Its bytes are held in the host-memory budget (bytes_per_sequence
// each: the lengths, and whatever the scenario keeps per sequence beside
// them), refused up front (oom) rather than killed half-way under a limit.
class DatasetLengths {
 public:
  DatasetLengths(std::string owner, std::uint64_t bytes_per_sequence)
      : owner_(std::move(owner)), bytes_per_sequence_(bytes_per_sequence) {}
  const std::vector<std::int32_t>& get(const std::string& text, std::int64_t sequences, std::int32_t max_len);
  // Of the lengths get() returned last: how many were over 4 x max_len and clipped to it.
  std::int64_t clipped() const { return clipped_; }

 private:
  std::string owner_;
  std::uint64_t bytes_per_sequence_;
  std::optional<std::vector<std::int32_t>> lengths_;
  HostReservation memory_;
  std::tuple<std::string, std::int64_t, std::int32_t> key_;
  std::int64_t clipped_ = 0;
};

}  // namespace sb::packing
