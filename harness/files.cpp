#include "harness/files.hpp"

#include <fcntl.h>     // open, O_RDONLY, O_NONBLOCK, O_CLOEXEC
#include <sys/stat.h>  // fstat, S_ISREG, S_ISDIR, S_ISFIFO
#include <unistd.h>    // read, close, access

#include <algorithm>  // std::min
#include <cerrno>     // errno, EINTR
#include <cstring>    // std::strerror
#include <filesystem>  // weakly_canonical, absolute

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // UsageError
#include "harness/units.hpp"   // format_bytes

namespace sb {

std::string read_regular_file(const std::string& path, const std::string& what, std::size_t max_bytes) {
  if (path.empty()) throw UsageError(fmt::format("the {} path is empty", what));
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of
  // waiting for one; fstat then says what the path is.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw UsageError(fmt::format("cannot read {} ({}): {}", path, what, std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw UsageError(fmt::format("cannot stat {} '{}': {}", what, path, std::strerror(errno)));
  if (S_ISDIR(st.st_mode)) throw UsageError(fmt::format("{} '{}' is a directory, not a file", what, path));
  if (!S_ISREG(st.st_mode))
    throw UsageError(fmt::format("{} '{}' is not a regular file ({}): only files are read", what, path,
                                 S_ISFIFO(st.st_mode)   ? "a FIFO"
                                 : S_ISCHR(st.st_mode)  ? "a character device"
                                 : S_ISBLK(st.st_mode)  ? "a block device"
                                 : S_ISSOCK(st.st_mode) ? "a socket"
                                                        : "not a file"));
  if (std::size_t(st.st_size) > max_bytes)
    throw UsageError(fmt::format("{} '{}' is {}, over the {} limit on an input file", what, path,
                                 format_bytes(double(st.st_size)), format_bytes(double(max_bytes))));
  // Read straight into the result; a file that grows meanwhile is read up
  // to the cap (one byte past it is enough to know).
  std::string out(std::min(std::size_t(st.st_size), max_bytes) + 1, '\0');
  std::size_t got = 0;
  for (;;) {
    if (got == out.size()) {
      if (got > max_bytes)
        throw UsageError(fmt::format("{} '{}' grew past the {} limit on an input file while being read", what,
                                     path, format_bytes(double(max_bytes))));
      out.resize(std::min(2 * out.size(), max_bytes + 1));
    }
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw UsageError(fmt::format("cannot read {} '{}': {}", what, path, std::strerror(errno)));
    if (n == 0) break;
    got += std::size_t(n);
  }
  out.resize(got);
  return out;
}

void check_writable_target(const std::string& path, const std::string& what) {
  if (path == "-") return;
  if (path.empty()) throw UsageError(fmt::format("the {} path is empty", what));
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw UsageError(fmt::format("{} '{}' is a directory; give a file path", what, path));
    if (!S_ISREG(st.st_mode))
      throw UsageError(fmt::format("{} '{}' exists and is not a regular file ({}); results are written atomically, "
                                   "which would replace it: give a file path, or - for stdout",
                                   what, path, S_ISLNK(st.st_mode) ? "a symbolic link" : "a device, FIFO or socket"));
    // The rename would replace a file its owner protected from writing (a user other than root).
    if (::access(path.c_str(), W_OK) != 0)
      throw UsageError(fmt::format("{} '{}' exists and is not writable ({}): it is not replaced; give another path",
                                   what, path, std::strerror(errno)));
  }
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct stat dst {};
  if (::stat(dir.c_str(), &dst) != 0)
    throw UsageError(fmt::format("{} '{}': its directory '{}' does not exist", what, path, dir));
  if (!S_ISDIR(dst.st_mode)) throw UsageError(fmt::format("{} '{}': '{}' is not a directory", what, path, dir));
  if (::access(dir.c_str(), W_OK) != 0)
    throw UsageError(fmt::format("{} '{}': cannot write in '{}': {}", what, path, dir, std::strerror(errno)));
}

