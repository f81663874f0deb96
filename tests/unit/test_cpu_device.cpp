// The cpu device (oneDNN) and the correctness check every GEMM passes before
// it is timed. No timing assertions: this machine is noisy.
#include <sys/resource.h>  // getrusage(RUSAGE_THREAD)
#include <sys/stat.h>      // mkfifo

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <thread>

#include <unistd.h>  // gettid
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join
#include <gtest/gtest.h>

#include "fake_device.hpp"
#include "harness/errors.hpp"
#include "harness/cpu_affinity.hpp"  // allowed_cpus, CpuClaims
#include "harness/gemm_check.hpp"
#include "harness/host_cpus.hpp"  // HostCpuForHost
#include "harness/train_ops.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/detail/compute_stream.hpp"
#include "kernels/cpu/detail/stream_device.hpp"  // last_level_cache_bytes
#include "kernels/cpu/detail/vec_math.hpp"       // exp_v, tanh_v

namespace sb {
namespace {

std::unique_ptr<Device> cpu() { return make_cpu_backend().open(0); }

// The vectorisable exp and tanh the cpu kernels use, against double-precision libm.
TEST(VecMath, ExpWithinAFewUlpOverTheNormalRange) {
  double worst = 0;
  float at = 0;
  for (float x = -86.5f; x <= 88.7f; x += 0.000731f) {
    const double ref = std::exp(double(x));
    const double rel = std::fabs(double(cpu::exp_v(x)) - ref) / ref;
    if (rel > worst) worst = rel, at = x;
  }
  EXPECT_LT(worst, 4 * 5.96e-8) << "at x = " << at;  // 4 ulp of fp32 (2^-24 relative each)
  EXPECT_EQ(cpu::exp_v(0.0f), 1.0f);
}

TEST(VecMath, ExpEdgesAreExactZeroInfAndNaN) {
  // a masked score (the dtype's lowest minus the row max) must give exactly 0: a 1e-38 there made
  // P subnormal and fp32 causal eager attention 25x slower (subnormal GEMM operands)
  EXPECT_EQ(cpu::exp_v(-3.4028234e38f), 0.0f);
  EXPECT_EQ(cpu::exp_v(-INFINITY), 0.0f);
  EXPECT_EQ(cpu::exp_v(-87.0f), 0.0f);  // flushed: fp32's normal range ends at exp(-87.3)
  EXPECT_GT(cpu::exp_v(-86.5f), 0.0f);
  EXPECT_TRUE(std::isfinite(cpu::exp_v(88.72f)));
  EXPECT_EQ(cpu::exp_v(88.8f), INFINITY);
  EXPECT_EQ(cpu::exp_v(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(cpu::exp_v(NAN)));
}

// The training ops' element loops work in chunks of 256 (train_ops.cpp): sizes that are not a multiple
// of it, rows longer than a chunk, a bias (indexed per column across chunk edges), a residual, and y
// written over z, against a scalar double reference. fp32 exactly-ish; bf16 within its rounding.
std::vector<float> ramp(std::size_t n, float scale, float shift) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * float(i) + shift);
  return v;
}
double gelu_ref(double z) { return 0.5 * z * (1 + std::tanh(0.7978845608028654 * (z + 0.044715 * z * z * z))); }
double gelu_d_ref(double z) {
  const double u = 0.7978845608028654 * (z + 0.044715 * z * z * z), t = std::tanh(u);
  return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * z * z);
}

