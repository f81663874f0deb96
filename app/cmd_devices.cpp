// `stallbench devices`: the machine, and under a launcher the ranks it started. Each rank reports
// its host, process and GPUs to rank 0; rank 0 sends a 128-byte id (the size of NCCL's unique id,
// which a NCCL job's rank 0 sends the same way) and every rank's hash of what it got must match:
// the check that the launch's rendezvous works before a long job depends on it.
#include "app/app.hpp"

#include <cstdint>   // std::uint64_t
#include <cstdlib>   // std::getenv
#include <iostream>  // std::cout
#include <memory>    // std::unique_ptr
#include <random>    // std::random_device

#include <unistd.h>  // getpid

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/comm.hpp"         // ProcessGroup
#include "harness/errors.hpp"       // Error
#include "harness/exit_codes.hpp"   // kExit*
#include "harness/expected.hpp"     // match_expected
#include "harness/fingerprint.hpp"  // machine_fingerprint, build_info, read_cpu_info
#include "kernels/backends.hpp"     // all_backends, launched_with_ranks, open_process_group

namespace sb::app {

using json = nlohmann::ordered_json;

namespace {

std::int64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return static_cast<std::int64_t>(h);
}

// Every rank's host, pid, local rank and GPUs, on rank 0; the id check on every rank.
json rank_roster(ProcessGroup& g, const json& fp) {
  using clock_type = std::chrono::steady_clock;
  const auto deadline = [] { return clock_type::now() + std::chrono::seconds(60); };
  std::string id;
  if (g.rank() == 0) {
    std::random_device rd;
    for (int i = 0; i < 128; ++i) id.push_back(static_cast<char>(rd() & 0xff));
  }
  id = g.broadcast(id, 0, deadline());
  const auto hashes = g.allgather(fnv1a(id), deadline());
  std::vector<int> differ;
  for (std::size_t r = 0; r < hashes.size(); ++r)
    if (hashes[r] != hashes[0] || id.size() != 128) differ.push_back(static_cast<int>(r));
  if (!differ.empty())
    throw Error(ErrorKind::runtime, fmt::format("rank 0's 128-byte id reached rank{} {} damaged: the rendezvous "
                                                "is broken", differ.size() == 1 ? "" : "s", fmt::join(differ, ", ")));
  json gpus = json::array();
  for (const auto& x : fp["gpus"]) gpus.push_back(x.value("id", "") + " " + x.value("name", ""));
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const json mine{{"rank", g.rank()},           {"host", g.host()},
                  {"pid", static_cast<long long>(::getpid())},
                  {"local_rank", g.local_rank()}, {"local_size", g.local_size()},
                  {"gpus", gpus},               {"cuda_visible_devices", visible ? json(visible) : json(nullptr)}};
  const auto all = g.gather(mine.dump(), 0, deadline());
  json out{{"size", g.size()}, {"launcher", g.launcher()}, {"rendezvous", g.library()}, {"id_bytes", 128},
           {"id_agreed", true}, {"per_rank", json::array()}};
  for (const auto& text : all) out["per_rank"].push_back(json::parse(text));  // our own dump(), from rank k
  g.barrier(deadline());
  return out;
}

void print_roster(const json& ranks) {
  std::cout << fmt::format("ranks    {} via {} ({})\n         rank 0's 128-byte id reached every rank intact (the "
                           "way NCCL's unique id travels)\n",
                           ranks["size"].get<int>(), ranks["launcher"].get<std::string>(),
                           ranks["rendezvous"].get<std::string>());
  std::cout << fmt::format("{:>8}  {:<20} {:>8}  {:<8} {}\n", "rank", "host", "pid", "local", "GPUs (CUDA_VISIBLE_DEVICES)");
  for (const auto& r : ranks["per_rank"]) {
    std::vector<std::string> gpus = r["gpus"].get<std::vector<std::string>>();
    std::string g = gpus.empty() ? "none" : fmt::format("{}", fmt::join(gpus, ", "));
    if (r["cuda_visible_devices"].is_string()) g += fmt::format(" ({})", r["cuda_visible_devices"].get<std::string>());
    std::cout << fmt::format("{:>8}  {:<20} {:>8}  {:<8} {}\n", r["rank"].get<int>(), r["host"].get<std::string>(),
                             r["pid"].get<long long>(),
                             fmt::format("{}/{}", r["local_rank"].get<int>(), r["local_size"].get<int>()), g);
  }
}

int cmd_devices(const std::string& json_path, int& argc, char**& argv) {
  json fp = machine_fingerprint(all_backends());
  // Under a launcher every rank answers: rank 0 alone prints, with the ranks' table
  std::unique_ptr<ProcessGroup> group;
  if (launched_with_ranks()) group = open_process_group(&argc, &argv);
  if (group) {
    fp["ranks"] = rank_roster(*group, fp);
    if (group->rank() != 0) return kExitOk;
  }
  if (!json_path.empty()) {
    // What this binary was built with (features found at configure): a script can tell
    // whether it may launch a multi-rank scenario under mpirun, or expect cuDNN.
    const BuildInfo b = build_info();
    fp["build"] = json{{"version", b.version}, {"git_sha", b.git_sha}, {"compiler", b.compiler},
                       {"build_type", b.build_type}, {"features", b.features}};
    write_file_atomic(json_path, fp.dump(2) + "\n");  // "-": stdout
    return kExitOk;
  }
  if (group) print_roster(fp["ranks"]);
  const json& cpu = fp["cpu"];
  std::cout << fmt::format("cpu      {}\n         {} logical cores; ISA: {}\n", cpu["model"].get<std::string>(),
                           cpu["logical_cores"].get<int>(),
                           cpu["isa"].empty() ? std::string("none of interest")
                                              : fmt::format("{}", fmt::join(cpu["isa"].get<std::vector<std::string>>(), " ")));
  {
    // which expected-numbers file a cpu run is compared with (matched on ISA, cores, vendor, family)
    DeviceInfo host;
    host.kind = DeviceKind::cpu;
    const CpuInfo ci = read_cpu_info();
    const auto ex = match_expected(host, ci);
    std::cout << fmt::format("         {}{}; expected numbers: {}\n", ci.vendor.empty() ? "vendor unknown" : ci.vendor,
                             ci.family >= 0 ? fmt::format(" family {}", ci.family) : std::string(),
                             ex ? ex->id() : std::string("none for this CPU (results/expected)"));
  }
  for (const auto& [backend, v] : fp["versions"].items()) {
    std::string line;
    for (const auto& [k, x] : v.items())
      if (k != "unavailable") line += fmt::format("{}={} ", k, x.is_string() ? x.get<std::string>() : x.dump());
    std::cout << fmt::format("{:<8} {}\n", backend, line);
  }
  for (const auto& g : fp["gpus"]) {
    std::cout << fmt::format("{:<8} {}\n", g["id"].get<std::string>(), g["name"].get<std::string>());
    for (const auto& [k, x] : g["props"].items())
      std::cout << fmt::format("         {}: {}\n", k, x.is_string() ? x.get<std::string>() : x.dump());
  }
  for (const auto& [backend, v] : fp["versions"].items())
    if (v.contains("unavailable")) std::cout << fmt::format("{:<8} {}\n", backend, v["unavailable"].get<std::string>());
  if (!fp["versions"].contains("cuda")) std::cout << "cuda     not built (configure with -Dcuda=enabled)\n";
  return kExitOk;
}

}  // namespace

Command add_devices(CLI::App& app, int& argc, char**& argv) {
  auto* devices = app.add_subcommand("devices", "the CPU and CUDA GPUs, with library versions; under a launcher (mpirun, srun, torchrun) every rank's host, process and GPUs, and whether the launch's rendezvous works");
  auto json_path = std::make_shared<std::string>();
  auto* json_opt = add_json_output(devices, *json_path, "the machine fingerprint as JSON");
  return {devices, [=, &argc, &argv] { return cmd_devices(json_output(json_opt, *json_path), argc, argv); }};
}


}  // namespace sb::app
