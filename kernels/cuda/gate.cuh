// The stream gate of timing=hidden (nvbench's blocking kernel): one thread
// spins until the host raises a release counter in mapped pinned memory, or
// until its own deadline passes, so the work enqueued behind it starts only
// when the host says so. Host launcher only; the kernel lives in gate.cu.
#pragma once

#include <cstdint>  // std::uint64_t

#include <cuda_runtime.h>  // cudaStream_t

namespace sb::cuda_kernels {

// Enqueues the gate: it returns once *release >= ticket, or after timeout_ns
// of GPU global time, having then written ticket to *timed_out. Both pointers
// are device views (cudaHostGetDevicePointer) of mapped pinned host memory.
void launch_stream_gate(const std::uint64_t* release, std::uint64_t* timed_out, std::uint64_t ticket,
                        std::uint64_t timeout_ns, cudaStream_t stream);

}  // namespace sb::cuda_kernels
