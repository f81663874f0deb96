// The registered scenarios: exactly the causes stallbench reproduces, one folder (or file) each
// under scenarios/. The engine (harness/scenario.hpp) knows the interface, not this list; the
// command and diagnose reach the scenarios through here.
#pragma once

#include <string>  // std::string
#include <vector>  // std::vector

#include "harness/scenario.hpp"  // Scenario

namespace sb {

// Every scenario, in the order `stallbench list` prints them (scenarios/registry.cpp).
const std::vector<const Scenario*>& all_scenarios();
// The scenario of that name, or nullptr.
const Scenario* find_scenario(const std::string& name);

}  // namespace sb
