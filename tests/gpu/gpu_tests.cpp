// Tests of the cuda backend on a real GPU. With no usable GPU the binary
// prints why and exits 77, which Meson reports as SKIP (a gtest binary whose
// tests all GTEST_SKIP would exit 0 and show as OK, hiding the missing device).
#include <dlfcn.h>  // dlopen: whether this machine has NVML at all

#include <algorithm>  // std::min
#include <chrono>     // std::chrono_literals
#include <cmath>      // std::fabs, std::isfinite
#include <cstdint>    // std::int64_t, std::uint64_t
#include <cstdio>     // std::printf
#include <cstring>    // std::memset
#include <exception>  // std::exception
#include <memory>     // std::unique_ptr
#include <random>     // std::mt19937_64, std::uniform_real_distribution
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
  const AttnCheck r = check_attention(dev, shape, c.impl, c.dtype, c.backward, 21, kTimeout);
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
