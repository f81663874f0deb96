#include "harness/fingerprint.hpp"
#include "harness/text.hpp"  // parse_whole

#include <algorithm>  // std::find
#include <chrono>     // std::chrono::system_clock
#include <fstream>    // std::ifstream
#include <sstream>    // std::stringstream
#include <thread>     // std::thread::hardware_concurrency

#include <sys/utsname.h>  // uname
#include <unistd.h>       // gethostname

#include <fmt/format.h>  // fmt::format

#include "version.hpp"  // STALLBENCH_VERSION, STALLBENCH_GIT_SHA (generated from harness/version.hpp.in)

namespace sb {

using json = nlohmann::ordered_json;

const std::vector<std::string>& isa_flags_of_interest() {
  static const std::vector<std::string> v{"avx2",     "avx512f",  "avx512_bf16", "avx512_fp16",
                                          "amx_tile", "amx_bf16", "amx_int8",    "amx_fp16"};
  return v;
}

CpuInfo parse_cpuinfo(const std::string& text, int logical_cores) {
  CpuInfo c;
  c.logical_cores = logical_cores;
  std::istringstream in(text);
  std::string line;
  bool have_flags = false;
  std::string implementer, part;
  while (std::getline(in, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    std::string val = colon + 1 < line.size() ? line.substr(colon + 1) : "";
    if (!val.empty() && val.front() == ' ') val.erase(0, 1);
    if (key == "model name" && c.model.empty()) c.model = val;
    if (key == "vendor_id" && c.vendor.empty()) c.vendor = val;
    if (key == "cpu family" && c.family < 0) {
      if (const auto f = text::parse_whole<int>(val); f && *f >= 0) c.family = *f;
    }
    // aarch64 has no "model name": the implementer and part identify the core.
    if (key == "CPU implementer" && implementer.empty()) implementer = val;
    if (key == "CPU part" && part.empty()) part = val;
    if ((key == "flags" || key == "Features") && !have_flags) {
      have_flags = true;
      std::istringstream fs(val);
      std::vector<std::string> flags;
      for (std::string f; fs >> f;) flags.push_back(f);
      for (const auto& want : isa_flags_of_interest())
        if (std::find(flags.begin(), flags.end(), want) != flags.end()) c.isa.push_back(want);
    }
  }
  if (c.model.empty() && !implementer.empty())
    c.model = fmt::format("Arm CPU implementer {} part {}", implementer, part.empty() ? "?" : part);
  if (c.model.empty()) c.model = "unknown CPU";
  return c;
}

CpuInfo read_cpu_info() {
  std::ifstream in("/proc/cpuinfo");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_cpuinfo(ss.str(), int(std::thread::hardware_concurrency()));
}

BuildInfo build_info() {
  BuildInfo b;
  b.version = STALLBENCH_VERSION;
  b.git_sha = STALLBENCH_GIT_SHA;
#if defined(__clang__)
  b.compiler = fmt::format("clang {}.{}.{}", __clang_major__, __clang_minor__, __clang_patchlevel__);
#elif defined(__GNUC__)
  b.compiler = fmt::format("gcc {}.{}.{}", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#endif
#ifdef STALLBENCH_BUILD_TYPE
  b.build_type = STALLBENCH_BUILD_TYPE;
#endif
  b.features = json{
#ifdef STALLBENCH_HAVE_CUDA
      {"cuda", true},
#else
      {"cuda", false},
#endif
#ifdef STALLBENCH_HAVE_CUDNN
      {"cudnn", true},
#else
      {"cudnn", false},
#endif
#ifdef STALLBENCH_HAVE_NCCL
      {"nccl", true},
#else
      {"nccl", false},
#endif
#ifdef STALLBENCH_HAVE_MPI
      {"mpi", true},
#else
      {"mpi", false},
#endif
  };
  return b;
}

json machine_fingerprint(std::span<const Backend> backends) {
  json m;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  m["host"] = host;
  struct utsname u{};
  if (::uname(&u) == 0) m["os"] = fmt::format("{} {} {}", u.sysname, u.release, u.machine);
  const CpuInfo cpu = read_cpu_info();
  m["cpu"] = json{{"model", cpu.model}, {"logical_cores", cpu.logical_cores}, {"isa", cpu.isa}};
  if (!cpu.vendor.empty()) m["cpu"]["vendor"] = cpu.vendor;
  if (cpu.family >= 0) m["cpu"]["family"] = cpu.family;
  json gpus = json::array();
  json versions = json::object();
  for (const auto& b : backends) {
    if (b.versions) versions[b.name] = b.versions();
    if (b.name == "cpu" || b.name == "sim") continue;  // only real GPUs are GPUs
    for (const auto& d : b.list()) gpus.push_back(json{{"id", d.id}, {"name", d.name}, {"props", d.props}});
    if (const std::string why = b.unavailable(); !why.empty()) versions[b.name]["unavailable"] = why;
  }
  m["gpus"] = std::move(gpus);
  m["versions"] = std::move(versions);
  return m;
}

}  // namespace sb
