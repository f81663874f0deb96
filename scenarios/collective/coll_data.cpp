#include "scenarios/collective/coll_data.hpp"

#include <algorithm>  // std::max
#include <cstring>    // std::memcpy

#include "harness/dtype.hpp"   // float_to_bf16_bits, bf16_bits_to_float
#include "harness/random.hpp"  // splitmix64

namespace sb {
namespace {

void store(CommDtype d, unsigned char* base, std::int64_t i, double v) {
  switch (d) {
    case CommDtype::fp32: {
      const float f = static_cast<float>(v);
      std::memcpy(base + i * 4, &f, 4);
      break;
    }
    case CommDtype::fp64: std::memcpy(base + i * 8, &v, 8); break;
    case CommDtype::bf16: {
      const std::uint16_t b = float_to_bf16_bits(static_cast<float>(v));
      std::memcpy(base + i * 2, &b, 2);
      break;
    }
    case CommDtype::i64: {
      const auto x = static_cast<std::int64_t>(v);
      std::memcpy(base + i * 8, &x, 8);
      break;
    }
  }
}

double load(CommDtype d, const unsigned char* base, std::int64_t i) {
  switch (d) {
    case CommDtype::fp32: {
      float f;
      std::memcpy(&f, base + i * 4, 4);
      return f;
    }
    case CommDtype::fp64: {
      double v;
      std::memcpy(&v, base + i * 8, 8);
      return v;
    }
    case CommDtype::bf16: {
      std::uint16_t b;
      std::memcpy(&b, base + i * 2, 2);
      return bf16_bits_to_float(b);
    }
    case CommDtype::i64: {
      std::int64_t x;
      std::memcpy(&x, base + i * 8, 8);
      return static_cast<double>(x);
    }
  }
  return 0;
}

// The reduction of every rank's element `index`.
double reduced(const CollCall& c, int nranks, std::uint64_t seed, std::int64_t index) {
  double acc = coll_input_value(seed, 0, index);
  for (int k = 1; k < nranks; ++k) {
    const double v = coll_input_value(seed, k, index);
    acc = c.reduce == ReduceOp::sum ? acc + v : std::max(acc, v);
  }
  return acc;
}

}  // namespace

double coll_input_value(std::uint64_t seed, int rank, std::int64_t index) {
  const std::uint64_t h =
      splitmix64(seed ^ splitmix64(static_cast<std::uint64_t>(rank) * 0x9e3779b97f4a7c15ULL + 0x51ed) ^
                 static_cast<std::uint64_t>(index) * 0xd6e8feb86659fd93ULL);
  return static_cast<double>(static_cast<int>(h >> 61) - 4);  // 3 bits: -4..3
}

std::uint64_t call_seed(std::uint64_t base, int step, int call_index) {
  return splitmix64(base ^ (static_cast<std::uint64_t>(step + 1) << 20) ^ static_cast<std::uint64_t>(call_index + 1));
}

void fill_coll_input(const CollCall& c, int nranks, int rank, std::uint64_t seed, std::vector<unsigned char>& out) {
  const std::int64_t n = coll_counts(c, nranks).send;
  out.assign(static_cast<std::size_t>(n) * dtype_size(c.dtype), 0);
  for (std::int64_t i = 0; i < n; ++i) store(c.dtype, out.data(), i, coll_input_value(seed, rank, i));
}

std::int64_t count_coll_wrong(const CollCall& c, int nranks, int rank, std::uint64_t seed,
                              const std::vector<unsigned char>& received) {
  const std::int64_t n = coll_counts(c, nranks).recv;
  const std::int64_t per = c.count / nranks;
  if (c.op == CollOp::reduce && rank != c.root) return 0;
  if (static_cast<std::int64_t>(received.size()) < n * static_cast<std::int64_t>(dtype_size(c.dtype))) return n;
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double want = 0;
    switch (c.op) {
      case CollOp::all_reduce:
      case CollOp::reduce: want = reduced(c, nranks, seed, i); break;
      case CollOp::broadcast: want = coll_input_value(seed, c.root, i); break;
      // Rank k sent its elements 0..per-1; they land at k*per.
      case CollOp::all_gather: want = coll_input_value(seed, static_cast<int>(i / per), i % per); break;
      // This rank keeps slice `rank` of the reduction.
      case CollOp::reduce_scatter: want = reduced(c, nranks, seed, rank * per + i); break;
      // From peer p: p's slice addressed to this rank.
      case CollOp::all_to_all: want = coll_input_value(seed, static_cast<int>(i / per), rank * per + i % per); break;
    }
    // Exact: every value is a small integer in every dtype.
    if (load(c.dtype, received.data(), i) != want) ++wrong;
  }
  return wrong;
}

}  // namespace sb
