#include <set>

#include <gtest/gtest.h>

#include "harness/errors.hpp"
#include "harness/comm.hpp"
#include "harness/device.hpp"
#include "harness/dtype.hpp"
#include "harness/params.hpp"
#include "tests/unit/usage_error.hpp"  // usage_error
#include "harness/result.hpp"

namespace sb {
namespace {

std::vector<ParamSpec> specs() {
  return {
      ParamSpec{.name = "size", .type = ParamType::integer, .default_value = "64,128", .unit = "elements",
                .min = 16, .max = 4096, .quick_default = "16", .gpu_default = "1024"},
      ParamSpec{.name = "dtype", .type = ParamType::choice, .default_value = "fp32",
                .choices = {"fp32", "bf16"}},
      ParamSpec{.name = "ratio", .type = ParamType::real, .default_value = "0.5", .min = 0, .max = 1},
      ParamSpec{.name = "pin", .type = ParamType::boolean, .default_value = "true"},
  };
}

std::string usage_message(const std::vector<std::string>& args) {
  try {
    expand_sweep(specs(), args, {});
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}


TEST(Params, DefaultsMakeTheDefaultSweep) {
  const Sweep s = expand_sweep(specs(), {}, {});
  ASSERT_EQ(s.points.size(), 2u);
  EXPECT_EQ(s.points[0].get_int("size"), 64);
  EXPECT_EQ(s.points[1].get_int("size"), 128);
  EXPECT_EQ(s.points[0].get_str("dtype"), "fp32");
  EXPECT_DOUBLE_EQ(s.points[0].get_real("ratio"), 0.5);
  EXPECT_TRUE(s.points[0].get_bool("pin"));
  EXPECT_EQ(s.axes["size"], nlohmann::ordered_json::array({64, 128}));
}

TEST(Params, ProfilesPickQuickAndGpuDefaults) {
  EXPECT_EQ(expand_sweep(specs(), {}, {.quick = true}).points[0].get_int("size"), 16);
  EXPECT_EQ(expand_sweep(specs(), {}, {.gpu = true}).points[0].get_int("size"), 1024);
  // A value the user gives wins over every default.
  EXPECT_EQ(expand_sweep(specs(), {"size=32"}, {.quick = true, .gpu = true}).points[0].get_int("size"), 32);
}

// precision's size once m, n and k are all given: its default sweep would measure the same shape
// once per default size (4 times a dtype on a GPU); it collapses to one point. A 0 among them
// (m = size) or a size the user gives keeps the sweep.
TEST(Params, AMootParameterKeepsOneDefaultValue) {
  std::vector<ParamSpec> sp{
      ParamSpec{.name = "size", .default_value = "64,128", .gpu_default = "1024,2048,4096", .moot_when_given = {"m", "n"}},
      ParamSpec{.name = "m", .default_value = "0", .min = 0},
      ParamSpec{.name = "n", .default_value = "0", .min = 0}};
  EXPECT_EQ(expand_sweep(sp, {}, {}).points.size(), 2u);
  EXPECT_EQ(expand_sweep(sp, {"m=96"}, {}).points.size(), 2u);  // n still follows size
  const Sweep one = expand_sweep(sp, {"m=96", "n=32"}, {.gpu = true});
  ASSERT_EQ(one.points.size(), 1u);
  EXPECT_EQ(one.points[0].get_int("size"), 1024);
  EXPECT_FALSE(one.axes.contains("size"));  // not in the result's params: m and n ran, not size
  EXPECT_EQ(expand_sweep(sp, {"m=96,0", "n=32"}, {}).points.size(), 4u);  // m=0 is size: the sweep stays
  EXPECT_EQ(expand_sweep(sp, {"m=96", "n=32", "size=16,32"}, {}).points.size(), 2u);  // given: kept
}

TEST(Params, AParameterThatWouldDoNothingIsRefused) {
  std::vector<ParamSpec> sp{
      ParamSpec{.name = "case", .type = ParamType::choice, .default_value = "nan,fp16",
                .choices = {"nan", "fp16", "custom"}, .quick_default = "nan"},
      ParamSpec{.name = "inject", .type = ParamType::text, .default_value = "none", .only_with = {"case", "custom"}}};
  // numerics -p inject=nan@7:2 ran the preset cases and ignored it
  const std::string msg = usage_error([&] { expand_sweep(sp, {"inject=nan@7:2"}, {}); });
  EXPECT_NE(msg.find("-p inject=nan@7:2 does nothing unless case=custom (now case=nan,fp16): add -p case=custom"),
            std::string::npos) << msg;
  EXPECT_NE(usage_error([&] { expand_sweep(sp, {"inject=nan@7:2"}, {.quick = true}); }).find("now case=nan)"),
            std::string::npos);
  EXPECT_EQ(expand_sweep(sp, {"inject=nan@7:2", "case=custom"}, {}).points.size(), 1u);
  EXPECT_EQ(expand_sweep(sp, {"inject=nan@7:2", "case=nan,custom"}, {}).points.size(), 2u);  // acts on custom's
  EXPECT_EQ(expand_sweep(sp, {}, {}).points.size(), 2u);  // its default is never refused
}

TEST(Params, AByteCountTakesABinarySuffixAsNcclTestsDoes) {
  const ParamSpec bytes{.name = "max_bytes", .unit = "bytes", .min = 8, .max = 1e12};
  EXPECT_EQ(std::get<std::int64_t>(parse_value(bytes, "1G")), std::int64_t(1) << 30);
  EXPECT_EQ(std::get<std::int64_t>(parse_value(bytes, "128M")), std::int64_t(128) << 20);
  EXPECT_EQ(std::get<std::int64_t>(parse_value(bytes, "64KiB")), std::int64_t(64) << 10);
  EXPECT_EQ(std::get<std::int64_t>(parse_value(bytes, "4096")), 4096);
  EXPECT_NE(usage_error([&] { parse_value(bytes, "1X"); }).find("unknown size suffix"), std::string::npos);
  EXPECT_NE(usage_error([&] { parse_value(bytes, "2T"); }).find("out of range"), std::string::npos);  // over 1e12
  EXPECT_NE(usage_error([&] { parse_value(bytes, "9000000000000T"); }).find("out of range"), std::string::npos);
  const ParamSpec count{.name = "steps", .unit = "steps", .min = 0, .max = 1e9};  // not bytes: no suffix
  EXPECT_NE(usage_error([&] { parse_value(count, "1K"); }).find("is not an integer"), std::string::npos);
}

TEST(Params, ADefaultMayFollowWhatElseWasGiven) {
  std::vector<ParamSpec> sp{
      ParamSpec{.name = "strategy", .type = ParamType::choice, .default_value = "pad,bfd",
                .choices = {"pad", "bfd", "hist"},
                .default_from = [](const auto& given) -> std::optional<std::string> {
                  const auto l = given("lengths");
                  return l && l->starts_with("@") ? std::optional<std::string>("pad,hist") : std::nullopt;
                }},
      ParamSpec{.name = "lengths", .type = ParamType::text, .default_value = "fixed:8"}};
  EXPECT_EQ(expand_sweep(sp, {}, {}).axes["strategy"], nlohmann::ordered_json({"pad", "bfd"}));
  EXPECT_EQ(expand_sweep(sp, {"lengths=@h.csv"}, {}).axes["strategy"], nlohmann::ordered_json({"pad", "hist"}));
  // given, it is the user's
  EXPECT_EQ(expand_sweep(sp, {"lengths=@h.csv", "strategy=bfd"}, {}).axes["strategy"], nlohmann::ordered_json({"bfd"}));
}

TEST(Params, CartesianProductLastAxisFastest) {
  const Sweep s = expand_sweep(specs(), {"size=16,32,64", "dtype=fp32,bf16"}, {});
  ASSERT_EQ(s.points.size(), 6u);
  EXPECT_EQ(s.points[0].get_int("size"), 16);
  EXPECT_EQ(s.points[0].get_str("dtype"), "fp32");
  EXPECT_EQ(s.points[1].get_str("dtype"), "bf16");
  EXPECT_EQ(s.points[2].get_int("size"), 32);
  EXPECT_EQ(s.points[5].get_int("size"), 64);
  EXPECT_EQ(s.points[5].to_json().dump(), R"({"size":64,"dtype":"bf16","ratio":0.5,"pin":true})");
}

TEST(Params, UnknownKeyNamesTheValidKeys) {
  const std::string m = usage_message({"sise=64"});
  EXPECT_NE(m.find("unknown parameter 'sise'"), std::string::npos) << m;
  EXPECT_NE(m.find("size, dtype, ratio, pin"), std::string::npos) << m;
}

TEST(Params, OutOfRangeNamesTheRangeAndUnit) {
  const std::string m = usage_message({"size=8"});
  EXPECT_NE(m.find("out of range"), std::string::npos) << m;
  EXPECT_NE(m.find("[16, 4096] elements"), std::string::npos) << m;
}

TEST(Params, MalformedValuesAreRejected) {
  for (const std::string bad : {"size=abc", "size=12x", "size=", "size=64,,128", "ratio=nan", "ratio=1.5",
                                "pin=maybe", "dtype=fp64", "size", "=3", "size=99999999999999999999"}) {
    EXPECT_FALSE(usage_message({bad}).empty()) << bad;
  }
  EXPECT_NE(usage_message({"dtype=fp64"}).find("fp32|bf16"), std::string::npos);
}

TEST(Params, RepeatedKeyIsAnError) {
  EXPECT_NE(usage_message({"size=16", "size=32"}).find("given twice"), std::string::npos);
}

TEST(Params, HugeSweepIsRefused) {
  std::string many = "size=16";
  for (int i = 17; i < 16 + 200; ++i) many += "," + std::to_string(i);
  std::string ratios = "ratio=0";
  for (int i = 1; i < 100; ++i) ratios += ",0." + std::to_string(i);
  EXPECT_NE(usage_message({many, ratios}).find("more than 10000 points"), std::string::npos);
}

TEST(Params, TextSweepsSplitOnSemicolons) {
  std::vector<ParamSpec> sp{ParamSpec{.name = "lengths", .type = ParamType::text, .default_value = "fixed:8"}};
  const Sweep s = expand_sweep(sp, {"lengths=lognormal:256,1.0;uniform:1,9"}, {});
  ASSERT_EQ(s.points.size(), 2u);
  EXPECT_EQ(s.points[0].get_str("lengths"), "lognormal:256,1.0");
  EXPECT_EQ(s.points[1].get_str("lengths"), "uniform:1,9");
}

TEST(Params, DescribeRange) {
  EXPECT_EQ(describe_range(specs()[0]), "[16, 4096]");
  EXPECT_EQ(describe_range(specs()[1]), "fp32|bf16");
  EXPECT_EQ(describe_range(specs()[3]), "true|false");
}

// A choice read through its enum's name table: a value outside the table is
// a usage error naming the parameter and the valid names (the old
// *parse_x(...) dereferenced an empty optional; == "file" ? ... fell back).
TEST(Params, ChoiceReadThroughItsTable) {
  ParamSet ps;
  ps.set("dtype", std::string("bf16"));
  EXPECT_EQ(ps.get_choice("dtype", kDTypeNames), DType::bf16);
  ps.set("timing", std::string("lukewarm"));
  try {
    (void)ps.get_choice("timing", kTimingModeNames);
    ADD_FAILURE() << "an unknown choice was accepted";
  } catch (const UsageError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("timing"), std::string::npos) << m;
    EXPECT_NE(m.find("lukewarm"), std::string::npos) << m;
    EXPECT_NE(m.find("warm|cold|hidden"), std::string::npos) << m;
  }
}

// Every table round-trips, names are unique, and a subset keeps its order.
template <class E, std::size_t N>
void expect_round_trip(const NameTable<E, N>& t) {
  std::set<std::string> seen;
  for (const auto& [v, n] : t.entries) {
    EXPECT_EQ(t.name(v), n);
    EXPECT_EQ(t.parse(n), v) << n;
    EXPECT_TRUE(seen.insert(std::string(n)).second) << "duplicate name " << n;
  }
  EXPECT_EQ(t.names().size(), N);
  EXPECT_FALSE(t.parse("").has_value());
}

TEST(NameTable, EveryHarnessTableRoundTrips) {
  expect_round_trip(kDTypeNames);
  expect_round_trip(kTimingModeNames);
  expect_round_trip(kAttnImplNames);
  expect_round_trip(kStatusNames);
  expect_round_trip(kDirectionNames);
  expect_round_trip(kParamTypeNames);
  expect_round_trip(kCollOpNames);
  expect_round_trip(kCommDtypeNames);
  expect_round_trip(kReduceOpNames);
  EXPECT_EQ(kDTypeNames.names({DType::bf16, DType::fp32}), (std::vector<std::string>{"bf16", "fp32"}));
  EXPECT_EQ(parse_dtype("fp8"), DType::fp8_e4m3);  // the dtype parser's alias stays
}

}  // namespace
}  // namespace sb
