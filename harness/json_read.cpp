#include "harness/json_read.hpp"

#include <cctype>  // std::isalnum
#include <cmath>   // std::isfinite

#include "harness/files.hpp"  // quoted_text: the parser's message quotes the bytes it stopped at, which may be anything

namespace sb {

namespace {

using json = nlohmann::ordered_json;

// The deepest nesting in text, found without parsing: brackets outside strings.
// Stops at the first place deeper than the limit and returns its byte offset.
std::optional<std::size_t> too_deep_at(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::nullopt;
}

// A key as a path step: .name when it reads as one, else ["..."] quoted.
std::string key_step(std::string_view key, bool first) {
  bool plain = !key.empty();
  for (char c : key) plain = plain && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-');
  if (plain) return first ? std::string(key) : fmt::format(".{}", key);
  return fmt::format("[{}]", json(std::string(key)).dump(-1, ' ', true, json::error_handler_t::replace));
}

std::string shorten(std::string s) {
  constexpr std::size_t kMax = 60;
  if (s.size() > kMax) s = s.substr(0, kMax - 3) + "...";
  return s;
}

}  // namespace

json parse_json_text(std::string_view text, const std::string& file) {
  if (const auto at = too_deep_at(text, kMaxJsonDepth))
    throw UsageError(fmt::format("{}: nests arrays and objects more than {} deep (at byte {}); no stallbench file does",
                                 file, kMaxJsonDepth, *at));
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {  // parse_error; out_of_range for a number such as 1e400
    // nlohmann's text without its "[json.exception.parse_error.101] parse error at " prefix:
    // "line 2, column 7: syntax error while parsing array - unexpected number literal; expected ']'"
    std::string_view what = e.what();
    if (const auto close = what.find("] "); what.starts_with("[json.exception.") && close != std::string_view::npos)
      what.remove_prefix(close + 2);
    for (std::string_view prefix : {"parse error at ", "parse error: "})
      if (what.starts_with(prefix)) what.remove_prefix(prefix.size());
    throw UsageError(fmt::format("{} is not valid JSON: {}", file, quoted_text(std::string(what))));
  }
}

void JsonRef::fail(std::string_view detail) const {
  throw UsageError(fmt::format("{}: {}: {}", file_, where(), detail));
}

void JsonRef::expected(std::string_view type) const { fail(fmt::format("expected {}, got {}", type, describe())); }

std::string JsonRef::describe() const {
  if (!v_) return "nothing (the field is missing)";
  switch (v_->type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "object";
    case json::value_t::array: return "array";
    case json::value_t::boolean: return fmt::format("boolean {}", v_->get<bool>());
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "integer " + v_->dump();
    case json::value_t::number_float: return fmt::format("number {}", v_->get<double>());
    case json::value_t::string:
      return "string " + shorten(v_->dump(-1, ' ', true, json::error_handler_t::replace));
    default: return v_->type_name();
  }
}

const json& JsonRef::raw() const {
  if (!v_) fail("missing");
  return *v_;
}

const JsonRef& JsonRef::object() const {
  if (!v_ || !v_->is_object()) expected("object");
  return *this;
}

const JsonRef& JsonRef::array() const {
  if (!v_ || !v_->is_array()) expected("array");
  return *this;
}

JsonRef JsonRef::at(std::string_view key) const {
  object();
  const auto it = v_->find(std::string(key));
  return JsonRef(it == v_->end() ? nullptr : &*it, file_, path_ + key_step(key, path_.empty()));
}

std::optional<JsonRef> JsonRef::find(std::string_view key) const {
  JsonRef m = at(key);
  if (!m.present()) return std::nullopt;
  return m;
}

JsonRef JsonRef::at(std::size_t index) const {
  array();
  if (index >= v_->size()) fail(fmt::format("has {} elements, no element {}", v_->size(), index));
  return JsonRef(&(*v_)[index], file_, fmt::format("{}[{}]", path_, index));
}

std::size_t JsonRef::size() const {
  if (!v_ || !(v_->is_array() || v_->is_object())) expected("array or object");
  return v_->size();
}

std::vector<std::pair<std::string, JsonRef>> JsonRef::members() const {
  object();
  std::vector<std::pair<std::string, JsonRef>> out;
  out.reserve(v_->size());
  for (auto it = v_->begin(); it != v_->end(); ++it)
    out.emplace_back(it.key(), JsonRef(&it.value(), file_, path_ + key_step(it.key(), path_.empty())));
  return out;
}

std::string JsonRef::str() const {
  if (!v_ || !v_->is_string()) expected("string");
  return v_->get<std::string>();
}

bool JsonRef::boolean() const {
  if (!v_ || !v_->is_boolean()) expected("boolean");
  return v_->get<bool>();
}

double JsonRef::number() const {
  if (!v_ || !v_->is_number()) expected("number");
  const double d = v_->get<double>();
  if (!std::isfinite(d)) expected("a finite number");
  return d;
}

double JsonRef::positive() const {
  if (!v_ || !v_->is_number()) expected("number > 0");
  const double d = v_->get<double>();
  if (!(d > 0) || !std::isfinite(d)) expected("number > 0");
  return d;
}

std::int64_t JsonRef::integer(std::int64_t lo, std::int64_t hi) const {
  const std::string type = lo == std::numeric_limits<std::int64_t>::min() && hi == std::numeric_limits<std::int64_t>::max()
                               ? std::string("integer")
                               : fmt::format("integer in [{}, {}]", lo, hi);
  if (!v_ || !v_->is_number_integer()) expected(type);
  // Read at full width first: 4294967297 must not narrow to 1, nor
  // 18446744073709551615 wrap to -1.
  if (v_->is_number_unsigned()) {
    const std::uint64_t u = v_->get<std::uint64_t>();
    if (hi < 0 || u > static_cast<std::uint64_t>(hi) || (lo > 0 && u < static_cast<std::uint64_t>(lo))) expected(type);
    return static_cast<std::int64_t>(u);
  }
  const std::int64_t i = v_->get<std::int64_t>();
  if (i < lo || i > hi) expected(type);
  return i;
}

std::string JsonRef::one_of(std::initializer_list<std::string_view> names) const {
  const std::string s = str();
  std::string all;
  for (auto n : names) {
    if (n == s) return s;
    if (!all.empty()) all += '|';
    all += n;
  }
  fail(fmt::format("expected one of {}, got {}", all, describe()));
}

std::string without_file_prefix(const std::string& message, const std::string& file) {
  const std::string prefix = file + ": ";
  return message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
}

}  // namespace sb
