// A Device for unit tests: a naive host GEMM (optionally broken on purpose,
// so tests can prove the checks catch it) and a virtual clock, so timing logic
// is tested without timing anything.
#pragma once

#include <cstring>
#include <stdexcept>
#include <vector>

#include "harness/device.hpp"
#include "harness/errors.hpp"

namespace sb::test {

struct FakeEvent : Event {
  double t_ms = 0;
};

class FakeGemm : public GemmOp {
 public:
  FakeGemm(GemmShape s, DType t, bool transposed_bug, double* clock, double op_ms)
      : s_(s), t_(t), bug_(transposed_bug), clock_(clock), op_ms_(op_ms),
        a_(std::size_t(s.m * s.k)), w_(std::size_t(s.n * s.k)), c_(std::size_t(s.m * s.n)) {}
  GemmShape shape() const override { return s_; }
  DType dtype() const override { return t_; }
  DType c_dtype() const override { return DType::fp32; }
  std::string impl() const override { return bug_ ? "naive (broken)" : "naive"; }
  void enqueue() override {
    *clock_ += op_ms_;
    for (std::int64_t i = 0; i < s_.m; ++i)
      for (std::int64_t j = 0; j < s_.n; ++j) {
        double acc = 0;
        for (std::int64_t k = 0; k < s_.k; ++k) {
          // The bug reads W as [K,N] instead of [N,K]: a layout mistake.
          const float w = bug_ ? w_[std::size_t(k * s_.n + j) % w_.size()] : w_[std::size_t(j * s_.k + k)];
          acc += double(a_[std::size_t(i * s_.k + k)]) * double(w);
        }
        c_[std::size_t(i * s_.n + j)] = float(acc);
      }
  }
  void upload(std::span<const float> a, std::span<const float> w) override {
    for (std::size_t i = 0; i < a.size(); ++i) a_[i] = round_to(t_, a[i]);
    for (std::size_t i = 0; i < w.size(); ++i) w_[i] = round_to(t_, w[i]);
  }
  void download_c(std::span<float> c) override { std::memcpy(c.data(), c_.data(), c.size() * 4); }

 private:
  GemmShape s_;
  DType t_;
  bool bug_;
  double* clock_;
  double op_ms_;
  std::vector<float> a_, w_, c_;
};

class FakeDevice : public Device {
 public:
  bool broken_gemm = false;
  double op_ms = 1.0;           // virtual time each GEMM takes
  std::vector<double> jitter;   // added to successive ops, cycling
  std::size_t ops = 0;
  bool hang_on_sync = false;

  FakeDevice() {
    info_.id = "fake";
    info_.name = "fake device";
  }
  const DeviceInfo& info() const override { return info_; }
  std::optional<std::string> gemm_unsupported(DType t) const override {
    if (t == DType::fp8_e4m3) return "fake device has no fp8";
    return std::nullopt;
  }
  std::unique_ptr<GemmOp> make_gemm(GemmShape s, DType t, std::uint64_t) override {
    if (s.m * s.n * s.k > (1ll << 40)) throw OutOfMemory("fake device: too big");
    return std::make_unique<FakeGemm>(s, t, broken_gemm, &clock_, op_ms);
  }
  Buffer allocate(std::size_t bytes, MemKind kind) override {
    return Buffer(new char[bytes], bytes, kind, [](void* p) { delete[] static_cast<char*>(p); });
  }
  void copy_h2d(Buffer&, const Buffer&, std::size_t) override {}
  EventPtr record() override {
    auto e = std::make_shared<FakeEvent>();
    e->t_ms = clock_;
    return e;
  }
  double elapsed_ms(const EventPtr& a, const EventPtr& b) override {
    return static_cast<FakeEvent*>(b.get())->t_ms - static_cast<FakeEvent*>(a.get())->t_ms;
  }
  void synchronize(std::chrono::milliseconds timeout) override {
    if (hang_on_sync) throw HangError("fake: no progress within " + std::to_string(timeout.count()) + " ms");
  }
  void wait_event(const EventPtr&, std::chrono::milliseconds timeout) override { synchronize(timeout); }
  std::unique_ptr<UtilProbe> utilization_probe() override { return nullptr; }

  // timing=cold: a flush takes flush_ms of virtual time and is counted.
  double flush_ms = 0;
  int flushes = 0;
  std::size_t flush_cache() override {
    clock_ += flush_ms;
    ++flushes;
    return 1 << 20;
  }
  // timing=hidden: a gate whose expiry a test sets; the virtual clock models
  // no launch gaps, so only the bookkeeping is under test.
  bool gates_expire = false;
  int gates = 0, gates_released = 0;
  struct FakeGate : StreamGate {
    FakeDevice* dev;
    bool done = false;
    explicit FakeGate(FakeDevice* d) : dev(d) {}
    void release() override {
      if (!done) ++dev->gates_released;
      done = true;
    }
    bool expired() const override { return dev->gates_expire; }
  };
  std::unique_ptr<StreamGate> hold_stream(std::chrono::milliseconds) override {
    ++gates;
    return std::make_unique<FakeGate>(this);
  }
  // A timed op that advances the virtual clock by op_ms plus jitter.
  void tick() {
    clock_ += op_ms + (jitter.empty() ? 0.0 : jitter[ops % jitter.size()]);
    ++ops;
  }

 private:
  DeviceInfo info_;
  double clock_ = 0;
};

// Whether the device's CPU lists an ISA extension (props.isa, from
// /proc/cpuinfo flags: "avx2", "avx512f", "avx512_bf16", "amx_bf16", ...).
inline bool cpu_has(const Device& dev, const std::string& isa) {
  const auto& props = dev.info().props;
  if (!props.contains("isa")) return false;
  for (const auto& x : props["isa"])
    if (x.is_string() && x.get<std::string>() == isa) return true;
  return false;
}

// Whether oneDNN, as it runs here, may use AVX-512 (props.onednn_isa, from
// dnnl_get_effective_cpu_isa: avx512_core and up). Not the same as the CPU's
// flags: ONEDNN_MAX_CPU_ISA=AVX2 caps it on an AVX-512 CPU (CI runs the unit
// suite that way), and oneDNN 2.6 runs bf16 from avx512_core up.
inline bool onednn_uses_avx512(const Device& dev) {
  const auto& props = dev.info().props;
  if (!props.contains("onednn_isa") || !props["onednn_isa"].is_string()) return false;
  return props["onednn_isa"].get<std::string>().rfind("avx512", 0) == 0;
}

}  // namespace sb::test
