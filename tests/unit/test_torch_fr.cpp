// PyTorch Flight Recorder dumps: the strict pickle reader (every opcode of
// the subset, the memo's sharing, refusals with their offsets, every
// truncation and thousands of byte mutations of a real dump), and the
// analysis on hand-made dumps of each kind. The real dumps' verdicts are
// checked end to end by tests/scenario/test_torch_fr.py.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "harness/errors.hpp"
#include "readers/pickle.hpp"
#include "diagnose/hang/torch_fr_analysis.hpp"

namespace sb {
namespace {

using json = nlohmann::ordered_json;

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s.push_back(char(x));
  return s;
}
std::string binunicode(const std::string& s) {
  std::string out = "X";
  const auto n = std::uint32_t(s.size());
  for (int k = 0; k < 4; ++k) out.push_back(char((n >> (8 * k)) & 0xFF));
  return out + s;
}

TEST(PickleRead, TheSubsetAndTheMemoShareContainers) {
  // {'a': [1, -2, 300, 2**40, None, True, False, 1.5, ('x', 'y')], 'b': <the same list>, 7: 'seven'}
  std::string p = bytes({0x80, 2, '}'});
  p += "q" + bytes({0});                       // memo 0: the dict
  p += "(" + binunicode("a");
  p += "]" + std::string("q") + bytes({1});    // memo 1: the list, still empty
  p += "(" + bytes({'K', 1}) + bytes({'J', 0xFE, 0xFF, 0xFF, 0xFF}) + bytes({'M', 0x2C, 0x01});
  p += bytes({0x8a, 6, 0, 0, 0, 0, 0, 1});     // LONG1 2**40
  p += "N" + bytes({0x88, 0x89});
  p += bytes({'G', 0x3F, 0xF8, 0, 0, 0, 0, 0, 0});  // 1.5 big-endian
  p += binunicode("x") + binunicode("y") + bytes({0x86});
  p += "e";                                    // APPENDS fills the memoized list
  p += binunicode("b") + "h" + bytes({1});     // BINGET: the same (now full) list
  p += bytes({'K', 7}) + binunicode("seven");
  p += "u.";
  const json j = read_pickle(p, "t");
  EXPECT_EQ(j["a"], json::parse(R"([1, -2, 300, 1099511627776, null, true, false, 1.5, ["x", "y"]])"));
  EXPECT_EQ(j["b"], j["a"]);
  EXPECT_EQ(j["7"], "seven");
}

TEST(PickleRead, TorchIdentityGlobalsAndNothingElse) {
  std::string ok = bytes({0x80, 2}) + "ctorch.jit._pickle\nbuild_intlist\n(" + "]" + "(" + bytes({'K', 3}) + "e" +
                   "tR.";
  EXPECT_EQ(read_pickle(ok, "t"), json::parse("[3]"));
  const std::string evil = bytes({0x80, 2}) + "cos\nsystem\n(" + binunicode("true") + "tR.";
  try {
    read_pickle(evil, "dump");
    FAIL() << "os.system accepted";
  } catch (const UsageError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("os.system refused"), std::string::npos) << m;
    EXPECT_NE(m.find("at offset 2"), std::string::npos) << m;
  }
  // An opcode outside the subset names itself and its offset.
  try {
    read_pickle(bytes({0x80, 2, 'B', 0, 0, 0, 0, '.'}), "dump");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("opcode 0x42 ('B')"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("offset 2"), std::string::npos) << e.what();
  }
}

TEST(PickleRead, HostileShapesAreUsageErrors) {
  const std::vector<std::string> bad = {
      "",                                                     // empty
      bytes({'{', '}'}),                                      // JSON, not a pickle
      bytes({0x80, 2}),                                       // no STOP
      bytes({0x80, 2, 'X', 0xFF, 0xFF, 0xFF, 0x7F, 'a'}),     // a string past the end
      bytes({0x80, 2, 'h', 9, '.'}),                          // memo never stored
      bytes({0x80, 2, 'N', 'N', '.'}),                        // two values at STOP
      bytes({0x80, 2, 'u', '.'}),                             // SETITEMS without MARK
      bytes({0x80, 2, 'X', 2, 0, 0, 0, 0xC0, 0x80, '.'}),     // overlong UTF-8
      bytes({0x80, 2, 0x8a, 9, 1, 1, 1, 1, 1, 1, 1, 1, 1, '.'}),  // a 72-bit integer
      bytes({0x80, 2, ']', 'q', 0, 'h', 0, 'a', '.'}),        // a list that holds itself
  };
  for (const auto& b : bad) EXPECT_THROW(read_pickle(b, "t"), UsageError) << testing::PrintToString(b);
  // Deep nesting stops at the limit instead of the stack's end.
  std::string deep = bytes({0x80, 2});
  for (int i = 0; i < 10000; ++i) deep += "]";
  for (int i = 0; i < 9999; ++i) deep += "a";
  deep += ".";
  EXPECT_THROW(read_pickle(deep, "t"), UsageError);
}

// A list filled one APPEND at a time (a chunk each) reads whole, in order.
TEST(PickleRead, AListOfManySmallAppendsReadsWhole) {
  std::string p = bytes({0x80, 2, ']'});
  for (int i = 0; i < 50000; ++i) p += bytes({'K', i % 256, 'a'});
  p += ".";
  const json j = read_pickle(p, "t");
  ASSERT_EQ(j.size(), 50000u);
  EXPECT_EQ(j[49999], 49999 % 256);
  EXPECT_EQ(j[256], 0);
}

// Records read by a fixed list of keys: a key string memoized once and
// fetched by later records is the same value; absent names, keys that are
// no string, and a repeated key (its last value, as Python reads it).
TEST(PickleRead, KeysAreResolvedOncePerKeyValue) {
  // [{'a': 1, 'b': 2, 7: 3}, {<memo 0: 'a'>: 4, 'c': 5}, {'a': 6, 'a': 8}]
  std::string p = bytes({0x80, 2, ']', '(', '}', '('});
  p += binunicode("a") + bytes({'q', 0, 'K', 1}) + binunicode("b") + bytes({'K', 2, 'K', 7, 'K', 3, 'u'});
  p += bytes({'}', '(', 'h', 0, 'K', 4}) + binunicode("c") + bytes({'K', 5, 'u'});
  p += bytes({'}', '(', 'h', 0, 'K', 6}) + binunicode("a") + bytes({'K', 8, 'u'});
  p += "e.";
  const PickleDoc doc(p, "t");
  constexpr std::string_view names[] = {"a", "b", "z"};
  const PickleKeys keys(doc, names, std::size(names));
  std::uint32_t out[3];
  auto value = [&](std::uint32_t id) { return PickleDoc::Ref(&doc, id).integer(); };
  keys.read(doc.root().at(0), out);
  EXPECT_EQ(value(out[0]), 1);
  EXPECT_EQ(value(out[1]), 2);
  EXPECT_EQ(out[2], PickleKeys::kAbsent);
  keys.read(doc.root().at(1), out);
  EXPECT_EQ(value(out[0]), 4);
  EXPECT_EQ(out[1], PickleKeys::kAbsent);
  keys.read(doc.root().at(2), out);
  EXPECT_EQ(value(out[0]), 8);
  keys.read(doc.root(), out);  // a list: nothing
  EXPECT_EQ(out[0], PickleKeys::kAbsent);
}

