// The packing scenario's planners: every token placed exactly once by every
// strategy, rows within max_len, the seeds' 87% padding, >= 99% packing
// efficiency on Wikipedia-like lengths, the ordering pad-max >= pad-longest >=
// bucket in computed tokens, the histogram fast path matching BFD, length
// specs and files (errors name the line), determinism, and timings printed
// with generous bounds so a busy 2-core machine cannot fail them.
#include <gtest/gtest.h>

#include <algorithm>   // std::sort, std::is_sorted, std::min_element
#include <cmath>       // std::erfc, std::log, std::sqrt
#include <cstdio>      // std::printf
#include <filesystem>  // temp length files
#include <fstream>     // std::ofstream
#include <functional>  // std::greater
#include <map>         // std::map
#include <string>      // std::string
#include <tuple>       // std::tuple
#include <utility>     // std::pair
#include <vector>      // std::vector

#include <unistd.h>    // getpid

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // sb::UsageError
#include "workloads/packers.hpp"

namespace sb::packing {
namespace {

constexpr Strategy kAll[] = {Strategy::pad_max, Strategy::pad_longest, Strategy::bucket,
                             Strategy::pack_ffd, Strategy::pack_bfd, Strategy::concat};

std::vector<std::int32_t> lengths_of(const std::string& spec, std::int64_t n, std::int32_t cap,
                                     std::uint64_t seed = 7) {
  return generate_lengths(parse_lengths(spec), n, seed, cap);
}

// The exactly-once check: each kept sequence's segments, sorted by offset,
// tile [0, length) with no gap or overlap; dropped sequences are absent.
void expect_valid(const Plan& p, const std::vector<std::int32_t>& lengths, Overflow overflow) {
  std::vector<Segment> all;
  std::int64_t computed = 0;
  ASSERT_EQ(p.row_computed.size(), p.rows.size());
  for (std::size_t r = 0; r < p.rows.size(); ++r) {
    std::int64_t used = 0;
    for (const auto& s : p.rows[r].segments) used += s.length;
    ASSERT_EQ(used, p.rows[r].used) << "row " << r;
    ASSERT_LE(p.rows[r].used, p.max_len) << "row " << r;
    ASSERT_GE(p.row_computed[r], p.rows[r].used) << "row " << r;
    ASSERT_LE(p.row_computed[r], p.max_len) << "row " << r;
    computed += p.row_computed[r];
    all.insert(all.end(), p.rows[r].segments.begin(), p.rows[r].segments.end());
  }
  std::sort(all.begin(), all.end(), [](const Segment& a, const Segment& b) {
    return a.seq != b.seq ? a.seq < b.seq : a.offset < b.offset;
  });
  std::vector<std::int64_t> covered(lengths.size(), 0);  // tokens tiled from 0 so far
  for (const auto& s : all) {
    ASSERT_GE(s.seq, 0);
    ASSERT_LT(s.seq, std::int64_t(lengths.size()));
    ASSERT_GT(s.length, 0);
    ASSERT_EQ(s.offset, covered[std::size_t(s.seq)]) << "gap or overlap in sequence " << s.seq;
    covered[std::size_t(s.seq)] += s.length;
  }
  std::int64_t real = 0, dropped = 0;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const bool drop = overflow == Overflow::drop && lengths[i] > p.max_len;
    ASSERT_EQ(covered[i], drop ? 0 : lengths[i]) << "sequence " << i << " of " << lengths[i];
    (drop ? dropped : real) += lengths[i];
  }
  EXPECT_EQ(p.real_tokens, real);
  EXPECT_EQ(p.dropped_tokens, dropped);
  EXPECT_EQ(p.computed_tokens, computed);
  EXPECT_EQ(p.cross_contamination, p.strategy == Strategy::concat);
}

TEST(Packing, EveryTokenPlacedOnceByEveryStrategy) {
  // Mean 64 at max_len 128 with a long tail up to 4x: many split sequences.
  const auto lengths = lengths_of("lognormal:64,1.0", 20000, 4 * 128);
  for (const Overflow overflow : {Overflow::split, Overflow::drop})
    for (const Strategy s : kAll)
      for (const auto& [rows_per_batch, window] : {std::pair{1, 1}, std::pair{7, 1}, std::pair{8, 4}}) {
        SCOPED_TRACE(fmt::format("{} {} rows_per_batch={} window={}", to_string(s),
                                 to_string(overflow), rows_per_batch, window));
        const Plan p = plan(lengths, s, 128, rows_per_batch, window, overflow);
        expect_valid(p, lengths, overflow);
      }
}

TEST(Packing, SplitCountsAndRealTokensMatchAcrossStrategies) {
  const std::vector<std::int32_t> lengths{10, 300, 100, 0, 256, 5};
  const Plan base = plan(lengths, Strategy::pad_max, 128, 2, 2, Overflow::split);
  EXPECT_EQ(base.split_sequences, 2);  // 300 -> 128+128+44, 256 -> 128+128
  EXPECT_EQ(base.rows.size(), 8u);     // 1 + 3 + 1 + 2 + 1; the empty sequence places nothing
  for (const Strategy s : kAll) {
    const Plan p = plan(lengths, s, 128, 2, 2, Overflow::split);
    expect_valid(p, lengths, Overflow::split);
    EXPECT_EQ(p.real_tokens, 671) << to_string(s);
  }
  const Plan dropped = plan(lengths, Strategy::pack_ffd, 128, 2, 2, Overflow::drop);
  EXPECT_EQ(dropped.dropped_tokens, 556);
  EXPECT_EQ(dropped.real_tokens, 115);
  EXPECT_EQ(dropped.rows.size(), 1u);
}

TEST(Packing, SmallCasesAreExact) {
  const std::vector<std::int32_t> lengths{6, 5, 4, 3, 2};  // max_len 10
  const Plan ffd = plan(lengths, Strategy::pack_ffd, 10, 1, 1, Overflow::split);
  ASSERT_EQ(ffd.rows.size(), 2u);  // {6,4} {5,3,2}
  EXPECT_EQ(ffd.rows[0].used, 10);
  EXPECT_EQ(ffd.rows[1].used, 10);
  EXPECT_DOUBLE_EQ(ffd.efficiency(), 1.0);
  EXPECT_DOUBLE_EQ(ffd.padding_fraction(), 0.0);
  const Plan pl = plan(lengths, Strategy::pad_longest, 10, 2, 1, Overflow::split);
  EXPECT_EQ(pl.computed_tokens, 6 * 2 + 4 * 2 + 2);  // batches {6,5} {4,3} {2}
  EXPECT_EQ(pl.row_len, 0);
  // a collator's pad_to_multiple_of: each batch's longest rounded up, at most max_len (train's pad-longest)
  const std::vector<std::int32_t> mixed{10, 70, 5, 3, 65, 1};  // max_len 100, 2 rows a batch
  const Plan m1 = plan(mixed, Strategy::pad_longest, 100, 2, 1, Overflow::split, 1);
  EXPECT_EQ(m1.computed_tokens, 2 * 70 + 2 * 5 + 2 * 65);
  const Plan m64 = plan(mixed, Strategy::pad_longest, 100, 2, 1, Overflow::split, 64);
  EXPECT_EQ(m64.computed_tokens, 2 * 100 + 2 * 64 + 2 * 100);  // 70 -> 128 capped at 100; 5 -> 64; 65 -> 100
  EXPECT_EQ(m64.real_tokens, m1.real_tokens);
  EXPECT_GT(m64.padding_fraction(), m1.padding_fraction());
  const Plan b64 = plan(mixed, Strategy::bucket, 100, 2, 3, Overflow::split, 64);  // sorted: {70,65} {10,5} {3,1}
  EXPECT_EQ(b64.computed_tokens, 2 * 100 + 2 * 64 + 2 * 64);
  const Plan pm = plan(mixed, Strategy::pad_max, 100, 2, 1, Overflow::split, 64);  // pad-max: max_len already
  EXPECT_EQ(pm.computed_tokens, 6 * 100);
  EXPECT_THROW(plan(mixed, Strategy::pad_longest, 100, 2, 1, Overflow::split, 0), sb::UsageError);
  const Plan cat = plan(lengths, Strategy::concat, 10, 1, 1, Overflow::split);
  ASSERT_EQ(cat.rows.size(), 2u);
  EXPECT_EQ(cat.split_sequences, 1);  // the 5 straddles the first row's end
  EXPECT_EQ(cat.rows[1].segments[0].offset, 4);
  EXPECT_EQ(cat.rows[1].segments[0].length, 1);
  const Plan none = plan({}, Strategy::pack_bfd, 10, 1, 1, Overflow::split);
  EXPECT_TRUE(none.rows.empty());
  EXPECT_EQ(none.efficiency(), 0.0);
  EXPECT_EQ(none.padding_fraction(), 0.0);
}

// Plain quadratic references, item by item, over the same decreasing order
// (counting sort keeps ties in input order, as std::stable_sort does here).
std::vector<std::vector<std::int32_t>> reference_fit(std::vector<std::int32_t> lengths,
                                                     std::int32_t max_len, bool best) {
  std::stable_sort(lengths.begin(), lengths.end(), std::greater<>());
  std::vector<std::vector<std::int32_t>> rows;
  std::vector<std::int32_t> room;
  for (const auto len : lengths) {
    std::size_t pick = rows.size();
    for (std::size_t r = 0; r < rows.size(); ++r)
      if (room[r] >= len && (pick == rows.size() || (best && room[r] < room[pick]))) {
        pick = r;
        if (!best) break;
      }
    if (pick == rows.size()) {
      rows.emplace_back();
      room.push_back(max_len);
    }
    rows[pick].push_back(len);
    room[pick] -= len;
  }
  return rows;
}

TEST(Packing, FfdAndBfdMatchQuadraticReferences) {
  for (const auto& [spec, max_len] : {std::pair{"uniform:1,100", 128}, std::pair{"lognormal:300,0.8", 512},
                                      std::pair{"uniform:513,1024", 1024}, std::pair{"uniform:1,6", 8}}) {
    const auto lengths = lengths_of(spec, 3000, max_len);
    const auto ffd_ref = reference_fit(lengths, max_len, false);
    const Plan ffd = plan(lengths, Strategy::pack_ffd, max_len, 1, 1, Overflow::split);
    ASSERT_EQ(ffd.rows.size(), ffd_ref.size()) << spec;
    for (std::size_t r = 0; r < ffd_ref.size(); ++r) {  // the same rows, row by row
      std::vector<std::int32_t> got;
      for (const auto& s : ffd.rows[r].segments) got.push_back(s.length);
      ASSERT_EQ(got, ffd_ref[r]) << spec << " row " << r;
    }
    // Best fit's ties (rows of equal room) may go either way; the row count cannot.
    const Plan bfd = plan(lengths, Strategy::pack_bfd, max_len, 1, 1, Overflow::split);
    EXPECT_EQ(bfd.rows.size(), reference_fit(lengths, max_len, true).size()) << spec;
  }
}

// Rows of one piece each outgrow first fit's initial tree (sized from the
// token count), so it must double while keeping the rows it holds.
TEST(Packing, FirstFitGrowsPastItsInitialSize) {
  const auto lengths = lengths_of("uniform:513,1024", 50000, 1024);
  const Plan ffd = plan(lengths, Strategy::pack_ffd, 1024, 1, 1, Overflow::split);
  EXPECT_EQ(ffd.rows.size(), lengths.size());
  expect_valid(ffd, lengths, Overflow::split);
}

TEST(Packing, CuSeqlens) {
  Row row{{{3, 0, 5}, {9, 128, 7}, {1, 0, 1}}, 13};
  EXPECT_EQ(cu_seqlens(row), (std::vector<std::int32_t>{0, 5, 12, 13}));
  EXPECT_EQ(cu_seqlens(Row{}), (std::vector<std::int32_t>{0}));
  const Plan p = plan(lengths_of("uniform:1,100", 500, 0), Strategy::pack_bfd, 256, 1, 1,
                      Overflow::split);
  for (const auto& r : p.rows) {
    const auto cu = cu_seqlens(r);
    ASSERT_EQ(cu.size(), r.segments.size() + 1);
    EXPECT_EQ(cu.back(), r.used);
    EXPECT_TRUE(std::is_sorted(cu.begin(), cu.end()));
  }
}

// The seeds' figure: mean 256 tokens at max_len 2048 is 1 - 256/2048 = 87.5% padding.
TEST(Packing, SeedsPadMaxIsAbout87PercentPadding) {
  const auto lengths = lengths_of("lognormal:256,1.0", 200000, 4 * 2048);
  const Plan p = plan(lengths, Strategy::pad_max, 2048, 8, 1, Overflow::split);
  std::printf("[ figures  ] seeds lognormal:256,1.0 max 2048 pad-max: padding %.4f (expected 0.875)\n",
              p.padding_fraction());
  EXPECT_NEAR(p.padding_fraction(), 0.875, 0.02);
  const Plan ffd = plan(lengths, Strategy::pack_ffd, 2048, 8, 1, Overflow::split);
  std::printf("[ figures  ] same lengths pack-ffd: padding %.4f, %zu rows vs %zu (%.2fx fewer)\n",
              ffd.padding_fraction(), ffd.rows.size(), p.rows.size(),
              double(p.rows.size()) / double(ffd.rows.size()));
  // Packing removes nearly all of it: the same tokens in about 1/8 of the rows.
  EXPECT_LT(ffd.padding_fraction(), 0.01);
  EXPECT_EQ(ffd.real_tokens, p.real_tokens);
  EXPECT_LT(double(ffd.rows.size()), double(p.rows.size()) / 7.5);
  EXPECT_NEAR(double(p.rows.size()) / double(ffd.rows.size()),
              (1 - ffd.padding_fraction()) / (1 - p.padding_fraction()), 1e-9);  // rows scale as 1/efficiency
}

// Wikipedia-like (Graphcore's BERT data at max 512: 50% padding under
// pad-max, with a spike of sequences truncated at 512): lognormal mean 300,
// sigma 0.8, clipped at 512 gives about 50% padding with 14% at 512.
TEST(Packing, WikipediaLikePacksAbove99Percent) {
  const auto lengths = lengths_of("lognormal:300,0.8", 500000, 512);
  const Plan pad = plan(lengths, Strategy::pad_max, 512, 32, 1, Overflow::split);
  EXPECT_NEAR(pad.padding_fraction(), 0.50, 0.03);
  const Plan ffd = plan(lengths, Strategy::pack_ffd, 512, 32, 1, Overflow::split);
  const Plan bfd = plan(lengths, Strategy::pack_bfd, 512, 32, 1, Overflow::split);
  const Plan cat = plan(lengths, Strategy::concat, 512, 32, 1, Overflow::split);
  std::printf("[ figures  ] wikipedia-like max 512, %zu seqs: pad-max padding %.4f; efficiency "
              "ffd %.5f (%zu rows), bfd %.5f (%zu rows), concat %.5f; speedup over pad-max %.2fx\n",
              lengths.size(), pad.padding_fraction(), ffd.efficiency(), ffd.rows.size(),
              bfd.efficiency(), bfd.rows.size(), cat.efficiency(),
              double(pad.rows.size()) / double(ffd.rows.size()));
  EXPECT_GE(ffd.efficiency(), 0.99);
  EXPECT_GE(bfd.efficiency(), 0.99);
  EXPECT_LE(bfd.rows.size(), ffd.rows.size() + ffd.rows.size() / 1000 + 2);
  const std::int64_t lower_bound = (ffd.real_tokens + 511) / 512;
  EXPECT_GE(std::int64_t(bfd.rows.size()), lower_bound);
}

TEST(Packing, PaddingOrderPadMaxPadLongestBucket) {
  // Generated lognormal lengths come in random order (as a shuffled dataset).
  const auto lengths = lengths_of("lognormal:256,1.0", 100000, 4 * 2048);
  for (const auto& [rows_per_batch, window] : {std::pair{8, 4}, std::pair{16, 16}, std::pair{3, 1}}) {
    const Plan pm = plan(lengths, Strategy::pad_max, 2048, rows_per_batch, window, Overflow::split);
    const Plan pl = plan(lengths, Strategy::pad_longest, 2048, rows_per_batch, window, Overflow::split);
    const Plan bu = plan(lengths, Strategy::bucket, 2048, rows_per_batch, window, Overflow::split);
    std::printf("[ figures  ] rows/batch %d window %d: padding pad-max %.4f pad-longest %.4f bucket %.4f\n",
                rows_per_batch, window, pm.padding_fraction(), pl.padding_fraction(),
                bu.padding_fraction());
    EXPECT_LE(pl.computed_tokens, pm.computed_tokens);
    EXPECT_LE(bu.computed_tokens, pl.computed_tokens);
    if (window > 1) {
      EXPECT_LT(bu.computed_tokens, pl.computed_tokens);
    }
  }
}

TEST(Packing, StrategyNames) {
  for (const Strategy s : kAll) EXPECT_EQ(parse_strategy(to_string(s)), s);
  EXPECT_EQ(parse_strategy("pack_ffd"), std::nullopt);
  EXPECT_EQ(parse_overflow("drop"), Overflow::drop);
  EXPECT_EQ(parse_overflow("truncate"), std::nullopt);
  const std::vector<std::int32_t> one{1};
  EXPECT_THROW(plan(one, Strategy::pad_max, 0, 1, 1, Overflow::split), UsageError);
  EXPECT_THROW(plan(one, Strategy::pad_longest, 8, 0, 1, Overflow::split), UsageError);
  EXPECT_THROW(plan(one, Strategy::bucket, 8, 1, 0, Overflow::split), UsageError);
  EXPECT_THROW(plan({-3}, Strategy::bucket, 8, 1, 1, Overflow::split), UsageError);
}

// ---- length specs and files ---------------------------------------------------

std::string message_of(const std::string& spec) {
  try {
    parse_lengths(spec);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string temp_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() /
                    fmt::format("sb_packing_{}_{}", getpid(), name);
  std::ofstream(path) << text;
  return path.string();
}

TEST(LengthSpec, ParseErrorsSayWhatIsWrong) {
  for (const std::string bad : {"", "gaussian:1,2", "fixed", "fixed:", "fixed:0", "fixed:12x",
                                "uniform:5", "uniform:9,3", "uniform:1,2,3", "lognormal:256",
                                "lognormal:-1,1", "lognormal:abc,1", "lognormal:256,-0.5", "@"}) {
    const std::string m = message_of(bad);
    EXPECT_NE(m.find("expected fixed:N, uniform:LO,HI, lognormal:MEAN,SIGMA or @FILE"), std::string::npos)
        << bad << " -> " << m;
  }
  EXPECT_NE(message_of("gaussian:1,2").find("unknown distribution 'gaussian'"), std::string::npos);
  EXPECT_NE(message_of("uniform:5").find("takes 2 numbers"), std::string::npos);
  const std::string missing = message_of("@/nonexistent/sb_lengths.txt");
  EXPECT_NE(missing.find("cannot read /nonexistent/sb_lengths.txt (lengths file)"), std::string::npos)
      << missing;
}

TEST(LengthSpec, FileErrorsNameTheLine) {
  const auto per_line = temp_file("bad.txt", "# lengths\n\n100\n200  # trailing comment\nabc\n");
  std::string m = message_of("@" + per_line);
  EXPECT_NE(m.find(per_line), std::string::npos) << m;
  EXPECT_NE(m.find("line 5"), std::string::npos) << m;
  EXPECT_NE(m.find("'abc'"), std::string::npos) << m;
  const auto csv = temp_file("bad.csv", "length,count\n100,5\n\n200\n");
  m = message_of("@" + csv);
  EXPECT_NE(m.find("line 4"), std::string::npos) << m;
  const auto zero = temp_file("zero.txt", "10\n0\n");
  EXPECT_NE(message_of("@" + zero).find("line 2"), std::string::npos);
  const auto neg = temp_file("neg.csv", "10,2\n20,-1\n");
  EXPECT_NE(message_of("@" + neg).find("line 2"), std::string::npos);
  const auto empty = temp_file("empty.txt", "# nothing\n\n");
  EXPECT_NE(message_of("@" + empty).find("holds no lengths"), std::string::npos);
  // 1025 lines of 2^40 sequences each: past the 2^50 cap, never an int64 overflow.
  std::string huge = "length,count\n";
  for (int i = 1; i <= 1025; ++i) huge += fmt::format("{},{}\n", i, std::int64_t(1) << 40);
  const auto big = temp_file("huge.csv", huge);
  EXPECT_NE(message_of("@" + big).find("over 2^50 sequences"), std::string::npos) << message_of("@" + big);
  for (const auto& p : {per_line, csv, zero, neg, empty, big}) std::filesystem::remove(p);
}

TEST(LengthSpec, PerLineFileIsCycledOrTakenWhole) {
  const auto path = temp_file("ok.txt", "# one per line\n5\n\n7\r\n9\n");
  const LengthSpec spec = parse_lengths("@" + path);
  EXPECT_EQ(spec.kind, LengthSpec::Kind::file_lengths);
  EXPECT_EQ(generate_lengths(spec, 0, 1), (std::vector<std::int32_t>{5, 7, 9}));
  EXPECT_EQ(generate_lengths(spec, 7, 1), (std::vector<std::int32_t>{5, 7, 9, 5, 7, 9, 5}));
  EXPECT_EQ(generate_lengths(spec, 2, 1), (std::vector<std::int32_t>{5, 7}));
  EXPECT_EQ(generate_lengths(spec, 3, 1, 6), (std::vector<std::int32_t>{5, 6, 6}));  // cap
  std::filesystem::remove(path);
}

// Lengths over the cap are clipped to it and counted (the packing and train points report the count):
// one a value, every sequence of a histogram row, a lognormal tail; none at the cap.
TEST(LengthSpec, ClippedLengthsAreCounted) {
  std::int64_t over = -1;
  const LengthSpec fixed = parse_lengths("fixed:10");
  EXPECT_EQ(generate_lengths(fixed, 4, 1, 10, &over), (std::vector<std::int32_t>{10, 10, 10, 10}));
  EXPECT_EQ(over, 0);
  EXPECT_EQ(generate_lengths(fixed, 4, 1, 9, &over), (std::vector<std::int32_t>{9, 9, 9, 9}));
  EXPECT_EQ(over, 4);
  const auto path = temp_file("clip.csv", "length,count\n100,3\n200,5\n50,0\n900,0\n");
  const LengthSpec hist = parse_lengths("@" + path);
  const auto all = generate_lengths(hist, 0, 3, 150, &over);
  EXPECT_EQ(std::count(all.begin(), all.end(), 150), 5);
  EXPECT_EQ(over, 5);  // the 200 row's five sequences; the empty 900 row none
  const auto drawn = generate_lengths(hist, 40, 3, 150, &over);
  EXPECT_EQ(over, std::count(drawn.begin(), drawn.end(), 150));
  EXPECT_GT(over, 0);
  std::filesystem::remove(path);
  const auto wild = generate_lengths(parse_lengths("lognormal:512,3"), 2000, 7, 4096, &over);
  EXPECT_EQ(over, std::count(wild.begin(), wild.end(), 4096));
  EXPECT_GT(over, 5);  // P(x > 4096) is 1.4% at sigma 3
}

TEST(LengthSpec, HistogramFileExpandsExactlyOrSamples) {
  const auto path = temp_file("hist.csv", "length,count\n# from a tokenizer pass\n100,3\n200, 1\n50,0\n300,6\n");
  const LengthSpec spec = parse_lengths("@" + path);
  EXPECT_EQ(spec.kind, LengthSpec::Kind::file_histogram);
  auto all = generate_lengths(spec, 0, 3);
  EXPECT_FALSE(std::is_sorted(all.begin(), all.end()));  // shuffled, as a dataset is read
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<std::int32_t>{100, 100, 100, 200, 300, 300, 300, 300, 300, 300}));
  std::map<std::int32_t, int> seen;
  for (const auto v : generate_lengths(spec, 100000, 3)) ++seen[v];
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_NEAR(seen[300] / 100000.0, 0.6, 0.01);
  EXPECT_NEAR(seen[100] / 100000.0, 0.3, 0.01);
  const auto headerless = temp_file("plain.csv", "64,2\n");
  EXPECT_EQ(generate_lengths(parse_lengths("@" + headerless), 0, 1), (std::vector<std::int32_t>{64, 64}));
  std::filesystem::remove(path);
  std::filesystem::remove(headerless);
}

