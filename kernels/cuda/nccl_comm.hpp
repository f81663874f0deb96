// The `backend=nccl` communicator of the collective scenario: NCCL
// collectives on device buffers, one GPU per rank, bootstrapped over the
// process group. Host-only header with no NCCL or CUDA include; the
// definition is built only when NCCL is found (STALLBENCH_HAVE_NCCL).
#pragma once

#include <memory>  // std::unique_ptr

#include "harness/comm.hpp"  // ProcessGroup, Communicator

namespace sb {

// Collective over the group: every rank calls it. Uses GPU group.local_rank()
// on this host (shared round-robin only with NCCL >= 2.30 and
// NCCL_MULTI_RANK_GPU_ENABLE=1). The communicator is non-blocking, so the
// watchdog's abort() can end a stuck call. Throws UnsupportedError when
// a rank has no GPU to use, HangError when initialization passes deadline,
// Error(runtime) when NCCL refuses.
std::unique_ptr<Communicator> open_nccl_communicator(ProcessGroup& group, ProcessGroup::Deadline deadline);

}  // namespace sb
