#include "workloads/loader.hpp"
#include "harness/text.hpp"  // parse_whole

#include <algorithm>   // std::min, std::max, std::count
#include <bit>         // std::endian
#include <cerrno>      // errno
#include <cstring>     // std::memcpy, std::strerror
#include <limits>      // std::numeric_limits
#include <mutex>       // std::once_flag
#include <stdexcept>   // std::runtime_error: a failed sample inside a worker

#include <fcntl.h>     // open
#include <time.h>      // clock_gettime: a load's CPU time
#include <setjmp.h>    // sigsetjmp, siglongjmp: a guarded read from a mapping
#include <signal.h>    // sigaction: SIGBUS
#include <sys/mman.h>  // mmap, munmap
#include <sys/stat.h>  // fstat
#include <unistd.h>    // pread, close, getpid

#include <fmt/format.h>  // fmt::format

#include "harness/cpu_affinity.hpp"  // pin_this_thread: workers on the loader's CPUs
#include "harness/host_memory.hpp"  // check_host_memory, reserve_host_memory: the batch slots
#include "harness/random.hpp"       // splitmix64, uniform_pm1
#include "harness/units.hpp"        // format_bytes

namespace sb::loader {

namespace {

using Clock = std::chrono::steady_clock;

// ---- reads through a mapping that may shrink under them ----
// A mapped file truncated during a run (another process rewrote or cut it)
// raises SIGBUS on the next read past its new end. The read is guarded: a
// SIGBUS inside the guarded range jumps back to the guard, which reports a
// DatasetFileError (a point error), not a crash. Any other SIGBUS goes to
// the handler that was there before.
// volatile, and fenced below: the compiler knows memcpy reads none of them
// and would otherwise drop the stores around it as dead.
thread_local sigjmp_buf* volatile t_bus_jump = nullptr;
thread_local const std::byte* volatile t_bus_lo = nullptr;
thread_local const std::byte* volatile t_bus_hi = nullptr;
struct sigaction g_previous_bus {};

extern "C" void on_mapping_fault(int sig, siginfo_t* info, void* uctx) {
  const auto* at = static_cast<const std::byte*>(info->si_addr);
  if (t_bus_jump && at >= t_bus_lo && at < t_bus_hi) siglongjmp(*t_bus_jump, 1);
  // Not ours: the previous disposition, for this and every later SIGBUS.
  if (g_previous_bus.sa_flags & SA_SIGINFO) {
    g_previous_bus.sa_sigaction(sig, info, uctx);
    return;
  }
  sigaction(SIGBUS, &g_previous_bus, nullptr);  // returning re-runs the faulting access under it
}

void install_mapping_fault_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_mapping_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_previous_bus);
  });
}

// memcpy from a mapping; false when the copy raised SIGBUS inside [lo, hi).
bool copy_from_mapping(std::byte* dst, const std::byte* src, std::size_t n, const std::byte* lo,
                       const std::byte* hi) {
  sigjmp_buf jump;
  if (sigsetjmp(jump, 1) != 0) {  // 1: the mask is restored (SIGBUS was blocked in the handler)
    t_bus_jump = nullptr;
    return false;
  }
  t_bus_lo = lo;
  t_bus_hi = hi;
  t_bus_jump = &jump;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_bus_jump = nullptr;
  return true;
}

void store_le64(std::byte* out, std::uint64_t v, std::size_t n) {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(out, &v, n);
  } else {
    for (std::size_t k = 0; k < n; ++k) out[k] = std::byte(v >> (8 * k));
  }
}