TEST(CpuTrainOps, ChunkedElementLoopsMatchAScalarReferenceAtAwkwardSizes) {
  auto dev = cpu();
  auto ops = dev->make_train_ops();
  const std::int64_t rows = 37, cols = 300, n = rows * cols;  // 300: one whole chunk and a tail per row
  for (DType t : {DType::fp32, DType::bf16}) {
    SCOPED_TRACE(std::string(to_string(t)));
    const double tol = t == DType::fp32 ? 2e-6 : 1.6e-2;  // bf16: 8 bits of mantissa, rounded on store
    const auto zh = ramp(std::size_t(n), 3.0f, 0.1f), bh = ramp(std::size_t(cols), 0.5f, 1.3f),
               rh = ramp(std::size_t(n), 1.0f, 2.2f);
    DTensor z = ops->alloc(n, t, "z"), b = ops->alloc(cols, t, "bias"), r = ops->alloc(n, t, "residual");
    ops->upload(z, zh);
    ops->upload(b, bh);
    ops->upload(r, rh);
    std::vector<float> zin(static_cast<std::size_t>(n)), bin(static_cast<std::size_t>(cols)), rin(zin.size());
    ops->download(z, zin);  // the inputs as the dtype holds them
    ops->download(b, bin);
    ops->download(r, rin);
    // y = gelu(z + bias) + residual, written over the residual (in place, as a decoder's residual add)
    ops->bias_act(z, &b, Act::gelu, &r, r, rows, cols);
    std::vector<float> zk(zin.size()), y(zin.size());
    ops->download(z, zk);
    ops->download(r, y);
    double worst_z = 0, worst_y = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const double zr = double(zin[std::size_t(i)]) + double(bin[std::size_t(i % cols)]);
      worst_z = std::max(worst_z, std::fabs(zk[std::size_t(i)] - zr) / std::max(1.0, std::fabs(zr)));
      const double yr = gelu_ref(zk[std::size_t(i)]) + double(rin[std::size_t(i)]);
      worst_y = std::max(worst_y, std::fabs(y[std::size_t(i)] - yr) / std::max(1.0, std::fabs(yr)));
    }
    EXPECT_LT(worst_z, tol) << "z + bias";
    EXPECT_LT(worst_y, tol) << "gelu + residual";

    // dz = dy * gelu'(z), into dy's own buffer
    DTensor dy = ops->alloc(n, t, "dy");
    ops->upload(dy, rh);
    std::vector<float> dyin(zin.size()), dz(zin.size());
    ops->download(dy, dyin);
    ops->act_backward(dy, z, Act::gelu, dy, n);
    ops->download(dy, dz);
    double worst_d = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const double dr = double(dyin[std::size_t(i)]) * gelu_d_ref(zk[std::size_t(i)]);
      worst_d = std::max(worst_d, std::fabs(dz[std::size_t(i)] - dr) / std::max(1.0, std::fabs(dr)));
    }
    EXPECT_LT(worst_d, tol) << "act_backward";

    // db[j] = sum over rows of dz[r, j]
    DTensor db = ops->alloc(cols, t, "db");
    ops->bias_grad(dy, db, rows, cols);
    std::vector<float> dbh(static_cast<std::size_t>(cols));
    ops->download(db, dbh);
    double worst_b = 0;
    for (std::int64_t j = 0; j < cols; ++j) {
      double s = 0;
      for (std::int64_t q = 0; q < rows; ++q) s += dz[std::size_t(q * cols + j)];
      worst_b = std::max(worst_b, std::fabs(dbh[std::size_t(j)] - s) / std::max(1.0, std::fabs(s)));
    }
    EXPECT_LT(worst_b, tol * 4) << "bias_grad";

    // rmsnorm per row across the chunk edge, and its backward
    DTensor yn = ops->alloc(n, t, "y"), rstd = ops->alloc(rows, DType::fp32, "rstd"), dx = ops->alloc(n, t, "dx");
    ops->rmsnorm(z, yn, rstd, rows, cols, 1e-6f);
    ops->rmsnorm_backward(dy, yn, rstd, dx, rows, cols);
    std::vector<float> ynh(zin.size()), rs(static_cast<std::size_t>(rows)), dxh(zin.size());
    ops->download(yn, ynh);
    ops->download(rstd, rs);
    ops->download(dx, dxh);
    double worst_n = 0, worst_nb = 0;
    for (std::int64_t q = 0; q < rows; ++q) {
      double ss = 0, dot = 0;
      for (std::int64_t j = 0; j < cols; ++j) ss += double(zk[std::size_t(q * cols + j)]) * zk[std::size_t(q * cols + j)];
      const double rr = 1 / std::sqrt(ss / double(cols) + 1e-6);
      EXPECT_NEAR(rs[std::size_t(q)], rr, 1e-5 * rr) << "rstd of row " << q;
      for (std::int64_t j = 0; j < cols; ++j) {
        const std::size_t i = std::size_t(q * cols + j);
        worst_n = std::max(worst_n, std::fabs(ynh[i] - zk[i] * rr));
        dot += double(dz[i]) * ynh[i];
      }
      for (std::int64_t j = 0; j < cols; ++j) {
        const std::size_t i = std::size_t(q * cols + j);
        worst_nb = std::max(worst_nb, std::fabs(dxh[i] - double(rs[std::size_t(q)]) * (dz[i] - ynh[i] * dot / double(cols))));
      }
    }
    EXPECT_LT(worst_n, tol * 4) << "rmsnorm";
    EXPECT_LT(worst_nb, tol * 4) << "rmsnorm_backward";
  }
}