// One scratch serves document after document, whether one failed between
// them or not: each reads as it does parsed in fresh storage.
TEST(PickleRead, AScratchIsReusedFromDocumentToDocument) {
  const std::string dir = std::string(SB_TEST_DATA) + "/fr/op-3r";
  ASSERT_TRUE(std::filesystem::exists(dir + "/rank_0")) << dir << "/rank_0 is missing from the tree";
  std::vector<std::string> docs;
  for (const char* f : {"/rank_0", "/rank_1", "/rank_2"}) {
    std::ifstream in(dir + f, std::ios::binary);
    docs.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  PickleScratch scratch;
  for (int round = 0; round < 2; ++round)
    for (const auto& b : docs) {
      EXPECT_EQ(PickleDoc(b, "t", &scratch).to_json(), read_pickle(b, "t"));
      // the storage came back to the scratch, and the same document parses into the same buffer again
      ASSERT_GT(scratch.nodes.capacity(), 0u);
      const auto* nodes = scratch.nodes.data();
      { const PickleDoc again(b, "t", &scratch); }
      EXPECT_EQ(scratch.nodes.data(), nodes) << "the scratch's node storage was not reused";
      EXPECT_THROW(PickleDoc(b.substr(0, b.size() / 2), "t", &scratch), UsageError);
      EXPECT_EQ(scratch.nodes.data(), nodes) << "a document that threw kept the scratch's storage";
      {
        const PickleDoc outer(b, "t", &scratch);
        const PickleDoc inner(docs[0], "t", &scratch);  // nested: the inner one gets storage of its own
        EXPECT_EQ(inner.to_json(), read_pickle(docs[0], "t"));
        EXPECT_EQ(outer.to_json(), read_pickle(b, "t"));
      }
    }
}

// One entry dict, memoized, standing in a thousand places, each holding
// 4096 references to one 16-int list: a few KB that would copy into GBs.
TEST(TorchFrRead, SharedValuesCannotExpandPastTheFileSize) {
  std::string p = bytes({0x80, 2, '}'}) + "(" + binunicode("version") + binunicode("2.10") + binunicode("entries");
  p += "]" + std::string("(");  // the entries list, then its items
  // the entry dict
  p += "}" + std::string("q") + bytes({0}) + "(";
  for (const char* k : {"record_id", "collective_seq_id", "time_created_ns"}) p += binunicode(k) + bytes({'K', 1});
  p += binunicode("profiling_name") + binunicode("nccl:all_reduce") + binunicode("state") + binunicode("completed");
  p += binunicode("input_dtypes") + "]" + binunicode("output_dtypes") + "]" + binunicode("output_sizes") + "]";
  p += binunicode("input_sizes") + "](";
  p += "]" + std::string("q") + bytes({1}) + "(";  // the 16-int list, memo 1
  for (int k = 0; k < 16; ++k) p += bytes({'K', 2});
  p += "e";
  for (int k = 1; k < 4096; ++k) p += "h" + bytes({1});
  p += "e";   // input_sizes filled
  p += "u";   // the entry dict filled
  for (int k = 1; k < 1000; ++k) p += "h" + bytes({0});
  p += "e";   // entries filled
  p += "u.";  // the root
  ASSERT_LT(p.size(), 20000u);
  try {
    read_torch_fr_file("d/rank_0", p);
    FAIL() << "a " << p.size() << "-byte dump was expanded";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("expand"), std::string::npos) << e.what();
  }
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Every prefix of a real dump, and every byte of it replaced by three other
// values: a report or a UsageError each time, never a crash or a hang (the
// ASan build in CI runs this too).
TEST(PickleRead, EveryTruncationAndMutationOfARealDump) {
  const std::string dir = std::string(SB_TEST_DATA) + "/fr/healthy-2r";
  // The dump is committed test data: its absence is a failure, not a skip.
  ASSERT_TRUE(std::filesystem::exists(dir + "/rank_0")) << dir << "/rank_0 is missing from the tree";
  const std::string real = slurp(dir + "/rank_0");
  ASSERT_TRUE(looks_like_pickle(real));
  ASSERT_NO_THROW(read_torch_fr_file("d/rank_0", real));
  int refused = 0, read = 0;
  auto attempt = [&](const std::string& b) {
    try {
      const TorchFrDump d = read_torch_fr_file("d/rank_0", b);
      (void)analyze_torch_fr({d});
      ++read;
    } catch (const UsageError&) {
      ++refused;
    }
  };
  for (std::size_t n = 0; n < real.size(); ++n) attempt(real.substr(0, n));
  EXPECT_EQ(read, 0) << "a truncated dump was read as whole";
  for (std::size_t i = 2; i < real.size(); ++i)
    for (unsigned char v : {0x00, 0xFF, 0x2E}) {
      std::string m = real;
      if (static_cast<unsigned char>(m[i]) == v) continue;
      m[i] = char(v);
      attempt(m);
    }
  EXPECT_GT(refused + read, int(3 * real.size()));
}

// ---- the analysis on hand-made dumps ----

TorchFrEntry entry(std::int64_t seq, const std::string& op, std::int64_t n, const std::string& dtype = "Float",
                   const std::string& state = "completed") {
  TorchFrEntry e;
  e.pg_name = "0";
  e.collective_seq_id = seq;
  e.profiling_name = "nccl:" + op;
  e.input_sizes = {{n}};
  e.output_sizes = {{op == "all_gather" ? 2 * n : n}};
  e.input_dtypes = e.output_dtypes = {dtype};
  e.state = state;
  e.time_created_ns = 1000000 * seq;
  e.frames = {"train (train.py:42)"};
  return e;
}

TorchFrDump dump(int rank, int world, std::vector<TorchFrEntry> es) {
  TorchFrDump d;
  d.rank = rank;
  d.path = "rank_" + std::to_string(rank);
  TorchFrDump::Group g{"0", "default_pg", {}};
  for (int k = 0; k < world; ++k) g.ranks.push_back(k);
  d.groups = {g};
  d.entries = std::move(es);
  return d;
}

TEST(TorchFrAnalysis, EachKindNamesSeqAndCulprit) {
  auto healthy = [](int r) {
    (void)r;
    return std::vector<TorchFrEntry>{entry(1, "all_reduce", 16), entry(2, "broadcast", 8)};
  };
  {  // missing: rank 2 never issued seq 3
    std::vector<TorchFrDump> ds;
    for (int r = 0; r < 3; ++r) {
      auto es = healthy(r);
      if (r != 2) es.push_back(entry(3, "all_reduce", 16, "Float", "started"));
      ds.push_back(dump(r, 3, es));
    }
    const HangReport rep = analyze_torch_fr(ds);
    EXPECT_EQ(rep.kind, DivergenceKind::missing);
    EXPECT_EQ(rep.seq, 3);
    EXPECT_EQ(rep.culprits, std::vector<int>{2});
    EXPECT_EQ(rep.last_all_completed_seq, 2);
  }
  {  // skip: rank 1 issues at seq 3 what the others issue at seq 4
    std::vector<TorchFrDump> ds;
    for (int r = 0; r < 3; ++r) {
      auto es = healthy(r);
      if (r == 1) {
        es.push_back(entry(3, "all_gather", 4, "Float", "started"));
      } else {
        es.push_back(entry(3, "all_reduce", 16, "Float", "started"));
        es.push_back(entry(4, "all_gather", 4, "Float", "scheduled"));
      }
      ds.push_back(dump(r, 3, es));
    }
    const HangReport rep = analyze_torch_fr(ds);
    EXPECT_EQ(rep.kind, DivergenceKind::op);
    EXPECT_EQ(rep.seq, 3);
    EXPECT_EQ(rep.culprits, std::vector<int>{1});
    EXPECT_EQ(rep.pattern, "skip");
    EXPECT_EQ(rep.torch_match_state, "COLLECTIVE_TYPE_MISMATCH");
    EXPECT_EQ(rep.culprit_frames, std::vector<std::string>{"train (train.py:42)"});
  }
  {  // count, dtype, state on 4 ranks; rank 3 the odd one
    struct Case {
      TorchFrEntry odd;
      DivergenceKind kind;
    };
    for (const Case& c : {Case{entry(3, "all_reduce", 8), DivergenceKind::count},
                          Case{entry(3, "all_reduce", 16, "Double"), DivergenceKind::dtype},
                          Case{entry(3, "all_reduce", 16, "Float", "scheduled"), DivergenceKind::state}}) {
      std::vector<TorchFrDump> ds;
      for (int r = 0; r < 4; ++r) {
        auto es = healthy(r);
        es.push_back(r == 3 ? c.odd : entry(3, "all_reduce", 16));
        ds.push_back(dump(r, 4, es));
      }
      const HangReport rep = analyze_torch_fr(ds);
      EXPECT_EQ(rep.kind, c.kind) << to_string(c.kind);
      EXPECT_EQ(rep.seq, 3);
      EXPECT_EQ(rep.culprits, std::vector<int>{3}) << to_string(c.kind);
    }
  }
  {  // an all-gather whose output is not group size x input on one rank
    std::vector<TorchFrDump> ds;
    for (int r = 0; r < 2; ++r) {
      TorchFrEntry e = entry(1, "all_gather", 4);
      if (r == 1) e.output_sizes = {{12}};
      ds.push_back(dump(r, 2, {e}));
    }
    const HangReport rep = analyze_torch_fr(ds);
    EXPECT_EQ(rep.kind, DivergenceKind::count);
    EXPECT_EQ(rep.culprits, std::vector<int>{1});
  }
  {  // a call not retired on a rank whose later call is: calls complete in order, so it did
    std::vector<TorchFrDump> ds;
    for (int r = 0; r < 3; ++r) {
      auto es = healthy(r);
      es.push_back(entry(3, "all_reduce", 16, "Float", r == 0 ? "scheduled" : "completed"));
      es.push_back(entry(4, "all_reduce", 16));
      ds.push_back(dump(r, 3, es));
    }
    EXPECT_EQ(analyze_torch_fr(ds).kind, DivergenceKind::none);
  }
  {  // the culprit's dump is lost and every other rank waits in seq 3: it is the one they wait for
    std::vector<TorchFrDump> ds;
    for (int r = 0; r < 2; ++r) {
      auto es = healthy(r);
      es.push_back(entry(3, "all_reduce", 16, "Float", "scheduled"));
      ds.push_back(dump(r, 3, es));
    }
    const HangReport rep = analyze_torch_fr(ds);
    EXPECT_EQ(rep.kind, DivergenceKind::missing);
    EXPECT_EQ(rep.pattern, "no dump");
    EXPECT_EQ(rep.seq, 3);
    EXPECT_EQ(rep.culprits, std::vector<int>{2});
    // a suspect, not a proven culprit: two dumps agree (high), with the evidence and what settles it
    EXPECT_EQ(rep.confidence, "high");
    ASSERT_GE(rep.evidence.size(), 3u);
    EXPECT_NE(rep.evidence[0].find("2 of the 3 ranks of process group 0 wrote a dump; each waits in collective seq 3"),
              std::string::npos) << rep.evidence[0];
    EXPECT_NE(rep.evidence[1].find("rank 0: seq 3 enqueued, not started, since 1970-01-01 00:00:00.003 UTC"),
              std::string::npos) << rep.evidence[1];
    ASSERT_FALSE(rep.decides.empty());
    EXPECT_NE(rep.decides[0].find("rank 2's own log"), std::string::npos) << rep.decides[0];
    const std::string text = format_hang_report(rep);
    EXPECT_NE(text.find("; suspect 2 (high confidence: no dump from it)"), std::string::npos) << text;
    EXPECT_NE(text.find("what decides it:"), std::string::npos) << text;
    EXPECT_EQ(to_json(rep)["suspect"]["ranks"], nlohmann::ordered_json::array({2}));
  }
  {  // one dump only: nothing confirms its view (medium); the two missing ranks are the suspects
    auto es = healthy(0);
    es.push_back(entry(3, "all_reduce", 16, "Float", "started"));
    const HangReport rep = analyze_torch_fr({dump(0, 3, es)});
    EXPECT_EQ(rep.pattern, "no dump");
    EXPECT_EQ(rep.culprits, (std::vector<int>{1, 2}));
    EXPECT_EQ(rep.confidence, "medium");
    EXPECT_NE(rep.evidence[1].find("started, in progress"), std::string::npos) << rep.evidence[1];
  }
  {  // the dumps wait in a group of ranks 0 and 1 only: rank 2's missing dump is not what they wait for
    std::vector<TorchFrDump> ds;
    for (int r = 0; r < 2; ++r) {
      auto es = healthy(r);
      es.push_back(entry(3, "all_reduce", 16, "Float", "scheduled"));
      for (auto& e : es) e.pg_name = "1";
      TorchFrDump d = dump(r, 3, es);
      d.groups.push_back({"1", "pair", {0, 1}});
      ds.push_back(std::move(d));
    }
    const HangReport rep = analyze_torch_fr(ds);
    EXPECT_EQ(rep.ranks_missing, std::vector<int>{2});
    EXPECT_TRUE(rep.culprits.empty()) << format_hang_report(rep);
    EXPECT_TRUE(rep.confidence.empty());
  }
  {  // a dtype split evenly: the side using a dtype its own history never used
    std::vector<TorchFrDump> ds;
    for (int r : {1, 2}) {
      auto es = healthy(r);
      es.push_back(entry(3, "all_reduce", 16, r == 1 ? "Double" : "Float"));
      ds.push_back(dump(r, 3, es));
    }
    const HangReport rep = analyze_torch_fr(ds);
    EXPECT_EQ(rep.kind, DivergenceKind::dtype);
    EXPECT_EQ(rep.culprits, std::vector<int>{1});
  }
  {  // an all-gather checked against the whole group even when a dump is missing
    std::vector<TorchFrDump> ds;
    for (int r : {0, 2}) ds.push_back(dump(r, 3, {entry(1, "all_gather", 4)}));
    for (auto& d : ds) d.entries[0].output_sizes = {{3, 4}};
    EXPECT_EQ(analyze_torch_fr(ds).kind, DivergenceKind::none);
  }
  {  // a rank's dump file is missing: named, and the rest still analysed
    std::vector<TorchFrDump> ds;
    for (int r : {0, 1, 3}) ds.push_back(dump(r, 4, healthy(r)));
    const HangReport rep = analyze_torch_fr(ds);
    EXPECT_EQ(rep.ranks_missing, std::vector<int>{2});
    EXPECT_EQ(rep.kind, DivergenceKind::none);
    EXPECT_NE(rep.summary.find("no dump from rank 2"), std::string::npos) << rep.summary;
  }
}

// A dump's entries with equal sizes and dtypes share one copy of them; the
// values compare equal whether shared or not.
TEST(TorchFrRead, EntriesShareEqualSizesAndDtypes) {
  const std::string dir = std::string(SB_TEST_DATA) + "/fr/healthy-2r";
  ASSERT_TRUE(std::filesystem::exists(dir + "/rank_0")) << dir << "/rank_0 is missing from the tree";
  const TorchFrDump d = read_torch_fr_file("d/rank_0", slurp(dir + "/rank_0"));
  ASSERT_GE(d.entries.size(), 5u);
  // Seqs 1 and 5 are broadcasts of [4] Float (tests/data/fr/make_dumps.py).
  EXPECT_EQ(&d.entries[0].input_sizes.get(), &d.entries[4].input_sizes.get());
  EXPECT_EQ(&d.entries[0].input_dtypes.get(), &d.entries[4].output_dtypes.get());
  EXPECT_EQ(d.entries[0].input_sizes, TorchFrSizes({{4}}));
  EXPECT_NE(d.entries[0].input_sizes, TorchFrSizes({{4, 1}}));
  EXPECT_EQ(TorchFrSizes(), TorchFrSizes(std::vector<std::vector<std::int64_t>>{}));
  EXPECT_TRUE(TorchFrDtypes().empty());
  EXPECT_EQ(TorchFrDtypes({"Float"})[0], "Float");
}

// A dump's entries need not be in seq order, and a seq written twice is
// read as its later entry, whatever order the dump holds them in.
TEST(TorchFrAnalysis, EntryOrderAndRepeatedSeqs) {
  auto job = [](auto edit) {
    std::vector<TorchFrDump> ds;
    for (int r = 0; r < 3; ++r) {
      std::vector<TorchFrEntry> es = {entry(1, "all_reduce", 16), entry(2, "broadcast", 8),
                                      entry(3, "all_reduce", 16, "Float", "started")};
      edit(r, es);
      ds.push_back(dump(r, 3, es));
    }
    return analyze_torch_fr(ds);
  };
  EXPECT_EQ(job([](int r, auto& es) { if (r == 1) std::reverse(es.begin(), es.end()); }).kind, DivergenceKind::none);
  // Rank 2 wrote seq 3 twice: first an all-gather, then the all-reduce the others issued.
  EXPECT_EQ(job([](int r, auto& es) {
              if (r == 2) es.insert(es.end() - 1, entry(3, "all_gather", 16, "Float", "started"));
            }).kind,
            DivergenceKind::none);
  const HangReport rep = job([](int r, auto& es) {
    if (r == 2) es.push_back(entry(3, "all_gather", 16, "Float", "started"));
  });
  EXPECT_EQ(rep.kind, DivergenceKind::op);
  EXPECT_EQ(rep.seq, 3);
  EXPECT_EQ(rep.culprits, std::vector<int>{2});
}

// The ops whose sizes differ by rank in a healthy job, as fr_trace's Op.match reads them: an uneven
// all-to-all (a mixture of experts' token dispatch: only the group's totals must agree), gather's output
// and scatter's input (the root's alone), broadcast's input dtypes. And an output that differs is a size
// mismatch (only inputs were compared).
TEST(TorchFrAnalysis, SizesThatDifferByRankInAHealthyJob) {
  auto two = [](TorchFrEntry a, TorchFrEntry b) {
    return analyze_torch_fr({dump(0, 2, {entry(1, "all_reduce", 16), a}), dump(1, 2, {entry(1, "all_reduce", 16), b})});
  };
  auto sized = [](const std::string& op, std::vector<std::vector<std::int64_t>> in,
                  std::vector<std::vector<std::int64_t>> out) {
    TorchFrEntry e = entry(2, op, 1);
    e.input_sizes = std::move(in);
    e.output_sizes = std::move(out);
    e.input_dtypes = std::vector<std::string>(e.input_sizes.get().size(), "Float");
    e.output_dtypes = std::vector<std::string>(e.output_sizes.get().size(), "Float");
    return e;
  };
  // all-to-all: rank 0 sends 5 rows and receives 7, rank 1 sends 7 and receives 5
  EXPECT_EQ(two(sized("all_to_all", {{5, 16}}, {{7, 16}}), sized("all_to_all", {{7, 16}}, {{5, 16}})).kind,
            DivergenceKind::none);
  // ... but a group that sends more than it receives has a wrong size somewhere
  const HangReport a2a = two(sized("all_to_all", {{5, 16}}, {{7, 16}}), sized("all_to_all", {{8, 16}}, {{5, 16}}));
  EXPECT_EQ(a2a.kind, DivergenceKind::count);
  EXPECT_EQ(a2a.seq, 2);
  // gather: the root's output, no output elsewhere; scatter: the root's input, none elsewhere
  EXPECT_EQ(two(sized("gather", {{16}}, {{32}}), sized("gather", {{16}}, {})).kind, DivergenceKind::none);
  EXPECT_EQ(two(sized("scatter", {{32}}, {{16}}), sized("scatter", {}, {{16}})).kind, DivergenceKind::none);
  // a gather whose ranks send different sizes is still a size mismatch
  EXPECT_EQ(two(sized("gather", {{16}}, {{32}}), sized("gather", {{8}}, {})).kind, DivergenceKind::count);
  // broadcast: equal inputs, a different output on rank 1
  const HangReport out = two(sized("broadcast", {{16}}, {{16}}), sized("broadcast", {{16}}, {{17}}));
  EXPECT_EQ(out.kind, DivergenceKind::count);
  EXPECT_EQ(out.culprits, std::vector<int>{1});  // a tie of two: the side that differs from the lowest rank
}

// The state verdict is stallbench's (a retired entry, or a later completed call, counts as done: gloo
// records every entry as scheduled); the label of what fr_trace would say compares the state strings
// alone, as fr_trace does. The last call every rank completed is before the divergence, even when the
// divergent call was retired (gloo retires a call that timed out).
TEST(TorchFrAnalysis, StateAsFrTraceReadsItAndTheLastCompletedCall) {
  TorchFrEntry r0 = entry(2, "all_reduce", 16, "Float", "scheduled"), r1 = r0;
  r0.retired = true;
  const HangReport same_strings = analyze_torch_fr(
      {dump(0, 2, {entry(1, "all_reduce", 16), r0}), dump(1, 2, {entry(1, "all_reduce", 16), r1})});
  EXPECT_EQ(same_strings.kind, DivergenceKind::state);
  EXPECT_EQ(same_strings.culprits, std::vector<int>{1});
  EXPECT_EQ(same_strings.torch_match_state.rfind("FULLY_MATCHED at this seq", 0), 0u) << same_strings.torch_match_state;
  const HangReport differ = analyze_torch_fr({dump(0, 2, {entry(1, "all_reduce", 16), entry(2, "all_reduce", 16)}),
                                              dump(1, 2, {entry(1, "all_reduce", 16),
                                                          entry(2, "all_reduce", 16, "Float", "started")})});
  EXPECT_EQ(differ.kind, DivergenceKind::state);
  EXPECT_EQ(differ.torch_match_state, "COLLECTIVE_STATE_MISMATCH");

  TorchFrEntry a = entry(2, "all_reduce", 16, "Float", "scheduled"), g = entry(2, "all_gather", 16, "Float", "scheduled");
  a.retired = g.retired = true;
  const HangReport op = analyze_torch_fr({dump(0, 2, {entry(1, "broadcast", 8), a}), dump(1, 2, {entry(1, "broadcast", 8), g})});
  EXPECT_EQ(op.kind, DivergenceKind::op);
  EXPECT_EQ(op.seq, 2);
  EXPECT_EQ(op.last_all_completed_seq, 1);  // not the divergent seq 2
  EXPECT_NE(op.last_all_completed.find("broadcast"), std::string::npos) << op.last_all_completed;
}

// A format 1.x dump (PyTorch 2.2-2.3) names the seq seq_id: read as collective_seq_id. Without either,
// every entry would read as seq 0: refused, naming the file.
TEST(TorchFrRead, AnOlderDumpsSeqIdAndADumpWithoutOne) {
  auto doc = [](const std::string& seq_key) {
    nlohmann::ordered_json j = {{"version", "1.4"}, {"pg_config", nlohmann::ordered_json::object()}};
    for (int k = 1; k <= 3; ++k) {
      nlohmann::ordered_json e = {{"record_id", k}, {"pg_id", 0}, {"profiling_name", "nccl:all_reduce"},
                                  {"time_created_ns", 1000 * k}, {"input_sizes", {{16}}}, {"input_dtypes", {"Float"}},
                                  {"output_sizes", {{16}}}, {"output_dtypes", {"Float"}}, {"state", "completed"}};
      if (!seq_key.empty()) e[seq_key] = k;
      j["entries"].push_back(e);
    }
    return j;
  };
  const TorchFrDump d = torch_fr_from_json(doc("seq_id"), "rank_0.json", 0);
  ASSERT_EQ(d.entries.size(), 3u);
  EXPECT_EQ(d.entries[2].collective_seq_id, 3);
  try {
    (void)torch_fr_from_json(doc(""), "rank_1.json", 1);
    FAIL() << "a dump without any seq was read";
  } catch (const sb::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("rank_1.json: entry 0 has neither collective_seq_id nor seq_id"),
              std::string::npos) << e.what();
  }
}

