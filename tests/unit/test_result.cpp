#include <algorithm>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "harness/errors.hpp"
#include "harness/json_read.hpp"
#include "harness/printer.hpp"
#include "harness/result.hpp"


namespace sb {
namespace {

using json = nlohmann::ordered_json;

Result sample() {
  Result r;
  r.meta = json{{"tool", "stallbench"}, {"device", {{"id", "cpu"}, {"simulated", false}}}};
  r.scenario = "precision";
  r.params = json{{"size", {256, 512}}, {"dtype", {"fp32", "bf16"}}};
  Point ok;
  ok.params = json{{"size", 256}, {"dtype", "bf16"}};
  Stats s;
  s.n = 5;
  s.median = 1.5;
  s.p10 = 1.4;
  s.p90 = 1.7;
  s.stdrel = 0.01;
  ok.add({"tflops", 0.25, "TFLOP/s", Direction::higher, s, "2*M*N*K / median time"});
  ok.add({"ms", 1.5, "ms", Direction::lower, std::nullopt, ""});
  ok.info = json{{"impl", "brg:avx512_core_bf16"}};
  Point oom;
  oom.params = json{{"size", 512}, {"dtype", "bf16"}};
  oom.status = Status::oom;
  oom.reason = "cannot allocate";
  r.points = {ok, oom};
  r.findings.push_back({"fp32 where bf16 would do", "fp32 -> bf16: 2.0x", 2.0, json{{"shape", "256x256x256"}}});
  return r;
}

TEST(Result, JsonRoundTripKeepsEverything) {
  const Result a = sample();
  const json j = to_json(a);
  EXPECT_EQ(j["schema_version"], kResultSchemaVersion);
  EXPECT_EQ(j["kind"], "result");
  const Result b = result_from_json(json::parse(j.dump()));
  EXPECT_EQ(to_json(b), j);
  ASSERT_EQ(b.points.size(), 2u);
  EXPECT_EQ(b.points[1].status, Status::oom);
  EXPECT_EQ(b.points[1].reason, "cannot allocate");
  const Metric* m = b.points[0].metric("tflops");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->direction, Direction::higher);
  ASSERT_TRUE(m->stats.has_value());
  EXPECT_DOUBLE_EQ(m->stats->p90, 1.7);
  EXPECT_EQ(b.findings.at(0).speedup, 2.0);
}

TEST(Result, RejectsWhatIsNotAResult) {
  json j = to_json(sample());
  j["points"][0]["status"] = "fine";
  EXPECT_THROW(result_from_json(j), UsageError);
  j = to_json(sample());
  j["points"][0]["metrics"]["tflops"].erase("unit");
  try {
    result_from_json(j);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("points[0].metrics.tflops"), std::string::npos) << e.what();
  }
  EXPECT_THROW(result_from_json(json{{"kind", "expected"}}), UsageError);
  j = to_json(sample());
  j["schema_version"] = 99;
  EXPECT_THROW(result_from_json(j), UsageError);
}

TEST(Result, AtomicWriteReplacesAndLeavesNoTemp) {
  const auto dir = std::filesystem::temp_directory_path() / ("sb-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "r.json").string();
  write_file_atomic(path, "first");
  write_file_atomic(path, "second");
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text, "second");
  int files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1);
  EXPECT_THROW(write_file_atomic((dir / "no-such-dir" / "r.json").string(), "x"), Error);
  std::filesystem::remove_all(dir);
}

TEST(Result, ReadJsonFileErrorsAreUsageErrors) {
  EXPECT_THROW(read_json_file("/nonexistent/stallbench.json"), UsageError);
  const auto p = std::filesystem::temp_directory_path() / ("sb-bad-" + std::to_string(::getpid()) + ".json");
  std::ofstream(p) << "{not json";
  EXPECT_THROW(read_json_file(p.string()), UsageError);
  std::filesystem::remove(p);
}

// ---- malformed fields of a real result (issue #24): exit 2 naming the file and the field ----

const std::string kPublished = std::string(STALLBENCH_SOURCE_DIR) + "/results/published/cpu-avx512-2c";

json published(const std::string& name) { return read_json_file(kPublished + "/" + name); }

// Writes doc to a file and reads it as `stallbench compare` does; returns the
// UsageError's message ("" when it read).
std::string read_error(const json& doc, const std::string& name) {
  const auto path = (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()) + ".json")).string();
  std::ofstream(path) << doc.dump(1);
  std::string msg;
  try {
    result_from_json(read_json_file(path), path);
  } catch (const UsageError& e) {
    msg = e.what();
  }  // any other exception fails the test
  std::filesystem::remove(path);
  if (msg.rfind(path, 0) == 0) msg.replace(0, path.size(), "<file>");  // names the file, first
  return msg;
}

TEST(ResultReader, EveryPublishedResultReads) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(kPublished)) {
    if (e.path().extension() != ".json") continue;
    EXPECT_NO_THROW(result_from_json(read_json_file(e.path().string()), e.path().string())) << e.path();
    ++n;
  }
  EXPECT_GE(n, 10);
}

