#include "harness/watchdog.hpp"

#include <cstdio>   // std::fprintf
#include <future>   // std::promise: the grace for on_fire
#include <unistd.h> // _exit

#include <fmt/format.h>  // fmt::format

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

void Watchdog::beat() {
  std::lock_guard lk(mu_);
  last_ = std::chrono::steady_clock::now();
}

void Watchdog::disarm() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
}

void Watchdog::on_fire(std::function<void(const std::string&)> f) {
  std::lock_guard lk(mu_);
  on_fire_ = std::move(f);
}

void Watchdog::loop() {
  std::unique_lock lk(mu_);
  while (!stop_) {
    const auto deadline = last_ + limit_;
    if (std::chrono::steady_clock::now() >= deadline) {
      const std::string what = fmt::format("no progress for {} s; last at: {}", limit_.count(), where_);
      std::fprintf(stderr, "stallbench: watchdog: %s\nstallbench: ending the run with exit code %d (hang)\n",
                   what.c_str(), kExitHang);
      std::fflush(stderr);
      if (auto f = on_fire_) {
        lk.unlock();
        // On its own thread, so a write that blocks cannot stop the exit.
        auto done = std::make_shared<std::promise<void>>();
        auto finished = done->get_future();
        std::thread([f, what, done] {
          try {
            f(what);
          } catch (const std::exception& e) {
            std::fprintf(stderr, "stallbench: watchdog: could not save the result: %s\n", e.what());
          }
          done->set_value();
        }).detach();
        const bool saved = finished.wait_for(kFireGrace) == std::future_status::ready;
        lk.lock();
        if (stop_) return;  // the run finished meanwhile (disarm): its own result stands
        lk.unlock();
        if (!saved) {
          // The saving thread may hold stdio's locks (a blocked write): plain write(2) only.
          static const char msg[] = "stallbench: watchdog: saving the result took too long; exiting without it\n";
          (void)!::write(2, msg, sizeof msg - 1);
          _exit(kExitHang);
        }
        std::fflush(stdout);
        std::fflush(stderr);
      }
      _exit(kExitHang);
    }
    cv_.wait_until(lk, deadline);
  }
}

}  // namespace sb