TEST(CpuTrainOps, AdamWOverAChunkTailMatchesItsFormula) {
  auto dev = cpu();
  auto ops = dev->make_train_ops();
  const std::int64_t n = 1000;  // 3 chunks and a tail of 232
  const auto ph = ramp(std::size_t(n), 1.0f, 0.0f), gh = ramp(std::size_t(n), 0.01f, 0.7f);
  DTensor p = ops->alloc(n, DType::fp32, "p"), g = ops->alloc(n, DType::bf16, "g"), m = ops->alloc(n, DType::fp32, "m"),
          v = ops->alloc(n, DType::fp32, "v");
  ops->upload(p, ph);
  ops->upload(g, gh);
  std::vector<float> gin(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
  ops->download(g, gin);
  ops->adamw(p, g, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 2.0f);  // step 1, gradients scaled by 2
  ops->download(p, out);
  for (std::int64_t i = 0; i < n; ++i) {
    const double gi = 2.0 * gin[std::size_t(i)], mi = 0.1 * gi, vi = 0.001 * gi * gi;
    double pi = ph[std::size_t(i)];
    pi -= 1e-3 * 0.01 * pi;
    pi -= 1e-3 * (mi / 0.1) / (std::sqrt(vi / 0.001) + 1e-8);
    ASSERT_NEAR(out[std::size_t(i)], pi, 1e-6) << "element " << i;
  }
}

// The training GEMM writes C = alpha op(A) op(B) + beta C itself (oneDNN's output scale and sum post-op
// where the dtype is native, an fp32 scratch and a pass where it is emulated): every transpose, C in bf16
// and in fp32, beta 0 over a C full of NaN (never read) and beta 1 (accumulated, never scaled by alpha).
TEST(CpuTrainOps, Bf16GemmWritesAlphaProductPlusBetaCRoundedOnce) {
  auto dev = cpu();
  auto ops = dev->make_train_ops();
  const std::int64_t m = 45, n = 70, k = 33;  // none a multiple of a register block
  const auto ah = ramp(std::size_t(m * k), 1.0f, 0.3f), bh = ramp(std::size_t(k * n), 1.0f, 1.7f),
             ch = ramp(std::size_t(m * n), 4.0f, 0.9f);
  DTensor a = ops->alloc(m * k, DType::bf16, "A"), b = ops->alloc(k * n, DType::bf16, "B");
  ops->upload(a, ah);
  ops->upload(b, bh);
  std::vector<float> ain(ah.size()), bin(bh.size());
  ops->download(a, ain);  // the inputs as bf16 holds them
  ops->download(b, bin);
  for (DType ct : {DType::bf16, DType::fp32})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (float beta : {0.0f, 1.0f}) {
          SCOPED_TRACE(fmt::format("C {} ta {} tb {} beta {}", to_string(ct), ta, tb, beta));
          DTensor c = ops->alloc(m * n, ct, "C");
          ops->upload(c, beta != 0.0f ? ch : std::vector<float>(ch.size(), NAN));
          std::vector<float> cin(ch.size()), out(ch.size());
          ops->download(c, cin);
          ops->gemm(ta, tb, m, n, k, 0.5f, a, b, beta, c);
          ops->download(c, out);
          double worst = 0;
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < n; ++j) {
              double s = 0;  // the operands' layout as op(A) [m,k], op(B) [k,n] read them
              for (std::int64_t p = 0; p < k; ++p)
                s += double(ain[std::size_t(ta ? p * m + i : i * k + p)]) *
                     double(bin[std::size_t(tb ? j * k + p : p * n + j)]);
              const double want = 0.5 * s + (beta != 0.0f ? double(cin[std::size_t(i * n + j)]) : 0.0);
              const double got = out[std::size_t(i * n + j)];
              ASSERT_TRUE(std::isfinite(got)) << "at " << i << "," << j << ": C's NaN leaked in";
              worst = std::max(worst, std::fabs(got - want) / std::max(1.0, std::fabs(want)));
            }
          // bf16 C: one rounding (2^-9 relative) and fp32 sums; fp32 C: fp32 sums of exact bf16 products
          EXPECT_LT(worst, ct == DType::bf16 ? 4.0e-3 : 1e-5);
          if (ct == DType::bf16) {
            EXPECT_GT(worst, 1e-5) << "a bf16 C not rounded: written as fp32?";
          }
        }
}

