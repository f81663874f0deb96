// The host data loader of the `dataloader` scenario: PyTorch DataLoader
// semantics (num_workers, prefetch_factor, in_order, timeout) in C++, so the
// scenario can reproduce "the loader cannot feed the device" and a loader
// that hangs or meets a corrupt sample.
//
// Batch b holds samples b*batch .. b*batch+batch-1. With workers > 0 the
// batches are scheduled as torch's _MultiProcessingDataLoaderIter schedules
// them (torch 2.15, recorded in tests/data/dataloader_torch):
// - prefetch * workers batches are dispatched at construction, and one more
//   each time next() hands a batch over (or raises for a failed one), so at
//   most prefetch * workers are dispatched and not yet handed over; the
//   batch the consumer holds does not count.
// - Dispatch cycles over the workers. With in_order=false a worker that
//   already has `prefetch` batches not yet handed over is passed by, so a
//   slow worker does not hold the others up; with in_order=true batch b goes
//   to worker b % workers whatever it has.
// - A worker loads its batches in the order they were dispatched to it.
// - timeout bounds the wait for any batch from any worker: with in_order=true
//   a batch that arrives out of order restarts it, as it restarts torch's.
// A batch is loaded into one of prefetch * workers + 1 staging slots (the +1:
// the batch the consumer holds). The consumer calls next(), copies the batch
// to the device, and release()s its slot once that copy has completed. Torch
// allocates each batch instead, so a consumer that holds more than one batch
// at a time leaves the workers short of slots here, and not there.
//
// Every wait in here has a deadline or ends at shutdown: the destructor
// always returns, even with a worker stuck in an injected hang.
#pragma once

#include <atomic>              // std::atomic
#include <chrono>              // std::chrono
#include <condition_variable>  // std::condition_variable
#include <cstddef>             // std::byte, std::size_t
#include <cstdint>             // std::int64_t, std::uint64_t
#include <deque>               // std::deque
#include <functional>          // std::function
#include <map>                 // std::map
#include <memory>              // std::unique_ptr
#include <mutex>               // std::mutex
#include <optional>            // std::optional
#include <string>              // std::string
#include <thread>              // std::thread
#include <vector>              // std::vector

#include "harness/device.hpp"  // sb::Buffer: staging slots
#include "harness/errors.hpp"  // sb::Error, HangError, UsageError
#include "harness/names.hpp"  // NameTable: the choices of source, read and on_error
#include "workloads/dataset_file.hpp"  // the file behind source=file

