// --trace on cuda: the kernels, copies and memsets the GPU ran and the
// runtime calls that launched them, from CUPTI's activity API (what Kineto,
// and so torch.profiler, records them with), written into a KinetoTrace with
// CUPTI's correlation ids. libcupti is loaded with dlopen and never linked:
// a machine without it writes the host ranges only, and says why.
//
// Compiled here, never run on a GPU (this project's CI machines have none).
#pragma once

#include <memory>  // std::unique_ptr
#include <string>  // std::string

namespace sb {

class KinetoTrace;

class CuptiTrace {
 public:
  // Starts recording the activity of every CUDA context of the process into
  // t. On failure returns nullptr and says why in `why` (no libcupti, a
  // CUPTI error): the caller writes the trace without GPU events.
  static std::unique_ptr<CuptiTrace> start(KinetoTrace& t, std::string& why);
  ~CuptiTrace();  // flushes what CUPTI holds into the trace, then disables
  CuptiTrace(const CuptiTrace&) = delete;
  CuptiTrace& operator=(const CuptiTrace&) = delete;

  struct Impl;

 private:
  explicit CuptiTrace(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sb
