#include "harness/host_cpus.hpp"

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/runner.hpp"  // add_warning

namespace sb {

void HostCpuForHost::record(Point& p) const {
  p.info["compute_cpus"] = compute_;
  if (shared_.empty()) return;
  p.info["compute_cpus_shared"] = shared_;
  add_warning(p, fmt::format("another stallbench process computes on CPU(s) {} too (its claim came first, and no "
                             "other CPU was free): this point's figures contend with it",
                             fmt::join(shared_, ", ")));
}

}  // namespace sb
