// The numerics scenario's parts on the cpu device: the fp16 conversions the
// training ops use, the GEMM's transposes, the MLP's gradients against a
// double-precision finite-difference check, and the detectors (a NaN injected
// at (step, layer) is reported as exactly that).
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "harness/random.hpp"
#include "harness/train_ops.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/detail/train_ops.hpp"
#include "scenarios/numerics/mlp.hpp"
#include "scenarios/numerics/train.hpp"

namespace sb {
namespace {

using numerics::Mlp;
using numerics::MlpConfig;

TEST(Fp16Fast, EveryHalfToFloatMatchesFloat16) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    _Float16 h;
    const std::uint16_t bits = std::uint16_t(b);
    std::memcpy(&h, &bits, 2);
    const float want = float(h), got = cpu::fp16_value_fast(bits);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << b;
    } else {
      ASSERT_EQ(std::memcmp(&want, &got, 4), 0) << "bits " << b << " want " << want << " got " << got;
    }
  }
}

TEST(Fp16Fast, FloatToHalfRoundsLikeFloat16) {
  // a stride over every fp32 bit pattern, plus the boundaries
  std::vector<std::uint32_t> pats;
  for (std::uint64_t u = 0; u < (1ull << 32); u += 4099) pats.push_back(std::uint32_t(u));
  for (float f : {65504.0f, 65519.99f, 65520.0f, 65536.0f, 5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f,
                  6.1035156e-05f, 6.1035152e-05f, 1e-10f, -0.0f})
    pats.push_back(std::bit_cast<std::uint32_t>(f));
  for (std::uint32_t p : pats) {
    const float f = std::bit_cast<float>(p);
    const _Float16 h = static_cast<_Float16>(f);
    std::uint16_t want;
    std::memcpy(&want, &h, 2);
    const std::uint16_t got = cpu::fp16_bits_fast(f);
    if (std::isnan(f)) {
      EXPECT_EQ(got & 0x7c00, 0x7c00);
      EXPECT_NE(got & 0x03ff, 0);
    } else {
      ASSERT_EQ(want, got) << "float " << f << " bits " << p;
    }
  }
}

class OpsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Device> dev = make_cpu_backend().open(0);
  std::unique_ptr<TrainOps> ops = dev->make_train_ops();
};

TEST_F(OpsTest, GemmEveryTransposeAndBeta) {
  const std::int64_t m = 7, n = 5, k = 9;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (float beta : {0.0f, 1.0f}) {
        std::vector<float> a(std::size_t(m * k)), b(std::size_t(k * n)), c0(std::size_t(m * n));
        for (std::size_t i = 0; i < a.size(); ++i) a[i] = uniform_pm1(1, i);
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = uniform_pm1(2, i);
        for (std::size_t i = 0; i < c0.size(); ++i) c0[i] = uniform_pm1(3, i);
        DTensor A = ops->alloc(m * k, DType::fp32, "A"), B = ops->alloc(k * n, DType::fp32, "B"),
                C = ops->alloc(m * n, DType::fp32, "C");
        ops->upload(A, a);
        ops->upload(B, b);
        ops->upload(C, c0);
        ops->gemm(ta, tb, m, n, k, 2.0f, A, B, beta, C);
        std::vector<float> c(c0.size());
        ops->download(C, c);
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (std::int64_t p = 0; p < k; ++p) {
              const double av = ta ? a[std::size_t(p * m + i)] : a[std::size_t(i * k + p)];
              const double bv = tb ? b[std::size_t(j * k + p)] : b[std::size_t(p * n + j)];
              s += av * bv;
            }
            const double want = 2.0 * s + beta * c0[std::size_t(i * n + j)];
            EXPECT_NEAR(c[std::size_t(i * n + j)], want, 1e-5) << ta << tb << beta << " at " << i << "," << j;
          }
      }
}

