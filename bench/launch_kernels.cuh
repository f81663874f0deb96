// The empty kernel launch_bench times (per-launch and per-graph-node cost).
// Host launcher only; the kernel lives in launch_kernels.cu.
#pragma once

#include <cuda_runtime.h>  // cudaStream_t

namespace sb::bench_kernels {

// Enqueues one empty kernel, <<<1, 1>>>, on stream. No error check here: the
// caller reads cudaGetLastError once after its launch loop, so the check
// stays out of the time per launch (a launch error stays pending until read).
void launch_empty(cudaStream_t stream);

}  // namespace sb::bench_kernels
