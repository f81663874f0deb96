// The device backends this build has: cpu and sim always, cuda when configured.
#pragma once

#include <memory>  // std::unique_ptr
#include <string>  // std::string
#include <vector>  // std::vector

#include "harness/comm.hpp"    // ProcessGroup, Communicator
#include "harness/device.hpp"  // Backend, Device, DeviceSpec

namespace sb {

const std::vector<Backend>& all_backends();

// Opens the device a spec names. "auto" is cuda:0 when a GPU answers, else
// cpu. Throws UsageError naming the valid devices (and why cuda has none).
std::unique_ptr<Device> open_device(const DeviceSpec& spec);

// The ranks a launcher started: over MPI (mpirun, srun), over TCP for an env:// launch
// (torchrun), a group of one process when neither and this build has no MPI. Initializes MPI: call once, before any
// other MPI use.
std::unique_ptr<ProcessGroup> open_process_group(int* argc, char*** argv);
// Whether a launcher started this process as one of several ranks (mpirun, srun with PMI, or an
// env:// launch: torchrun's variables). Throws UsageError for half an env:// launch.
bool launched_with_ranks();
// "mpi" or "nccl" over the group's ranks. Throws UnsupportedError naming
// what the build or the machine lacks.
std::unique_ptr<Communicator> open_communicator(ProcessGroup& group, const std::string& backend);

}  // namespace sb