TEST_F(OpsTest, StatsCountNonFiniteZeroAndTiny) {
  const std::vector<float> v{1.0f, 0.0f, NAN, INFINITY, 1e-6f, -2.0f, 0.0f, -1e-5f};
  for (DType t : {DType::fp32, DType::bf16, DType::fp16}) {
    DTensor x = ops->alloc(std::int64_t(v.size()), t, "x");
    DTensor out = ops->alloc(kStatsPerTensor * 2, DType::fp32, "stats");
    ops->upload(x, v);
    ops->stats(x, std::int64_t(v.size()), out, 1);
    std::vector<float> h(kStatsPerTensor * 2);
    ops->download(out, h);
    const TensorStats s = read_stats(h, 1);
    EXPECT_EQ(s.nonfinite, 2) << to_string(t);
    EXPECT_EQ(s.zero, 2) << to_string(t);
    EXPECT_EQ(s.tiny, 2) << to_string(t);  // 1e-6 and -1e-5 are below 2^-14 (fp16 keeps them as subnormals)
    EXPECT_NEAR(s.sumsq, 5.0, 1e-3) << to_string(t);
  }
}

TEST_F(OpsTest, Fp16FlushesWhatBf16Keeps) {
  DTensor h = ops->alloc(3, DType::fp16, "h"), b = ops->alloc(3, DType::bf16, "b");
  const std::vector<float> v{1e-8f, 7e4f, 3e-5f};
  ops->upload(h, v);
  ops->upload(b, v);
  std::vector<float> hh(3), bb(3);
  ops->download(h, hh);
  ops->download(b, bb);
  EXPECT_EQ(hh[0], 0.0f);          // below half of fp16's smallest subnormal, 2^-25
  EXPECT_TRUE(std::isinf(hh[1]));  // past 65504
  EXPECT_NEAR(bb[0], 1e-8f, 1e-10f);
  EXPECT_NEAR(bb[1], 7e4f, 300.0f);
}

// ---- the MLP's gradients against central finite differences in double ----

struct HostMlp {
  MlpConfig c;
  std::vector<std::vector<double>> w, b;  // per layer, [out*in], [out]
  double act(double z) const {
    switch (c.act) {
      case Act::relu: return z > 0 ? z : 0;
      case Act::tanh: return std::tanh(z);
      case Act::sigmoid: return 1 / (1 + std::exp(-z));
      case Act::gelu: return 0.5 * z * (1 + std::tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)));
      default: return z;
    }
  }
  // MSE loss of the batch
  double loss(const std::vector<float>& x, const std::vector<float>& t) const {
    const std::int64_t B = c.batch;
    std::vector<double> h(x.begin(), x.end());
    std::int64_t in = c.in;
    for (int l = 0; l <= c.depth; ++l) {
      const std::int64_t out = l == c.depth ? c.out : c.width;
      std::vector<double> u = h;
      if (c.norm && l > 0)
        for (std::int64_t r = 0; r < B; ++r) {
          double ss = 0;
          for (std::int64_t j = 0; j < in; ++j) ss += h[std::size_t(r * in + j)] * h[std::size_t(r * in + j)];
          const double rs = 1 / std::sqrt(ss / double(in) + 1e-6);
          for (std::int64_t j = 0; j < in; ++j) u[std::size_t(r * in + j)] = h[std::size_t(r * in + j)] * rs;
        }
      std::vector<double> y(std::size_t(B * out));
      for (std::int64_t r = 0; r < B; ++r)
        for (std::int64_t o = 0; o < out; ++o) {
          double z = b[std::size_t(l)][std::size_t(o)];
          for (std::int64_t i = 0; i < in; ++i) z += u[std::size_t(r * in + i)] * w[std::size_t(l)][std::size_t(o * in + i)];
          const bool hidden = l < c.depth;
          double v = hidden ? act(z) : z;
          if (hidden && c.residual && l > 0) v += h[std::size_t(r * in + o)];
          y[std::size_t(r * out + o)] = v;
        }
      h = y;
      in = out;
    }
    double s = 0;
    for (std::size_t i = 0; i < h.size(); ++i) s += (h[i] - t[i]) * (h[i] - t[i]);
    return s / double(h.size());
  }
};

