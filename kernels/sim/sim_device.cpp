// The `sim:<gpu>` device: a simulated accelerator. Each operation's time comes
// from the roofline model of an expected file (kernels/sim/sim_model.hpp) and
// is spent as a timed wait on a ComputeStream thread, so it costs no CPU and
// the stream's busy time is the modelled device time. Nothing is computed and
// no byte is copied; host and device memory are real host memory all the same,
// so callers can write to it, and device memory is capped at the modelled
// GPU's capacity.
#include "kernels/sim/sim_backend.hpp"

#include <sys/prctl.h>  // prctl(PR_SET_TIMERSLACK): precise timed waits on the stream thread

#include <algorithm>           // std::max, std::fill
#include <atomic>              // std::atomic
#include <chrono>              // std::chrono
#include <condition_variable>  // std::condition_variable
#include <cstdint>             // std::uint64_t
#include <cstdlib>             // std::aligned_alloc, std::free
#include <memory>              // std::make_shared, std::shared_ptr
#include <mutex>               // std::mutex
#include <string>              // std::string
#include <cstdio>              // std::fprintf
#include <thread>              // std::this_thread::sleep_until
#include <type_traits>         // std::is_same_v
#include <vector>              // std::vector

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"                     // OutOfMemory, UnsupportedError, UsageError
#include "harness/expected.hpp"                   // load_expected_files
#include "harness/gemm_check.hpp"                 // gpu_gemm_shape_problem
#include "harness/host_memory.hpp"              // reserve_host_memory: simulated buffers are host memory
#include "harness/memory_ledger.hpp"            // MemoryLedger: the modelled device's memory
#include "harness/units.hpp"                    // format_bytes
#include "kernels/cpu/detail/compute_stream.hpp"  // ComputeStream
#include "kernels/cpu/detail/stream_device.hpp"   // StreamEvent, stream_elapsed_ms, StreamBusyProbe
#include "harness/train_ops.hpp"                 // TrainOps: modelled, nothing computed
#include "kernels/sim/sim_model.hpp"              // SimModel, sim_gemm_time, sim_h2d_seconds

namespace sb {
namespace {

using std::chrono::steady_clock;

// A pageable copy returns to the host only once the stream has run it (as a
// CUDA pageable cudaMemcpyAsync does once staged); bound that wait, since the
// interface gives copy_h2d no timeout.
constexpr std::chrono::minutes kHostBlockTimeout{5};

// A timed wait on a VM wakes some 40-90 us late, so a stream that waited out
// every 5 us launch would run ~10x slower than the model. The stream thread
// therefore waits only once it is more than this far ahead of the modelled
// clock; host-side waits (synchronize, wait_event, a pageable copy) still
// end no earlier than the modelled time, since they wait out the rest.
constexpr std::chrono::microseconds kMinStreamWait{100};

// Modelled time is not wall time: an operation modelled longer than this is waited out for this long only,
// and the modelled clock runs ahead of the wall clock by the rest (the offset). Events, elapsed_ms and
// --trace keep the modelled durations; host waits wait for the modelled end less the offset. An attention
// point at a huge sequence (minutes modelled) then takes a fraction of a second, not minutes; every figure
// is modelled either way, and the device says on stderr, once, that it fast-forwarded.
constexpr std::chrono::milliseconds kMaxRealWait{100};

std::vector<ExpectedFile> gpu_files() {
  std::vector<ExpectedFile> out;
  for (auto& f : load_expected_files())
    if (f.doc.value("/hardware/class"_json_pointer, std::string("gpu")) == "gpu") out.push_back(std::move(f));
  return out;
}

DeviceInfo sim_info(const SimModel& m) {
  DeviceInfo info;
  info.id = "sim:" + m.id;
  info.kind = DeviceKind::sim;
  info.name = "simulated " + m.name;
  info.simulated = true;
  info.props = sim_props(m);
  return info;
}

class SimDevice;

class SimGemm final : public GemmOp {
 public:
  SimGemm(SimDevice& dev, GemmShape s, DType t, SimGemmTime time, MemoryReservation r)
      : dev_(dev), shape_(s), dtype_(t), time_(time), reservation_(std::move(r)) {
    label_ = fmt::format("simulated gemm {} {}x{}x{}", to_string(t), s.m, s.n, s.k);
  }
  GemmShape shape() const override { return shape_; }
  DType dtype() const override { return dtype_; }
  DType c_dtype() const override { return gpu_gemm_c_dtype(dtype_); }
  std::string impl() const override {
    return fmt::format("simulated roofline: {}-bound, {:.1f} us", time_.compute_bound() ? "compute" : "memory",
                       time_.seconds() * 1e6);
  }
  void enqueue() override;
  void upload(std::span<const float> a, std::span<const float> w) override {
    check_size("upload: a", a.size(), shape_.m * shape_.k);
    check_size("upload: w", w.size(), shape_.n * shape_.k);
  }
  void download_c(std::span<float> c) override {
    check_size("download_c", c.size(), shape_.m * shape_.n);
    std::fill(c.begin(), c.end(), 0.0f);  // nothing was computed
  }
  bool computes() const override { return false; }