namespace sb::loader {

// An injected fault, keyed by global sample index.
struct Fault {
  enum class Kind { none, hang, fail } kind = Kind::none;
  std::int64_t sample = -1;
};
// "none", "hang@N", "throw@N" (N = global sample index >= 0).
// Throws sb::UsageError naming the valid forms.
Fault parse_fault(const std::string& text);

// The queueing model beside each measurement: with `workers` loaders each
// needing load_s per batch and a device needing train_s per step, the device
// is busy min(1, w * train / load) of the time. With load_s measured as wall
// time (which already includes workers sharing cores), w = max(1, workers)
// (workers = 0 loads inline: one loader) and loader_cpus is 0. With load_s a
// load's CPU time (its cost on a core of its own), w is also at most the
// CPUs left to the loader (loader_cpus): two workers on one core load no
// faster than one.
int effective_workers(int workers, int loader_cpus);
double predicted_busy(int workers, double train_s, double load_s, int loader_cpus = 0);
// "loader" when one effective worker's share of a batch takes longer than a
// step (load / w > train), else "device".
const char* bottleneck(int workers, double train_s, double load_s, int loader_cpus = 0);
std::string to_string(const Fault& f);  // inverse of parse_fault
// The calling thread's CPU time, seconds.
double thread_cpu_s();

enum class OnError { stop, skip };
enum class Source { memory, file };
enum class ReadMode { pread, mmap };
inline constexpr NameTable<OnError, 2> kOnErrorNames{{{{OnError::stop, "stop"}, {OnError::skip, "skip"}}}};
inline constexpr NameTable<Source, 2> kSourceNames{{{{Source::memory, "memory"}, {Source::file, "file"}}}};
inline constexpr NameTable<ReadMode, 2> kReadModeNames{{{{ReadMode::pread, "pread"}, {ReadMode::mmap, "mmap"}}}};

struct Config {
  int workers = 0;              // 0: load inline in the caller's thread (DataLoader num_workers=0)
  int prefetch = 2;             // prefetch_factor: prefetch * workers batches in flight; >= 1
  int batch = 32;               // samples per batch
  std::size_t sample_bytes = 4096;
  double decode_us = 0;         // real CPU work per sample, not sleep
  double decode_spread = 0;     // per-sample cost uniform in +-spread*decode_us, from (seed, sample); 0..1
  // When set, the CPU work of sample s in microseconds (real work, as decode_us), in place of
  // decode_us and decode_spread: a sample whose cost is its own (the train scenario's rows cost
  // their real tokens). Must return a finite value >= 0.
  std::function<double(std::int64_t sample)> sample_us;
  Source source = Source::memory;
  ReadMode read = ReadMode::pread;
  std::vector<int> cpus;        // the CPUs the workers run on (sched_setaffinity); empty: any
  std::string file_path;        // for Source::file: a dataset file made by write_dataset_file (dataset_file.hpp)
  bool in_order = true;         // deliver batches in index order (DataLoader's default); false: as they finish
  // DataLoader's `timeout`: the longest next() waits for any batch (above).
  // Inline too, where torch has none (its single-process iterator requires
  // timeout=0): here an inline hang is caught, never waited on for ever.
  std::chrono::milliseconds timeout{10000};
  Fault fault;
  OnError on_error = OnError::stop;
  std::uint64_t seed = 1;
  std::int64_t num_batches = 0; // batches in the epoch
  std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now();  // zero of record times
  // Allocates one host staging slot of `bytes` (the scenario passes the device's pinned or pageable allocation).
  std::function<sb::Buffer(std::size_t bytes)> alloc;  // if empty, plain new[]-backed Buffers
  // Called on the loading thread as a batch load begins (true) and ends
  // (false): the scenario names it for profilers (NVTX "load" ranges).
  std::function<void(bool begin)> on_load;
};

struct LoadRecord {
  int worker;            // -1: inline (workers = 0)
  std::int64_t batch;
  double t0_s, t1_s;     // seconds from Config::origin
  double cpu_s = 0;      // CPU time the loading thread spent on it (its cost on a core of its own)
};

// One batch sent to a worker.
struct Dispatch {
  std::int64_t batch;
  int worker;
  std::int64_t handed;  // batches next() had handed over (or raised for), the one it was handing counted; 0: at construction
};

struct Batch {
  std::int64_t index = -1;
  const std::byte* data = nullptr;    // samples.size() * sample_bytes bytes, valid until release()
  std::size_t bytes = 0;
  std::vector<std::int64_t> samples;  // global sample indices, in order, skipped ones removed
  int worker = -1;
  int slot = -1;                      // internal
};

// Names the batch, the worker and the sample it is stuck on.
struct LoaderTimeout : sb::HangError {
  using HangError::HangError;
};
// Names the sample and the worker.
struct SampleError : sb::Error {
  explicit SampleError(const std::string& w) : Error(ErrorKind::runtime, w) {}
};

class Loader {
 public:
  // Validates cfg (UsageError), allocates workers*prefetch+1 (or 1 when
  // inline) slots, opens the file source, dispatches the first
  // workers*prefetch batches, then starts the workers.
  explicit Loader(Config cfg);
  // Stops and joins every worker, including one stuck in a hang fault.
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next batch, or nullopt at epoch end. Throws LoaderTimeout when no
  // batch arrives within cfg.timeout (calling again waits again), and
  // SampleError (on_error=stop) when the due batch failed; that batch is then
  // consumed and the next call goes on with the following one, as PyTorch's
  // iterator does. Inline (workers=0), the previous batch must have been
  // released first: there is one slot (UsageError otherwise).
  std::optional<Batch> next();
  // The consumer is done with b's memory (its H2D copy completed); the slot is reused.
  void release(const Batch& b);
  std::vector<LoadRecord> records() const;  // one per produced batch
  std::vector<Dispatch> dispatches() const; // in dispatch order (workers > 0)
  int skipped() const;                      // samples dropped under on_error=skip
  const Config& config() const { return cfg_; }