// The CPU time each thread of this process has run (ns, /proc/self/task/*/schedstat), by thread id.
std::map<long, long long> thread_cpu_ns() {
  std::map<long, long long> t;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream f(e.path() / "schedstat");
    long long ns = 0;
    if (f >> ns) t[std::stol(e.path().filename().string())] = ns;
  }
  return t;
}

// With a CPU kept for the host (HostCpuForHost), the training GEMMs run on the
// compute thread's team alone: at most one thread per compute CPU (one on 2
// CPUs). oneDNN 2.6's matmul with a sum post-op (beta 1: the weight gradients
// accumulated) keeps the thread count of the thread that made it: made on the
// host thread (every CPU), it ran a team one larger than the compute CPUs (on 2
// CPUs: two threads on the compute thread's one CPU taking turns at each
// barrier, both at 120 ms for the 30 GEMMs below, against 40 ms for the one
// thread made for the team). A plain GEMM (beta 0) took the count when it ran
// and never showed it. Which threads did the work is counted, not timed.
// The defect needs oneDNN's AVX2 gemm: on an AVX-512 machine (AMD Zen 4, 2 CPUs)
// this test passes without the fix, and fails without it under
// ONEDNN_MAX_CPU_ISA=AVX2 (two threads at 124 ms): meson's test_cpu_team_avx2
// runs it so, and sees the defect on any x86 CPU.
// Claims across processes: flock on one file per CPU. flock treats two open()s of one file as two
// owners even in one process, so one process shows what two would. The CPU numbers need not exist: a
// claim is a lock file.
TEST(CpuClaims, ASecondClaimantTakesOtherCpusThenSharesAndSaysWhich) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("sb_claims_{}", ::getpid());
  std::filesystem::create_directories(dir);
  {
    CpuClaims a(dir.string()), b(dir.string()), c(dir.string()), d(dir.string());
    EXPECT_EQ(a.claim({0, 1, 2, 3}, 2), (std::vector<int>{0, 1}));
    EXPECT_TRUE(a.contended().empty());
    EXPECT_EQ(b.claim({0, 1, 2, 3}, 2), (std::vector<int>{2, 3}));  // not both on the first ones
    EXPECT_TRUE(b.contended().empty());
    EXPECT_EQ(c.claim({0, 1, 2, 3}, 3), (std::vector<int>{0, 1, 2}));  // none free: shared, and listed
    EXPECT_EQ(c.contended(), (std::vector<int>{0, 1, 2}));
    // a partly free set (a's 0 and 1 released; b holds 2 and 3): the free one, then the first held one
    // in the order given, shared
    a.release();
    EXPECT_EQ(d.claim({3, 1, 2}, 2), (std::vector<int>{1, 3}));
    EXPECT_EQ(d.contended(), (std::vector<int>{3}));
    // a claim again drops the last one first: b's 2 and 3 come free for another (d holds only 1: a
    // shared CPU is not locked)
    EXPECT_EQ(b.claim({0, 1, 2, 3}, 1), (std::vector<int>{0}));
    EXPECT_EQ(a.claim({1, 2, 3}, 1), (std::vector<int>{2}));
    EXPECT_TRUE(a.contended().empty());
  }
  // a FIFO or a directory at a CPU's lock path (another user's, made on purpose or not): opened without
  // blocking, and no lock, so that CPU counts as free and unclaimed, not as held by another process
  ASSERT_EQ(::mkfifo((dir / "stallbench-cpu7.lock").c_str(), 0600), 0);
  std::filesystem::create_directories(dir / "stallbench-cpu8.lock");
  {
    CpuClaims f(dir.string()), g(dir.string());
    EXPECT_EQ(f.claim({7, 8}, 2), (std::vector<int>{7, 8}));
    EXPECT_TRUE(f.contended().empty());
    EXPECT_EQ(g.claim({7, 8}, 2), (std::vector<int>{7, 8}));  // nobody holds them
    EXPECT_TRUE(g.contended().empty());
  }
  // a lock directory that does not exist: every CPU counts as free (no claim anyone could see)
  CpuClaims none((dir / "missing").string());
  EXPECT_EQ(none.claim({0, 1}, 1), (std::vector<int>{0}));
  EXPECT_TRUE(none.contended().empty());
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// Two cpu devices (two stallbench processes, as a parallel `meson test` runs them) keeping a CPU for
// the host each: their compute goes to different CPUs, not both to the first one. A third shares, and
// its point says so.
TEST(CpuClaims, TwoDevicesComputeOnDifferentCpus) {
  if (allowed_cpus().size() < 2) GTEST_SKIP() << "one CPU: nothing to split";
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("sb_claims_dev_{}", ::getpid());
  std::filesystem::create_directories(dir);
  ASSERT_EQ(::setenv("STALLBENCH_LOCK_DIR", dir.c_str(), 1), 0);
  {
    auto d1 = cpu(), d2 = cpu();
    const HostCpuForHost h1(*d1), h2(*d2);
    const std::size_t n = allowed_cpus().size() - 1;
    ASSERT_EQ(h1.compute_cpus().size(), n);
    ASSERT_EQ(h2.compute_cpus().size(), n);
    EXPECT_TRUE(h1.shared_cpus().empty());
    if (allowed_cpus().size() == 2) {
      EXPECT_NE(h1.compute_cpus(), h2.compute_cpus());
      EXPECT_TRUE(h2.shared_cpus().empty());
      auto d3 = cpu();
      const HostCpuForHost h3(*d3);
      EXPECT_EQ(h3.shared_cpus().size(), 1u);
      Point p;
      h3.record(p);
      EXPECT_EQ(p.info.at("compute_cpus_shared"), nlohmann::ordered_json(h3.shared_cpus()));
      EXPECT_NE(p.info.value("warning", std::string()).find("another stallbench process computes on CPU(s)"),
                std::string::npos)
          << p.info.dump();
    }
    Point q;
    h1.record(q);
    EXPECT_EQ(q.info.at("compute_cpus"), nlohmann::ordered_json(h1.compute_cpus()));
    EXPECT_FALSE(q.info.contains("compute_cpus_shared"));
    EXPECT_FALSE(q.info.contains("warning"));
  }
  ::unsetenv("STALLBENCH_LOCK_DIR");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST(CpuTrainOps, GemmsRunOnTheComputeThreadsTeamAloneWhenTheHostKeepsACpu) {
  if (allowed_cpus().size() < 2) GTEST_SKIP() << "one CPU: none to keep for the host, so no team to exceed";
  auto dev = cpu();
  const HostCpuForHost host(*dev);
  const std::size_t team = host.compute_cpus().size();
  ASSERT_EQ(team, allowed_cpus().size() - 1);
  auto ops = dev->make_train_ops();
  const std::int64_t n = 384;  // large enough that oneDNN splits it over a team of 2 or more
  DTensor a = ops->alloc(n * n, DType::fp32, "A"), b = ops->alloc(n * n, DType::fp32, "B"),
          c = ops->alloc(n * n, DType::fp32, "C");
  ops->upload(a, ramp(std::size_t(n * n), 1.0f, 0.3f));
  ops->upload(b, ramp(std::size_t(n * n), 1.0f, 1.7f));
  ops->gemm(false, false, n, n, n, 1.0f, a, b, 1.0f, c);  // makes the primitive, and any team it runs
  dev->synchronize(std::chrono::seconds(60));
  // Idle OpenMP workers of earlier parallel regions (earlier tests') spin before they sleep: LLVM's
  // libomp for KMP_BLOCKTIME, 200 ms by default. One spinning through the count read as a second
  // GEMM thread (clang 16's ASan build: 33.7 and 32.7 ms). Let them settle first; a team the GEMMs
  // themselves run still works through the count.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto before = thread_cpu_ns();
  for (int i = 0; i < 30; ++i) ops->gemm(false, false, n, n, n, 1.0f, a, b, 1.0f, c);
  dev->synchronize(std::chrono::seconds(120));
  const auto after = thread_cpu_ns();
  const long self = long(::gettid());
  std::vector<std::string> ran;  // the threads, other than this (host) one, that ran 0.5 ms or more meanwhile
  long long total = 0;
  for (const auto& [tid, ns] : after) {
    if (tid == self) continue;
    const long long d = ns - (before.count(tid) ? before.at(tid) : 0);
    total += d;
    if (d >= 500000) ran.push_back(fmt::format("{} ({:.1f} ms)", tid, d / 1e6));
  }
  ASSERT_GT(total, 5000000) << "30 GEMMs of 384^3 ran in under 5 ms of thread time: not counted";
  EXPECT_GE(ran.size(), 1u);
  EXPECT_LE(ran.size(), team) << "threads that ran the GEMMs, " << team
                              << " compute CPU(s): " << fmt::format("{}", fmt::join(ran, ", "));
}

TEST(VecMath, TanhWithinAFewUlpAndSaturates) {
  double worst = 0;
  float at = 0;
  for (float x = -12.0f; x <= 12.0f; x += 0.000377f) {
    const double ref = std::tanh(double(x));
    const double err = std::fabs(double(cpu::tanh_v(x)) - ref) / std::max(std::fabs(ref), 1e-30);
    if (err > worst) worst = err, at = x;
  }
  EXPECT_LT(worst, 4 * 5.96e-8) << "at x = " << at;
  for (float x : {1e-3f, 1e-6f, 1e-20f}) {  // small arguments keep their relative accuracy (no 1 - 2/(e+1))
    EXPECT_NEAR(cpu::tanh_v(x), std::tanh(double(x)), 1.2e-7 * x);
    EXPECT_EQ(cpu::tanh_v(-x), -cpu::tanh_v(x));
  }
  EXPECT_EQ(cpu::tanh_v(0.0f), 0.0f);
  EXPECT_EQ(cpu::tanh_v(9.5f), 1.0f);
  EXPECT_EQ(cpu::tanh_v(INFINITY), 1.0f);
  EXPECT_EQ(cpu::tanh_v(-INFINITY), -1.0f);
  EXPECT_TRUE(std::isnan(cpu::tanh_v(NAN)));
}

TEST(CpuGemm, Fp32MatchesDoubleReference) {
  auto dev = cpu();
  const GemmCheck c = check_gemm(*dev, DType::fp32, {61, 47, 256}, 1, std::chrono::seconds(60));
  EXPECT_TRUE(c.ok) << c.first_mismatches;
  EXPECT_LT(c.worst_ratio, 1.0);
  EXPECT_FALSE(c.impl.empty());
}

TEST(CpuGemm, Bf16MatchesReferenceAndRecordsItsImplementation) {
  auto dev = cpu();
  if (auto why = dev->gemm_unsupported(DType::bf16)) {
    // oneDNN 2.6 runs bf16 from avx512_core up; below that the skip names why.
    ASSERT_FALSE(test::onednn_uses_avx512(*dev))
        << "bf16 refused where oneDNN runs AVX-512 (" << dev->info().props["onednn_isa"] << "): " << *why;
    EXPECT_NE(why->find("bf16"), std::string::npos) << *why;
    GTEST_SKIP() << *why;
  }
  const GemmCheck c = check_gemm(*dev, DType::bf16, {33, 65, 128}, 2, std::chrono::seconds(60));
  EXPECT_TRUE(c.ok) << c.first_mismatches;
  // oneDNN names what ran, e.g. brg:avx512_core_amx_bf16 or brg:avx512_core_bf16.
  EXPECT_NE(c.impl.find(":"), std::string::npos) << c.impl;
  const auto& isa = dev->info().props["isa"];
  const bool amx = std::find(isa.begin(), isa.end(), "amx_bf16") != isa.end();
  if (amx) {
    EXPECT_NE(c.impl.find("amx"), std::string::npos) << c.impl;
  }
}

TEST(CpuGemm, NonSquareShapesAreLaidOutAsLinear) {
  // C[M,N] = A[M,K] W[N,K]^T with M != N != K catches any transposition.
  auto dev = cpu();
  EXPECT_TRUE(check_gemm(*dev, DType::fp32, {7, 130, 19}, 3, std::chrono::seconds(60)).ok);
}

TEST(CpuGemm, UnsupportedDtypesSayWhy) {
  auto dev = cpu();
  const auto why = dev->gemm_unsupported(DType::fp8_e4m3);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("fp8"), std::string::npos);
  EXPECT_THROW(dev->make_gemm({16, 16, 16}, DType::tf32, 1), UnsupportedError);
}

