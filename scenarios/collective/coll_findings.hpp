// The collective scenario's findings, from its result rows: the peak bus
// bandwidth and latency floor per op and dtype, what check=fingerprint costs
// per size, and each mismatch run's analysis.
#pragma once

#include <cstdint>  // std::int64_t
#include <string>   // std::string

#include <vector>   // std::vector

#include "harness/result.hpp"                  // Result, Point
#include "scenarios/collective/coll_data.hpp"      // CollCall
#include "diagnose/hang/hang_analysis.hpp"  // HangReport

namespace sb {

inline constexpr const char* kCollectiveCause = "collectives that do not match across ranks";

// "256 KiB", "1020 B": a message size as people read it.
std::string bytes_text(std::int64_t bytes);

// How a sweep row's calls went through the library, for its info: the
// backend and its library, the mode the calls ran in ("blocking",
// "nonblocking": what ran, not what was asked, since nccl has no blocking
// mode) and the calls by name (coll_call_family).
struct CollPath {
  std::string backend, library;
  bool blocking = false;
};

// The library calls a row timed: "MPI_Allreduce", "MPI_Iallreduce + MPI_Test",
// "ncclAllReduce on a stream".
std::string coll_call_family(const std::string& backend, CollOp op, bool blocking);

// One row of the size sweep, from what the timed window recorded: each
// rank's per-call time (us) and the wrong elements summed over ranks.
// nccl-tests' figures: algbw = size / time (GB/s = 1e9 B/s), busbw = algbw x
// the op's bus factor (allreduce 2(n-1)/n, allgather and reducescatter
// (n-1)/n, broadcast and reduce 1), time the mean over ranks.
Point coll_size_point(const CollCall& c, int ranks, std::int64_t size_bytes, const std::vector<double>& times_us,
                      std::int64_t wrong, const CollPath& path);

// The step loop's row (a mismatch reproduced), from what it recorded: its
// wall time on this rank, the wrong elements summed over ranks and the
// first step that had any, and (rank 0) the analysis of the dumps every
// rank wrote at the end. No hang but a divergence, or wrong data, is an error.
Point step_loop_point(int steps, double loop_ms, std::int64_t wrong_total, std::int64_t first_wrong_step,
                      const HangReport* analysis);

// Adds the ranks and bytes axes and the findings to r. A pure function of the
// result: the job's size is the one its rows recorded (params.ranks; 1 when
// no row did), never the live process group, so a published result reads
// the same wherever it is analysed.
void collective_findings(Result& r);

}  // namespace sb
