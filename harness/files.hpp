// Reading a user's input file without ever blocking or running out of memory:
// only a regular file is read (a FIFO, a device such as /dev/zero, a socket or
// a directory is refused at once, by what it is), and never more than a cap.
#pragma once

#include <cstddef>  // std::size_t
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <utility>      // std::pair
#include <vector>       // std::vector

namespace sb {

// Inputs are results, expected-numbers files, hang dumps and length lists:
// the largest real ones are tens of MiB.
inline constexpr std::size_t kMaxInputBytes = std::size_t(256) << 20;

// The whole file. Throws UsageError (exit 2) naming the path and `what` it
// was to be ("result JSON", "lengths file") when it cannot be opened, is not
// a regular file, or is larger than max_bytes (the limit named).
std::string read_regular_file(const std::string& path, const std::string& what,
                              std::size_t max_bytes = kMaxInputBytes);

// Throws UsageError (exit 2), before anything runs, when `path` cannot take
// an atomic write (a new file renamed into place): its directory is missing,
// not a directory or not writable (a read-only filesystem too), or the path
// is a directory, a symlink or another non-regular file, which the rename
// would replace (a link to /dev/stdout, /dev/null itself). "-" is stdout.
void check_writable_target(const std::string& path, const std::string& what);

// A named path on the command line: the path and its flag or role ("--json",
// "the config").
using NamedPath = std::pair<std::string, std::string>;

// Throws UsageError (exit 2), before anything runs, when an output path names
// the same file as an input (the nvidia-smi log, the trace, the config, a
// lengths file: the write would destroy what the user measured) or as another
// output (one would replace the other). The same file: one path, or two that
// resolve to one (./x and x, a symlink, a hard link). Empty paths and "-"
// are skipped.
void refuse_clobbering(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs);

// `s` made safe to print on a terminal: valid UTF-8 is kept (a path in
// another script, the table's arrows), invalid bytes and control characters
// other than newline and tab are shown as \xNN (a lengths file's 0xff byte was
// written raw into the error message).
std::string terminal_safe(std::string_view s);

// A piece of what a user gave (a YAML value, a CSV field, the bytes a parser
// stopped at) quoted in a message: as terminal_safe, but on one line (newline
// and tab are \xNN too) and at most `max_bytes` of `s`, never cutting a UTF-8
// character in two, with "..." where it was cut. The one escaper behind every
// such quote (the config reader's showed control bytes as '?', the JSON and
// telemetry readers' escaped all non-ASCII: three rules for one job).
std::string quoted_text(std::string_view s, std::size_t max_bytes = std::string_view::npos);

// The byte offset of the first place `s` is not well-formed UTF-8 (RFC 3629:
// no overlong forms, no surrogates, nothing past U+10FFFF), or nullopt: a
// user's text is checked before any of it reaches a JSON writer, which
// throws on invalid UTF-8.
std::optional<std::size_t> first_invalid_utf8(std::string_view s);

}  // namespace sb