 private:
  void check_size(const char* what, std::size_t got, std::int64_t want) const {
    if (std::int64_t(got) != want)
      throw Error(ErrorKind::runtime, fmt::format("{}: {} has {} values, the {}x{}x{} GEMM needs {}", label_, what,
                                                  got, shape_.m, shape_.n, shape_.k, want));
  }
  SimDevice& dev_;  // outlives the op
  GemmShape shape_;
  DType dtype_;
  SimGemmTime time_;
  MemoryReservation reservation_;
  std::string label_;
};

class SimDevice final : public Device {
 public:
  explicit SimDevice(const ExpectedFile& file)
      : model_(make_sim_model(file)), info_(sim_info(model_)), ledger_(make_ledger(info_.id, model_)),
        cs_("sim:" + model_.id) {
    // Linux lets a timed wait end up to 50 us late by default (timer slack);
    // 1 ns keeps a modelled 5 us launch near 5 us. Per thread, so set it on
    // the stream thread.
    cs_.enqueue("sim: set timer slack", [] { (void)::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL); });
  }

  ~SimDevice() override {
    if (followed_) followed_->follow_offset(nullptr);
    // Waits still queued are cut short: the stream drains at once.
    {
      std::lock_guard lk(mu_);
      closing_ = true;
    }
    cv_.notify_all();
  }

  const DeviceInfo& info() const override { return info_; }

  std::optional<std::string> gemm_unsupported(DType t) const override { return sim_gemm_unsupported(model_, t); }

  std::unique_ptr<GemmOp> make_gemm(GemmShape s, DType t, std::uint64_t /*seed: nothing is filled*/) override {
    if (s.m <= 0 || s.n <= 0 || s.k <= 0)
      throw Error(ErrorKind::runtime,
                  fmt::format("{}: GEMM shape M={} N={} K={} is not positive", info_.id, s.m, s.n, s.k));
    // The GPU it stands for refuses what cuBLASLt refuses (fp8 alignment).
    if (auto why = gpu_gemm_shape_problem(t, s)) throw UnsupportedError(info_.id + ": " + *why);
    const SimGemmTime time = sim_gemm_time(model_, s, t);  // UnsupportedError with the reason
    // The operands a GPU of this size would hold (A, W, C); none is allocated here.
    MemoryReservation r = ledger_->reserve(std::uint64_t(time.bytes),
                                           fmt::format("the operands of a {}x{}x{} {} GEMM", s.m, s.n, s.k, to_string(t)));
    return std::make_unique<SimGemm>(*this, s, t, time, std::move(r));
  }

  std::unique_ptr<TrainOps> make_train_ops() override;
  std::optional<std::string> attention_unsupported(AttnImpl, DType t) const override {
    return sim_gemm_unsupported(model_, t);
  }
  std::unique_ptr<AttentionOp> make_attention(const AttnShape& s, AttnImpl impl, DType t, std::uint64_t) override;
  const SimModel& model() const { return model_; }
  MemoryLedger& ledger() { return *ledger_; }