std::uint64_t load64(const std::byte* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// The decode work: a serial multiply-xor chain over the sample's words. Each
// step depends on the previous one, so it cannot be vectorised away and its
// cost per iteration is stable; that is what decode_iters_per_us measures.
std::uint64_t decode_mix(const std::byte* p, std::size_t words, std::int64_t iters,
                         std::uint64_t h, std::size_t& j) {
  for (std::int64_t i = 0; i < iters; ++i) {
    h = (h ^ load64(p + 8 * j)) * 0x100000001b3ULL;
    h ^= h >> 29;
    if (++j == words) j = 0;
  }
  return h;
}

std::atomic<std::uint64_t> g_sink{0};  // keeps the calibration loop's result alive

std::string seconds_text(std::chrono::milliseconds ms) {
  return ms.count() % 100 == 0 ? fmt::format("{:.1f} s", double(ms.count()) / 1000.0)
                               : fmt::format("{:.3f} s", double(ms.count()) / 1000.0);
}

Config validated(Config c) {
  auto bad = [](const std::string& m) { throw UsageError("loader: " + m); };
  if (c.workers < 0 || c.workers > 1024) bad(fmt::format("workers must be 0..1024, got {}", c.workers));
  if (c.prefetch < 1) bad(fmt::format("prefetch must be >= 1, got {}", c.prefetch));
  if (std::int64_t(c.workers) * c.prefetch > (1 << 20))
    bad(fmt::format("workers x prefetch must be at most {}, got {} x {}", 1 << 20, c.workers, c.prefetch));
  if (c.batch < 1) bad(fmt::format("batch must be >= 1, got {}", c.batch));
  // Bytes 0..7 carry the index and 8..15 the decode result.
  if (c.sample_bytes < 16) bad(fmt::format("sample_bytes must be >= 16, got {}", c.sample_bytes));
  if (c.sample_bytes > std::numeric_limits<std::size_t>::max() / std::size_t(c.batch))
    bad("batch * sample_bytes overflows");
  if (!(c.decode_us >= 0)) bad(fmt::format("decode_us must be >= 0, got {}", c.decode_us));
  if (!(c.decode_spread >= 0 && c.decode_spread <= 1))
    bad(fmt::format("decode_spread must be in 0..1, got {}", c.decode_spread));
  if (c.num_batches < 0 || c.num_batches > std::numeric_limits<std::int64_t>::max() / c.batch)
    bad(fmt::format("num_batches must be >= 0 and num_batches * batch fit in int64, got {}",
                    c.num_batches));
  if (c.timeout.count() <= 0) bad(fmt::format("timeout must be > 0 ms, got {}", c.timeout.count()));
  if (c.source == Source::file && c.file_path.empty())
    bad("source=file needs file_path (a dataset file made by write_dataset_file)");
  if (c.fault.kind != Fault::Kind::none && c.fault.sample < 0)
    bad(fmt::format("fault sample must be >= 0, got {}", c.fault.sample));
  return c;
}

}  // namespace

// ---- free functions -------------------------------------------------------

int effective_workers(int workers, int loader_cpus) {
  const int w = std::max(1, workers);
  return loader_cpus > 0 ? std::min(w, loader_cpus) : w;
}

double predicted_busy(int workers, double train_s, double load_s, int loader_cpus) {
  return std::min(1.0, double(effective_workers(workers, loader_cpus)) * train_s / std::max(load_s, 1e-12));
}

const char* bottleneck(int workers, double train_s, double load_s, int loader_cpus) {
  return load_s / double(effective_workers(workers, loader_cpus)) > train_s ? "loader" : "device";
}

double thread_cpu_s() {
  timespec ts{};
  if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}


Fault parse_fault(const std::string& text) {
  if (text == "none") return {};
  const auto fail = [&] {
    return UsageError(fmt::format("bad fault '{}': expected none, hang@N or throw@N "
                                  "(N = global sample index >= 0)", text));
  };
  const auto at = text.find('@');
  if (at == std::string::npos) throw fail();
  const std::string kind = text.substr(0, at);
  Fault f;
  if (kind == "hang") f.kind = Fault::Kind::hang;
  else if (kind == "throw") f.kind = Fault::Kind::fail;
  else throw fail();
  // the whole field, no sign or space: "hang@-1" and "hang@ 3" fail here
  const std::string_view digits = std::string_view(text).substr(at + 1);
  const auto n = digits.empty() || digits.front() == '-' ? std::nullopt : text::parse_whole<decltype(f.sample)>(digits);
  if (!n) throw fail();
  f.sample = *n;
  return f;
}

std::string to_string(const Fault& f) {
  switch (f.kind) {
    case Fault::Kind::none: return "none";
    case Fault::Kind::hang: return fmt::format("hang@{}", f.sample);
    case Fault::Kind::fail: return fmt::format("throw@{}", f.sample);
  }
  return "?";
}