// A group pg_config does not list (gloo keys every group's config by "") is not the whole job: a healthy
// new_group([0, 1]) beside ranks 2 and 3 read as "ranks 2, 3 never joined". And PyTorch's JSON writer
// leaves "entries" out when there are none: a dump with no entries, not "no dump".
TEST(TorchFrAnalysis, AnUnlistedSubgroupAndADumpWithoutEntries) {
  std::vector<TorchFrDump> ds;
  for (int r = 0; r < 4; ++r) {
    std::vector<TorchFrEntry> es = {entry(1, "all_reduce", 16)};
    if (r < 2) {
      TorchFrEntry sub = entry(1, "broadcast", 8);
      sub.pg_name = "1";
      es.push_back(sub);
    }
    ds.push_back(dump(r, 4, es));
  }
  const HangReport rep = analyze_torch_fr(ds);
  EXPECT_EQ(rep.kind, DivergenceKind::none) << rep.summary;

  nlohmann::ordered_json j = {{"version", "2.10"},
                              {"pg_config", {{"0", {{"name", "0"}, {"desc", "default_pg"}, {"ranks", "[0, 1]"}}}}},
                              {"pg_status", {{"0", {{"last_enqueued_collective", -1}}}}}};
  EXPECT_TRUE(is_torch_fr_json(j));
  const TorchFrDump empty = torch_fr_from_json(j, "rank_1.json", 1);
  EXPECT_TRUE(empty.entries.empty());
  EXPECT_FALSE(is_torch_fr_json(nlohmann::ordered_json{{"version", "2.10"}}));  // nothing says it is a dump
}

