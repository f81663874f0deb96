#include "workloads/dataset_file.hpp"

#include <fcntl.h>     // open
#include <signal.h>    // kill: is a temp file's writer alive
#include <sys/file.h>  // flock: a temp file in use
#include <unistd.h>  // getpid, getuid, access

#include <algorithm>   // std::min, std::max
#include <array>       // std::array
#include <atomic>      // std::atomic: temp names
#include <cerrno>      // errno
#include <cstdlib>     // std::getenv, std::atol
#include <cstring>     // std::memcmp, std::memcpy, std::strerror
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream, std::ofstream

#include <fmt/format.h>  // fmt::format

#include "harness/host_memory.hpp"           // reserve_host_memory: the write buffer
#include "harness/random.hpp"                // splitmix64
#include "harness/temp_files.hpp"            // TempFileGuard
#include "workloads/loader.hpp"  // fill_sample

namespace sb::loader {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'S', 'B', 'D', 'S', 'E', 'T', '\0', '\1'};

// Header fields as little-endian u64 words after the magic.
enum Word { header_bytes, n_samples, sample_bytes, seed, generator, checksum, kWords };

std::uint64_t params_checksum(const std::array<std::uint64_t, kWords>& w) {
  std::uint64_t h = 0x7374616c6c62656eULL;  // "stallben"
  for (int i = 0; i < checksum; ++i) h = splitmix64(h ^ w[std::size_t(i)]);
  return h;
}

void put64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
std::uint64_t get64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t(p[i]) << (8 * i);
  return v;
}

std::array<unsigned char, kDatasetHeaderBytes> make_header(const DatasetHeader& h) {
  std::array<unsigned char, kDatasetHeaderBytes> out{};
  std::memcpy(out.data(), kMagic, 8);
  std::array<std::uint64_t, kWords> w{kDatasetHeaderBytes, std::uint64_t(h.n_samples), h.sample_bytes, h.seed,
                                      kDatasetGenerator, 0};
  w[checksum] = params_checksum(w);
  for (int i = 0; i < kWords; ++i) put64(out.data() + 8 + 8 * i, w[std::size_t(i)]);
  return out;
}

bool pid_alive(long pid) { return pid > 0 && (::kill(pid_t(pid), 0) == 0 || errno == EPERM); }

// A temporary file is in use while its writer holds a lock on it (flock):
// that holds across PID namespaces (a TMPDIR shared between containers),
// where a pid says nothing. A pid alive here counts as in use too.
bool temp_in_use(const fs::path& p, long pid) {
  if (pid_alive(pid)) return true;
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool locked = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return locked;
}

// Holds an exclusive lock on a file while it is written.
struct WriterLock {
  int fd = -1;
  explicit WriterLock(const std::string& path) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd >= 0) (void)::flock(fd, LOCK_EX);
  }
  ~WriterLock() {
    if (fd >= 0) ::close(fd);
  }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;
};

}  // namespace

std::optional<DatasetHeader> check_dataset_file(const std::string& path, int spot_samples, std::string* problem) {
  const auto fail = [&](const std::string& why) -> std::optional<DatasetHeader> {
    if (problem) *problem = why;
    return std::nullopt;
  };
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return fail("not a regular file");
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec) return fail(ec.message());
  std::ifstream in(path, std::ios::binary);
  std::array<unsigned char, kDatasetHeaderBytes> hdr{};
  if (!in.read(reinterpret_cast<char*>(hdr.data()), std::streamsize(hdr.size())))
    return fail(fmt::format("{} bytes: shorter than the {}-byte header", size, kDatasetHeaderBytes));
  if (std::memcmp(hdr.data(), kMagic, 8) != 0) return fail("no stallbench dataset header (zeroed, or another file)");
  std::array<std::uint64_t, kWords> w{};
  for (int i = 0; i < kWords; ++i) w[std::size_t(i)] = get64(hdr.data() + 8 + 8 * i);
  if (w[checksum] != params_checksum(w)) return fail("the header's checksum does not match its fields");
  if (w[header_bytes] != kDatasetHeaderBytes) return fail(fmt::format("header of {} bytes", w[header_bytes]));
  if (w[generator] != kDatasetGenerator)
    return fail(fmt::format("made by generator version {}, this stallbench writes {}", w[generator],
                            kDatasetGenerator));
  if (w[sample_bytes] < 16 || w[n_samples] > (std::uint64_t(1) << 62) / w[sample_bytes])
    return fail("implausible sample count or size in the header");
  DatasetHeader h{std::int64_t(w[n_samples]), std::size_t(w[sample_bytes]), w[seed]};
  const std::uintmax_t want = kDatasetHeaderBytes + std::uintmax_t(h.n_samples) * h.sample_bytes;
  if (size != want)
    return fail(fmt::format("{} bytes, but its header says {} samples of {} bytes ({} with the header)", size,
                            h.n_samples, h.sample_bytes, want));
  // A spread of samples, first and last included, regenerated and compared.
  const int k = int(std::min<std::int64_t>(spot_samples, h.n_samples));
  if (k <= 0) return h;
  // Two samples' worth of buffers (up to 2 x 256 MiB): in the host budget.
  const HostReservation mem = reserve_host_memory(2 * std::uint64_t(h.sample_bytes), "the dataset file's check");
  std::vector<std::byte> got(h.sample_bytes), expect(h.sample_bytes);
  for (int i = 0; i < k; ++i) {
    const std::int64_t s = k == 1 ? 0 : std::int64_t(double(i) * double(h.n_samples - 1) / double(k - 1));
    in.seekg(std::streamoff(kDatasetHeaderBytes + std::uintmax_t(s) * h.sample_bytes));
    if (!in.read(reinterpret_cast<char*>(got.data()), std::streamsize(got.size())))
      return fail(fmt::format("cannot read sample {}", s));
    fill_sample(h.seed, s, expect.data(), expect.size());
    if (std::memcmp(got.data(), expect.data(), got.size()) != 0)
      return fail(fmt::format("sample {} does not hold its generated content (changed or corrupt)", s));
  }
  return h;
}