void fd_check(MlpConfig cfg) {
  auto dev = make_cpu_backend().open(0);
  auto ops = dev->make_train_ops();
  Mlp mlp(*ops, cfg, 7);
  HostMlp host{cfg, {}, {}};
  for (int l = 0; l < mlp.layers(); ++l) {
    std::vector<float> w, b;
    mlp.get_weights(l, w, b);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = 0.1f * uniform_pm1(99 + std::uint64_t(l), i);  // nonzero biases
    mlp.set_weights(l, w, b);
    host.w.emplace_back(w.begin(), w.end());
    host.b.emplace_back(b.begin(), b.end());
  }
  std::vector<float> x(std::size_t(cfg.batch * cfg.in)), t(std::size_t(cfg.batch * cfg.out));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = uniform_pm1(11, i);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = uniform_pm1(12, i);
  mlp.set_batch(x, t);
  mlp.forward_backward(1.0f, 0, numerics::Injection{});
  for (int l = 0; l < mlp.layers(); ++l) {
    std::vector<float> dw, db;
    mlp.get_grads(l, dw, db);
    // central differences of the host loss in each parameter of `host_params`
    auto check = [&](std::vector<double>& host_params, const std::vector<float>& grad, const char* what) {
      for (std::size_t i = 0; i < grad.size(); ++i) {
        const double h = 1e-6, keep = host_params[i];
        host_params[i] = keep + h;
        const double up = host.loss(x, t);
        host_params[i] = keep - h;
        const double down = host.loss(x, t);
        host_params[i] = keep;
        const double fd = (up - down) / (2 * h);
        EXPECT_NEAR(grad[i], fd, 2e-4 * std::max(1.0, std::fabs(fd))) << "layer " << l << " " << what << "[" << i << "]";
      }
    };
    check(host.w[std::size_t(l)], dw, "dW");
    check(host.b[std::size_t(l)], db, "db");
  }
}

MlpConfig tiny(Act act, bool norm, bool residual) {
  MlpConfig c;
  c.in = 3;
  c.width = 5;
  c.out = 2;
  c.depth = 3;
  c.batch = 4;
  c.act = act;
  c.norm = norm;
  c.residual = residual;
  return c;
}

TEST(MlpGradients, TanhMatchesFiniteDifferences) { fd_check(tiny(Act::tanh, false, false)); }
TEST(MlpGradients, SigmoidMatchesFiniteDifferences) { fd_check(tiny(Act::sigmoid, false, false)); }
TEST(MlpGradients, GeluWithNormAndResidualMatchesFiniteDifferences) { fd_check(tiny(Act::gelu, true, true)); }

// ---- detectors ----

numerics::TrainSpec small_spec() {
  numerics::TrainSpec s;
  s.model = tiny(Act::relu, false, false);
  s.model.in = 8;
  s.model.width = 16;
  s.model.out = 4;
  s.model.batch = 16;
  s.max_steps = 30;
  s.target_loss = 0;
  s.plateau_window = 0;
  s.epoch_steps = 10;
  return s;
}

TEST(Detectors, NanInActivationIsLocatedExactly) {
  auto dev = make_cpu_backend().open(0);
  auto ops = dev->make_train_ops();
  for (int layer = 0; layer <= 3; ++layer) {
    numerics::TrainSpec s = small_spec();
    s.inject = {true, NAN, 12, layer, numerics::InjectInto::activation};
    const auto r = numerics::train(*ops, *dev, s, 60000);
    EXPECT_EQ(r.first_nonfinite.step, 12) << layer;
    EXPECT_EQ(r.first_nonfinite.layer, layer);
    EXPECT_EQ(r.first_nonfinite.where, "activation");
    EXPECT_EQ(r.grad_check_step, 12);
    EXPECT_EQ(r.loss_nan_step, 12);     // a NaN output makes the batch's mean loss NaN at once
    EXPECT_EQ(r.epoch_check_step, 19);  // the end of the epoch of steps 10..19
    EXPECT_EQ(r.outcome, "nan");
  }
}