// Several process groups: the divergence reported is the one made first, not the first group by name.
// Rank 3 skips its call in subgroup "2" = [2, 3] and goes on to the world group's seq 2, where ranks 0
// and 1 wait too, and rank 2 never arrives (it waits in group "2" for rank 3): the cause is rank 3's skip.
// The rank table counts each rank's seqs in that group.
TEST(TorchFrAnalysis, TheEarliestDivergenceOfSeveralGroups) {
  std::vector<TorchFrDump> ds;
  for (int r = 0; r < 4; ++r) {
    std::vector<TorchFrEntry> es = {entry(1, "all_reduce", 16)};
    TorchFrEntry sub = entry(1, "broadcast", 8, "Float", "started");
    sub.time_created_ns = 2000000;
    TorchFrEntry world2 = entry(2, "all_reduce", 16, "Float", "started");
    world2.time_created_ns = 3000000;
    if (r >= 2) {
      sub.pg_name = "2";
      if (r == 2) es.push_back(sub);  // rank 3 skips it
    } else {
      sub.pg_name = "1";
      sub.state = "completed";
      es.push_back(sub);
    }
    if (r != 2) es.push_back(world2);  // rank 2 is stuck in group "2"
    TorchFrDump d = dump(r, 4, es);
    d.groups.push_back({"1", "", {0, 1}});
    d.groups.push_back({"2", "", {2, 3}});
    ds.push_back(d);
  }
  const HangReport rep = analyze_torch_fr(ds);
  EXPECT_EQ(rep.kind, DivergenceKind::missing);
  EXPECT_EQ(rep.process_group, "2");
  EXPECT_EQ(rep.seq, 1);
  EXPECT_EQ(rep.culprits, std::vector<int>{3});
  EXPECT_EQ(rep.last_enqueued[3], -1);  // rank 3 never issued a call in group "2" (its world seq 2 is not it)
  EXPECT_EQ(rep.last_enqueued[2], 1);
}

// A coalesced group: its ops, then the "coalesced" marker (no sizes), all at one seq. The group is
// compared op by op, as fr_trace's match_coalesced_groups does (only the marker was kept: every
// coalesced group matched).
TEST(TorchFrAnalysis, ACoalescedGroupIsComparedOpByOp) {
  auto group = [](const std::string& second_dtype, bool both = true) {
    std::vector<TorchFrEntry> es = {entry(1, "all_reduce", 16), entry(2, "all_reduce", 16)};
    if (both) es.push_back(entry(2, "all_reduce", 8, second_dtype));
    TorchFrEntry marker = entry(2, "coalesced", 0);
    marker.input_sizes = {};
    marker.output_sizes = {};
    marker.input_dtypes = marker.output_dtypes = std::vector<std::string>{};
    es.push_back(marker);
    return es;
  };
  EXPECT_EQ(analyze_torch_fr({dump(0, 2, group("Float")), dump(1, 2, group("Float"))}).kind, DivergenceKind::none);
  const HangReport dt = analyze_torch_fr({dump(0, 2, group("Float")), dump(1, 2, group("Double"))});
  EXPECT_EQ(dt.kind, DivergenceKind::dtype);
  EXPECT_EQ(dt.seq, 2);
  const HangReport one = analyze_torch_fr({dump(0, 2, group("Float")), dump(1, 2, group("Float", false))});
  EXPECT_EQ(one.kind, DivergenceKind::op);  // one op where the others coalesced two
  EXPECT_EQ(one.seq, 2);
}

