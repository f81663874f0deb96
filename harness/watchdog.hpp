// The last line of defence against a hang: a thread that ends the process
// with a distinct exit code (4) when the run makes no progress for `limit`,
// naming the last phase it reported. Waits inside devices have their own,
// shorter deadlines (HangError); this catches what those cannot (a library
// call that never returns).
#pragma once

#include <chrono>              // std::chrono
#include <condition_variable>  // std::condition_variable
#include <functional>          // std::function: on_fire
#include <mutex>               // std::mutex
#include <string>              // std::string
#include <thread>              // std::thread
#include "harness/exit_codes.hpp"  // kExit*

namespace sb {

class Watchdog {
 public:
  // limit <= 0 disables it.
  explicit Watchdog(std::chrono::seconds limit);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  // Record progress: resets the deadline and names where the run is.
  void progress(const std::string& where);
  // Resets the deadline, keeping where the run is (a timed trial ended).
  void beat();
  // Stops watching for good: it never fires after this returns, and a
  // firing already under way ends without exiting the process.
  void disarm();
  // Called on the watchdog's thread when it fires, with what it reports
  // ("no progress for 5 s; last at: ..."), before the process ends: the CLI
  // writes what was measured so far. It gets kFireGrace to finish; the
  // process ends with exit 4 either way.
  void on_fire(std::function<void(const std::string&)> f);
  static constexpr std::chrono::seconds kFireGrace{10};

 private:
  void loop();
  std::chrono::seconds limit_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string where_ = "start";
  std::function<void(const std::string&)> on_fire_;
  std::chrono::steady_clock::time_point last_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace sb
