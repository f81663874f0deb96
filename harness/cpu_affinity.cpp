#include "harness/cpu_affinity.hpp"

namespace sb {

std::vector<int> allowed_cpus() {
  std::vector<int> out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) out.push_back(c);
  if (out.empty()) out.push_back(0);
  return out;
}

void pin_this_thread(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  (void)sched_setaffinity(0, sizeof set, &set);
}

ThreadAffinityGuard::ThreadAffinityGuard() { ok_ = sched_getaffinity(0, sizeof saved_, &saved_) == 0; }

ThreadAffinityGuard::~ThreadAffinityGuard() {
  if (ok_) (void)sched_setaffinity(0, sizeof saved_, &saved_);
}

}  // namespace sb
