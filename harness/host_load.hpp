// What else ran on this machine while a point was measured: the CPU time of
// other processes and the time the hypervisor took (steal), from /proc/stat
// and /proc/self/stat, over the point's window. A 2-core VM shared with a
// compiler made every GEMM read 7.95 ms (an OpenMP team member descheduled
// for a scheduler slice at each barrier) with 0.3% noise and no warning; the
// figures were consistent, and wrong. The runner records this per point and
// warns above a threshold.
#pragma once

#include <optional>  // std::optional
#include <string>    // std::string

namespace sb {

// Clock ticks (USER_HZ) of the whole machine and of this process, at one moment.
struct CpuTicks {
  unsigned long long busy = 0;   // user + nice + system + irq + softirq, every CPU
  unsigned long long total = 0;  // every field of /proc/stat's cpu line but guest (counted in user)
  unsigned long long steal = 0;  // taken by the hypervisor
  unsigned long long self = 0;   // this process: utime + stime, every thread
  double wall_s = 0;             // steady clock
  bool ok = false;               // false where /proc cannot be read (then nothing is judged)
};

CpuTicks read_cpu_ticks();
// Parses the two files' texts (tests give their own).
CpuTicks parse_cpu_ticks(const std::string& proc_stat, const std::string& self_stat, double wall_s);

struct HostLoad {
  double other_pct = 0;  // other processes' busy ticks over the ticks every CPU ran for this machine (not stolen), in %
  double steal_pct = 0;  // stolen ticks over every CPU's ticks, in %
  double window_s = 0;
};

// Over [a, b]; nullopt when either read failed or the window holds too few ticks to say
// (under 20 in all: at 100 Hz on 2 CPUs, 0.1 s).
std::optional<HostLoad> host_load(const CpuTicks& a, const CpuTicks& b);

// Other processes at or over this share of the machine, or steal at or over
// kStealWarnPct, make a point's timings suspect.
inline constexpr double kOtherWarnPct = 25;
inline constexpr double kStealWarnPct = 10;

}  // namespace sb
