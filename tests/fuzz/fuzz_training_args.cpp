// A training_args.bin, as `diagnose DIR` reads it: torch.save's zip, its data.pkl through the strict
// pickle reader with the TrainingArguments allow-list, the fields typed; then the report's JSON of
// them, the findings they prove and the schedule the plateau reading uses. Only a UsageError may
// escape; nothing in the input is ever executed.
#include <cmath>    // std::isfinite
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint8_t

#include "diagnose/run/curves.hpp"        // scheduled_lr
#include "diagnose/run/run_settings.hpp"  // settings_findings, training_args_json
#include "readers/training_args.hpp"      // parse_training_args
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string file = "fuzz-training_args.bin";
  sb::fuzz::usage_errors_only(file, [&] {
    const sb::TrainingArgs a = sb::parse_training_args(sb::fuzz::as_text(data, size), file);
    (void)sb::diagnose::training_args_json(a).dump();
    for (const auto& f : sb::diagnose::settings_findings(a, {}, "cpu"))
      sb::fuzz::require(!f.summary.empty() && !f.reproduce.empty(), "a settings finding says what and how to reproduce");
    for (const std::int64_t step : {0, 1, 50, 1000})
      if (const auto lr = sb::diagnose::scheduled_lr(a, 1000, step))
        sb::fuzz::require(std::isfinite(*lr) && *lr >= 0 && *lr <= *a.learning_rate * (1 + 1e-12),
                          "the schedule stays within 0 and the peak");
  });
  return 0;
}
