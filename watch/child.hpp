// What `watch --exec` does with processes (watch.cpp): the signals it takes and forwards to the job,
// the job and --on-stuck started (fork + exec, a death signal, a process group), reaped with a
// deadline, and ended.
#pragma once

#include <signal.h>     // sigaction
#include <sys/types.h>  // pid_t

#include <array>    // std::array
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

namespace sb::watch {

// The signals forwarded to the job: INT, TERM, HUP, QUIT, USR1, USR2.
inline constexpr std::array kForwarded = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

// Installs counting handlers for kForwarded (an ignored one stays ignored) and ignores SIGPIPE, for
// its lifetime. A handler only counts what arrived and where from. With the job in stallbench's
// own process group (a terminal on stdin), a signal the terminal generated (Ctrl-C: si_code
// SI_KERNEL) reached the job too and is not sent again; one sent with kill(2) (SI_USER, SI_QUEUE:
// `kill PID`) reached stallbench alone and is forwarded. Without a terminal the job gets a process
// group of its own (as dumb-init does) and every signal is forwarded.
class SignalScope {
 public:
  SignalScope();
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;
  // (signal, from a process) pairs that arrived since the last call
  std::vector<std::pair<int, bool>> take();
  bool pipe_was_ignored() const { return pipe_was_ignored_; }

 private:
  std::array<struct sigaction, kForwarded.size()> old_{};
  std::array<bool, kForwarded.size()> ignored_{};
  struct sigaction old_pipe_ {};
  bool pipe_was_ignored_ = false;
};

// fork + exec, so the child can ask for a signal when stallbench dies (PR_SET_PDEATHSIG: a watch
// killed with SIGKILL does not leave the job running unsupervised). exec's failure comes back
// through a close-on-exec pipe: -1 with why set.
// out_fd, err_fd: the child's stdout and stderr (-1: stallbench's own).
pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env, bool own_group,
            int death_signal, bool restore_sigpipe, std::string& why, int out_fd = -1, int err_fd = -1);
// As a shell reports it: the exit status, or 128 + the signal.
int exit_code_of(int status);
// Reaps pid within timeout_s (polling: waitpid has no deadline of its own). Returns its exit code,
// or -1 when it was not reaped in time.
int reap_within(pid_t pid, double timeout_s);
// Ends a process (its group when it has one): SIGTERM, then SIGKILL after grace_s; returns its exit
// code, or -1 when even that did not reap it.
int end_process(pid_t pid, bool group, double grace_s);

// The job: ended (TERM, then KILL) if the watch unwinds while it runs.
struct ChildGuard {
  pid_t pid = -1;
  bool group = false;
  ~ChildGuard() {
    if (pid > 0) end_process(pid, group, 10);
  }
};

}  // namespace sb::watch