TEST(Detectors, InfInGradientIsLocatedAndPoisonsTheNextStep) {
  auto dev = make_cpu_backend().open(0);
  auto ops = dev->make_train_ops();
  numerics::TrainSpec s = small_spec();
  s.inject = {true, INFINITY, 5, 2, numerics::InjectInto::gradient};
  const auto r = numerics::train(*ops, *dev, s, 60000);
  EXPECT_EQ(r.first_nonfinite.step, 5);
  EXPECT_EQ(r.first_nonfinite.layer, 2);
  EXPECT_EQ(r.first_nonfinite.where, "gradient");
  EXPECT_EQ(r.grad_check_step, 5);
  EXPECT_EQ(r.loss_nan_step, 6);  // the loss is finite at 5; the update made the weights non-finite
  // skipping the non-finite step keeps the run finite
  s.skip_nonfinite = true;
  const auto r2 = numerics::train(*ops, *dev, s, 60000);
  EXPECT_EQ(r2.skipped_steps, 1);
  EXPECT_EQ(r2.loss_nan_step, -1);
  EXPECT_EQ(r2.steps, 30);
}

// A step skipped for a non-finite loss is not the loss's trend: the plateau detector fires where it
// fires without it (a NaN in either window made the window's mean NaN and blinded the detector for two
// windows), and the divergence test's reference is the first finite loss.
TEST(Detectors, OneSkippedNanDoesNotBlindThePlateauDetector) {
  auto dev = make_cpu_backend().open(0);
  auto ops = dev->make_train_ops();
  numerics::TrainSpec s = small_spec();
  s.lr = 1e-9;  // no progress: a plateau from the first two windows
  s.max_steps = 200;
  s.plateau_window = 20;
  const auto clean = numerics::train(*ops, *dev, s, 60000);
  ASSERT_EQ(clean.outcome, "stalled");
  ASSERT_EQ(clean.plateau_step, 39);
  s.skip_nonfinite = true;
  s.inject = {true, NAN, 25, 1, numerics::InjectInto::activation};
  const auto r = numerics::train(*ops, *dev, s, 60000);
  EXPECT_EQ(r.skipped_steps, 1);
  EXPECT_EQ(r.outcome, "stalled");
  EXPECT_EQ(r.plateau_step, 39);
  // a NaN at step 0, skipped: the reference is step 1's loss, finite
  s.inject = {true, NAN, 0, 1, numerics::InjectInto::activation};
  const auto r0 = numerics::train(*ops, *dev, s, 60000);
  EXPECT_TRUE(std::isfinite(r0.initial_loss));
  EXPECT_EQ(r0.initial_loss, r0.loss[1]);
}

TEST(Detectors, GradScalerRulesHalveOnOverflowAndSkip) {
  auto dev = make_cpu_backend().open(0);
  auto ops = dev->make_train_ops();
  numerics::TrainSpec s = small_spec();
  s.model.dtype = DType::fp16;
  s.loss_scaling = true;
  s.init_scale = 1e30;  // overflows fp16 at once: every step halves until the gradients fit
  s.growth_interval = 5;
  s.max_steps = 120;
  s.dataset_batches = 1;  // one batch every step: a step's loss moves only if the last update was applied
  const auto r = numerics::train(*ops, *dev, s, 60000);
  ASSERT_GT(r.skipped_steps, 0);
  int skipped = 0;
  for (std::size_t i = 0; i + 1 < r.loss.size(); ++i) {
    ASSERT_TRUE(std::isfinite(r.loss[i])) << "step " << i;  // the forward never sees the scale
    if (!std::isfinite(r.grad_norm[i])) {
      ++skipped;
      EXPECT_EQ(r.loss[i + 1], r.loss[i]) << "step " << i << " overflowed, and its update was applied";
    } else {
      EXPECT_NE(r.loss[i + 1], r.loss[i]) << "step " << i << " was clean, and no update was applied";
    }
  }
  EXPECT_EQ(skipped + (std::isfinite(r.grad_norm.back()) ? 0 : 1), r.skipped_steps);
  // 1e30 halved per skipped step, doubled after every 5 clean steps
  double scale = 1e30;
  int clean = 0;
  for (std::size_t i = 0; i < r.loss_scale.size(); ++i) {
    EXPECT_DOUBLE_EQ(r.loss_scale[i], scale) << "step " << i;
    const bool skipped = !std::isfinite(r.grad_norm[i]);
    if (skipped) {
      scale *= 0.5;
      clean = 0;
    } else if (++clean >= 5) {
      scale *= 2;
      clean = 0;
    }
  }
  EXPECT_DOUBLE_EQ(r.next_scale, scale);  // after the last step's update, as GradScaler.get_scale() reads
}

}  // namespace
}  // namespace sb
