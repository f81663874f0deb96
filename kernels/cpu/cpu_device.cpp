// The cpu device. GEMM is oneDNN 2.x matmul: src A [M,K] row-major, weights
// given as W [N,K] row-major (oneDNN tag `ba` of a [K,N] tensor) and reordered
// once to the layout the primitive prefers (`any`), dst C [M,N] f32. bf16
// gives oneDNN bf16 memory descriptors, which is what selects AMX.
//
// Memory: every operand, workspace and oneDNN scratchpad the device makes
// (and allocate()) comes from one MemLedger, so memory_stats() is exact and
// set_memory_limit() turns the host into a smaller device that answers
// OutOfMemory instead of being killed.
#include "kernels/cpu/cpu_backend.hpp"

#include <cstring>  // std::memcpy
#include <memory>   // std::make_shared: the work items share what they execute
#include <mutex>    // std::once_flag
#include <unordered_map>  // std::unordered_map: oneDNN execute args

#include <oneapi/dnnl/dnnl.hpp>  // dnnl::matmul, dnnl::reorder, dnnl::memory

#include <omp.h>    // omp_set_num_threads: the compute thread's team

#include <fmt/format.h>  // fmt::format

#include "harness/cpu_affinity.hpp"                // allowed_cpus, pin_this_thread
#include "harness/errors.hpp"                      // OutOfMemory, UnsupportedError, UsageError
#include "harness/fingerprint.hpp"                 // read_cpu_info
#include "harness/random.hpp"                      // uniform_pm1
#include "kernels/cpu/detail/attention.hpp"        // make_attention, attention_unsupported
#include "kernels/cpu/detail/compute_stream.hpp"   // ComputeStream
#include "kernels/cpu/detail/dnnl_check.hpp"       // SB_DNNL_CHECK
#include "kernels/cpu/detail/mem_ledger.hpp"       // MemLedger, LedgerBlock
#include "kernels/cpu/detail/omp_team.hpp"         // TeamScope
#include "kernels/cpu/detail/stream_device.hpp"    // record_event, StreamBusyProbe
#include "kernels/cpu/detail/train_ops.hpp"        // make_train_ops

namespace sb {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return fmt::format("{}.{}.{}", v->major, v->minor, v->patch);
}

std::string isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return fmt::format("isa {:#x}", static_cast<unsigned>(isa));
  }
}

std::optional<dt> dnnl_type(DType t) {
  switch (t) {
    case DType::fp32: return dt::f32;
    case DType::bf16: return dt::bf16;
    case DType::fp16: return dt::f16;
    default: return std::nullopt;
  }
}

class CpuGemm : public GemmOp {
 public:
  CpuGemm(dnnl::engine& eng, cpu::ComputeStream& cs, cpu::MemLedger& ledger, GemmShape s, DType t,
          std::uint64_t seed)
      : eng_(eng), cs_(cs), strm_(SB_DNNL_CHECK(dnnl::stream(eng))), shape_(s), dtype_(t) {
    const dt in = *dnnl_type(t);
    const dnnl::memory::dims a_dims{s.m, s.k}, w_dims{s.k, s.n}, c_dims{s.m, s.n};
    const dnnl::memory::desc a_md(a_dims, in, tag::ab);
    const dnnl::memory::desc w_any(w_dims, in, tag::any);
    const dnnl::memory::desc c_md(c_dims, dt::f32, tag::ab);
    const dnnl::matmul::desc desc(a_md, w_any, c_md);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // its scratchpad is ledger memory too
    {
      const cpu::TeamScope team(cs_.team());  // made for the compute thread's team (omp_team.hpp)
      pd_ = SB_DNNL_CHECK(dnnl::matmul::primitive_desc(desc, attr, eng_));
      prim_ = SB_DNNL_CHECK(dnnl::matmul(pd_));
    }
    label_ = fmt::format("gemm {} {}x{}x{}", to_string(t), s.m, s.n, s.k);
    // A [M,K] and W [N,K] in the dtype (W in oneDNN's blocked layout, maybe
    // padded), C [M,N] fp32: the sizes come from the descriptors.
    const std::size_t a_b = a_md.get_size(), w_b = pd_.weights_desc().get_size(), c_b = c_md.get_size(),
                      sp_b = pd_.scratchpad_desc().get_size();
    ledger.require(a_b + w_b + c_b + sp_b,
                   fmt::format("{} (A {}, W {}, C {}, scratchpad {})", label_, format_bytes(a_b),
                               format_bytes(w_b), format_bytes(c_b), format_bytes(sp_b)));
    a_buf_ = ledger.alloc(a_b, label_ + " A");
    w_buf_ = ledger.alloc(w_b, label_ + " W");
    c_buf_ = ledger.alloc(c_b, label_ + " C");
    sp_buf_ = ledger.alloc(sp_b, label_ + " scratchpad");
    a_ = SB_DNNL_CHECK(dnnl::memory(a_md, eng_, a_buf_.data()));
    w_ = SB_DNNL_CHECK(dnnl::memory(pd_.weights_desc(), eng_, w_buf_.data()));
    c_ = SB_DNNL_CHECK(dnnl::memory(c_md, eng_, c_buf_.data()));
    sp_ = SB_DNNL_CHECK(dnnl::memory(pd_.scratchpad_desc(), eng_, sp_buf_.data()));
    std::vector<float> a(std::size_t(s.m * s.k)), w(std::size_t(s.n * s.k));
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = uniform_pm1(seed, i);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = uniform_pm1(seed + 1, i);
    upload(a, w);
  }

