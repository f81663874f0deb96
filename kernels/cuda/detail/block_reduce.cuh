// A block-wide reduction for the project's own row kernels (softmax,
// layernorm-style statistics): one fixed tree, so a result never depends on
// timing. Device code only; included by .cu files.
#pragma once

#include <cmath>  // INFINITY

namespace sb::cuda_kernels::detail {

struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
  static constexpr float identity = -INFINITY;
};
struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
  static constexpr float identity = 0.0f;
};

// The reduction of v over a block of Threads threads (a multiple of 32, at
// most 1024), returned to every thread. scratch holds Threads / 32 + 1
// floats; the leading __syncthreads lets a kernel call it repeatedly with
// the same scratch.
template <int Threads, class Op>
__device__ float block_reduce(float v, Op op, float* scratch) {
  static_assert(Threads % 32 == 0 && Threads <= 1024, "a block of whole warps, at most 1024 threads");
  constexpr int kWarps = Threads / 32;
  for (int off = 16; off > 0; off /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? scratch[lane] : Op::identity;
    for (int off = 16; off > 0; off /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
    if (lane == 0) scratch[kWarps] = v;
  }
  __syncthreads();
  return scratch[kWarps];
}

}  // namespace sb::cuda_kernels::detail
