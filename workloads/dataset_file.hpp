// The dataset file behind `source=file`: a cache of fill_sample content,
// written once and reused by later runs with the same parameters.
//
// Layout: a 4096-byte header (so samples stay page-aligned for mmap), then
// n_samples * sample_bytes of sample content. The header holds a magic, the
// generator's parameters (samples, sample bytes, seed, generator version) and
// a checksum of them. A file is reused only if its header checks, its size is
// exactly right and a spread of samples regenerates byte for byte; otherwise
// it is rewritten (a zeroed or foreign file is never trusted). Every read
// also checks the index that bytes 0..7 of each sample carry.
//
// Files are written under a temporary name that a signal removes
// (harness/temp_files.hpp) and renamed into place; `stallbench clean`
// removes the cache and what killed runs left.
#pragma once

#include <cstddef>   // std::size_t, std::byte
#include <cstdint>   // std::int64_t, std::uint64_t
#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

#include "harness/errors.hpp"  // Error

namespace sb::loader {

inline constexpr std::size_t kDatasetHeaderBytes = 4096;
inline constexpr std::uint64_t kDatasetGenerator = 1;  // fill_sample's layout; bump if it changes

struct DatasetHeader {
  std::int64_t n_samples = 0;
  std::size_t sample_bytes = 0;
  std::uint64_t seed = 0;
};

// A failure of the file itself (truncated under a run, changed, corrupt),
// not of one sample: never skipped by on_error=skip.
struct DatasetFileError : Error {
  explicit DatasetFileError(const std::string& w) : Error(ErrorKind::runtime, w) {}
};

// Reads and checks the header of `path` (magic, checksum, size). With
// spot_samples > 0, also regenerates that many samples spread over the file
// and compares them. Returns the header, or sets *problem to why not.
std::optional<DatasetHeader> check_dataset_file(const std::string& path, int spot_samples, std::string* problem);

// What write_dataset_file did.
struct DatasetWrite {
  std::string path;
  enum class How { written, reused, rewritten } how = How::written;
  std::string why;  // rewritten: what was wrong with the old file
};

// Makes `path` hold n_samples * sample_bytes of fill_sample(seed) content
// after the header, unless a file that checks for exactly these parameters
// is there already. Throws sb::Error (runtime) when it cannot be written.
DatasetWrite write_dataset_file(const std::string& path, std::int64_t n_samples, std::size_t sample_bytes,
                                std::uint64_t seed);

// The cache directory, $TMPDIR/stallbench-<uid>, created if missing. Throws
// UsageError (exit 2) when TMPDIR names no writable directory.
std::string dataset_cache_dir();

// The cache file name for these parameters inside dataset_cache_dir().
std::string dataset_cache_path(std::int64_t n_samples, std::size_t sample_bytes, std::uint64_t seed);

// Removes dataset files and the temporary files of runs that are gone from
// `dir` (dry_run: lists them only). Returns what was (or would be) removed.
struct Removed {
  std::string path;
  std::uint64_t bytes = 0;
};
std::vector<Removed> clean_dataset_cache(const std::string& dir, bool dry_run);

}  // namespace sb::loader
