// The dataloader scenario's host loader: exactly-once, in-order delivery for
// every worker/prefetch shape, file sources, deterministic decode cost, and
// injected faults caught (hang -> LoaderTimeout, corrupt -> SampleError or
// skipped) without the loader itself ever hanging; the schedule (which worker
// gets which batch, when it is dispatched, the delivery order) against torch's
// DataLoader as recorded in tests/data/dataloader_torch. No timing assertions
// other than "a fault is detected within timeout + a generous margin".
#include <gtest/gtest.h>

#include <algorithm>   // std::count
#include <chrono>      // std::chrono
#include <cmath>       // std::isfinite
#include <condition_variable>  // the replay's gates
#include <cstring>     // std::memcmp, std::memcpy
#include <filesystem>  // temp dataset files
#include <fstream>     // spoiling a dataset file
#include <functional>  // std::function
#include <map>         // std::map
#include <memory>      // std::shared_ptr
#include <mutex>       // std::mutex
#include <optional>    // std::optional
#include <set>         // std::set
#include <sstream>     // std::istringstream: the recorded schedule
#include <stdexcept>   // std::runtime_error: a gated corrupt batch
#include <string>      // std::string
#include <thread>      // std::jthread, std::this_thread
#include <vector>      // std::vector

#include <fcntl.h>     // open
#include <sys/file.h>  // flock
#include <unistd.h>    // getpid

#include <fmt/format.h>  // fmt::format

#include "scenarios/dataloader/epoch.hpp"
#include "workloads/loader.hpp"

namespace sb::loader {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Detection bound for faults: the configured timeout plus this margin.
constexpr milliseconds kMargin{2000};

std::int64_t embedded_index(const std::byte* p) {
  std::int64_t v;
  std::memcpy(&v, p, 8);  // the test hosts are little-endian, as the format is
  return v;
}

Config small(int workers, int prefetch) {
  Config c;
  c.workers = workers;
  c.prefetch = prefetch;
  c.batch = 4;
  c.sample_bytes = 64;
  c.num_batches = 13;  // not a multiple of any worker count: uneven last rounds
  c.timeout = milliseconds(20000);
  c.seed = 7;
  return c;
}

// Checks each sample of b against the generator (content_seed); bytes 8..15
// hold the decode result when decode ran, so they are compared only without.
void check_contents(const Batch& b, const Config& c, std::uint64_t content_seed) {
  ASSERT_EQ(b.bytes, b.samples.size() * c.sample_bytes);
  std::vector<std::byte> want(c.sample_bytes);
  for (std::size_t k = 0; k < b.samples.size(); ++k) {
    const std::byte* got = b.data + k * c.sample_bytes;
    ASSERT_EQ(embedded_index(got), b.samples[k]) << "batch " << b.index << " position " << k;
    fill_sample(content_seed, b.samples[k], want.data(), want.size());
    const std::size_t from = c.decode_us > 0 ? 16 : 8;
    ASSERT_EQ(std::memcmp(got + from, want.data() + from, c.sample_bytes - from), 0)
        << "sample " << b.samples[k];
  }
}

// Drains an epoch; returns delivered batch indices in delivery order.
std::vector<std::int64_t> drain(Loader& l, std::uint64_t content_seed, std::vector<std::int64_t>* samples = nullptr) {
  std::vector<std::int64_t> order;
  while (auto b = l.next()) {
    check_contents(*b, l.config(), content_seed);
    order.push_back(b->index);
    if (samples) samples->insert(samples->end(), b->samples.begin(), b->samples.end());
    l.release(*b);
  }
  return order;
}

std::filesystem::path temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / fmt::format("stallbench_loader_{}_{}", ::getpid(), name);
  std::filesystem::create_directories(d);
  return d;
}

TEST(Loader, EverySampleOnceInOrderForAllShapes) {
  for (int workers : {0, 1, 2, 4, 8}) {
    for (int prefetch : {1, 2, 4}) {
      SCOPED_TRACE(fmt::format("workers={} prefetch={}", workers, prefetch));
      Config c = small(workers, prefetch);
      Loader l(c);
      std::vector<std::int64_t> samples;
      const auto order = drain(l, c.seed, &samples);
      ASSERT_EQ(order.size(), 13u);
      for (std::int64_t i = 0; i < 13; ++i) EXPECT_EQ(order[std::size_t(i)], i);
      ASSERT_EQ(samples.size(), 52u);
      for (std::int64_t i = 0; i < 52; ++i) EXPECT_EQ(samples[std::size_t(i)], i);
      EXPECT_FALSE(l.next().has_value());  // stays at epoch end
      const auto rec = l.records();
      ASSERT_EQ(rec.size(), 13u);
      for (const auto& r : rec) {
        EXPECT_EQ(r.worker, workers == 0 ? -1 : int(r.batch % workers));  // PyTorch's assignment
        EXPECT_LE(r.t0_s, r.t1_s);
      }
      EXPECT_EQ(l.skipped(), 0);
    }
  }
}

TEST(Loader, OutOfOrderDeliversEveryBatchOnce) {
  Config c = small(4, 2);
  c.in_order = false;
  c.num_batches = 40;
  c.decode_us = 20;
  c.decode_spread = 1.0;  // uneven costs, so batches finish out of order
  Loader l(c);
  const auto order = drain(l, c.seed);
  ASSERT_EQ(order.size(), 40u);
  const std::set<std::int64_t> seen(order.begin(), order.end());
  EXPECT_EQ(seen.size(), 40u);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 39);
}