  GemmShape shape() const override { return shape_; }
  DType dtype() const override { return dtype_; }
  DType c_dtype() const override { return DType::fp32; }
  std::string impl() const override { return pd_.impl_info_str(); }

  // The work item holds what it executes (oneDNN handles are reference
  // counted), never `this`: after a timed-out wait the op may be destroyed
  // while its GEMM still runs on the stream. The operands' memory is then
  // kept by the ledger (MemLedger::keep_freed_blocks).
  void enqueue() override {
    if (!exec_)
      exec_ = std::make_shared<Exec>(Exec{strm_, prim_, {{DNNL_ARG_SRC, a_}, {DNNL_ARG_WEIGHTS, w_},
                                                         {DNNL_ARG_DST, c_}, {DNNL_ARG_SCRATCHPAD, sp_}}});
    cs_.enqueue(label_, [e = exec_] {
      SB_DNNL_CHECK(e->prim.execute(e->strm, e->args));
      SB_DNNL_CHECK(e->strm.wait());
    });
  }

  void upload(std::span<const float> a, std::span<const float> w) override {
    if (a.size() != std::size_t(shape_.m * shape_.k) || w.size() != std::size_t(shape_.n * shape_.k))
      throw Error(ErrorKind::runtime, "cpu gemm upload: operand sizes do not match the shape");
    // User layouts: A is [M,K] `ab`; W is [N,K] row-major, i.e. a [K,N] tensor in `ba`.
    const dnnl::memory::desc a_user({shape_.m, shape_.k}, dt::f32, tag::ab);
    const dnnl::memory::desc w_user({shape_.k, shape_.n}, dt::f32, tag::ba);
    cs_.enqueue("upload operands", [&, this] {
      dnnl::memory am(a_user, eng_, const_cast<float*>(a.data()));
      dnnl::memory wm(w_user, eng_, const_cast<float*>(w.data()));
      SB_DNNL_CHECK(dnnl::reorder(am, a_).execute(strm_, am, a_));
      SB_DNNL_CHECK(dnnl::reorder(wm, w_).execute(strm_, wm, w_));
      SB_DNNL_CHECK(strm_.wait());
    });
    cs_.synchronize(std::chrono::minutes(5));
  }

  void download_c(std::span<float> c) override {
    if (c.size() != std::size_t(shape_.m * shape_.n))
      throw Error(ErrorKind::runtime, "cpu gemm download: size does not match the shape");
    std::memcpy(c.data(), c_.get_data_handle(), c.size() * sizeof(float));
  }

 private:
  dnnl::engine& eng_;
  cpu::ComputeStream& cs_;
  dnnl::stream strm_;
  GemmShape shape_;
  DType dtype_;
  dnnl::matmul::primitive_desc pd_;
  dnnl::matmul prim_;
  cpu::LedgerBlock a_buf_, w_buf_, c_buf_, sp_buf_;  // before the memories that view them
  dnnl::memory a_, w_, c_, sp_;
  std::string label_;
  struct Exec {
    dnnl::stream strm;
    dnnl::matmul prim;
    std::unordered_map<int, dnnl::memory> args;
  };
  std::shared_ptr<Exec> exec_;  // made at the first enqueue, shared with every work item
};

class CpuDevice : public Device {
 public:
  CpuDevice() : eng_(dnnl::engine::kind::cpu, 0) {
    const CpuInfo cpu = read_cpu_info();
    info_.id = "cpu";
    info_.kind = DeviceKind::cpu;
    info_.name = cpu.model;
    info_.props = nlohmann::ordered_json{{"logical_cores", cpu.logical_cores},
                                         {"isa", cpu.isa},
                                         {"onednn", onednn_version()},
                                         {"onednn_isa", isa_name(dnnl::get_effective_cpu_isa())},
                                         {"stream", "dedicated compute thread"}};
  }