TEST(GemmCheck, CatchesALayoutBug) {
  test::FakeDevice good, bad;
  bad.broken_gemm = true;
  EXPECT_TRUE(check_gemm(good, DType::bf16, {9, 13, 32}, 4, std::chrono::seconds(5)).ok);
  const GemmCheck c = check_gemm(bad, DType::bf16, {9, 13, 32}, 4, std::chrono::seconds(5));
  EXPECT_FALSE(c.ok);
  EXPECT_GT(c.wrong, 0);
  EXPECT_NE(c.first_mismatches.find("C[0,"), std::string::npos) << c.first_mismatches;
}

TEST(CpuDevice, AllocationFailureIsTypedOutOfMemory) {
  auto dev = cpu();
  EXPECT_THROW(dev->allocate(std::size_t(1) << 60, MemKind::device), OutOfMemory);
  Buffer b = dev->allocate(4096, MemKind::host_pinned);
  EXPECT_NE(b.data(), nullptr);
}

TEST(CpuDevice, EventsAndCopiesRunInStreamOrder) {
  auto dev = cpu();
  Buffer src = dev->allocate(1 << 20, MemKind::host_pageable);
  Buffer dst = dev->allocate(1 << 20, MemKind::device);
  std::memset(src.data(), 0x5a, 1 << 20);
  std::memset(dst.data(), 0, 1 << 20);
  // The copy runs on the stream after e0: held behind a gate, nothing has
  // been copied until the gate lets go; then the events bracket the copy.
  auto gate = dev->hold_stream(std::chrono::seconds(30));
  auto e0 = dev->record();
  dev->copy_h2d(dst, src, 1 << 20);
  auto e1 = dev->record();
  EXPECT_NE(static_cast<unsigned char*>(dst.data())[12345], 0x5a);  // not yet: the stream is held
  gate->release();
  dev->synchronize(std::chrono::seconds(10));
  EXPECT_GT(dev->elapsed_ms(e0, e1), 0.0);  // a 1 MiB memcpy takes time between the two stamps
  EXPECT_EQ(static_cast<unsigned char*>(dst.data())[12345], 0x5a);
  EXPECT_THROW(dev->copy_h2d(dst, src, 2 << 20), Error);
}

