#include "scenarios/packing/packers.hpp"

#include <algorithm>     // std::max, std::min, std::stable_sort
#include <bit>           // std::countr_zero
#include <chrono>        // std::chrono::steady_clock
#include <limits>        // std::numeric_limits
#include <utility>       // std::exchange, std::move

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // sb::UsageError

namespace sb::packing {

namespace {

using Clock = std::chrono::steady_clock;

// ---- a bitset over 0..n-1 with summary levels: smallest set bit >= i in
// O(log64 n) word operations (3 levels cover 262144 capacities) ------------

class LevelBits {
 public:
  explicit LevelBits(std::size_t n) {
    std::size_t words = n;
    do {
      words = (words + 63) / 64;
      levels_.emplace_back(words, 0);
    } while (words > 1);
  }
  void set(std::size_t i) {
    for (auto& level : levels_) {
      level[i >> 6] |= std::uint64_t(1) << (i & 63);
      i >>= 6;
    }
  }
  void reset(std::size_t i) {
    for (auto& level : levels_) {
      level[i >> 6] &= ~(std::uint64_t(1) << (i & 63));
      if (level[i >> 6] != 0) return;  // the summary bit above stays set
      i >>= 6;
    }
  }
  // Smallest set index >= i, or -1.
  std::int64_t find_ge(std::size_t i) const {
    std::size_t lvl = 0;
    for (;; ++lvl) {  // climb until a word holds a set bit at or after i
      if (lvl == levels_.size()) return -1;
      const std::size_t w = i >> 6;
      if (w < levels_[lvl].size()) {
        const std::uint64_t bits = levels_[lvl][w] & (~std::uint64_t(0) << (i & 63));
        if (bits) {
          i = (w << 6) | std::size_t(std::countr_zero(bits));
          break;
        }
      }
      i = w + 1;  // the next word at this level is bit w+1 one level up
    }
    while (lvl-- > 0) i = (i << 6) | std::size_t(std::countr_zero(levels_[lvl][i]));
    return std::int64_t(i);
  }

