// A TensorBoard event file, as `diagnose DIR` reads it where a run has no trainer_state.json: the
// TFRecord framing with both CRC-32Cs checked, the Event protobuf's scalars, the log they make and
// every detector on its curves. The fuzzer cannot forge the CRCs, so it also reads the input with
// the CRCs mended (each record's length and data re-framed), which reaches the protobuf reader.
// Only a UsageError may escape.
#include <algorithm>  // std::min
#include <cstddef>    // std::size_t
#include <cstdint>    // std::uint8_t
#include <string>     // std::string

#include "diagnose/run/curves.hpp"        // analyze_curves, logged_throughput
#include "diagnose/run/event_curves.hpp"  // state_from_events
#include "readers/tfevents.hpp"           // parse_tfevents, masked_crc32c
#include "tests/fuzz/fuzz_common.hpp"

namespace {

std::string le(std::uint64_t v, int n) {
  std::string s;
  for (int k = 0; k < n; ++k) s.push_back(char((v >> (8 * k)) & 0xFF));
  return s;
}

// The input cut into records by a 2-byte length each, each framed with the right CRCs.
std::string framed(std::string_view in) {
  std::string out;
  for (std::size_t p = 0; p + 2 <= in.size();) {
    const std::size_t n = std::min<std::size_t>(in.size() - p - 2, std::uint8_t(in[p]) | std::size_t(std::uint8_t(in[p + 1])) << 8);
    const std::string_view data = in.substr(p + 2, n);
    const std::string len = le(n, 8);
    out += len + le(sb::masked_crc32c(len), 4) + std::string(data) + le(sb::masked_crc32c(data), 4);
    p += 2 + n;
  }
  return out;
}

void read(const std::string& bytes, const std::string& file) {
  const sb::TfEvents e = sb::parse_tfevents(bytes, file);
  const sb::TrainerState s = sb::diagnose::state_from_events({e}, file);
  for (const auto& f : sb::diagnose::analyze_curves(s)) {
    bool logged = false;
    for (const auto& x : s.log) logged = logged || x.step == f.step;
    sb::fuzz::require(logged, "a finding's step is a logged step");
    sb::fuzz::require(!f.summary.empty() && !f.reproduce.empty(), "a finding says what and how to reproduce");
  }
  (void)sb::diagnose::logged_throughput(s);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string file = "fuzz-events.out.tfevents";
  const std::string_view in = sb::fuzz::as_text(data, size);
  sb::fuzz::usage_errors_only(file, [&] { read(std::string(in), file); });
  sb::fuzz::usage_errors_only(file, [&] { read(framed(in), file); });
  return 0;
}
