// The cuda device's GEMM: cuBLASLt matmul in the "TN" layout (see below),
// operands filled on the device by the kernels in fill.cu.
#include "kernels/cuda/detail/cuda_gemm.hpp"

#include <algorithm>  // std::max
#include <array>      // std::array
#include <cstdint>    // std::int32_t, std::int64_t, std::uint32_t, std::uint64_t
#include <memory>     // std::make_unique
#include <span>       // std::span
#include <string>     // std::string
#include <utility>    // std::move

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"             // Error, UnsupportedError
#include "kernels/cuda/detail/check.hpp"  // SB_CUDA_CHECK, SB_CUBLAS_CHECK
#include "kernels/cuda/fill.cuh"          // fill_uniform, convert_from_fp32, convert_to_fp32

namespace sb::cuda_detail {
namespace {

// cuBLASLt heuristics on Hopper assume a 32 MiB workspace (NVIDIA's guidance
// for sm_90); smaller ones rule out some split-K and stream-K kernels.
constexpr std::size_t kWorkspaceBytes = 32ull << 20;

// fp8's per-tensor dequantization scales for A and B: 1.0 keeps the product
// equal to the stored values' product. Static storage: it is the source of an
// asynchronous host-to-device copy.
constexpr std::array<float, 2> kUnitScales = {1.0f, 1.0f};

using MatmulDesc = Owned<cublasLtMatmulDesc_t, &cublasLtMatmulDescDestroy>;
using MatrixLayout = Owned<cublasLtMatrixLayout_t, &cublasLtMatrixLayoutDestroy>;
using MatmulPref = Owned<cublasLtMatmulPreference_t, &cublasLtMatmulPreferenceDestroy>;

// cuBLASLt types per dtype. The scale type (alpha, beta, fp8 scales) is fp32
// throughout; accumulation is fp32 (tf32 rounds the tensor-core inputs).
struct LtTypes {
  cublasComputeType_t compute;
  cudaDataType_t ab;  // A and B (our W and A)
  cudaDataType_t cd;  // C and D
};
LtTypes lt_types(DType d) {
  switch (d) {
    case DType::fp32: return {CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F};
    case DType::tf32: return {CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, CUDA_R_32F};
    case DType::bf16: return {CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_16BF};
    case DType::fp16: return {CUBLAS_COMPUTE_32F, CUDA_R_16F, CUDA_R_16F};
    case DType::fp8_e4m3: return {CUBLAS_COMPUTE_32F, CUDA_R_8F_E4M3, CUDA_R_16BF};
  }
  throw Error(ErrorKind::runtime, "cuda: unknown dtype");
}

MatrixLayout make_layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols,
                         std::int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  SB_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&l, type, std::uint64_t(rows), std::uint64_t(cols), ld));
  return MatrixLayout(l);
}

template <class T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  SB_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

