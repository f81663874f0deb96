#include "harness/host_memory.hpp"

#include <sys/resource.h>  // getrlimit
#include <unistd.h>        // sysconf

#include <algorithm>   // std::min, std::max
#include <filesystem>  // std::filesystem::path
#include <fstream>     // std::ifstream
#include <mutex>       // std::mutex
#include <sstream>     // std::istringstream

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // OutOfMemory
#include "harness/units.hpp"   // format_bytes

namespace sb {
namespace {

namespace fs = std::filesystem;

// A cgroup v1 "no limit" is PAGE_COUNTER_MAX in bytes (about 2^63); anything
// at or above 2^62 is treated as unlimited.
constexpr std::uint64_t kUnlimited = std::uint64_t(1) << 62;

std::optional<std::uint64_t> read_u64(const fs::path& p) {
  std::ifstream f(p);
  std::string s;
  if (!(f >> s) || s.empty()) return std::nullopt;
  if (s == "max") return kUnlimited;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9' || v > (UINT64_MAX - 9) / 10) return std::nullopt;
    v = v * 10 + std::uint64_t(c - '0');
  }
  return v;
}

// A `key value` line of memory.stat.
std::optional<std::uint64_t> stat_value(const fs::path& stat, const std::string& key) {
  std::ifstream f(stat);
  std::string k;
  std::uint64_t v = 0;
  while (f >> k >> v)
    if (k == key) return v;
  return std::nullopt;
}

std::optional<std::uint64_t> meminfo_available(const std::string& path) {
  std::ifstream f(path);
  std::string key, unit;
  std::uint64_t kib = 0;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return std::nullopt;
}

// Our memory cgroup's path in each hierarchy, from /proc/self/cgroup:
// "4:memory:/a/b" (v1) and "0::/a/b" (v2).
struct CgroupPaths {
  std::optional<std::string> v1, v2;
};
CgroupPaths self_cgroups(const std::string& proc_self) {
  CgroupPaths out;
  std::ifstream f(proc_self + "/cgroup");
  std::string line;
  while (std::getline(f, line)) {
    const auto a = line.find(':');
    const auto b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {
      out.v2 = path;
      continue;
    }
    std::istringstream cs(controllers);
    for (std::string c; std::getline(cs, c, ',');)
      if (c == "memory") out.v1 = path;
  }
  return out;
}

// The directory of our cgroup under `mount`; inside a cgroup namespace the
// path from /proc/self/cgroup may not exist under the mount, whose root is
// then our cgroup itself.
fs::path cgroup_dir(const fs::path& mount, const std::string& rel) {
  fs::path d = mount / fs::path(rel).relative_path();
  std::error_code ec;
  return fs::is_directory(d, ec) ? d : mount;
}

// One bound per limited cgroup from `dir` up to `mount` (a parent's limit
// holds for all its children).
void cgroup_bounds(const fs::path& mount, fs::path dir, int version, std::vector<MemoryBound>& out) {
  const char* limit_file = version == 2 ? "memory.max" : "memory.limit_in_bytes";
  const char* usage_file = version == 2 ? "memory.current" : "memory.usage_in_bytes";
  const char* inactive_key = version == 2 ? "inactive_file" : "total_inactive_file";
  for (int depth = 0; depth < 64; ++depth) {
    const auto limit = read_u64(dir / limit_file);
    const auto usage = read_u64(dir / usage_file);
    if (limit && usage && *limit < kUnlimited) {
      // Inactive file pages are reclaimed before the cgroup's OOM killer runs.
      const std::uint64_t inactive = stat_value(dir / "memory.stat", inactive_key).value_or(0);
      const std::uint64_t used = *usage - std::min(*usage, inactive);
      out.push_back({*limit - std::min(*limit, used),
                     fmt::format("cgroup v{} {}: {} {}, {} in use", version, dir.string(), limit_file,
                                 format_bytes(double(*limit)), format_bytes(double(used)))});
    }
    if (dir == mount || !dir.has_parent_path() || dir.parent_path() == dir) break;
    dir = dir.parent_path();
  }
}

struct Statm {
  std::uint64_t size = 0, rss = 0;  // bytes
};
Statm read_statm(const std::string& proc_self) {
  std::ifstream f(proc_self + "/statm");
  std::uint64_t size = 0, rss = 0;
  if (!(f >> size >> rss)) return {};
  const long page = ::sysconf(_SC_PAGESIZE);
  const std::uint64_t p = page > 0 ? std::uint64_t(page) : 4096;
  return {size * p, rss * p};
}

// Anonymous resident memory (RssAnon in /proc/self/status): what touching
// reserved heap pages adds. Total RSS would count a mapped file's pages
// too, and take them for reserved bytes already touched.
std::optional<std::uint64_t> rss_anon(const std::string& proc_self) {
  std::ifstream f(proc_self + "/status");
  std::string key;
  for (std::string line; std::getline(f, line);) {
    std::istringstream ls(line);
    std::uint64_t kib = 0;
    if (ls >> key >> kib && key == "RssAnon:") return kib * 1024;
  }
  return std::nullopt;
}

std::uint64_t resident_anon(const std::string& proc_self) {
  if (auto a = rss_anon(proc_self)) return *a;
  return read_statm(proc_self).rss;
}

struct Budget {
  std::mutex mu;
  std::uint64_t reserved = 0;
  std::uint64_t rss_base = 0;  // resident set when `reserved` last rose from 0
  const HostMemoryPaths* test_paths = nullptr;
};
Budget& budget() {
  static Budget b;
  return b;
}

const HostMemoryPaths& current_paths(const Budget& b) {
  static const HostMemoryPaths real;
  return b.test_paths ? *b.test_paths : real;
}

// Throws when `bytes` more do not fit; b.mu held.
void check_locked(Budget& b, std::uint64_t bytes, const std::string& what) {
  const HostMemory m = read_host_memory(current_paths(b));
  const auto t = m.tightest();
  if (!t) return;  // nothing readable: no bound to enforce
  const std::uint64_t usable = t->available - std::min(t->available, kHostMemoryReserve);
  // Reserved bytes already touched show in the bounds' usage; only the
  // untouched ones are still to come. Touched is at most the growth of the
  // resident set since the reservations began.
  const std::uint64_t grown = m.rss > b.rss_base ? m.rss - b.rss_base : 0;
  const std::uint64_t untouched = b.reserved - std::min(b.reserved, grown);
  if (bytes > usable || untouched > usable - bytes)
    throw OutOfMemory(fmt::format(
        "host: {} needs {}, but only {} is usable ({} kept back){}; tightest bound: {}", what,
        format_bytes(double(bytes)), format_bytes(double(usable)), format_bytes(double(kHostMemoryReserve)),
        untouched ? fmt::format(" and {} of it is reserved by this run, not yet touched", format_bytes(double(untouched)))
                  : std::string(),
        t->what));
}

}  // namespace

