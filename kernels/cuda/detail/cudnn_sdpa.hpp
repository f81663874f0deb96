// The attention operations of the cuda device, as cuda_device.cpp sees them:
// the context both implementations share, the tensors they share
// (AttnTensors), the naive cuBLAS + softmax attention (attention_naive.cpp)
// and cuDNN SDPA through cudnn-frontend (cudnn_sdpa.cpp, built only with
// STALLBENCH_HAVE_CUDNN). Host-only: no device code and no cudnn-frontend
// header; the frontend stays inside cudnn_sdpa.cpp.
#pragma once

#include <cstdint>  // std::int64_t, std::uint64_t
#include <memory>   // std::unique_ptr, std::shared_ptr
#include <span>     // std::span
#include <string>   // std::string
#include <vector>   // std::vector

#include <cublas_v2.h>     // cublasHandle_t
#include <cuda_runtime.h>  // cudaStream_t

#include "harness/device.hpp"  // Device, AttentionOp, AttnShape, Buffer
#include "harness/dtype.hpp"   // DType

namespace sb::cuda_detail {

// What an attention op needs from the device that makes it; the device
// outlives its ops.
struct AttnContext {
  Device* device = nullptr;  // allocate() (the memory ledger) and synchronize()
  int index = 0;             // made current (cudaSetDevice) before each call
  cudaStream_t stream = nullptr;
  std::string id;  // "cuda:0", for messages
};

// One independent attention problem inside the [B, H, S, D] tensors: `len`
// tokens starting at token `token_offset` of the token axis, for `batch`
// (batch, head) matrices `head_stride` elements apart. Dense shapes are one
// segment of batch B*H; varlen shapes are one segment per sequence, of batch
// H, over the packed [1, H, total, D] tensors (head_stride = total*D).
struct AttnSegment {
  std::int64_t len = 0;
  std::int64_t token_offset = 0;
  std::int64_t head_stride = 0;  // elements between consecutive (batch, head) matrices
  std::int64_t batch = 0;
};

// Validates the shape (positive sizes; varlen: batch 1, cu_seqlens from 0,
// non-decreasing, ending at seq) and splits it; empty sequences are dropped.
// Throws UsageError naming what is wrong.
std::vector<AttnSegment> attention_segments(const AttnShape& s, const std::string& id);

// 1/sqrt(head_dim) unless the shape sets a scale.
double attention_scale(const AttnShape& s);

// Q, K, V, O, dO, dQ, dK, dV in the dtype, allocated through the device (so
// the ledger sees them and a cap throws OutOfMemory), Q/K/V/dO filled from
// seed (streams 4*seed+0..3, uniform in [-1, 1]), outputs zeroed; and the
// host upload/download of AttentionOp. Shared by both implementations.
class AttnTensors {
 public:
  AttnTensors(const AttnContext& ctx, const AttnShape& shape, DType dtype, std::uint64_t seed);
  void upload(std::span<const float> q, std::span<const float> k, std::span<const float> v,
              std::span<const float> d_o);
  void download(std::span<float> o, std::span<float> dq, std::span<float> dk, std::span<float> dv);
  std::int64_t count() const { return count_; }  // elements of each tensor
  Buffer q, k, v, o, d_o, dq, dk, dv;

 private:
  void put(Buffer& dst, std::span<const float> src, const char* name);
  void get(std::span<float> dst, const Buffer& src, const char* name);
  float* scratch();
  AttnContext ctx_;
  DType dtype_;
  std::int64_t count_ = 0;
  Buffer scratch_;  // fp32 staging, made on first upload/download
};

// PyTorch's math path: S = scale * Q K^T and O = P V (and the four backward
// GEMMs) as cuBLAS strided-batched GEMMs, the row softmax and its backward as
// kernels (softmax.cu). S, P and dS for the whole shape are allocated here,
// so a shape whose B*H*S^2 does not fit throws OutOfMemory naming the bytes.
// cublas is the device's handle, already bound to ctx.stream. impl is naive
// or naive-prealloc: on cuda both run this preallocated path (the eager,
// op-by-op variant is the cpu device's only; the op's impl_detail says so).
std::unique_ptr<AttentionOp> make_naive_attention(const AttnContext& ctx, cublasHandle_t cublas, const AttnShape& shape,
                                                  AttnImpl impl, DType dtype, std::uint64_t seed);

// cuDNN SDPA. The per-device state (one cuDNN handle bound to the device's
// stream, and the graphs built so far, keyed by shape, dtype, mask and pass)
// is opaque here; cudnn_sdpa.cpp defines it. Defined only when the build has
// cudnn-frontend (STALLBENCH_HAVE_CUDNN).
class CudnnSdpa;
std::shared_ptr<CudnnSdpa> make_cudnn_sdpa(const AttnContext& ctx);
// Throws UnsupportedError (dtype, head_dim, or a graph cuDNN cannot run, with
// the frontend's reason), OutOfMemory.
std::unique_ptr<AttentionOp> make_cudnn_attention(const AttnContext& ctx, const std::shared_ptr<CudnnSdpa>& cudnn,
                                                  const AttnShape& shape, DType dtype, std::uint64_t seed);
// The cudnn-frontend headers built against, "1.32.0" (for versions()).
std::string cudnn_frontend_version();

}  // namespace sb::cuda_detail