  MemoryStats memory_stats() const override {
    return ledger_->stats("simulated: what the modelled device would hold (nothing is allocated for ops)");
  }
  void reset_peak_memory() override { ledger_->reset_peak(); }
  void set_trace(KinetoTrace* t) override {
    trace_.attach(t, cs_, *ledger_, info_, "a simulated device (sim:): every GPU event lasts its modelled time; nothing was measured on a GPU");
    // host events on the modelled clock too, once it runs ahead of the wall clock (the fast-forward)
    if (followed_) followed_->follow_offset(nullptr);
    followed_ = t;
    if (t) t->follow_offset(&offset_);
  }
  void range_push(const char* name) override { trace_.push(name); }
  void range_pop() override { trace_.pop(); }
  void set_memory_limit(std::size_t bytes) override { ledger_->set_limit(bytes); }

  Buffer allocate(std::size_t bytes, MemKind kind) override {
    auto r = kind == MemKind::device ? std::make_shared<MemoryReservation>(ledger_->reserve(bytes, "a device allocation"))
                                     : std::shared_ptr<MemoryReservation>();
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    // Simulated device buffers are real host memory too.
    auto host = std::make_shared<HostReservation>(reserve_host_memory(
        rounded, fmt::format("{}: a simulated {} buffer", info_.id, kind == MemKind::device ? "device" : "host")));
    void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
    if (!p && rounded)
      throw OutOfMemory(fmt::format("{}: out of host memory: {} bytes ({}) for a simulated {} buffer", info_.id,
                                    bytes, format_bytes(double(bytes)),
                                    kind == MemKind::device ? "device" : "host"));
    return Buffer(p, bytes, kind, [r, host](void* q) { std::free(q); });  // r and host released with the buffer
  }

  void copy_h2d(Buffer& dst, const Buffer& src, std::size_t bytes) override {
    if (dst.kind() != MemKind::device || src.kind() == MemKind::device)
      throw Error(ErrorKind::runtime,
                  fmt::format("{}: copy_h2d needs a host source and a device destination", info_.id));
    if (bytes > dst.bytes() || bytes > src.bytes())
      throw Error(ErrorKind::runtime, fmt::format("{}: copy_h2d of {} bytes exceeds a buffer (src {}, dst {})",
                                                  info_.id, bytes, src.bytes(), dst.bytes()));
    const bool pinned = src.kind() == MemKind::host_pinned;
    spend(fmt::format("simulated h2d copy ({}, {} bytes)", pinned ? "pinned" : "pageable", bytes),
          sim_h2d_seconds(model_, bytes, src.kind()));
    // From pageable memory CUDA stages through a pinned bounce buffer and the
    // call returns only once staged: the host-blocking copy that pinned
    // memory avoids. The model blocks the caller until the copy has run.
    if (!pinned) {
      const EventPtr staged = record();
      wait_event(staged, kHostBlockTimeout);
    }
  }

  // timing=hidden: the gate waits in real time and advances no modelled
  // clock. timing=cold: the roofline has no cache, so flush_cache stays the
  // default (nothing written, 0 bytes recorded).
  std::unique_ptr<StreamGate> hold_stream(std::chrono::milliseconds deadline) override {
    return std::make_unique<cpu::StreamHold>(cs_, deadline);
  }