// timing=hidden: nothing enqueued behind a held stream completes before the
// gate is released (the wait below is a deadline, not a measured time), and
// everything does after; a gate nobody releases expires at its deadline.
TEST(CpuDevice, HeldStreamRunsNothingUntilReleased) {
  auto dev = cpu();
  auto gate = dev->hold_stream(std::chrono::seconds(30));
  auto e = dev->record();
  EXPECT_THROW(dev->wait_event(e, std::chrono::milliseconds(50)), HangError);
  gate->release();
  dev->wait_event(e, std::chrono::seconds(30));
  dev->synchronize(std::chrono::seconds(30));
  EXPECT_FALSE(gate->expired());

  auto lapsed = dev->hold_stream(std::chrono::milliseconds(1));
  dev->synchronize(std::chrono::seconds(30));  // the gate lets go by itself
  EXPECT_TRUE(lapsed->expired());
}

// timing=cold: the flush writes twice the last-level cache (read from sysfs,
// or a 32 MiB fallback), on the stream.
TEST(CpuDevice, CacheFlushWritesTwiceTheLastLevelCache) {
  auto dev = cpu();
  const std::size_t n = dev->flush_cache();
  EXPECT_EQ(n, 2 * cpu::last_level_cache_bytes());
  EXPECT_GE(n, std::size_t(1) << 20);
  EXPECT_EQ(dev->flush_cache(), n);  // the buffer is made once
  dev->synchronize(std::chrono::seconds(30));
}

