// Host memory: how much this process may still allocate, and one budget that
// every large host allocation is accounted against.
//
// On Linux a huge malloc succeeds and the process is killed later, when its
// pages are touched: in a container or a Slurm job the memory cgroup's limit
// is what kills it, not the machine's free memory. So before a large host
// allocation stallbench asks reserve_host_memory(), which refuses with
// OutOfMemory (a point status `oom`, never a kill) when the request does not
// fit under the tightest of:
//   - MemAvailable (/proc/meminfo);
//   - every memory cgroup from ours up to the root: limit minus what it uses
//     that the kernel cannot reclaim (usage - inactive file pages), cgroup v2
//     (memory.max, memory.current) and v1 (memory.limit_in_bytes,
//     memory.usage_in_bytes);
//   - RLIMIT_AS minus the address space in use.
// The check is cumulative: bytes reserved and not yet touched are counted
// against what is available, so many requests that each fit alone cannot
// together exceed it.
#pragma once

#include <cstdint>   // std::uint64_t
#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

namespace sb {

// One limit on the host memory this process may still use.
struct MemoryBound {
  std::uint64_t available = 0;  // bytes still usable under this bound
  std::string what;             // "cgroup v1 /sys/fs/cgroup/memory/x: limit 1.0 GiB, 310 MiB in use"
};

struct HostMemory {
  std::optional<std::uint64_t> mem_available;  // /proc/meminfo MemAvailable
  std::uint64_t rss = 0;                       // this process's anonymous resident memory (RssAnon), bytes
  std::vector<MemoryBound> bounds;             // every bound found (MemAvailable, cgroups, RLIMIT_AS)
  // The tightest bound, if any was found.
  std::optional<MemoryBound> tightest() const;
};

// Where the files are read from: tests point these at a fake tree.
struct HostMemoryPaths {
  std::string proc_self = "/proc/self";  // cgroup, statm
  std::string meminfo = "/proc/meminfo";
  std::string cgroup_root = "/sys/fs/cgroup";
  bool use_rlimit = true;  // read RLIMIT_AS with getrlimit
};

// Reads every bound now. Files that are missing or unreadable are skipped
// (no bound from them); it never throws.
HostMemory read_host_memory(const HostMemoryPaths& paths = {});

// Bytes kept back from every bound for what is not accounted (stacks,
// libraries, the allocator's own overhead): 64 MiB.
inline constexpr std::uint64_t kHostMemoryReserve = std::uint64_t(64) << 20;

// A reservation of host bytes; returns them on destruction. Move-only.
class HostReservation {
 public:
  HostReservation() = default;
  explicit HostReservation(std::uint64_t bytes) : bytes_(bytes) {}
  HostReservation(HostReservation&& o) noexcept : bytes_(o.bytes_) { o.bytes_ = 0; }
  HostReservation& operator=(HostReservation&& o) noexcept;
  HostReservation(const HostReservation&) = delete;
  HostReservation& operator=(const HostReservation&) = delete;
  ~HostReservation();
  std::uint64_t bytes() const { return bytes_; }

 private:
  std::uint64_t bytes_ = 0;
};

// Throws OutOfMemory naming `what`, the bytes asked, the bytes already
// reserved and the binding bound, when `bytes` more would not fit; else
// returns a reservation that holds them until it is destroyed.
HostReservation reserve_host_memory(std::uint64_t bytes, const std::string& what);

// The same check without reserving (for a size known before its parts are
// allocated one by one).
void check_host_memory(std::uint64_t bytes, const std::string& what);

// Bytes reserved now by this process.
std::uint64_t host_memory_reserved();

// For tests: read the bounds from `paths` instead of the real files
// (nullptr restores the real ones).
void set_host_memory_paths_for_testing(const HostMemoryPaths* paths);

}  // namespace sb