TEST(ResultReader, KindOfTheWrongTypeNamesFileAndField) {
  json j = published("precision.json");
  j["kind"] = 5;  // once [json.exception.type_error.302], exit 1
  EXPECT_EQ(read_error(j, "kind5"), "<file>: kind: expected string, got integer 5");
}

TEST(ResultReader, NumericReasonNamesFileAndField) {
  json j = published("precision.json");
  j["points"][1]["reason"] = 5;
  EXPECT_EQ(read_error(j, "reason5"), "<file>: points[1].reason: expected string, got integer 5");
}

TEST(ResultReader, StringStatsNNamesFileAndField) {
  json j = published("precision.json");
  j["points"][2]["metrics"]["ms"]["stats"]["n"] = "5";  // once read as 0 by value("n", 0)... or a raw type_error
  EXPECT_EQ(read_error(j, "statsn"),
            "<file>: points[2].metrics.ms.stats.n: expected integer in [0, 2147483647], got string \"5\"");
  j["points"][2]["metrics"]["ms"]["stats"]["n"] = 4294967297LL;  // never narrowed to 1
  EXPECT_EQ(read_error(j, "statsn"),
            "<file>: points[2].metrics.ms.stats.n: expected integer in [0, 2147483647], got integer 4294967297");
}

TEST(ResultReader, OptionalFieldOfTheWrongTypeIsAnError) {
  json j = published("precision.json");
  j["meta"]["device"]["simulated"] = "yes";  // once silently "not simulated"
  EXPECT_EQ(read_error(j, "simyes"), "<file>: meta.device.simulated: expected boolean, got string \"yes\"");
  j = published("precision.json");
  j["points"][0]["metrics"]["tflops"]["note"] = json::array();
  EXPECT_EQ(read_error(j, "note"), "<file>: points[0].metrics.tflops.note: expected string, got array");
  j = published("precision.json");
  j["findings"][0]["speedup"] = "2x";
  EXPECT_EQ(read_error(j, "speedup"), "<file>: findings[0].speedup: expected number, got string \"2x\"");
  j = published("precision.json");
  j["meta"]["measurement_params"] = json::array({"trials", 3});
  EXPECT_EQ(read_error(j, "mparams"), "<file>: meta.measurement_params[1]: expected string, got integer 3");
}

TEST(ResultReader, MissingAndUnknownValuesNameTheField) {
  json j = published("precision.json");
  j["points"][3].erase("status");
  EXPECT_EQ(read_error(j, "nostatus"),
            "<file>: points[3].status: expected string, got nothing (the field is missing)");
  j = published("precision.json");
  j["points"][0]["metrics"]["tflops"]["direction"] = "up";
  EXPECT_EQ(read_error(j, "dir"),
            "<file>: points[0].metrics.tflops.direction: expected one of higher|lower|none, got string \"up\"");
  j = published("precision.json");
  j["points"] = json::object();
  EXPECT_EQ(read_error(j, "points"), "<file>: points: expected array, got object");
  EXPECT_EQ(read_error(json::array(), "array"), "<file> is not a stallbench result (it has no \"kind\": \"result\")");
}

// CI's fuzzer (stop 62) found "gpuscpu": compare threw it later, without the file's name.
TEST(ResultReader, UnknownDeviceKindIsReadAsAnErrorNamingTheFile) {
  json j = published("precision.json");
  j["meta"]["device"]["kind"] = "gpuscpu";
  EXPECT_EQ(read_error(j, "kindgpu"),
            "<file>: meta.device.kind: expected one of cpu|cuda|sim, got string \"gpuscpu\"");
  j["meta"]["device"].erase("kind");  // then the id's prefix names it, as compare reads it
  j["meta"]["device"]["id"] = "tpu:0";
  EXPECT_EQ(read_error(j, "idtpu"), "<file>: meta.device.id: expected an id that starts with cpu|cuda|sim (as cpu, "
                                    "cuda:0, sim:h100), got string \"tpu:0\"");
  j["meta"]["device"]["id"] = "cuda:1";
  EXPECT_EQ(read_error(j, "idcuda"), "");
  j["meta"]["device"].erase("id");
  EXPECT_EQ(read_error(j, "nodev"),
            "<file>: meta.device: expected a device with a kind (cpu|cuda|sim) or an id, got neither");
  j["meta"].erase("device");
  EXPECT_EQ(read_error(j, "nodevice"), "<file>: meta.device: expected object, got nothing (the field is missing)");
}

TEST(JsonText, NumbersOutOfRangeAndDeepNestingAreUsageErrors) {
  // nlohmann throws out_of_range (not parse_error) for 1e400: it once escaped read_json_file raw.
  try {
    parse_json_text("[1e400]", "big.json");
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("big.json is not valid JSON"), std::string::npos) << e.what();
  }
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  try {
    parse_json_text(deep, "deep.json");
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("deep.json: nests arrays and objects more than 64 deep"), std::string::npos)
        << e.what();
  }
  // Brackets inside strings are not nesting.
  EXPECT_NO_THROW(parse_json_text("{\"a\": \"" + std::string(1000, '[') + "\\\"\"}", "s.json"));
  EXPECT_NO_THROW(parse_json_text(std::string(64, '[') + std::string(64, ']'), "ok.json"));
}

