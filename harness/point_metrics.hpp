// What several scenarios write alike, in one place: the time and rate
// metrics of a Measurement, the info block saying how it was measured, and
// ratios of each point against a baseline point of the same shape measured
// in the same run (speedup over fp32, over naive attention, over padding).
#pragma once

#include <functional>  // std::function
#include <initializer_list>  // std::initializer_list
#include <map>         // std::map
#include <set>         // std::set
#include <span>        // std::span
#include <string>      // std::string

#include "harness/measure.hpp"  // Measurement
#include "harness/result.hpp"   // Point, Result

namespace sb {

// Adds "ms" (median time of one op, lower is better) and, when flops > 0,
// "tflops" (flops / time, per trial, higher is better). `op` names what one
// op is ("one GEMM", "one pass"); `formula` how flops are counted.
void add_time_and_rate(Point& p, const Measurement& m, double flops, const std::string& op,
                       const std::string& formula);

// {reps_per_trial, trials, stop, timing: {mode, flush_bytes | note}}: how the
// figures were measured, merged into a point's info.
nlohmann::ordered_json measurement_info(const Measurement& m);

// For each ok point that is not a baseline, the ok baseline point with the
// same key (if any): fn(point, baseline). Keys say what must match (shape,
// dtype, timing mode), so a ratio never divides figures of different shapes.
void against_baseline(Result& r, const std::function<std::string(const Point&)>& key,
                      const std::function<bool(const Point&)>& is_baseline,
                      const std::function<void(Point&, const Point&)>& fn);

// A sweep of several workloads (two length distributions, pin=pinned,pageable): each point
// against the points of its own workload, and each finding named by what sets it apart.
// The parameters whose values differ between r's points, but those in `but`.
std::set<std::string> varying_params(const Result& r, std::initializer_list<const char*> but);
// p's parameters without those in `but`, as a key.
std::string workload_key(const Point& p, std::initializer_list<const char*> but);
// "name=value name=value" of p's parameters in `names`, in p's order ("" when none).
std::string params_label(const Point& p, const std::set<std::string>& names);

// A step's utilization pattern for a point's info: {"pattern", "pattern_basis"}. The pattern is the
// sampled series' (classify) from 5 samples on; under that there is no shape to read, and it comes from
// busy % alone (healthy from 90%, else steady-low), which pattern_basis says.
nlohmann::ordered_json pattern_info(std::span<const double> util, double busy_frac);
// The pattern as a finding quotes it: "steady-low", or "steady-low, by busy % alone".
std::string pattern_text(const Point& p);

}  // namespace sb
