#include "workloads/packers.hpp"

#include <algorithm>     // std::max, std::min, std::stable_sort, std::upper_bound
#include <bit>           // std::countr_zero
#include <chrono>        // std::chrono::steady_clock
#include <iterator>      // std::prev
#include <limits>        // std::numeric_limits
#include <memory>        // std::make_shared, std::shared_ptr
#include <stdexcept>     // std::out_of_range
#include <string_view>   // std::string_view
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
void pad_batches(const std::vector<Segment>& pieces, std::int32_t rows_per_batch, std::int32_t multiple, Plan& p) {
  p.rows.resize(pieces.size());
  p.row_computed.resize(pieces.size());
  for (std::size_t b = 0; b < pieces.size(); b += std::size_t(rows_per_batch)) {
    const std::size_t e = std::min(pieces.size(), b + std::size_t(rows_per_batch));
    std::int32_t longest = 0;
    for (std::size_t i = b; i < e; ++i) longest = std::max(longest, pieces[i].length);
    if (multiple > 1)  // the collator's pad_to_multiple_of, at most max_len (as train's pad-longest)
      longest = std::int32_t(std::min<std::int64_t>(
          p.max_len, std::max<std::int64_t>(multiple, (std::int64_t(longest) + multiple - 1) / multiple * multiple)));
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

// ---- pack-hist: best-fit decreasing over length classes ----------------------

constexpr std::int64_t kMaxTokens = std::int64_t(1) << 62;  // every count below fits int64 with room

// a * b, or UsageError when it passes kMaxTokens (a, b >= 0).
std::int64_t product(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r) || r > kMaxTokens)
    throw UsageError(fmt::format("{}: {} x {} is more than 2^62", what, a, b));
  return r;
}
std::int64_t sum(std::int64_t a, std::int64_t b, std::string_view what) {
  if (b > kMaxTokens - a) throw UsageError(fmt::format("{}: more than 2^62", what));
  return a + b;
}

// A row group's contents as a chain: the last (length, count) added, and the
// node before it. Groups split from one group share its chain, so moving or
// splitting a group never copies what its rows already hold.
struct ShapeNode {
  std::int64_t parent = -1;
  std::int64_t count = 0;
  std::int32_t length = 0;
};
// `rows` identical rows holding `used` tokens, contents ending at `node`.
struct RowGroup {
  std::int64_t rows = 0, node = -1;
  std::int32_t used = 0;
};

// Best fit, decreasing, over count[L] pieces of L tokens (L = max_len..1).
// A piece of L goes to a row of the smallest remaining room >= L (pack-bfd's
// rule). For a class of c pieces that row keeps taking them until it holds
// m = room / L more (what it then has left is < L, and no row had room in
// [L, room)), so a group of g identical rows at that room takes min(c, g*m)
// pieces at once: all g rows m each, or `whole` rows m each and one row the
// rest, the others staying. New rows likewise take max_len / L each. Groups
// of one room sit in a stack whose top is taken first: pack-bfd's rows of one
// room are a list whose head is taken first, and this keeps the same order
// (the rows a group moves together are contiguous in that list), so the rows
// made are pack-bfd's, not only as many. Work: O(max_len) for the classes,
// plus O(log64 max_len) per group moved or split; a group moves once per
// length it takes, so at most sqrt(2 max_len) times (its lengths are distinct
// and add up to <= max_len), and a class adds at most 2 groups.
std::vector<RowGroup> best_fit_counts(const std::vector<std::int64_t>& count, std::int32_t max_len,
                                      std::vector<ShapeNode>& nodes) {
  std::vector<std::vector<RowGroup>> by_room(std::size_t(max_len) + 1);  // [0]: full rows
  LevelBits open(std::size_t(max_len) + 1);                              // rooms > 0 holding a group
  const auto put = [&](const RowGroup& g) {
    const auto room = std::size_t(max_len - g.used);
    by_room[room].push_back(g);
    if (room > 0) open.set(room);
  };
  const auto add = [&](const RowGroup& from, std::int64_t rows, std::int32_t len, std::int64_t k) {
    nodes.push_back({from.node, k, len});
    put({rows, std::int64_t(nodes.size()) - 1, from.used + std::int32_t(k * len)});  // k * len <= max_len
  };
  for (std::int32_t len = max_len; len >= 1; --len) {
    for (std::int64_t c = count[std::size_t(len)]; c > 0;) {
      const std::int64_t room = open.find_ge(std::size_t(len));
      if (room < 0) {  // nothing fits: new rows of m, and one of the rest
        const std::int64_t m = max_len / len;
        if (c / m > 0) add(RowGroup{}, c / m, len, m);
        if (c % m > 0) add(RowGroup{}, 1, len, c % m);
        break;
      }
      auto& stack = by_room[std::size_t(room)];
      RowGroup g = stack.back();
      stack.pop_back();
      if (stack.empty()) open.reset(std::size_t(room));
      const std::int64_t m = room / len;
      if (c / m >= g.rows) {  // every row of the group takes m (c >= rows * m, without overflow)
        c -= g.rows * m;
        add(g, g.rows, len, m);
        continue;
      }
      const std::int64_t whole = c / m, rest = c % m;
      if (whole > 0) add(g, whole, len, m);
      if (rest > 0) add(g, 1, len, rest);
      g.rows -= whole + (rest > 0 ? 1 : 0);
      if (g.rows > 0) put(g);  // the untouched rows, back on top
      break;
    }
  }
  std::vector<RowGroup> out;
  for (const auto& stack : by_room) out.insert(out.end(), stack.begin(), stack.end());
  return out;
}

}  // namespace

