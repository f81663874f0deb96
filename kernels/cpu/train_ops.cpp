// The cpu device's training ops (harness/train_ops.hpp): GEMMs through oneDNN
// matmul, everything else C++ loops (OpenMP over rows) on the compute thread.
//
// GEMM: op(A) and op(B) are described to oneDNN by their strides (tag ab or
// ba), so no transpose is ever copied. oneDNN writes C = alpha * A B + beta * C
// itself, in C's dtype, rounded once (alpha as its output scale, beta = 1 as
// its sum post-op): a bf16 GEMM here is what a GPU's is (bf16 inputs, fp32
// products and sums, one rounding), and what torch.mm / addmm on CPU run.
// Where oneDNN has no bf16 (or fp16) matmul on this CPU (oneDNN 2.6 needs
// AVX-512 BF16 / AVX512-FP16), the inputs are widened to fp32 first — exact,
// since every bf16 and fp16 value is an fp32 value — an fp32 matmul runs into
// an fp32 scratch, and one epilogue pass writes C: the same numbers, not the
// same speed. gemm_impl() says which ran.
//
// The fused epilogue replaced that scratch-and-pass on every path (2026-12-02):
// at micro batch 8 (2048 x 1024 outputs) the pass read and wrote 8 MiB more
// per GEMM than the GEMM itself, and PyTorch's step on the same CPU gained
// from larger micro batches where this one lost (tests/peer/batch_peer.py).
#include "kernels/cpu/detail/train_ops.hpp"

#include <algorithm>  // std::max
#include <bit>        // std::bit_cast
#include <cmath>      // std::exp, std::tanh, std::sqrt, std::isfinite
#include <cstring>    // std::memset, std::memcpy
#include <functional>  // std::function: captured ops
#include <map>        // std::map: the primitive cache
#include <vector>     // std::vector
#include <mutex>      // std::mutex: the primitive cache and scratch
#include <tuple>      // std::tuple: cache keys

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"                 // Error, OutOfMemory, UsageError
#include "harness/units.hpp"                  // format_bytes
#include "kernels/cpu/detail/dnnl_check.hpp"  // SB_DNNL_CHECK
#include "kernels/cpu/detail/omp_team.hpp"    // TeamScope
#include "kernels/cpu/detail/vec_math.hpp"    // exp_v, tanh_v

