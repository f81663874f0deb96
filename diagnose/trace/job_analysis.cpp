// A job's ranks side by side, the collectives matched across them (job_analysis.hpp).
#include "diagnose/trace/job_analysis.hpp"

#include <algorithm>  // std::sort, std::max, std::min
#include <limits>     // std::numeric_limits

#include "diagnose/trace/intervals.hpp"  // median

namespace sb::diagnose {
namespace {

using readers::intervals::median;

struct Kernel {
  double ts = 0, te = 0;
  std::string name;
};

// "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)" -> "ncclKernel_AllReduce_RING_LL_Sum_float"
std::string family(const std::string& name) { return name.substr(0, name.find_first_of("(<")); }

// A GPU job's: the communication kernels on its busiest device. A CPU job's (no GPU events: gloo): the
// backend's own spans, gloo:all_reduce and the like, on gloo's threads (the c10d:: op on the main thread
// only queues the work).
std::vector<Kernel> communication_kernels(const readers::Trace& t, const readers::Temporal* dev) {
  std::vector<Kernel> out;
  for (const auto& e : t.events) {
    const std::string& n = t.name(e);
    if (dev ? e.cat == readers::Cat::kernel && e.pid == dev->device &&
                  readers::kernel_type(n) == readers::KernelType::communication
            : (e.cat == readers::Cat::user_annotation || e.cat == readers::Cat::cpu_op) && n.rfind("gloo:", 0) == 0)
      out.push_back({e.ts, e.end(), family(n)});
  }
  std::sort(out.begin(), out.end(), [](const Kernel& a, const Kernel& b) { return a.ts < b.ts; });
  return out;
}

// Its ProfilerStep#N spans: the first start and the summed length (0, 0 without steps).
std::pair<double, double> steps(const readers::Trace& t) {
  double first = std::numeric_limits<double>::infinity(), total = 0;
  for (const auto& e : t.events)
    if ((e.cat == readers::Cat::user_annotation || e.cat == readers::Cat::cpu_op) &&
        t.name(e).rfind("ProfilerStep#", 0) == 0) {
      first = std::min(first, e.ts);
      total += e.dur;
    }
  return total > 0 ? std::pair{first, total} : std::pair{0.0, 0.0};
}

// How many collectives match: the shortest rank's count, cut at the first position whose names differ.
std::size_t match_count(const std::vector<std::vector<Kernel>>& k, JobAnalysis& j) {
  std::size_t n = std::numeric_limits<std::size_t>::max(), total = 0;
  for (const auto& v : k) n = std::min(n, v.size()), total += v.size();
  if (k.empty()) return 0;
  std::size_t m = 0;
  for (; m < n; ++m) {
    bool same = true;
    for (const auto& v : k) same = same && v[m].name == k[0][m].name;
    if (!same) {
      j.match_note = "the ranks' communication kernel #" + std::to_string(m + 1) + " differs by name (" +
                     k[0][m].name + " on the first rank): matched up to it";
      break;
    }
  }
  if (j.match_note.empty() && total != n * k.size())
    j.match_note = "the ranks have different numbers of communication kernels: the first " + std::to_string(n) +
                   " of each matched";
  j.unmatched = total - m * k.size();
  return m;
}

void collectives(const std::vector<std::vector<Kernel>>& k, std::size_t m, JobAnalysis& j) {
  const std::size_t n = k.size();
  // clock offsets from the ends: a collective ends at about the same instant on every rank
  std::vector<std::vector<double>> rel(n);
  for (std::size_t c = 0; c < m; ++c) {
    std::vector<double> ends;
    for (const auto& v : k) ends.push_back(v[c].te);
    const double mid = median(ends);
    for (std::size_t r = 0; r < n; ++r) rel[r].push_back(k[r][c].te - mid);
  }
  for (std::size_t r = 0; r < n; ++r) j.ranks[r].clock_offset_us = m > 0 ? median(rel[r]) : 0;
  std::vector<double> spreads, durations;
  for (std::size_t c = 0; c < m; ++c) {
    Collective col;
    col.name = k[0][c].name;
    double first = std::numeric_limits<double>::infinity(), last = -first, end_lo = first, end_hi = -first;
    std::vector<double> arrivals;
    for (std::size_t r = 0; r < n; ++r) {
      const double a = k[r][c].ts - j.ranks[r].clock_offset_us, e = k[r][c].te - j.ranks[r].clock_offset_us;
      arrivals.push_back(a);
      col.duration_us.push_back(k[r][c].te - k[r][c].ts);
      durations.push_back(k[r][c].te - k[r][c].ts);
      if (a > last) last = a, col.last = r;
      first = std::min(first, a);
      end_lo = std::min(end_lo, e), end_hi = std::max(end_hi, e);
    }
    const double mid = median(arrivals);
    for (std::size_t r = 0; r < n; ++r) {
      col.arrival_us.push_back(arrivals[r] - first);
      col.wait_us.push_back(std::clamp(last - arrivals[r], 0.0, col.duration_us[r]));
      JobFigures& f = j.ranks[r];
      f.wait_us += col.wait_us[r];
      f.late_us += std::max(0.0, arrivals[r] - mid);
      f.max_late_us = std::max(f.max_late_us, arrivals[r] - mid);
    }
    j.ranks[col.last].last_count++;
    col.spread_us = last - first;
    col.over_median_us = last - mid;
    j.balanced_saving_us += col.over_median_us;
    spreads.push_back(end_hi - end_lo);
    j.collectives.push_back(std::move(col));
  }
  j.end_spread_us = median(spreads);
  // NCCL's kernels end within microseconds of each other; gloo's all_reduce returns on each rank when its
  // own part of the ring is done (ends 0.3-8 ms apart on 3 ranks of one machine, of 3-45 ms calls)
  const bool gloo = m > 0 && k[0][0].name.rfind("gloo:", 0) == 0;
  j.clocks_agree = m > 0 && j.end_spread_us <= (gloo ? std::max(1000.0, 0.25 * median(durations))
                                                     : std::max(50.0, 0.05 * median(durations)));
}

void straggler(JobAnalysis& j) {
  if (j.collectives.empty() || j.ranks.size() < 2) return;
  std::size_t top = 0;
  for (std::size_t r = 1; r < j.ranks.size(); ++r)
    if (j.ranks[r].late_us > j.ranks[top].late_us) top = r;
  // one rank must stand out: late past the median rank by 5% of the job's median step or more, summed over
  // the collectives (launch jitter on a balanced job stays under it: 0 named on the balanced gloo job)
  std::vector<double> st;
  for (const auto& f : j.ranks) st.push_back(f.step_us);
  const double step = median(st);
  if (j.ranks[top].late_us <= 0 || (step > 0 && j.ranks[top].late_us < 0.05 * step)) return;
  j.straggler = std::ptrdiff_t(top);
  for (std::size_t r = 0; r < j.ranks.size(); ++r)
    if (r != top && j.ranks[r].late_us >= 0.5 * j.ranks[top].late_us) j.also_late.push_back(r);
}

}  // namespace

JobAnalysis analyze_job(const std::vector<JobRank>& in) {
  JobAnalysis j;
  std::vector<std::vector<Kernel>> k;
  for (std::size_t i = 0; i < in.size(); ++i) {
    JobFigures f;
    f.rank_index = i;
    f.rank = in[i].rank;
    for (const auto& d : in[i].analysis->temporal)
      if (!f.dev || d.kernel_us > f.dev->kernel_us) f.dev = &d;
    k.push_back(communication_kernels(*in[i].trace, f.dev));
    for (const auto& c : k.back()) f.comm_us += c.te - c.ts;
    const auto [start, total] = steps(*in[i].trace);
    f.has_steps = total > 0;
    f.step_start_us = start;
    f.step_us = f.has_steps ? total : f.dev ? f.dev->window_us : 0;
    j.ranks.push_back(f);
  }
  const std::size_t m = match_count(k, j);
  collectives(k, m, j);
  // step starts and the first arrival, on the common clock
  double first_start = std::numeric_limits<double>::infinity();
  for (auto& f : j.ranks)
    if (f.has_steps) f.step_start_us -= f.clock_offset_us, first_start = std::min(first_start, f.step_start_us);
  for (auto& f : j.ranks) {
    if (!f.has_steps) continue;
    if (m > 0) f.first_arrival_in_step_us = (k[f.rank_index][0].ts - f.clock_offset_us) - f.step_start_us;
    f.step_start_us -= first_start;
  }
  straggler(j);
  return j;
}

}  // namespace sb::diagnose