namespace detail {

// What CountPlan::row reads: where each group's rows begin, each group's
// pattern with the ordinal (within its length's pieces) that its row 0
// starts at, and where the pieces of a length come from: explicit lengths
// keep their pieces sorted by length; a histogram keeps runs of entries.
struct RowIndex {
  struct Entry {
    std::int32_t length = 0;
    std::int64_t count = 0;  // pieces per row
    std::int64_t first = 0;  // ordinal of row 0's first piece among this length's pieces
  };
  // Pieces [end of the previous run, end) of one length: sequences seq0,
  // seq0+1, ..., each giving `per` pieces at offset0, offset0 + max_len, ...
  struct Run {
    std::int64_t end = 0, seq0 = 0, per = 1;
    std::int32_t offset0 = 0;
  };
  std::int32_t max_len = 0;
  std::vector<std::int64_t> group_end;     // rows of groups 0..g
  std::vector<std::size_t> entry_begin;    // group g: entries [entry_begin[g], entry_begin[g + 1])
  std::vector<Entry> entries;
  bool from_histogram = false;
  std::vector<Segment> sorted;             // explicit: pieces longest first; length L's from class_start[L]
  std::vector<std::int64_t> class_start;
  std::vector<std::vector<Run>> runs;      // histogram: runs[L], in entry order

  Segment piece(std::int32_t len, std::int64_t ordinal) const {
    if (!from_histogram) return sorted[std::size_t(class_start[std::size_t(len)] + ordinal)];
    const auto& rs = runs[std::size_t(len)];
    const auto it = std::upper_bound(rs.begin(), rs.end(), ordinal,
                                     [](std::int64_t o, const Run& r) { return o < r.end; });
    const std::int64_t local = ordinal - (it == rs.begin() ? 0 : std::prev(it)->end);
    return {it->seq0 + local / it->per, std::int32_t(it->offset0 + local % it->per * max_len), len};
  }
};

}  // namespace detail