TEST(LengthSpec, GenerationIsDeterministicAndMatchesTheSpec) {
  for (const std::string spec : {"uniform:10,20", "lognormal:256,1.0"}) {
    const auto a = lengths_of(spec, 10000, 0, 42), b = lengths_of(spec, 10000, 0, 42);
    EXPECT_EQ(a, b) << spec;
    EXPECT_NE(a, lengths_of(spec, 10000, 0, 43)) << spec;
  }
  EXPECT_EQ(lengths_of("fixed:77", 3, 0), (std::vector<std::int32_t>{77, 77, 77}));
  const auto u = lengths_of("uniform:10,20", 100000, 0);
  EXPECT_EQ(*std::min_element(u.begin(), u.end()), 10);
  EXPECT_EQ(*std::max_element(u.begin(), u.end()), 20);
  const auto ln = lengths_of("lognormal:256,1.0", 400000, 0);  // unclipped: the mean is MEAN
  double sum = 0;
  for (const auto v : ln) sum += v;
  EXPECT_NEAR(sum / double(ln.size()), 256.0, 256.0 * 0.02);
  const auto clipped = lengths_of("lognormal:256,3.0", 10000, 1000);
  EXPECT_LE(*std::max_element(clipped.begin(), clipped.end()), 1000);
  EXPECT_GE(*std::min_element(clipped.begin(), clipped.end()), 1);
}

