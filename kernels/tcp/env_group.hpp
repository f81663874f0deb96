// The process group of a job launched the env:// way, without MPI: torchrun, accelerate, a Kubeflow
// PyTorchJob (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; LOCAL_RANK), or srun with a rendezvous
// address (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID with MASTER_ADDR, MASTER_PORT). Rank 0
// listens; every other rank connects to it over TCP; each control-plane call (barrier, allgather,
// broadcast, gather) goes through rank 0. It carries a few bytes (NCCL's unique id, a run id,
// per-rank figures), never the collectives the scenario measures. Every connect, accept and read
// has a deadline: a rank that never arrives is a HangError naming it.
#pragma once

#include <chrono>    // std::chrono::seconds
#include <memory>    // std::unique_ptr
#include <optional>  // std::optional
#include <string>    // std::string

#include "harness/comm.hpp"  // ProcessGroup

namespace sb {

// What the environment says of an env:// launch, checked.
struct EnvLaunch {
  std::string launcher;  // "torchrun", "srun (env://)", "env://"
  int rank = 0, world_size = 1;
  int local_rank = -1, local_world_size = -1;  // -1: not given (then found from the ranks' host names)
  std::string master_addr;
  int port = 0;           // where rank 0 listens
  std::string port_why;   // "MASTER_PORT", "MASTER_PORT + 1: torchrun's agent store holds MASTER_PORT", ...
  std::string job;        // TORCHELASTIC_RUN_ID or SLURM_JOB_ID.SLURM_STEP_ID: ranks of another job are refused
  std::chrono::seconds timeout{120};  // STALLBENCH_RDZV_TIMEOUT
};

// The env:// launch the environment describes; nullopt when it describes none. Throws UsageError
// (exit 2) for a launch that is half there or wrong: RANK without WORLD_SIZE, RANK >= WORLD_SIZE,
// no MASTER_ADDR, a port out of range.
std::optional<EnvLaunch> detect_env_launch();

// Rendezvous of the launch's ranks at master_addr:port; returns once all of them have joined.
// Throws HangError naming the ranks that did not join before the deadline, UsageError when the
// ranks disagree on WORLD_SIZE or the job (or two claim one rank).
std::unique_ptr<ProcessGroup> open_env_process_group(const EnvLaunch& launch);

}  // namespace sb
