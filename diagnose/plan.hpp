// `diagnose CONFIG --plan`: what a diagnosis will do, without measuring, in well under a second: every
// setting as the checks will use it with its source (the file's line, Axolotl's default for the
// release, the Hugging Face cache, a stallbench default), each check with what it will run or why
// the config already excludes its cause, and how long the measured run will take. The checks'
// config-side skips live here, so the plan and the run cannot disagree.
#pragma once

#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "diagnose/config.hpp"  // TrainConfig

namespace sb::diagnose {

// Why the check `check` ("loader", "dtype", "padding", "attention") is not run for this config (its
// cause is excluded by the settings themselves), or nothing when it runs.
std::optional<std::string> skipped_by_config(std::string_view check, const TrainConfig& c);

// The plan as text. `device` names the device the run would use ("cuda:0", "sim:h100-sxm", "cpu").
std::string format_plan(const TrainConfig& c, const std::string& config_path, const std::string& device,
                        bool quick, double budget_s);

}  // namespace sb::diagnose
