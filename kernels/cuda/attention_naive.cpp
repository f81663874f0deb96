// Naive attention on the cuda device: PyTorch's math path. The score matrix
// S = scale * Q K^T is materialized, softmaxed row by row into P, and
// O = P V; backward runs four more GEMMs and the softmax backward. Its memory
// is quadratic in the sequence length (B*H*S^2 per buffer), which is what the
// attention scenario shows against cuDNN's fused SDPA.
//
// Also here: the tensors both implementations share (AttnTensors) and the
// split of a shape into independent segments.
#include <algorithm>  // std::max
#include <climits>    // INT_MAX
#include <cmath>      // std::sqrt
#include <cstdint>    // std::int64_t, std::uint64_t
#include <memory>     // std::make_unique
#include <span>       // std::span
#include <string>     // std::string
#include <utility>    // std::move
#include <vector>     // std::vector

#include <cublas_v2.h>   // cublasGemmStridedBatchedEx
#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"                  // Error, OutOfMemory, UnsupportedError, UsageError
#include "kernels/cuda/detail/check.hpp"       // SB_CUDA_CHECK, SB_CUBLAS_CHECK
#include "kernels/cuda/detail/cuda_gemm.hpp"   // kSetupTimeout
#include "kernels/cuda/detail/cudnn_sdpa.hpp"  // AttnContext, AttnTensors, AttnSegment, make_naive_attention
#include "kernels/cuda/fill.cuh"               // fill_uniform, convert_from_fp32, convert_to_fp32
#include "kernels/cuda/softmax.cuh"            // softmax_rows_forward, softmax_rows_backward

namespace sb::cuda_detail {

std::vector<AttnSegment> attention_segments(const AttnShape& s, const std::string& id) {
  if (s.batch <= 0 || s.heads <= 0 || s.seq <= 0 || s.head_dim <= 0)
    throw UsageError(fmt::format("{}: attention shape B={} H={} S={} D={} must be positive", id, s.batch, s.heads,
                                 s.seq, s.head_dim));
  const std::int64_t d = s.head_dim;
  if (!s.varlen()) return {AttnSegment{s.seq, 0, s.seq * d, s.batch * s.heads}};

  const auto& cu = s.cu_seqlens;
  if (s.batch != 1)
    throw UsageError(fmt::format("{}: varlen attention packs sequences into batch 1 (got B={})", id, s.batch));
  if (cu.size() < 2 || cu.front() != 0 || cu.back() != s.seq)
    throw UsageError(fmt::format("{}: cu_seqlens must run from 0 to S={} with at least one sequence", id, s.seq));
  std::vector<AttnSegment> out;
  for (std::size_t i = 1; i < cu.size(); ++i) {
    if (cu[i] < cu[i - 1])
      throw UsageError(fmt::format("{}: cu_seqlens decreases at index {} ({} after {})", id, i, cu[i], cu[i - 1]));
    if (cu[i] > cu[i - 1]) out.push_back({cu[i] - cu[i - 1], cu[i - 1], s.seq * d, s.heads});
  }
  return out;
}

double attention_scale(const AttnShape& s) { return s.scale != 0 ? s.scale : 1.0 / std::sqrt(double(s.head_dim)); }

// ---- AttnTensors ----

AttnTensors::AttnTensors(const AttnContext& ctx, const AttnShape& shape, DType dtype, std::uint64_t seed)
    : ctx_(ctx), dtype_(dtype), count_(shape.batch * shape.heads * shape.seq * shape.head_dim) {
  const std::size_t bytes = std::size_t(count_) * std::size_t(storage_bytes(dtype));
  SB_CUDA_CHECK(cudaSetDevice(ctx_.index));
  for (Buffer* b : {&q, &k, &v, &o, &d_o, &dq, &dk, &dv}) *b = ctx_.device->allocate(bytes, MemKind::device);
  int stream_id = 0;
  for (Buffer* b : {&q, &k, &v, &d_o})
    cuda_kernels::fill_uniform(b->data(), dtype, count_, 4 * seed + std::uint64_t(stream_id++), ctx_.stream);
  for (Buffer* b : {&o, &dq, &dk, &dv}) SB_CUDA_CHECK(cudaMemsetAsync(b->data(), 0, bytes, ctx_.stream));
}

float* AttnTensors::scratch() {
  if (scratch_.data() == nullptr)
    scratch_ = ctx_.device->allocate(std::size_t(count_) * sizeof(float), MemKind::device);
  return static_cast<float*>(scratch_.data());
}

void AttnTensors::put(Buffer& dst, std::span<const float> src, const char* name) {
  if (std::int64_t(src.size()) != count_)
    throw Error(ErrorKind::runtime,
                fmt::format("{}: attention upload: {} has {} values, the shape needs {}", ctx_.id, name, src.size(),
                            count_));
  float* s = scratch();
  // The stream orders the copy, the conversion and the next copy into the
  // same scratch; the pageable source is staged before the call returns.
  SB_CUDA_CHECK(cudaMemcpyAsync(s, src.data(), src.size_bytes(), cudaMemcpyHostToDevice, ctx_.stream));
  cuda_kernels::convert_from_fp32(dst.data(), dtype_, s, count_, ctx_.stream);
}

void AttnTensors::get(std::span<float> dst, const Buffer& src, const char* name) {
  if (dst.empty()) return;
  if (std::int64_t(dst.size()) != count_)
    throw Error(ErrorKind::runtime,
                fmt::format("{}: attention download: {} has room for {} values, the shape has {}", ctx_.id, name,
                            dst.size(), count_));
  float* s = scratch();
  cuda_kernels::convert_to_fp32(s, src.data(), dtype_, count_, ctx_.stream);
  // A copy to pageable memory waits for the stream's earlier work with no deadline: the synchronize first.
  ctx_.device->synchronize(kSetupTimeout);
  SB_CUDA_CHECK(cudaMemcpyAsync(dst.data(), s, dst.size_bytes(), cudaMemcpyDeviceToHost, ctx_.stream));
  // Pageable destination: wait before the scratch is reused or dst is read.
  ctx_.device->synchronize(kSetupTimeout);
}

void AttnTensors::upload(std::span<const float> q_in, std::span<const float> k_in, std::span<const float> v_in,
                         std::span<const float> d_o_in) {
  SB_CUDA_CHECK(cudaSetDevice(ctx_.index));
  put(q, q_in, "q");
  put(k, k_in, "k");
  put(v, v_in, "v");
  put(d_o, d_o_in, "d_o");
  ctx_.device->synchronize(kSetupTimeout);
}

void AttnTensors::download(std::span<float> o_out, std::span<float> dq_out, std::span<float> dk_out,
                           std::span<float> dv_out) {
  SB_CUDA_CHECK(cudaSetDevice(ctx_.index));
  get(o_out, o, "O");
  get(dq_out, dq, "dQ");
  get(dk_out, dk, "dK");
  get(dv_out, dv, "dV");
}

namespace {

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::fp32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::fp16: return CUDA_R_16F;
    default: break;
  }
  throw UnsupportedError(fmt::format("naive attention runs in fp32, bf16 or fp16, not {}", to_string(d)));
}

