// Tests of the cuda backend on a real GPU. With no usable GPU the binary
// prints why and exits 77, which Meson reports as SKIP (a gtest binary whose
// tests all GTEST_SKIP would exit 0 and show as OK, hiding the missing device).
#include <dlfcn.h>  // dlopen: whether this machine has NVML at all

#include <algorithm>  // std::min
#include <chrono>     // std::chrono_literals
#include <cmath>      // std::fabs, std::isfinite
#include <cstdint>    // std::int64_t, std::uint64_t
#include <cstdio>     // std::printf
#include <cstdlib>    // std::calloc, std::free: the host reference's tensors
#include <cstring>    // std::memset
#include <exception>  // std::exception
#include <limits>     // std::numeric_limits
#include <memory>     // std::unique_ptr
#include <random>     // std::mt19937_64, std::uniform_real_distribution
#include <span>       // std::span
#include <stdexcept>  // std::logic_error
#include <string>     // std::string, std::stod
#include <utility>    // std::pair
#include <vector>     // std::vector

#include <cuda_runtime.h>  // cudaDeviceGetAttribute: the L2 size
#include <fmt/format.h>   // fmt::format
#include <gtest/gtest.h>  // TEST, TEST_P, GTEST_SKIP

#include "harness/attention_check.hpp"    // check_attention: the pre-timing attention check
#include "harness/device.hpp"             // Device, GemmOp, MemKind, AttentionOp
#include "harness/dtype.hpp"              // DType, round_to, unit_roundoff
#include "harness/errors.hpp"             // Error, OutOfMemory, UsageError
#include "harness/gemm_check.hpp"         // check_gemm: the pre-timing check the CLI runs
#include "harness/measure.hpp"            // measure, MeasureConfig, TimingMode
#include "harness/train_ops.hpp"          // TrainOps, DTensor, Act, read_stats
#include "kernels/cuda/cuda_backend.hpp"  // make_cuda_backend
#include "tests/gpu/gpu_main.hpp"          // gpu_test_main: SKIP (77) without a device
#include "kernels/cuda/fill.cuh"          // cuda_kernels::uniform_value

namespace sb {
namespace {

using namespace std::chrono_literals;

constexpr auto kTimeout = 30s;  // generous: every op here takes milliseconds

std::unique_ptr<Device> open_gpu() { return make_cuda_backend().open(0); }

// Bound on the accumulation error, as a fraction of sum_k |a_k||w_k|. fp32
// accumulates in fp32 (K*2^-24 is ~6e-6 for K=96, worst case); tf32 inputs
// here are already tf32-exact, but the tensor-core path may round partial sums
// more coarsely; bf16/fp16 accumulate in fp32; Hopper's fp8 tensor cores keep
// fewer accumulator bits than fp32 (about 14), hence the loosest bound.
double accumulation_bound(DType d) {
  switch (d) {
    case DType::fp32: return 1e-5;
    case DType::tf32: return 2e-3;
    case DType::bf16: return 1e-4;
    case DType::fp16: return 1e-4;
    case DType::fp8_e4m3: return 2e-3;
  }
  return 1e-5;
}

struct GemmCase {
  DType dtype;
  GemmShape shape;
};

std::string case_name(const testing::TestParamInfo<GemmCase>& info) {
  const GemmShape& s = info.param.shape;
  return fmt::format("{}_{}x{}x{}", to_string(info.param.dtype), s.m, s.n, s.k);
}

std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> out;
  for (DType d : all_dtypes()) {
    out.push_back({d, {64, 48, 80}});
    // Odd M and N exercise the edge tiles. fp8 in cuBLASLt needs N and K to
    // be multiples of 16 (16-byte aligned leading dimensions): its edge case
    // keeps every dimension a multiple of 16 but none a power of two.
    out.push_back({d, d == DType::fp8_e4m3 ? GemmShape{272, 144, 96} : GemmShape{257, 129, 96}});
    // The shape precision checks each dtype on before timing.
    out.push_back({d, gemm_check_shape(d)});
  }
  for (const GemmCase& c : out)  // no case may ask cuBLASLt for an illegal shape
    if (auto why = gpu_gemm_shape_problem(c.dtype, c.shape)) throw std::logic_error(*why);
  return out;
}

// Compares C (row-major M x N) with a double-precision reference built from
// the same (already rounded) operands:
//   |c - ref| <= rel * |ref| + acc * sum_k |a_ik| |w_jk|,
// where rel = 2 * unit roundoff of C's type covers the final rounding of C and
// acc bounds the accumulation. Returns "" or a report of the first mismatches.
std::string check_gemm(const GemmOp& op, const std::vector<float>& a, const std::vector<float>& w,
                       const std::vector<float>& c) {
  const GemmShape s = op.shape();
  const double rel = 2.0 * unit_roundoff(op.c_dtype());
  const double acc = accumulation_bound(op.dtype());
  std::int64_t bad = 0;
  std::string report;
  for (std::int64_t i = 0; i < s.m; ++i) {
    for (std::int64_t j = 0; j < s.n; ++j) {
      double ref = 0, mag = 0;
      for (std::int64_t k = 0; k < s.k; ++k) {
        const double p = double(a[i * s.k + k]) * double(w[j * s.k + k]);
        ref += p;
        mag += std::fabs(p);
      }
      const std::int64_t idx = i * s.n + j;
      const double got = c[idx];
      const double tol = rel * std::fabs(ref) + acc * mag;
      if (!std::isfinite(got) || std::fabs(got - ref) > tol) {
        if (bad < 5)
          report += fmt::format(
              "  C[{},{}] (index {}): got {:.8g}, want {:.8g}, |diff| {:.3g} > tol {:.3g}\n", i,
              j, idx, got, ref, std::fabs(got - ref), tol);
        ++bad;
      }
    }
  }
  if (bad == 0) return "";
  return fmt::format("{} of {} values of a {} {}x{}x{} GEMM mismatch (impl {}):\n{}", bad,
                     s.m * s.n, to_string(op.dtype()), s.m, s.n, s.k, op.impl(), report);
}

// Uploads host operands in [-1, 1] rounded to the op's dtype (so the device
// stores exactly these), runs the GEMM once and checks C against the host
// reference. "" or a report of the first mismatches.
std::string run_uploaded(Device& dev, GemmOp& op, std::uint64_t seed) {
  const GemmShape shape = op.shape();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(std::size_t(shape.m * shape.k)), w(std::size_t(shape.n * shape.k));
  for (float& x : a) x = round_to(op.dtype(), u(rng));
  for (float& x : w) x = round_to(op.dtype(), u(rng));
  op.upload(a, w);
  op.enqueue();
  dev.synchronize(kTimeout);
  std::vector<float> c(std::size_t(shape.m * shape.n));
  op.download_c(c);
  return check_gemm(op, a, w, c);
}

class GemmTest : public testing::TestWithParam<GemmCase> {};

// Host operands, uploaded: checks the GEMM layout, types and conversions.
TEST_P(GemmTest, UploadedOperandsMatchHostReference) {
  const auto [dtype, shape] = GetParam();
  auto dev = open_gpu();
  if (auto why = dev->gemm_unsupported(dtype)) GTEST_SKIP() << *why;
  auto op = dev->make_gemm(shape, dtype, 7);
  EXPECT_EQ(op->dtype(), dtype);
  EXPECT_EQ(op->impl().rfind("cublasLt algo ", 0), 0u) << op->impl();

  const std::string report = run_uploaded(*dev, *op, 42);
  EXPECT_TRUE(report.empty()) << report;
}

// Operands filled on the device from the seed: checks the fill kernels against
// their host twin (A from seed stream 2*seed, W from 2*seed+1).
TEST_P(GemmTest, SeededOperandsMatchHostRebuild) {
  const auto [dtype, shape] = GetParam();
  auto dev = open_gpu();
  if (auto why = dev->gemm_unsupported(dtype)) GTEST_SKIP() << *why;
  const std::uint64_t seed = 1234;
  auto op = dev->make_gemm(shape, dtype, seed);
  op->enqueue();
  dev->synchronize(kTimeout);
  std::vector<float> c(std::size_t(shape.m * shape.n));
  op->download_c(c);

  std::vector<float> a(std::size_t(shape.m * shape.k)), w(std::size_t(shape.n * shape.k));
  for (std::size_t i = 0; i < a.size(); ++i)
    a[i] = round_to(dtype, cuda_kernels::uniform_value(2 * seed, std::int64_t(i)));
  for (std::size_t i = 0; i < w.size(); ++i)
    w[i] = round_to(dtype, cuda_kernels::uniform_value(2 * seed + 1, std::int64_t(i)));
  const std::string report = check_gemm(*op, a, w, c);
  EXPECT_TRUE(report.empty()) << report;
}

// The check the CLI runs before timing (harness/gemm_check): unrounded fp32
// inputs, rounded by the device's conversion kernels.
TEST_P(GemmTest, HarnessCheckPasses) {
  const auto [dtype, shape] = GetParam();
  auto dev = open_gpu();
  if (auto why = dev->gemm_unsupported(dtype)) GTEST_SKIP() << *why;
  const GemmCheck r = check_gemm(*dev, dtype, shape, 99, kTimeout);
  EXPECT_TRUE(r.ok) << r.wrong << " wrong, worst |err|/tol " << r.worst_ratio << " (" << r.impl
                    << "): " << r.first_mismatches;
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, GemmTest, testing::ValuesIn(gemm_cases()), case_name);

// Writes over the stack below the caller: a source of an asynchronous copy
// left on the stack (the fp8 scales once were) reads this garbage.
[[gnu::noinline]] float scribble_stack(float v) {
  volatile float junk[4096];
  for (int i = 0; i < 4096; ++i) junk[i] = v + float(i);
  return junk[v > 0 ? 17 : 4095];
}

// fp8's dequantization scales are copied to the device when the op is made;
// they must be 1.0 whatever the host stack holds afterwards. Several ops made
// back to back with the stack scribbled between them all match the reference.
TEST(CudaGemm, Fp8ScalesSurviveTheirHostSource) {
  auto dev = open_gpu();
  if (auto why = dev->gemm_unsupported(DType::fp8_e4m3)) GTEST_SKIP() << *why;
  const GemmShape shape{64, 48, 96};
  std::vector<std::unique_ptr<GemmOp>> ops;
  for (int i = 0; i < 4; ++i) {
    ops.push_back(dev->make_gemm(shape, DType::fp8_e4m3, 100 + std::uint64_t(i)));
    EXPECT_NE(scribble_stack(1e30f * float(i + 1)), 0.0f);
  }
  std::uint64_t seed = 7;
  for (auto& op : ops) {
    const std::string report = run_uploaded(*dev, *op, seed++);
    EXPECT_TRUE(report.empty()) << report;
  }
}

TEST(CudaGemm, IllegalFp8ShapeIsUnsupportedWithReason) {
  auto dev = open_gpu();
  if (auto why = dev->gemm_unsupported(DType::fp8_e4m3)) GTEST_SKIP() << *why;
  try {
    dev->make_gemm({61, 47, 256}, DType::fp8_e4m3, 1);
    ADD_FAILURE() << "an fp8 GEMM with N = 47 was accepted";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 16"), std::string::npos) << e.what();
  }
}

TEST(CudaGemm, CDtypeFollowsInputDtype) {
  auto dev = open_gpu();
  const std::vector<std::pair<DType, DType>> expect = {{DType::fp32, DType::fp32},
                                                       {DType::tf32, DType::fp32},
                                                       {DType::bf16, DType::bf16},
                                                       {DType::fp16, DType::fp16},
                                                       {DType::fp8_e4m3, DType::bf16}};
  for (auto [in, out] : expect) {
    if (dev->gemm_unsupported(in)) continue;
    EXPECT_EQ(dev->make_gemm({64, 64, 64}, in, 1)->c_dtype(), out) << to_string(in);
  }
}

TEST(CudaGemm, Fp8BelowHopperIsUnsupportedWithReason) {
  auto dev = open_gpu();
  const std::string cc = dev->info().props.at("compute_capability").get<std::string>();
  const bool hopper_or_newer = std::stod(cc) >= 9.0;
  const auto why = dev->gemm_unsupported(DType::fp8_e4m3);
  EXPECT_EQ(why.has_value(), !hopper_or_newer) << "compute capability " << cc;
  if (why) {
    EXPECT_NE(why->find("9.0"), std::string::npos) << *why;
    EXPECT_THROW(dev->make_gemm({64, 64, 64}, DType::fp8_e4m3, 1), UnsupportedError);
  }
}

TEST(CudaDevice, HugeAllocationThrowsOutOfMemory) {
  auto dev = open_gpu();
  try {
    (void)dev->allocate(1ull << 50, MemKind::device);  // 1 PiB
    FAIL() << "allocating 1 PiB succeeded";
  } catch (const OutOfMemory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("1125899906842624"), std::string::npos) << what;
    EXPECT_NE(what.find("free of"), std::string::npos) << what;
  }
  // The failed cudaMalloc must not leak into the next kernel launch check.
  EXPECT_NO_THROW({
    auto op = dev->make_gemm({64, 64, 64}, DType::fp32, 3);
    op->enqueue();
    dev->synchronize(kTimeout);
  });
}

