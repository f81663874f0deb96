// A job is many ranks: the figures of every rank's trace side by side, and what one rank's trace cannot
// show: who the others wait for at each collective.
//
// The collectives are matched across ranks by their order on each rank (the n-th communication kernel of
// every rank is one collective), while their names agree. A collective ends at nearly the same instant on
// every rank (none can finish before the last has arrived), so the ranks' clocks are aligned on the
// collectives' ends (each rank's offset: the median over collectives of its end minus the median end), and
// each rank's arrival is its kernel's start on that common clock. The time a rank's kernel spins before the
// last rank arrives is its wait for the others (HTA's "collective launch skew", counted per rank); the rank
// that arrives late most, summed over the collectives against the median arrival, is the straggler.
#pragma once

#include <cstdint>  // std::int64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include "diagnose/trace/trace_analysis.hpp"  // TraceAnalysis, Temporal
#include "readers/kineto.hpp"                 // Trace

namespace sb::diagnose {

struct JobRank {
  const readers::Trace* trace = nullptr;
  const readers::TraceAnalysis* analysis = nullptr;
  std::int64_t rank = 0;
};

struct Collective {
  std::string name;                  // the kernel's name up to its template arguments
  std::vector<double> arrival_us;    // per rank, on the common clock, from the earliest arrival
  std::vector<double> duration_us;   // per rank
  std::vector<double> wait_us;       // per rank: last arrival - its arrival, at most its kernel's length
  std::size_t last = 0;              // index (into the ranks) of the rank that arrived last
  double spread_us = 0;              // last arrival - first arrival
  double over_median_us = 0;         // last arrival - the median arrival
};

struct JobFigures {
  std::size_t rank_index = 0;
  std::int64_t rank = 0;
  const readers::Temporal* dev = nullptr;  // its device with the most GPU time (nullptr: no GPU events)
  double clock_offset_us = 0;              // subtracted from its times to put them on the common clock
  double step_start_us = 0;                // its first ProfilerStep#N's start on the common clock (from the earliest)
  double step_us = 0;                      // its ProfilerStep#N time summed (0: no steps), else its GPU window
  bool has_steps = false;
  double first_arrival_in_step_us = -1;    // its first collective's arrival - its step start (-1: unknown)
  double comm_us = 0;                      // its communication kernels' time, summed
  double wait_us = 0;                      // of that, waiting for later ranks
  double late_us = 0;                      // its arrivals past the median arrival, summed
  double max_late_us = 0;                  // the most it arrived past the median at one collective
  int last_count = 0;                      // collectives it arrived last at
};

struct JobAnalysis {
  std::vector<JobFigures> ranks;          // in the order given
  std::vector<Collective> collectives;    // matched across every rank
  std::size_t unmatched = 0;              // communication kernels past the match (counts or names differ)
  std::string match_note;                 // why the match stopped where it did ("" when all matched)
  double end_spread_us = 0;               // the median over collectives of (last end - first end), aligned
  bool clocks_agree = false;  // the aligned ends agree (NCCL: within 5% of the median kernel or 50 us; gloo: 25% or 1 ms)
  std::ptrdiff_t straggler = -1;          // index into ranks, -1: none stands out
  std::vector<std::size_t> also_late;     // ranks late by at least half the straggler's lateness
  double balanced_saving_us = 0;          // sum over collectives of (last - median arrival): the job's loss
};

JobAnalysis analyze_job(const std::vector<JobRank>& ranks);

}  // namespace sb::diagnose
