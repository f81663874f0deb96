// analyze-hang on PyTorch's Flight Recorder dumps, read by readers/torch_fr.hpp (whose header
// says how the analysis follows torch.distributed.flight_recorder.fr_trace and what it does not
// model).
#pragma once

#include <vector>  // std::vector

#include "diagnose/hang/hang_analysis.hpp"  // HangReport
#include "readers/torch_fr.hpp"             // TorchFrDump

namespace sb {

// The analysis. Ranks of the job without a dump are named.
HangReport analyze_torch_fr(const std::vector<TorchFrDump>& dumps);

}  // namespace sb