  EventPtr record() override {
    // Stamped with the modelled clock, not the thread's wake-up time, so
    // elapsed_ms is the modelled time and host scheduling noise stays out.
    auto e = std::make_shared<cpu::StreamEvent>();
    const auto submitted = steady_clock::now();
    e->seq = cs_.enqueue("event", [this, e, submitted] {
      advance(submitted, steady_clock::duration::zero());
      e->t = clock_;
    });
    return e;
  }
  double elapsed_ms(const EventPtr& a, const EventPtr& b) override { return cpu::stream_elapsed_ms(a, b); }
  // A host wait has its deadline in modelled time too: an operation modelled longer than the deadline
  // would not end within it on the device, so the wait is a hang (HangError, naming the operation), though
  // the fast-forward ended it in real time. The watchdog scenario (an 8 s modelled GEMM, --timeout 3) is one.
  void synchronize(std::chrono::milliseconds timeout) override {
    const auto called = modelled_now();
    cs_.synchronize(timeout);
    const auto end = steady_clock::time_point(steady_clock::duration(modelled_end_.load()));
    check_modelled_deadline(called, end, timeout);
    std::this_thread::sleep_until(end - steady_clock::duration(offset_.load()));
  }
  void wait_event(const EventPtr& e, std::chrono::milliseconds timeout) override {
    const auto called = modelled_now();
    const cpu::StreamEvent& se = cpu::as_stream_event(e);
    cs_.wait_done(se.seq, timeout);
    check_modelled_deadline(called, se.t, timeout);
    std::this_thread::sleep_until(se.t - steady_clock::duration(offset_.load()));
  }
  // The stream thread's busy fraction: time inside modelled operations.
  // The modelled busy time over real time: the stream thread skips waits
  // shorter than kMinStreamWait, so its own busy time would miss every
  // short op (5 us launches); the model's account does not.
  std::unique_ptr<UtilProbe> utilization_probe() override {
    class Probe final : public UtilProbe {
     public:
      explicit Probe(const std::atomic<std::int64_t>& busy) : busy_(busy), last_(busy.load()), t_(steady_clock::now()) {}
      UtilSample sample() override {
        const std::int64_t b = busy_.load();
        const auto t = steady_clock::now();
        const double dt = std::chrono::duration<double>(t - t_).count();
        UtilSample s;
        s.util = dt > 0 ? std::clamp(double(b - last_) * 1e-9 / dt, 0.0, 1.0) : 0.0;
        last_ = b;
        t_ = t;
        return s;
      }
      std::string source() const override { return "simulated: modelled busy time of the stream"; }
      std::chrono::milliseconds period() const override { return std::chrono::milliseconds(10); }

     private:
      const std::atomic<std::int64_t>& busy_;
      std::int64_t last_;
      steady_clock::time_point t_;
    };
    return std::make_unique<Probe>(modelled_busy_ns_);
  }

  // Enqueues `seconds` of modelled device time. An operation starts when it
  // was submitted or when the one before it ended in the model, whichever is
  // later (a GPU stream's semantics), and the thread waits until its modelled
  // end. Late wake-ups do not accumulate: the next operation's end is computed
  // from the modelled clock, not from when the thread woke.
  void spend(std::string label, double seconds) {
    const auto submitted = steady_clock::now();
    const auto dur = std::chrono::duration_cast<steady_clock::duration>(std::chrono::duration<double>(seconds));
    std::string what = dur > kMaxRealWait ? label : std::string();
    cs_.enqueue(std::move(label), [this, submitted, dur, what = std::move(what)] {
      advance(submitted, dur);
      cpu::stream_interval(clock_ - dur, clock_);  // --trace: the modelled interval
      // Host waits see the fast-forward once the operation's real wait is over (committed_): until then a
      // host's modelled clock runs at wall speed from the operation's start, so a wait on it is judged
      // against its modelled length.
      struct Commit {
        SimDevice* d;
        ~Commit() { d->committed_.store(d->offset_.load()); }
      } commit{this};
      if (dur > kMaxRealWait) {  // fast-forward: wait kMaxRealWait of it, the clock runs ahead by the rest
        {
          std::lock_guard lk(mu_);
          long_label_ = what;
        }
        offset_.fetch_add((dur - kMaxRealWait).count());
        if (!told_) {
          told_ = true;
          std::fprintf(stderr, "%s: a modelled operation of %.1f s was not waited out in real time (sim: modelled "
                               "time runs ahead of the wall clock; every figure is modelled)\n",
                       info_.id.c_str(), std::chrono::duration<double>(dur).count());
        }
      }
      const auto real_end = clock_ - steady_clock::duration(offset_.load());
      if (real_end - steady_clock::now() < kMinStreamWait) return;
      std::unique_lock lk(mu_);
      cv_.wait_until(lk, real_end, [this] { return closing_; });  // a timed wait: no CPU
    });
  }

 private:
  // The host's clock on the modelled one: the wall clock plus what the fast-forwards that ended skipped.
  steady_clock::time_point modelled_now() const {
    return steady_clock::now() + steady_clock::duration(committed_.load());
  }
  void check_modelled_deadline(steady_clock::time_point called, steady_clock::time_point end,
                               std::chrono::milliseconds timeout) {
    if (end - called <= timeout) return;
    std::string what;
    {
      std::lock_guard lk(mu_);
      what = long_label_.empty() ? "a modelled operation" : long_label_;
    }
    throw HangError(fmt::format("{}: stream made no progress within {:.1f} s of modelled time; running: {} "
                                "(the wait would end {:.1f} s after it began; sim: modelled)",
                                info_.id, double(timeout.count()) / 1e3, what,
                                std::chrono::duration<double>(end - called).count()));
  }

