// A Trainer's trainer_state.json, as `diagnose DIR` reads it: the bytes parsed (NaN and Infinity
// tokens quoted first), then every detector run on the curves and the throughput read. Only a
// UsageError may escape; the findings' steps are steps of the log.
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint8_t

#include "diagnose/run/curves.hpp"    // analyze_curves, logged_throughput
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
  });
  return 0;
}
