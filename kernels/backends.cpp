#include "kernels/backends.hpp"

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"           // UsageError
#include "kernels/cpu/cpu_backend.hpp"  // make_cpu_backend
#ifdef STALLBENCH_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"  // make_cuda_backend
#endif

namespace sb {

const std::vector<Backend>& all_backends() {
  static const std::vector<Backend> v = [] {
    std::vector<Backend> b{make_cpu_backend()};
#ifdef STALLBENCH_HAVE_CUDA
    b.push_back(make_cuda_backend());
#endif
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
  throw UsageError(fmt::format("device {} is not available in this build; valid: auto, cpu, cuda:N", spec.str()));
}

}  // namespace sb