namespace {
bool same_file(const std::string& a, const std::string& b) {
  if (a == b) return true;
  struct stat sa {}, sb_ {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb_) == 0)
    return sa.st_dev == sb_.st_dev && sa.st_ino == sb_.st_ino;
  std::error_code ea, eb;  // one is yet to be written: compare what the two would resolve to
  const auto ca = std::filesystem::weakly_canonical(std::filesystem::absolute(a, ea), ea);
  const auto cb = std::filesystem::weakly_canonical(std::filesystem::absolute(b, eb), eb);
  return !ea && !eb && ca == cb;
}
bool skipped(const std::string& p) { return p.empty() || p == "-"; }
}  // namespace

void refuse_clobbering(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto& [out, flag] = outputs[i];
    if (skipped(out)) continue;
    for (const auto& [in, what] : inputs)
      if (!skipped(in) && same_file(out, in))
        throw UsageError(fmt::format("{} {} is {} ({}): writing there would destroy it; give {} another path", flag,
                                     out, what, in, flag));
    for (std::size_t j = i + 1; j < outputs.size(); ++j)
      if (!skipped(outputs[j].first) && same_file(out, outputs[j].first))
        throw UsageError(fmt::format("{} and {} name the same file ({}): one would replace the other", flag,
                                     outputs[j].second, out));
  }
}

namespace {

// The length a UTF-8 lead byte announces (1 for ASCII and for a byte that leads nothing).
std::size_t utf8_length(unsigned char c) { return c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1; }

std::string escape_text(std::string_view s, bool lines) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if ((c < 0x20 && !(lines && (c == '\n' || c == '\t'))) || c == 0x7f) out += fmt::format("\\x{:02x}", c);
      else out += char(c);
      ++i;
      continue;
    }
    // a whole valid sequence is kept, but for the C1 controls (U+0080-U+009F: U+009B is CSI to some
    // terminals, U+0085 a line break) and the line and paragraph separators (U+2028, U+2029), which are
    // escaped byte by byte; else this byte is escaped and the next one looked at
    const std::size_t n = utf8_length(c);
    const std::string_view seq = s.substr(i, std::min(n, s.size() - i));
    const bool control = (n == 2 && c == 0xC2 && seq.size() == 2 && static_cast<unsigned char>(seq[1]) < 0xA0) ||
                         seq == "\xE2\x80\xA8" || seq == "\xE2\x80\xA9";
    if (n > 1 && seq.size() == n && !first_invalid_utf8(seq) && !control) {
      out += seq;
      i += n;
    } else {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    }
  }
  return out;
}

}  // namespace

std::string terminal_safe(std::string_view s) { return escape_text(s, true); }

std::string quoted_text(std::string_view s, std::size_t max_bytes) {
  if (s.size() <= max_bytes) return escape_text(s, false);
  // back to the start of the character the cut falls in, only when that start's lead byte says the character
  // reaches past the cut (else the bytes before the cut are not one character: cut as asked)
  std::size_t n = max_bytes;
  std::size_t lead = n;
  while (lead > 0 && n - lead < 3 && (static_cast<unsigned char>(s[lead]) & 0xC0) == 0x80) --lead;
  if (lead < n && utf8_length(static_cast<unsigned char>(s[lead])) > n - lead) n = lead;
  return escape_text(s.substr(0, n), false) + "...";
}

std::optional<std::size_t> first_invalid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t n;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (c >= 0xC2 && c <= 0xDF) n = 1;
    else if (c >= 0xE0 && c <= 0xEF) n = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) n = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return i;
    if (s.size() - i - 1 < n) return i;
    for (std::size_t k = 1; k <= n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if (k == 1 ? (b < lo || b > hi) : (b >> 6) != 2) return i;
    }
    i += n + 1;
  }
  return std::nullopt;
}

}  // namespace sb
