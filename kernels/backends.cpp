#include "kernels/backends.hpp"

#include <cstdlib>  // std::getenv

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/errors.hpp"           // UsageError
#include "kernels/cpu/cpu_backend.hpp"  // make_cpu_backend
#include "kernels/sim/sim_backend.hpp"  // make_sim_backend
#include "kernels/tcp/env_group.hpp"    // detect_env_launch, open_env_process_group
#ifdef STALLBENCH_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"  // make_cuda_backend
#endif
#ifdef STALLBENCH_HAVE_MPI
#include "kernels/mpi/mpi_comm.hpp"  // open_mpi_process_group, open_mpi_communicator
#endif
#ifdef STALLBENCH_HAVE_NCCL
#include "kernels/cuda/nccl_comm.hpp"  // open_nccl_communicator
#endif

namespace sb {

const std::vector<Backend>& all_backends() {
  static const std::vector<Backend> v = [] {
    std::vector<Backend> b{make_cpu_backend()};
#ifdef STALLBENCH_HAVE_CUDA
    b.push_back(make_cuda_backend());
#endif
    b.push_back(make_sim_backend());
    return b;
  }();
  return v;
}

namespace {
const Backend* find_backend(const std::string& name) {
  for (const auto& b : all_backends())
    if (b.name == name) return &b;
  return nullptr;
}

// sim:<name>: the gpu expected file whose hardware.id is name, or else the
// only one that name is a prefix of ("h100" -> "h100-sxm").
std::unique_ptr<Device> open_sim(const Backend& sim, const DeviceSpec& spec) {
  std::vector<std::string> ids;
  for (const auto& d : sim.list()) ids.push_back(d.id.substr(d.id.find(':') + 1));
  if (ids.empty()) throw UsageError(fmt::format("device {}: {}", spec.str(), sim.unavailable()));
  std::vector<std::string> valid;
  for (const auto& id : ids) valid.push_back("sim:" + id);
  std::vector<int> prefixed;
  for (int i = 0; i < int(ids.size()); ++i) {
    if (ids[std::size_t(i)] == spec.sim) return sim.open(i);
    if (ids[std::size_t(i)].rfind(spec.sim, 0) == 0) prefixed.push_back(i);
  }
  if (prefixed.size() == 1) return sim.open(prefixed[0]);
  if (prefixed.empty())
    throw UsageError(fmt::format("device {}: no expected file with that hardware id; valid: {} (or a unique prefix, "
                                 "e.g. sim:h100)",
                                 spec.str(), fmt::join(valid, ", ")));
  std::vector<std::string> matches;
  for (int i : prefixed) matches.push_back(valid[std::size_t(i)]);
  throw UsageError(fmt::format("device {} is ambiguous: it is a prefix of {}; valid: {}", spec.str(),
                               fmt::join(matches, ", "), fmt::join(valid, ", ")));
}
}  // namespace

std::unique_ptr<Device> open_device(const DeviceSpec& spec) {
  const Backend* cuda = find_backend("cuda");
  if (spec.automatic) {
    if (cuda && !cuda->list().empty()) return cuda->open(0);
    return find_backend("cpu")->open(0);
  }
  if (spec.kind == DeviceKind::cpu) return find_backend("cpu")->open(spec.index);
  if (spec.kind == DeviceKind::cuda) {
    if (!cuda) throw UsageError(fmt::format("device {}: this stallbench was built without CUDA (-Dcuda=disabled); valid: cpu, auto", spec.str()));
    if (cuda->list().empty())
      throw UsageError(fmt::format("device {}: {}; valid here: cpu, auto", spec.str(), cuda->unavailable()));
    return cuda->open(spec.index);
  }
  if (spec.kind == DeviceKind::sim) return open_sim(*find_backend("sim"), spec);
  throw UsageError(fmt::format("device {} is not available in this build; valid: auto, cpu, cuda:N, sim:<gpu>", spec.str()));
}

namespace {
// mpirun and srun with PMI start MPI ranks
bool mpi_launch() { return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK"); }
}  // namespace

bool launched_with_ranks() { return mpi_launch() || detect_env_launch().has_value(); }

std::unique_ptr<ProcessGroup> open_process_group([[maybe_unused]] int* argc, [[maybe_unused]] char*** argv) {
  // torchrun, accelerate, a PyTorchJob (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or srun with a
  // rendezvous address and no PMI are env:// launches
  if (!mpi_launch())
    if (const auto launch = detect_env_launch()) return open_env_process_group(*launch);
#ifdef STALLBENCH_HAVE_MPI
  return open_mpi_process_group(argc, argv);
#else
  return make_single_process_group();
#endif
}

std::unique_ptr<Communicator> open_communicator([[maybe_unused]] ProcessGroup& group, const std::string& backend) {
  if (backend == "mpi") {
    if (!group.is_mpi() && group.size() > 1)
      throw UnsupportedError(fmt::format("backend=mpi: the ranks were launched the env:// way ({}), not by mpirun or "
                                         "srun with PMI: MPI is not running in them; use backend=nccl, or launch with mpirun",
                                         group.launcher()));
#ifdef STALLBENCH_HAVE_MPI
    return open_mpi_communicator(group);
#else
    throw UnsupportedError("backend=mpi: this build has no MPI (install libopenmpi-dev and reconfigure); "
                           "backend=nccl runs one rank without it");
#endif
  }
  if (backend == "nccl") {
#ifdef STALLBENCH_HAVE_NCCL
    return open_nccl_communicator(group, std::chrono::steady_clock::now() + std::chrono::seconds(120));
#else
    throw UnsupportedError("backend=nccl: this build has no NCCL (it needs CUDA and NCCL; see `meson configure`)");
#endif
  }
  throw UsageError(fmt::format("unknown collective backend '{}'; valid: mpi, nccl", backend));
}

}  // namespace sb
