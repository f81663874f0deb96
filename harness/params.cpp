#include "harness/params.hpp"

#include <algorithm>    // std::find, std::find_if
#include <array>        // std::array: the size suffixes
#include <cerrno>       // errno
#include <limits>       // std::numeric_limits
#include <string_view>  // std::string_view
#include <cmath>      // std::isfinite
#include <cstdlib>    // std::strtoll, std::strtod
#include <stdexcept>  // std::out_of_range

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/errors.hpp"  // UsageError

namespace sb {

ParamSpec trials_param(std::string default_value, std::string quick_default) {
  return ParamSpec{.name = "trials",
                   .type = ParamType::integer,
                   .default_value = std::move(default_value),
                   .help = "minimum timed trials; more run until noise < --noise or the --budget is spent",
                   .unit = "trials",
                   .min = 1,
                   .max = 100000,
                   .quick_default = std::move(quick_default),
                   .workload = false};
}

void throw_bad_choice(const std::string& name, const std::string& value, const std::vector<std::string>& valid) {
  throw UsageError(fmt::format("parameter {}: '{}' is not one of {}", name, value, fmt::join(valid, "|")));
}

std::string format_value(const ParamValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) return x ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::string>) return x;
        else if constexpr (std::is_same_v<T, double>) return fmt::format("{:g}", x);
        else return fmt::format("{}", x);
      },
      v);
}

void ParamSet::set(const std::string& name, ParamValue v) {
  for (auto& [k, old] : values_)
    if (k == name) {
      old = std::move(v);
      return;
    }
  values_.emplace_back(name, std::move(v));
}

bool ParamSet::has(const std::string& name) const {
  return std::any_of(values_.begin(), values_.end(), [&](const auto& p) { return p.first == name; });
}

const ParamValue& ParamSet::get(const std::string& name) const {
  for (const auto& [k, v] : values_)
    if (k == name) return v;
  throw std::out_of_range("parameter not in set: " + name);
}

std::int64_t ParamSet::get_int(const std::string& n) const { return std::get<std::int64_t>(get(n)); }
double ParamSet::get_real(const std::string& n) const { return std::get<double>(get(n)); }
bool ParamSet::get_bool(const std::string& n) const { return std::get<bool>(get(n)); }
const std::string& ParamSet::get_str(const std::string& n) const {
  return std::get<std::string>(get(n));
}

nlohmann::ordered_json ParamSet::to_json() const {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [k, v] : values_) std::visit([&](const auto& x) { j[k] = x; }, v);
  return j;
}

std::string describe_range(const ParamSpec& s) {
  switch (s.type) {
    case ParamType::choice: return fmt::format("{}", fmt::join(s.choices, "|"));
    case ParamType::boolean: return "true|false";
    case ParamType::text: return "text";
    case ParamType::integer:
    case ParamType::real: {
      const bool integer = s.type == ParamType::integer;
      auto f = [integer](double x) {
        if (!std::isfinite(x)) return std::string(x < 0 ? "-inf" : "inf");
        return integer ? fmt::format("{:.0f}", x) : fmt::format("{:g}", x);
      };
      return fmt::format("[{}, {}]", f(s.min), f(s.max));
    }
  }
  return "";
}