// torch's split_group: one name, two rank sets ("5" is [0, 1] on ranks 0 and 1, [2, 3] on ranks 2 and
// 3): two groups. Rank 3 issues a broadcast where rank 2 issues the all-reduce: found in "5 [2, 3]" (the
// groups were merged by name, the first set kept, and ranks 2 and 3 were no members of it: none found).
TEST(TorchFrAnalysis, OneNameTwoRankSetsAreTwoGroups) {
  std::vector<TorchFrDump> ds;
  for (int r = 0; r < 4; ++r) {
    TorchFrEntry sub = entry(1, r == 3 ? "broadcast" : "all_reduce", 16, "Float", "started");
    sub.pg_name = "5";
    TorchFrDump d = dump(r, 4, {entry(1, "all_reduce", 16), sub});
    d.groups.push_back({"5", "", r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}});
    ds.push_back(d);
  }
  const HangReport rep = analyze_torch_fr(ds);
  EXPECT_EQ(rep.kind, DivergenceKind::op);
  EXPECT_EQ(rep.process_group, "5 [2, 3]");
  EXPECT_EQ(rep.culprits, std::vector<int>{3});
}

// ---- point-to-point calls: matched by peer and per-pair order ----

// A send ("send ME->PEER") or recv ("recv ME<-PEER") as ProcessGroupNCCL records it: collective_seq_id
// the group's last collective, p2p_seq_id the rank's own count of p2p calls in the group.
TorchFrEntry p2p(bool send, int me, int peer, std::int64_t cseq, std::int64_t pseq, std::int64_t n,
                 const std::string& dtype = "Float", std::int64_t t = 0) {
  TorchFrEntry e = entry(cseq, "", n, dtype);
  e.profiling_name = fmt::format("nccl:{} {}{}{}", send ? "send" : "recv", me, send ? "->" : "<-",
                                 peer < 0 ? std::string("?") : std::to_string(peer));
  e.is_p2p = true;
  e.state = "scheduled";  // NCCL's state of a call not yet run (a completed one: with_state)
  e.p2p_seq_id = pseq;
  e.time_created_ns = t ? t : 1000000 * cseq + 1000 * pseq;
  return e;
}

// The last stage never sends the gradient back (p2p-missing-2r's shape): rank 0 waits in recv from rank 1,
// which went on to the all-reduce. The collective alone says rank 0 never joined seq 2; the p2p calls say
// why, and who owes the send.
TEST(TorchFrP2p, AnUnmatchedRecvNamesTheRankThatNeverSent) {
  const HangReport rep = analyze_torch_fr(
      {dump(0, 2, {entry(1, "all_reduce", 8), p2p(true, 0, 1, 1, 1, 4), p2p(false, 0, 1, 1, 2, 4)}),
       dump(1, 2, {entry(1, "all_reduce", 8), p2p(false, 1, 0, 1, 1, 4), entry(2, "all_reduce", 8, "Float", "started")})});
  EXPECT_EQ(rep.kind, DivergenceKind::missing);
  EXPECT_EQ(rep.pattern, "p2p");
  EXPECT_EQ(rep.seq, 2);  // rank 0's recv
  EXPECT_EQ(rep.culprits, std::vector<int>{1});
  EXPECT_NE(rep.summary.find("rank 0 waits in recv from rank 1 (p2p seq 2, [4] Float); rank 1 never sent it"),
            std::string::npos) << rep.summary;
  EXPECT_NE(rep.summary.find("rank 0 never reached collective seq 2"), std::string::npos) << rep.summary;
  EXPECT_NE(rep.per_rank_call[0].find("unmatched: waits for rank 1"), std::string::npos) << rep.per_rank_call[0];
  // the table counts p2p calls: rank 0 enqueued p2p seq 2, rank 1 p2p seq 1
  EXPECT_EQ(rep.last_enqueued, (std::vector<std::int64_t>{2, 1}));
  // an unmatched send reads the same way: rank 1 owes the recv
  const HangReport send = analyze_torch_fr(
      {dump(0, 2, {p2p(true, 0, 1, 0, 1, 4), p2p(true, 0, 1, 0, 2, 4, "Float", 5)}),
       dump(1, 2, {p2p(false, 1, 0, 0, 1, 4), entry(1, "all_reduce", 8, "Float", "started")})});
  EXPECT_EQ(send.kind, DivergenceKind::missing);
  EXPECT_EQ(send.culprits, std::vector<int>{1});
  EXPECT_NE(send.summary.find("rank 0 waits in send to rank 1 (p2p seq 2"), std::string::npos) << send.summary;
}

// A pipeline of three: rank 2 skips its send to rank 1, so rank 1 never sends to rank 0 either. Rank 0 waits
// too, but on rank 1, which waits on rank 2: the culprit is where the waits end, whoever's call came first.
TEST(TorchFrP2p, WaitsAreFollowedToTheRankThatOwesTheCall) {
  for (const std::int64_t t0 : {std::int64_t(1), std::int64_t(1000000000)}) {  // rank 0's recv made first, or last
    const HangReport rep = analyze_torch_fr(
        {dump(0, 3, {p2p(true, 0, 1, 0, 1, 4), p2p(false, 0, 1, 0, 2, 4, "Float", t0)}),
         dump(1, 3, {p2p(false, 1, 0, 0, 1, 4), p2p(true, 1, 2, 0, 2, 4), p2p(false, 1, 2, 0, 3, 4, "Float", 5000)}),
         dump(2, 3, {p2p(false, 2, 1, 0, 1, 4), entry(1, "all_reduce", 8, "Float", "started")})});
    EXPECT_EQ(rep.kind, DivergenceKind::missing);
    EXPECT_EQ(rep.culprits, std::vector<int>{2});
    EXPECT_EQ(rep.seq, 3);  // rank 1's recv from rank 2
    EXPECT_NE(rep.summary.find("waiting on it in turn: rank 0 in recv from rank 1"), std::string::npos) << rep.summary;
  }
}

// A 3-stage pipeline whose last stage crashed and left no dump: rank 1's recv from rank 2 is kept (it was
// dropped, so rank 1 looked like it waited on nobody and was named for "never sending" to rank 0): the waits
// end at rank 2, which is named as the rank that left no dump.
TEST(TorchFrP2p, AWaitOnARankWithNoDumpNamesThatRank) {
  const HangReport rep = analyze_torch_fr(
      {dump(0, 3, {p2p(true, 0, 1, 0, 1, 4), p2p(false, 0, 1, 0, 2, 4, "Float", 9000)}),
       dump(1, 3, {p2p(false, 1, 0, 0, 1, 4), p2p(false, 1, 2, 0, 2, 4, "Float", 5000)})});
  EXPECT_EQ(rep.kind, DivergenceKind::missing);
  EXPECT_EQ(rep.pattern, "p2p no dump");
  EXPECT_EQ(rep.culprits, std::vector<int>{2});
  EXPECT_EQ(rep.seq, 2);  // rank 1's recv from rank 2
  EXPECT_NE(rep.summary.find("rank 2 left no dump"), std::string::npos) << rep.summary;
  EXPECT_NE(rep.summary.find("waiting on it in turn: rank 0 in recv from rank 1"), std::string::npos) << rep.summary;
}

// Both ranks receive first (p2p-deadlock-2r's shape): each waits on the other, and nothing else is wrong.
TEST(TorchFrP2p, RanksThatWaitOnEachOtherAreACycle) {
  const HangReport rep = analyze_torch_fr({dump(0, 2, {entry(1, "all_reduce", 8), p2p(false, 0, 1, 1, 1, 4)}),
                                           dump(1, 2, {entry(1, "all_reduce", 8), p2p(false, 1, 0, 1, 1, 4)})});
  EXPECT_EQ(rep.kind, DivergenceKind::missing);
  EXPECT_EQ(rep.pattern, "p2p cycle");
  EXPECT_EQ(rep.culprits, (std::vector<int>{0, 1}));
  EXPECT_EQ(rep.seq, 1);
  EXPECT_NE(rep.summary.find("ranks 0, 1 wait on each other"), std::string::npos) << rep.summary;
}

TorchFrEntry with_state(TorchFrEntry e, const std::string& state) {
  e.state = state;
  return e;
}
// A batch_isend_irecv's closing "coalesced" entry: the batch's p2p seq, no sizes.
TorchFrEntry batch_end(std::int64_t cseq, std::int64_t pseq, const std::string& state = "completed", bool is_p2p = true) {
  TorchFrEntry e = p2p(true, 0, 1, cseq, pseq, 0);
  e.profiling_name = "nccl:coalesced";
  e.input_sizes = e.output_sizes = {};
  e.input_dtypes = e.output_dtypes = std::vector<std::string>{};
  e.state = state;
  e.is_p2p = is_p2p;
  return e;
}

