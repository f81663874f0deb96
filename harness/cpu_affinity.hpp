// Which CPUs a thread runs on: the list this process may use, pinning the
// calling thread to a list, and putting a thread's mask back. Used to give a
// device's compute and a host loader CPUs of their own (dataloader scenario).
#pragma once

#include <sched.h>  // cpu_set_t

#include <string>  // std::string
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

// CPUs claimed across processes: an flock on one file per CPU in a lock
// directory (STALLBENCH_LOCK_DIR, else /tmp), held until release() or the
// process ends (the kernel drops it, whatever ended the process). A second
// stallbench process on the machine (a parallel `meson test`, two runs at
// once) then computes on other CPUs instead of both on the first allowed
// one; with too few CPUs left it shares, and says which.
class CpuClaims {
 public:
  explicit CpuClaims(std::string dir = default_dir()) : dir_(std::move(dir)) {}
  ~CpuClaims() { release(); }
  CpuClaims(const CpuClaims&) = delete;
  CpuClaims& operator=(const CpuClaims&) = delete;
  // Drops what this holds, then claims `n` of `allowed` (in its order), the
  // ones no other claimant holds first; where fewer are free, the rest are
  // taken from the claimed ones in order (shared, listed in contended()).
  // A lock that cannot be made (no directory, read-only) counts as free.
  std::vector<int> claim(const std::vector<int>& allowed, std::size_t n);
  void release();
  // The CPUs the last claim shares with another claimant, ascending.
  const std::vector<int>& contended() const { return contended_; }
  static std::string default_dir();

 private:
  std::string dir_;
  std::vector<int> fds_;
  std::vector<int> contended_;
};

}  // namespace sb
