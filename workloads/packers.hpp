// Batching and packing planners of the `packing` scenario: how many tokens a
// device computes to train on a given set of sequence lengths, for
// pad-to-max, pad-to-longest, length bucketing, first/best-fit-decreasing
// packing (per-sequence, varlen attention) and plain concatenation.
//
// A plan is pure host arithmetic; the scenario then runs its rows on a device
// to turn the computed-token counts into tokens/s. Definitions (docs/DESIGN.md):
//   padding fraction   = 1 - real tokens / computed tokens
//   packing efficiency = real tokens / (rows x max_len)
//
// Sequences longer than max_len follow one rule for every strategy, so real
// tokens match across strategies: Overflow::split cuts them into max_len
// pieces (continuing at an offset), Overflow::drop leaves them out.
#pragma once

#include <cstdint>      // std::int32_t, std::int64_t, std::uint64_t
#include <memory>       // std::shared_ptr
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "workloads/lengths.hpp"  // LengthCount, LengthSpec, generate_lengths
#include "harness/names.hpp"  // NameTable: to_string, parse and choices from one table

namespace sb::packing {

enum class Strategy { pad_max, pad_longest, bucket, pack_ffd, pack_bfd, pack_hist, concat };
enum class Overflow { split, drop };

inline constexpr NameTable<Strategy, 7> kStrategyNames{{{{Strategy::pad_max, "pad-max"}, {Strategy::pad_longest, "pad-longest"}, {Strategy::bucket, "bucket"}, {Strategy::pack_ffd, "pack-ffd"}, {Strategy::pack_bfd, "pack-bfd"}, {Strategy::pack_hist, "pack-hist"}, {Strategy::concat, "concat"}}}};
inline std::string_view to_string(Strategy v) { return kStrategyNames.name(v); }
inline std::optional<Strategy> parse_strategy(std::string_view s) { return kStrategyNames.parse(s); }
inline constexpr NameTable<Overflow, 2> kOverflowNames{{{{Overflow::split, "split"}, {Overflow::drop, "drop"}}}};
inline std::string_view to_string(Overflow v) { return kOverflowNames.name(v); }
inline std::optional<Overflow> parse_overflow(std::string_view s) { return kOverflowNames.parse(s); }

// A piece of sequence `seq` (index into the planner's input), tokens
// [offset, offset + length) of it, placed in a row.
struct Segment {
  std::int64_t seq = 0;
  std::int32_t offset = 0, length = 0;
};

// One row of device work. `used` = sum of segment lengths <= max_len.
struct Row {
  std::vector<Segment> segments;
  std::int32_t used = 0;
};

struct CountPlan;

struct Plan {
  Strategy strategy = Strategy::pad_max;
  std::int32_t max_len = 0;
  // Tokens computed per row when every row computes the same (pad-max,
  // packing, concat: max_len); 0 for pad-longest and bucket, whose rows
  // compute their batch's longest: see row_computed.
  std::int32_t row_len = 0;
  // Every row, for every strategy but pack-hist, whose rows are made on
  // demand from `packed` (rows and row_computed stay empty): read rows
  // through row_count(), row(r) and computed(r), which serve both.
  std::vector<Row> rows;
  std::vector<std::int32_t> row_computed;  // computed tokens per row
  std::shared_ptr<const CountPlan> packed; // pack-hist: pack shapes x repeat counts
  std::int64_t real_tokens = 0;            // tokens placed in rows
  std::int64_t computed_tokens = 0;        // sum of computed(r)
  std::int64_t dropped_tokens = 0;         // Overflow::drop: tokens of sequences left out
  // Sequences placed in more than one segment: those longer than max_len
  // under split and, for concat, also those cut at a row boundary.
  std::int64_t split_sequences = 0;
  double seconds = 0;                      // planner wall time (steady_clock)
  bool cross_contamination = false;        // concat only: examples share rows with no boundary

