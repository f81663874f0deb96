// The list of scenarios. Explicit, so no static-initialisation order or
// linker dead-stripping decides what exists. Adding a scenario is one line
// here (its `const Scenario <name>_scenario` is defined in its own file),
// and tests/scenario/test_smoke.py covers it from then on.
#include "scenarios/registry.hpp"

#define SB_SCENARIOS(X) \
  X(precision)          \
  X(dataloader)         \
  X(attention)          \
  X(packing)            \
  X(collective)         \
  X(numerics)           \
  X(batch)              \
  X(memory)             \
  X(train)

namespace sb {

#define SB_DECLARE(name) extern const Scenario name##_scenario;
SB_SCENARIOS(SB_DECLARE)
#undef SB_DECLARE

const std::vector<const Scenario*>& all_scenarios() {
#define SB_ADDRESS(name) &name##_scenario,
  static const std::vector<const Scenario*> v{SB_SCENARIOS(SB_ADDRESS)};
#undef SB_ADDRESS
  return v;
}

const Scenario* find_scenario(const std::string& name) {
  for (const Scenario* s : all_scenarios())
    if (s->name == name) return s;
  return nullptr;
}

}  // namespace sb
