// Packing's correctness on a real device: a packed row run as varlen attention
// gives each example exactly the output it gets alone, and naive concat (one
// dense sequence over the row) does not: its examples attend to each other.
#include <cmath>

#include <gtest/gtest.h>

#include "harness/random.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "workloads/packers.hpp"

namespace sb {
namespace {

constexpr std::int64_t H = 2, D = 16;

// [1, H, n, D] tensors; element (h, t, d) at (h*n + t)*D + d.
std::vector<float> tensor(std::int64_t n, std::uint64_t seed) {
  std::vector<float> v(std::size_t(H * n * D));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = uniform_pm1(seed, i);
  return v;
}

std::vector<float> slice(const std::vector<float>& x, std::int64_t n, std::int64_t t0, std::int64_t len) {
  std::vector<float> out(std::size_t(H * len * D));
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t t = 0; t < len; ++t)
      for (std::int64_t d = 0; d < D; ++d)
        out[std::size_t((h * len + t) * D + d)] = x[std::size_t((h * n + t0 + t) * D + d)];
  return out;
}

std::vector<float> run(Device& dev, const AttnShape& s, const std::vector<float>& q, const std::vector<float>& k,
                       const std::vector<float>& v, bool causal) {
  AttnShape shape = s;
  shape.causal = causal;
  auto op = dev.make_attention(shape, AttnImpl::flash, DType::fp32, 1);
  const std::vector<float> d_o(q.size(), 0.0f);
  op->upload(q, k, v, d_o);
  op->forward();
  dev.synchronize(std::chrono::seconds(30));
  std::vector<float> o(q.size());
  op->download(o, {}, {}, {});
  return o;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

TEST(PackingOnDevice, PackedRowEqualsEachExampleAloneAndConcatDoesNot) {
  auto dev = make_cpu_backend().open(0);
  const std::vector<std::int32_t> lengths{5, 11, 7};
  const packing::Plan plan = packing::plan(lengths, packing::Strategy::pack_ffd, 32, 1, 1, packing::Overflow::split);
  ASSERT_EQ(plan.rows.size(), 1u);
  std::vector<std::int32_t> cu = packing::cu_seqlens(plan.rows[0]);
  const std::int64_t n = cu.back();  // 23 real tokens, in the packer's order
  const auto q = tensor(n, 1), k = tensor(n, 2), v = tensor(n, 3);

  for (bool causal : {false, true}) {
    AttnShape packed;
    packed.heads = H;
    packed.head_dim = D;
    packed.seq = n;
    packed.cu_seqlens = cu;
    const auto o_packed = run(*dev, packed, q, k, v, causal);

    AttnShape whole = packed;  // concat: one dense sequence over the row
    whole.cu_seqlens.clear();
    const auto o_concat = run(*dev, whole, q, k, v, causal);

    double worst_packed = 0, worst_concat = 0;
    for (std::size_t i = 0; i + 1 < cu.size(); ++i) {
      const std::int64_t t0 = cu[i], len = cu[i + 1] - cu[i];
      AttnShape alone;
      alone.heads = H;
      alone.head_dim = D;
      alone.seq = len;
      const auto o_alone = run(*dev, alone, slice(q, n, t0, len), slice(k, n, t0, len), slice(v, n, t0, len), causal);
      worst_packed = std::max(worst_packed, max_diff(slice(o_packed, n, t0, len), o_alone));
      worst_concat = std::max(worst_concat, max_diff(slice(o_concat, n, t0, len), o_alone));
    }
    EXPECT_LT(worst_packed, 1e-5) << "causal=" << causal << ": a packed example saw another";
    EXPECT_GT(worst_concat, 1e-2) << "causal=" << causal << ": concat should mix examples";
  }
}

}  // namespace
}  // namespace sb