DatasetWrite write_dataset_file(const std::string& path, std::int64_t n, std::size_t bytes, std::uint64_t sd) {
  if (n < 0 || bytes < 16)
    throw UsageError(fmt::format("write_dataset_file: n_samples must be >= 0 and sample_bytes >= 16, "
                                 "got {} and {}", n, bytes));
  DatasetWrite out{path};
  std::error_code ec;
  if (fs::exists(path, ec)) {
    std::string why;
    const auto h = check_dataset_file(path, 16, &why);
    if (h && h->n_samples == n && h->sample_bytes == bytes && h->seed == sd) {
      out.how = DatasetWrite::How::reused;
      return out;
    }
    out.how = DatasetWrite::How::rewritten;
    out.why = h ? fmt::format("it holds {} samples of {} bytes with seed {}", h->n_samples, h->sample_bytes, h->seed)
                : why;
  }
  const fs::path dir = fs::path(path).parent_path();
  if (!dir.empty()) fs::create_directories(dir, ec);
  // What killed writers left beside it (SIGKILL cannot be caught).
  const std::string stem = fs::path(path).filename().string() + ".tmp.";
  for (const auto& e : fs::directory_iterator(dir.empty() ? fs::path(".") : dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(stem, 0) == 0 && !temp_in_use(e.path(), std::atol(name.c_str() + stem.size())))
      fs::remove(e.path(), ec);
  }

  // A unique temp name per writer, so concurrent writers never share one;
  // the rename makes the complete file appear at once.
  static std::atomic<int> counter{0};
  const std::string tmp = fmt::format("{}{}.{}", path + ".tmp.", ::getpid(), counter.fetch_add(1));
  const TempFileGuard guard(tmp);  // a signal while writing removes it
  const auto fail = [&](const std::string& why) {
    fs::remove(tmp, ec);
    return Error(ErrorKind::runtime, fmt::format("cannot write dataset file {}: {}", path, why));
  };
  std::optional<WriterLock> lock;  // held until the rename: others' cleanups leave the file alone
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw fail(std::strerror(errno));
    lock.emplace(tmp);
    const auto hdr = make_header({n, bytes, sd});
    f.write(reinterpret_cast<const char*>(hdr.data()), std::streamsize(hdr.size()));
    // About 1 MiB per write (one sample when samples are larger).
    const std::int64_t per_chunk = std::max<std::int64_t>(1, std::int64_t((1 << 20) / bytes));
    const std::size_t chunk_bytes = std::size_t(per_chunk) * bytes;
    const HostReservation mem = reserve_host_memory(chunk_bytes, "the dataset file's write buffer");
    std::vector<std::byte> chunk(chunk_bytes);
    for (std::int64_t s = 0; s < n; s += per_chunk) {
      const std::int64_t k = std::min(per_chunk, n - s);
      for (std::int64_t i = 0; i < k; ++i) fill_sample(sd, s + i, chunk.data() + std::size_t(i) * bytes, bytes);
      f.write(reinterpret_cast<const char*>(chunk.data()), std::streamsize(std::size_t(k) * bytes));
      if (!f) throw fail(std::strerror(errno));
    }
    f.close();
    if (!f) throw fail(std::strerror(errno));
  }
  fs::rename(tmp, path, ec);
  if (ec) throw fail(ec.message());
  return out;
}

std::string dataset_cache_dir() {
  const char* env = std::getenv("TMPDIR");
  const std::string base = env && *env ? env : "/tmp";
  std::error_code ec;
  if (!fs::is_directory(base, ec) || ::access(base.c_str(), W_OK | X_OK) != 0)
    throw UsageError(fmt::format("the dataset file goes under TMPDIR={}, which is not a writable directory: "
                                 "set TMPDIR to one",
                                 base));
  const fs::path dir = fs::path(base) / fmt::format("stallbench-{}", ::getuid());
  fs::create_directories(dir, ec);
  if (ec) throw UsageError(fmt::format("cannot make the dataset cache {}: {}", dir.string(), ec.message()));
  return dir.string();
}

std::string dataset_cache_path(std::int64_t n, std::size_t bytes, std::uint64_t sd) {
  return (fs::path(dataset_cache_dir()) / fmt::format("dataset-{}x{}-seed{}.bin", n, bytes, sd)).string();
}

std::vector<Removed> clean_dataset_cache(const std::string& dir, bool dry_run) {
  std::vector<Removed> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("dataset-", 0) != 0 || !e.is_regular_file(ec)) continue;
    const auto tmp_at = name.find(".bin.tmp.");
    if (tmp_at != std::string::npos && temp_in_use(e.path(), std::atol(name.c_str() + tmp_at + 9)))
      continue;  // a run writing it now
    if (tmp_at == std::string::npos && (name.size() < 4 || name.compare(name.size() - 4, 4, ".bin") != 0)) continue;
    const std::uint64_t bytes = e.file_size(ec);
    if (!dry_run && !fs::remove(e.path(), ec)) continue;
    out.push_back({e.path().string(), bytes});
  }
  std::sort(out.begin(), out.end(), [](const Removed& a, const Removed& b) { return a.path < b.path; });
  return out;
}

}  // namespace sb::loader