TEST(CudaDevice, EventsTimeAGemm) {
  auto dev = open_gpu();
  const DType dtype = dev->gemm_unsupported(DType::bf16) ? DType::fp32 : DType::bf16;
  const GemmShape shape{1024, 1024, 1024};
  auto op = dev->make_gemm(shape, dtype, 5);
  op->enqueue();  // warm-up: first launch loads the kernel
  const int reps = 3;
  auto start = dev->record();
  for (int i = 0; i < reps; ++i) op->enqueue();
  auto stop = dev->record();
  dev->synchronize(kTimeout);
  const double ms = dev->elapsed_ms(start, stop);
  EXPECT_GT(ms, 0.0);
  // FLOPs = 2*M*N*K per GEMM; TFLOPS = reps * FLOPs / (ms * 1e-3) / 1e12.
  std::printf("  %s %lldx%lldx%lld: %.3f ms for %d GEMMs, %.1f TFLOPS (%s)\n",
              std::string(to_string(dtype)).c_str(), (long long)shape.m, (long long)shape.n,
              (long long)shape.k, ms, reps, reps * shape.flops() / (ms * 1e-3) / 1e12,
              op->impl().c_str());
}

TEST(CudaDevice, SynchronizeAfterSmallCopyReturns) {
  auto dev = open_gpu();
  const std::size_t bytes = 1 << 20;
  for (MemKind host : {MemKind::host_pinned, MemKind::host_pageable}) {
    Buffer src = dev->allocate(bytes, host);
    std::memset(src.data(), 1, bytes);
    Buffer dst = dev->allocate(bytes, MemKind::device);
    dev->copy_h2d(dst, src, bytes);
    EXPECT_NO_THROW(dev->synchronize(kTimeout));
  }
}

TEST(CudaDevice, WaitEventAfterGemmReturns) {
  auto dev = open_gpu();
  auto op = dev->make_gemm({512, 512, 512}, DType::fp32, 11);
  op->enqueue();
  auto done = dev->record();
  op->enqueue();  // work after the event does not hold the wait up
  EXPECT_NO_THROW(dev->wait_event(done, kTimeout));
  dev->synchronize(kTimeout);
  // An event of another device is an error, not a crash.
  struct Foreign : Event {};
  EXPECT_THROW(dev->wait_event(std::make_shared<Foreign>(), kTimeout), Error);
}

