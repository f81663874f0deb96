// The OpenMP team a oneDNN primitive is made for.
//
// oneDNN (OpenMP runtime) may take a primitive's thread count from the
// creating thread's omp_get_max_threads() and keep it: Debian 12's oneDNN 2.6
// matmul with a sum post-op (measured; a plain one takes the count when it
// runs) partitions its work for that many threads, and runs a team that size
// wherever it executes. The cpu device makes its primitives on the host
// thread and runs them on its compute thread, whose team reserve_host_cpus
// sets (HostCpuForHost: one CPU fewer than the process has). Made with the
// host's count (2 on a 2-core machine), a primitive ran a team of 2 on the
// compute thread's one CPU: a pool thread created there inherits that CPU,
// and the two took turns at every barrier. Measured (AMD EPYC, 2 cores,
// batch at micro batch 1, d_model 32, fp32): 976 us of device time per
// submission against 17 us at the next point, whose pool thread had been made
// before the pinning, on both CPUs (so, deduced and not measured, it took the
// host's CPU instead).
//
// TeamScope sets the calling thread's count to the compute thread's team
// while a primitive is made, and puts it back. A team of 0 (no
// reserve_host_cpus yet: the compute thread runs OpenMP's default, as the
// host does) changes nothing.
#pragma once

#include <omp.h>  // omp_get_max_threads, omp_set_num_threads

namespace sb::cpu {

class TeamScope {
 public:
  explicit TeamScope(int team) : saved_(omp_get_max_threads()), set_(team > 0 && team != saved_) {
    if (set_) omp_set_num_threads(team);
  }
  ~TeamScope() {
    if (set_) omp_set_num_threads(saved_);
  }
  TeamScope(const TeamScope&) = delete;
  TeamScope& operator=(const TeamScope&) = delete;

 private:
  int saved_;
  bool set_;
};

}  // namespace sb::cpu