void fill_sample(std::uint64_t seed, std::int64_t index, std::byte* out, std::size_t bytes) {
  const std::uint64_t base = splitmix64(seed ^ splitmix64(std::uint64_t(index)));
  for (std::size_t off = 0, j = 0; off < bytes; off += 8, ++j) {
    const std::uint64_t w = j == 0 ? std::uint64_t(index) : splitmix64(base + j);
    store_le64(out + off, w, std::min<std::size_t>(8, bytes - off));
  }
}

double decode_iters_per_us() {
  // A function-local static: initialised once, thread-safely; later callers
  // block until the first has measured. 30 ms to 1 s over a 4 KiB sample (in L1).
  static const double v = [] {
    std::vector<std::byte> buf(4096);
    fill_sample(1, 0, buf.data(), buf.size());
    constexpr std::int64_t chunk = 1 << 14;
    std::size_t j = 0;
    std::uint64_t h = 0;
    // The fastest of many short chunks: a chunk the scheduler interrupted
    // (another process on a 2-core machine) runs slow, never fast, so the
    // best rate is the CPU's own. An average would let a busy moment at
    // calibration shrink every later decode.
    //
    // The end is set by chunks, not only by wall time: a thread preempted for
    // the whole window (a loaded 2-core machine) once measured a handful of
    // interrupted chunks, and every later decode ran 7.6x faster than asked
    // (CI: sim dataloader at supply 0.6 loaded in 8.7 ms, not 66). A CPU whose
    // clock is still rising from idle (nothing ran before it on sim) keeps
    // improving the best, so the loop runs until the best has held for 256
    // chunks, at least 30 ms and 512 chunks, at most 1 s.
    double best = 0;
    std::int64_t chunks = 0, since_better = 0;
    const auto t0 = Clock::now();
    Clock::time_point t1 = t0;
    for (;;) {
      const auto c0 = Clock::now();
      h = decode_mix(buf.data(), buf.size() / 8, chunk, h, j);
      t1 = Clock::now();
      ++chunks;
      ++since_better;
      const double us = std::chrono::duration<double, std::micro>(t1 - c0).count();
      if (us > 0 && double(chunk) / us > best) {
        // Within 1%: the same rate measured again, not a faster one.
        if (double(chunk) / us > 1.01 * best) since_better = 0;
        best = double(chunk) / us;
      }
      const auto spent = t1 - t0;
      if (spent >= std::chrono::seconds(1)) break;
      if (spent >= std::chrono::milliseconds(30) && chunks >= 512 && since_better >= 256) break;
    }
    g_sink.store(h, std::memory_order_relaxed);
    return best;
  }();
  return v;
}

double sample_decode_us(double decode_us, double spread, std::uint64_t seed, std::int64_t sample) {
  if (spread == 0) return decode_us;
  // A fixed salt keeps the cost independent of the sample's content stream.
  const double u = uniform_pm1(seed ^ 0x6465636f6465ULL, std::uint64_t(sample));
  return std::max(0.0, decode_us * (1.0 + spread * u));
}

// ---- Loader ---------------------------------------------------------------

