// The MPI side of the collective scenario: the process group a launcher
// started (mpirun, srun) and the `backend=mpi` communicator, collectives on
// host buffers. Host-only header; mpi.h stays in mpi_comm.cpp.
#pragma once

#include <memory>  // std::unique_ptr

#include "harness/comm.hpp"  // ProcessGroup, Communicator

namespace sb {

// What launched this process, from the environment: "mpirun" (Open MPI),
// "srun" (Slurm), "mpiexec" (a PMI launcher), or "" when none did.
std::string detect_launcher();

// Starts MPI with MPI_THREAD_MULTIPLE (the watchdog thread calls MPI_Abort
// while the main thread polls). Call once per process; the group finalizes
// MPI when destroyed. Throws UnsupportedError when the library cannot give
// that thread level.
std::unique_ptr<ProcessGroup> open_mpi_process_group(int* argc, char*** argv);

// A communicator of its own (MPI_Comm_dup), with errors returned rather than
// fatal, so a truncation caused by a mismatch is reported, not a crash.
std::unique_ptr<Communicator> open_mpi_communicator(ProcessGroup& group);

}  // namespace sb