// timing=hidden: the gate kernel holds the stream. An event recorded behind
// it cannot complete before release (the 50 ms is a deadline, not a
// measured time); after release it does, and the gate did not expire.
TEST(CudaDevice, HeldStreamRunsNothingUntilReleased) {
  auto dev = open_gpu();
  auto gate = dev->hold_stream(std::chrono::seconds(30));
  auto e = dev->record();
  EXPECT_THROW(dev->wait_event(e, std::chrono::milliseconds(50)), HangError);
  gate->release();
  dev->wait_event(e, kTimeout);
  dev->synchronize(kTimeout);
  EXPECT_FALSE(gate->expired());
  // A gate nobody releases lets go by itself at its deadline, and says so.
  auto lapsed = dev->hold_stream(std::chrono::milliseconds(5));
  dev->synchronize(kTimeout);
  EXPECT_TRUE(lapsed->expired());
  // A later gate is not confused by the lapsed one.
  auto next = dev->hold_stream(std::chrono::seconds(30));
  next->release();
  dev->synchronize(kTimeout);
  EXPECT_FALSE(next->expired());
}

// timing=cold: the flush is a memset of twice the L2, on the stream.
TEST(CudaDevice, CacheFlushCoversTwiceTheL2) {
  auto dev = open_gpu();
  int l2 = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0), cudaSuccess);
  EXPECT_EQ(dev->flush_cache(), 2 * std::size_t(l2));
  EXPECT_EQ(dev->flush_cache(), 2 * std::size_t(l2));  // one buffer, reused
  dev->synchronize(kTimeout);
}

// The three timing modes on one GEMM: each gives a positive per-op time and
// records its mode; cold records the bytes it flushed.
TEST(CudaDevice, MeasureRunsInEveryTimingMode) {
  auto dev = open_gpu();
  auto op = dev->make_gemm({1024, 1024, 1024}, DType::bf16, 3);
  for (TimingMode mode : {TimingMode::warm, TimingMode::cold, TimingMode::hidden}) {
    MeasureConfig cfg = quick_measure_config();
    cfg.mode = mode;
    const Measurement m = measure(*dev, [&] { op->enqueue(); }, cfg);
    EXPECT_EQ(m.mode, mode);
    EXPECT_GT(m.ms.median, 0.0) << to_string(mode);
    EXPECT_EQ(m.flush_bytes > 0, mode == TimingMode::cold) << to_string(mode);
  }
}

TEST(CudaDevice, NvmlProbeReportsUtilizationInRange) {
  auto dev = open_gpu();
  const auto& nvml = dev->info().props.at("nvml");
  // NVML ships with the driver; where the library is missing the probe is
  // legitimately absent, and props say why.
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) GTEST_SKIP() << "no libnvidia-ml.so.1 on this machine: " << nvml.dump();
  dlclose(lib);
  auto probe = dev->utilization_probe();
  ASSERT_NE(probe, nullptr) << nvml.dump();
  EXPECT_EQ(nvml.at("status"), "ok") << nvml.dump();
  EXPECT_EQ(probe->source(), "nvml");
  EXPECT_EQ(probe->period(), std::chrono::milliseconds(50));

  auto op = dev->make_gemm({2048, 2048, 2048}, DType::fp32, 13);
  dev->range_push("gpu_tests: busy loop");  // NVTX: a no-op with no profiler attached
  for (int i = 0; i < 20; ++i) op->enqueue();
  const UtilSample busy = probe->sample();
  dev->synchronize(kTimeout);
  dev->range_pop();
  for (const UtilSample& s : {busy, probe->sample()}) {
    EXPECT_GE(s.util, 0.0);
    EXPECT_LE(s.util, 1.0);
    if (s.sm_clock_mhz) {
      EXPECT_GT(*s.sm_clock_mhz, 0.0);
    }
    if (s.power_w) {
      EXPECT_GT(*s.power_w, 0.0);
    }
  }
  std::printf("  nvml: util %.2f, sm clock %s MHz, power %s W, clock-event reasons %s\n", busy.util,
              busy.sm_clock_mhz ? fmt::format("{:.0f}", *busy.sm_clock_mhz).c_str() : "-",
              busy.power_w ? fmt::format("{:.1f}", *busy.power_w).c_str() : "-",
              busy.clock_event_reasons ? fmt::format("{:#x}", *busy.clock_event_reasons).c_str() : "-");
  // nvmlInit/nvmlShutdown are reference-counted: a second device closing
  // must not shut NVML down under this probe, and a probe outlives its device.
  { auto other = open_gpu(); }
  EXPECT_NO_THROW((void)probe->sample());
  op.reset();
  dev.reset();
  EXPECT_NO_THROW((void)probe->sample());
}

// ---- attention: naive (cuBLAS + softmax kernels) and cuDNN SDPA ----

enum class AttnKind { dense, causal, varlen, varlen_causal };

struct AttnCase {
  AttnImpl impl;
  DType dtype;
  AttnKind kind;
  bool backward;
};

const char* kind_name(AttnKind k) {
  switch (k) {
    case AttnKind::dense: return "dense";
    case AttnKind::causal: return "causal";
    case AttnKind::varlen: return "varlen";
    case AttnKind::varlen_causal: return "varlen_causal";
  }
  return "?";
}

// Small shapes with odd lengths (edge tiles) and, for varlen, a one-token
// sequence. D = 64: a multiple of 8, as cuDNN needs.
AttnShape attn_shape(AttnKind k) {
  AttnShape s;
  s.head_dim = 64;
  s.causal = k == AttnKind::causal || k == AttnKind::varlen_causal;
  if (k == AttnKind::dense || k == AttnKind::causal) {
    s.batch = 2;
    s.heads = 3;
    s.seq = 67;
  } else {
    s.batch = 1;
    s.heads = 3;
    s.cu_seqlens = {0, 17, 81, 82, 130};
    s.seq = s.cu_seqlens.back();
  }
  return s;
}

std::string attn_case_name(const testing::TestParamInfo<AttnCase>& info) {
  const AttnCase& c = info.param;
  return fmt::format("{}_{}_{}_{}", to_string(c.impl), to_string(c.dtype), kind_name(c.kind),
                     c.backward ? "fwd_bwd" : "fwd");
}

std::vector<AttnCase> attn_cases() {
  std::vector<AttnCase> out;
  const std::vector<std::pair<AttnImpl, DType>> impls = {{AttnImpl::naive, DType::fp32},
                                                         {AttnImpl::naive, DType::bf16},
                                                         {AttnImpl::naive, DType::fp16},
                                                         {AttnImpl::cudnn, DType::bf16},
                                                         {AttnImpl::cudnn, DType::fp16}};
  for (auto [impl, dtype] : impls)
    for (AttnKind k : {AttnKind::dense, AttnKind::causal, AttnKind::varlen, AttnKind::varlen_causal})
      for (bool bwd : {false, true}) out.push_back({impl, dtype, k, bwd});
  return out;
}

// One device for the whole suite: its cuDNN handle and graph cache carry
// from case to case, so each (shape, dtype, mask) graph is built once rather
// than once per test (a build can take a second).
class AttentionTest : public testing::TestWithParam<AttnCase> {
 protected:
  static void SetUpTestSuite() { dev_ = open_gpu(); }
  static void TearDownTestSuite() { dev_.reset(); }
  static std::unique_ptr<Device> dev_;
};
std::unique_ptr<Device> AttentionTest::dev_;