  // Stream thread only: the modelled clock moves to the end of an operation
  // submitted at `submitted` that lasts `dur`; published for host waits.
  void advance(steady_clock::time_point submitted, steady_clock::duration dur) {
    // submitted on the wall clock: on the modelled one it is that plus what was fast-forwarded so far
    clock_ = std::max(clock_, submitted + steady_clock::duration(offset_.load())) + dur;
    modelled_end_.store(clock_.time_since_epoch().count());
    modelled_busy_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(dur).count());
  }

  // The account of what the modelled GPU would hold: its capacity is the
  // datasheet's (GB = 1e9 bytes); set_memory_limit makes it smaller.
  static std::shared_ptr<MemoryLedger> make_ledger(const std::string& id, const SimModel& m) {
    if (!m.memory_capacity_gb) return std::make_shared<MemoryLedger>(id);
    return std::make_shared<MemoryLedger>(
        id, std::uint64_t(m.memory_capacity_gb->value * 1e9),
        fmt::format("the simulated {}'s memory ({} GB, peaks.memory_capacity in {})", m.name,
                    m.memory_capacity_gb->value, m.path));
  }

  SimModel model_;
  DeviceInfo info_;
  std::shared_ptr<MemoryLedger> ledger_;
  steady_clock::time_point clock_{};  // modelled end of the last operation; stream thread only
  std::atomic<steady_clock::rep> modelled_end_{0};  // clock_, for host threads
  std::atomic<std::int64_t> modelled_busy_ns_{0};  // sum of modelled op durations
  // modelled time not waited out (kMaxRealWait), steady_clock ns; the stream thread writes it
  std::atomic<std::int64_t> offset_{0};
  std::atomic<std::int64_t> committed_{0};  // offset_ as of the last operation whose real wait ended
  std::string long_label_;                  // the last fast-forwarded operation's label; under mu_
  static_assert(std::is_same_v<steady_clock::duration, std::chrono::nanoseconds>, "offset_ counts steady_clock ns");
  KinetoTrace* followed_ = nullptr;  // the trace whose host events follow offset_ (released in the destructor)
  bool told_ = false;                         // the fast-forward said on stderr; stream thread only
  std::mutex mu_;
  std::condition_variable cv_;
  bool closing_ = false;
  cpu::StreamTrace trace_;
  cpu::ComputeStream cs_;  // last: its thread stops before the members it uses go
};

void SimGemm::enqueue() { dev_.spend(label_, time_.seconds()); }

// Seconds to move `bytes` through memory, and the launch overhead every op
// adds (the model's assumption).
double bytes_seconds(const SimModel& m, double bytes) {
  return bytes / (m.memory_bandwidth_gbs ? m.memory_bandwidth_gbs->value * 1e9 : 1e12);
}
double launch_seconds(const SimModel& m) { return m.launch_overhead_us.value * 1e-6; }
double memory_op_seconds(const SimModel& m, double bytes) { return bytes_seconds(m, bytes) + launch_seconds(m); }

// A CUDA graph's replay cost per node: ~0.9 us (REFERENCE.md: 80 small
// kernels, 260 us eager -> 70 us replayed, RTX 5070 Ti, CUDA 13): an
// assumption for every modelled GPU, in place of the launch overhead.
constexpr double kSimGraphNodeUs = 0.9;

// Training ops on the roofline: each op spends its modelled time, nothing is
// computed, and tensors are reservations in the modelled device's memory
// only (no host memory behind them).
class SimTrainOps final : public TrainOps {
 public:
  explicit SimTrainOps(SimDevice& dev) : dev_(dev), m_(dev.model()) {}
  std::string impl() const override {
    return fmt::format("simulated roofline: GEMMs max(FLOPs/peak, bytes/bandwidth), elementwise bytes/bandwidth, "
                       "each + {} us launch (an assumption); graph replays {} us per node (an assumption)",
                       m_.launch_overhead_us.value, kSimGraphNodeUs);
  }
  bool computes() const override { return false; }
  std::string gemm_impl(DType t) const override { return fmt::format("simulated {} GEMM", to_string(t)); }