 private:
  std::vector<std::vector<std::uint64_t>> levels_;  // [0] is the finest
};

// ---- planners ----------------------------------------------------------------

// Applies the Overflow rule: pieces of at most max_len tokens, in input order.
std::vector<Segment> make_pieces(const std::vector<std::int32_t>& lengths, std::int32_t max_len,
                                 Overflow overflow, Plan& p) {
  std::vector<Segment> pieces;
  pieces.reserve(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const std::int32_t len = lengths[i];
    if (len <= max_len) {
      if (len > 0) pieces.push_back({std::int64_t(i), 0, len});
    } else if (overflow == Overflow::drop) {
      p.dropped_tokens += len;
    } else {
      ++p.split_sequences;
      for (std::int32_t off = 0; off < len; off += std::min(max_len, len - off))
        pieces.push_back({std::int64_t(i), off, std::min(max_len, len - off)});
    }
  }
  return pieces;
}

// Consecutive groups of rows_per_batch pieces, each row padded to the longest
// of its group (pad-longest; bucket after sorting its windows). O(n).
void pad_batches(const std::vector<Segment>& pieces, std::int32_t rows_per_batch, Plan& p) {
  p.rows.resize(pieces.size());
  p.row_computed.resize(pieces.size());
  for (std::size_t b = 0; b < pieces.size(); b += std::size_t(rows_per_batch)) {
    const std::size_t e = std::min(pieces.size(), b + std::size_t(rows_per_batch));
    std::int32_t longest = 0;
    for (std::size_t i = b; i < e; ++i) longest = std::max(longest, pieces[i].length);
    for (std::size_t i = b; i < e; ++i) {
      p.rows[i] = Row{{pieces[i]}, pieces[i].length};
      p.row_computed[i] = longest;
    }
  }
}

// Pieces by decreasing length, ties in input order: a counting sort,
// O(n + max_len), since every piece is <= max_len. The packers then read
// lengths sequentially: an index permutation would cost a cache miss per
// piece, which measured as half of first-fit's time at 1M pieces.
std::vector<Segment> sort_decreasing(const std::vector<Segment>& pieces, std::int32_t max_len) {
  std::vector<std::size_t> start(std::size_t(max_len) + 1, 0);
  for (const auto& s : pieces) ++start[std::size_t(s.length)];
  std::size_t at = 0;
  for (std::size_t len = std::size_t(max_len); len >= 1; --len) at += std::exchange(start[len], at);
  std::vector<Segment> sorted(pieces.size());
  for (const auto& s : pieces) sorted[start[std::size_t(s.length)]++] = s;
  return sorted;
}

// A 16-ary max tree over row capacities: a node is one 64-byte block of 16
// int32, so a search reads one cache line per level (5 levels cover 1M
// rows) instead of chasing 20 binary levels, and the 16 compares vectorize.
class MaxTree16 {
 public:
  MaxTree16(std::size_t leaves, std::int32_t fill) { build(std::vector<std::int32_t>(leaves, fill)); }
  // Level sizes are multiples of 16, padded with 0 (no piece fits a 0); the
  // top level is one block.
  void build(std::vector<std::int32_t> leaf) {
    leaves_ = leaf.size();
    levels_.clear();
    leaf.resize((leaf.size() + 15) / 16 * 16, 0);
    levels_.push_back(std::move(leaf));
    while (levels_.back().size() > 16) {
      const auto& below = levels_.back();
      std::vector<std::int32_t> up((below.size() / 16 + 15) / 16 * 16, 0);
      for (std::size_t i = 0; i < below.size(); ++i) up[i / 16] = std::max(up[i / 16], below[i]);
      levels_.push_back(std::move(up));
    }
  }
  std::size_t leaves() const { return leaves_; }
  const std::vector<std::int32_t>& leaf_values() const { return levels_[0]; }
  // Leftmost leaf with value >= x; the caller guarantees one exists.
  std::size_t leftmost_ge(std::int32_t x) const {
    std::size_t i = 0;
    for (std::size_t l = levels_.size(); l-- > 0;) i = i * 16 + first_ge(&levels_[l][i * 16], x);
    return i;
  }
  void set(std::size_t i, std::int32_t v) {
    levels_[0][i] = v;
    for (std::size_t l = 1; l < levels_.size(); ++l) {
      const std::size_t block = i / 16;
      std::int32_t m = 0;
      for (std::size_t j = 0; j < 16; ++j) m = std::max(m, levels_[l - 1][block * 16 + j]);
      if (levels_[l][block] == m) return;  // ancestors are unchanged too
      levels_[l][block] = m;
      i = block;
    }
  }