// NCCL runs a pair's plain sends and recvs in issue order on one queue (the pair's own communicator): both
// ranks receiving first (irecv, then isend, each) hang though every call has its counterpart, and so do both
// sending first with tensors too large to buffer (neither send completed). Sends that completed (eager) do not.
TEST(TorchFrP2p, NcclPairOrderDeadlocksAreCycles) {
  auto run = [](bool send_first, const std::string& send_state) {
    std::vector<TorchFrDump> ds;
    for (int r = 0; r < 2; ++r) {
      TorchFrEntry recv = with_state(p2p(false, r, 1 - r, 0, send_first ? 2 : 1, 4), "started");
      TorchFrEntry send = with_state(p2p(true, r, 1 - r, 0, send_first ? 1 : 2, 4), send_state);
      ds.push_back(dump(r, 2, send_first ? std::vector<TorchFrEntry>{send, recv} : std::vector<TorchFrEntry>{recv, send}));
    }
    return analyze_torch_fr(ds);
  };
  for (const bool send_first : {false, true}) {
    const HangReport rep = run(send_first, "scheduled");
    EXPECT_EQ(rep.kind, DivergenceKind::missing) << rep.summary;
    EXPECT_EQ(rep.pattern, "p2p cycle");
    EXPECT_EQ(rep.culprits, (std::vector<int>{0, 1}));
    EXPECT_EQ(rep.seq, 1);
    EXPECT_NE(rep.summary.find("an ordering deadlock"), std::string::npos) << rep.summary;
    EXPECT_NE(rep.summary.find(send_first ? "rank 0 in send to rank 1 (p2p seq 1" : "rank 0 in recv from rank 1 (p2p seq 1"),
              std::string::npos) << rep.summary;
  }
  EXPECT_EQ(run(true, "completed").kind, DivergenceKind::none);  // small sends: buffered, both completed
  // alternating order (one sends where the other receives) is fine whatever the states
  std::vector<TorchFrDump> ok;
  for (int r = 0; r < 2; ++r) {
    TorchFrEntry recv = with_state(p2p(false, r, 1 - r, 0, r == 0 ? 2 : 1, 4), "started");
    TorchFrEntry send = with_state(p2p(true, r, 1 - r, 0, r == 0 ? 1 : 2, 4), "started");
    ok.push_back(dump(r, 2, r == 0 ? std::vector<TorchFrEntry>{send, recv} : std::vector<TorchFrEntry>{recv, send}));
  }
  EXPECT_EQ(analyze_torch_fr(ok).kind, DivergenceKind::none);
}

// batch_isend_irecv's ops share one p2p seq and end with a "coalesced" entry; they run as one group call on
// the group's communicator: order within a batch does not matter, and they pair only with batched ops.
TEST(TorchFrP2p, BatchedOpsPairOnlyWithBatchedOps) {
  auto batch = [](int r, const std::string& state) {
    return std::vector<TorchFrEntry>{with_state(p2p(false, r, 1 - r, 0, 1, 4), "scheduled"),
                                     with_state(p2p(true, r, 1 - r, 0, 1, 4), "scheduled"), batch_end(0, 1, state)};
  };
  // both receive first inside their batch, the batch not completed: no ordering deadlock (one group call)
  EXPECT_EQ(analyze_torch_fr({dump(0, 2, batch(0, "started")), dump(1, 2, batch(1, "started"))}).kind,
            DivergenceKind::none);
  // rank 0 batches, rank 1 issues plain calls: NCCL never pairs them
  const HangReport mixed = analyze_torch_fr(
      {dump(0, 2, batch(0, "started")),
       dump(1, 2, {with_state(p2p(true, 1, 0, 0, 1, 4), "started"), with_state(p2p(false, 1, 0, 0, 2, 4), "started")})});
  EXPECT_EQ(mixed.kind, DivergenceKind::missing) << mixed.summary;
  EXPECT_EQ(mixed.culprits, (std::vector<int>{0, 1}));
  EXPECT_NE(mixed.summary.find("cannot pair with it"), std::string::npos) << mixed.summary;
}

// The batch's closing "coalesced" entry, recorded with is_p2p false and the previous collective's seq in some
// torch versions: it is the batch's, not a coalesced group with that collective (it was merged into seq 1 on
// the ranks that batched, and rank 2, which did not, read as issuing a different collective). Both forms.
TEST(TorchFrP2p, ABatchsClosingMarkerIsTheBatchsWhateverItsIsP2p) {
  for (const bool marker_is_p2p : {false, true}) {
    std::vector<TorchFrDump> ds;
    for (int r = 0; r < 3; ++r) {
      std::vector<TorchFrEntry> es = {entry(1, "all_reduce", 8)};
      if (r < 2) {
        es.push_back(with_state(p2p(true, r, 1 - r, 1, 1, 4), "scheduled"));
        es.push_back(with_state(p2p(false, r, 1 - r, 1, 1, 4), "scheduled"));
        es.push_back(batch_end(1, 1, "completed", marker_is_p2p));
      }
      es.push_back(entry(2, "all_reduce", 8));
      ds.push_back(dump(r, 3, es));
    }
    for (std::size_t k = 0; k < ds.size(); ++k)
      for (std::size_t i = 0; i < ds[k].entries.size(); ++i) ds[k].entries[i].index = i;
    const HangReport rep = analyze_torch_fr(ds);
    EXPECT_EQ(rep.kind, DivergenceKind::none) << marker_is_p2p << ": " << rep.summary;
    EXPECT_NE(rep.summary.find("(2 pairs)"), std::string::npos) << rep.summary;
  }
}

// A completed call waits on nothing: rank 1's recv completed though rank 0's dump holds no send (lost from it):
// a warning, and rank 1 waits at its next call. When the waiting call is the waiter's newest entry and the
// peer's dump ends at a call of the pair, the dumps may be a moment apart: the wording says so.
TEST(TorchFrP2p, CompletedCallsAreNoWaitAndDumpSkewIsHedged) {
  const HangReport rep = analyze_torch_fr(
      {dump(0, 2, {entry(1, "all_reduce", 8, "Float", "started")}),
       dump(1, 2, {with_state(p2p(false, 1, 0, 0, 1, 4), "completed"), p2p(true, 1, 0, 0, 2, 4),
                   entry(1, "all_reduce", 8, "Float", "scheduled")})});
  EXPECT_EQ(rep.kind, DivergenceKind::missing) << rep.summary;
  EXPECT_EQ(rep.seq, 2) << rep.summary;  // the send, not the completed recv
  EXPECT_EQ(rep.culprits, std::vector<int>{0});
  bool warned = false;
  for (const auto& w : rep.warnings) warned = warned || w.find("1 recv completed with no matching send") != std::string::npos;
  EXPECT_TRUE(warned) << fmt::format("{}", fmt::join(rep.warnings, " | "));
  const HangReport skew = analyze_torch_fr(
      {dump(0, 2, {with_state(p2p(true, 0, 1, 0, 1, 4), "completed"), p2p(false, 0, 1, 0, 2, 4)}),
       dump(1, 2, {with_state(p2p(false, 1, 0, 0, 1, 4), "completed")})});
  EXPECT_EQ(skew.kind, DivergenceKind::missing);
  EXPECT_EQ(skew.culprits, std::vector<int>{1});
  EXPECT_NE(skew.summary.find("rank 1 had not sent it when its dump was taken"), std::string::npos) << skew.summary;
}

// A send and its recv of different element counts or dtypes: the side whose own earlier calls of that pair
// never did so is the culprit; with no history to tell, both.
TEST(TorchFrP2p, APairOfDifferentSizesOrDtypesNamesTheSideThatChanged) {
  auto run = [](std::int64_t send_n, const std::string& recv_dtype) {
    return analyze_torch_fr(
        {dump(0, 2, {p2p(false, 0, 1, 0, 1, 4), entry(1, "all_reduce", 8), p2p(false, 0, 1, 1, 2, 4, recv_dtype)}),
         dump(1, 2, {p2p(true, 1, 0, 0, 1, 4), entry(1, "all_reduce", 8), p2p(true, 1, 0, 1, 2, send_n)})});
  };
  const HangReport size = run(3, "Float");
  EXPECT_EQ(size.kind, DivergenceKind::count);
  EXPECT_EQ(size.pattern, "p2p");
  EXPECT_EQ(size.culprits, std::vector<int>{1});
  EXPECT_EQ(size.seq, 2);
  EXPECT_NE(size.summary.find("rank 1's send of [3] Float (p2p seq 2) is received by rank 0's recv into [4] Float"),
            std::string::npos) << size.summary;
  EXPECT_EQ(size.culprit_frames, std::vector<std::string>{"train (train.py:42)"});
  EXPECT_NE(size.summary.find("the element counts differ (3 vs 4 elements)"), std::string::npos) << size.summary;
  const HangReport dtype = run(4, "Double");
  EXPECT_EQ(dtype.kind, DivergenceKind::dtype);
  EXPECT_EQ(dtype.culprits, std::vector<int>{0});
  // the count matches; the bytes do not
  EXPECT_NE(dtype.summary.find("the dtypes differ (4 elements each: 16 bytes sent, 32 bytes received)"),
            std::string::npos) << dtype.summary;
  // the first call of the pair already differs: nothing tells which side changed
  const HangReport first = analyze_torch_fr({dump(0, 2, {p2p(false, 0, 1, 0, 1, 4)}), dump(1, 2, {p2p(true, 1, 0, 0, 1, 6)})});
  EXPECT_EQ(first.kind, DivergenceKind::count);
  EXPECT_EQ(first.culprits, (std::vector<int>{0, 1}));
}

