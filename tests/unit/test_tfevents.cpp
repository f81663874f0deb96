// TensorBoard event files (readers/tfevents) and the curves diagnose reads from them
// (diagnose/run/event_curves): the real files of tests/data/run (written by SummaryWriter through
// Hugging Face's TensorBoardCallback in a real Trainer run, and by SummaryWriter with the callback's
// tags), records made here (tensor scalars, wrong wire types), and the damage a file meets: every
// truncation, a flipped CRC in the length or the data, a huge length, NaN and Inf values.
#include <cmath>       // std::isnan
#include <cstring>     // std::memcpy
#include <string>      // std::string
#include <vector>      // std::vector

#include <fmt/format.h>  // fmt::format
#include <gtest/gtest.h>

#include "diagnose/run/event_curves.hpp"  // state_from_events
#include "harness/errors.hpp"             // UsageError
#include "harness/files.hpp"              // read_regular_file
#include "readers/tfevents.hpp"           // parse_tfevents, crc32c
#include "readers/trainer_state.hpp"      // read_trainer_state

namespace sb {
namespace {

using diagnose::state_from_events;

const std::string kData = SB_TEST_DATA "/run";
const char* kVersions[] = {"transformers-4.46.3", "transformers-5.25.0"};

std::string le(std::uint64_t v, int n) {
  std::string s;
  for (int k = 0; k < n; ++k) s.push_back(char((v >> (8 * k)) & 0xFF));
  return s;
}
std::string varint(std::uint64_t v) {
  std::string s;
  do {
    s.push_back(char((v & 0x7F) | (v > 0x7F ? 0x80 : 0)));
    v >>= 7;
  } while (v);
  return s;
}
std::string field(int num, int wire) { return varint(std::uint64_t(num) << 3 | std::uint64_t(wire)); }
std::string bytes_field(int num, const std::string& b) { return field(num, 2) + varint(b.size()) + b; }
std::string float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return le(u, 4);
}
std::string double_bits(double d) {
  std::uint64_t u;
  std::memcpy(&u, &d, 8);
  return le(u, 8);
}
// One TFRecord around `data`, both CRCs right.
std::string record(const std::string& data) {
  const std::string len = le(data.size(), 8);
  return len + le(masked_crc32c(len), 4) + data + le(masked_crc32c(data), 4);
}
// An Event at `step` whose summary holds the given Values.
std::string event(std::int64_t step, const std::vector<std::string>& values) {
  std::string summary;
  for (const auto& v : values) summary += bytes_field(1, v);
  return field(1, 1) + double_bits(1.7e9 + double(step)) + field(2, 0) + varint(std::uint64_t(step)) +
         bytes_field(5, summary);
}
std::string simple(const std::string& tag, float v) { return bytes_field(1, tag) + field(2, 5) + float_bits(v); }

std::string error_of(const std::string& b) {
  try {
    parse_tfevents(b, "ev.tfevents");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(Crc32c, TheCheckValueAndTensorFlowsMask) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // the CRC-32C check value (RFC 3720 B.4's polynomial)
  EXPECT_EQ(crc32c(""), 0u);
  const std::uint32_t c = crc32c("abc");
  EXPECT_EQ(masked_crc32c("abc"), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TfEvents, HfTagsWrittenBySummaryWriterKeepTheirNaNs) {
  const TfEvents e = read_tfevents(kData + "/hf_tags_nan.tfevents");
  EXPECT_EQ(e.file_version, "brain.Event:2");
  ASSERT_EQ(e.scalars.at("train/loss").size(), 40u);
  EXPECT_EQ(e.scalars.at("train/loss")[0].step, 1);
  EXPECT_TRUE(std::isnan(e.scalars.at("train/loss")[29].value));  // step 30
  EXPECT_FALSE(std::isnan(e.scalars.at("train/loss")[28].value));
  EXPECT_TRUE(std::isnan(e.scalars.at("train/grad_norm")[24].value));  // step 25
  EXPECT_FLOAT_EQ(float(e.scalars.at("train/train_samples_per_second")[0].value), 51.2f);
  EXPECT_FALSE(e.truncated_at);
  const TrainerState s = state_from_events({e}, "hf");
  EXPECT_EQ(s.global_step, 40);
  ASSERT_EQ(s.log.size(), 40u);
  EXPECT_EQ(s.log[24].step, 25);
  EXPECT_TRUE(std::isnan(*s.log[24].grad_norm));
  EXPECT_NEAR(*s.log[0].learning_rate, 1.95e-4, 1e-9);
  EXPECT_FLOAT_EQ(float(*s.train_samples_per_second), 51.2f);
  EXPECT_FLOAT_EQ(float(*s.train_runtime_s), 12.5f);
}

// The real Trainer run: the event file holds what trainer_state.json's log_history holds.
TEST(TfEvents, ARealTrainerRunsEventsMatchItsTrainerState) {
  for (const char* v : kVersions) {
    SCOPED_TRACE(v);
    const std::string dir = kData + "/" + v + "/tiny_run";
    const TfEvents e = read_tfevents(dir + "/runs/tiny/events.out.tfevents.0.tiny");
    EXPECT_GT(e.skipped_values, 0u);  // TensorBoardCallback's text summaries (the args, the model config)
    const TrainerState from_events = state_from_events({e}, "events");
    const TrainerState state = read_trainer_state(dir + "/trainer_state.json");
    std::vector<const TrainerLogEntry*> a, b;
    for (const auto& x : from_events.log) a.push_back(&x);
    for (const auto& x : state.log)
      if (x.is_train()) b.push_back(&x);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_EQ(a.size(), 24u);  // 48 steps, a log every 2
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i]->step, b[i]->step);
      EXPECT_NEAR(*a[i]->loss, *b[i]->loss, 1e-3 * std::fabs(*b[i]->loss));  // float32 in the event, rounded in the json
      EXPECT_NEAR(*a[i]->grad_norm, *b[i]->grad_norm, 1e-5 * std::fabs(*b[i]->grad_norm));
      EXPECT_NEAR(*a[i]->learning_rate, 1e-7, 1e-12);
    }
    EXPECT_NEAR(*from_events.train_samples_per_second, *state.train_samples_per_second, 1e-3);
    EXPECT_EQ(from_events.global_step, 48);
  }
}