namespace {

// Packs count[1..max_len] into `out`: its groups (patterns longest first),
// rows, and the row index over `x` (whose piece source the caller filled).
void pack_classes(const std::vector<std::int64_t>& count, std::int32_t max_len,
                  std::shared_ptr<detail::RowIndex> x, CountPlan& out) {
  std::vector<ShapeNode> nodes;
  const std::vector<RowGroup> groups = best_fit_counts(count, max_len, nodes);
  std::vector<std::int64_t> next(std::size_t(max_len) + 1, 0);  // pieces of each length handed out
  x->max_len = max_len;
  x->group_end.reserve(groups.size());
  x->entry_begin.reserve(groups.size() + 1);
  out.groups.reserve(groups.size());
  for (const RowGroup& g : groups) {
    PackGroup pg{g.rows, {}, g.used};
    for (std::int64_t n = g.node; n >= 0; n = nodes[std::size_t(n)].parent)  // shortest first
      pg.pattern.push_back({nodes[std::size_t(n)].length, nodes[std::size_t(n)].count});
    std::reverse(pg.pattern.begin(), pg.pattern.end());
    x->entry_begin.push_back(x->entries.size());
    for (const auto& [len, k] : pg.pattern) {
      x->entries.push_back({len, k, next[std::size_t(len)]});
      next[std::size_t(len)] += g.rows * k;  // <= count[len]
    }
    out.rows += g.rows;
    x->group_end.push_back(out.rows);
    out.groups.push_back(std::move(pg));
  }
  x->entry_begin.push_back(x->entries.size());
  out.max_len = max_len;
  out.index = std::move(x);
}

// pack-hist from explicit lengths: the Overflow rule's pieces sorted by
// length, longest first, ties in input order (pack-bfd's counting sort),
// straight into the row index. O(n + max_len).
void pack_lengths(const std::vector<std::int32_t>& lengths, Overflow overflow, Plan& p) {
  const auto t0 = Clock::now();
  const std::int32_t max_len = p.max_len;
  std::vector<std::int64_t> count(std::size_t(max_len) + 1, 0);
  auto c = std::make_shared<CountPlan>();
  for (const std::int32_t len : lengths) {
    if (len <= 0) continue;
    if (len <= max_len) {
      ++count[std::size_t(len)];
    } else if (overflow == Overflow::drop) {
      p.dropped_tokens += len;
      continue;
    } else {
      ++p.split_sequences;
      count[std::size_t(max_len)] += len / max_len;
      if (len % max_len) ++count[std::size_t(len % max_len)];
    }
    ++c->sequences;
    p.real_tokens += len;
  }
  auto x = std::make_shared<detail::RowIndex>();
  x->class_start.assign(std::size_t(max_len) + 1, 0);
  std::int64_t at = 0;
  for (std::size_t len = std::size_t(max_len); len >= 1; --len) {
    x->class_start[len] = at;
    at += count[len];
  }
  x->sorted.resize(std::size_t(at));
  std::vector<std::int64_t> cursor = x->class_start;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const std::int32_t len = lengths[i];
    if (len <= 0 || (len > max_len && overflow == Overflow::drop)) continue;
    for (std::int32_t off = 0, piece = 0; off < len; off += piece) {  // off + max_len may pass INT32_MAX
      piece = std::min(max_len, len - off);
      x->sorted[std::size_t(cursor[std::size_t(piece)]++)] = {std::int64_t(i), off, piece};
    }
  }
  pack_classes(count, max_len, std::move(x), *c);
  c->real_tokens = p.real_tokens;
  c->dropped_tokens = p.dropped_tokens;
  c->split_sequences = p.split_sequences;
  c->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  p.packed = std::move(c);
}

}  // namespace

// ---- public ------------------------------------------------------------------



double Plan::padding_fraction() const {
  return computed_tokens > 0 ? 1.0 - double(real_tokens) / double(computed_tokens) : 0.0;
}

double Plan::efficiency() const {
  const std::int64_t n = row_count();
  return n == 0 ? 0.0 : double(real_tokens) / (double(n) * double(max_len));
}

std::int64_t Plan::row_count() const { return packed ? packed->rows : std::int64_t(rows.size()); }

Row Plan::row(std::int64_t r) const {
  if (packed) return packed->row(r);
  if (r < 0 || r >= std::int64_t(rows.size()))
    throw std::out_of_range(fmt::format("row {} of a plan of {} rows", r, rows.size()));
  return rows[std::size_t(r)];
}

std::int32_t Plan::computed(std::int64_t r) const {
  if (r < 0 || r >= row_count()) throw std::out_of_range(fmt::format("row {} of a plan of {} rows", r, row_count()));
  return packed ? max_len : row_computed[std::size_t(r)];
}

