// PyTorch Flight Recorder dumps, as `stallbench analyze-hang DIR` reads
// them: the input is one or more dumps (one rank's file each: a pickle or the
// JSON form) separated by a line "=====", named rank_0, rank_1, ...; each is
// read (read_torch_fr_file: the strict pickle reader or the JSON parser),
// the readable ones are analysed, and the report is formatted as text and
// JSON. Every input must give a report or a UsageError naming the file.
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint8_t
#include <string>   // std::string
#include <vector>   // std::vector

#include <fmt/format.h>  // fmt::format

#include "diagnose/hang/torch_fr_analysis.hpp"  // read_torch_fr_file, analyze_torch_fr
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text = sb::fuzz::as_text(data, size);
  constexpr std::string_view kSep = "\n=====\n";
  constexpr std::size_t kMaxFiles = 8;
  std::vector<sb::TorchFrDump> dumps;
  std::size_t index = 0;
  for (std::size_t at = 0; index < kMaxFiles; ++index) {
    const std::size_t next = text.find(kSep, at);
    const std::string part(text.substr(at, next == std::string_view::npos ? next : next - at));
    const std::string file = fmt::format("dumps/rank_{}", index);
    sb::fuzz::usage_errors_only(file, [&] { dumps.push_back(sb::read_torch_fr_file(file, part)); });
    if (next == std::string_view::npos) break;
    at = next + kSep.size();
  }
  if (dumps.empty()) return 0;
  sb::fuzz::usage_errors_only("dumps", [&] {
    const sb::HangReport r = sb::analyze_torch_fr(dumps);
    (void)sb::format_hang_report(r);
    (void)sb::to_json(r).dump();
  });
  return 0;
}