TEST(TfEvents, TensorScalarsOfEachDtypeAndWhatIsNoScalar) {
  // Value{tag, tensor=TensorProto{dtype, tensor_shape{}, ...}}
  auto tensor_value = [](const std::string& tag, int dtype, const std::string& body) {
    return bytes_field(1, tag) + bytes_field(8, field(1, 0) + varint(std::uint64_t(dtype)) + bytes_field(2, "") + body);
  };
  const std::string f32 = tensor_value("a", 1, field(5, 5) + float_bits(1.5f));                     // float_val
  const std::string packed = tensor_value("b", 1, bytes_field(5, float_bits(2.5f) + float_bits(9)));  // packed
  const std::string dbl = tensor_value("c", 2, bytes_field(4, double_bits(0.125)));                   // tensor_content
  const std::string i64 = tensor_value("d", 9, field(10, 0) + varint(7));                            // int64_val
  const std::string vec = bytes_field(1, "e") +
                          bytes_field(8, field(1, 0) + varint(1) + bytes_field(2, bytes_field(2, field(1, 0) + varint(3))) +
                                             bytes_field(5, float_bits(1) + float_bits(2) + float_bits(3)));
  const std::string text = tensor_value("f", 7, bytes_field(8, "hello"));  // DT_STRING
  const TfEvents e = parse_tfevents(record(field(3, 2) + varint(13) + "brain.Event:2") +
                                        record(event(5, {f32, packed, dbl, i64, vec, text})),
                                    "t");
  EXPECT_EQ(e.scalars.at("a")[0].value, 1.5);
  EXPECT_EQ(e.scalars.at("b")[0].value, 2.5);
  EXPECT_EQ(e.scalars.at("c")[0].value, 0.125);
  EXPECT_EQ(e.scalars.at("d")[0].value, 7.0);
  EXPECT_EQ(e.scalars.count("e"), 0u);  // three elements: no scalar
  EXPECT_EQ(e.scalars.count("f"), 0u);
  EXPECT_EQ(e.skipped_values, 2u);
  EXPECT_EQ(e.scalars.at("a")[0].step, 5);
}

