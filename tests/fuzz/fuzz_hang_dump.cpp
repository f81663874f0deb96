// The flight-recorder dump reader, as `stallbench analyze-hang DIR` uses it.
// The input is one or more dumps (one rank's file each), separated by a line
// "=====": each is parsed (parse_json_text, behind read_json_file) and read
// (rank_dump_from_json) by analyze_hang_files, which skips a bad one with a
// warning; the dumps of the newest run are analysed, and the report is
// formatted as text and JSON.
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint8_t
#include <string>   // std::string
#include <vector>   // std::vector

#include <fmt/format.h>  // fmt::format

#include "harness/json_read.hpp"                    // parse_json_text
#include "diagnose/hang/hang_analysis.hpp"  // analyze_hang_files, format_hang_report
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text = sb::fuzz::as_text(data, size);
  constexpr std::string_view kSep = "\n=====\n";
  constexpr std::size_t kMaxFiles = 8;
  std::vector<std::string> files;
  std::vector<std::string_view> parts;
  for (std::size_t at = 0; files.size() < kMaxFiles;) {
    const std::size_t next = text.find(kSep, at);
    files.push_back(fmt::format("dumps/rank-{}.json", files.size()));
    parts.push_back(text.substr(at, next == std::string_view::npos ? next : next - at));
    if (next == std::string_view::npos) break;
    at = next + kSep.size();
  }
  sb::fuzz::usage_errors_only("dumps", [&] {
    const sb::HangReport r = sb::analyze_hang_files("dumps", files, [&](const std::string& f) {
      for (std::size_t i = 0; i < files.size(); ++i)
        if (files[i] == f) return sb::parse_json_text(parts[i], f);
      throw sb::UsageError(f + ": no such part");
    });
    (void)sb::format_hang_report(r);
    (void)sb::to_json(r).dump();
  });
  return 0;
}