  DTensor alloc(std::int64_t numel, DType dtype, const std::string& what) override {
    DTensor t;
    t.dtype = dtype;
    t.numel = numel;
    auto r = std::make_shared<MemoryReservation>(dev_.ledger().reserve(t.bytes(), what));
    t.buf = Buffer(nullptr, t.bytes(), MemKind::device, [r](void*) {});
    return t;
  }
  void upload(DTensor& t, std::span<const float> host) override { size_ok(t, host.size()); }
  void download(const DTensor& t, std::span<float> host, std::int64_t timeout_ms) override {
    size_ok(t, host.size());
    dev_.synchronize(std::chrono::milliseconds(timeout_ms));
    std::fill(host.begin(), host.end(), 0.0f);  // nothing was computed
  }
  void gemm(bool, bool, std::int64_t m, std::int64_t n, std::int64_t k, float, const DTensor& a, const DTensor&, float,
            DTensor& c) override {
    const DType t = a.dtype;
    const double flops = 2.0 * double(m) * double(n) * double(k);
    const double bytes = double(m * k + n * k) * storage_bytes(t) + double(m * n) * storage_bytes(c.dtype);
    const auto peak = m_.peak_tflops.find(t);
    const double compute = peak == m_.peak_tflops.end() ? 0 : flops / (peak->second.value * 1e12);
    spend(fmt::format("simulated gemm {} {}x{}x{}", to_string(t), m, n, k),
          std::max(compute, bytes_seconds(m_, bytes)) + launch_seconds(m_));
  }
  void cast(const DTensor& src, DTensor& dst, std::int64_t n) override {
    mem("cast", double(n) * (storage_bytes(src.dtype) + storage_bytes(dst.dtype)));
  }
  void bias_act(DTensor& z, const DTensor*, Act, const DTensor* residual, DTensor& y, std::int64_t rows,
                std::int64_t cols) override {
    mem("bias_act", double(rows * cols) * (storage_bytes(z.dtype) * 2 + storage_bytes(y.dtype) +
                                           (residual ? storage_bytes(residual->dtype) : 0)));
  }
  void act_backward(const DTensor& dy, const DTensor& z, Act, DTensor& dz, std::int64_t n) override {
    mem("act_backward", double(n) * (storage_bytes(dy.dtype) + storage_bytes(z.dtype) + storage_bytes(dz.dtype)));
  }
  void bias_grad(const DTensor& dz, DTensor&, std::int64_t rows, std::int64_t cols) override {
    mem("bias_grad", double(rows * cols) * storage_bytes(dz.dtype));
  }
  void rmsnorm(const DTensor& x, DTensor& y, DTensor&, std::int64_t rows, std::int64_t cols, float) override {
    mem("rmsnorm", double(rows * cols) * (storage_bytes(x.dtype) + storage_bytes(y.dtype)));
  }
  void rmsnorm_backward(const DTensor& dy, const DTensor& y, const DTensor&, DTensor& dx, std::int64_t rows,
                        std::int64_t cols) override {
    mem("rmsnorm_backward",
        double(rows * cols) * (storage_bytes(dy.dtype) + storage_bytes(y.dtype) + storage_bytes(dx.dtype)));
  }
  void mse_loss(const DTensor& y, const DTensor&, DTensor&, DTensor& dy, std::int64_t n, float) override {
    mem("mse_loss", double(n) * (storage_bytes(y.dtype) + 4 + storage_bytes(dy.dtype)));
  }
  void xent_loss(const DTensor& logits, const DTensor&, DTensor&, DTensor& d, std::int64_t rows, std::int64_t classes,
                 float) override {
    mem("xent_loss", double(rows * classes) * (storage_bytes(logits.dtype) + storage_bytes(d.dtype)));
  }
  void stats(const DTensor& t, std::int64_t n, DTensor&, std::int64_t) override {
    mem("stats", double(n) * storage_bytes(t.dtype));
  }
  void zero(DTensor& t) override { mem("zero", double(t.bytes())); }
  void poke(DTensor&, std::int64_t, float) override { mem("poke", 4); }
  void sgd(DTensor&, const DTensor& g, std::int64_t n, float, float, float) override {
    mem("sgd", double(n) * (8 + storage_bytes(g.dtype)));
  }
  void adamw(DTensor&, const DTensor& g, DTensor&, DTensor&, std::int64_t n, float, float, float, float, float, int,
             float) override {
    mem("adamw", double(n) * (4 * 2 + 4 * 2 + 4 * 2 + storage_bytes(g.dtype)));  // p, m, v read and written; g read
  }
  void begin_capture() override {
    capturing_ = true;
    captured_.clear();
  }
  std::unique_ptr<TrainGraph> end_capture() override;