TEST(Loader, FileSourceWithPreadAndMmap) {
  const auto dir = temp_dir("file");
  const std::uint64_t file_seed = 99;  // differs from the loader's seed: content comes from the file
  for (ReadMode mode : {ReadMode::pread, ReadMode::mmap}) {
    for (int workers : {0, 3}) {
      SCOPED_TRACE(fmt::format("mmap={} workers={}", mode == ReadMode::mmap, workers));
      Config c = small(workers, 2);
      c.sample_bytes = 100;  // not a multiple of 8: a partial last word
      c.source = Source::file;
      c.read = mode;
      c.file_path = write_dataset_file((dir / "data.bin").string(), 13 * 4, c.sample_bytes, file_seed).path;
      EXPECT_EQ(std::filesystem::file_size(c.file_path), kDatasetHeaderBytes + 13u * 4 * 100);
      Loader l(c);
      EXPECT_EQ(drain(l, file_seed).size(), 13u);
    }
  }
  // A file that checks is kept, not rewritten.
  const auto p = dir / "data.bin";
  const auto t = std::filesystem::last_write_time(p);
  EXPECT_EQ(write_dataset_file(p.string(), 13 * 4, 100, file_seed).how, DatasetWrite::How::reused);
  EXPECT_EQ(std::filesystem::last_write_time(p), t);
  // Too small for the epoch: a usage error that names what is needed.
  Config c = small(2, 2);
  c.source = Source::file;
  c.file_path = write_dataset_file((dir / "short.bin").string(), 3, c.sample_bytes, file_seed).path;
  try {
    Loader l(c);
    FAIL() << "short file accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("need 52 samples of 64 bytes"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

// Overwrites `bytes` at `offset` of `path` with `fill`.
void scribble(const std::filesystem::path& path, std::uintmax_t offset, std::size_t bytes, char fill) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(std::streamoff(offset));
  const std::string junk(bytes, fill);
  f.write(junk.data(), std::streamsize(junk.size()));
}

TEST(DatasetFile, ANonMatchingOrCorruptCacheIsRewrittenNeverTrusted) {
  const auto dir = temp_dir("cache");
  const auto p = dir / "d.bin";
  const std::uintmax_t size = kDatasetHeaderBytes + 40u * 64;
  EXPECT_EQ(write_dataset_file(p.string(), 40, 64, 5).how, DatasetWrite::How::written);
  struct Case {
    const char* name;
    std::function<void()> spoil;
    const char* why;
  };
  const std::vector<Case> cases = {
      {"zeroed whole", [&] { scribble(p, 0, std::size_t(size), '\0'); }, "no stallbench dataset header"},
      {"zeroed samples, header kept", [&] { scribble(p, kDatasetHeaderBytes, 40 * 64, '\0'); },
       "does not hold its generated content"},
      {"one byte of the last sample", [&] { scribble(p, size - 1, 1, 'x'); }, "sample 39 does not hold"},
      {"a header field changed", [&] { scribble(p, 8 + 8 * 4, 1, '\7'); }, "checksum"},
      {"truncated", [&] { std::filesystem::resize_file(p, size - 64); }, "header says 40 samples"},
      {"another seed", [&] { write_dataset_file(p.string(), 40, 64, 6); }, "seed 6"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_EQ(write_dataset_file(p.string(), 40, 64, 5).how, DatasetWrite::How::reused);  // sound before
    c.spoil();
    const DatasetWrite w = write_dataset_file(p.string(), 40, 64, 5);
    EXPECT_EQ(w.how, DatasetWrite::How::rewritten);
    EXPECT_NE(w.why.find(c.why), std::string::npos) << w.why;
    std::string problem;
    EXPECT_TRUE(check_dataset_file(p.string(), 40, &problem)) << problem;  // every sample sound again
  }
  // A file with no header at all is refused by the loader, by name.
  std::ofstream(dir / "raw.bin") << std::string(8192, '\0');
  Config c = small(0, 1);
  c.source = Source::file;
  c.file_path = (dir / "raw.bin").string();
  try {
    Loader l(c);
    FAIL() << "a headerless file accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("not a usable dataset file"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(DatasetFile, ASampleChangedDuringTheRunStopsTheEpochEvenWithSkip) {
  const auto dir = temp_dir("changed");
  for (ReadMode mode : {ReadMode::pread, ReadMode::mmap}) {
    SCOPED_TRACE(mode == ReadMode::mmap ? "mmap" : "pread");
    Config c = small(0, 1);
    c.source = Source::file;
    c.read = mode;
    c.on_error = OnError::skip;  // skips bad samples, never a bad file
    c.file_path = write_dataset_file((dir / "d.bin").string(), 13 * 4, c.sample_bytes, 3).path;
    Loader l(c);
    scribble(c.file_path, kDatasetHeaderBytes + 9 * 64, 8, '\0');  // sample 9's index word, after the checks
    int batches = 0;
    try {
      while (auto b = l.next()) {
        ++batches;
        l.release(*b);
      }
      FAIL() << "a changed sample went unnoticed";
    } catch (const SampleError& e) {
      EXPECT_NE(std::string(e.what()).find("sample 9"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("holds index 0"), std::string::npos) << e.what();
    }
    EXPECT_EQ(batches, 2);  // samples 0..7; batch 2 holds sample 9
    EXPECT_EQ(l.skipped(), 0);
  }
  std::filesystem::remove_all(dir);
}

TEST(DatasetFile, AMappedFileTruncatedDuringTheRunIsAnErrorNotSigbus) {
  const auto dir = temp_dir("truncated");
  Config c = small(2, 2);
  c.source = Source::file;
  c.read = ReadMode::mmap;
  c.sample_bytes = 8192;  // whole pages, so the cut leaves later samples unmapped
  c.file_path = write_dataset_file((dir / "d.bin").string(), 13 * 4, c.sample_bytes, 3).path;
  Loader l(c);
  std::filesystem::resize_file(c.file_path, kDatasetHeaderBytes + 8192);  // one sample left
  try {
    while (auto b = l.next()) l.release(*b);
    FAIL() << "reads past the end of a truncated mapping succeeded";
  } catch (const SampleError& e) {
    EXPECT_NE(std::string(e.what()).find("SIGBUS"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(DatasetFile, CleanRemovesDatasetsAndDeadWritersTempFilesOnly) {
  const auto dir = temp_dir("clean");
  write_dataset_file((dir / "dataset-4x64-seed1.bin").string(), 4, 64, 1);
  std::ofstream(dir / "dataset-4x64-seed1.bin.tmp.999999999.0") << "left by a killed run";
  const std::string live = fmt::format("dataset-9x64-seed1.bin.tmp.{}.0", ::getpid());
  std::ofstream(dir / live) << "being written";
  std::ofstream(dir / "notes.txt") << "not ours";
  // A writer in another PID namespace: its pid means nothing here, its lock does.
  const auto foreign = dir / "dataset-8x64-seed1.bin.tmp.999999998.0";
  std::ofstream(foreign) << "being written elsewhere";
  const int lock_fd = ::open(foreign.c_str(), O_RDONLY);
  ASSERT_GE(lock_fd, 0);
  ASSERT_EQ(::flock(lock_fd, LOCK_EX), 0);
  const auto dry = clean_dataset_cache(dir.string(), true);
  ASSERT_EQ(dry.size(), 2u);
  EXPECT_TRUE(std::filesystem::exists(dir / "dataset-4x64-seed1.bin"));
  const auto gone = clean_dataset_cache(dir.string(), false);
  ASSERT_EQ(gone.size(), 2u);
  EXPECT_EQ(gone[0].bytes, kDatasetHeaderBytes + 4 * 64);
  EXPECT_FALSE(std::filesystem::exists(dir / "dataset-4x64-seed1.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir / "dataset-4x64-seed1.bin.tmp.999999999.0"));
  EXPECT_TRUE(std::filesystem::exists(dir / live));
  EXPECT_TRUE(std::filesystem::exists(dir / "notes.txt"));
  EXPECT_TRUE(std::filesystem::exists(foreign));
  ::close(lock_fd);  // its writer is gone: now it is stale
  EXPECT_EQ(clean_dataset_cache(dir.string(), false).size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(foreign));
  std::filesystem::remove_all(dir);
}

TEST(Loader, DecodeSpreadIsDeterministic) {
  std::set<double> costs;
  for (std::int64_t s = 0; s < 200; ++s) {
    const double us = sample_decode_us(100, 0.5, 3, s);
    EXPECT_GE(us, 50);
    EXPECT_LE(us, 150);
    EXPECT_EQ(us, sample_decode_us(100, 0.5, 3, s));
    costs.insert(us);
  }
  EXPECT_GT(costs.size(), 150u);  // it really varies per sample
  EXPECT_EQ(sample_decode_us(100, 0, 3, 5), 100);
  EXPECT_GT(decode_iters_per_us(), 0);

  // The decode result lands in bytes 8..15 and is the same from run to run.
  auto decoded = [](std::uint64_t seed) {
    Config c = small(2, 2);
    c.decode_us = 5;
    c.decode_spread = 0.8;
    c.seed = seed;
    Loader l(c);
    std::vector<std::uint64_t> out;
    while (auto b = l.next()) {
      check_contents(*b, c, seed);
      for (std::size_t k = 0; k < b->samples.size(); ++k) {
        std::uint64_t v;
        std::memcpy(&v, b->data + k * c.sample_bytes + 8, 8);
        out.push_back(v);
      }
      l.release(*b);
    }
    return out;
  };
  const auto a = decoded(11), b = decoded(11), other = decoded(12);
  ASSERT_EQ(a.size(), 52u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);
  std::vector<std::byte> raw(64);
  fill_sample(11, 0, raw.data(), raw.size());
  std::uint64_t raw8;
  std::memcpy(&raw8, raw.data() + 8, 8);
  EXPECT_NE(a[0], raw8);  // decode actually wrote something
}

// Batch 3 (samples 12..15) hangs on sample 13; with 2 workers it is worker 1's.
TEST(Loader, HangIsCaughtByTimeoutAndShutdownJoins) {
  for (int workers : {0, 2}) {
    SCOPED_TRACE(fmt::format("workers={}", workers));
    Config c = small(workers, 2);
    c.timeout = milliseconds(300);
    c.fault = parse_fault("hang@13");
    const auto t_start = Clock::now();
    {
      Loader l(c);
      for (int i = 0; i < 3; ++i) {
        auto b = l.next();
        ASSERT_TRUE(b.has_value());
        l.release(*b);
      }
      const auto t0 = Clock::now();
      try {
        l.next();
        FAIL() << "no timeout";
      } catch (const LoaderTimeout& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("batch 3 (samples 12..15)"), std::string::npos) << m;
        EXPECT_NE(m.find("stuck on sample 13"), std::string::npos) << m;
        EXPECT_NE(m.find(workers == 0 ? "main thread" : "worker 1"), std::string::npos) << m;
        EXPECT_EQ(e.kind(), ErrorKind::hang);
      }
      EXPECT_LT(Clock::now() - t0, c.timeout + kMargin);
    }  // the destructor must release the stuck worker and return
    EXPECT_LT(Clock::now() - t_start, 2 * c.timeout + 2 * kMargin);
  }
}

TEST(Loader, CorruptSampleStopsWithSampleError) {
  for (int workers : {0, 2}) {
    SCOPED_TRACE(fmt::format("workers={}", workers));
    Config c = small(workers, 2);
    c.fault = parse_fault("throw@13");
    Loader l(c);
    for (int i = 0; i < 3; ++i) {
      auto b = l.next();
      ASSERT_TRUE(b.has_value());
      l.release(*b);
    }
    try {
      l.next();
      FAIL() << "no SampleError";
    } catch (const SampleError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("sample 13 on "), std::string::npos) << m;
      EXPECT_NE(m.find(workers == 0 ? "main thread" : "worker 1"), std::string::npos) << m;
      EXPECT_NE(m.find("fault=throw@13"), std::string::npos) << m;
    }
    // The failed batch is consumed; the epoch goes on after it.
    auto b = l.next();
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(b->index, 4);
    l.release(*b);
  }
}

TEST(Loader, CorruptSampleSkippedUnderSkip) {
  for (int workers : {0, 3}) {
    SCOPED_TRACE(fmt::format("workers={}", workers));
    Config c = small(workers, 2);
    c.fault = parse_fault("throw@13");
    c.on_error = OnError::skip;
    Loader l(c);
    std::vector<std::int64_t> samples;
    std::size_t short_batches = 0;
    while (auto b = l.next()) {
      check_contents(*b, c, c.seed);  // packed: the samples after 13 moved down
      if (b->samples.size() != 4u) {
        ++short_batches;
        EXPECT_EQ(b->index, 3);
        EXPECT_EQ(b->samples, (std::vector<std::int64_t>{12, 14, 15}));
      }
      samples.insert(samples.end(), b->samples.begin(), b->samples.end());
      l.release(*b);
    }
    EXPECT_EQ(short_batches, 1u);
    EXPECT_EQ(samples.size(), 51u);
    EXPECT_EQ(std::count(samples.begin(), samples.end(), 13), 0);
    EXPECT_EQ(l.skipped(), 1);
  }
}

TEST(Loader, DestroyMidEpochIsPrompt) {
  Config c = small(4, 2);
  c.num_batches = 100000;
  c.decode_us = 200;
  c.timeout = milliseconds(20000);
  const auto t0 = Clock::now();
  {
    Loader l(c);
    auto held = l.next();  // kept, not released: destruction must not wait for it
    ASSERT_TRUE(held.has_value());
    auto b = l.next();
    ASSERT_TRUE(b.has_value());
    l.release(*b);
  }
  EXPECT_LT(Clock::now() - t0, kMargin);
}

// prefetch * workers + 1 slots: the batch the consumer holds has its own. A
// second one held leaves the workers short (torch would allocate another).
TEST(Loader, HeldSlotsAreNamedInTheTimeout) {
  Config c = small(1, 1);
  c.timeout = milliseconds(200);
  Loader l(c);
  auto held = l.next();
  ASSERT_TRUE(held.has_value());
  auto second = l.next();  // batch 1 was dispatched as batch 0 was handed over, into the +1 slot
  ASSERT_TRUE(second.has_value());
  try {
    l.next();  // batch 2 has no slot: both are held
    FAIL() << "no timeout";
  } catch (const LoaderTimeout& e) {
    EXPECT_NE(std::string(e.what()).find("waiting for a free slot: 2 of the 2"), std::string::npos) << e.what();
  }
  l.release(*held);
  l.release(*second);
  EXPECT_TRUE(l.next().has_value());
}

TEST(Loader, ReleaseMisuseIsAUsageError) {
  Config c = small(0, 1);
  Loader l(c);
  auto b = l.next();
  ASSERT_TRUE(b.has_value());
  EXPECT_THROW(l.next(), UsageError);  // inline: one slot, not yet released
  l.release(*b);
  EXPECT_THROW(l.release(*b), UsageError);  // twice
  EXPECT_THROW(l.release(Batch{}), UsageError);
}

TEST(Loader, AllocCallbackProvidesTheSlots) {
  int calls = 0;
  Config c = small(3, 2);
  c.alloc = [&](std::size_t bytes) {
    ++calls;
    EXPECT_EQ(bytes, 4u * 64);
    return Buffer(new std::byte[bytes], bytes, MemKind::host_pinned,
                  [](void* p) { delete[] static_cast<std::byte*>(p); });
  };
  Loader l(c);
  EXPECT_EQ(calls, 7);  // 3 workers x prefetch 2, + 1 for the batch the consumer holds
  EXPECT_EQ(drain(l, c.seed).size(), 13u);
}

TEST(Loader, EmptyEpoch) {
  for (int workers : {0, 2}) {
    Config c = small(workers, 2);
    c.num_batches = 0;
    Loader l(c);
    EXPECT_FALSE(l.next().has_value());
  }
}

TEST(Loader, ParseFault) {
  EXPECT_EQ(parse_fault("none").kind, Fault::Kind::none);
  const Fault h = parse_fault("hang@0");
  EXPECT_EQ(h.kind, Fault::Kind::hang);
  EXPECT_EQ(h.sample, 0);
  const Fault t = parse_fault("throw@123");
  EXPECT_EQ(t.kind, Fault::Kind::fail);
  EXPECT_EQ(t.sample, 123);
  EXPECT_EQ(to_string(t), "throw@123");
  for (const char* bad : {"", "hang", "hang@", "hang@-1", "hang@+1", "hang@ 3", "throw@x", "throw@3x",
                          "boom@3", "HANG@3", "None", "hang@99999999999999999999"}) {
    try {
      parse_fault(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("hang@N"), std::string::npos) << m;
      EXPECT_NE(m.find("throw@N"), std::string::npos) << m;
    }
  }
}

TEST(Loader, BadConfigIsAUsageError) {
  auto rejects = [](auto edit) {
    Config c = small(2, 2);
    edit(c);
    EXPECT_THROW(Loader{c}, UsageError);
  };
  rejects([](Config& c) { c.workers = -1; });
  rejects([](Config& c) { c.batch = 0; });
  rejects([](Config& c) { c.prefetch = 0; });
  rejects([](Config& c) { c.sample_bytes = 15; });
  rejects([](Config& c) { c.source = Source::file; });  // no path
  rejects([](Config& c) { c.decode_us = -1; });
  rejects([](Config& c) { c.decode_spread = 1.5; });
  rejects([](Config& c) { c.num_batches = -1; });
  rejects([](Config& c) { c.timeout = milliseconds(0); });
  rejects([](Config& c) { c.fault = {Fault::Kind::hang, -1}; });
  rejects([](Config& c) {
    c.source = Source::file;
    c.file_path = "/nonexistent/stallbench/data.bin";
  });
}

}  // namespace
}  // namespace sb::loader

namespace sb::loader {
namespace {

TEST(Loader, OnLoadHookBracketsEveryBatchLoad) {
  for (int workers : {0, 3}) {
    Config c = small(workers, 2);
    std::atomic<int> begins{0}, ends{0}, open{0}, max_open{0};
    c.on_load = [&](bool begin) {
      if (begin) {
        ++begins;
        const int now = ++open;
        int m = max_open.load();
        while (now > m && !max_open.compare_exchange_weak(m, now)) {
        }
      } else {
        ++ends;
        --open;
      }
    };
    {
      Loader l(c);
      drain(l, c.seed);
    }
    EXPECT_EQ(begins.load(), c.num_batches) << workers;
    EXPECT_EQ(ends.load(), c.num_batches) << workers;
    EXPECT_LE(max_open.load(), std::max(1, workers)) << "one open range per loading thread";
  }
}

}  // namespace

namespace {

// The queueing model and the bottleneck rule, exactly, at and around their edges.
TEST(QueueingModel, PredictedBusyAndBottleneck) {
  EXPECT_DOUBLE_EQ(predicted_busy(0, 0.020, 0.040), 0.5);   // inline loading: one loader
  EXPECT_DOUBLE_EQ(predicted_busy(1, 0.020, 0.040), 0.5);
  EXPECT_DOUBLE_EQ(predicted_busy(2, 0.020, 0.040), 1.0);   // two workers exactly keep up
  EXPECT_DOUBLE_EQ(predicted_busy(3, 0.020, 0.040), 1.0);   // capped at 1
  EXPECT_DOUBLE_EQ(predicted_busy(4, 0.010, 0.080), 0.5);
  EXPECT_DOUBLE_EQ(predicted_busy(1, 0.020, 0.0), 1.0);     // free loading never starves the device
  EXPECT_STREQ(bottleneck(1, 0.020, 0.040), "loader");
  EXPECT_STREQ(bottleneck(2, 0.020, 0.040), "device");      // load / workers == train: not the loader
  EXPECT_STREQ(bottleneck(0, 0.020, 0.019), "device");
  // Workers beyond the loader's CPUs add nothing: two workers on one core load as one.
  EXPECT_EQ(effective_workers(4, 1), 1);
  EXPECT_EQ(effective_workers(0, 1), 1);
  EXPECT_EQ(effective_workers(3, 8), 3);
  EXPECT_DOUBLE_EQ(predicted_busy(2, 0.020, 0.040, 1), 0.5);
  EXPECT_DOUBLE_EQ(predicted_busy(4, 0.020, 0.040, 2), 1.0);
  EXPECT_STREQ(bottleneck(2, 0.020, 0.040, 1), "loader");
}

}  // namespace
}  // namespace sb::loader

// ---- derive_epoch: the figures from a recorded epoch, no device, no clock ----
namespace sb::loader {
namespace {

// n steps of `train` seconds (h2d 10% of it), each waiting `wait` for its
// batch first; one load record per batch of `load` seconds per worker.
EpochRecord synthetic_epoch(int n, double train, double wait, double load, int workers) {
  EpochRecord rec;
  double t = 0;
  for (int s = 0; s < n; ++s) {
    rec.waits.push_back({s, t, t + wait});
    t += wait;
    if (s == 0) rec.first_batch_s = t;
    rec.steps.push_back({s, t, t + 0.1 * train, t + train});
    t += train;
    rec.loads.push_back({workers == 0 ? -1 : s % workers, s, t - train - wait - load, t - train - wait});
  }
  rec.wall_s = t;
  return rec;
}

TEST(DeriveEpoch, BusyFractionIsTheDeviceUnionOverTheSteadyWindow) {
  // 10 steps of 20 ms, each after a 20 ms wait: half busy once the first batch is in.
  const EpochRecord rec = synthetic_epoch(10, 0.020, 0.020, 0.040, 1);
  const Point p = derive_epoch(rec, {1, 32, 32 * 4096, true, false});
  // Window [first batch, wall] = 0.020 .. 0.400: busy 10 x 20 ms, waits 9 x 20 ms.
  EXPECT_NEAR(p.metric("busy_pct")->value, 100.0 * 0.200 / 0.380, 1e-9);
  EXPECT_NEAR(p.metric("train_ms")->value, 20.0, 1e-9);
  EXPECT_NEAR(p.metric("load_ms")->value, 40.0, 1e-9);
  EXPECT_NEAR(p.metric("wait_ms")->value, 1e3 * 9 * 0.020 / 10, 1e-9);
  // The queueing model: min(1, max(1, workers) * T / L) = 0.5.
  EXPECT_NEAR(p.metric("predicted_pct")->value, 50.0, 1e-9);
  EXPECT_NEAR(p.metric("model_error_pts")->value, 100.0 * 0.200 / 0.380 - 50.0, 1e-9);
  EXPECT_NEAR(p.metric("samples_per_s")->value, 9 * 32 / 0.380, 1e-6);
  EXPECT_NEAR(p.metric("first_batch_ms")->value, 20.0, 1e-9);
  // h2d: 10% of each step, the batch's bytes each time.
  EXPECT_NEAR(p.metric("h2d_gbs")->value, 32.0 * 4096 / 0.002 / 1e9, 1e-9);
  EXPECT_EQ(p.info["bottleneck"], "loader");
  EXPECT_EQ(p.info["steps"], 10);
}

TEST(DeriveEpoch, EnoughWorkersPredictFullUseAndNameTheDevice) {
  const EpochRecord rec = synthetic_epoch(8, 0.020, 0.0, 0.040, 4);
  Timeline tl;
  const Point p = derive_epoch(rec, {4, 8, 8 * 64, false, true}, &tl);
  EXPECT_NEAR(p.metric("predicted_pct")->value, 100.0, 1e-9);  // min(1, 4 * 20 / 40)
  EXPECT_NEAR(p.metric("busy_pct")->value, 100.0, 1e-9);
  EXPECT_EQ(p.info["bottleneck"], "device");
  EXPECT_FALSE(p.metric("sampled_util_pct"));  // no samples recorded, no figure
  EXPECT_NE(p.info.value("note", "").find("simulated"), std::string::npos);
  EXPECT_NE(p.metric("h2d_gbs")->note.find("pageable"), std::string::npos);
  // The timeline holds every span: 8 waits, 8 h2d, 8 compute, 8 loads.
  EXPECT_EQ(tl.spans().size(), 32u);
}

TEST(DeriveEpoch, TwoViewsOfTheLoadersSupply) {
  // Four workers share one CPU: each load takes 160 ms of wall time but 40 ms
  // of CPU. From wall time, 4 x 20 / 160 = 50%: the sharing is in the
  // measured load time. With the loader's one CPU to itself: 1 x 20 / 40 =
  // 50% as well; with four CPUs, 100%.
  EpochRecord rec = synthetic_epoch(8, 0.020, 0.020, 0.160, 4);
  for (auto& l : rec.loads) l.cpu_s = 0.040;
  const Point one_cpu = derive_epoch(rec, {4, 8, 512, true, false, 1});
  EXPECT_NEAR(one_cpu.metric("predicted_pct")->value, 50.0, 1e-9);
  EXPECT_NEAR(one_cpu.metric("predicted_own_cpus_pct")->value, 50.0, 1e-9);
  EXPECT_NEAR(one_cpu.metric("load_cpu_ms")->value, 40.0, 1e-9);
  EXPECT_NEAR(one_cpu.metric("load_ms")->value, 160.0, 1e-9);
  EXPECT_EQ(one_cpu.info["bottleneck"], "loader");
  const Point four_cpus = derive_epoch(rec, {4, 8, 512, true, false, 4});
  EXPECT_NEAR(four_cpus.metric("predicted_pct")->value, 50.0, 1e-9);
  EXPECT_NEAR(four_cpus.metric("predicted_own_cpus_pct")->value, 100.0, 1e-9);
}

TEST(DeriveEpoch, AnEmptyEpochHasNoNaN) {
  EpochRecord rec;
  rec.wall_s = 0.5;
  const Point p = derive_epoch(rec, {0, 4, 256, true, false});
  for (const auto& m : p.metrics) EXPECT_TRUE(std::isfinite(m.value)) << m.name;
  EXPECT_EQ(p.info["steps"], 0);
}

}  // namespace
}  // namespace sb::loader

// ---- the schedule against torch's DataLoader, as recorded ----
// tests/data/dataloader_torch/schedule.txt holds what torch 2.15's
// _MultiProcessingDataLoaderIter did in cases where this test, not a clock,
// decides when each batch's load runs (record.py there; its README). Each
// case is replayed here through the same gates: a batch's load waits at its
// first sample until the case releases it.
namespace sb::loader {
namespace {

struct TorchCase {
  std::string name;
  int workers = 0, prefetch = 0, slow = -1;
  bool in_order = true;
  std::int64_t batches = 0;
  std::set<std::int64_t> errors;
  struct Event {
    enum class Kind { dispatch, release, deliver } kind;
    std::int64_t batch = -1;
    int worker = -1;
    std::int64_t handed = -1;
    bool error = false;
  };
  std::vector<Event> events;
};

// Found from this file's path as the compiler was given it: absolute, or
// relative to the build root, which meson puts above tests/test_loader.
std::filesystem::path torch_schedule_file() {
  namespace fs = std::filesystem;
  const fs::path src = __FILE__;
  std::vector<fs::path> roots{fs::path()};
  if (src.is_relative()) {
    roots = {fs::current_path()};
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) roots.push_back(exe.parent_path().parent_path());
  }
  for (const auto& r : roots) {
    const fs::path f = (r / src).parent_path().parent_path() / "data" / "dataloader_torch" / "schedule.txt";
    if (fs::exists(f)) return f;
  }
  return {};
}

std::vector<TorchCase> torch_cases() {
  std::vector<TorchCase> out;
  const auto path = torch_schedule_file();
  if (path.empty()) return out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string word, k;
    ls >> word;
    if (word == "case") {
      TorchCase c;
      std::string errors;
      int in_order = 1;
      ls >> c.name >> k >> c.workers >> k >> c.prefetch >> k >> in_order >> k >> c.batches >> k >> c.slow >> k;
      c.in_order = in_order != 0;
      while (ls >> errors)
        if (errors != "none") c.errors.insert(std::stoll(errors));
      out.push_back(c);
    } else if (word == "dispatch" || word == "release" || word == "deliver") {
      if (out.empty()) continue;
      TorchCase::Event e{};
      e.kind = word == "dispatch"  ? TorchCase::Event::Kind::dispatch
               : word == "release" ? TorchCase::Event::Kind::release
                                   : TorchCase::Event::Kind::deliver;
      ls >> e.batch;
      if (e.kind != TorchCase::Event::Kind::release) ls >> k >> e.worker;
      if (e.kind == TorchCase::Event::Kind::dispatch) ls >> k >> e.handed;
      if (e.kind == TorchCase::Event::Kind::deliver) e.error = (ls >> k) && k == "error";
      out.back().events.push_back(e);
    }
  }
  return out;
}

// Holds each batch's load (batch = 1 sample: sample s is batch s) until the
// test releases it; a released batch listed in `fail` then throws, as a
// corrupt sample does. Every wait has a deadline, so a replay that went
// wrong ends.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  std::set<std::int64_t> open, fail;
  bool all = false;
  double wait(std::int64_t s) {
    std::unique_lock lk(mu);
    cv.wait_until(lk, Clock::now() + std::chrono::seconds(20), [&] { return all || open.count(s) > 0; });
    if (fail.count(s)) throw std::runtime_error("corrupt batch");
    return 0;
  }
  void release(std::int64_t s) {
    {
      std::lock_guard lk(mu);
      open.insert(s);
    }
    cv.notify_all();
  }
  void open_all() {
    {
      std::lock_guard lk(mu);
      all = true;
    }
    cv.notify_all();
  }
};

Config gated(const std::shared_ptr<Gate>& gate, int workers, int prefetch, bool in_order, std::int64_t batches) {
  Config c = small(workers, prefetch);
  c.batch = 1;
  c.num_batches = batches;
  c.in_order = in_order;
  c.timeout = milliseconds(5000);  // only a replay gone wrong waits this long
  c.sample_us = [gate](std::int64_t s) { return gate->wait(s); };
  return c;
}

// Polls records() for batch b, for at most 5 s.
bool loaded(const Loader& l, std::int64_t b) {
  const auto until = Clock::now() + std::chrono::seconds(5);
  for (;;) {
    for (const auto& r : l.records())
      if (r.batch == b) return true;
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
}

std::string dispatch_text(const std::vector<Dispatch>& ds) {
  std::string out;
  for (const auto& d : ds) out += fmt::format("{}->w{}@{} ", d.batch, d.worker, d.handed);
  return out;
}

void replay(const TorchCase& tc) {
  auto gate = std::make_shared<Gate>();
  gate->fail = tc.errors;
  Loader l(gated(gate, tc.workers, tc.prefetch, tc.in_order, tc.batches));
  struct OpenAll {  // before the loader goes: no worker is left at a gate
    std::shared_ptr<Gate> g;
    ~OpenAll() { g->open_all(); }
  } open_all{gate};
  std::map<std::int64_t, int> worker;  // torch's worker of each batch
  std::vector<Dispatch> want;
  std::optional<Batch> held;  // the consumer keeps each batch until it has the next one
  for (const auto& e : tc.events) {
    switch (e.kind) {
      case TorchCase::Event::Kind::dispatch:
        want.push_back({e.batch, e.worker, e.handed});
        worker[e.batch] = e.worker;
        break;
      case TorchCase::Event::Kind::release:
        // torch's worker ran it at once: here too it must have been dispatched and have a slot.
        gate->release(e.batch);
        ASSERT_TRUE(loaded(l, e.batch)) << "batch " << e.batch << " released, not loaded; dispatched: "
                                        << dispatch_text(l.dispatches());
        break;
      case TorchCase::Event::Kind::deliver:
        if (e.error) {
          try {
            l.next();
            FAIL() << "batch " << e.batch << " did not raise";
          } catch (const SampleError& err) {
            EXPECT_NE(std::string(err.what()).find(fmt::format("sample {} on worker {}", e.batch, e.worker)),
                      std::string::npos) << err.what();
          }
        } else {
          std::optional<Batch> b = l.next();
          ASSERT_TRUE(b.has_value());
          ASSERT_EQ(b->index, e.batch) << "delivered out of torch's order";
          EXPECT_EQ(b->worker, e.worker);
          if (held) l.release(*held);
          held = std::move(b);
        }
        break;
    }
  }
  if (held) l.release(*held);
  EXPECT_FALSE(l.next().has_value());
  EXPECT_EQ(dispatch_text(l.dispatches()), dispatch_text(want));
  const auto rec = l.records();
  EXPECT_EQ(rec.size(), std::size_t(tc.batches));
  for (const auto& r : rec) EXPECT_EQ(r.worker, worker[r.batch]) << "batch " << r.batch;
}

TEST(TorchSchedule, TheRecordedCasesAreThere) {
  const auto cases = torch_cases();
  ASSERT_FALSE(torch_schedule_file().empty()) << "tests/data/dataloader_torch/schedule.txt not found from " << __FILE__;
  ASSERT_EQ(cases.size(), 7u);
  for (const auto& c : cases) EXPECT_GT(c.events.size(), std::size_t(2 * c.batches)) << c.name;
}

// in_order=false with a slow worker: the others take its share (torch passes
// a worker with `prefetch` batches out), and deliver as they finish.
TEST(TorchSchedule, OutOfOrderASlowWorkerIsPassedBy) {
  for (const auto& c : torch_cases()) {
    if (c.in_order) continue;
    SCOPED_TRACE(c.name);
    replay(c);
  }
}

// in_order=true: strict round-robin, and a batch is dispatched as one is
// handed over, so the batch the consumer holds does not count against
// prefetch (ordered_w2_pf1_slow1: worker 0 loads batch 2 while the consumer
// holds batch 0, its only prefetch).
TEST(TorchSchedule, InOrderDispatchesAsBatchesAreHandedOver) {
  for (const auto& c : torch_cases()) {
    if (!c.in_order) continue;
    SCOPED_TRACE(c.name);
    replay(c);
  }
}

// torch keeps prefetch * workers batches dispatched and not handed over
// while the epoch has batches left, whatever the consumer holds.
TEST(TorchSchedule, PrefetchTimesWorkersAheadOfTheConsumer) {
  for (bool in_order : {true, false}) {
    for (int workers : {1, 3}) {
      for (int prefetch : {1, 2, 4}) {
        SCOPED_TRACE(fmt::format("in_order={} workers={} prefetch={}", in_order, workers, prefetch));
        Config c = small(workers, prefetch);
        c.in_order = in_order;
        Loader l(c);
        std::vector<std::int64_t> order;
        while (auto b = l.next()) {
          order.push_back(b->index);
          l.release(*b);
        }
        const auto ds = l.dispatches();
        ASSERT_EQ(ds.size(), std::size_t(c.num_batches));
        const std::int64_t window = std::int64_t(workers) * prefetch;
        for (std::size_t k = 0; k < ds.size(); ++k) {
          EXPECT_EQ(ds[k].batch, std::int64_t(k));  // the sampler's order
          EXPECT_EQ(ds[k].handed, std::max<std::int64_t>(0, std::int64_t(k) + 1 - window)) << "batch " << k;
        }
      }
    }
  }
}

// torch's timeout bounds each wait for any batch; with in_order=true a batch
// that arrives out of order starts the wait again (timeout_demo.py there:
// timeout=2, batches 1 and 3 at 1.5 s and 3 s, the error at 5.1 s). Worker 0
// holds batch 0; batches 1 and 3 are let through at 2 s and 5 s, each within
// the 4 s timeout of the one before, batch 3 after 4 s from the call. The
// only timed part is the release thread's, with 1 s to spare either way.
TEST(TorchSchedule, InOrderTimeoutRestartsWhenABatchArrives) {
  auto gate = std::make_shared<Gate>();
  Config c = gated(gate, 2, 2, true, 8);
  c.timeout = milliseconds(4000);
  Loader l(c);
  struct OpenAll {
    std::shared_ptr<Gate> g;
    ~OpenAll() { g->open_all(); }
  } open_all{gate};
  const auto t0 = Clock::now();
  std::jthread releaser([&] {  // joined on every way out
    std::this_thread::sleep_until(t0 + milliseconds(2000));
    gate->release(1);
    std::this_thread::sleep_until(t0 + milliseconds(5000));
    gate->release(3);
  });
  try {
    l.next();
    ADD_FAILURE() << "batch 0 arrived";
  } catch (const LoaderTimeout& e) {
    std::set<std::int64_t> arrived;
    for (const auto& r : l.records()) arrived.insert(r.batch);
    EXPECT_EQ(arrived, (std::set<std::int64_t>{1, 3})) << "the timeout fired before batch 3 arrived: " << e.what();
    EXPECT_NE(std::string(e.what()).find("batch 0 (samples 0..0)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sb::loader