 private:
  static std::size_t first_ge(const std::int32_t* b, std::int32_t x) {
    unsigned mask = 0;
    for (unsigned j = 0; j < 16; ++j) mask |= unsigned(b[j] >= x) << j;
    return std::size_t(std::countr_zero(mask));  // 16 (out of block) cannot happen: the parent said >= x
  }
  std::size_t leaves_ = 0;
  std::vector<std::vector<std::int32_t>> levels_;  // [0] = leaves
};

// First fit: the leftmost row whose remaining capacity >= len, from a
// MaxTree16 over remaining capacities. Leaves past the opened rows hold
// max_len, so the leftmost fit is an open row or the next new one. The tree
// doubles when every leaf is open. O(n log16 rows).
std::vector<std::int32_t> first_fit(const std::vector<Segment>& sorted, std::int32_t max_len,
                                    std::int64_t real_tokens, std::int32_t& rows) {
  MaxTree16 tree(std::size_t(real_tokens / max_len + real_tokens / max_len / 4 + 16), max_len);
  std::vector<std::int32_t> row_of(sorted.size());
  rows = 0;
  std::int32_t last_len = 0;
  std::size_t last_row = 0;
  for (std::size_t k = 0; k < sorted.size(); ++k) {
    const std::int32_t len = sorted[k].length;
    if (std::size_t(rows) == tree.leaves()) {  // all leaves open: double, keeping them
      std::vector<std::int32_t> leaf(tree.leaf_values().begin(),
                                     tree.leaf_values().begin() + std::ptrdiff_t(tree.leaves()));
      leaf.resize(2 * leaf.size(), max_len);
      tree.build(std::move(leaf));
    }
    // Rows left of the previous fit hold < len for the same len, so if that
    // row still fits it is the leftmost: equal lengths come in runs, and this
    // skips the search for most of them.
    const std::size_t row = len == last_len && tree.leaf_values()[last_row] >= len
                                ? last_row
                                : tree.leftmost_ge(len);
    if (row == std::size_t(rows)) ++rows;
    tree.set(row, tree.leaf_values()[row] - len);
    row_of[k] = std::int32_t(row);
    last_len = len;
    last_row = row;
  }
  return row_of;
}

// Best fit: the row with the smallest remaining capacity >= len. Rows sit in
// intrusive lists indexed by remaining capacity, with a LevelBits of the
// non-empty capacities. O(n log64 max_len).
std::vector<std::int32_t> best_fit(const std::vector<Segment>& sorted, std::int32_t max_len,
                                   std::int32_t& rows) {
  std::vector<std::int32_t> head(std::size_t(max_len) + 1, -1), next, remaining;
  LevelBits nonempty(std::size_t(max_len) + 1);
  std::vector<std::int32_t> row_of(sorted.size());
  rows = 0;
  for (std::size_t k = 0; k < sorted.size(); ++k) {
    const std::int32_t len = sorted[k].length;
    const std::int64_t c = nonempty.find_ge(std::size_t(len));
    std::int32_t row;
    if (c < 0) {
      row = rows++;
      remaining.push_back(max_len);
      next.push_back(-1);
    } else {
      row = head[std::size_t(c)];
      head[std::size_t(c)] = next[std::size_t(row)];
      if (head[std::size_t(c)] < 0) nonempty.reset(std::size_t(c));
    }
    const std::int32_t r = remaining[std::size_t(row)] -= len;
    if (r > 0) {  // a full row can take nothing more: it leaves the index
      next[std::size_t(row)] = head[std::size_t(r)];
      head[std::size_t(r)] = row;
      nonempty.set(std::size_t(r));
    }
    row_of[k] = row;
  }
  return row_of;
}

void fill_packed_rows(const std::vector<Segment>& sorted, const std::vector<std::int32_t>& row_of,
                      std::int32_t rows, Plan& p) {
  std::vector<std::int32_t> count(std::size_t(rows), 0);
  for (const std::int32_t r : row_of) ++count[std::size_t(r)];
  p.rows.resize(std::size_t(rows));
  for (std::size_t r = 0; r < p.rows.size(); ++r) p.rows[r].segments.reserve(std::size_t(count[r]));
  for (std::size_t k = 0; k < sorted.size(); ++k) {
    Row& row = p.rows[std::size_t(row_of[k])];
    row.segments.push_back(sorted[k]);
    row.used += sorted[k].length;
  }
  p.row_computed.assign(p.rows.size(), p.max_len);
}

// Back to back in input order, cut every max_len. O(n).
void concat_rows(const std::vector<std::int32_t>& lengths, Overflow overflow, Plan& p) {
  Row cur;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const std::int32_t len = lengths[i];
    if (len > p.max_len && overflow == Overflow::drop) {
      p.dropped_tokens += len;
      continue;
    }
    for (std::int32_t off = 0; off < len;) {
      const std::int32_t take = std::min(len - off, p.max_len - cur.used);
      if (take < len && off == 0) ++p.split_sequences;
      cur.segments.push_back({std::int64_t(i), off, take});
      cur.used += take;
      off += take;
      p.real_tokens += take;
      if (cur.used == p.max_len) p.rows.push_back(std::exchange(cur, Row{}));
    }
  }
  if (cur.used > 0) p.rows.push_back(std::move(cur));  // padded, not dropped: every token is trained on
  p.row_computed.assign(p.rows.size(), p.max_len);
}

void add_to(PackGroup& g, std::int32_t len, std::int64_t k) {
  if (!g.pattern.empty() && g.pattern.back().length == len)
    g.pattern.back().count += k;
  else
    g.pattern.push_back({len, k});
  g.used += std::int32_t(std::int64_t(len) * k);
}

}  // namespace