  double padding_fraction() const;  // 1 - real / computed (0 for an empty plan)
  double efficiency() const;        // real / (rows * max_len) (0 for an empty plan)
  std::int64_t row_count() const;
  // Row r, a copy (pack-hist makes it), and the tokens it computes; both
  // throw std::out_of_range outside 0 <= r < row_count().
  Row row(std::int64_t r) const;
  std::int32_t computed(std::int64_t r) const;
};

// Plans `lengths` (each >= 0; 0-length sequences place nothing) for a strategy:
//   pad-max      one piece per row, every row computes max_len.           O(n)
//   pad-longest  rows_per_batch pieces per batch in input order; each row
//                computes the longest of its batch.                      O(n)
//   bucket       within windows of bucket_window * rows_per_batch pieces,
//                sort by length, then pad to the longest of each batch.  O(n log w)
//   pack-ffd     first-fit decreasing into max_len rows.                 O(n log rows)
//   pack-bfd     best-fit decreasing into max_len rows.                  O(n log64 max_len)
//   pack-hist    pack-bfd's rows, planned on the length classes' counts
//                (pack_counts below); rows made on demand.               O(n + max_len + moves)
//   concat       all tokens back to back in input order, cut every
//                max_len; the last row is padded.                        O(n)
// pad_multiple: pad-longest's and bucket's batch length rounded up to a
// multiple of it, at most max_len (a collator's pad_to_multiple_of: Axolotl's
// trainer sets 64; 1 pads to the longest exactly).
// Throws sb::UsageError when max_len, rows_per_batch, bucket_window or
// pad_multiple < 1, or a length is negative.
Plan plan(const std::vector<std::int32_t>& lengths, Strategy strategy, std::int32_t max_len,
          std::int32_t rows_per_batch, std::int32_t bucket_window, Overflow overflow, std::int32_t pad_multiple = 1);

// pack-hist straight from a histogram, never expanding it: 16M sequences
// cost about what their distinct lengths cost. Sequence i of the result is
// the i-th of the histogram read in order, each entry repeated `count` times
// (entry 0's sequences are 0..count0-1, entry 1's follow, ...).
Plan plan_histogram(const std::vector<LengthCount>& histogram, std::int32_t max_len, Overflow overflow);

// cu_seqlens of one packed row: 0, l0, l0+l1, ..., used (FlashAttention's
// varlen layout, one entry per segment boundary).
std::vector<std::int32_t> cu_seqlens(const Row& row);

// Best-fit decreasing over length classes with counts (the way Graphcore's
// SPFHP/LPFHP work on histograms): classes from the longest down; open rows
// grouped by identical contents, indexed by remaining capacity; a class's
// count goes into the best-fitting group in bulk and whole groups move at
// once. It makes the same rows as item-by-item pack-bfd (plan(..., pack_bfd,
// ...) on the expanded lengths): the same row count, and the same multiset of
// row contents, since it takes equal-capacity rows in pack-bfd's order.
struct PackGroup {
  std::int64_t rows = 0;               // identical rows of this pattern
  std::vector<LengthCount> pattern;    // what one row holds, longest first
  std::int32_t used = 0;               // tokens per row
};
namespace detail { struct RowIndex; }
struct CountPlan {
  std::int32_t max_len = 0;
  std::vector<PackGroup> groups;       // rows in this order: group 0's, then group 1's, ...
  std::int64_t rows = 0, sequences = 0, real_tokens = 0, dropped_tokens = 0, split_sequences = 0;
  double seconds = 0;
  double efficiency() const;  // real / (rows * max_len)
  // Row r (0 <= r < rows) with its segments, longest first: which sequence,
  // which tokens. O(log groups + segments), plus a binary search per segment
  // over the input's entries of that length for a histogram input.
  Row row(std::int64_t r) const;
  std::shared_ptr<const detail::RowIndex> index;  // what row() reads
};
// Sequence numbering as plan_histogram. Throws sb::UsageError for max_len < 1,
// a negative length or count, or a histogram of more than 2^62 tokens.
CountPlan pack_counts(const std::vector<LengthCount>& histogram, std::int32_t max_len,
                      Overflow overflow);

}  // namespace sb::packing
