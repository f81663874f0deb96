// Keeps one CPU for the host thread while a scenario runs (as a GPU job's host
// thread has its own core): the device's compute (the cpu device's thread and
// its OpenMP team) is pinned to the others, and gets every CPU back when this
// goes out of scope. Devices that compute elsewhere (cuda, sim) reserve none.
#pragma once

#include <vector>  // std::vector

#include "harness/cpu_affinity.hpp"  // allowed_cpus
#include "harness/device.hpp"        // Device::reserve_host_cpus
#include "harness/result.hpp"        // Point

namespace sb {

class HostCpuForHost {
 public:
  explicit HostCpuForHost(Device& dev) : dev_(dev) {
    const int ncpu = int(allowed_cpus().size());
    compute_ = dev_.reserve_host_cpus(ncpu > 1 ? ncpu - 1 : 0);
    shared_ = dev_.shared_host_cpus();
  }
  // Never throws: a stream that hung keeps its pinning (the run is ending).
  ~HostCpuForHost() {
    try {
      dev_.reserve_host_cpus(0);
    } catch (...) {
    }
  }
  HostCpuForHost(const HostCpuForHost&) = delete;
  HostCpuForHost& operator=(const HostCpuForHost&) = delete;
  // The CPUs the device's compute runs on now (empty where it uses none).
  const std::vector<int>& compute_cpus() const { return compute_; }
  // Those of them another stallbench process computes on too (Device::shared_host_cpus).
  const std::vector<int>& shared_cpus() const { return shared_; }
  // info.compute_cpus; where shared, info.compute_cpus_shared and a warning on the point.
  void record(Point& p) const;

 private:
  Device& dev_;
  std::vector<int> compute_, shared_;
};

}  // namespace sb