  const DeviceInfo& info() const override { return info_; }

  std::optional<std::string> gemm_unsupported(DType t) const override {
    switch (t) {
      case DType::tf32: return "oneDNN 2.6 has no tf32 matmul mode (fp32 with reduced-precision inputs)";
      case DType::fp8_e4m3: return "oneDNN 2.6 has no fp8 matmul";
      default: break;
    }
    // Ask oneDNN whether it has an implementation for this type on this CPU.
    try {
      const dt in = *dnnl_type(t);
      const dnnl::matmul::desc d({{64, 64}, in, tag::ab}, {{64, 64}, in, tag::any}, {{64, 64}, dt::f32, tag::ab});
      dnnl::matmul::primitive_desc pd(d, eng_);
    } catch (const dnnl::error& e) {
      return fmt::format("oneDNN {} has no {} matmul on this CPU ({}; isa {})", onednn_version(), to_string(t),
                         cpu::dnnl_status_name(e.status), isa_name(dnnl::get_effective_cpu_isa()));
    }
    return std::nullopt;
  }

  std::unique_ptr<GemmOp> make_gemm(GemmShape s, DType t, std::uint64_t seed) override {
    if (auto why = gemm_unsupported(t)) throw UnsupportedError(*why);
    try {
      return std::make_unique<CpuGemm>(eng_, cs_, *ledger_, s, t, seed);
    } catch (const std::bad_alloc&) {
      throw OutOfMemory(fmt::format("cpu: cannot allocate the operands of a {}x{}x{} {} GEMM", s.m, s.n, s.k,
                                    to_string(t)));
    }
  }

  std::optional<std::string> attention_unsupported(AttnImpl impl, DType t) const override {
    return cpu::attention_unsupported(eng_, impl, t);
  }
  std::unique_ptr<AttentionOp> make_attention(const AttnShape& s, AttnImpl impl, DType t,
                                              std::uint64_t seed) override {
    return cpu::make_attention(cpu::AttnEnv{eng_, cs_, ledger_}, s, impl, t, seed);
  }

  std::unique_ptr<TrainOps> make_train_ops() override {
    return cpu::make_train_ops(
        cpu::TrainEnv{eng_, cs_, ledger_, [this](std::chrono::milliseconds t) { synchronize(t); }});
  }

  MemoryStats memory_stats() const override { return ledger_->stats(); }
  void reset_peak_memory() override { ledger_->reset_peak(); }
  void set_trace(KinetoTrace* t) override { trace_.attach(t, cs_, ledger_->account(), info_, "a cpu device: its compute thread is written as GPU 0, stream 7; its kernels are the thread's work items"); }
  void range_push(const char* name) override { trace_.push(name); }
  void range_pop() override { trace_.pop(); }
  void set_memory_limit(std::size_t bytes) override { ledger_->set_limit(bytes); }

  Buffer allocate(std::size_t bytes, MemKind kind) override {
    // Host memory stands for device memory here; "pinned" has no meaning on
    // the cpu device and is plain memory too. The Buffer's release hands the
    // block back to the ledger.
    auto block = std::make_shared<cpu::LedgerBlock>(
        ledger_->alloc(bytes, fmt::format("buffer of {}", format_bytes(bytes))));
    void* p = block->data();
    return Buffer(p, bytes, kind, [block](void*) mutable { block.reset(); });
  }

  void copy_h2d(Buffer& dst, const Buffer& src, std::size_t bytes) override {
    if (bytes > dst.bytes() || bytes > src.bytes())
      throw Error(ErrorKind::runtime, "cpu: copy_h2d larger than a buffer");
    void* d = dst.data();
    const void* s = src.data();
    cs_.enqueue(fmt::format("h2d copy ({}, {} bytes)", src.kind() == MemKind::host_pinned ? "pinned" : "pageable", bytes),
                [d, s, bytes] { std::memcpy(d, s, bytes); });
  }

  // timing=cold: every line of a buffer twice the last-level cache is
  // written, which evicts the operands of the op timed next.
  std::size_t flush_cache() override {
    if (flush_buf_.data() == nullptr) flush_buf_ = allocate(2 * cpu::last_level_cache_bytes(), MemKind::device);
    auto* p = static_cast<unsigned char*>(flush_buf_.data());
    const std::size_t n = flush_buf_.bytes();
    cs_.enqueue("cache flush", [p, n] {
      for (std::size_t i = 0; i < n; i += 64) p[i] = static_cast<unsigned char>(p[i] + 1);
    });
    return n;
  }
  std::unique_ptr<StreamGate> hold_stream(std::chrono::milliseconds deadline) override {
    return std::make_unique<cpu::StreamHold>(cs_, deadline);
  }