std::optional<MemoryBound> HostMemory::tightest() const {
  std::optional<MemoryBound> best;
  for (const auto& b : bounds)
    if (!best || b.available < best->available) best = b;
  return best;
}

HostMemory read_host_memory(const HostMemoryPaths& paths) {
  HostMemory m;
  m.mem_available = meminfo_available(paths.meminfo);
  if (m.mem_available)
    m.bounds.push_back({*m.mem_available, fmt::format("{} MemAvailable {}", paths.meminfo,
                                                      format_bytes(double(*m.mem_available)))});
  const CgroupPaths cg = self_cgroups(paths.proc_self);
  const fs::path root(paths.cgroup_root);
  std::error_code ec;
  if (cg.v1 && fs::is_directory(root / "memory", ec))
    cgroup_bounds(root / "memory", cgroup_dir(root / "memory", *cg.v1), 1, m.bounds);
  // v2 where the unified hierarchy is mounted at the root and has the memory
  // controller (a hybrid's /sys/fs/cgroup/unified has none).
  if (cg.v2 && fs::exists(root / "cgroup.controllers", ec)) cgroup_bounds(root, cgroup_dir(root, *cg.v2), 2, m.bounds);
  const Statm sm = read_statm(paths.proc_self);
  m.rss = resident_anon(paths.proc_self);
  if (paths.use_rlimit) {
    rlimit rl{};
    if (::getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && sm.size) {
      const std::uint64_t lim = rl.rlim_cur;
      m.bounds.push_back({lim - std::min<std::uint64_t>(lim, sm.size),
                          fmt::format("RLIMIT_AS {}, {} of address space in use", format_bytes(double(lim)),
                                      format_bytes(double(sm.size)))});
    }
  }
  return m;
}

HostReservation& HostReservation::operator=(HostReservation&& o) noexcept {
  if (this != &o) {
    HostReservation old(std::move(*this));
    bytes_ = o.bytes_;
    o.bytes_ = 0;
  }
  return *this;
}

HostReservation::~HostReservation() {
  if (!bytes_) return;
  Budget& b = budget();
  std::lock_guard lk(b.mu);
  b.reserved -= std::min(b.reserved, bytes_);
}

HostReservation reserve_host_memory(std::uint64_t bytes, const std::string& what) {
  if (bytes == 0) return {};
  Budget& b = budget();
  std::lock_guard lk(b.mu);
  if (b.reserved == 0) b.rss_base = resident_anon(current_paths(b).proc_self);
  check_locked(b, bytes, what);
  b.reserved += bytes;
  return HostReservation(bytes);
}

void check_host_memory(std::uint64_t bytes, const std::string& what) {
  if (bytes == 0) return;
  Budget& b = budget();
  std::lock_guard lk(b.mu);
  if (b.reserved == 0) b.rss_base = resident_anon(current_paths(b).proc_self);
  check_locked(b, bytes, what);
}

std::uint64_t host_memory_reserved() {
  Budget& b = budget();
  std::lock_guard lk(b.mu);
  return b.reserved;
}

void set_host_memory_paths_for_testing(const HostMemoryPaths* paths) {
  Budget& b = budget();
  std::lock_guard lk(b.mu);
  b.test_paths = paths;
}

}  // namespace sb
