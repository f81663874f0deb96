#include "kernels/cuda/gate.cuh"

#include "kernels/cuda/detail/check.hpp"  // SB_CUDA_CHECK_LAUNCH

namespace sb::cuda_kernels {
namespace {

__device__ inline std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Volatile reads: the host writes the counter through the mapping while this
// runs, and each iteration must see memory, not a register.
__global__ void stream_gate(const volatile std::uint64_t* release, volatile std::uint64_t* timed_out,
                            std::uint64_t ticket, std::uint64_t timeout_ns) {
  const std::uint64_t t0 = global_ns();
  while (*release < ticket) {
    if (global_ns() - t0 > timeout_ns) {
      *timed_out = ticket;
      return;
    }
    __nanosleep(1000);
  }
}

}  // namespace

void launch_stream_gate(const std::uint64_t* release, std::uint64_t* timed_out, std::uint64_t ticket,
                        std::uint64_t timeout_ns, cudaStream_t stream) {
  stream_gate<<<1, 1, 0, stream>>>(release, timed_out, ticket, timeout_ns);
  SB_CUDA_CHECK_LAUNCH();
}

}  // namespace sb::cuda_kernels
