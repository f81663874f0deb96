// The cuBLASLt GEMM of the cuda device, and the RAII handles both share.
// Internal to kernels/cuda: includes cuda_runtime.h and cublasLt.h.
#pragma once

#include <chrono>       // std::chrono::milliseconds
#include <cstdint>      // std::uint64_t
#include <memory>       // std::unique_ptr
#include <string>       // std::string
#include <type_traits>  // std::remove_pointer_t

#include <cublasLt.h>      // cublasLtHandle_t, cublasLtDestroy, descriptor types
#include <cuda_runtime.h>  // cudaStream_t, cudaStreamDestroy

#include "harness/device.hpp"  // Device, GemmOp, GemmShape
#include "harness/dtype.hpp"   // DType

namespace sb::cuda_detail {

using namespace std::chrono_literals;

// Bound for the waits the interface gives no timeout to: make_gemm, upload and
// download_c are setup and checking steps, never timed, and a healthy GPU
// finishes them in milliseconds.
inline constexpr std::chrono::milliseconds kSetupTimeout = 60s;

// RAII for the CUDA and cuBLASLt handles and descriptors (all pointer typedefs).
template <auto Destroy>
struct Destroyer {
  template <class P>
  void operator()(P p) const noexcept {
    (void)Destroy(p);  // nothing useful to do with a failed destroy
  }
};
template <class Handle, auto Destroy>
using Owned = std::unique_ptr<std::remove_pointer_t<Handle>, Destroyer<Destroy>>;
using LtHandle = Owned<cublasLtHandle_t, &cublasLtDestroy>;
using Stream = Owned<cudaStream_t, &cudaStreamDestroy>;

// What a GEMM needs from the device that makes it; the device outlives its ops.
struct GemmContext {
  Device* device = nullptr;  // allocate() and synchronize()
  int index = 0;             // made current (cudaSetDevice) before each call
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  std::string id;  // "cuda:0", for messages
};

// Allocates the operands, fills them from seed (A from stream 2*seed, W from
// 2*seed+1) and picks the cuBLASLt algorithm. Throws OutOfMemory,
// UnsupportedError (no algorithm for this shape/dtype).
std::unique_ptr<GemmOp> make_cublaslt_gemm(const GemmContext& ctx, GemmShape shape, DType dtype,
                                           std::uint64_t seed);

}  // namespace sb::cuda_detail