// The check the CLI runs before timing: a double-precision host reference of
// O (and dQ, dK, dV) on the same inputs rounded to the dtype.
TEST_P(AttentionTest, MatchesHostReference) {
  const AttnCase c = GetParam();
  Device& dev = *dev_;
  if (auto why = dev.attention_unsupported(c.impl, c.dtype)) GTEST_SKIP() << *why;
  const AttnShape shape = attn_shape(c.kind);
  // The one refusal that is not a defect: cuDNN with no engine for the varlen shapes' 1-token sequence
  // (cu_seqlens 81..82: s_q = 1; not yet seen on a GPU either way). Then the same shape without that
  // sequence must run and match: the varlen path is still checked, and what was left out is recorded
  // with cuDNN's reason. Any other refusal (a dense or causal shape, naive attention, the varlen shape
  // without the 1-token sequence) fails, as does a wrong answer.
  const bool may_refuse = c.impl == AttnImpl::cudnn && (c.kind == AttnKind::varlen || c.kind == AttnKind::varlen_causal);
  AttnCheck r;
  try {
    r = check_attention(dev, shape, c.impl, c.dtype, c.backward, 21, kTimeout);
  } catch (const UnsupportedError& e) {
    if (!may_refuse) throw;
    AttnShape without_one = shape;
    without_one.cu_seqlens = {0, 17, 81, 129};  // the 1-token sequence dropped, the others as they were
    without_one.seq = without_one.cu_seqlens.back();
    RecordProperty("left_out", std::string("the 1-token sequence (cuDNN refused it): ") + e.what());
    std::printf("note: cuDNN refused the varlen shape with a 1-token sequence (%s); checking it without\n", e.what());
    r = check_attention(dev, without_one, c.impl, c.dtype, c.backward, 21, kTimeout);
  }
  EXPECT_TRUE(r.checked);
  EXPECT_TRUE(r.ok) << r.wrong << " wrong; worst " << r.worst_tensor << "[" << r.worst_index << "] |err| "
                    << r.worst_err << " > tol " << r.worst_tol << " (" << r.impl << "): " << r.first_mismatches;
}

INSTANTIATE_TEST_SUITE_P(ImplsDtypesMasks, AttentionTest, testing::ValuesIn(attn_cases()), attn_case_name);

TEST(CudaAttention, ReportsImplementationAndWorkspace) {
  auto dev = open_gpu();
  AttnShape s;
  s.batch = 2;
  s.heads = 4;
  s.seq = 128;
  s.head_dim = 64;
  auto naive = dev->make_attention(s, AttnImpl::naive, DType::bf16, 1);
  EXPECT_EQ(naive->impl(), AttnImpl::naive);
  EXPECT_EQ(naive->dtype(), DType::bf16);
  EXPECT_NE(naive->impl_detail().find("cuBLAS"), std::string::npos) << naive->impl_detail();
  // S and dP in fp32, P and dS in bf16: B*H*S^2 * (4 + 2 + 2) bytes.
  EXPECT_EQ(naive->workspace_bytes(), std::size_t(2 * 4 * 128 * 128) * 8u);
  if (!dev->attention_unsupported(AttnImpl::cudnn, DType::bf16)) {
    auto cudnn = dev->make_attention(s, AttnImpl::cudnn, DType::bf16, 1);
    EXPECT_EQ(cudnn->impl(), AttnImpl::cudnn);
    EXPECT_NE(cudnn->impl_detail().find("cuDNN"), std::string::npos) << cudnn->impl_detail();
    // The statistics (B*H*S fp32) at least; no S x S buffer.
    EXPECT_GE(cudnn->workspace_bytes(), std::size_t(2 * 4 * 128) * 4u);
    std::printf("  cudnn: %s, workspace %zu bytes\n", cudnn->impl_detail().c_str(), cudnn->workspace_bytes());
  }
}

TEST(CudaAttention, CudnnFp32IsUnsupportedWithReason) {
  auto dev = open_gpu();
  for (DType d : {DType::fp32, DType::tf32}) {
    const auto why = dev->attention_unsupported(AttnImpl::cudnn, d);
    ASSERT_TRUE(why.has_value()) << to_string(d);
#ifdef STALLBENCH_HAVE_CUDNN
    EXPECT_EQ(*why, "cuDNN has no fp32 SDPA");
#else
    EXPECT_NE(why->find("built without cudnn-frontend"), std::string::npos) << *why;
#endif
    AttnShape s;
    EXPECT_THROW(dev->make_attention(s, AttnImpl::cudnn, d, 1), UnsupportedError);
  }
  // No hand-written flash kernel on cuda; fp8 has no naive path.
  EXPECT_TRUE(dev->attention_unsupported(AttnImpl::flash, DType::bf16).has_value());
  EXPECT_TRUE(dev->attention_unsupported(AttnImpl::naive, DType::fp8_e4m3).has_value());
}

TEST(CudaAttention, CudnnRejectsHeadDimNotMultipleOf8) {
  auto dev = open_gpu();
  if (auto why = dev->attention_unsupported(AttnImpl::cudnn, DType::bf16)) GTEST_SKIP() << *why;
  AttnShape s;
  s.head_dim = 60;
  EXPECT_THROW(dev->make_attention(s, AttnImpl::cudnn, DType::bf16, 1), UnsupportedError);
}

TEST(CudaAttention, BadVarlenIsAUsageError) {
  auto dev = open_gpu();
  AttnShape s;
  s.seq = 100;
  s.cu_seqlens = {0, 60, 50, 100};  // decreasing
  EXPECT_THROW(dev->make_attention(s, AttnImpl::naive, DType::fp32, 1), UsageError);
  s.cu_seqlens = {0, 60, 90};  // does not end at S
  EXPECT_THROW(dev->make_attention(s, AttnImpl::naive, DType::fp32, 1), UsageError);
}

// The ledger: allocate() books every cudaMalloc and its release.
TEST(CudaMemory, LedgerTracksAllocationsAndPeak) {
  auto dev = open_gpu();
  const auto before = dev->memory_stats();
  EXPECT_NE(before.source.find("cudaMemGetInfo"), std::string::npos) << before.source;
  EXPECT_EQ(before.limit, 0u);
  const std::size_t mib = 1 << 20;
  {
    Buffer a = dev->allocate(8 * mib, MemKind::device);
    Buffer host = dev->allocate(mib, MemKind::host_pinned);  // not device memory: not booked
    const auto during = dev->memory_stats();
    EXPECT_EQ(during.in_use, before.in_use + 8 * mib);
    EXPECT_GE(during.peak, during.in_use);
  }
  const auto after = dev->memory_stats();
  EXPECT_EQ(after.in_use, before.in_use);
  EXPECT_GE(after.peak, before.in_use + 8 * mib);
  dev->reset_peak_memory();
  EXPECT_EQ(dev->memory_stats().peak, after.in_use);
}

TEST(CudaMemory, LimitMakesLargerAllocationsOutOfMemory) {
  auto dev = open_gpu();
  const std::size_t mib = 1 << 20;
  const std::size_t base = dev->memory_stats().in_use;
  dev->set_memory_limit(base + 16 * mib);
  EXPECT_EQ(dev->memory_stats().limit, base + 16 * mib);
  EXPECT_NO_THROW((void)dev->allocate(8 * mib, MemKind::device));
  try {
    (void)dev->allocate(32 * mib, MemKind::device);
    FAIL() << "a 32 MiB allocation under a 16 MiB limit succeeded";
  } catch (const OutOfMemory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(std::to_string(32 * mib)), std::string::npos) << what;
    EXPECT_NE(what.find("limit"), std::string::npos) << what;
  }
  EXPECT_EQ(dev->memory_stats().in_use, base);  // the refused request left nothing booked
  dev->set_memory_limit(0);
  EXPECT_NO_THROW((void)dev->allocate(32 * mib, MemKind::device));
}

// Naive attention's S x S buffers are what a long sequence cannot afford: the
// error names the buffer and its bytes, and the device stays usable.
TEST(CudaAttention, NaiveOutOfMemoryUnderLimitNamesTheBytes) {
  auto dev = open_gpu();
  AttnShape small;
  (void)dev->make_attention(small, AttnImpl::naive, DType::bf16, 1);  // makes the cuBLAS handle and workspace
  const std::size_t base = dev->memory_stats().in_use;
  dev->set_memory_limit(base + (256u << 20));  // 256 MiB on top of what is held
  AttnShape big;
  big.batch = 1;
  big.heads = 8;
  big.seq = 8192;
  big.head_dim = 64;
  const std::size_t s_bytes = std::size_t(8) * 8192 * 8192 * 4;  // 2 GiB of fp32 scores
  try {
    (void)dev->make_attention(big, AttnImpl::naive, DType::bf16, 1);
    FAIL() << "naive attention at S=8192 fit under a 256 MiB limit";
  } catch (const OutOfMemory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(std::to_string(s_bytes)), std::string::npos) << what;
    EXPECT_NE(what.find("S=8192"), std::string::npos) << what;
  }
  EXPECT_EQ(dev->memory_stats().in_use, base);
  // cuDNN SDPA needs no S x S buffer: the same shape fits under the limit.
  if (!dev->attention_unsupported(AttnImpl::cudnn, DType::bf16)) {
    auto op = dev->make_attention(big, AttnImpl::cudnn, DType::bf16, 1);
    op->forward();
    op->backward();
    EXPECT_NO_THROW(dev->synchronize(kTimeout));
  }
  dev->set_memory_limit(0);
  auto op = dev->make_attention(small, AttnImpl::naive, DType::bf16, 2);
  op->forward();
  EXPECT_NO_THROW(dev->synchronize(kTimeout));
}

