// Typed scenario parameters and sweeps. A scenario declares its parameters
// (type, default, range, unit, help); `-p key=v1,v2` on the command line
// turns a parameter into a sweep axis (text parameters, whose values may hold
// commas, separate theirs with ';'), and the sweep is the cartesian product
// of all axes (like nvbench axes). Axis names become JSON keys unchanged.
#pragma once

#include <cstdint>     // std::int64_t
#include <functional>  // std::function
#include <limits>   // std::numeric_limits
#include <string>   // std::string
#include <utility>  // std::pair
#include <variant>  // std::variant
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/names.hpp"  // NameTable: to_string, parse and choices from one table

namespace sb {

enum class ParamType { integer, real, choice, boolean, text };

struct ParamSpec {
  std::string name;
  ParamType type = ParamType::integer;
  std::string default_value;  // one value or a comma list (a default sweep)
  std::string help;
  std::string unit;                  // "elements", "ms", "" for none
  double min = -std::numeric_limits<double>::infinity();  // integer and real only
  double max = std::numeric_limits<double>::infinity();
  std::vector<std::string> choices;  // choice only
  std::string quick_default;         // default under --quick ("" = default_value)
  std::string gpu_default;           // default on a cuda device ("" = default_value)
  // false for parameters that do not define a point's workload: those that steer measurement
  // only (trials), and a range whose points each record the value it produced (collective's
  // min_bytes, max_bytes and factor: each point has its `bytes`). compare matches points
  // without them (meta.measurement_params).
  bool workload = true;
  // For text parameters with a grammar (fault=hang@N): throws UsageError on
  // a bad value, so it is rejected with exit 2 before anything runs.
  std::function<void(const std::string&)> check;
  // Parameters that make this one moot when every one of them is given with
  // no 0 among its values (precision's size once m, n and k all are): its
  // default sweep then collapses to its first value, so the same point is not
  // measured once per default value. A value the user gives is kept.
  std::vector<std::string> moot_when_given;
  // A parameter that acts only when another has a value (numerics' model parameters: only with
  // case=custom). Given while none of that one's values is it, it would do nothing: expand_sweep
  // refuses it (UsageError, exit 2) and says what to add. Empty: always acts.
  std::pair<std::string, std::string> only_with;
  // A default that depends on what else was given (packing's strategies for a histogram file:
  // pack-hist, not pack-ffd and pack-bfd, which expand its counts). Called with the text given for a
  // parameter, or nullopt; returns the default to use, or nullopt for the usual one. Not called
  // when this parameter is given.
  std::function<std::optional<std::string>(const std::function<std::optional<std::string>(const std::string&)>&)>
      default_from;
};

using ParamValue = std::variant<std::int64_t, double, bool, std::string>;

std::string format_value(const ParamValue&);

// One point of a sweep: every declared parameter with one value, in
// declaration order.
// The one `trials` parameter every measured scenario takes: the minimum
// number of timed trials (more run until the noise is low or the budget is
// spent). Measurement-only: compare matches points without it.
ParamSpec trials_param(std::string default_value, std::string quick_default = "");

[[noreturn]] void throw_bad_choice(const std::string& name, const std::string& value,
                                   const std::vector<std::string>& valid);

class ParamSet {
 public:
  void set(const std::string& name, ParamValue v);
  bool has(const std::string& name) const;
  const ParamValue& get(const std::string& name) const;  // throws std::out_of_range
  std::int64_t get_int(const std::string& name) const;
  double get_real(const std::string& name) const;
  bool get_bool(const std::string& name) const;
  const std::string& get_str(const std::string& name) const;
  // A choice parameter read through the name table its choices came from.
  // Throws UsageError (exit 2) naming the parameter when the value is not in
  // the table: never an empty optional dereferenced, never a silent fallback.
  template <class E, std::size_t N>
  E get_choice(const std::string& name, const NameTable<E, N>& table) const {
    const std::string& s = get_str(name);
    if (auto v = table.parse(s)) return *v;
    throw_bad_choice(name, s, table.names());
  }
  nlohmann::ordered_json to_json() const;
  const std::vector<std::pair<std::string, ParamValue>>& items() const { return values_; }

 private:
  std::vector<std::pair<std::string, ParamValue>> values_;
};

struct Sweep {
  std::vector<ParamSet> points;
  nlohmann::ordered_json axes = nlohmann::ordered_json::object();  // name -> [values]
};

struct SweepProfile {
  bool quick = false;
  bool gpu = false;
};

// Parses one value for spec; throws UsageError naming the parameter, the bad
// text and what is valid.
ParamValue parse_value(const ParamSpec& spec, const std::string& text);

// Expands "key=v1,v2" assignments against the specs. Throws UsageError for an
// unknown key (naming the valid keys), a repeated key, a missing '=', an empty
// list, a malformed or out-of-range value. Cap: 10000 points.
Sweep expand_sweep(const std::vector<ParamSpec>& specs, const std::vector<std::string>& assignments,
                   const SweepProfile& profile);

// "[16, 65536]" or "fp32|bf16" or "true|false": the valid range of a spec.
std::string describe_range(const ParamSpec& spec);
inline constexpr NameTable<ParamType, 5> kParamTypeNames{{{{ParamType::integer, "int"}, {ParamType::real, "real"}, {ParamType::choice, "choice"}, {ParamType::boolean, "bool"}, {ParamType::text, "text"}}}};
inline std::string_view to_string(ParamType v) { return kParamTypeNames.name(v); }

}  // namespace sb