// A wait that times out while GEMMs still run (one running, more queued):
// the op's operands are freed by unwinding right after. They must not be
// returned while a GEMM may still write them (ASan would see a
// heap-use-after-free), and the queued GEMMs are dropped, so the device's
// destruction waits only for the one running.
TEST(CpuDevice, AHungWaitNeverFreesMemoryAnOpStillUses) {
  auto dev = cpu();
  {
    auto op = dev->make_gemm({1024, 1024, 1024}, DType::fp32, 1);  // tens of ms each on any CPU
    for (int i = 0; i < 50; ++i) op->enqueue();
    EXPECT_THROW(dev->synchronize(std::chrono::milliseconds(1)), HangError);
  }  // the op and its buffers go while a GEMM is running
  const auto t0 = std::chrono::steady_clock::now();
  dev.reset();  // joins the stream: the running GEMM only, not the 49 queued
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
}

// The same for attention, whose work items run the op's own members.
TEST(CpuDevice, AHungWaitNeverDestroysAnAttentionOpUnderItsWork) {
  auto dev = cpu();
  for (AttnImpl impl : {AttnImpl::naive, AttnImpl::flash}) {
    AttnShape s;
    s.batch = 1;
    s.heads = 4;
    s.seq = 1024;
    s.head_dim = 64;
    {
      auto op = dev->make_attention(s, impl, DType::fp32, 1);
      for (int i = 0; i < 20; ++i) {
        op->forward();
        op->backward();
      }
      EXPECT_THROW(dev->synchronize(std::chrono::milliseconds(1)), HangError) << to_string(impl);
    }  // destroyed after its running item ends, never under it
  }
}