namespace sb::cpu {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// Element access by dtype. bf16 and fp16 round to nearest even; NaN stays NaN;
// fp16 overflows to inf and flushes below 2^-24 to zero (IEEE binary16).
inline float bf16_to_f(std::uint16_t b) { return std::bit_cast<float>(std::uint32_t(b) << 16); }
inline std::uint16_t f_to_bf16(float x) {  // a select, not a branch: it vectorises
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return std::uint16_t((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);  // NaN: quiet NaN
}
// fp16 by bit manipulation (F. Giesen's half_to_float_fast4 and
// float_to_half_fast3_rtne): a baseline x86-64 build has no F16C, and GCC's
// _Float16 conversions are then library calls, ~10x slower. Exact, and
// round to nearest even: unit-tested against _Float16 over every fp16 value
// and a sweep of fp32 bit patterns.
inline float fp16_to_f(std::uint16_t h) {
  constexpr std::uint32_t shifted_exp = 0x7c00u << 13;
  std::uint32_t o = (std::uint32_t(h) & 0x7fffu) << 13;
  const std::uint32_t exp = o & shifted_exp;
  o += (127u - 15u) << 23;
  if (exp == shifted_exp) {
    o += (128u - 16u) << 23;  // inf / NaN
  } else if (exp == 0) {       // zero / subnormal: renormalise through an fp32 subtraction
    o += 1u << 23;
    o = std::bit_cast<std::uint32_t>(std::bit_cast<float>(o) - std::bit_cast<float>(113u << 23));
  }
  o |= (std::uint32_t(h) & 0x8000u) << 16;
  return std::bit_cast<float>(o);
}
inline std::uint16_t f_to_fp16(float f) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = x & 0x80000000u;
  x ^= sign;
  std::uint32_t o;
  if (x >= 0x47800000u) {  // >= 65536 (or inf / NaN): inf, or a quiet NaN
    o = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (x < 0x38800000u) {  // below 2^-14: subnormal or zero, rounded by an fp32 addition (RNE)
    o = std::bit_cast<std::uint32_t>(std::bit_cast<float>(x) + 0.5f) - 0x3f000000u;
  } else {
    const std::uint32_t odd = (x >> 13) & 1u;
    x += ((15u - 127u) << 23) + 0xfffu;
    x += odd;
    o = x >> 13;
  }
  return std::uint16_t(o | (sign >> 16));
}

inline float ld(const void* p, DType t, std::int64_t i) {
  switch (t) {
    case DType::bf16: return bf16_to_f(static_cast<const std::uint16_t*>(p)[i]);
    case DType::fp16: return fp16_to_f(static_cast<const std::uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}
inline void st(void* p, DType t, std::int64_t i, float v) {
  switch (t) {
    case DType::bf16: static_cast<std::uint16_t*>(p)[i] = f_to_bf16(v); break;
    case DType::fp16: static_cast<std::uint16_t*>(p)[i] = f_to_fp16(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

// Loops over fewer elements than this run on the compute thread alone: a
// thread team's wake-up and its spinning workers cost more than they save,
// and on a 2-core machine the spinning takes the core the host thread needs.
constexpr std::int64_t kParallelMin = 1 << 16;

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)

// tanh and exp by vec_math.hpp's selects, so the activation loops vectorise
SB_INLINE float act_f(Act a, float z) {
  switch (a) {
    case Act::relu: return z > 0 || z != z ? z : 0.0f;  // NaN stays NaN (torch.relu's semantics)
    case Act::gelu: return 0.5f * z * (1.0f + tanh_v(kGeluC * (z + 0.044715f * z * z * z)));
    case Act::sigmoid: return 1.0f / (1.0f + exp_v(-z));
    case Act::tanh: return tanh_v(z);
    case Act::none: break;
  }
  return z;
}
SB_INLINE float act_d(Act a, float z) {
  switch (a) {
    case Act::relu: return z > 0 ? 1.0f : 0.0f;
    case Act::gelu: {
      const float u = kGeluC * (z + 0.044715f * z * z * z);
      const float t = tanh_v(u);
      return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * 0.044715f * z * z);
    }
    case Act::sigmoid: {
      const float s = 1.0f / (1.0f + exp_v(-z));
      return s * (1.0f - s);
    }
    case Act::tanh: {
      const float t = tanh_v(z);
      return 1.0f - t * t;
    }
    case Act::none: break;
  }
  return 1.0f;
}

// The element loops work in chunks: a chunk is loaded into fp32 with one
// dtype switch and a typed loop, computed in fp32, and stored back the same
// way, so every loop vectorises. A switch on the dtype per element (ld/st)
// cost ~7 ns an element: the casts, norms and activations of a bf16 decoder
// step took twice its GEMMs' time on this harness's cpu device.
constexpr std::int64_t kChunk = 256;

// The chunk functions are ISA clones (SB_CPU_CLONES, vec_math.hpp), as
// PyTorch's ATen kernels pick their ISA at run time: the baseline (SSE2) GELU
// backward took 9.5 ns an element on an AVX-512 CPU, the AVX-512 clone 1.3
// (glibc's scalar tanhf 28). cpu_clone_isa() says which clone runs.

SB_CPU_CLONES void load_f(const void* p, DType t, std::int64_t i0, std::int64_t len, float* out) {
  if (t == DType::bf16) {
    const auto* q = static_cast<const std::uint16_t*>(p) + i0;
#pragma omp simd
    for (std::int64_t i = 0; i < len; ++i) out[i] = bf16_to_f(q[i]);
  } else if (t == DType::fp16) {
    const auto* q = static_cast<const std::uint16_t*>(p) + i0;
#pragma omp simd
    for (std::int64_t i = 0; i < len; ++i) out[i] = fp16_to_f(q[i]);
  } else {
    std::memcpy(out, static_cast<const float*>(p) + i0, std::size_t(len) * sizeof(float));
  }
}
SB_CPU_CLONES void store_f(void* p, DType t, std::int64_t i0, std::int64_t len, const float* in) {
  if (t == DType::bf16) {
    auto* q = static_cast<std::uint16_t*>(p) + i0;
#pragma omp simd
    for (std::int64_t i = 0; i < len; ++i) q[i] = f_to_bf16(in[i]);
  } else if (t == DType::fp16) {
    auto* q = static_cast<std::uint16_t*>(p) + i0;
#pragma omp simd
    for (std::int64_t i = 0; i < len; ++i) q[i] = f_to_fp16(in[i]);
  } else {
    std::memcpy(static_cast<float*>(p) + i0, in, std::size_t(len) * sizeof(float));
  }
}
// f(i0, len) over [0, n) in chunks, on the device's OpenMP team when n is large
template <class F>
void for_chunks(std::int64_t n, F&& f) {
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c) f(c * kChunk, std::min(kChunk, n - c * kChunk));
}
// v += alpha * t
SB_CPU_CLONES void axpy_chunk(float* v, const float* t, float alpha, std::int64_t len) {
#pragma omp simd
  for (std::int64_t i = 0; i < len; ++i) v[i] += alpha * t[i];
}
SB_CPU_CLONES float dot_chunk(const float* a, const float* b, std::int64_t len) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (std::int64_t i = 0; i < len; ++i) s += a[i] * b[i];
  return s;
}
// g = rs * (g - y * mean): rmsnorm's backward
SB_CPU_CLONES void rms_bwd_chunk(float* g, const float* y, float rs, float mean, std::int64_t len) {
#pragma omp simd
  for (std::int64_t i = 0; i < len; ++i) g[i] = rs * (g[i] - y[i] * mean);
}
SB_CPU_CLONES void scale_chunk(float* v, float a, std::int64_t len) {
#pragma omp simd
  for (std::int64_t i = 0; i < len; ++i) v[i] *= a;
}
struct AdamW {
  float lr, beta1, beta2, eps, weight_decay, bc1, bc2, grad_scale;
};
SB_CPU_CLONES void adamw_chunk(float* p, float* m, float* v, const float* g, const AdamW& h, std::int64_t len) {
#pragma omp simd
  for (std::int64_t i = 0; i < len; ++i) {
    const float gi = g[i] * h.grad_scale;
    m[i] = h.beta1 * m[i] + (1.0f - h.beta1) * gi;
    v[i] = h.beta2 * v[i] + (1.0f - h.beta2) * gi * gi;
    p[i] -= h.lr * h.weight_decay * p[i];
    p[i] -= h.lr * (m[i] / h.bc1) / (std::sqrt(v[i] / h.bc2) + h.eps);
  }
}
SB_CPU_CLONES void sgd_chunk(float* p, const float* g, float lr, float weight_decay, float grad_scale,
                             std::int64_t len) {
#pragma omp simd
  for (std::int64_t i = 0; i < len; ++i) p[i] -= lr * (g[i] * grad_scale + weight_decay * p[i]);
}

template <Act A>
SB_INLINE void act_loop(const float* z, float* y, std::int64_t len) {
#pragma omp simd
  for (std::int64_t i = 0; i < len; ++i) y[i] = act_f(A, z[i]);
}
SB_CPU_CLONES void act_chunk(Act a, const float* z, float* y, std::int64_t len) {
  switch (a) {
    case Act::relu: act_loop<Act::relu>(z, y, len); break;
    case Act::gelu: act_loop<Act::gelu>(z, y, len); break;
    case Act::sigmoid: act_loop<Act::sigmoid>(z, y, len); break;
    case Act::tanh: act_loop<Act::tanh>(z, y, len); break;
    case Act::none: std::memcpy(y, z, std::size_t(len) * sizeof(float)); break;
  }
}
// dz = dy * act'(z) in place of dy
template <Act A>
SB_INLINE void act_d_loop(const float* z, float* dy, std::int64_t len) {
#pragma omp simd
  for (std::int64_t i = 0; i < len; ++i)
    // relu selects: dy where z > 0, else 0 (a NaN dy at z <= 0 gives 0, not NaN * 0; a NaN z
    // gives 0 here, where torch's threshold_backward passes dy: the NaN shows in the forward)
    dy[i] = A == Act::relu ? (z[i] > 0 ? dy[i] : 0.0f) : dy[i] * act_d(A, z[i]);
}
SB_CPU_CLONES void act_d_chunk(Act a, const float* z, float* dy, std::int64_t len) {
  switch (a) {
    case Act::relu: act_d_loop<Act::relu>(z, dy, len); break;
    case Act::gelu: act_d_loop<Act::gelu>(z, dy, len); break;
    case Act::sigmoid: act_d_loop<Act::sigmoid>(z, dy, len); break;
    case Act::tanh: act_d_loop<Act::tanh>(z, dy, len); break;
    case Act::none: break;
  }
}

template <class T, DType D>
inline float ld_t(const T* p, std::int64_t i) {
  if constexpr (D == DType::bf16) return bf16_to_f(p[i]);
  else if constexpr (D == DType::fp16) return fp16_to_f(p[i]);
  else return p[i];
}

// sumsq of the finite values, NaN/inf count, exact zeros, nonzero |v| < 2^-14.
template <class T, DType D>
void stats_of(const void* pv, std::int64_t n, double r[4]) {
  const T* p = static_cast<const T*>(pv);
  constexpr float kTiny = 6.103515625e-05f;  // 2^-14, fp16's smallest normal
  constexpr float kMax = 3.402823466e38f;
  double ss = 0;
  std::int64_t nonfinite = 0, zero = 0, tiny = 0;
  // Blocks of 4096 summed in fp32 (vectorisable, no branches), then in fp64.
#pragma omp parallel for schedule(static) reduction(+ : ss, nonfinite, zero, tiny) if (n > kParallelMin)
  for (std::int64_t b0 = 0; b0 < n; b0 += 4096) {
    const std::int64_t b1 = std::min(n, b0 + 4096);
    float s = 0;
    std::int32_t nf = 0, z = 0, t = 0;
#pragma omp simd reduction(+ : s, nf, z, t)
    for (std::int64_t i = b0; i < b1; ++i) {
      const float v = ld_t<T, D>(p, i);
      const float a = std::fabs(v);
      const bool fin = a <= kMax;  // false for NaN and inf
      nf += fin ? 0 : 1;
      z += v == 0.0f ? 1 : 0;
      t += (a < kTiny) & (v != 0.0f) ? 1 : 0;
      s += fin ? v * v : 0.0f;
    }
    ss += double(s);  // inf when finite values square past fp32's range (a norm over 1.8e19): the slot is fp32
                      // anyway; the training loop treats a finite gradient with an inf norm as unclippable
    nonfinite += nf;
    zero += z;
    tiny += t;
  }
  r[0] = ss;
  r[1] = double(nonfinite);
  r[2] = double(zero);
  r[3] = double(tiny);
}

void check_dtype(const DTensor& t, const char* what) {
  if (t.dtype != DType::fp32 && t.dtype != DType::bf16 && t.dtype != DType::fp16)
    throw UsageError(fmt::format("training op {}: dtype {} is not one of fp32, bf16, fp16", what, to_string(t.dtype)));
}
void check_size(const DTensor& t, std::int64_t n, const char* what) {
  if (n < 0 || n > t.numel)
    throw Error(ErrorKind::runtime,
                fmt::format("training op {}: {} elements asked of a tensor of {}", what, n, t.numel));
}

class CpuTrainOps final : public TrainOps {
 public:
  explicit CpuTrainOps(TrainEnv env) : env_(std::move(env)), strm_(SB_DNNL_CHECK(dnnl::stream(env_.eng))) {
    native_[DType::bf16] = has_native(dt::bf16);
    native_[DType::fp16] = has_native(dt::f16);
    native_[DType::fp32] = true;
  }

  std::string impl() const override {
    // no dtype here: an fp32 run's impl said "bf16 matmul"; each point's gemm_impl names its own
    return fmt::format("oneDNN matmul + C++ loops on the compute thread, element loops {}", cpu_clone_isa());
  }
  std::string gemm_impl(DType t) const override {
    if (t == DType::fp32) return "fp32 matmul";
    auto it = native_.find(t);
    if (it != native_.end() && it->second) return fmt::format("{} matmul, fp32 accumulation", to_string(t));
    return fmt::format("{} emulated: inputs widened exactly to fp32, fp32 matmul, output rounded to {} "
                       "(oneDNN has no {} matmul on this CPU)",
                       to_string(t), to_string(t), to_string(t));
  }

  DTensor alloc(std::int64_t numel, DType dtype, const std::string& what) override {
    no_capture("alloc");
    if (numel < 0) throw UsageError(fmt::format("{}: negative size", what));
    DTensor t;
    t.dtype = dtype;
    t.numel = numel;
    check_dtype(t, what.c_str());
    const std::size_t bytes = t.bytes();
    auto block = std::make_shared<LedgerBlock>(env_.ledger->alloc(bytes, what));
    void* p = block->data();
    // Freed in stream order: a tensor dropped while work on it is still queued
    // (a host exception unwinding a half-built model) is released by the
    // stream after that work, not under it.
    ComputeStream* cs = &env_.cs;
    t.buf = Buffer(p, bytes, MemKind::device, [block, cs](void*) mutable {
      try {
        cs->enqueue("free", [b = std::move(block)] {});
      } catch (...) {
        block.reset();  // the stream cannot take it: free now
      }
    });
    if (p) env_.cs.enqueue("zero " + what, [p, bytes] { std::memset(p, 0, bytes); });
    return t;
  }

  void upload(DTensor& t, std::span<const float> host) override {
    no_capture("upload");
    check_size(t, std::int64_t(host.size()), "upload");
    void* p = t.data();
    const DType d = t.dtype;
    env_.cs.enqueue("upload", [p, d, host] {
      for (std::size_t i = 0; i < host.size(); ++i) st(p, d, std::int64_t(i), host[i]);
    });
    env_.sync(std::chrono::minutes(5));
  }
  void download(const DTensor& t, std::span<float> host, std::int64_t timeout_ms) override {
    no_capture("download");
    check_size(t, std::int64_t(host.size()), "download");
    env_.sync(std::chrono::milliseconds(timeout_ms));
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = ld(t.data(), t.dtype, std::int64_t(i));
  }

  // oneDNN's matmul type for an input dtype: f32 where the dtype is emulated
  dt matmul_type(DType in) const {
    return !native_.at(in) || in == DType::fp32 ? dt::f32 : (in == DType::bf16 ? dt::bf16 : dt::f16);
  }

  std::size_t gemm_workspace_bytes(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                                   DType in) override {
    if (m <= 0 || n <= 0 || k <= 0 || !native_.count(in)) return 0;
    const bool widen = !native_.at(in);
    const dt t = matmul_type(in);
    if (widen) return widened_workspace(m, n, k, primitive(ta, tb, m, n, k, t, dt::f32, 1.0f, false)->sp_bytes);
    // fused: the scratchpad alone, the largest of the forms a call can take (C fp32 or the input's dtype,
    // beta 0 or 1), plus 64 B (never an empty block)
    std::size_t sp_b = 0;
    for (dt out : {dt::f32, t})
      for (bool sum : {false, true}) sp_b = std::max(sp_b, primitive(ta, tb, m, n, k, t, out, 1.0f, sum)->sp_bytes);
    return sp_b + 64;
  }

  void reserve_gemm_workspace(std::size_t bytes) override {
    no_capture("reserve_gemm_workspace");
    if (bytes) (void)scratch_of(bytes);
  }

  void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const DTensor& a,
            const DTensor& b, float beta, DTensor& c) override {
    if (m <= 0 || n <= 0 || k <= 0) throw UsageError(fmt::format("gemm {}x{}x{}: sizes must be positive", m, n, k));
    if (a.dtype != b.dtype) throw UsageError("gemm: A and B must share a dtype");
    if (c.dtype != DType::fp32 && c.dtype != a.dtype) throw UsageError("gemm: C must be fp32 or A's dtype");
    if (beta != 0.0f && beta != 1.0f) throw UsageError("gemm: beta must be 0 or 1");
    check_dtype(a, "gemm");
    check_size(a, m * k, "gemm A");
    check_size(b, k * n, "gemm B");
    check_size(c, m * n, "gemm C");
    const DType in = a.dtype;
    const bool widen = !native_.at(in);
    const DType ct = c.dtype;
    const void* ap = a.data();
    const void* bp = b.data();
    void* cp = c.data();
    const std::string label = fmt::format("gemm {}{} {}x{}x{} {}", ta ? "T" : "N", tb ? "T" : "N", m, n, k,
                                          to_string(in));
    // The scratch this call's own primitive needs (reserve_gemm_workspace made the step's largest before it
    // ran): one primitive lookup a call, not the workspace query's one per form.
    if (!widen) {
      // C's dtype is fp32 or the input's (checked above), both oneDNN destinations here
      auto prim = primitive(ta, tb, m, n, k, matmul_type(in), ct == DType::fp32 ? dt::f32 : matmul_type(in), alpha,
                            beta != 0.0f);
      auto scratch = scratch_of(prim->sp_bytes + 64);
      submit(label, [=, strm = strm_, eng = env_.eng] () mutable {
        dnnl::memory am(prim->a_md, eng, const_cast<void*>(ap));
        dnnl::memory bm(prim->b_md, eng, const_cast<void*>(bp));
        dnnl::memory cm(prim->c_md, eng, cp);
        dnnl::memory spm(prim->pd.scratchpad_desc(), eng, scratch->data());
        SB_DNNL_CHECK(prim->prim.execute(
            strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, spm}}));
        SB_DNNL_CHECK(strm.wait());
      });
      return;
    }
    auto prim = primitive(ta, tb, m, n, k, dt::f32, dt::f32, 1.0f, false);
    auto scratch = scratch_of(widened_workspace(m, n, k, prim->sp_bytes));
    // scratch: T [m,n] fp32, and the widened A and B
    const std::size_t t_b = std::size_t(m * n) * 4, aw_b = std::size_t(m * k) * 4, bw_b = std::size_t(k * n) * 4;
    submit(label, [=, strm = strm_, eng = env_.eng] () mutable {
      auto* base = static_cast<unsigned char*>(scratch->data());
      auto align = [](std::size_t x) { return (x + 63) / 64 * 64; };
      auto* tp = reinterpret_cast<float*>(base);
      auto* awp = reinterpret_cast<float*>(base + align(t_b));
      auto* bwp = reinterpret_cast<float*>(base + align(t_b) + align(aw_b));
      void* spp = base + align(t_b) + align(aw_b) + align(bw_b);
      for_chunks(m * k, [&](std::int64_t i0, std::int64_t len) { load_f(ap, in, i0, len, awp + i0); });
      for_chunks(k * n, [&](std::int64_t i0, std::int64_t len) { load_f(bp, in, i0, len, bwp + i0); });
      dnnl::memory am(prim->a_md, eng, awp);
      dnnl::memory bm(prim->b_md, eng, bwp);
      dnnl::memory tm(prim->c_md, eng, tp);
      dnnl::memory spm(prim->pd.scratchpad_desc(), eng, spp);
      SB_DNNL_CHECK(prim->prim.execute(
          strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, tm}, {DNNL_ARG_SCRATCHPAD, spm}}));
      SB_DNNL_CHECK(strm.wait());
      for_chunks(m * n, [&](std::int64_t i0, std::int64_t len) {
        float v[kChunk];
        if (beta != 0.0f) {
          load_f(cp, ct, i0, len, v);
        } else {
          std::fill_n(v, len, 0.0f);  // C's old values unread: garbage or NaN there never leaks in
        }
        axpy_chunk(v, tp + i0, alpha, len);
        store_f(cp, ct, i0, len, v);
      });
    });
  }

  void cast(const DTensor& src, DTensor& dst, std::int64_t n) override {
    check_size(src, n, "cast src");
    check_size(dst, n, "cast dst");
    const void* s = src.data();
    void* d = dst.data();
    const DType st_ = src.dtype, dt_ = dst.dtype;
    submit("cast", [=] {
      for_chunks(n, [&](std::int64_t i0, std::int64_t len) {
        float v[kChunk];
        load_f(s, st_, i0, len, v);
        store_f(d, dt_, i0, len, v);
      });
    });
  }

  void bias_act(DTensor& z, const DTensor* bias, Act act, const DTensor* residual, DTensor& y, std::int64_t rows,
                std::int64_t cols) override {
    const std::int64_t n = rows * cols;
    check_size(z, n, "bias_act z");
    check_size(y, n, "bias_act y");
    if (bias) check_size(*bias, cols, "bias_act bias");
    if (residual) check_size(*residual, n, "bias_act residual");
    void* zp = z.data();
    void* yp = y.data();
    const void* bp = bias ? bias->data() : nullptr;
    const void* rp = residual ? residual->data() : nullptr;
    const DType zt = z.dtype, yt = y.dtype, bt = bias ? bias->dtype : DType::fp32,
                rt = residual ? residual->dtype : DType::fp32;
    // y may be z or the residual (an in-place residual add): each chunk is read before it is written
    submit("bias_act", [=] {
      for_chunks(n, [&](std::int64_t i0, std::int64_t len) {
        float v[kChunk], o[kChunk];
        load_f(zp, zt, i0, len, v);
        if (bp) {
          for (std::int64_t i = 0; i < len; ++i) v[i] += ld(bp, bt, (i0 + i) % cols);
          store_f(zp, zt, i0, len, v);
          load_f(zp, zt, i0, len, v);  // what the backward will read: z rounded to its dtype
        }
        act_chunk(act, v, o, len);
        if (rp) {
          load_f(rp, rt, i0, len, v);
          axpy_chunk(o, v, 1.0f, len);
        }
        store_f(yp, yt, i0, len, o);
      });
    });
  }

  void act_backward(const DTensor& dy, const DTensor& z, Act act, DTensor& dz, std::int64_t n) override {
    check_size(dy, n, "act_backward dy");
    check_size(z, n, "act_backward z");
    check_size(dz, n, "act_backward dz");
    const void* dyp = dy.data();
    const void* zp = z.data();
    void* dzp = dz.data();
    const DType a = dy.dtype, b = z.dtype, c = dz.dtype;
    submit("act_backward", [=] {
      for_chunks(n, [&](std::int64_t i0, std::int64_t len) {
        float z[kChunk], g[kChunk];
        load_f(zp, b, i0, len, z);
        load_f(dyp, a, i0, len, g);
        act_d_chunk(act, z, g, len);
        store_f(dzp, c, i0, len, g);
      });
    });
  }

  void bias_grad(const DTensor& dz, DTensor& db, std::int64_t rows, std::int64_t cols) override {
    check_size(dz, rows * cols, "bias_grad dz");
    check_size(db, cols, "bias_grad db");
    const void* zp = dz.data();
    void* bp = db.data();
    const DType zt = dz.dtype, bt = db.dtype;
    // a column block at a time, summed over the rows in row order (fp32, as before: contiguous loads)
    submit("bias_grad", [=] {
      const std::int64_t blocks = (cols + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if ((rows * cols) > kParallelMin)
      for (std::int64_t bk = 0; bk < blocks; ++bk) {
        const std::int64_t j0 = bk * kChunk, len = std::min(kChunk, cols - j0);
        float acc[kChunk] = {}, v[kChunk];
        for (std::int64_t r = 0; r < rows; ++r) {
          load_f(zp, zt, r * cols + j0, len, v);
          axpy_chunk(acc, v, 1.0f, len);
        }
        store_f(bp, bt, j0, len, acc);
      }
    });
  }

  void rmsnorm(const DTensor& x, DTensor& y, DTensor& rstd, std::int64_t rows, std::int64_t cols,
               float eps) override {
    check_size(x, rows * cols, "rmsnorm x");
    check_size(y, rows * cols, "rmsnorm y");
    check_size(rstd, rows, "rmsnorm rstd");
    const void* xp = x.data();
    void* yp = y.data();
    void* rp = rstd.data();
    const DType xt = x.dtype, yt = y.dtype, rt = rstd.dtype;
    submit("rmsnorm", [=] {
#pragma omp parallel for schedule(static) if ((rows * cols) > kParallelMin)
      for (std::int64_t r = 0; r < rows; ++r) {
        float v[kChunk];
        float ss = 0;
        for (std::int64_t j0 = 0; j0 < cols; j0 += kChunk) {
          const std::int64_t len = std::min(kChunk, cols - j0);
          load_f(xp, xt, r * cols + j0, len, v);
          ss += dot_chunk(v, v, len);
        }
        const float rs = 1.0f / std::sqrt(ss / float(cols) + eps);
        st(rp, rt, r, rs);
        for (std::int64_t j0 = 0; j0 < cols; j0 += kChunk) {
          const std::int64_t len = std::min(kChunk, cols - j0);
          load_f(xp, xt, r * cols + j0, len, v);
          scale_chunk(v, rs, len);
          store_f(yp, yt, r * cols + j0, len, v);
        }
      }
    });
  }
  void rmsnorm_backward(const DTensor& dy, const DTensor& y, const DTensor& rstd, DTensor& dx, std::int64_t rows,
                        std::int64_t cols) override {
    check_size(dy, rows * cols, "rmsnorm_backward dy");
    check_size(y, rows * cols, "rmsnorm_backward y");
    check_size(rstd, rows, "rmsnorm_backward rstd");
    check_size(dx, rows * cols, "rmsnorm_backward dx");
    const void* dyp = dy.data();
    const void* yp = y.data();
    const void* rp = rstd.data();
    void* dxp = dx.data();
    const DType a = dy.dtype, b = y.dtype, c = rstd.dtype, d = dx.dtype;
    submit("rmsnorm_backward", [=] {
#pragma omp parallel for schedule(static) if ((rows * cols) > kParallelMin)
      for (std::int64_t r = 0; r < rows; ++r) {
        float g[kChunk], yv[kChunk];
        float dot = 0;
        for (std::int64_t j0 = 0; j0 < cols; j0 += kChunk) {
          const std::int64_t len = std::min(kChunk, cols - j0);
          load_f(dyp, a, r * cols + j0, len, g);
          load_f(yp, b, r * cols + j0, len, yv);
          dot += dot_chunk(g, yv, len);
        }
        const float mean = dot / float(cols), rs = ld(rp, c, r);
        for (std::int64_t j0 = 0; j0 < cols; j0 += kChunk) {
          const std::int64_t len = std::min(kChunk, cols - j0);
          load_f(dyp, a, r * cols + j0, len, g);
          load_f(yp, b, r * cols + j0, len, yv);
          rms_bwd_chunk(g, yv, rs, mean, len);
          store_f(dxp, d, r * cols + j0, len, g);
        }
      }
    });
  }

  void mse_loss(const DTensor& y, const DTensor& target, DTensor& loss, DTensor& dy, std::int64_t n,
                float scale) override {
    check_size(y, n, "mse_loss y");
    check_size(target, n, "mse_loss target");
    check_size(loss, 1, "mse_loss loss");
    check_size(dy, n, "mse_loss dy");
    const void* yp = y.data();
    const void* tp = target.data();
    void* lp = loss.data();
    void* dp = dy.data();
    const DType a = y.dtype, b = target.dtype, c = loss.dtype, d = dy.dtype;
    submit("mse_loss", [=] {
      double s = 0;
#pragma omp parallel for schedule(static) reduction(+ : s) if ((n) > kParallelMin)
      for (std::int64_t i = 0; i < n; ++i) {
        const float e = ld(yp, a, i) - ld(tp, b, i);
        s += double(e) * double(e);
        st(dp, d, i, scale * 2.0f * e / float(n));
      }
      st(lp, c, 0, float(s / double(n)));
    });
  }

  void xent_loss(const DTensor& logits, const DTensor& labels, DTensor& loss, DTensor& dlogits, std::int64_t rows,
                 std::int64_t classes, float scale) override {
    check_size(logits, rows * classes, "xent_loss logits");
    check_size(labels, rows, "xent_loss labels");
    check_size(loss, 1, "xent_loss loss");
    check_size(dlogits, rows * classes, "xent_loss dlogits");
    const void* zp = logits.data();
    const void* lp = labels.data();
    void* op = loss.data();
    void* dp = dlogits.data();
    const DType a = logits.dtype, b = labels.dtype, c = loss.dtype, d = dlogits.dtype;
    submit("xent_loss", [=] {
      double s = 0;
#pragma omp parallel for schedule(static) reduction(+ : s) if ((rows * classes) > kParallelMin)
      for (std::int64_t r = 0; r < rows; ++r) {
        float mx = -INFINITY;
        for (std::int64_t j = 0; j < classes; ++j) mx = std::max(mx, ld(zp, a, r * classes + j));
        double sum = 0;
        for (std::int64_t j = 0; j < classes; ++j) sum += std::exp(double(ld(zp, a, r * classes + j) - mx));
        const float lf = ld(lp, b, r);
        const bool in = lf >= 0 && lf < float(classes) && lf == std::floor(lf);  // false for NaN
        const std::int64_t label = in ? std::int64_t(lf) : -1;
        const double lse = double(mx) + std::log(sum);
        s += in ? lse - double(ld(zp, a, r * classes + label)) : NAN;
        for (std::int64_t j = 0; j < classes; ++j) {
          const double p = std::exp(double(ld(zp, a, r * classes + j)) - lse);
          st(dp, d, r * classes + j, float(double(scale) * (p - (j == label ? 1.0 : 0.0)) / double(rows)));
        }
      }
      st(op, c, 0, float(s / double(rows)));
    });
  }

  void stats(const DTensor& t, std::int64_t n, DTensor& out, std::int64_t slot) override {
    const DTensor* one[] = {&t};
    const std::int64_t ns[] = {n};
    stats_many(one, ns, out, slot);
  }

  // One work item and one parallel region for every tensor (what torch's
  // _amp_foreach_non_finite_check_and_unscale_ does on a GPU): the per-op
  // cost of a stream item and a thread team's fork is paid once.
  void stats_many(std::span<const DTensor* const> ts, std::span<const std::int64_t> ns, DTensor& out,
                  std::int64_t first_slot) override {
    if (ts.size() != ns.size()) throw Error(ErrorKind::runtime, "stats_many: one count per tensor");
    check_size(out, (first_slot + std::int64_t(ts.size())) * kStatsPerTensor, "stats out");
    if (out.dtype != DType::fp32) throw UsageError("stats: the output must be fp32");
    struct Job {
      const void* p;
      DType d;
      std::int64_t n;
      float* o;
    };
    std::vector<Job> jobs;
    for (std::size_t k = 0; k < ts.size(); ++k) {
      check_size(*ts[k], ns[k], "stats");
      jobs.push_back({ts[k]->data(), ts[k]->dtype, ns[k],
                      static_cast<float*>(out.data()) + (first_slot + std::int64_t(k)) * kStatsPerTensor});
    }
    submit("stats", [jobs = std::move(jobs)] {
      for (const Job& j : jobs) {
        double r[4];
        switch (j.d) {
          case DType::bf16: stats_of<std::uint16_t, DType::bf16>(j.p, j.n, r); break;
          case DType::fp16: stats_of<std::uint16_t, DType::fp16>(j.p, j.n, r); break;
          default: stats_of<float, DType::fp32>(j.p, j.n, r); break;
        }
        for (int i = 0; i < 4; ++i) j.o[i] = float(r[i]);
      }
    });
  }

  void poke(DTensor& t, std::int64_t index, float value) override {
    check_size(t, index + 1, "poke");
    void* p = t.data();
    const DType d = t.dtype;
    submit("poke", [=] { st(p, d, index, value); });
  }

  void sgd(DTensor& p, const DTensor& g, std::int64_t n, float lr, float weight_decay, float grad_scale) override {
    check_size(p, n, "sgd p");
    check_size(g, n, "sgd g");
    if (p.dtype != DType::fp32) throw UsageError("sgd: parameters must be fp32 (master weights)");
    auto* pp = static_cast<float*>(p.data());
    const void* gp = g.data();
    const DType gt = g.dtype;
    submit("sgd", [=] {
      for_chunks(n, [&](std::int64_t i0, std::int64_t len) {
        float g[kChunk];
        load_f(gp, gt, i0, len, g);
        sgd_chunk(pp + i0, g, lr, weight_decay, grad_scale, len);
      });
    });
  }

  void adamw(DTensor& p, const DTensor& g, DTensor& m, DTensor& v, std::int64_t n, float lr, float beta1, float beta2,
             float eps, float weight_decay, int step, float grad_scale) override {
    for (const DTensor* t : {&p, &m, &v}) {
      check_size(*t, n, "adamw state");
      if (t->dtype != DType::fp32) throw UsageError("adamw: parameters and moments must be fp32");
    }
    check_size(g, n, "adamw g");
    if (step < 1) throw UsageError("adamw: step counts from 1");
    auto* pp = static_cast<float*>(p.data());
    auto* mp = static_cast<float*>(m.data());
    auto* vp = static_cast<float*>(v.data());
    const void* gp = g.data();
    const DType gt = g.dtype;
    const AdamW h{lr, beta1, beta2, eps, weight_decay, 1.0f - std::pow(beta1, float(step)),
                  1.0f - std::pow(beta2, float(step)), grad_scale};
    submit("adamw", [=] {
      for_chunks(n, [&](std::int64_t i0, std::int64_t len) {
        float g[kChunk];
        load_f(gp, gt, i0, len, g);
        adamw_chunk(pp + i0, mp + i0, vp + i0, g, h, len);
      });
    });
  }

  void zero(DTensor& t) override {
    void* p = t.data();
    const std::size_t bytes = t.bytes();
    submit("zero", [p, bytes] {
      if (p) std::memset(p, 0, bytes);
    });
  }

  void begin_capture() override {
    if (capturing_) throw Error(ErrorKind::runtime, "training ops: begin_capture while capturing");
    capturing_ = true;
    captured_ = std::make_shared<std::vector<std::function<void()>>>();
  }
  std::unique_ptr<TrainGraph> end_capture() override {
    if (!capturing_) throw Error(ErrorKind::runtime, "training ops: end_capture without begin_capture");
    capturing_ = false;
    return std::make_unique<Graph>(env_.cs, std::move(captured_));
  }

 private:
  // A replay is one stream item that runs every captured op in order: the
  // per-op submission (queue, lock, wake-up) is paid once per graph, not
  // per op: what a CUDA graph saves a GPU's launches, here.
  class Graph final : public TrainGraph {
   public:
    Graph(ComputeStream& cs, std::shared_ptr<std::vector<std::function<void()>>> fns) : cs_(cs), fns_(std::move(fns)) {}
    void replay() override {
      cs_.enqueue(fmt::format("graph replay ({} ops)", fns_->size()), [f = fns_] {
        for (auto& fn : *f) fn();
      });
    }
    std::size_t nodes() const override { return fns_->size(); }

   private:
    ComputeStream& cs_;
    std::shared_ptr<std::vector<std::function<void()>>> fns_;
  };

  void submit(std::string label, std::function<void()> fn) {
    if (capturing_) {
      captured_->push_back(std::move(fn));
      return;
    }
    env_.cs.enqueue(std::move(label), std::move(fn));
  }
  void no_capture(const char* what) const {
    if (capturing_) throw Error(ErrorKind::runtime, fmt::format("training ops: {} while capturing", what));
  }

  bool capturing_ = false;
  std::shared_ptr<std::vector<std::function<void()>>> captured_;

  struct Prim {
    dnnl::memory::desc a_md, b_md, c_md;
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul prim;
    std::size_t sp_bytes = 0;
  };

  bool has_native(dt t) const {
    try {
      const dnnl::matmul::desc d({{64, 64}, t, tag::ab}, {{64, 64}, t, tag::ab}, {{64, 64}, dt::f32, tag::ab});
      dnnl::matmul::primitive_desc pd(d, env_.eng);
      // oneDNN 2.6 may answer with a reference (unoptimised) kernel: not "native".
      return std::string(pd.impl_info_str()).find("ref") == std::string::npos;
    } catch (const dnnl::error&) {
      return false;
    }
  }

  // An emulated dtype's GEMM scratch: T [m,n] fp32, the widened A and B, the scratchpad, 64 B of alignment for
  // each of the four.
  static std::size_t widened_workspace(std::int64_t m, std::int64_t n, std::int64_t k, std::size_t sp_bytes) {
    return std::size_t(m * n) * 4 + std::size_t(m * k + k * n) * 4 + sp_bytes + 4 * 64;
  }

  // C = alpha * op(A) op(B) (+ C with sum): alpha is oneDNN's output scale, applied before the sum
  // post-op, so C's old value is never scaled; both in fp32, C rounded once to its dtype.
  std::shared_ptr<Prim> primitive(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, dt t, dt out,
                                  float alpha, bool sum) {
    // made on this (the host) thread for the compute thread's team (omp_team.hpp), which is part of the key
    const int team = env_.cs.team();
    const auto key =
        std::make_tuple(ta, tb, m, n, k, int(t), int(out), std::bit_cast<std::uint32_t>(alpha), sum, team);
    std::lock_guard<std::mutex> lk(mu_);
    auto it = prims_.find(key);
    if (it != prims_.end()) return it->second;
    auto p = std::make_shared<Prim>();
    p->a_md = dnnl::memory::desc({m, k}, t, ta ? tag::ba : tag::ab);
    p->b_md = dnnl::memory::desc({k, n}, t, tb ? tag::ba : tag::ab);
    p->c_md = dnnl::memory::desc({m, n}, out, tag::ab);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (sum) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    const TeamScope scope(team);
    p->pd = SB_DNNL_CHECK(dnnl::matmul::primitive_desc(dnnl::matmul::desc(p->a_md, p->b_md, p->c_md), attr, env_.eng));
    p->prim = SB_DNNL_CHECK(dnnl::matmul(p->pd));
    p->sp_bytes = p->pd.scratchpad_desc().get_size();
    prims_.emplace(key, p);
    return p;
  }

  // The GEMM scratch: grown, never shrunk; a block a queued GEMM still uses
  // lives as long as its work item (shared ownership). Counted in the
  // ledger as workspace, so memory_stats() sees it.
  std::shared_ptr<LedgerBlock> scratch_of(std::size_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!scratch_ || scratch_->bytes() < bytes)
      scratch_ = std::make_shared<LedgerBlock>(
          env_.ledger->alloc(bytes, fmt::format("training-op GEMM workspace ({})", format_bytes(double(bytes)))));
    return scratch_;
  }

  TrainEnv env_;
  dnnl::stream strm_;
  std::map<DType, bool> native_;
  std::mutex mu_;
  std::map<std::tuple<bool, bool, std::int64_t, std::int64_t, std::int64_t, int, int, std::uint32_t, bool, int>,
           std::shared_ptr<Prim>>
      prims_;
  std::shared_ptr<LedgerBlock> scratch_;
};

}  // namespace

std::uint16_t fp16_bits_fast(float x) { return f_to_fp16(x); }
float fp16_value_fast(std::uint16_t b) { return fp16_to_f(b); }

std::unique_ptr<TrainOps> make_train_ops(TrainEnv env) { return std::make_unique<CpuTrainOps>(std::move(env)); }

}  // namespace sb::cpu
