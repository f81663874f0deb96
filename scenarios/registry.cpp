// The list of scenarios. Explicit, so no static-initialisation order or
// linker dead-stripping decides what exists.
#include "harness/scenario.hpp"  // Scenario

namespace sb {

extern const Scenario precision_scenario;
extern const Scenario dataloader_scenario;
extern const Scenario attention_scenario;
extern const Scenario packing_scenario;
extern const Scenario collective_scenario;

const std::vector<const Scenario*>& all_scenarios() {
  static const std::vector<const Scenario*> v{&precision_scenario, &dataloader_scenario, &attention_scenario,
                                                &packing_scenario, &collective_scenario};
  return v;
}

const Scenario* find_scenario(const std::string& name) {
  for (const Scenario* s : all_scenarios())
    if (s->name == name) return s;
  return nullptr;
}

}  // namespace sb