// One strided-batched GEMM operand: a column-major view of a row-major
// buffer (see the layout note in NaiveAttention).
struct Operand {
  const void* ptr;
  cudaDataType_t type;
  int ld;
  long long stride;
};

// C = alpha * op(A) op(B) + 0 * C, batch times, accumulating in fp32
// (CUBLAS_COMPUTE_32F: no TF32 for fp32 inputs, like PyTorch's default).
void gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
          const Operand& a, const Operand& b, void* c, cudaDataType_t c_type, int ldc, long long stride_c,
          int batch) {
  const float beta = 0.0f;
  SB_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, &alpha, a.ptr, a.type, a.ld, a.stride, b.ptr,
                                             b.type, b.ld, b.stride, &beta, c, c_type, ldc, stride_c, batch,
                                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

char* at(const Buffer& b, std::int64_t elements, std::size_t element_bytes) {
  return static_cast<char*>(b.data()) + std::size_t(elements) * element_bytes;
}

// Layout. All tensors are row-major; cuBLAS is column-major, where a
// row-major R x C buffer with leading dimension C reads as its transpose.
// Per (batch, head) matrix, with L tokens and D = head_dim:
//   S  = scale Q K^T   ->  S^T  = K Q^T        gemm(T, N, m=L, n=L, k=D, A=K,  B=Q)
//   O  = P V           ->  O^T  = V^T P^T      gemm(N, N, m=D, n=L, k=L, A=V,  B=P)
//   dV = P^T dO        ->  dV^T = dO^T P       gemm(N, T, m=D, n=L, k=L, A=dO, B=P)
//   dP = dO V^T        ->  dP^T = V dO^T       gemm(T, N, m=L, n=L, k=D, A=V,  B=dO)
//   dS = P * (dP - rowsum(dP * P))             softmax_rows_backward
//   dQ = scale dS K    ->  dQ^T = K^T dS^T     gemm(N, N, m=D, n=L, k=L, A=K,  B=dS)
//   dK = scale dS^T Q  ->  dK^T = Q^T dS       gemm(N, T, m=D, n=L, k=L, A=Q,  B=dS)
// S and dP are fp32 (GEMM output in fp32, the softmax reads fp32); P and dS
// are in the input dtype, because cuBLAS needs both GEMM inputs of one type.
class NaiveAttention final : public AttentionOp {
 public:
  NaiveAttention(const AttnContext& ctx, cublasHandle_t cublas, const AttnShape& shape, AttnImpl impl, DType dtype,
                 std::uint64_t seed)
      : ctx_(ctx),
        cublas_(cublas),
        shape_(shape),
        impl_(impl),
        dtype_(dtype),
        type_(cuda_type(dtype)),
        esize_(std::size_t(storage_bytes(dtype))),
        segments_(attention_segments(shape, ctx.id)),
        scale_(float(attention_scale(shape))),
        tensors_(ctx, shape, dtype, seed) {
    std::int64_t elements = 0;  // S (or P, or dS) over all segments
    for (const AttnSegment& s : segments_) {
      if (s.len > INT_MAX || shape.head_dim > INT_MAX || s.batch > INT_MAX)
        throw UnsupportedError(fmt::format("{}: naive attention: L={} D={} batch={} exceed cuBLAS's int sizes",
                                           ctx_.id, s.len, shape.head_dim, s.batch));
      offsets_.push_back(elements);
      elements += s.batch * s.len * s.len;
    }
    // S and dP fp32 (one buffer: dP overwrites S, which backward no longer
    // needs), P and dS in the dtype: B*H*S^2 * (4 + 2*esize) bytes; a
    // forward-only op (AttnShape::backward false) has no dS.
    scores_ = allocate_quadratic("S/dP (fp32)", elements, sizeof(float));
    probs_ = allocate_quadratic(fmt::format("P ({})", to_string(dtype)), elements, esize_);
    if (shape.backward) dscores_ = allocate_quadratic(fmt::format("dS ({})", to_string(dtype)), elements, esize_);
    workspace_ = scores_.bytes() + probs_.bytes() + (shape.backward ? dscores_.bytes() : 0);

    detail_ = dtype == DType::fp32
                  ? "cuBLAS strided-batched GEMMs (fp32, no TF32) + row softmax kernel; S, P, dS in fp32"
                  : fmt::format("cuBLAS strided-batched GEMMs ({} in, fp32 accumulate) + row softmax kernel; "
                                "S and dP in fp32, P and dS in {}",
                                to_string(dtype), to_string(dtype));
    if (shape.varlen()) detail_ += fmt::format("; one GEMM batch per sequence ({} sequences)", segments_.size());
    if (impl == AttnImpl::naive)
      detail_ += "; S, P, dS preallocated and the scale fused into the GEMM: the eager op-by-op path (a fresh tensor "
                 "and a pass over S x S per op) is reproduced on the cpu device only, so on cuda this understates "
                 "eager attention's cost";
    ctx_.device->synchronize(kSetupTimeout);  // fill errors surface here, not in the first timed call
  }

  AttnShape shape() const override { return shape_; }
  AttnImpl impl() const override { return impl_; }
  DType dtype() const override { return dtype_; }
  std::string impl_detail() const override { return detail_; }
  std::size_t workspace_bytes() const override { return workspace_; }

  void forward() override {
    bind();
    const int d = int(shape_.head_dim);
    for (std::size_t i = 0; i < segments_.size(); ++i) {
      const AttnSegment& s = segments_[i];
      const int l = int(s.len), nb = int(s.batch);
      const std::int64_t tok = s.token_offset * shape_.head_dim;  // first element of this segment's head 0
      const long long hs = s.head_stride, ll = (long long)(s.len) * s.len;
      float* sc = reinterpret_cast<float*>(at(scores_, offsets_[i], sizeof(float)));
      char* p = at(probs_, offsets_[i], esize_);
      gemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, l, l, d, scale_, in(tensors_.k, tok, d, hs), in(tensors_.q, tok, d, hs),
           sc, CUDA_R_32F, l, ll, nb);
      cuda_kernels::softmax_rows_forward(sc, p, dtype_, s.batch * s.len, l, shape_.causal, ctx_.stream);
      gemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, d, l, l, 1.0f, in(tensors_.v, tok, d, hs), Operand{p, type_, l, ll},
           at(tensors_.o, tok, esize_), type_, d, hs, nb);
    }
  }

  void backward() override {
    if (!shape_.backward)
      throw Error(ErrorKind::runtime, ctx_.id + ": naive attention planned for the forward only (AttnShape::backward)");
    bind();
    const int d = int(shape_.head_dim);
    for (std::size_t i = 0; i < segments_.size(); ++i) {
      const AttnSegment& s = segments_[i];
      const int l = int(s.len), nb = int(s.batch);
      const std::int64_t tok = s.token_offset * shape_.head_dim;
      const long long hs = s.head_stride, ll = (long long)(s.len) * s.len;
      float* dp = reinterpret_cast<float*>(at(scores_, offsets_[i], sizeof(float)));
      char* p = at(probs_, offsets_[i], esize_);
      char* ds = at(dscores_, offsets_[i], esize_);
      const Operand p_op{p, type_, l, ll}, ds_op{ds, type_, l, ll};
      gemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, d, l, l, 1.0f, in(tensors_.d_o, tok, d, hs), p_op,
           at(tensors_.dv, tok, esize_), type_, d, hs, nb);
      gemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, l, l, d, 1.0f, in(tensors_.v, tok, d, hs),
           in(tensors_.d_o, tok, d, hs), dp, CUDA_R_32F, l, ll, nb);
      cuda_kernels::softmax_rows_backward(p, dp, ds, dtype_, s.batch * s.len, l, ctx_.stream);
      gemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, d, l, l, scale_, in(tensors_.k, tok, d, hs), ds_op,
           at(tensors_.dq, tok, esize_), type_, d, hs, nb);
      gemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, d, l, l, scale_, in(tensors_.q, tok, d, hs), ds_op,
           at(tensors_.dk, tok, esize_), type_, d, hs, nb);
    }
  }

  void upload(std::span<const float> q, std::span<const float> k, std::span<const float> v,
              std::span<const float> d_o) override {
    tensors_.upload(q, k, v, d_o);
  }
  void download(std::span<float> o, std::span<float> dq, std::span<float> dk, std::span<float> dv) override {
    tensors_.download(o, dq, dk, dv);
  }

 private:
  void bind() const { SB_CUDA_CHECK(cudaSetDevice(ctx_.index)); }

  Operand in(const Buffer& b, std::int64_t elements, int ld, long long stride) const {
    return Operand{at(b, elements, esize_), type_, ld, stride};
  }

  // The quadratic buffers are what makes naive attention run out of memory;
  // the error says which one, its size and the shape that asked for it.
  Buffer allocate_quadratic(const std::string& what, std::int64_t elements, std::size_t element_bytes) {
    const auto& s = shape_;
    const std::string where = fmt::format("{}: naive attention B={} H={} S={} D={}{}: {}", ctx_.id, s.batch, s.heads,
                                          s.seq, s.head_dim, s.varlen() ? " varlen" : "", what);
    if (double(elements) * double(element_bytes) > 9.0e18)  // would overflow size_t arithmetic
      throw OutOfMemory(fmt::format("{} needs {:.3g} bytes, beyond any device", where,
                                    double(elements) * double(element_bytes)));
    const std::size_t bytes = std::size_t(elements) * element_bytes;
    try {
      return ctx_.device->allocate(bytes, MemKind::device);
    } catch (const OutOfMemory& e) {
      throw OutOfMemory(fmt::format("{} needs {} bytes: {}", where, bytes, e.what()));
    }
  }

  AttnContext ctx_;
  cublasHandle_t cublas_;
  AttnShape shape_;
  AttnImpl impl_;
  DType dtype_;
  cudaDataType_t type_;
  std::size_t esize_;
  std::vector<AttnSegment> segments_;
  std::vector<std::int64_t> offsets_;  // each segment's first element in S, P, dS
  float scale_;
  AttnTensors tensors_;
  Buffer scores_, probs_, dscores_;
  std::size_t workspace_ = 0;
  std::string detail_;
};

}  // namespace

std::unique_ptr<AttentionOp> make_naive_attention(const AttnContext& ctx, cublasHandle_t cublas, const AttnShape& shape,
                                                  AttnImpl impl, DType dtype, std::uint64_t seed) {
  return std::make_unique<NaiveAttention>(ctx, cublas, shape, impl, dtype, seed);
}

}  // namespace sb::cuda_detail