// Not a performance test: prints what each implementation reaches at a
// moderate size, so a run's log shows them side by side.
TEST(CudaAttention, EventsTimeForwardAndBackward) {
  auto dev = open_gpu();
  AttnShape s;
  s.batch = 1;
  s.heads = 16;
  s.seq = 2048;
  s.head_dim = 128;
  s.causal = true;
  for (AttnImpl impl : {AttnImpl::naive, AttnImpl::cudnn}) {
    if (dev->attention_unsupported(impl, DType::bf16)) continue;
    auto op = dev->make_attention(s, impl, DType::bf16, 3);
    op->forward();
    op->backward();  // warm-up
    auto t0 = dev->record();
    op->forward();
    auto t1 = dev->record();
    op->backward();
    auto t2 = dev->record();
    dev->synchronize(kTimeout);
    const double fwd_ms = dev->elapsed_ms(t0, t1), bwd_ms = dev->elapsed_ms(t1, t2);
    EXPECT_GT(fwd_ms, 0.0);
    EXPECT_GT(bwd_ms, 0.0);
    // docs/DESIGN.md: forward 4*B*H*S^2*D halved for causal; backward 2.5x forward.
    const double f = s.fwd_flops();
    std::printf("  %s bf16 causal S=%lld: fwd %.3f ms (%.1f TFLOPS), bwd %.3f ms (%.1f TFLOPS), workspace %zu\n",
                std::string(to_string(impl)).c_str(), (long long)s.seq, fwd_ms, f / (fwd_ms * 1e-3) / 1e12, bwd_ms,
                2.5 * f / (bwd_ms * 1e-3) / 1e12, op->workspace_bytes());
  }
}

// ---- Training ops (harness/train_ops.hpp) ----
//
// The same small sequence runs on the cuda device's TrainOps and on a host
// reference that computes each op's definition in the header in double and
// rounds what it stores to the tensor's dtype (harness round_to: nearest
// even), then the two are compared with tolerances by dtype. The reference is
// a TrainOps too, so the sequence is written once; the cpu device's TrainOps
// could stand in for it (make_cpu_backend().open(0)->make_train_ops()) once
// this binary links kernels_cpu_lib, which tests/meson.build does not.

// Host tensors hold one float per element (already rounded to the dtype),
// whatever the dtype: only this class reads them.
class HostRefOps final : public TrainOps {
 public:
  std::string impl() const override { return "host reference (double, rounded on store)"; }
  std::string gemm_impl(DType) const override { return "host loops in double"; }

  DTensor alloc(std::int64_t numel, DType dtype, const std::string&) override {
    const std::size_t bytes = std::size_t(numel) * sizeof(float);
    void* p = std::calloc(std::size_t(numel) + 1, sizeof(float));
    if (p == nullptr) throw OutOfMemory("host reference tensor");
    DTensor t;
    t.buf = Buffer(p, bytes, MemKind::host_pageable, [](void* q) { std::free(q); });
    t.dtype = dtype;
    t.numel = numel;
    return t;
  }
  void upload(DTensor& t, std::span<const float> host) override {
    for (std::size_t i = 0; i < host.size(); ++i) put(t, std::int64_t(i), host[i]);
  }
  void download(const DTensor& t, std::span<float> host, std::int64_t) override {
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = get(t, std::int64_t(i));
  }

  void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const DTensor& a,
            const DTensor& b, float beta, DTensor& c) override {
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t q = 0; q < k; ++q)
          s += double(get(a, ta ? q * m + i : i * k + q)) * double(get(b, tb ? j * k + q : q * n + j));
        const double old = beta != 0.0f ? double(beta) * get(c, i * n + j) : 0.0;
        put(c, i * n + j, double(alpha) * s + old);
      }
  }
  void cast(const DTensor& src, DTensor& dst, std::int64_t n) override {
    for (std::int64_t i = 0; i < n; ++i) put(dst, i, get(src, i));
  }
  void bias_act(DTensor& z, const DTensor* bias, Act act, const DTensor* residual, DTensor& y, std::int64_t rows,
                std::int64_t cols) override {
    for (std::int64_t i = 0; i < rows * cols; ++i) {
      if (bias != nullptr) put(z, i, double(get(z, i)) + get(*bias, i % cols));
      double v = act_fwd(act, get(z, i));
      if (residual != nullptr) v += get(*residual, i);
      put(y, i, v);
    }
  }
  void act_backward(const DTensor& dy, const DTensor& z, Act act, DTensor& dz, std::int64_t n) override {
    for (std::int64_t i = 0; i < n; ++i) put(dz, i, act_bwd(act, get(dy, i), get(z, i)));
  }
  void bias_grad(const DTensor& dz, DTensor& db, std::int64_t rows, std::int64_t cols) override {
    for (std::int64_t j = 0; j < cols; ++j) {
      double s = 0;
      for (std::int64_t r = 0; r < rows; ++r) s += get(dz, r * cols + j);
      put(db, j, s);
    }
  }
  void rmsnorm(const DTensor& x, DTensor& y, DTensor& rstd, std::int64_t rows, std::int64_t cols,
               float eps) override {
    for (std::int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (std::int64_t j = 0; j < cols; ++j) ss += double(get(x, r * cols + j)) * get(x, r * cols + j);
      const double inv = 1.0 / std::sqrt(ss / double(cols) + double(eps));
      put(rstd, r, inv);
      for (std::int64_t j = 0; j < cols; ++j) put(y, r * cols + j, get(x, r * cols + j) * inv);
    }
  }
  void rmsnorm_backward(const DTensor& dy, const DTensor& y, const DTensor& rstd, DTensor& dx, std::int64_t rows,
                        std::int64_t cols) override {
    for (std::int64_t r = 0; r < rows; ++r) {
      double dot = 0;
      for (std::int64_t j = 0; j < cols; ++j) dot += double(get(dy, r * cols + j)) * get(y, r * cols + j);
      dot /= double(cols);
      for (std::int64_t j = 0; j < cols; ++j)
        put(dx, r * cols + j, double(get(rstd, r)) * (get(dy, r * cols + j) - get(y, r * cols + j) * dot));
    }
  }
  void mse_loss(const DTensor& y, const DTensor& target, DTensor& loss, DTensor& dy, std::int64_t n,
                float scale) override {
    double s = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const double d = double(get(y, i)) - get(target, i);
      s += d * d;
      put(dy, i, double(scale) * 2.0 * d / double(n));
    }
    put(loss, 0, s / double(n));
  }
  void xent_loss(const DTensor& logits, const DTensor& labels, DTensor& loss, DTensor& dlogits, std::int64_t rows,
                 std::int64_t classes, float scale) override {
    double total = 0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t base = r * classes, label = std::int64_t(get(labels, r));
      double m = -INFINITY, sum = 0;
      for (std::int64_t j = 0; j < classes; ++j) m = std::max(m, double(get(logits, base + j)));
      for (std::int64_t j = 0; j < classes; ++j) sum += std::exp(get(logits, base + j) - m);
      total += m + std::log(sum) - get(logits, base + label);
      for (std::int64_t j = 0; j < classes; ++j) {
        const double p = std::exp(get(logits, base + j) - m) / sum;
        put(dlogits, base + j, double(scale) * (p - (j == label ? 1.0 : 0.0)) / double(rows));
      }
    }
    put(loss, 0, total / double(rows));
  }
  void stats(const DTensor& t, std::int64_t n, DTensor& out, std::int64_t slot) override {
    double s[kStatsPerTensor] = {0, 0, 0, 0};
    for (std::int64_t i = 0; i < n; ++i) {
      const double v = get(t, i);
      if (!std::isfinite(v)) {
        s[1] += 1;
      } else {
        s[0] += v * v;
        if (v == 0) s[2] += 1;
        else if (std::fabs(v) < std::ldexp(1.0, -14)) s[3] += 1;
      }
    }
    for (int q = 0; q < kStatsPerTensor; ++q) put(out, slot * kStatsPerTensor + q, s[q]);
  }
  void poke(DTensor& t, std::int64_t index, float value) override { put(t, index, value); }
  void zero(DTensor& t) override {
    for (std::int64_t i = 0; i < t.numel; ++i) put(t, i, 0.0f);
  }
  void sgd(DTensor& p, const DTensor& g, std::int64_t n, float lr, float weight_decay, float grad_scale) override {
    for (std::int64_t i = 0; i < n; ++i) {
      const double gv = double(get(g, i)) * grad_scale, pv = get(p, i);
      put(p, i, pv - double(lr) * double(weight_decay) * pv - double(lr) * gv);
    }
  }
  void adamw(DTensor& p, const DTensor& g, DTensor& m, DTensor& v, std::int64_t n, float lr, float beta1,
             float beta2, float eps, float weight_decay, int step, float grad_scale) override {
    const double bc1 = 1.0 - std::pow(double(beta1), step), bc2 = 1.0 - std::pow(double(beta2), step);
    for (std::int64_t i = 0; i < n; ++i) {
      const double gv = double(get(g, i)) * grad_scale;
      const double mi = double(beta1) * get(m, i) + (1.0 - beta1) * gv;
      const double vi = double(beta2) * get(v, i) + (1.0 - beta2) * gv * gv;
      put(m, i, mi);
      put(v, i, vi);
      double pv = double(get(p, i)) * (1.0 - double(lr) * weight_decay);
      pv -= double(lr) * (mi / bc1) / (std::sqrt(vi / bc2) + double(eps));
      put(p, i, pv);
    }
  }

 private:
  static float get(const DTensor& t, std::int64_t i) { return static_cast<const float*>(t.data())[i]; }
  static void put(DTensor& t, std::int64_t i, double v) {
    static_cast<float*>(t.data())[i] = round_to(t.dtype, float(v));
  }
  static double act_fwd(Act a, double x) {
    constexpr double kBeta = 0.7978845608028654, kKappa = 0.044715;
    switch (a) {
      case Act::none: return x;
      case Act::relu: return (x > 0 || std::isnan(x)) ? x : 0.0;
      case Act::gelu: return 0.5 * x * (1.0 + std::tanh(kBeta * (x + kKappa * x * x * x)));
      case Act::sigmoid: return 1.0 / (1.0 + std::exp(-x));
      case Act::tanh: return std::tanh(x);
    }
    return x;
  }
  static double act_bwd(Act a, double dy, double z) {
    constexpr double kBeta = 0.7978845608028654, kKappa = 0.044715;
    switch (a) {
      case Act::none: return dy;
      case Act::relu: return z > 0 ? dy : 0.0;
      case Act::gelu: {
        const double t = std::tanh(kBeta * (z + kKappa * z * z * z));
        return dy * (0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * kBeta * (1.0 + 3.0 * kKappa * z * z));
      }
      case Act::sigmoid: {
        const double s = 1.0 / (1.0 + std::exp(-z));
        return dy * s * (1.0 - s);
      }
      case Act::tanh: {
        const double t = std::tanh(z);
        return dy * (1.0 - t * t);
      }
    }
    return dy;
  }
};

