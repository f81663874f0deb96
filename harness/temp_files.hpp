// Temporary files that a signal must not leave behind. A file being written
// under a temporary name (a result JSON before its rename, a dataset file of
// hundreds of MiB) is registered while it exists; SIGINT, SIGTERM, SIGHUP or
// SIGQUIT removes every registered file and then ends the process by the same
// signal, as it would have without the handler (the shell sees 130 for ^C).
// SIGKILL cannot be caught: `stallbench clean` removes what a killed run left.
#pragma once

#include <string>  // std::string

namespace sb {

// Installs the handlers once; later calls do nothing. The CLI calls it first.
void install_temp_file_cleanup();

// Registers `path` for removal on those signals while the guard lives. The
// destructor only unregisters: the owner removes or renames the file itself.
// At most 64 files are registered at once; past that a file is simply not
// covered (never an error).
class TempFileGuard {
 public:
  explicit TempFileGuard(const std::string& path);
  ~TempFileGuard();
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;

 private:
  int slot_ = -1;
};

// How many files are registered now (for tests).
int registered_temp_files();

}  // namespace sb
