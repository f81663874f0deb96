#include "harness/temp_files.hpp"

#include <signal.h>  // sigaction, raise
#include <unistd.h>  // unlink, write

#include <array>    // std::array
#include <atomic>   // std::atomic
#include <cstring>  // std::memcpy, std::strlen
#include <mutex>    // std::once_flag

namespace sb {
namespace {

constexpr int kSlots = 64;
constexpr std::size_t kPathMax = 4096;

// A slot is free (0), being written (1) or ready (2). The handler reads only
// ready slots; registration writes the path before publishing it.
struct Slot {
  std::atomic<int> state{0};
  char path[kPathMax];
};
std::array<Slot, kSlots> g_slots;

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

extern "C" void remove_temp_files(int sig) {
  // Async-signal-safe only: atomics, unlink, write, sigaction, raise.
  for (auto& s : g_slots)
    if (s.state.load(std::memory_order_acquire) == 2) ::unlink(s.path);
  // One line, so a scheduler's log shows the run was cut short rather than ending mid-table.
  const char* msg = sig == SIGINT    ? "\nstallbench: interrupted (SIGINT): stopped where it was; a result not yet "
                                       "written is lost, its temporary file removed\n"
                    : sig == SIGTERM ? "\nstallbench: terminated (SIGTERM): stopped where it was; a result not yet "
                                       "written is lost, its temporary file removed\n"
                    : sig == SIGHUP  ? "\nstallbench: hung up (SIGHUP): stopped where it was; a result not yet "
                                       "written is lost, its temporary file removed\n"
                                     : "\nstallbench: quit (SIGQUIT): stopped where it was\n";
  [[maybe_unused]] const ssize_t n = ::write(2, msg, std::strlen(msg));
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  raise(sig);  // pending until this handler returns (the signal is blocked in it), then ends the process
}

}  // namespace

void install_temp_file_cleanup() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : kSignals) {
      struct sigaction old {};
      if (sigaction(sig, nullptr, &old) != 0) continue;
      // A signal the parent set to be ignored (nohup) stays ignored.
      if (old.sa_handler == SIG_IGN) continue;
      struct sigaction sa {};
      sa.sa_handler = remove_temp_files;
      sigemptyset(&sa.sa_mask);
      for (int other : kSignals) sigaddset(&sa.sa_mask, other);  // one cleanup at a time
      sigaction(sig, &sa, nullptr);
    }
  });
}

TempFileGuard::TempFileGuard(const std::string& path) {
  if (path.size() + 1 > kPathMax) return;
  for (int i = 0; i < kSlots; ++i) {
    int expected = 0;
    if (g_slots[std::size_t(i)].state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
      std::memcpy(g_slots[std::size_t(i)].path, path.c_str(), path.size() + 1);
      g_slots[std::size_t(i)].state.store(2, std::memory_order_release);
      slot_ = i;
      return;
    }
  }
}

TempFileGuard::~TempFileGuard() {
  if (slot_ >= 0) g_slots[std::size_t(slot_)].state.store(0, std::memory_order_release);
}

int registered_temp_files() {
  int n = 0;
  for (auto& s : g_slots) n += s.state.load(std::memory_order_acquire) == 2;
  return n;
}

}  // namespace sb
