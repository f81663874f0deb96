// A training_args.bin, as `diagnose DIR` reads it: torch.save's zip, its data.pkl through the strict
// pickle reader with the TrainingArguments allow-list, the fields typed; then the report's JSON of
// them, the findings they prove and the schedule the plateau reading uses. The fuzzer cannot forge
// the zip's CRC-32, so the input is also read as a data.pkl, put in a zip with the right CRC, which
// reaches the pickle and field readers. Only a UsageError may escape; nothing in the input is ever
// executed.
#include <cmath>    // std::isfinite
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint8_t
#include <string>   // std::string
#include <string_view>  // std::string_view

#include <zlib.h>  // crc32

#include "diagnose/run/curves.hpp"        // scheduled_lr
#include "diagnose/run/run_settings.hpp"  // settings_findings, training_args_json
#include "readers/training_args.hpp"      // parse_training_args
#include "tests/fuzz/fuzz_common.hpp"

namespace {

std::string le(std::uint64_t v, int n) {
  std::string s;
  for (int k = 0; k < n; ++k) s.push_back(char((v >> (8 * k)) & 0xFF));
  return s;
}

// A zip of one stored entry, a/data.pkl, holding `pkl` (torch.save's layout, without its padding).
std::string zipped(std::string_view pkl) {
  const std::string name = "a/data.pkl";
  const auto crc = std::uint32_t(crc32(0, reinterpret_cast<const Bytef*>(pkl.data()), uInt(pkl.size())));
  const std::string sizes = le(crc, 4) + le(pkl.size(), 4) + le(pkl.size(), 4);
  // the local header: signature, version, then flags, method, time and date all 0
  std::string out = le(0x04034b50, 4) + le(20, 2) + le(0, 8) + sizes + le(name.size(), 2) + le(0, 2) + name;
  out += pkl;
  const std::size_t dir_at = out.size();
  const std::string dir = le(0x02014b50, 4) + le(20, 2) + le(20, 2) + le(0, 4) + le(0, 4) + sizes +
                          le(name.size(), 2) + le(0, 8) + le(0, 4) + le(0, 4) + name;
  return out + dir + le(0x06054b50, 4) + le(0, 4) + le(1, 2) + le(1, 2) + le(dir.size(), 4) + le(dir_at, 4) + le(0, 2);
}

void read(std::string_view bytes, const std::string& file) {
  const sb::TrainingArgs a = sb::parse_training_args(bytes, file);
  (void)sb::diagnose::training_args_json(a).dump();
  for (const auto& f : sb::diagnose::settings_findings(a, {}, "cpu"))
    sb::fuzz::require(!f.summary.empty() && !f.reproduce.empty(), "a settings finding says what and how to reproduce");
  for (const std::int64_t step : {0, 1, 50, 1000})
    if (const auto lr = sb::diagnose::scheduled_lr(a, 1000, step))
      sb::fuzz::require(std::isfinite(*lr) && *lr >= 0 && *lr <= *a.learning_rate * (1 + 1e-12),
                        "the schedule stays within 0 and the peak");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string file = "fuzz-training_args.bin";
  const std::string_view in = sb::fuzz::as_text(data, size);
  sb::fuzz::usage_errors_only(file, [&] { read(in, file); });
  sb::fuzz::usage_errors_only(file, [&] { read(zipped(in), file); });
  return 0;
}