// One tensor on both sides: [0] the cuda device, [1] the host reference.
struct Twin {
  DTensor t[2];
};

// Relative tolerance of one stored value: two units in the last place of the
// dtype (the two sides may round a value on either side of a boundary, and an
// intermediate they stored may differ the same way); fp32 values are computed
// in fp32 on the device against double on the host.
double value_rtol(DType d) { return d == DType::fp32 ? 2e-5 : 4.0 * unit_roundoff(d); }
// Absolute slack for a value computed from stored intermediates that the two
// sides may have rounded one unit apart (bf16: 2^-8 of values near 1), where
// a sum can cancel to far below them.
double carried_atol(DType d) { return d == DType::fp32 ? 1e-5 : 2e-2; }

class TrainOpsPair {
 public:
  TrainOpsPair(TrainOps& dev, TrainOps& ref) : ops_{&dev, &ref} {}

  Twin tensor(const std::vector<float>& values, DType d, const std::string& name) {
    Twin w = zeros(std::int64_t(values.size()), d, name);
    for (int s = 0; s < 2; ++s) ops_[s]->upload(w.t[s], values);
    return w;
  }
  Twin zeros(std::int64_t n, DType d, const std::string& name) {
    Twin w;
    for (int s = 0; s < 2; ++s) w.t[s] = ops_[s]->alloc(n, d, name);
    return w;
  }
  // Runs f on each side with that side's ops and the index of its tensors.
  template <class F>
  void both(F f) {
    for (int s = 0; s < 2; ++s) f(*ops_[s], s);
  }
  std::vector<float> values(const Twin& w, int side) {
    std::vector<float> out(std::size_t(w.t[side].numel));
    ops_[side]->download(w.t[side], out, 30000);
    return out;
  }
  // "" or a report of the first mismatches: |dev - ref| <= atol + rtol |ref|;
  // NaN matches NaN and an infinity the same infinity.
  std::string compare(const Twin& w, const std::string& what, double rtol, double atol) {
    const std::vector<float> dev = values(w, 0), ref = values(w, 1);
    std::string report;
    std::int64_t bad = 0;
    for (std::size_t i = 0; i < dev.size(); ++i) {
      const double a = dev[i], b = ref[i];
      bool ok;
      if (std::isnan(b) || std::isinf(b))
        ok = (std::isnan(a) && std::isnan(b)) || a == b;
      else
        ok = std::isfinite(a) && std::fabs(a - b) <= atol + rtol * std::fabs(b);
      if (!ok && bad++ < 5)
        report += fmt::format("  [{}]: cuda {:.8g}, reference {:.8g} (tol {:.3g})\n", i, a, b,
                              atol + rtol * std::fabs(b));
    }
    if (bad == 0) return "";
    return fmt::format("{}: {} of {} values differ:\n{}", what, bad, dev.size(), report);
  }

 private:
  TrainOps* ops_[2];
};