// Healthy: pairs are per peer and order, not p2p_seq_id (rank 1 talks to two peers, so its numbers run ahead
// of each peer's); a [2, 2] send into a [4] recv is the same count; a recv from any source takes the send.
TEST(TorchFrP2p, MatchedPairsAreNoFinding) {
  TorchFrEntry square = p2p(true, 2, 1, 0, 2, 0);
  square.input_sizes = square.output_sizes = {{2, 2}};
  const HangReport rep = analyze_torch_fr(
      {dump(0, 3, {p2p(true, 0, 1, 0, 1, 4), entry(1, "all_reduce", 8)}),
       dump(1, 3, {p2p(false, 1, 0, 0, 1, 4), p2p(true, 1, 2, 0, 2, 4), p2p(false, 1, -1, 0, 3, 4),
                   entry(1, "all_reduce", 8)}),
       dump(2, 3, {p2p(false, 2, 1, 0, 1, 4), square, entry(1, "all_reduce", 8)})});
  EXPECT_EQ(rep.kind, DivergenceKind::none) << rep.summary;
  EXPECT_NE(rep.summary.find("every send met its recv in peer and order (3 pairs)"), std::string::npos) << rep.summary;
}

// A ring that dropped its oldest entries: rank 0 no longer holds the send that rank 1's first recv matched.
// Pairing starts where both hold every call (rank 0's first collective held), not at each ring's start.
TEST(TorchFrP2p, AWrappedRingIsPairedFromWhereBothHoldEveryCall) {
  std::vector<TorchFrEntry> r0 = {entry(2, "all_reduce", 8), p2p(true, 0, 1, 2, 4, 4)};
  r0[0].record_id = 7;  // entries 0-6 dropped
  r0[1].record_id = 8;
  std::vector<TorchFrEntry> r1 = {p2p(false, 1, 0, 1, 3, 4), entry(2, "all_reduce", 8), p2p(false, 1, 0, 2, 4, 4)};
  r1[0].record_id = 0;
  const HangReport rep = analyze_torch_fr({dump(0, 2, r0), dump(1, 2, r1)});
  EXPECT_EQ(rep.kind, DivergenceKind::none) << rep.summary;
}

// A pipeline group with no collectives: every p2p call carries collective seq 0, so a cut by collective seq
// left out every call of a wrapped ring and of its peers, silently (rank 1's hang went unseen). The cut is then
// by the time of the wrapped ring's oldest entry, and the calls left out are a warning.
TEST(TorchFrP2p, AWrappedRingWithoutCollectivesIsCutByTime) {
  std::vector<TorchFrEntry> r0, r1;
  for (int k = 5; k <= 6; ++k) r0.push_back(p2p(true, 0, 1, 0, k, 4, "Float", 1000 * k));
  r0[0].record_id = 4;  // entries 0-3 (its sends 1-4) dropped
  r0[1].record_id = 5;
  for (int k = 1; k <= 6; ++k) r1.push_back(p2p(false, 1, 0, 0, k, 4, "Float", 1000 * k + 100));
  r1.push_back(with_state(p2p(false, 1, 0, 0, 7, 4, "Float", 7100), "started"));
  const HangReport rep = analyze_torch_fr({dump(0, 2, r0), dump(1, 2, r1)});
  EXPECT_EQ(rep.kind, DivergenceKind::missing) << rep.summary;
  EXPECT_EQ(rep.culprits, std::vector<int>{0});
  EXPECT_EQ(rep.seq, 7);
  bool warned = false;
  for (const auto& w : rep.warnings) warned = warned || w.find("4 of 9 send/recv calls") != std::string::npos;
  EXPECT_TRUE(warned) << fmt::format("{}", fmt::join(rep.warnings, " | "));
}

// Names that give no peer, or a peer outside the group, are warned about and left out: never a throw.
TEST(TorchFrP2p, ABadP2pNameIsAWarning) {
  TorchFrEntry bad = p2p(true, 0, 1, 0, 1, 4);
  bad.profiling_name = "nccl:send 0=>1";
  const HangReport a = analyze_torch_fr({dump(0, 2, {bad}), dump(1, 2, {})});
  EXPECT_EQ(a.kind, DivergenceKind::none);
  ASSERT_FALSE(a.warnings.empty());
  EXPECT_NE(a.warnings.back().find("names no peer"), std::string::npos) << a.warnings.back();
  const HangReport b = analyze_torch_fr({dump(0, 2, {p2p(true, 0, 5, 0, 1, 4)}), dump(1, 2, {})});
  EXPECT_EQ(b.kind, DivergenceKind::none);
  ASSERT_FALSE(b.warnings.empty());
  EXPECT_NE(b.warnings.back().find("does not fit process group 0"), std::string::npos) << b.warnings.back();
}

// Hostile input stays bounded: warnings about unnamed p2p calls are capped (the first 5 and a count), and a
// long run of mismatched pairs whose creation times decrease (each the earliest so far) is not quadratic.
TEST(TorchFrP2p, HostileP2pInputIsBounded) {
  std::vector<TorchFrEntry> bad;
  for (int k = 0; k < 1000; ++k) {
    bad.push_back(p2p(true, 0, 1, 0, k + 1, 4));
    bad.back().profiling_name = "nccl:send 0=>1";
  }
  const HangReport a = analyze_torch_fr({dump(0, 2, bad), dump(1, 2, {})});
  EXPECT_LE(a.warnings.size(), 7u);
  ASSERT_FALSE(a.warnings.empty());
  EXPECT_NE(a.warnings.back().find("995 more p2p calls name no peer"), std::string::npos) << a.warnings.back();
  const int n = 40000;
  std::vector<TorchFrEntry> s0, s1;
  for (int k = 0; k < n; ++k) {
    s0.push_back(p2p(true, 0, 1, 0, k + 1, 4 + k, "Float", std::int64_t(2) * n - k));
    s1.push_back(p2p(false, 1, 0, 0, k + 1, 3 + k, "Float", std::int64_t(2) * n - k));
  }
  const auto t0 = std::chrono::steady_clock::now();
  const HangReport b = analyze_torch_fr({dump(0, 2, s0), dump(1, 2, s1)});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(b.kind, DivergenceKind::count);
  // a loose bound, for a loaded machine: 0.3 s measured here, the quadratic walk 46 s (minutes under a sanitizer)
  EXPECT_LT(s, 20.0);
}

// ---- wait cycles across calls and process groups ----

TorchFrEntry in_group(TorchFrEntry e, const std::string& pg, std::int64_t t) {
  e.pg_name = pg;
  e.time_created_ns = t;
  return e;
}
TorchFrDump with_groups(TorchFrDump d, const std::vector<TorchFrDump::Group>& gs) {
  d.groups.insert(d.groups.end(), gs.begin(), gs.end());
  return d;
}
std::vector<int> cycle_ranks(const HangReport& r) {
  std::vector<int> v;
  for (const auto& w : r.wait_cycle) v.push_back(w.rank);
  std::sort(v.begin(), v.end());
  return v;
}

// Two groups of the same two ranks, their collectives issued in different orders in step 2 (group-order-2r's
// shape): rank 0 waits in group 1's seq 2, which rank 1 never reached; rank 1 in group 2's seq 2, which rank 0
// never reached. Either reads as "missing" alone; the report names the ring, each rank's call and whom it waits
// for, whichever call was made first.
TEST(TorchFrWaitCycle, CollectivesOfTwoGroupsInDifferentOrdersAreACycle) {
  const std::vector<TorchFrDump::Group> gs = {{"1", "A", {0, 1}}, {"2", "B", {0, 1}}};
  for (const std::int64_t t1 : {std::int64_t(5000), std::int64_t(7000)}) {  // rank 1's swapped call first, or last
    const HangReport rep = analyze_torch_fr(
        {with_groups(dump(0, 2, {in_group(entry(1, "all_reduce", 8), "1", 100), in_group(entry(1, "all_reduce", 8), "2", 200),
                                 in_group(entry(2, "all_reduce", 8, "Float", "started"), "1", 6000)}),
                     gs),
         with_groups(dump(1, 2, {in_group(entry(1, "all_reduce", 8), "1", 100), in_group(entry(1, "all_reduce", 8), "2", 200),
                                 in_group(entry(2, "all_reduce", 8, "Float", "started"), "2", t1)}),
                     gs)});
    EXPECT_EQ(rep.kind, DivergenceKind::missing);
    ASSERT_EQ(rep.wait_cycle.size(), 2u) << rep.summary;
    EXPECT_EQ(cycle_ranks(rep), (std::vector<int>{0, 1}));
    for (const auto& w : rep.wait_cycle) {
      EXPECT_FALSE(w.p2p);
      EXPECT_EQ(w.seq, 2);
      EXPECT_EQ(w.waits_for, 1 - w.rank);
      EXPECT_EQ(w.process_group, w.rank == 0 ? "1" : "2");  // each waits in its own group's call
    }
    // the missing rank named is the one whose call went unanswered first
    EXPECT_EQ(rep.culprits, std::vector<int>{t1 < 6000 ? 0 : 1});
    EXPECT_NE(rep.summary.find("the waits close a cycle (ranks 0, 1"), std::string::npos) << rep.summary;
    EXPECT_NE(rep.torch_match_state.find("once in each of the ring's 2 groups"), std::string::npos)
        << rep.torch_match_state;
    const json j = to_json(rep);
    ASSERT_EQ(j.at("wait_cycle").size(), 2u);
    EXPECT_NE(format_hang_report(rep).find("wait cycle: rank"), std::string::npos);
  }
}

