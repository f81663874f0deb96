// Text as every reader of a user's file reads it: one trim, one split, one whole-field number parse,
// so a CSV row, a lengths file and a YAML scalar agree on what a blank and a number are.
#pragma once

#include <charconv>      // std::from_chars
#include <optional>      // std::optional
#include <string>        // std::string, std::to_string
#include <string_view>   // std::string_view
#include <system_error>  // std::errc
#include <type_traits>   // std::is_floating_point_v
#include <vector>        // std::vector

namespace sb::text {

// Blanks: spaces, tabs, and the line ends a line-based file leaves (CRLF's \r, a last \n).
inline constexpr std::string_view kBlank = " \t\r\n";

// s without the blanks at either end.
inline std::string_view trim(std::string_view s) {
  const auto b = s.find_first_not_of(kBlank);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kBlank) - b + 1);
}

// The fields between each `sep`, each trimmed; "" is one empty field, "a," two.
inline std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (std::size_t at = 0;;) {
    const std::size_t next = s.find(sep, at);
    out.push_back(trim(s.substr(at, next == std::string_view::npos ? next : next - at)));
    if (next == std::string_view::npos) return out;
    at = next + 1;
  }
}

// The whole field as a number, or nothing: "12x", "", " 12" and an out-of-range value are not one.
// No sign '+' and no blank (trim first); a double may come out inf or nan only from "inf"/"nan".
template <class T>
std::optional<T> parse_whole(std::string_view s, int base = 10) {
  T v{};
  if (s.empty()) return std::nullopt;
  const char* end = s.data() + s.size();
  std::from_chars_result r;
  if constexpr (std::is_floating_point_v<T>) r = std::from_chars(s.data(), end, v);
  else r = std::from_chars(s.data(), end, v, base);
  if (r.ec != std::errc() || r.ptr != end) return std::nullopt;
  return v;
}

// "0, 2-5, 9" of sorted ranks, "none" for none; past max_ranges ranges (0: no limit), the rest as
// ", ... (N ranks in all)": a job of 10,000 ranks that did not start is one line, not 10,000 numbers.
inline std::string rank_ranges(const std::vector<int>& ranks, std::size_t max_ranges = 0) {
  std::string out;
  std::size_t shown = 0;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (max_ranges > 0 && shown++ == max_ranges) return out + ", ... (" + std::to_string(ranks.size()) + " ranks in all)";
    out += (out.empty() ? "" : ", ") + std::to_string(ranks[i]) + (j == i ? "" : "-" + std::to_string(ranks[j]));
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

}  // namespace sb::text