Plan plan(const std::vector<std::int32_t>& lengths, Strategy strategy, std::int32_t max_len,
          std::int32_t rows_per_batch, std::int32_t bucket_window, Overflow overflow, std::int32_t pad_multiple) {
  if (max_len < 1) throw UsageError(fmt::format("max_len must be >= 1, got {}", max_len));
  if (pad_multiple < 1) throw UsageError(fmt::format("pad_multiple must be >= 1, got {}", pad_multiple));
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
  } else if (strategy == Strategy::pack_hist) {  // O(n + max_len + groups moved)
    pack_lengths(lengths, overflow, p);
    p.computed_tokens = p.row_count() * max_len;
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
        pad_batches(pieces, rows_per_batch, pad_multiple, p);
        break;
      }
      case Strategy::pad_longest:  // O(n)
        pad_batches(pieces, rows_per_batch, pad_multiple, p);
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
      case Strategy::pack_hist:
      case Strategy::concat: break;  // handled above
    }
  }
  for (const std::int32_t c : p.row_computed) p.computed_tokens += c;
  p.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return p;
}

Plan plan_histogram(const std::vector<LengthCount>& histogram, std::int32_t max_len, Overflow overflow) {
  const auto t0 = Clock::now();
  auto c = std::make_shared<CountPlan>(pack_counts(histogram, max_len, overflow));
  Plan p;
  p.strategy = Strategy::pack_hist;
  p.max_len = max_len;
  p.row_len = max_len;
  p.real_tokens = c->real_tokens;
  p.dropped_tokens = c->dropped_tokens;
  p.split_sequences = c->split_sequences;
  p.computed_tokens = c->rows * max_len;
  p.packed = std::move(c);
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

Row CountPlan::row(std::int64_t r) const {
  if (r < 0 || r >= rows) throw std::out_of_range(fmt::format("row {} of a plan of {} rows", r, rows));
  const detail::RowIndex& x = *index;
  const auto g = std::size_t(std::upper_bound(x.group_end.begin(), x.group_end.end(), r) - x.group_end.begin());
  const std::int64_t j = r - (g == 0 ? 0 : x.group_end[g - 1]);  // which of the group's identical rows
  Row row;
  for (std::size_t e = x.entry_begin[g]; e < x.entry_begin[g + 1]; ++e) {
    const auto& [len, k, first] = x.entries[e];
    for (std::int64_t t = 0; t < k; ++t) row.segments.push_back(x.piece(len, first + j * k + t));
    row.used += std::int32_t(len * k);
  }
  return row;
}

CountPlan pack_counts(const std::vector<LengthCount>& histogram, std::int32_t max_len,
                      Overflow overflow) {
  if (max_len < 1) throw UsageError(fmt::format("max_len must be >= 1, got {}", max_len));
  const auto t0 = Clock::now();
  CountPlan out;
  auto x = std::make_shared<detail::RowIndex>();
  x->from_histogram = true;
  x->runs.resize(std::size_t(max_len) + 1);
  std::vector<std::int64_t> count(std::size_t(max_len) + 1, 0);
  const auto run = [&](std::int32_t len, std::int64_t pieces, std::int64_t seq0, std::int64_t per,
                       std::int32_t offset0) {
    count[std::size_t(len)] += pieces;  // <= the tokens, checked below
    x->runs[std::size_t(len)].push_back({count[std::size_t(len)], seq0, per, offset0});
  };
  std::int64_t seq = 0, tokens = 0;  // sequences numbered so far; tokens placed or dropped
  for (const auto& [len, n] : histogram) {
    if (len < 0 || n < 0) throw UsageError(fmt::format("bad histogram entry {},{}: negative", len, n));
    const std::int64_t seq0 = seq;
    seq = sum(seq, n, "histogram sequences");
    if (len == 0 || n == 0) continue;  // places nothing
    const std::int64_t t = product(len, n, "histogram tokens");
    tokens = sum(tokens, t, "histogram tokens");
    if (len <= max_len) {
      run(len, n, seq0, 1, 0);
    } else if (overflow == Overflow::drop) {
      out.dropped_tokens += t;
      continue;
    } else {  // n sequences of q max_len pieces, then one of the rest each
      const std::int32_t q = len / max_len, rest = len % max_len;
      out.split_sequences += n;
      run(max_len, n * q, seq0, q, 0);  // n * q <= t
      if (rest > 0) run(rest, n, seq0, 1, q * max_len);
    }
    out.sequences += n;
    out.real_tokens += t;
  }
  pack_classes(count, max_len, std::move(x), out);
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

}  // namespace sb::packing
