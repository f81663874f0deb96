#include "watch/child.hpp"

#include <fcntl.h>      // O_CLOEXEC
#include <sys/prctl.h>  // PR_SET_PDEATHSIG
#include <sys/wait.h>   // waitpid
#include <time.h>       // nanosleep
#include <unistd.h>     // fork, execvpe, pipe2

#include <atomic>   // std::atomic
#include <cerrno>   // errno
#include <chrono>   // std::chrono
#include <cstring>  // std::strerror

extern char** environ;

namespace sb::watch {

using Clock = std::chrono::steady_clock;

namespace {

std::atomic<int> g_pending[NSIG][2];  // [signal][0: from the terminal/kernel, 1: from a process]

void on_signal(int sig, siginfo_t* info, void*) {
  const bool from_process = info && (info->si_code == SI_USER || info->si_code == SI_QUEUE);
  g_pending[sig][from_process ? 1 : 0].fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

SignalScope::SignalScope() {
  for (std::size_t i = 0; i < kForwarded.size(); ++i) {
    const int sig = kForwarded[i];
    for (auto& c : g_pending[sig]) c.store(0);
    sigaction(sig, nullptr, &old_[i]);
    // nohup, trap '' HUP: an ignored signal stays ignored, for the job too
    if (old_[i].sa_handler == SIG_IGN && !(old_[i].sa_flags & SA_SIGINFO)) {
      ignored_[i] = true;
      continue;
    }
    struct sigaction sa {};
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO;  // no SA_RESTART: the loop's waits wake at once
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
  // A closed pipe on stdout (watch | head) must end the view, not the watch
  // (and not leave a job unsupervised): EPIPE is handled where we write.
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  sigaction(SIGPIPE, &ign, &old_pipe_);
  pipe_was_ignored_ = old_pipe_.sa_handler == SIG_IGN;
}

SignalScope::~SignalScope() {
  for (std::size_t i = 0; i < kForwarded.size(); ++i)
    if (!ignored_[i]) sigaction(kForwarded[i], &old_[i], nullptr);
  sigaction(SIGPIPE, &old_pipe_, nullptr);
}

// (signal, from a process) pairs that arrived since the last call
std::vector<std::pair<int, bool>> SignalScope::take() {
  std::vector<std::pair<int, bool>> out;
  for (int sig : kForwarded)
    for (int k = 0; k < 2; ++k)
      for (int n = g_pending[sig][k].exchange(0); n > 0; --n) out.emplace_back(sig, k == 1);
  return out;
}

// fork + exec, so the child can ask for a signal when stallbench dies
// (PR_SET_PDEATHSIG: a watch killed with SIGKILL does not leave the job
// running unsupervised). exec's failure comes back through a close-on-exec pipe.
pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env, bool own_group,
            int death_signal, bool restore_sigpipe, std::string& why, int out_fd, int err_fd) {
  std::vector<char*> av;
  for (const auto& s : argv) av.push_back(const_cast<char*>(s.c_str()));
  av.push_back(nullptr);
  std::vector<std::string> env_store(extra_env.begin(), extra_env.end());
  std::vector<char*> envp;
  for (char** e = environ; e && *e; ++e) envp.push_back(*e);
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    why = std::strerror(errno);
    return -1;
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    why = std::strerror(errno);
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (pid == 0) {  // the child: async-signal-safe calls only
    close(fds[0]);
    if (own_group) setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, death_signal);
    if (getppid() != parent) _exit(127);  // stallbench died before prctl
    if (restore_sigpipe) signal(SIGPIPE, SIG_DFL);
    if (out_fd >= 0) dup2(out_fd, STDOUT_FILENO);  // the copies are not close-on-exec
    if (err_fd >= 0) dup2(err_fd, STDERR_FILENO);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execvpe(av[0], av.data(), envp.data());
    const int e = errno;
    (void)!write(fds[1], &e, sizeof e);
    _exit(127);
  }
  close(fds[1]);
  int e = 0;
  ssize_t got;
  do got = read(fds[0], &e, sizeof e);
  while (got < 0 && errno == EINTR);
  close(fds[0]);
  if (got == ssize_t(sizeof e)) {  // exec failed
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    why = std::strerror(e);
    return -1;
  }
  if (own_group) setpgid(pid, pid);  // both sides, so a signal sent at once finds the group
  return pid;
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);  // as a shell reports it
  return 1;
}

// Reaps pid within timeout_s (polling: waitpid has no deadline of its own).
// Returns its exit code, or -1 when it was not reaped in time.
int reap_within(pid_t pid, double timeout_s) {
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return exit_code_of(status);
    if (r < 0 && errno != EINTR) return -1;  // not our child any more
    if (Clock::now() >= until) return -1;
    struct timespec ts {0, 10'000'000};
    nanosleep(&ts, nullptr);
  }
}

// Ends a process (its group when it has one): SIGTERM, then SIGKILL after
// grace_s; returns its exit code, or -1 when even that did not reap it.
int end_process(pid_t pid, bool group, double grace_s) {
  kill(group ? -pid : pid, SIGTERM);
  int rc = reap_within(pid, grace_s);
  if (rc >= 0) return rc;
  kill(group ? -pid : pid, SIGKILL);
  return reap_within(pid, 5);
}

}  // namespace sb::watch