ParamValue parse_value(const ParamSpec& s, const std::string& text) {
  auto bad = [&](const std::string& what) {
    return UsageError(fmt::format("parameter {}: '{}' {}; valid: {}{}", s.name, text, what,
                                  describe_range(s), s.unit.empty() ? "" : " " + s.unit));
  };
  if (text.empty()) throw bad("is empty");
  switch (s.type) {
    case ParamType::integer: {
      errno = 0;
      char* end = nullptr;
      long long v = std::strtoll(text.c_str(), &end, 10);
      if (end == text.c_str() || errno == ERANGE) throw bad("is not an integer");
      // A byte count takes a binary suffix, as nccl-tests' -b/-e do: 1G = 2^30 (K, M, G, T, or KiB ... TiB)
      if (*end != '\0' && s.unit == "bytes") {
        const std::string_view suffix = end;
        static constexpr std::array<std::pair<std::string_view, int>, 8> kSuffixes{
            {{"K", 10}, {"KiB", 10}, {"M", 20}, {"MiB", 20}, {"G", 30}, {"GiB", 30}, {"T", 40}, {"TiB", 40}}};
        const auto it = std::find_if(kSuffixes.begin(), kSuffixes.end(), [&](const auto& k) { return k.first == suffix; });
        if (it == kSuffixes.end()) throw bad("has an unknown size suffix (K, M, G, T: powers of 1024)");
        if (v < 0 || v > (std::numeric_limits<long long>::max() >> it->second)) throw bad("is out of range");
        v <<= it->second;
      } else if (*end != '\0') {
        throw bad("is not an integer");
      }
      if (double(v) < s.min || double(v) > s.max) throw bad("is out of range");
      return std::int64_t(v);
    }
    case ParamType::real: {
      errno = 0;
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (end == text.c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
        throw bad("is not a number");
      if (v < s.min || v > s.max) throw bad("is out of range");
      return v;
    }
    case ParamType::boolean:
      if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
      if (text == "false" || text == "0" || text == "no" || text == "off") return false;
      throw bad("is not a boolean");
    case ParamType::choice:
      if (std::find(s.choices.begin(), s.choices.end(), text) == s.choices.end())
        throw bad("is not one of the choices");
      return text;
    case ParamType::text:
      if (s.check) {
        try {
          s.check(text);
        } catch (const UsageError& e) {
          throw UsageError(fmt::format("parameter {}: {}", s.name, e.what()));
        }
      }
      return text;
  }
  throw bad("has an unknown type");
}

namespace {
std::vector<std::string> split_list(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const auto comma = s.find(sep, start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}
}  // namespace

Sweep expand_sweep(const std::vector<ParamSpec>& specs, const std::vector<std::string>& assignments,
                   const SweepProfile& profile) {
  std::vector<std::string> given(specs.size());
  std::vector<bool> seen(specs.size(), false);
  auto valid_keys = [&] {
    std::vector<std::string> names;
    for (const auto& s : specs) names.push_back(s.name);
    return fmt::format("{}", fmt::join(names, ", "));
  };
  for (const auto& a : assignments) {
    const auto eq = a.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError(fmt::format("-p '{}': expected key=value[,value...]; valid keys: {}", a, valid_keys()));
    const std::string key = a.substr(0, eq);
    const auto it = std::find_if(specs.begin(), specs.end(), [&](const ParamSpec& s) { return s.name == key; });
    if (it == specs.end())
      throw UsageError(fmt::format("unknown parameter '{}'; valid keys: {}", key, valid_keys()));
    const auto idx = std::size_t(it - specs.begin());
    if (seen[idx]) throw UsageError(fmt::format("parameter {} given twice; put all its values in one comma list", key));
    seen[idx] = true;
    given[idx] = a.substr(eq + 1);
  }

  // A parameter given that acts only with another's value it will not have (ParamSpec::only_with)
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto& [other, value] = specs[i].only_with;
    if (!seen[i] || other.empty()) continue;
    const auto it = std::find_if(specs.begin(), specs.end(), [&](const ParamSpec& o) { return o.name == other; });
    if (it == specs.end()) continue;
    const auto j = std::size_t(it - specs.begin());
    std::string values = seen[j] ? given[j] : it->default_value;
    if (!seen[j] && profile.gpu && !it->gpu_default.empty()) values = it->gpu_default;
    if (!seen[j] && profile.quick && !it->quick_default.empty()) values = it->quick_default;
    const auto parts = split_list(values, it->type == ParamType::text ? ';' : ',');
    if (std::find(parts.begin(), parts.end(), value) == parts.end())
      throw UsageError(fmt::format("-p {}={} does nothing unless {}={} (now {}={}): add -p {}={}", specs[i].name,
                                   given[i], other, value, other, values, other, value));
  }

  Sweep sweep;
  std::vector<std::vector<ParamValue>> axes(specs.size());
  std::size_t total = 1;
  // A parameter is moot (ParamSpec::moot_when_given) when each of the named ones was given and
  // none of their values is 0.
  auto moot = [&](const ParamSpec& s) {
    if (s.moot_when_given.empty()) return false;
    for (const auto& name : s.moot_when_given) {
      const auto it = std::find_if(specs.begin(), specs.end(), [&](const ParamSpec& o) { return o.name == name; });
      if (it == specs.end()) return false;
      const auto j = std::size_t(it - specs.begin());
      if (!seen[j]) return false;
      for (const auto& part : split_list(given[j], ','))
        if (const ParamValue v = parse_value(*it, part); std::holds_alternative<std::int64_t>(v) && std::get<std::int64_t>(v) == 0)
          return false;
    }
    return true;
  };
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto& s = specs[i];
    std::string text = given[i];
    if (!seen[i]) {
      text = s.default_value;
      if (s.default_from)
        if (auto d = s.default_from([&](const std::string& name) -> std::optional<std::string> {
              for (std::size_t j = 0; j < specs.size(); ++j)
                if (specs[j].name == name && seen[j]) return given[j];
              return std::nullopt;
            }))
          text = *d;
      if (profile.gpu && !s.gpu_default.empty()) text = s.gpu_default;
      if (profile.quick && !s.quick_default.empty()) text = s.quick_default;
      if (moot(s)) text = split_list(text, s.type == ParamType::text ? ';' : ',').front();
    }
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    // Text values may hold commas themselves (lengths=lognormal:256,1.0), so
    // a text sweep separates its values with ';'.
    for (const auto& part : split_list(text, s.type == ParamType::text ? ';' : ',')) {
      axes[i].push_back(parse_value(s, part));
      std::visit([&](const auto& x) { list.push_back(x); }, axes[i].back());
    }
    // A moot default stays in each point (the scenario may read it) but not in the result's params: the
    // table's "fixed:" line said size=256 beside the m, n and k that ran.
    if (seen[i] || !moot(s)) sweep.axes[s.name] = list;
    total *= axes[i].size();
    if (total > 10000)
      throw UsageError(fmt::format("the sweep has more than 10000 points; shorten a list (at {})", s.name));
  }

  // Cartesian product; the last declared parameter varies fastest.
  std::vector<std::size_t> idx(specs.size(), 0);
  for (std::size_t p = 0; p < total; ++p) {
    ParamSet set;
    for (std::size_t i = 0; i < specs.size(); ++i) set.set(specs[i].name, axes[i][idx[i]]);
    sweep.points.push_back(std::move(set));
    for (std::size_t i = specs.size(); i-- > 0;) {
      if (++idx[i] < axes[i].size()) break;
      idx[i] = 0;
    }
  }
  return sweep;
}

}  // namespace sb