Loader::Loader(Config cfg) : cfg_(validated(std::move(cfg))) {
  try {
    // Inline, one: the batch being loaded is the one handed over.
    const int n_slots = cfg_.workers > 0 ? cfg_.workers * cfg_.prefetch + 1 : 1;
    slot_bytes_ = std::size_t(cfg_.batch) * cfg_.sample_bytes;

    if (cfg_.source == Source::file) {
      std::string why;
      const auto hdr = check_dataset_file(cfg_.file_path, 0, &why);
      if (!hdr)
        throw UsageError(fmt::format("loader: {} is not a usable dataset file: {} (make it with write_dataset_file)",
                                     cfg_.file_path, why));
      if (hdr->sample_bytes != cfg_.sample_bytes || std::uintmax_t(hdr->n_samples) <
                                                        std::uintmax_t(cfg_.num_batches) * std::uintmax_t(cfg_.batch))
        throw UsageError(fmt::format(
            "loader: dataset file {} holds {} samples of {} bytes; {} batches of {} samples of {} bytes need {} "
            "samples of {} bytes (make it with write_dataset_file)", cfg_.file_path, hdr->n_samples,
            hdr->sample_bytes, cfg_.num_batches, cfg_.batch, cfg_.sample_bytes, cfg_.num_batches * cfg_.batch,
            cfg_.sample_bytes));
      fd_ = ::open(cfg_.file_path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd_ < 0)
        throw UsageError(fmt::format("loader: cannot open dataset file {}: {}", cfg_.file_path,
                                     std::strerror(errno)));
      const std::size_t need = kDatasetHeaderBytes + std::size_t(cfg_.num_batches) * slot_bytes_;
      if (cfg_.read == ReadMode::mmap && cfg_.num_batches > 0) {
        void* m = ::mmap(nullptr, need, PROT_READ, MAP_PRIVATE, fd_, 0);
        if (m == MAP_FAILED)
          throw Error(ErrorKind::runtime, fmt::format("loader: mmap {}: {}", cfg_.file_path, std::strerror(errno)));
        map_ = static_cast<const std::byte*>(m);
        map_bytes_ = need;
        install_mapping_fault_handler();
      }
    }
    // Calibrate before any worker runs, so the measurement has the CPU to itself.
    if (cfg_.decode_us > 0 || cfg_.sample_us) iters_per_us_ = decode_iters_per_us();

    // All slots at once first, so a configuration that cannot fit (64 workers
    // x prefetch 64 of large batches) is refused before any is allocated.
    const std::uint64_t all_slots = std::uint64_t(n_slots) * slot_bytes_;
    if (slot_bytes_ != 0 && all_slots / slot_bytes_ != std::uint64_t(n_slots))
      throw OutOfMemory(fmt::format("loader: {} slots of {} bytes overflow 64 bits", n_slots, slot_bytes_));
    check_host_memory(all_slots, fmt::format("loader: {} batch slots of {} ({} workers x prefetch {}, + 1 the "
                                             "consumer holds; batch {} x {})",
                                             n_slots, format_bytes(double(slot_bytes_)), cfg_.workers,
                                             cfg_.prefetch, cfg_.batch, format_bytes(double(cfg_.sample_bytes))));
    for (int i = 0; i < n_slots; ++i) {
      if (cfg_.alloc) {
        slots_.push_back(cfg_.alloc(slot_bytes_));
      } else {
        auto host = std::make_shared<HostReservation>(
            reserve_host_memory(slot_bytes_, fmt::format("loader: batch slot {} of {}", i + 1, n_slots)));
        slots_.emplace_back(new std::byte[slot_bytes_], slot_bytes_, MemKind::host_pageable,
                            [host](void* p) { delete[] static_cast<std::byte*>(p); });
      }
      if (!slots_.back().data() || slots_.back().bytes() < slot_bytes_)
        throw Error(ErrorKind::runtime, fmt::format("loader: alloc returned {} bytes for a {}-byte slot",
                                                    slots_.back().bytes(), slot_bytes_));
    }
    for (int i = n_slots - 1; i >= 0; --i) free_.push_back(i);
    held_.assign(std::size_t(n_slots), 0);
    delivered_.assign(std::size_t(cfg_.num_batches), 0);
    current_ = std::make_unique<std::atomic<std::int64_t>[]>(std::size_t(cfg_.workers) + 1);
    for (int i = 0; i <= cfg_.workers; ++i) current_[std::size_t(i)].store(-1);
    queue_.resize(std::size_t(cfg_.workers));
    tasks_.assign(std::size_t(cfg_.workers), 0);
    worker_of_.assign(std::size_t(cfg_.num_batches), -1);
    {
      std::lock_guard lk(mu_);
      for (int i = 0; i < cfg_.workers * cfg_.prefetch; ++i) dispatch();  // torch primes at iter()
    }

    for (int w = 0; w < cfg_.workers; ++w) threads_.emplace_back([this, w] { worker_loop(w); });
  } catch (...) {
    shutdown();  // the destructor does not run for a constructor that throws
    throw;
  }
}

Loader::~Loader() { shutdown(); }

void Loader::shutdown() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  stopping_.store(true);
  slot_cv_.notify_all();
  ready_cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  if (map_) ::munmap(const_cast<std::byte*>(map_), map_bytes_);
  map_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string Loader::who(int worker) const {
  return worker < 0 ? std::string("the main thread (workers=0)") : fmt::format("worker {}", worker);
}

double Loader::since_origin(Clock::time_point t) const {
  return std::chrono::duration<double>(t - cfg_.origin).count();
}