// ---- public ------------------------------------------------------------------



double Plan::padding_fraction() const {
  return computed_tokens > 0 ? 1.0 - double(real_tokens) / double(computed_tokens) : 0.0;
}

double Plan::efficiency() const {
  return rows.empty() ? 0.0 : double(real_tokens) / (double(rows.size()) * double(max_len));
}

Plan plan(const std::vector<std::int32_t>& lengths, Strategy strategy, std::int32_t max_len,
          std::int32_t rows_per_batch, std::int32_t bucket_window, Overflow overflow) {
  if (max_len < 1) throw UsageError(fmt::format("max_len must be >= 1, got {}", max_len));
  if (rows_per_batch < 1) throw UsageError(fmt::format("rows_per_batch must be >= 1, got {}", rows_per_batch));
  if (bucket_window < 1) throw UsageError(fmt::format("bucket_window must be >= 1, got {}", bucket_window));
  for (std::size_t i = 0; i < lengths.size(); ++i)
    if (lengths[i] < 0) throw UsageError(fmt::format("length {} of sequence {} is negative", lengths[i], i));

  const auto t0 = Clock::now();
  Plan p;
  p.strategy = strategy;
  p.max_len = max_len;
  p.cross_contamination = strategy == Strategy::concat;
  p.row_len = strategy == Strategy::pad_longest || strategy == Strategy::bucket ? 0 : max_len;
  if (strategy == Strategy::concat) {
    concat_rows(lengths, overflow, p);
  } else {
    std::vector<Segment> pieces = make_pieces(lengths, max_len, overflow, p);
    if (pieces.size() >= std::size_t(std::numeric_limits<std::int32_t>::max()))
      throw UsageError(fmt::format("{} pieces are more than the planner indexes", pieces.size()));
    for (const auto& s : pieces) p.real_tokens += s.length;
    switch (strategy) {
      case Strategy::pad_max:  // O(n)
        p.rows.resize(pieces.size());
        for (std::size_t i = 0; i < pieces.size(); ++i) p.rows[i] = Row{{pieces[i]}, pieces[i].length};
        p.row_computed.assign(pieces.size(), max_len);
        break;
      case Strategy::bucket: {  // O(n log w): sort each window, longest first
        const std::size_t window = std::size_t(rows_per_batch) * std::size_t(bucket_window);
        for (std::size_t w = 0; w < pieces.size(); w += window)
          std::stable_sort(pieces.begin() + std::ptrdiff_t(w),
                           pieces.begin() + std::ptrdiff_t(std::min(pieces.size(), w + window)),
                           [](const Segment& a, const Segment& b) { return a.length > b.length; });
        pad_batches(pieces, rows_per_batch, p);
        break;
      }
      case Strategy::pad_longest:  // O(n)
        pad_batches(pieces, rows_per_batch, p);
        break;
      case Strategy::pack_ffd:  // O(n + max_len + n log rows)
      case Strategy::pack_bfd: {  // O(n + max_len + n log64 max_len)
        pieces = sort_decreasing(pieces, max_len);
        std::int32_t rows = 0;
        const auto row_of = strategy == Strategy::pack_ffd ? first_fit(pieces, max_len, p.real_tokens, rows)
                                                           : best_fit(pieces, max_len, rows);
        fill_packed_rows(pieces, row_of, rows, p);
        break;
      }
      case Strategy::concat: break;  // handled above
    }
  }
  for (const std::int32_t c : p.row_computed) p.computed_tokens += c;
  p.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return p;
}

