#include "harness/watchdog.hpp"

#include <cstdio>   // std::fprintf
#include <unistd.h> // _exit

namespace sb {

Watchdog::Watchdog(std::chrono::seconds limit) : limit_(limit), last_(std::chrono::steady_clock::now()) {
  if (limit_.count() > 0) thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::progress(const std::string& where) {
  std::lock_guard lk(mu_);
  where_ = where;
  last_ = std::chrono::steady_clock::now();
}

void Watchdog::loop() {
  std::unique_lock lk(mu_);
  while (!stop_) {
    const auto deadline = last_ + limit_;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::fprintf(stderr,
                   "stallbench: watchdog: no progress for %lld s; last at: %s\n"
                   "stallbench: ending the run with exit code %d (hang)\n",
                   static_cast<long long>(limit_.count()), where_.c_str(), kExitHang);
      std::fflush(stderr);
      _exit(kExitHang);
    }
    cv_.wait_until(lk, deadline);
  }
}

}  // namespace sb