  EventPtr record() override { return cpu::record_event(cs_); }
  double elapsed_ms(const EventPtr& a, const EventPtr& b) override { return cpu::stream_elapsed_ms(a, b); }
  // A wait that times out leaves an operation running, and more queued, on
  // buffers that unwinding is about to free: keep every freed block from now
  // on and drop what has not started, then report the hang.
  void synchronize(std::chrono::milliseconds timeout) override {
    try {
      cs_.synchronize(timeout);
    } catch (const HangError&) {
      on_stream_hang();
      throw;
    }
  }
  void wait_event(const EventPtr& e, std::chrono::milliseconds timeout) override {
    try {
      cs_.wait_done(cpu::as_stream_event(e).seq, timeout);
    } catch (const HangError&) {
      on_stream_hang();
      throw;
    }
  }
  std::unique_ptr<UtilProbe> utilization_probe() override { return std::make_unique<cpu::StreamBusyProbe>(cs_); }

  // Pins the compute thread, and the OpenMP team it starts (libgomp's team
  // threads are the compute thread's own and inherit its mask when created;
  // a team of one is the thread alone), to the first `threads` allowed CPUs.
  // Fewer than all: claimed across processes (CpuClaims), so that a second
  // stallbench process computes on other CPUs where there are any.
  std::vector<int> reserve_host_cpus(int threads) override {
    // After a hang the stream is stuck behind the running item: leave it.
    if (ledger_->keeps_freed_blocks()) return pinned_;
    std::vector<int> cpus = allowed_cpus_;
    if (threads > 0 && std::size_t(threads) < cpus.size())
      cpus = claims_.claim(allowed_cpus_, std::size_t(threads));
    else
      claims_.release();
    pinned_ = cpus;
    const int team = int(cpus.size());
    cs_.set_team(team);  // what primitives made from now are made for (omp_team.hpp)
    cs_.enqueue("pin the compute thread", [cpus, team] {
      pin_this_thread(cpus);
      omp_set_num_threads(team);
      // libgomp reuses its pool threads, which keep the mask they were made
      // with: each team thread pins itself too.
#pragma omp parallel num_threads(team)
      { pin_this_thread(cpus); }
    });
    cs_.synchronize(std::chrono::seconds(60));
    return cpus;
  }

  std::vector<int> shared_host_cpus() const override { return claims_.contended(); }

  void on_stream_hang() {
    ledger_->keep_freed_blocks();
    cs_.abandon_queued();
  }

 private:
  DeviceInfo info_;
  mutable dnnl::engine eng_;
  std::shared_ptr<cpu::MemLedger> ledger_ = std::make_shared<cpu::MemLedger>("cpu");
  std::vector<int> allowed_cpus_ = allowed_cpus();  // the process's, before any pinning
  CpuClaims claims_;                                // the compute's CPUs while it has fewer than all
  std::vector<int> pinned_ = allowed_cpus_;         // what the compute runs on now
  Buffer flush_buf_;       // timing=cold's eviction buffer, made on first use
  cpu::StreamTrace trace_;
  cpu::ComputeStream cs_;  // last: its thread stops before the engine goes and the buffers
};

}  // namespace

Backend make_cpu_backend() {
  Backend b;
  b.name = "cpu";
  b.list = [] {
    CpuDevice d;
    return std::vector<DeviceInfo>{d.info()};
  };
  b.unavailable = [] { return std::string(); };
  b.open = [](int index) -> std::unique_ptr<Device> {
    if (index != 0) throw UsageError(fmt::format("no device cpu:{}; the cpu backend has one device, cpu", index));
    return std::make_unique<CpuDevice>();
  };
  b.versions = [] {
    return nlohmann::ordered_json{{"onednn", onednn_version()},
                                  {"onednn_git", dnnl_version()->hash},
                                  {"onednn_runtime", dnnl_version()->cpu_runtime == DNNL_RUNTIME_OMP   ? "OpenMP"
                                                     : dnnl_version()->cpu_runtime == DNNL_RUNTIME_TBB ? "TBB"
                                                     : dnnl_version()->cpu_runtime == DNNL_RUNTIME_SEQ ? "sequential"
                                                                                                       : "other"},
                                  {"onednn_isa", isa_name(dnnl::get_effective_cpu_isa())}};
  };
  return b;
}

}  // namespace sb