std::vector<std::int32_t> cu_seqlens(const Row& row) {
  std::vector<std::int32_t> cu{0};
  cu.reserve(row.segments.size() + 1);
  for (const auto& s : row.segments) cu.push_back(cu.back() + s.length);
  return cu;
}

double CountPlan::efficiency() const {
  return rows > 0 ? double(real_tokens) / (double(rows) * double(max_len)) : 0.0;
}

// Best-fit decreasing over counts. Taking c items of length L: a row at the
// smallest capacity cap >= L keeps taking them until it holds m = cap / L
// (its remainder is then < L, and nothing in [L, cap) existed), so a group of
// g identical rows absorbs min(c, g*m) items at once: whole rows of m, one
// row of the rest. New rows likewise take max_len / L each. Only capacities
// steer best fit, so the row count equals item-by-item BFD's.
// O(distinct lengths x groups touched); groups grow by <= 3 per length.
CountPlan pack_counts(const std::vector<LengthCount>& histogram, std::int32_t max_len,
                      Overflow overflow) {
  if (max_len < 1) throw UsageError(fmt::format("max_len must be >= 1, got {}", max_len));
  const auto t0 = Clock::now();
  CountPlan out;
  out.max_len = max_len;
  std::vector<std::int64_t> count(std::size_t(max_len) + 1, 0);
  for (const auto& [len, n] : histogram) {
    if (len < 1 || n < 0) throw UsageError(fmt::format("bad histogram entry {},{}", len, n));
    if (len <= max_len) {
      count[std::size_t(len)] += n;
    } else if (overflow == Overflow::drop) {
      out.dropped_tokens += std::int64_t(len) * n;
      continue;
    } else {
      out.split_sequences += n;
      count[std::size_t(max_len)] += n * (len / max_len);
      if (len % max_len) count[std::size_t(len % max_len)] += n;
    }
    out.sequences += n;
    out.real_tokens += std::int64_t(len) * n;
  }
  std::vector<std::vector<PackGroup>> by_cap(std::size_t(max_len) + 1);
  LevelBits nonempty(std::size_t(max_len) + 1);
  const auto place = [&](PackGroup&& g) {
    const std::int32_t cap = max_len - g.used;
    by_cap[std::size_t(cap)].push_back(std::move(g));
    if (cap > 0) nonempty.set(std::size_t(cap));  // full rows stay out of the index
  };
  for (std::int32_t len = max_len; len >= 1; --len) {
    for (std::int64_t c = count[std::size_t(len)]; c > 0;) {
      const std::int64_t cap = nonempty.find_ge(std::size_t(len));
      if (cap < 0) {  // open rows of max_len / len each, and one for the rest
        const std::int64_t m = max_len / len;
        if (c / m > 0) { PackGroup g{c / m, {}, 0}; add_to(g, len, m); place(std::move(g)); }
        if (c % m > 0) { PackGroup g{1, {}, 0}; add_to(g, len, c % m); place(std::move(g)); }
        break;
      }
      auto& bucket = by_cap[std::size_t(cap)];
      PackGroup g = std::move(bucket.back());
      bucket.pop_back();
      if (bucket.empty()) nonempty.reset(std::size_t(cap));
      const std::int64_t m = cap / len;
      if (c >= g.rows * m) {  // the whole group fills up with this length
        c -= g.rows * m;
        add_to(g, len, m);
        place(std::move(g));
        continue;
      }
      const std::int64_t whole = c / m, rest = c % m;
      if (whole > 0) { PackGroup a = g; a.rows = whole; add_to(a, len, m); place(std::move(a)); }
      if (rest > 0) { PackGroup b = g; b.rows = 1; add_to(b, len, rest); place(std::move(b)); }
      g.rows -= whole + (rest > 0 ? 1 : 0);
      if (g.rows > 0) place(std::move(g));  // untouched rows keep their capacity
      break;
    }
  }
  for (auto& bucket : by_cap)
    for (auto& g : bucket) {
      out.rows += g.rows;
      out.groups.push_back(std::move(g));
    }
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

}  // namespace sb::packing