 private:
  // A batch a worker finished (or failed) and the consumer has not taken yet.
  struct Done {
    int slot = -1;
    int worker = -1;
    std::vector<std::int64_t> samples;
    std::string error;  // non-empty: SampleError text
  };
  enum class Outcome { done, stopped, timed_out };

  void shutdown();  // idempotent: stop, join, unmap, close
  void worker_loop(int w);
  // Loads batch b into dst, sample by sample. hang_deadline bounds an
  // injected hang (inline); workers pass nullopt and wait for shutdown.
  Outcome load_batch(std::int64_t b, int worker, std::byte* dst, Done& out,
                     std::optional<std::chrono::steady_clock::time_point> hang_deadline);
  void read_sample(std::int64_t s, std::byte* dst) const;
  bool decode_sample(std::int64_t s, std::byte* p) const;  // false: shutdown interrupted it
  std::optional<Batch> next_inline();
  void dispatch();  // under mu_: the next batch to a worker, as torch's _try_put_index
  Batch take(std::int64_t index, Done&& d);  // under mu_
  std::string timeout_message(std::int64_t b);  // under mu_
  std::string who(int worker) const;
  double since_origin(std::chrono::steady_clock::time_point t) const;

  const Config cfg_;
  std::size_t slot_bytes_ = 0;
  double iters_per_us_ = 0;
  std::vector<sb::Buffer> slots_;
  int fd_ = -1;
  const std::byte* map_ = nullptr;
  std::size_t map_bytes_ = 0;

  mutable std::mutex mu_;
  std::condition_variable ready_cv_;  // consumer: a batch finished
  std::condition_variable slot_cv_;   // workers: a batch dispatched, a slot freed, or shutdown
  bool stop_ = false;                 // under mu_
  std::atomic<bool> stopping_{false}; // the same, read lock-free between samples
  std::vector<int> free_;             // free slot ids (workers share them)
  std::vector<char> held_;            // per slot: delivered and not yet released
  std::vector<std::deque<std::int64_t>> queue_;  // per worker: dispatched batches not yet started, in order
  std::vector<int> tasks_;            // per worker: dispatched and not yet handed over (torch's _workers_num_tasks)
  std::vector<int> worker_of_;        // per batch: the worker it went to, -1 before dispatch
  int cycle_ = 0;                     // the worker dispatch considers first (torch's _worker_queue_idx_cycle)
  std::int64_t send_ = 0;             // the next batch to dispatch
  std::uint64_t arrivals_ = 0;        // batches finished so far: restarts an in-order wait
  std::vector<Dispatch> dispatches_;
  std::map<std::int64_t, Done> ready_;  // finished, by batch index
  std::deque<std::int64_t> finish_order_;  // in_order=false: delivery order
  std::vector<char> delivered_;       // per batch: returned or thrown by next()
  std::int64_t next_index_ = 0;       // in_order: the batch due
  std::int64_t n_delivered_ = 0;
  std::vector<LoadRecord> records_;
  // Per worker (index workers = inline): the sample being loaded, -1 between
  // batches. Read by timeout messages without stopping the worker.
  std::unique_ptr<std::atomic<std::int64_t>[]> current_;
  std::atomic<int> skipped_{0};
  std::vector<std::thread> threads_;
};

// Calibrated once per process: iterations of the decode loop per microsecond on this CPU.
double decode_iters_per_us();
// The decode cost of one sample in microseconds: decode_us * (1 + spread*u),
// u uniform in [-1, 1) from (seed, sample). The queueing model uses its mean.
double sample_decode_us(double decode_us, double spread, std::uint64_t seed, std::int64_t sample);
// The stored content of a sample (before decode): bytes 0..7 = index
// (little-endian int64), the rest from splitmix64 of (seed, index). Checks
// regenerate expected bytes from it.
void fill_sample(std::uint64_t seed, std::int64_t index, std::byte* out, std::size_t bytes);

}  // namespace sb::loader