  void spend(std::string label, double seconds) {
    if (capturing_) {
      captured_.push_back(seconds - launch_seconds(m_) + kSimGraphNodeUs * 1e-6);  // a node, not a launch
      return;
    }
    dev_.spend(std::move(label), seconds);
  }

 private:
  void mem(const char* what, double bytes) { spend(fmt::format("simulated {}", what), memory_op_seconds(m_, bytes)); }
  void size_ok(const DTensor& t, std::size_t n) const {
    if (std::int64_t(n) > t.numel)
      throw Error(ErrorKind::runtime, fmt::format("simulated training op: {} values for a tensor of {}", n, t.numel));
  }
  SimDevice& dev_;
  const SimModel& m_;
  bool capturing_ = false;
  std::vector<double> captured_;
};

class SimGraph final : public TrainGraph {
 public:
  SimGraph(SimDevice& dev, std::vector<double> node_s, double launch_s)
      : dev_(dev), nodes_(node_s.size()), seconds_(launch_s) {
    for (double x : node_s) seconds_ += x;
  }
  void replay() override { dev_.spend(fmt::format("simulated graph replay ({} nodes)", nodes_), seconds_); }
  std::size_t nodes() const override { return nodes_; }

 private:
  SimDevice& dev_;
  std::size_t nodes_;
  double seconds_;
};

std::unique_ptr<TrainGraph> SimTrainOps::end_capture() {
  capturing_ = false;
  return std::make_unique<SimGraph>(dev_, std::move(captured_), launch_seconds(m_));
}

std::unique_ptr<TrainOps> SimDevice::make_train_ops() { return std::make_unique<SimTrainOps>(*this); }

