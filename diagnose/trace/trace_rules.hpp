// diagnose --trace's rules, shared between trace_diagnose.cpp (the checks of the TensorBoard plugin and
// HTA's figures) and host_rules.cpp (what the host did while the GPU waited): the context they read and
// the way a finding is recorded. Internal to diagnose/trace.
#pragma once

#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

#include "diagnose/trace/cpu_breakdown.hpp"     // CpuBreakdown
#include "diagnose/trace/host_attribution.hpp"  // HostAttribution, Iterations
#include "diagnose/trace/trace_analysis.hpp"    // TraceAnalysis, Steps
#include "harness/result.hpp"                   // Point, Finding
#include "readers/kineto.hpp"                   // Trace

namespace sb::diagnose::trace_rules {

struct Ctx {
  const readers::Trace& t;
  const readers::TraceAnalysis& a;
  std::string device;  // for the reproduce commands: this machine's device
  std::vector<Finding> found;
  // the device the figures speak for: the one with the most GPU time
  const readers::Temporal* dev = nullptr;
  double window = 0;   // its GPU window, µs
  double windows = 0;  // every device's GPU window, summed (the denominator of a figure summed over devices)
  const readers::Iterations* iterations = nullptr;
  const readers::HostAttribution* host = nullptr;  // of `dev`; stream -1 without GPU events
  // The loader's figures: over ProfilerStep#N as analyze() has them, else over the iterations recovered
  // from the loader's or the optimizer's calls; over the iterations after warm-up where there was one.
  readers::Steps steps;
  std::string steps_source;  // "ProfilerStep#N", "enumerate(DataLoader)#...__next__", ... or ""
  double slow_op_us = 0;     // the host time a slow-op finding claimed (not launch overhead's too)
  // Without GPU events: the CPU ops' breakdown (cpu(), from the iterations), and the ISA extensions of the CPU
  // reading the trace (meta's cpu.isa; a trace does not name its CPU), which say whether bf16 is native.
  std::optional<readers::CpuBreakdown> cpu;
  std::vector<std::string> cpu_isa;
  bool cpu_isa_known = false;
};

Point check(const std::string& name);
Point skipped(const std::string& name, const std::string& why);
// Records a finding of `check_name` on point p. bound: the gain is an upper bound (the cost removed
// entirely), said "up to". An empty command: no scenario reproduces the cause.
void find(Ctx& c, Point& p, const std::string& cause, const std::string& check_name, std::optional<double> gain,
          double share_pct, const std::string& confidence, const std::string& evidence, const std::string& line,
          const std::string& command, bool bound = false);

// host_rules.cpp: the host attribution as a check (its figures), and the findings it names: warm-up in the
// window, synchronization, allocator churn, a slow op on the host.
Point host(Ctx& c);
// The host attribution as every finding's evidence: evidence.figures gets its line (warm-up's for the
// warm-up finding), evidence.host_attribution its leading items.
void attach_host_evidence(const Ctx& c, std::vector<Finding>& findings);

// cpu_rules.cpp: a trace without GPU events read from its CPU ops (a sync per step, allocator churn, a slow
// custom layer, the GEMMs' dtype, framework overhead, collectives, CPU-only), and, after the ranking, the
// breakdown as every finding's evidence (CPU-only first where the steps hold no compute). read_cpu_isa takes
// meta's cpu.isa.
void read_cpu_isa(Ctx& c, const nlohmann::ordered_json& meta);
Point cpu(Ctx& c);
void finish_cpu(const Ctx& c, std::vector<Finding>& findings);

}  // namespace sb::diagnose::trace_rules
