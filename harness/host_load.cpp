#include "harness/host_load.hpp"

#include <chrono>   // std::chrono::steady_clock
#include <fstream>  // std::ifstream
#include <sstream>  // std::istringstream
#include <string>   // std::getline
#include <vector>   // std::vector

namespace sb {

namespace {

// Both files say what is read here on their first line (/proc/stat then lists every CPU).
std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

CpuTicks parse_cpu_ticks(const std::string& proc_stat, const std::string& self_stat, double wall_s) {
  CpuTicks t;
  t.wall_s = wall_s;
  // "cpu  user nice system idle iowait irq softirq steal guest guest_nice"
  std::istringstream in(proc_stat);
  std::string label;
  if (!(in >> label) || label != "cpu") return t;
  std::vector<unsigned long long> f;
  unsigned long long v = 0;
  while (f.size() < 10 && in >> v) f.push_back(v);
  if (f.size() < 8) return t;
  t.busy = f[0] + f[1] + f[2] + f[5] + f[6];
  for (std::size_t i = 0; i < 8; ++i) t.total += f[i];  // guest time is already in user
  t.steal = f[7];
  // /proc/self/stat: "pid (comm) state ppid ..."; comm may hold spaces and
  // parentheses, so fields are counted after the last ')'. utime and stime
  // are fields 14 and 15, the 12th and 13th after it.
  const auto close = self_stat.rfind(')');
  if (close == std::string::npos) return t;
  std::istringstream rest(self_stat.substr(close + 1));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 1; i <= 13 && rest >> field; ++i) {
    if (i == 12) utime = std::stoull(field);
    if (i == 13) stime = std::stoull(field);
  }
  if (!rest) return t;
  t.self = utime + stime;
  t.ok = true;
  return t;
}

CpuTicks read_cpu_ticks() {
  const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  try {
    return parse_cpu_ticks(first_line("/proc/stat"), first_line("/proc/self/stat"), now);
  } catch (...) {  // a field that is not a number: nothing is judged
    return CpuTicks{};
  }
}

std::optional<HostLoad> host_load(const CpuTicks& a, const CpuTicks& b) {
  if (!a.ok || !b.ok || b.total <= a.total || b.busy < a.busy || b.self < a.self || b.steal < a.steal)
    return std::nullopt;
  const double total = double(b.total - a.total), stolen = double(b.steal - a.steal);
  if (total < 20) return std::nullopt;
  const double busy = double(b.busy - a.busy), self = double(b.self - a.self);
  HostLoad h;
  // Of the time the CPUs ran for this machine (not stolen), what other processes took. Our own
  // ticks are counted per thread and can run a tick ahead of the machine's: never below 0.
  h.other_pct = busy > self && total > stolen ? 100 * (busy - self) / (total - stolen) : 0;
  h.steal_pct = 100 * stolen / total;
  h.window_s = b.wall_s - a.wall_s;
  return h;
}

}  // namespace sb
