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
#include <string_view>  // std::string_view
#include <vector>   // std::vector

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

// What travels in the rendezvous, as text: a rank's hello (rank 0's roster is the hellos of every
// rank), and a gather's parts forwarded to a root other than 0. These are bytes from the network
// (anyone can connect to the port): the parsers take any bytes (tests/fuzz/fuzz_rendezvous.cpp).
struct RdzvMember {
  int rank = -1, world = 0, local_rank = -1;
  long long pid = 0;
  std::string job, host;
};
std::string rdzv_hello_text(const RdzvMember& m);
// nullopt for what is not a hello (six lines: rank, world, local rank, pid, job, host).
std::optional<RdzvMember> parse_rdzv_hello(std::string_view payload);
std::string rdzv_roster_text(const std::vector<RdzvMember>& members);
// Each rank's hello, by rank; throws Error(runtime) for a damaged roster (a hello that does not
// parse, a rank outside [0, world)).
std::vector<RdzvMember> parse_rdzv_roster(std::string_view payload, int world);
// Parts as "<length>\n<bytes>" one after another; at most max_parts read back. Throws
// Error(runtime) for damaged bytes (a length that is not one, or runs past the end).
std::string pack_parts(const std::vector<std::string>& parts);
std::vector<std::string> unpack_parts(std::string_view packed, std::size_t max_parts);

// The env:// launch the environment describes; nullopt when it describes none. Throws UsageError
// (exit 2) for a launch that is half there or wrong: RANK without WORLD_SIZE, RANK >= WORLD_SIZE,
// no MASTER_ADDR, a port out of range.
std::optional<EnvLaunch> detect_env_launch();

// Rendezvous of the launch's ranks at master_addr:port; returns once all of them have joined.
// Throws HangError naming the ranks that did not join before the deadline, UsageError when the
// ranks disagree on WORLD_SIZE or the job (or two claim one rank).
std::unique_ptr<ProcessGroup> open_env_process_group(const EnvLaunch& launch);

}  // namespace sb
