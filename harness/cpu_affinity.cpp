#include "harness/cpu_affinity.hpp"

#include <fcntl.h>     // open
#include <sys/file.h>  // flock
#include <sys/stat.h>  // fstat, S_ISREG
#include <unistd.h>    // close

#include <algorithm>  // std::find, std::sort
#include <cerrno>     // errno, EINTR
#include <cstdlib>    // std::getenv

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

std::string CpuClaims::default_dir() {
  const char* d = std::getenv("STALLBENCH_LOCK_DIR");
  return d && *d ? std::string(d) : std::string("/tmp");
}

void CpuClaims::release() {
  for (int fd : fds_) (void)::close(fd);  // closing the last descriptor drops the flock
  fds_.clear();
  contended_.clear();
}

std::vector<int> CpuClaims::claim(const std::vector<int>& allowed, std::size_t n) {
  release();
  std::vector<int> out;
  for (int c : allowed) {
    if (out.size() >= n) break;
    const std::string path = dir_ + "/stallbench-cpu" + std::to_string(c) + ".lock";
    // O_RDONLY is enough for flock, so a file another user made (mode 0644) still serves. O_NONBLOCK:
    // a FIFO someone left at the path must not block the open (it is then no lock: not a regular file).
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0666);
    if (fd < 0) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st {};
    if (fd >= 0 && (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
      (void)::close(fd);
      fd = -1;
    }
    if (fd < 0) {  // no lock to take: not a claim anyone else can see either
      out.push_back(c);
      continue;
    }
    int rc;
    do rc = ::flock(fd, LOCK_EX | LOCK_NB);
    while (rc != 0 && errno == EINTR);
    if (rc == 0) {
      fds_.push_back(fd);
      out.push_back(c);
    } else {
      // EWOULDBLOCK: another process holds it. Anything else (ENOLCK, EINVAL: a file system without
      // flock, as some NFS and FUSE mounts) is no lock to take, not a contended CPU.
      const bool held = errno == EWOULDBLOCK;
      (void)::close(fd);
      if (!held) out.push_back(c);
    }
  }
  // too few free: share the claimed ones, in order
  for (int c : allowed) {
    if (out.size() >= n) break;
    if (std::find(out.begin(), out.end(), c) != out.end()) continue;
    out.push_back(c);
    contended_.push_back(c);
  }
  std::sort(out.begin(), out.end());
  std::sort(contended_.begin(), contended_.end());
  return out;
}

}  // namespace sb
