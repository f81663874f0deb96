// One JSON document per run (results/schema/result.schema.json). The terminal
// table (printer.hpp) and compare read this same data.
#pragma once

#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/stats.hpp"  // Stats
#include "harness/names.hpp"  // NameTable: to_string, parse and choices from one table

namespace sb {

inline constexpr int kResultSchemaVersion = 1;

enum class Direction { higher, lower, none };  // which way is better
enum class Status { ok, skipped, oom, hang, error };

inline constexpr NameTable<Direction, 3> kDirectionNames{{{{Direction::higher, "higher"}, {Direction::lower, "lower"}, {Direction::none, "none"}}}};
inline std::string_view to_string(Direction v) { return kDirectionNames.name(v); }
inline constexpr NameTable<Status, 5> kStatusNames{{{{Status::ok, "ok"}, {Status::skipped, "skipped"}, {Status::oom, "oom"}, {Status::hang, "hang"}, {Status::error, "error"}}}};
inline std::string_view to_string(Status v) { return kStatusNames.name(v); }
inline std::optional<Direction> parse_direction(std::string_view s) { return kDirectionNames.parse(s); }
inline std::optional<Status> parse_status(std::string_view s) { return kStatusNames.parse(s); }

struct Metric {
  std::string name;  // JSON key: "tflops", "speedup_vs_fp32"
  double value = 0;
  std::string unit;  // "TFLOP/s", "ms", "x", "%"
  Direction direction = Direction::none;
  std::optional<Stats> stats;  // present when the value is a summary of trials
  std::string note;
  bool in_table = true;  // false: JSON only, to keep the terminal table narrow
};

struct Point {
  nlohmann::ordered_json params = nlohmann::ordered_json::object();
  Status status = Status::ok;
  std::string reason;  // why skipped / oom / hang / error
  std::vector<Metric> metrics;
  nlohmann::ordered_json info = nlohmann::ordered_json::object();  // impl, reps, ...

  const Metric* metric(const std::string& name) const;
  void add(Metric m) { metrics.push_back(std::move(m)); }
};

struct Finding {
  std::string cause;    // "fp32 where bf16 would do"
  std::string summary;  // "fp32 -> bf16: 5.6x on this device"
  std::optional<double> speedup;  // measured gain of the fix, when there is one
  nlohmann::ordered_json evidence = nlohmann::ordered_json::object();
};

struct Result {
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  std::string scenario;
  nlohmann::ordered_json params = nlohmann::ordered_json::object();  // the sweep's axes
  std::vector<Point> points;
  std::vector<Finding> findings;
  nlohmann::ordered_json expected;  // the expected file used, if any (null otherwise)
  bool simulated() const;
};

// A point's parameters without those that only steer measurement (trials,
// min_time_s: meta.measurement_params): what defines its workload, for
// matching points across results or along a sweep.
nlohmann::ordered_json workload_params(const Result& r, const nlohmann::ordered_json& params);

nlohmann::ordered_json to_json(const Result&);
// Throws UsageError naming `file` and the path of the missing or mistyped
// field ("a.json: points[3].metrics.tflops.stats.n: expected integer, got
// string \"5\""); never a JSON library exception.
Result result_from_json(const nlohmann::ordered_json& doc, const std::string& file = "result");

// Writes text to path atomically: a temporary file in the same directory,
// flushed and fsync'd, then renamed over path. "-" writes to stdout.
// Throws Error(runtime) naming the path and errno text.
void write_file_atomic(const std::string& path, const std::string& text);

// Reads and parses a JSON file; throws UsageError naming the file and what is
// wrong (missing, unreadable, parse error with byte offset, nested too deep).
nlohmann::ordered_json read_json_file(const std::string& path);

}  // namespace sb