// ---- histogram fast path and timings ---------------------------------------------

// Counts for L = 1..cap of a lognormal with the given mean, as a tokenizer
// pass over `total` sequences would write them.
std::vector<LengthCount> lognormal_histogram(double mean, double sigma, std::int32_t cap, double total) {
  const double mu = std::log(mean) - 0.5 * sigma * sigma;
  const auto cdf = [&](double x) { return 0.5 * std::erfc(-(std::log(x) - mu) / (sigma * std::sqrt(2.0))); };
  std::vector<LengthCount> h;
  for (std::int32_t len = 1; len <= cap; ++len) {
    const double p = (len == cap ? 1.0 : cdf(len + 0.5)) - (len == 1 ? 0.0 : cdf(len - 0.5));
    if (const auto n = std::int64_t(p * total + 0.5); n > 0) h.push_back({len, n});
  }
  return h;
}

TEST(PackCounts, MatchesItemByItemBestFitDecreasing) {
  for (const auto& [mean, sigma, max_len] : {std::tuple{256.0, 1.0, 2048}, std::tuple{300.0, 0.8, 512}, std::tuple{40.0, 0.5, 128}}) {
    const auto hist = lognormal_histogram(mean, sigma, 3 * max_len, 100000);
    std::vector<std::int32_t> expanded;
    for (const auto& [len, n] : hist) expanded.insert(expanded.end(), std::size_t(n), len);
    for (const Overflow overflow : {Overflow::split, Overflow::drop}) {
      const CountPlan c = pack_counts(hist, max_len, overflow);
      const Plan bfd = plan(expanded, Strategy::pack_bfd, max_len, 1, 1, overflow);
      EXPECT_EQ(c.rows, std::int64_t(bfd.rows.size())) << mean << " " << max_len;
      EXPECT_EQ(c.real_tokens, bfd.real_tokens);
      EXPECT_EQ(c.dropped_tokens, bfd.dropped_tokens);
      EXPECT_EQ(c.split_sequences, bfd.split_sequences);
      std::int64_t rows = 0, tokens = 0;
      for (const auto& g : c.groups) {
        std::int64_t used = 0;
        for (const auto& [len, n] : g.pattern) used += std::int64_t(len) * n;
        ASSERT_EQ(used, g.used);
        ASSERT_LE(g.used, max_len);
        rows += g.rows;
        tokens += g.rows * g.used;
      }
      EXPECT_EQ(rows, c.rows);
      EXPECT_EQ(tokens, c.real_tokens);
    }
  }
}