// C[M,N] = A[M,K] * W[N,K]^T, row-major. cuBLAS is column-major, where the
// same memory reads as C^T[N,M] = W[N,K] * A^T[K,M]: cuBLAS's A is our W
// stored K x N (ld K) with op T, its B is our A stored K x M (ld K) with op N,
// and D is N x M (ld N). So m=N, n=M, k=K: the "TN" form fp8 requires.
class CudaGemm final : public GemmOp {
 public:
  CudaGemm(GemmContext ctx, GemmShape shape, DType dtype, std::uint64_t seed)
      : ctx_(std::move(ctx)), shape_(shape), dtype_(dtype) {
    const std::int64_t m = shape.m, n = shape.n, k = shape.k;
    const LtTypes t = lt_types(dtype);
    const auto esize = std::size_t(storage_bytes(dtype));
    const auto csize = std::size_t(storage_bytes(gpu_gemm_c_dtype(dtype)));
    bind();
    a_ = ctx_.device->allocate(std::size_t(m * k) * esize, MemKind::device);
    w_ = ctx_.device->allocate(std::size_t(n * k) * esize, MemKind::device);
    c_ = ctx_.device->allocate(std::size_t(m * n) * csize, MemKind::device);
    workspace_ = ctx_.device->allocate(kWorkspaceBytes, MemKind::device);

    // A from seed stream 2*seed, W from 2*seed+1: distinct, and a host
    // reference can rebuild either with cuda_kernels::uniform_value.
    cuda_kernels::fill_uniform(a_.data(), dtype, m * k, 2 * seed, ctx_.stream);
    cuda_kernels::fill_uniform(w_.data(), dtype, n * k, 2 * seed + 1, ctx_.stream);
    SB_CUDA_CHECK(cudaMemsetAsync(c_.data(), 0, c_.bytes(), ctx_.stream));

    cublasLtMatmulDesc_t desc = nullptr;
    SB_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, t.compute, CUDA_R_32F));
    desc_.reset(desc);
    set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, std::int32_t(CUBLAS_OP_T));
    set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, std::int32_t(CUBLAS_OP_N));
    set_desc(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, std::int32_t(CUBLASLT_POINTER_MODE_HOST));
    if (dtype == DType::fp8_e4m3) {
      // fp8 needs per-tensor dequantization scales on the device; 1.0 keeps
      // the product equal to the stored values' product.
      scales_ = ctx_.device->allocate(sizeof(kUnitScales), MemKind::device);
      // The source must outlive the asynchronous copy: a static constant,
      // not a stack array (the constructor's synchronize() below also ends
      // the copy before the op can be used).
      SB_CUDA_CHECK(cudaMemcpyAsync(scales_.data(), kUnitScales.data(), sizeof(kUnitScales),
                                    cudaMemcpyHostToDevice, ctx_.stream));
      const void* a_scale = static_cast<const float*>(scales_.data());
      const void* b_scale = static_cast<const float*>(scales_.data()) + 1;
      set_desc(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale);
      set_desc(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale);
    }
    w_layout_ = make_layout(t.ab, k, n, k);
    a_layout_ = make_layout(t.ab, k, m, k);
    c_layout_ = make_layout(t.cd, n, m, n);

    choose_algo();
    // Fill errors surface here, in setup, rather than in the first timed GEMM.
    ctx_.device->synchronize(kSetupTimeout);
  }

  GemmShape shape() const override { return shape_; }
  DType dtype() const override { return dtype_; }
  DType c_dtype() const override { return gpu_gemm_c_dtype(dtype_); }
  std::string impl() const override { return impl_; }

  void enqueue() override {
    bind();
    const float alpha = 1.0f, beta = 0.0f;  // host scalars (POINTER_MODE_HOST)
    // C is passed as both C and D; with beta = 0 it is only written.
    SB_CUBLAS_CHECK(cublasLtMatmul(ctx_.lt, desc_.get(), &alpha, w_.data(), w_layout_.get(),
                                   a_.data(), a_layout_.get(), &beta, c_.data(), c_layout_.get(),
                                   c_.data(), c_layout_.get(), &algo_, workspace_.data(),
                                   workspace_.bytes(), ctx_.stream));
  }

  void upload(std::span<const float> a, std::span<const float> w) override {
    const std::int64_t m = shape_.m, n = shape_.n, k = shape_.k;
    check_size("upload: a", a.size(), m * k);
    check_size("upload: w", w.size(), n * k);
    bind();
    float* scratch = ensure_scratch();
    // One operand at a time through the fp32 scratch; the stream orders the
    // copy, the conversion and the next copy.
    SB_CUDA_CHECK(cudaMemcpyAsync(scratch, a.data(), a.size_bytes(), cudaMemcpyHostToDevice,
                                  ctx_.stream));
    cuda_kernels::convert_from_fp32(a_.data(), dtype_, scratch, m * k, ctx_.stream);
    SB_CUDA_CHECK(cudaMemcpyAsync(scratch, w.data(), w.size_bytes(), cudaMemcpyHostToDevice,
                                  ctx_.stream));
    cuda_kernels::convert_from_fp32(w_.data(), dtype_, scratch, n * k, ctx_.stream);
    ctx_.device->synchronize(kSetupTimeout);
  }

  void download_c(std::span<float> c) override {
    const std::int64_t m = shape_.m, n = shape_.n;
    check_size("download_c", c.size(), m * n);
    bind();
    float* scratch = ensure_scratch();
    cuda_kernels::convert_to_fp32(scratch, c_.data(), c_dtype(), m * n, ctx_.stream);
    // A copy to pageable memory returns only once it is done, and so waits for the stream's earlier work
    // without a deadline: that wait is the synchronize's, which has one.
    ctx_.device->synchronize(kSetupTimeout);
    SB_CUDA_CHECK(cudaMemcpyAsync(c.data(), scratch, c.size_bytes(), cudaMemcpyDeviceToHost,
                                  ctx_.stream));
    ctx_.device->synchronize(kSetupTimeout);
  }

 private:
  void bind() const { SB_CUDA_CHECK(cudaSetDevice(ctx_.index)); }

  void check_size(const char* what, std::size_t got, std::int64_t want) const {
    if (std::int64_t(got) != want)
      throw Error(ErrorKind::runtime,
                  fmt::format("{}: {} has {} values, the {}x{}x{} GEMM needs {}", ctx_.id, what,
                              got, shape_.m, shape_.n, shape_.k, want));
  }

  // The fp32 staging area for upload/download, made on first use so a timed
  // GEMM never pays its memory.
  float* ensure_scratch() {
    if (scratch_.data() == nullptr) {
      const std::int64_t count =
          std::max({shape_.m * shape_.k, shape_.n * shape_.k, shape_.m * shape_.n});
      scratch_ = ctx_.device->allocate(std::size_t(count) * sizeof(float), MemKind::device);
    }
    return static_cast<float*>(scratch_.data());
  }

  void choose_algo() {
    cublasLtMatmulPreference_t pref_raw = nullptr;
    SB_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_raw));
    const MatmulPref pref(pref_raw);
    const std::uint64_t max_ws = kWorkspaceBytes;
    SB_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof(max_ws)));

    const std::string no_algo = fmt::format(
        "{}: cuBLASLt has no algorithm for a {} GEMM of M={} N={} K={}{}", ctx_.id,
        to_string(dtype_), shape_.m, shape_.n, shape_.k,
        dtype_ == DType::fp8_e4m3 ? " (fp8 needs N and K to be multiples of 16)" : "");
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    try {
      SB_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(ctx_.lt, desc_.get(), w_layout_.get(),
                                                     a_layout_.get(), c_layout_.get(),
                                                     c_layout_.get(), pref_raw, 1, &result,
                                                     &count));
    } catch (const UnsupportedError& e) {
      throw UnsupportedError(no_algo + ": " + e.what());
    }
    if (count < 1 || result.state != CUBLAS_STATUS_SUCCESS) throw UnsupportedError(no_algo);
    algo_ = result.algo;

    std::int32_t algo_id = 0, splitk = 0;
    std::uint32_t tile = 0, stages = 0;
    SB_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_ID,
                                                         &algo_id, sizeof(algo_id), nullptr));
    SB_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_TILE_ID,
                                                         &tile, sizeof(tile), nullptr));
    SB_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo_, CUBLASLT_ALGO_CONFIG_STAGES_ID,
                                                         &stages, sizeof(stages), nullptr));
    SB_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(
        &algo_, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), nullptr));
    // Tile and stages are cublasLtMatmulTile_t / cublasLtMatmulStages_t enum
    // values (see cublasLt.h), reported as numbers.
    impl_ = fmt::format("cublasLt algo {} tile {} stages {} splitK {}", algo_id, tile, stages,
                        splitk);
  }

  GemmContext ctx_;  // the device outlives the op
  GemmShape shape_;
  DType dtype_;
  Buffer a_, w_, c_, workspace_, scales_, scratch_;
  MatmulDesc desc_;
  MatrixLayout w_layout_, a_layout_, c_layout_;
  cublasLtMatmulAlgo_t algo_{};
  std::string impl_;
};

}  // namespace

std::unique_ptr<GemmOp> make_cublaslt_gemm(const GemmContext& ctx, GemmShape shape, DType dtype,
                                           std::uint64_t seed) {
  return std::make_unique<CudaGemm>(ctx, shape, dtype, seed);
}

}  // namespace sb::cuda_detail
