// A Trainer's trainer_state.json, as `diagnose DIR` reads it: the bytes parsed (NaN and Infinity
// tokens quoted first), then every detector run on the curves and the throughput read (and corrected, held against an H100). Only a
// UsageError may escape; the findings' steps are steps of the log.
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint8_t

#include <cmath>    // std::isfinite

#include "diagnose/run/curves.hpp"      // analyze_curves, logged_throughput
#include "diagnose/run/throughput.hpp"  // read_throughput
#include "readers/trainer_state.hpp"  // parse_trainer_state
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string file = "fuzz-trainer_state.json";
  sb::fuzz::usage_errors_only(file, [&] {
    const sb::TrainerState s = sb::parse_trainer_state(std::string(sb::fuzz::as_text(data, size)), file);
    const auto found = sb::diagnose::analyze_curves(s);
    for (const auto& f : found) {
      bool logged = false;
      for (const auto& e : s.log) logged = logged || e.step == f.step;
      sb::fuzz::require(logged || f.kind == "past_best" || f.kind == "early_stopping",
                        "a finding's step is a logged step (the best's is the checkpoint's)");
      sb::fuzz::require(!f.summary.empty() && !f.reproduce.empty(), "a finding says what and how to reproduce");
    }
    (void)sb::diagnose::logged_throughput(s);
    // the throughput corrected and held against a GPU (throughput.hpp): every figure finite, an MFU in (0, 100]
    sb::diagnose::ThroughputOptions o;
    o.gpu = "h100";
    const sb::diagnose::ModelDims dims;
    const auto t = sb::diagnose::read_throughput(s, nullptr, &dims, false, "", o);
    sb::fuzz::require(std::isfinite(t.samples_per_s) && std::isfinite(t.steps_per_s) && t.samples_per_s >= 0,
                      "the corrected throughput is a finite, non-negative figure");
    sb::fuzz::require(!t.mfu_pct || (std::isfinite(*t.mfu_pct) && *t.mfu_pct >= 0 && (*t.mfu_pct <= 100 || !t.world)),
                      "an MFU over known GPUs is at most 100%");
    sb::fuzz::require(!t.tokens_per_s || std::isfinite(*t.tokens_per_s), "tokens/s is finite");
  });
  return 0;
}