TEST(TfEvents, DamageIsAnErrorWithItsOffsetAndACutTailIsKept) {
  const std::string one = record(event(1, {simple("train/loss", 2.0f)}));
  const std::string two = one + record(event(2, {simple("train/loss", 1.5f)}));
  ASSERT_EQ(parse_tfevents(two, "t").scalars.at("train/loss").size(), 2u);
  // the second record's data CRC, its length's CRC
  std::string data_crc = two;
  data_crc[one.size() + 14] ^= 1;
  EXPECT_NE(error_of(data_crc).find(fmt::format("data's CRC-32C does not match (damaged) at offset {}", one.size())),
            std::string::npos)
      << error_of(data_crc);
  std::string len_crc = two;
  len_crc[one.size() + 9] ^= 1;
  EXPECT_NE(error_of(len_crc).find("length whose CRC-32C"), std::string::npos) << error_of(len_crc);
  // a huge length with a right CRC: refused before anything is allocated
  const std::string len = le(std::uint64_t(1) << 40, 8);
  EXPECT_NE(error_of(one + len + le(masked_crc32c(len), 4)).find("a record of 1099511627776 bytes"), std::string::npos);
  // every prefix: the whole records before the cut are kept and the cut said; none at all is an error
  for (std::size_t n = 0; n < two.size(); ++n) {
    if (n < one.size()) {
      EXPECT_THROW(parse_tfevents(two.substr(0, n), "t"), UsageError) << n;
    } else {
      const TfEvents e = parse_tfevents(two.substr(0, n), "t");
      EXPECT_EQ(e.records, 1u) << n;
      EXPECT_EQ(e.truncated_at.has_value(), n > one.size()) << n;
    }
  }
  EXPECT_NE(error_of("").find("empty"), std::string::npos);
}

TEST(TfEvents, WrongWireTypesAndMalformedProtobufAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {field(2, 1) + le(5, 8), "Event.step (field 2) has wire type 1, not 0"},
      {field(1, 0) + varint(5), "Event.wall_time (field 1) has wire type 0, not 1"},
      {bytes_field(5, field(1, 0) + varint(1)), "Summary.value (field 1) has wire type 0, not 2"},
      {bytes_field(5, bytes_field(1, field(2, 0) + varint(1))), "Value.simple_value"},
      {field(5, 2) + varint(100) + "short", "run past their message"},
      {field(2, 0) + std::string(11, '\xff'), "varint"},
      {field(2, 3), "wire type 3"},
      {std::string(1, '\0'), "field number 0"},
  };
  for (const auto& [data, want] : cases) {
    const std::string m = error_of(record(data));
    EXPECT_NE(m.find(want), std::string::npos) << "want '" << want << "', got: " << m;
    EXPECT_EQ(m.rfind("ev.tfevents", 0), 0u) << m;
  }
  // Inf and a negative step are read as they are
  const TfEvents e = parse_tfevents(record(event(-3, {simple("x", float(INFINITY))})), "t");
  EXPECT_TRUE(std::isinf(e.scalars.at("x")[0].value));
  EXPECT_EQ(e.scalars.at("x")[0].step, -3);
}

TEST(TfEvents, MutationsOfARealFileAreReadOrRefused) {
  const std::string b = read_regular_file(kData + "/hf_tags_nan.tfevents", "t");
  int refused = 0;
  for (std::size_t i = 0; i < b.size(); i += 5) {
    std::string m = b;
    m[i] = char(m[i] ^ 0x10);
    try {
      (void)parse_tfevents(m, "mut");
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("mut", 0), 0u);
      ++refused;
    }
  }
  EXPECT_EQ(refused, int((b.size() + 4) / 5));  // every byte is under a CRC
}

TEST(EventCurves, FilesMergeByWallTimeAndAResumeIsSeen) {
  // a run to step 4, resumed from step 2 in a second file
  std::string first, second;
  for (int s = 1; s <= 4; ++s) first += record(event(s, {simple("train/loss", 3.0f - 0.1f * float(s))}));
  for (int s = 3; s <= 5; ++s) {
    std::string ev = field(1, 1) + double_bits(1.8e9 + s) + field(2, 0) + varint(std::uint64_t(s)) +
                     bytes_field(5, bytes_field(1, simple("train/loss", 2.0f)) + bytes_field(1, simple("eval/loss", 2.5f)));
    second += record(ev);
  }
  const TrainerState st = state_from_events({parse_tfevents(second, "b"), parse_tfevents(first, "a")}, "two");
  ASSERT_EQ(st.log.size(), 4u + 3u + 3u);
  EXPECT_EQ(st.log[0].step, 1);  // the earlier file first, whatever the order given
  EXPECT_TRUE(st.resumed);
  EXPECT_EQ(st.global_step, 5);
  std::size_t evals = 0;
  for (const auto& e : st.log) evals += e.is_eval() ? 1 : 0;
  EXPECT_EQ(evals, 3u);
}

}  // namespace
}  // namespace sb