TEST(PackCounts, SixteenMillionSequenceHistogramFromAFile) {
  const auto hist = lognormal_histogram(256, 1.0, 4 * 2048, 16e6);
  std::string csv = "length,count\n";
  for (const auto& [len, n] : hist) csv += fmt::format("{},{}\n", len, n);
  const auto path = temp_file("16m.csv", csv);
  const LengthSpec spec = parse_lengths("@" + path);
  std::filesystem::remove(path);
  const CountPlan c = pack_counts(spec.histogram, 2048, Overflow::split);
  std::printf("[ timings  ] pack_counts 16M-sequence histogram (%zu lengths) max 2048: %.4f s, "
              "%lld sequences, %lld rows, %zu row patterns, efficiency %.5f\n",
              spec.histogram.size(), c.seconds, (long long)c.sequences, (long long)c.rows,
              c.groups.size(), c.efficiency());
  EXPECT_NEAR(double(c.sequences), 16e6, 16e6 * 0.001);
  EXPECT_GE(c.efficiency(), 0.99);
  // Planned on the counts, never expanded: pack shapes with repeat counts,
  // far fewer than the rows they stand for. (Seconds are in bench/packing_bench.)
  EXPECT_LT(c.groups.size() * 100, std::size_t(c.rows));
}

// Scaling, not seconds (those are in bench/packing_bench): 8x the lengths
// costs about 8x log(8n)/log(n) the time for O(n log n) packers, 64x for a
// quadratic one. Both times come from this run, so machine speed cancels.
TEST(PackingScaling, FfdAndBfdAreNearLinearithmic) {
  const auto small = lengths_of("lognormal:256,1.0", 125000, 4 * 2048);
  const auto large = lengths_of("lognormal:256,1.0", 1000000, 4 * 2048);
  for (const Strategy s : {Strategy::pack_ffd, Strategy::pack_bfd}) {
    double t_small = 1e30, t_large = 1e30;  // best of 3: the least disturbed run
    for (int i = 0; i < 3; ++i) {
      t_small = std::min(t_small, plan(small, s, 2048, 8, 16, Overflow::split).seconds);
      const Plan p = plan(large, s, 2048, 8, 16, Overflow::split);
      t_large = std::min(t_large, p.seconds);
      EXPECT_GE(p.efficiency(), 0.99) << to_string(s);
    }
    std::printf("[ scaling  ] %s: 125k %.4f s, 1M %.4f s, ratio %.1f (n log n: ~9, n^2: 64)\n",
                std::string(to_string(s)).c_str(), t_small, t_large, t_large / t_small);
    EXPECT_LT(t_large / t_small, 32.0) << to_string(s);
  }
}

// The brute-force alternative to the fast path: 16M lengths expanded and
// packed one by one. Memory-heavy (about 1 GB), so off by default; run with
// --gtest_also_run_disabled_tests to measure it.
TEST(PackingTimings, DISABLED_SixteenMillionExpandedFfdAndBfd) {
  LengthSpec spec;
  spec.kind = LengthSpec::Kind::file_histogram;
  spec.histogram = lognormal_histogram(256, 1.0, 4 * 2048, 16e6);
  const auto lengths = generate_lengths(spec, 0, 5);
  for (const Strategy s : {Strategy::pack_ffd, Strategy::pack_bfd}) {
    const Plan p = plan(lengths, s, 2048, 1, 1, Overflow::split);
    std::printf("[ timings  ] 16M expanded %s: %.3f s, %zu rows, efficiency %.5f\n",
                std::string(to_string(s)).c_str(), p.seconds, p.rows.size(), p.efficiency());
    EXPECT_LT(p.seconds, 20.0);
  }
}

}  // namespace
}  // namespace sb::packing