std::vector<float> uniform_values(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::unique_ptr<TrainOps> gpu_train_ops(Device& dev) {
  auto ops = dev.make_train_ops();
  EXPECT_TRUE(ops->computes());
  EXPECT_NE(ops->impl().find("cublasGemmEx"), std::string::npos) << ops->impl();
  return ops;
}

class TrainOpsTest : public testing::TestWithParam<DType> {};

std::string dtype_name(const testing::TestParamInfo<DType>& info) { return std::string(to_string(info.param)); }

// The three GEMMs of a Linear and the fourth transpose combination, with
// non-square odd sizes (a wrong leading dimension or operand order cannot
// pass), C in fp32 and in the input dtype, and beta = 1 accumulating.
TEST_P(TrainOpsTest, GemmAllTransposesMatchReference) {
  const DType dt = GetParam();
  auto dev = open_gpu();
  auto ops = gpu_train_ops(*dev);
  HostRefOps ref;
  TrainOpsPair p(*ops, ref);
  const std::int64_t m = 23, n = 37, k = 41;
  const double acc = dt == DType::fp32 ? 1e-6 : 1e-4;  // of sum |a||b| <= k: fp32 accumulation
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (DType cd : {DType::fp32, dt}) {
        const std::string what = fmt::format("{} gemm ta={} tb={} C {}", to_string(dt), ta, tb, to_string(cd));
        Twin a = p.tensor(uniform_values(std::size_t(m * k), 10 + std::uint64_t(2 * ta + tb)), dt, "A");
        Twin b = p.tensor(uniform_values(std::size_t(k * n), 20 + std::uint64_t(2 * ta + tb)), dt, "B");
        Twin c = p.tensor(uniform_values(std::size_t(m * n), 30), cd, "C");  // beta 0: never read
        p.both([&](TrainOps& o, int s) { o.gemm(ta, tb, m, n, k, 0.5f, a.t[s], b.t[s], 0.0f, c.t[s]); });
        EXPECT_EQ(p.compare(c, what, value_rtol(cd), acc * double(k)), "");
        p.both([&](TrainOps& o, int s) { o.gemm(ta, tb, m, n, k, 1.0f, a.t[s], b.t[s], 1.0f, c.t[s]); });
        EXPECT_EQ(p.compare(c, what + " beta=1", value_rtol(cd), 2 * acc * double(k)), "");
      }
}

// Every activation forward (with bias and residual, and bare) and backward,
// and the bias gradient.
TEST_P(TrainOpsTest, BiasActBackwardAndBiasGradMatchReference) {
  const DType dt = GetParam();
  auto dev = open_gpu();
  auto ops = gpu_train_ops(*dev);
  HostRefOps ref;
  TrainOpsPair p(*ops, ref);
  const std::int64_t rows = 19, cols = 45, n = rows * cols;
  const double rtol = value_rtol(dt), atol = 1e-6;
  for (Act act : {Act::none, Act::relu, Act::gelu, Act::sigmoid, Act::tanh}) {
    const std::string name = fmt::format("{} {}", to_string(dt), to_string(act));
    Twin z = p.tensor(uniform_values(std::size_t(n), 40, -4.0f, 4.0f), dt, "z");
    Twin bias = p.tensor(uniform_values(std::size_t(cols), 41), DType::fp32, "bias");
    Twin res = p.tensor(uniform_values(std::size_t(n), 42), dt, "residual");
    Twin y = p.zeros(n, dt, "y");
    p.both([&](TrainOps& o, int s) { o.bias_act(z.t[s], &bias.t[s], act, &res.t[s], y.t[s], rows, cols); });
    EXPECT_EQ(p.compare(z, name + " z + bias", rtol, atol), "");
    EXPECT_EQ(p.compare(y, name + " y = act(z) + residual", rtol, atol), "");
    Twin y2 = p.zeros(n, dt, "y2");
    p.both([&](TrainOps& o, int s) { o.bias_act(z.t[s], nullptr, act, nullptr, y2.t[s], rows, cols); });
    EXPECT_EQ(p.compare(y2, name + " y = act(z)", rtol, atol), "");

    Twin dy = p.tensor(uniform_values(std::size_t(n), 43), dt, "dy");
    Twin dz = p.zeros(n, dt, "dz");
    p.both([&](TrainOps& o, int s) { o.act_backward(dy.t[s], z.t[s], act, dz.t[s], n); });
    EXPECT_EQ(p.compare(dz, name + " act_backward", rtol, atol), "");
    for (DType bd : {DType::fp32, dt}) {
      Twin db = p.zeros(cols, bd, "db");
      p.both([&](TrainOps& o, int s) { o.bias_grad(dz.t[s], db.t[s], rows, cols); });
      EXPECT_EQ(p.compare(db, name + " bias_grad in " + std::string(to_string(bd)), value_rtol(bd), carried_atol(dt)),
                "");
    }
  }
}

TEST_P(TrainOpsTest, RmsnormForwardBackwardMatchReference) {
  const DType dt = GetParam();
  auto dev = open_gpu();
  auto ops = gpu_train_ops(*dev);
  HostRefOps ref;
  TrainOpsPair p(*ops, ref);
  // 300 columns: more than one pass of a 256-thread block per row.
  const std::int64_t rows = 7, cols = 300, n = rows * cols;
  Twin x = p.tensor(uniform_values(std::size_t(n), 50, -3.0f, 3.0f), dt, "x");
  Twin y = p.zeros(n, dt, "y");
  Twin rstd = p.zeros(rows, DType::fp32, "rstd");
  p.both([&](TrainOps& o, int s) { o.rmsnorm(x.t[s], y.t[s], rstd.t[s], rows, cols, 1e-5f); });
  EXPECT_EQ(p.compare(rstd, "rstd", 1e-5, 0), "");
  EXPECT_EQ(p.compare(y, "rmsnorm y", value_rtol(dt), 1e-6), "");
  Twin dy = p.tensor(uniform_values(std::size_t(n), 51), dt, "dy");
  Twin dx = p.zeros(n, dt, "dx");
  p.both([&](TrainOps& o, int s) { o.rmsnorm_backward(dy.t[s], y.t[s], rstd.t[s], dx.t[s], rows, cols); });
  EXPECT_EQ(p.compare(dx, "rmsnorm dx", value_rtol(dt), carried_atol(dt)), "");
}

TEST_P(TrainOpsTest, LossesMatchReference) {
  const DType dt = GetParam();
  auto dev = open_gpu();
  auto ops = gpu_train_ops(*dev);
  HostRefOps ref;
  TrainOpsPair p(*ops, ref);
  const float scale = 1024.0f;  // a loss scale: dy carries it, the loss does not
  {
    const std::int64_t n = 5000;  // more than one block
    Twin y = p.tensor(uniform_values(std::size_t(n), 60), dt, "y");
    Twin t = p.tensor(uniform_values(std::size_t(n), 61), dt, "target");
    Twin loss = p.zeros(1, DType::fp32, "loss");
    Twin dy = p.zeros(n, dt, "dy");
    p.both([&](TrainOps& o, int s) { o.mse_loss(y.t[s], t.t[s], loss.t[s], dy.t[s], n, scale); });
    EXPECT_EQ(p.compare(loss, "mse loss", 1e-5, 0), "");
    EXPECT_EQ(p.compare(dy, "mse dy", value_rtol(dt), 1e-7), "");
  }
  {
    // 1100 rows: more rows than the loss has partial sums, so blocks take
    // several rows; 300 classes: several passes per row.
    const std::int64_t rows = 1100, classes = 300;
    Twin logits = p.tensor(uniform_values(std::size_t(rows * classes), 62, -6.0f, 6.0f), dt, "logits");
    std::vector<float> labels(static_cast<std::size_t>(rows));
    for (std::size_t r = 0; r < labels.size(); ++r) labels[r] = float((r * 37) % std::size_t(classes));
    Twin lab = p.tensor(labels, DType::fp32, "labels");
    Twin loss = p.zeros(1, DType::fp32, "loss");
    Twin dl = p.zeros(rows * classes, dt, "dlogits");
    p.both([&](TrainOps& o, int s) { o.xent_loss(logits.t[s], lab.t[s], loss.t[s], dl.t[s], rows, classes, scale); });
    EXPECT_EQ(p.compare(loss, "xent loss", 1e-5, 0), "");
    EXPECT_EQ(p.compare(dl, "xent dlogits", value_rtol(dt), 1e-7), "");
    // The same loss in place (dlogits over the logits).
    Twin again = p.tensor(p.values(logits, 1), dt, "logits in place");
    p.both([&](TrainOps& o, int s) {
      o.xent_loss(again.t[s], lab.t[s], loss.t[s], again.t[s], rows, classes, scale);
    });
    EXPECT_EQ(p.compare(loss, "xent loss in place", 1e-5, 0), "");
    EXPECT_EQ(p.compare(again, "xent dlogits in place", value_rtol(dt), 1e-7), "");
  }
}

// Planted NaN, infinities, zeros and values below 2^-14, in slot 1 of the
// output; stats twice into one slot is not a sum of the two; poke plants one.
TEST_P(TrainOpsTest, StatsCountPlantedValuesAndPokeInjects) {
  const DType dt = GetParam();
  auto dev = open_gpu();
  auto ops = gpu_train_ops(*dev);
  HostRefOps ref;
  TrainOpsPair p(*ops, ref);
  std::vector<float> v = uniform_values(3000, 70, 0.5f, 2.0f);  // all normal and nonzero
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<std::pair<std::size_t, float>> planted = {
      {3, nan}, {100, inf}, {101, -inf}, {500, 0.0f}, {501, -0.0f}, {502, 0.0f},
      {900, 1e-6f}, {901, -3e-5f}, {902, 6e-5f}, {903, 7e-5f}, {2999, nan}};
  for (const auto& [i, x] : planted) v[i] = x;
  Twin t = p.tensor(v, dt, "t");
  Twin out = p.zeros(3 * kStatsPerTensor, DType::fp32, "stats");
  p.both([&](TrainOps& o, int s) {
    o.stats(t.t[s], std::int64_t(v.size()), out.t[s], 1);
    o.stats(t.t[s], std::int64_t(v.size()), out.t[s], 1);
  });
  EXPECT_EQ(p.compare(out, "stats", 1e-5, 0), "");
  const std::vector<float> got = p.values(out, 0);
  const TensorStats st = read_stats(got, 1);
  EXPECT_EQ(st.nonfinite, 4);
  EXPECT_EQ(st.zero, 3);
  EXPECT_EQ(st.tiny, 3);  // 1e-6, -3e-5, 6e-5 (7e-5 is above 2^-14 ~ 6.1e-5)
  EXPECT_EQ(read_stats(got, 0).sumsq, 0);  // other slots untouched
  EXPECT_EQ(read_stats(got, 2).sumsq, 0);

  p.both([&](TrainOps& o, int s) {
    o.poke(t.t[s], 7, nan);
    o.stats(t.t[s], std::int64_t(v.size()), out.t[s], 0);
  });
  EXPECT_EQ(p.compare(t, "after poke", 0, 0), "");
  EXPECT_EQ(read_stats(p.values(out, 0), 0).nonfinite, 5);
}

// One SGD step and three AdamW steps, g in the dtype scaled by grad_scale.
TEST_P(TrainOpsTest, OptimizersMatchReference) {
  const DType dt = GetParam();
  auto dev = open_gpu();
  auto ops = gpu_train_ops(*dev);
  HostRefOps ref;
  TrainOpsPair p(*ops, ref);
  const std::int64_t n = 3000;
  Twin w = p.tensor(uniform_values(std::size_t(n), 80), DType::fp32, "p sgd");
  Twin g = p.tensor(uniform_values(std::size_t(n), 81, -4.0f, 4.0f), dt, "g");
  p.both([&](TrainOps& o, int s) { o.sgd(w.t[s], g.t[s], n, 0.1f, 0.01f, 0.25f); });
  EXPECT_EQ(p.compare(w, "sgd p", 1e-6, 1e-6), "");

  Twin pa = p.tensor(uniform_values(std::size_t(n), 82), DType::fp32, "p adamw");
  Twin m = p.zeros(n, DType::fp32, "m");
  Twin v = p.zeros(n, DType::fp32, "v");
  for (int step = 1; step <= 3; ++step) {
    Twin gs = p.tensor(uniform_values(std::size_t(n), 90 + std::uint64_t(step), -2.0f, 2.0f), dt, "g step");
    p.both([&](TrainOps& o, int s) {
      o.adamw(pa.t[s], gs.t[s], m.t[s], v.t[s], n, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, step, 0.5f);
    });
  }
  EXPECT_EQ(p.compare(m, "adamw m", 1e-5, 1e-7), "");
  EXPECT_EQ(p.compare(v, "adamw v", 1e-5, 1e-9), "");
  EXPECT_EQ(p.compare(pa, "adamw p", 1e-5, 1e-6), "");
}

INSTANTIATE_TEST_SUITE_P(Fp32Bf16, TrainOpsTest, testing::Values(DType::fp32, DType::bf16), dtype_name);

// Casts between the three dtypes, fp16's overflow to inf and flush to zero
// included; a same-dtype cast copies.
TEST(CudaTrainOps, CastsRoundAsTheDtypesDo) {
  auto dev = open_gpu();
  auto ops = gpu_train_ops(*dev);
  HostRefOps ref;
  TrainOpsPair p(*ops, ref);
  std::vector<float> v = uniform_values(1000, 100, -3.0f, 3.0f);
  const std::vector<float> special = {70000.0f, -70000.0f, 65504.0f, 1e-8f, 3e-8f, 1e-6f, 1e-40f, 0.0f,
                                      std::numeric_limits<float>::infinity(),
                                      std::numeric_limits<float>::quiet_NaN()};
  std::copy(special.begin(), special.end(), v.begin());
  const auto n = std::int64_t(v.size());
  for (DType from : {DType::fp32, DType::bf16, DType::fp16})
    for (DType to : {DType::fp32, DType::bf16, DType::fp16}) {
      Twin src = p.tensor(v, from, "src");
      Twin dst = p.zeros(n, to, "dst");
      p.both([&](TrainOps& o, int s) { o.cast(src.t[s], dst.t[s], n); });
      EXPECT_EQ(p.compare(dst, fmt::format("cast {} -> {}", to_string(from), to_string(to)), 0, 0), "");
    }
  Twin h = p.tensor(v, DType::fp16, "fp16");
  const std::vector<float> got = p.values(h, 0);
  EXPECT_TRUE(std::isinf(got[0]) && got[0] > 0);  // past 65504
  EXPECT_EQ(got[2], 65504.0f);
  EXPECT_EQ(got[3], 0.0f);                         // below 2^-25: flushed
  EXPECT_EQ(got[4], std::ldexp(1.0f, -24));        // the smallest subnormal
}

// Tensors come through the device's allocator: the ledger sees them, a cap
// makes alloc throw OutOfMemory naming the tensor, and alloc zero-fills.
TEST(CudaTrainOps, AllocIsLedgeredZeroedAndOutOfMemoryNamesTheTensor) {
  auto dev = open_gpu();
  auto ops = gpu_train_ops(*dev);
  const std::size_t base = dev->memory_stats().in_use;
  {
    DTensor t = ops->alloc(1 << 20, DType::bf16, "activations");
    EXPECT_EQ(dev->memory_stats().in_use, base + (2u << 20));
    std::vector<float> host(1 << 20, 1.0f);
    ops->download(t, host);
    EXPECT_EQ(std::count(host.begin(), host.end(), 0.0f), std::ptrdiff_t(host.size()));
  }
  EXPECT_EQ(dev->memory_stats().in_use, base);
  dev->set_memory_limit(base + (16u << 20));
  try {
    (void)ops->alloc(std::int64_t(64) << 20, DType::fp32, "huge weights");
    FAIL() << "a 256 MiB tensor under a 16 MiB limit was allocated";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("huge weights"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dev->memory_stats().in_use, base);
  dev->set_memory_limit(0);
  EXPECT_THROW((void)ops->alloc(16, DType::fp8_e4m3, "fp8"), UnsupportedError);
}

TEST(CudaBackend, ReportsDevicesAndVersions) {
  const Backend cuda = make_cuda_backend();
  EXPECT_EQ(cuda.unavailable(), "");
  const auto devices = cuda.list();
  ASSERT_FALSE(devices.empty());
  EXPECT_EQ(devices[0].id, "cuda:0");
  EXPECT_EQ(devices[0].kind, DeviceKind::cuda);
  EXPECT_FALSE(devices[0].name.empty());
  for (const char* key : {"compute_capability", "sm_count", "memory_bytes",
                          "memory_bus_width_bits", "l2_bytes", "sm_clock_khz",
                          "memory_clock_khz", "pci_bus_id"})
    EXPECT_TRUE(devices[0].props.contains(key)) << key;
  EXPECT_GT(devices[0].props.at("sm_count").get<int>(), 0);

  const auto v = cuda.versions();
  for (const char* key : {"cuda_runtime", "cuda_driver", "cublasLt"})
    EXPECT_TRUE(v.contains(key)) << key << " in " << v.dump();

  EXPECT_THROW(cuda.open(int(devices.size())), UsageError);
  EXPECT_THROW(cuda.open(-1), UsageError);
}

}  // namespace
}  // namespace sb

int main(int argc, char** argv) { return sb::gpu_test_main(argc, argv); }