// Three ranks, three groups of two, each rank in two: rank 0 calls C before A, so 0 waits in C for 2, 2 in B for
// 1, 1 in A for 0 (group-order-3r's shape): a ring of three through every group.
TEST(TorchFrWaitCycle, ARingOfThreeGroups) {
  const std::vector<TorchFrDump::Group> gs = {{"1", "A", {0, 1}}, {"2", "B", {1, 2}}, {"3", "C", {0, 2}}};
  auto s = [](const std::string& pg, std::int64_t seq, std::int64_t t, bool waiting = false) {
    TorchFrEntry e = in_group(entry(seq, "all_reduce", 8, "Float", waiting ? "started" : "completed"), pg, t);
    e.pg_desc = pg == "1" ? "A" : pg == "2" ? "B" : "C";  // new_group(group_desc=...)
    return e;
  };
  const HangReport rep = analyze_torch_fr(
      {with_groups(dump(0, 3, {s("1", 1, 10), s("3", 1, 20), s("3", 2, 30, true)}), gs),
       with_groups(dump(1, 3, {s("1", 1, 10), s("2", 1, 20), s("1", 2, 31, true)}), gs),
       with_groups(dump(2, 3, {s("2", 1, 20), s("3", 1, 21), s("2", 2, 32, true)}), gs)});
  EXPECT_EQ(rep.kind, DivergenceKind::missing);
  ASSERT_EQ(rep.wait_cycle.size(), 3u) << rep.summary;
  EXPECT_EQ(cycle_ranks(rep), (std::vector<int>{0, 1, 2}));
  for (const auto& w : rep.wait_cycle) {
    const int want = w.rank == 0 ? 2 : w.rank == 2 ? 1 : 0;
    EXPECT_EQ(w.waits_for, want) << w.rank;
    EXPECT_EQ(w.process_group, w.rank == 0 ? "3" : w.rank == 1 ? "1" : "2");
    // the group's desc, as the program named it
    EXPECT_NE(w.where.find(w.rank == 0 ? "process group 3 \"C\" collective seq 2" : w.rank == 1 ? "process group 1 \"A\""
                                                                                      : "process group 2 \"B\""),
              std::string::npos)
        << w.where;
  }
}

// A recv in a pipeline group and an all-reduce in the data-parallel group: rank 0 waits in recv from rank 1,
// rank 1 in the all-reduce rank 0 never reached. The p2p finding stands (rank 1 never sent); the ring is named.
TEST(TorchFrWaitCycle, ARecvAndACollectiveOfAnotherGroup) {
  const std::vector<TorchFrDump::Group> gs = {{"1", "pp", {0, 1}}};
  TorchFrEntry recv = p2p(false, 0, 1, 0, 1, 4);
  recv.pg_name = "1";
  const HangReport rep = analyze_torch_fr(
      {with_groups(dump(0, 2, {entry(1, "all_reduce", 8), recv}), gs),
       with_groups(dump(1, 2, {entry(1, "all_reduce", 8), entry(2, "all_reduce", 8, "Float", "started")}), gs)});
  EXPECT_EQ(rep.kind, DivergenceKind::missing);
  EXPECT_EQ(rep.culprits, std::vector<int>{1});
  ASSERT_EQ(rep.wait_cycle.size(), 2u) << rep.summary;
  for (const auto& w : rep.wait_cycle) {
    EXPECT_EQ(w.p2p, w.rank == 0);
    EXPECT_EQ(w.process_group, w.rank == 0 ? "1" : "0");
    EXPECT_EQ(w.seq, w.rank == 0 ? 1 : 2);
  }
}

// No ring: the waits end at a rank that waits on nobody (it skipped the call and is idle), at a rank without a
// dump, or at a member whose wrapped ring holds nothing of the group (not known to be behind); a call the dump
// says completed is no wait.
TEST(TorchFrWaitCycle, WaitsThatEndSomewhereAreNoCycle) {
  // rank 1 skipped seq 2 and waits on nothing
  const HangReport idle = analyze_torch_fr({dump(0, 2, {entry(1, "all_reduce", 8), entry(2, "all_reduce", 8, "Float", "started")}),
                                            dump(1, 2, {entry(1, "all_reduce", 8)})});
  EXPECT_EQ(idle.kind, DivergenceKind::missing);
  EXPECT_TRUE(idle.wait_cycle.empty()) << idle.summary;
  EXPECT_EQ(idle.summary.find("cycle"), std::string::npos) << idle.summary;
  // rank 1's wait in group 2 is on rank 0, whose wrapped ring holds nothing of group 2: unknown, no edge
  const std::vector<TorchFrDump::Group> gs = {{"1", "A", {0, 1}}, {"2", "B", {0, 1}}};
  TorchFrDump d0 = with_groups(dump(0, 2, {in_group(entry(5, "all_reduce", 8, "Float", "started"), "1", 100)}), gs);
  d0.entries.front().record_id = 500;
  const HangReport wrapped = analyze_torch_fr(
      {d0, with_groups(dump(1, 2, {in_group(entry(4, "all_reduce", 8), "1", 50),
                                   in_group(entry(9, "all_reduce", 8, "Float", "started"), "2", 90)}),
                       gs)});
  EXPECT_EQ(wrapped.kind, DivergenceKind::missing);
  EXPECT_TRUE(wrapped.wait_cycle.empty()) << wrapped.summary;
  // the same shape as the two-group ring, but rank 1's call in group 2 completed: its dump says it is not stuck
  const HangReport done = analyze_torch_fr(
      {with_groups(dump(0, 2, {in_group(entry(1, "all_reduce", 8), "2", 200), in_group(entry(2, "all_reduce", 8, "Float", "started"), "1", 6000)}), gs),
       with_groups(dump(1, 2, {in_group(entry(1, "all_reduce", 8), "1", 100), in_group(entry(2, "all_reduce", 8), "2", 5000)}), gs)});
  EXPECT_TRUE(done.wait_cycle.empty()) << done.summary;
}

// Three levels in one group: rank 2 stopped at seq 1, rank 1 at seq 2, rank 0 went on to seq 3. Rank 0's seq 3
// waits on rank 1 as well as rank 2, and rank 1 waits in group 1 for rank 0, which never made that call: a ring
// of 0 and 1 that a wait on the group's lowest members alone (rank 2) does not see.
TEST(TorchFrWaitCycle, AWaitPastAHigherLevelIsOnThoseMembersToo) {
  const std::vector<TorchFrDump::Group> gs = {{"1", "pp", {0, 1}}};
  const HangReport rep = analyze_torch_fr(
      {with_groups(dump(0, 3, {entry(1, "all_reduce", 8), entry(2, "all_reduce", 8, "Float", "started"),
                               entry(3, "all_reduce", 8, "Float", "started")}),
                   gs),
       with_groups(dump(1, 3, {entry(1, "all_reduce", 8), entry(2, "all_reduce", 8, "Float", "started"),
                               in_group(entry(1, "broadcast", 8, "Float", "started"), "1", 100)}),
                   gs),
       dump(2, 3, {entry(1, "all_reduce", 8)})});
  EXPECT_EQ(rep.kind, DivergenceKind::missing);
  EXPECT_EQ(rep.process_group, "1");  // group 1's call was made first: rank 0 never joined it
  EXPECT_EQ(rep.culprits, std::vector<int>{0});
  ASSERT_EQ(cycle_ranks(rep), (std::vector<int>{0, 1})) << rep.summary;
  for (const auto& w : rep.wait_cycle) {
    EXPECT_EQ(w.waits_for, 1 - w.rank);
    EXPECT_EQ(w.process_group, w.rank == 0 ? "0" : "1");
    EXPECT_EQ(w.seq, w.rank == 0 ? 3 : 1);  // rank 0's first call past rank 1's level
  }
}

// A large group with one laggard that waits in a pipeline recv on rank 1: the ring of two is found among 3000
// ranks, within a loose time bound (a scale check: with one laggard, a list per waiter would be small too).
TEST(TorchFrWaitCycle, ALargeGroupStaysLinear) {
  const int n = 3000;
  const std::vector<TorchFrDump::Group> gs = {{"1", "pp", {0, 1}}};
  std::vector<TorchFrDump> ds;
  for (int r = 0; r < n; ++r) {
    std::vector<TorchFrEntry> es = {entry(1, "all_reduce", 8)};
    if (r == 0) {
      es.push_back(p2p(false, 0, 1, 0, 1, 4));
      es.back().pg_name = "1";
    } else {
      es.push_back(entry(2, "all_reduce", 8, "Float", "started"));
    }
    ds.push_back(with_groups(dump(r, n, std::move(es)), gs));
  }
  const auto t0 = std::chrono::steady_clock::now();
  const HangReport rep = analyze_torch_fr(ds);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(rep.kind, DivergenceKind::missing);
  EXPECT_EQ(cycle_ranks(rep), (std::vector<int>{0, 1}));
  EXPECT_LT(secs, 20.0);  // loose, for a loaded machine and sanitizers
}

TEST(TorchFrAnalysis, RankComesFromTheFileName) {
  EXPECT_EQ(rank_from_file_name("/tmp/x/rank_12"), 12);
  EXPECT_EQ(rank_from_file_name("nccl_trace_rank_3.json"), 3);
  EXPECT_EQ(rank_from_file_name("README.md"), -1);
  EXPECT_EQ(rank_from_file_name("rank_9999999"), -1);  // past any job: damage, not a rank
}

}  // namespace
}  // namespace sb