void Loader::read_sample(std::int64_t s, std::byte* dst) const {
  const std::size_t n = cfg_.sample_bytes;
  if (cfg_.source == Source::memory) {
    fill_sample(cfg_.seed, s, dst, n);
    return;
  }
  const std::size_t at = kDatasetHeaderBytes + std::size_t(s) * n;
  if (map_) {
    if (!copy_from_mapping(dst, map_ + at, n, map_, map_ + map_bytes_))
      throw DatasetFileError(fmt::format("reading sample {} of {} through its mapping raised SIGBUS at offset {}: "
                                         "the file was truncated or removed during the run",
                                         s, cfg_.file_path, at));
  } else {
    for (std::size_t got = 0; got < n;) {
      const ssize_t r = ::pread(fd_, dst + got, n - got, off_t(at + got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        throw DatasetFileError(fmt::format("pread {} at offset {}: {}", cfg_.file_path, at + got,
                                           r == 0 ? "unexpected end of file (truncated during the run?)"
                                                  : std::strerror(errno)));
      got += std::size_t(r);
    }
  }
  // Bytes 0..7 of every stored sample carry its index.
  std::uint64_t index = 0;
  for (int i = 0; i < 8; ++i) index |= std::uint64_t(std::to_integer<unsigned char>(dst[i])) << (8 * i);
  if (index != std::uint64_t(s))
    throw DatasetFileError(fmt::format("sample {} of {} (offset {}) holds index {}: the file changed or is corrupt",
                                       s, cfg_.file_path, at, index));
}

bool Loader::decode_sample(std::int64_t s, std::byte* p) const {
  const double us = cfg_.sample_us ? std::max(0.0, cfg_.sample_us(s))
                                   : sample_decode_us(cfg_.decode_us, cfg_.decode_spread, cfg_.seed, s);
  std::int64_t left = std::llround(us * iters_per_us_);
  std::uint64_t h = splitmix64(cfg_.seed ^ std::uint64_t(s));
  std::size_t j = 0;
  // In chunks, so a shutdown does not wait for a long decode to finish.
  constexpr std::int64_t chunk = 1 << 15;
  while (left > 0) {
    if (stopping_.load(std::memory_order_relaxed)) return false;
    const std::int64_t n = std::min(left, chunk);
    h = decode_mix(p, cfg_.sample_bytes / 8, n, h, j);
    left -= n;
  }
  store_le64(p + 8, h, 8);  // the result lands in the batch, so the work is observable
  return true;
}

Loader::Outcome Loader::load_batch(std::int64_t b, int worker, std::byte* dst, Done& out,
                                   std::optional<Clock::time_point> hang_deadline) {
  auto& cur = current_[std::size_t(worker < 0 ? cfg_.workers : worker)];
  struct Phase {  // on_load(true) now, on_load(false) on every way out
    const std::function<void(bool)>& f;
    explicit Phase(const std::function<void(bool)>& fn) : f(fn) {
      if (f) f(true);
    }
    ~Phase() {
      if (f) f(false);
    }
  } phase(cfg_.on_load);
  const std::int64_t first = b * cfg_.batch;
  std::size_t off = 0;
  for (std::int64_t s = first; s < first + cfg_.batch; ++s) {
    if (stopping_.load(std::memory_order_relaxed)) return Outcome::stopped;
    cur.store(s);
    try {
      if (cfg_.fault.kind == Fault::Kind::hang && s == cfg_.fault.sample) {
        // "Forever" is a wait only shutdown ends, so the destructor can join
        // this thread; inline, the caller's timeout bounds it instead.
        std::unique_lock lk(mu_);
        if (hang_deadline) {
          return slot_cv_.wait_until(lk, *hang_deadline, [&] { return stop_; }) ? Outcome::stopped
                                                                                : Outcome::timed_out;
        }
        slot_cv_.wait(lk, [&] { return stop_; });
        return Outcome::stopped;
      }
      if (cfg_.fault.kind == Fault::Kind::fail && s == cfg_.fault.sample)
        throw std::runtime_error(fmt::format("injected corrupt sample (fault={})", to_string(cfg_.fault)));
      read_sample(s, dst + off);
      if ((cfg_.decode_us > 0 || cfg_.sample_us) && !decode_sample(s, dst + off)) return Outcome::stopped;
    } catch (const std::exception& e) {
      // A fault of the file itself is never one sample to skip.
      if (cfg_.on_error == OnError::skip && !dynamic_cast<const DatasetFileError*>(&e)) {
        skipped_.fetch_add(1);
        continue;  // left out; later samples pack down into its place
      }
      // PyTorch fails the whole batch; the consumer sees it when it is due.
      out.error = fmt::format("sample {} on {} failed: {}", s, who(worker), e.what());
      break;
    }
    out.samples.push_back(s);
    off += cfg_.sample_bytes;
  }
  cur.store(-1);
  return Outcome::done;
}

void Loader::worker_loop(int w) {
  pin_this_thread(cfg_.cpus);
  auto& queue = queue_[std::size_t(w)];
  for (;;) {
    std::int64_t b = -1;
    int slot = -1;
    {
      // No deadline: only a dispatch, a release or shutdown moves a worker on.
      std::unique_lock lk(mu_);
      slot_cv_.wait(lk, [&] { return stop_ || (!queue.empty() && !free_.empty()); });
      if (stop_) return;
      b = queue.front();
      queue.pop_front();
      slot = free_.back();
      free_.pop_back();
    }
    Done d;
    d.slot = slot;
    d.worker = w;
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_s();
    if (load_batch(b, w, static_cast<std::byte*>(slots_[std::size_t(slot)].data()), d, std::nullopt) !=
        Outcome::done)
      return;  // shutdown
    const auto t1 = Clock::now();
    {
      std::lock_guard lk(mu_);
      records_.push_back({w, b, since_origin(t0), since_origin(t1), thread_cpu_s() - c0});
      ready_.emplace(b, std::move(d));
      if (!cfg_.in_order) finish_order_.push_back(b);
      ++arrivals_;
    }
    ready_cv_.notify_all();
  }
}

void Loader::dispatch() {
  if (send_ >= cfg_.num_batches) return;
  const int n = cfg_.workers;
  for (int k = 0; k < n; ++k) {
    const int w = cycle_;
    cycle_ = (cycle_ + 1) % n;
    // torch passes a worker by (in_order=false) when _workers_num_tasks[w] >=
    // max_tasks // active workers, which is prefetch here: every worker of a
    // map-style dataset stays active. Fewer than prefetch * workers batches
    // are out whenever this runs, so some worker has room; were none to,
    // torch would lose the index it drew, and this keeps it for the next call.
    if (cfg_.in_order || tasks_[std::size_t(w)] < cfg_.prefetch) {
      queue_[std::size_t(w)].push_back(send_);
      worker_of_[std::size_t(send_)] = w;
      ++tasks_[std::size_t(w)];
      dispatches_.push_back({send_, w, n_delivered_});
      ++send_;
      slot_cv_.notify_all();
      return;
    }
  }
}

Batch Loader::take(std::int64_t index, Done&& d) {
  delivered_[std::size_t(index)] = 1;
  ++n_delivered_;
  if (cfg_.workers > 0) {
    // Handing a batch over (or raising for it) dispatches the next, as torch's
    // _process_data does before it returns or re-raises.
    --tasks_[std::size_t(d.worker)];
    dispatch();
  }
  if (!d.error.empty()) {
    // The failed batch is consumed: its slot goes back and the next call
    // moves on to the following batch.
    if (cfg_.workers > 0) {
      free_.push_back(d.slot);
      slot_cv_.notify_all();
    }
    throw SampleError(d.error);
  }
  held_[std::size_t(d.slot)] = 1;
  Batch out;
  out.index = index;
  out.data = static_cast<const std::byte*>(slots_[std::size_t(d.slot)].data());
  out.bytes = d.samples.size() * cfg_.sample_bytes;
  out.samples = std::move(d.samples);
  out.worker = d.worker;
  out.slot = d.slot;
  return out;
}

std::string Loader::timeout_message(std::int64_t b) {
  const int w = worker_of_[std::size_t(b)];
  const std::int64_t first = b * cfg_.batch;
  std::string state;
  if (w < 0) {
    state = "it has not been dispatched";  // not reached: the due batch is always out
  } else if (const std::int64_t s = current_[std::size_t(w)].load(); s >= 0) {
    state = fmt::format("worker {} is stuck on sample {}", w, s);
  } else if (!queue_[std::size_t(w)].empty() && free_.empty()) {
    state = fmt::format("worker {} is waiting for a free slot: {} of the {} batches in the slots were handed "
                        "over and not release()d", w, std::count(held_.begin(), held_.end(), 1), held_.size());
  } else {
    state = fmt::format("worker {} has not started it", w);
  }
  return fmt::format("loader timeout: batch {} (samples {}..{}) did not arrive: no batch arrived within {}; {}", b,
                     first, first + cfg_.batch - 1, seconds_text(cfg_.timeout), state);
}

std::optional<Batch> Loader::next() {
  if (cfg_.workers == 0) return next_inline();
  std::unique_lock lk(mu_);
  if (n_delivered_ >= cfg_.num_batches) return std::nullopt;
  auto deadline = Clock::now() + cfg_.timeout;
  if (cfg_.in_order) {
    const std::int64_t b = next_index_;
    // torch's timeout bounds each wait for any batch: one that arrives out of
    // order is kept and the wait starts again.
    for (std::uint64_t seen = arrivals_; ready_.count(b) == 0; seen = arrivals_) {
      if (!ready_cv_.wait_until(lk, deadline, [&] { return ready_.count(b) > 0 || arrivals_ != seen; }))
        throw LoaderTimeout(timeout_message(b));
      deadline = Clock::now() + cfg_.timeout;
    }
    auto node = ready_.extract(b);
    ++next_index_;
    return take(b, std::move(node.mapped()));
  }
  if (!ready_cv_.wait_until(lk, deadline, [&] { return !finish_order_.empty(); })) {
    // Nothing finished: name the oldest batch still missing.
    std::int64_t b = 0;
    while (delivered_[std::size_t(b)]) ++b;
    throw LoaderTimeout(timeout_message(b));
  }
  const std::int64_t b = finish_order_.front();
  finish_order_.pop_front();
  auto node = ready_.extract(b);
  return take(b, std::move(node.mapped()));
}

std::optional<Batch> Loader::next_inline() {
  const std::int64_t b = next_index_;  // only the consumer's thread touches it inline
  {
    std::lock_guard lk(mu_);
    if (b >= cfg_.num_batches) return std::nullopt;
    if (held_[0])
      throw UsageError("loader: with workers=0 there is one staging slot; release() the previous "
                       "batch before calling next()");
  }
  Done d;
  d.slot = 0;
  d.worker = -1;
  const auto t0 = Clock::now();
  const double c0 = thread_cpu_s();
  const Outcome o = load_batch(b, -1, static_cast<std::byte*>(slots_[0].data()), d, t0 + cfg_.timeout);
  const auto t1 = Clock::now();
  auto& cur = current_[std::size_t(cfg_.workers)];
  if (o == Outcome::timed_out) {
    const std::int64_t first = b * cfg_.batch;
    const std::string msg = fmt::format(
        "loader timeout: batch {} (samples {}..{}) did not arrive within {}; {} is stuck on sample {}", b,
        first, first + cfg_.batch - 1, seconds_text(cfg_.timeout), who(-1), cur.load());
    cur.store(-1);
    throw LoaderTimeout(msg);  // not consumed: calling again retries it
  }
  if (o == Outcome::stopped) return std::nullopt;  // only during shutdown
  std::lock_guard lk(mu_);
  records_.push_back({-1, b, since_origin(t0), since_origin(t1), thread_cpu_s() - c0});
  ++next_index_;
  return take(b, std::move(d));
}

void Loader::release(const Batch& b) {
  {
    std::lock_guard lk(mu_);
    if (b.slot < 0 || std::size_t(b.slot) >= held_.size() || !held_[std::size_t(b.slot)])
      throw UsageError(fmt::format("loader: release of batch {} (slot {}) that is not held: released twice "
                                   "or not from this loader", b.index, b.slot));
    held_[std::size_t(b.slot)] = 0;
    if (cfg_.workers > 0) free_.push_back(b.slot);
  }
  slot_cv_.notify_all();
}

std::vector<LoadRecord> Loader::records() const {
  std::lock_guard lk(mu_);
  return records_;
}

std::vector<Dispatch> Loader::dispatches() const {
  std::lock_guard lk(mu_);
  return dispatches_;
}

int Loader::skipped() const { return skipped_.load(); }

}  // namespace sb::loader
