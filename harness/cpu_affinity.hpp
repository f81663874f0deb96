// Which CPUs a thread runs on: the list this process may use, pinning the
// calling thread to a list, and putting a thread's mask back. Used to give a
// device's compute and a host loader CPUs of their own (dataloader scenario).
#pragma once

#include <sched.h>  // cpu_set_t

#include <vector>  // std::vector

namespace sb {

// The CPUs the calling thread may run on now (its affinity mask), ascending;
// {0} if the mask cannot be read.
std::vector<int> allowed_cpus();

// Pins the calling thread to `cpus`; nothing when empty. Best effort: a CPU
// taken away since is no error.
void pin_this_thread(const std::vector<int>& cpus);

// Saves the calling thread's mask and puts it back when destroyed.
class ThreadAffinityGuard {
 public:
  ThreadAffinityGuard();
  ~ThreadAffinityGuard();
  ThreadAffinityGuard(const ThreadAffinityGuard&) = delete;
  ThreadAffinityGuard& operator=(const ThreadAffinityGuard&) = delete;

 private:
  cpu_set_t saved_;
  bool ok_ = false;
};

}  // namespace sb