// Fused attention on the roofline: forward max(4*B*H*S^2*D (halved causal) /
// peak, Q K V O bytes / bandwidth) + launch; backward 2.5x the forward's
// FLOPs (3.5x in all, the convention of docs/DESIGN.md).
class SimAttention final : public AttentionOp {
 public:
  // Fused (flash, cudnn): one kernel each way, the S x S scores never leave the chip: the roofline of
  // its FLOPs (causal: half) and of Q, K, V, O (and their gradients) once. Eager (naive), as PyTorch
  // runs it without flash/sdp attention: every S x S tensor goes through memory in the compute dtype.
  // Forward: S = Q K^T written, the causal mask read and written, softmax read and written, P read by
  // P V: 6 passes over B H S^2, in 4 launches, the FLOPs of the full square. Backward: dP = dO V^T
  // written, P read for dV, the softmax backward reads P and dP and writes dS, dS read for dQ and dK:
  // 7 passes, 5 launches, twice the forward's FLOPs. Its S and P are held too.
  SimAttention(SimDevice& dev, const AttnShape& s, AttnImpl impl, DType t) : dev_(dev), s_(s), impl_(impl), t_(t) {
    const double e = storage_bytes(t);
    const double tokens = double(s.varlen() ? s.cu_seqlens.back() : s.batch * s.seq);
    const double io = 4.0 * double(s.heads) * tokens * double(s.head_dim) * e;
    const bool eager = impl != AttnImpl::flash && impl != AttnImpl::cudnn;
    double square = 0;  // B H S^2 elements (summed per sequence for varlen)
    if (!s.varlen())
      square = double(s.batch * s.heads) * double(s.seq) * double(s.seq);
    else
      for (std::size_t i = 1; i < s.cu_seqlens.size(); ++i)
        square += double(s.heads) * double(s.cu_seqlens[i] - s.cu_seqlens[i - 1]) *
                  double(s.cu_seqlens[i] - s.cu_seqlens[i - 1]);
    // A forward-only op (AttnShape::backward false) holds no gradients.
    const double grads = s.backward ? io : 0;
    workspace_ = std::size_t(eager ? 2 * square * e : 0);  // S and P, what the scenario's workspace_mib reads
    reservation_ = dev.ledger().reserve(std::uint64_t(io + grads + (eager ? 2 * square * e : 0)),
                                        eager ? "simulated eager attention Q, K, V, O, grads and the S x S scores"
                                              : "simulated attention Q, K, V, O and grads");
    const SimModel& m = dev.model();
    const double peak = m.peak_tflops.at(t).value * 1e12;
    const double launch = launch_seconds(m);
    if (!eager) {
      const double mem = bytes_seconds(m, io);
      fwd_s_ = std::max(s.fwd_flops() / peak, mem) + launch;
      bwd_s_ = std::max(2.5 * s.fwd_flops() / peak, 2 * mem) + launch;
    } else {
      const double full = s.causal ? 2 * s.fwd_flops() : s.fwd_flops();  // the masked half computed too
      fwd_s_ = std::max(full / peak, bytes_seconds(m, io + 6 * square * e)) + 4 * launch;
      bwd_s_ = std::max(2 * full / peak, bytes_seconds(m, 2 * io + 7 * square * e)) + 5 * launch;
    }
  }
  AttnShape shape() const override { return s_; }
  AttnImpl impl() const override { return impl_; }
  DType dtype() const override { return t_; }
  std::string impl_detail() const override {
    return impl_ == AttnImpl::flash || impl_ == AttnImpl::cudnn
               ? "simulated roofline of a fused attention"
               : "simulated roofline of eager attention (S x S scores through memory)";
  }
  std::size_t workspace_bytes() const override { return workspace_; }
  void forward() override { dev_.spend(fmt::format("simulated {} attention forward", to_string(impl_)), fwd_s_); }
  void backward() override { dev_.spend(fmt::format("simulated {} attention backward", to_string(impl_)), bwd_s_); }
  void upload(std::span<const float>, std::span<const float>, std::span<const float>, std::span<const float>) override {}
  void download(std::span<float> o, std::span<float> dq, std::span<float> dk, std::span<float> dv) override {
    for (auto sp : {o, dq, dk, dv}) std::fill(sp.begin(), sp.end(), 0.0f);
  }
  bool computes() const override { return false; }

 private:
  SimDevice& dev_;
  AttnShape s_;
  AttnImpl impl_;
  DType t_;
  MemoryReservation reservation_;
  std::size_t workspace_ = 0;
  double fwd_s_ = 0, bwd_s_ = 0;
};

std::unique_ptr<AttentionOp> SimDevice::make_attention(const AttnShape& s, AttnImpl impl, DType t, std::uint64_t) {
  if (auto why = attention_unsupported(impl, t)) throw UnsupportedError(*why);
  return std::make_unique<SimAttention>(*this, s, impl, t);
}

}  // namespace

Backend make_sim_backend() {
  Backend b;
  b.name = "sim";
  b.list = [] {
    std::vector<DeviceInfo> out;
    for (const auto& f : gpu_files()) out.push_back(sim_info(make_sim_model(f)));
    return out;
  };
  b.unavailable = []() -> std::string {
    if (!gpu_files().empty()) return "";
    std::string dirs;
    for (const auto& d : expected_dirs()) dirs += (dirs.empty() ? "" : ", ") + d;
    return fmt::format("no gpu expected files found (searched {}; set STALLBENCH_DATA_DIR)", dirs);
  };
  b.open = [](int index) -> std::unique_ptr<Device> {
    const auto files = gpu_files();
    if (index < 0 || index >= int(files.size()))
      throw UsageError(fmt::format("no simulated device #{}: {} gpu expected files found", index, files.size()));
    return std::make_unique<SimDevice>(files[std::size_t(index)]);
  };
  b.versions = [] {
    return nlohmann::ordered_json{{"model", "roofline over results/expected (simulated, never measured)"}};
  };
  return b;
}

}  // namespace sb
