// Temporary files registered with TempFileGuard are removed when a signal
// ends the process, and the process still ends by that signal. Each case
// forks: the child registers, then is signalled; the parent checks.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "harness/files.hpp"
#include "harness/temp_files.hpp"

namespace sb {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  return fs::temp_directory_path() / ("sb_temp_files_" + std::to_string(::getpid()) + "_" + name);
}

TEST(TempFiles, GuardRegistersWhileItLives) {
  const int before = registered_temp_files();
  {
    TempFileGuard a("/tmp/x.tmp.1");
    TempFileGuard b("/tmp/y.tmp.1");
    EXPECT_EQ(registered_temp_files(), before + 2);
  }
  EXPECT_EQ(registered_temp_files(), before);
}

class SignalCleanup : public ::testing::TestWithParam<int> {};

TEST_P(SignalCleanup, RemovesRegisteredFilesAndEndsByTheSameSignal) {
  const int sig = GetParam();
  const fs::path kept = scratch("kept"), doomed = scratch("doomed." + std::to_string(sig));
  std::ofstream(kept) << "not registered";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::signal(sig, SIG_DFL);  // a test run under nohup or in the background may inherit it ignored
    install_temp_file_cleanup();
    std::ofstream(doomed) << "half written";
    TempFileGuard g(doomed.string());
    (void)!::write(ready[1], "r", 1);
    for (;;) ::pause();  // the parent's signal ends this
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_TRUE(fs::exists(doomed));
  ASSERT_EQ(::kill(child, sig), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status)) << "status " << status;
  if (WIFSIGNALED(status)) {
    EXPECT_EQ(WTERMSIG(status), sig);
  }
  EXPECT_FALSE(fs::exists(doomed)) << "left behind by signal " << sig;
  EXPECT_TRUE(fs::exists(kept));
  fs::remove(kept);
  fs::remove(doomed);
  ::close(ready[0]);
  ::close(ready[1]);
}

INSTANTIATE_TEST_SUITE_P(Signals, SignalCleanup, ::testing::Values(SIGINT, SIGTERM, SIGHUP));

TEST(TempFiles, AnIgnoredSignalStaysIgnored) {
  // nohup sets SIGHUP to SIG_IGN; the cleanup must not turn it back on.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::signal(SIGHUP, SIG_IGN);
    install_temp_file_cleanup();
    ::raise(SIGHUP);
    ::_exit(7);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 7);
}

}  // namespace
// A message that quotes a user's bytes is printed safe: valid UTF-8 kept, bad bytes and controls as \xNN.
TEST(Files, TerminalSafeKeepsUtf8AndEscapesTheRest) {
  EXPECT_EQ(terminal_safe("plain text\nnext\tcol"), "plain text\nnext\tcol");
  EXPECT_EQ(terminal_safe("/tmp/\xe6\x97\xa5\xe6\x9c\xac/x \xe2\x86\x91"), "/tmp/\xe6\x97\xa5\xe6\x9c\xac/x \xe2\x86\x91");
  EXPECT_EQ(terminal_safe("got '\xff\x01" "abc'"), "got '\\xff\\x01abc'");
  EXPECT_EQ(terminal_safe("\x1b[2Jwiped"), "\\x1b[2Jwiped");            // no terminal escape sequences
  EXPECT_EQ(terminal_safe("cut \xe6\x97"), "cut \\xe6\\x97");            // a truncated sequence
  EXPECT_EQ(terminal_safe("\xc0\xaf"), "\\xc0\\xaf");                      // an overlong form is invalid
}

// A quote of a user's value in a message: one line, cut at a byte count but never inside a character.
TEST(Files, QuotedTextIsOneLineAndCutsWholeCharacters) {
  EXPECT_EQ(quoted_text("a\nb\tc"), "a\\x0ab\\x09c");  // a value's newline would break the message's line
  EXPECT_EQ(quoted_text("short", 40), "short");
  EXPECT_EQ(quoted_text("abcdef", 4), "abcd...");
  // "\xe6\x97\xa5" is one character: a cut inside it leaves it out whole, not two of its bytes escaped
  EXPECT_EQ(quoted_text("a\xe6\x97\xa5z", 2), "a...");
  EXPECT_EQ(quoted_text("a\xe6\x97\xa5z", 4), "a\xe6\x97\xa5...");
  EXPECT_EQ(quoted_text("\xff\xfe\x01", 2), "\\xff\\xfe...");  // not UTF-8: cut where asked, escaped
  EXPECT_EQ(quoted_text("\x80\x80\x80\x80\x80", 3), "\\x80\\x80\\x80...");  // continuation bytes only
  EXPECT_EQ(quoted_text("\xf0\x9f\x98\x80!", 3), "...");                   // a 4-byte character, cut inside
  EXPECT_EQ(quoted_text("\xf0\x9f\x98\x80!", 4), "\xf0\x9f\x98\x80...");
  // a stray continuation byte after a whole character: the character stays, the cut is where asked
  EXPECT_EQ(quoted_text("\xc3\x80\x80\x80", 3), "\xc3\x80\\x80...");
  // C1 controls and the Unicode line separators are valid UTF-8 but act on a terminal or break the line
  EXPECT_EQ(quoted_text("a\xc2\x9b" "2Jb\xc2\x85" "c\xe2\x80\xa8" "d"), "a\\xc2\\x9b2Jb\\xc2\\x85c\\xe2\\x80\\xa8d");
  EXPECT_EQ(quoted_text("caf\xc3\xa9 \xc2\xa0"), "caf\xc3\xa9 \xc2\xa0");  // U+00A0 and above stay
  EXPECT_EQ(terminal_safe("x\xc2\x9b" "1m"), "x\\xc2\\x9b1m");
}

}  // namespace sb