TEST(ComputeStream, SynchronizeHasADeadlineAndNamesTheStuckItem) {
  // The item cannot finish before the test lets it go, so the short deadline
  // must pass first, however loaded the machine (no race on sleep lengths).
  cpu::ComputeStream cs;
  std::promise<void> started, go;
  std::shared_future<void> go_f = go.get_future().share();
  cs.enqueue("slow item", [&started, go_f] {
    started.set_value();
    go_f.wait();
  });
  ASSERT_EQ(started.get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready);
  try {
    cs.synchronize(std::chrono::milliseconds(20));
    ADD_FAILURE() << "expected a HangError";
  } catch (const HangError& e) {
    EXPECT_NE(std::string(e.what()).find("slow item"), std::string::npos) << e.what();
  }
  go.set_value();
  cs.synchronize(std::chrono::seconds(30));  // it does finish
}

TEST(ComputeStream, WorkErrorsSurfaceAtSynchronize) {
  cpu::ComputeStream cs;
  cs.enqueue("throws", [] { throw OutOfMemory("inside the stream"); });
  EXPECT_THROW(cs.synchronize(std::chrono::seconds(10)), OutOfMemory);
  cs.enqueue("fine", [] {});
  EXPECT_NO_THROW(cs.synchronize(std::chrono::seconds(10)));
}

namespace {
void spin_us(int us) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  while (std::chrono::steady_clock::now() < until) {
  }
}
long voluntary_switches() {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_nvcsw;
}
}  // namespace

TEST(ComputeStream, ABlockedSynchronizeIsWokenAtItsTargetNotOncePerItem) {
  // A host blocked in synchronize() used to be woken by every finished item
  // (2.9 us of the stream's time each, 13% of a small training step). Counted
  // as this thread's voluntary context switches, not timed: 2000 items that
  // each outlast a wake-up would give ~2000 switches; the fix gives a few.
  cpu::ComputeStream cs;
  std::promise<void> go;
  std::shared_future<void> go_f = go.get_future().share();
  cs.enqueue("gate", [go_f] { go_f.wait(); });
  constexpr int kItems = 2000;
  std::atomic<int> ran{0};
  for (int i = 0; i < kItems; ++i)
    cs.enqueue("small", [&ran] {
      spin_us(20);
      ran.fetch_add(1, std::memory_order_relaxed);
    });
  go.set_value();
  const long before = voluntary_switches();
  cs.synchronize(std::chrono::seconds(60));
  const long switches = voluntary_switches() - before;
  EXPECT_EQ(ran.load(), kItems);
  EXPECT_LT(switches, 50) << "the waiting thread was woken " << switches << " times for " << kItems << " items";
}

TEST(ComputeStream, WaitersWithDifferentTargetsEachWakeAtTheirOwn) {
  cpu::ComputeStream cs;
  std::promise<void> go;
  std::shared_future<void> go_f = go.get_future().share();
  cs.enqueue("gate", [go_f] { go_f.wait(); });
  std::uint64_t third = 0;
  for (int i = 0; i < 50; ++i) {
    const auto seq = cs.enqueue("small", [] { spin_us(100); });
    if (i == 2) third = seq;
  }
  // one waits for the third item, one for everything, one drains while more
  // work arrives: each must return (a missed wake-up is a HangError here)
  auto early = std::async(std::launch::async, [&] { cs.wait_done(third, std::chrono::seconds(60)); });
  auto all = std::async(std::launch::async, [&] { cs.synchronize(std::chrono::seconds(60)); });
  auto drained = std::async(std::launch::async, [&] { cs.drain(std::chrono::seconds(60)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let them block (not needed for correctness)
  go.set_value();
  for (int i = 0; i < 20; ++i) cs.enqueue("late", [] { spin_us(100); });
  EXPECT_NO_THROW(early.get());
  EXPECT_NO_THROW(all.get());
  drained.get();
  cs.synchronize(std::chrono::seconds(60));  // and the late ones finish too
}

TEST(CpuBackend, BadIndexIsAUsageError) { EXPECT_THROW(make_cpu_backend().open(1), UsageError); }

}  // namespace
}  // namespace sb
