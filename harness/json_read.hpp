// Typed reads of a JSON document that came from a user's file. Every reader of
// such a document (results, expected numbers, flight-recorder dumps) reads it
// through JsonRef, so a missing field, a value of the wrong type or an integer
// out of range is a UsageError (exit 2) naming the file and the field's path:
//
//   "a.json: points[3].metrics.tflops.stats.n: expected integer, got string \"5\""
//
// and never a raw nlohmann exception. An optional field that is present must
// have its type too: `"simulated": "yes"` is an error, not false.
#pragma once

#include <cstdint>      // std::int64_t
#include <initializer_list>  // std::initializer_list
#include <limits>       // std::numeric_limits
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <utility>      // std::pair
#include <vector>       // std::vector

#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/errors.hpp"  // UsageError
#include "harness/names.hpp"   // NameTable

namespace sb {

// Deeper nesting than any file stallbench writes (a result nests 5 levels);
// the limit keeps recursive copies, dumps and comparisons of a hostile file
// off the end of the stack.
inline constexpr int kMaxJsonDepth = 64;

// Parses text as one JSON document. A syntax error, a number out of range
// (1e400) or nesting over kMaxJsonDepth is a UsageError naming `file`.
nlohmann::ordered_json parse_json_text(std::string_view text, const std::string& file);

// A value in a document, with the file it came from and its path from the
// root. A JsonRef does not own the document: the document outlives it.
class JsonRef {
 public:
  using json = nlohmann::ordered_json;

  JsonRef(const json& doc, std::string file) : v_(&doc), file_(std::move(file)) {}

  const std::string& file() const { return file_; }
  // "points[3].status"; "the document" for the root.
  std::string where() const { return path_.empty() ? std::string("the document") : path_; }
  // "<file>: <where>: <detail>".
  [[noreturn]] void fail(std::string_view detail) const;

  bool present() const { return v_ != nullptr; }
  // The value itself; fails when the field is missing.
  const json& raw() const;

  // A member: this must be an object. at() may return a missing member,
  // whose typed reads then fail ("got nothing: the field is missing");
  // find() returns nullopt for it instead.
  JsonRef at(std::string_view key) const;
  std::optional<JsonRef> find(std::string_view key) const;
  // An element: this must be an array.
  JsonRef at(std::size_t index) const;

  // Type checks, returning this for chaining.
  const JsonRef& object() const;
  const JsonRef& array() const;
  // Elements of an array, members of an object (in document order).
  std::size_t size() const;  // this must be an array or an object
  std::vector<std::pair<std::string, JsonRef>> members() const;

  std::string str() const;
  bool boolean() const;
  // Any JSON number, finite.
  double number() const;
  // A number > 0 (a rate or a size that is divided by).
  double positive() const;
  // An integer (not 2.5, not "5") in [lo, hi]: never narrowed or wrapped.
  std::int64_t integer(std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                       std::int64_t hi = std::numeric_limits<std::int64_t>::max()) const;
  int int32(int lo = std::numeric_limits<int>::min(), int hi = std::numeric_limits<int>::max()) const {
    return static_cast<int>(integer(lo, hi));
  }
  // A string among a name table's names, parsed.
  template <class E, std::size_t N>
  E choice(const NameTable<E, N>& table) const {
    const std::string s = str();
    if (const auto v = table.parse(s)) return *v;
    std::string names;
    for (const auto& n : table.names()) names += (names.empty() ? "" : "|") + n;
    fail(fmt::format("expected one of {}, got {}", names, describe()));
  }
  // A string among `names`.
  std::string one_of(std::initializer_list<std::string_view> names) const;

  // What the value is, for a message: "string \"yes\"", "integer 5", "object",
  // "nothing (the field is missing)".
  std::string describe() const;

 private:
  JsonRef(const json* v, std::string file, std::string path)
      : v_(v), file_(std::move(file)), path_(std::move(path)) {}
  [[noreturn]] void expected(std::string_view type) const;

  const json* v_;  // null: a missing member
  std::string file_;
  std::string path_;
};

// A message that begins "<file>: " without it (a warning that names the file
// itself: "skipped <file>: <why>").
std::string without_file_prefix(const std::string& message, const std::string& file);

// The safety net around a reader: any nlohmann exception that the typed reads
// did not turn into a UsageError becomes one, naming the file.
template <class F>
auto reading_file(const std::string& file, F&& read) -> decltype(read()) {
  try {
    return read();
  } catch (const nlohmann::ordered_json::exception& e) {
    throw UsageError(fmt::format("{}: {}", file, e.what()));
  }
}

}  // namespace sb