TEST(JsonRef, PathsAndTypeNames) {
  const json doc = json::parse(R"({"a": {"b c": [1, -2, 2.5, "x", null, true, 18446744073709551615]}})");
  const JsonRef root(doc, "f.json");
  const JsonRef arr = root.at("a").at("b c");
  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(msg([&] { arr.at(2).integer(); }), "f.json: a[\"b c\"][2]: expected integer, got number 2.5");
  EXPECT_EQ(msg([&] { arr.at(1).integer(0, 10); }), "f.json: a[\"b c\"][1]: expected integer in [0, 10], got integer -2");
  EXPECT_EQ(msg([&] { arr.at(6).integer(); }),
            "f.json: a[\"b c\"][6]: expected integer, got integer 18446744073709551615");  // never wrapped to -1
  EXPECT_EQ(msg([&] { arr.at(4).str(); }), "f.json: a[\"b c\"][4]: expected string, got null");
  EXPECT_EQ(msg([&] { arr.at(9); }), "f.json: a[\"b c\"]: has 7 elements, no element 9");
  EXPECT_EQ(msg([&] { root.at("a").at("z").number(); }), "f.json: a.z: expected number, got nothing (the field is missing)");
  EXPECT_EQ(msg([&] { arr.at("k"); }), "f.json: a[\"b c\"]: expected object, got array");
  EXPECT_EQ(msg([&] { arr.at(5).number(); }), "f.json: a[\"b c\"][5]: expected number, got boolean true");
  EXPECT_EQ(msg([&] { arr.at(0).positive(); }), "no error");
  EXPECT_EQ(arr.at(1).integer(), -2);
  EXPECT_FALSE(root.find("nope").has_value());
}

// The terminal table: a wide result wraps into blocks that fit the width, each repeating the swept axis
// and the status; the unit and direction sit under each name; a point's reason prints once.
TEST(Printer, WideTableWrapsIntoBlocksThatFit) {
  Result r = sample();
  for (Point& p : r.points)
    for (int i = 0; i < 9; ++i)
      p.add({fmt::format("metric_number_{}", i), 1234.5 * (i + 1), i % 2 ? "ms" : "tokens/s",
             i % 2 ? Direction::lower : Direction::higher, std::nullopt, ""});
  auto lines_of = [](const std::string& t) {
    std::vector<std::string> v;
    std::string l;
    for (char c : t)
      if (c == '\n') v.push_back(l), l.clear();
      else l += c;
    return v;
  };
  auto cols = [](const std::string& s) {
    std::size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  };
  const std::string narrow = format_result_table(r, 80);
  const auto lines = lines_of(narrow);
  std::size_t heads = 0, reasons = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    if (l.rfind("size", 0) == 0) {  // a block's header: the swept axis first, the status next
      ++heads;
      EXPECT_NE(l.find("status"), std::string::npos) << l;
      EXPECT_LE(cols(l), 80u) << l;
      ASSERT_LT(i + 2, lines.size());
      EXPECT_LE(cols(lines[i + 1]), 80u) << lines[i + 1];  // the units line
      EXPECT_EQ(lines[i + 2].find_first_not_of('-'), std::string::npos) << lines[i + 2];
    }
    if (l.find("cannot allocate") != std::string::npos) ++reasons;
  }
  EXPECT_GE(heads, 2u) << narrow;
  EXPECT_EQ(reasons, 1u) << narrow;  // the oom point's reason, once, not once a block
  for (int i = 0; i < 9; ++i) {  // every metric in exactly one block's header
    std::size_t n = 0;
    for (const auto& l : lines)
      if (l.rfind("size", 0) == 0) n += l.find(fmt::format("metric_number_{}", i)) != std::string::npos;
    EXPECT_EQ(n, 1u) << i;
  }
  EXPECT_NE(narrow.find("tokens/s ↑"), std::string::npos);
  EXPECT_NE(narrow.find("ms ↓"), std::string::npos);
  EXPECT_EQ(narrow.find("(ms)"), std::string::npos);  // no "ms (ms)": the unit is on its own line
  EXPECT_NE(narrow.find(fmt::format("(columns 1 of {})", heads)), std::string::npos) << narrow;

  // No limit: one block, every metric on one header line.
  const std::string wide = format_result_table(r, 0);
  std::size_t wide_heads = 0;
  for (const auto& l : lines_of(wide))
    if (l.rfind("size", 0) == 0) {
      ++wide_heads;
      for (int i = 0; i < 9; ++i) EXPECT_NE(l.find(fmt::format("metric_number_{}", i)), std::string::npos);
    }
  EXPECT_EQ(wide_heads, 1u);
  EXPECT_EQ(wide.find("(columns"), std::string::npos);
}

}  // namespace
}  // namespace sb
