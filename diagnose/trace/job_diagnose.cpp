// diagnose --trace on a whole job (job_diagnose.hpp).
#include "diagnose/trace/job_diagnose.hpp"

#include <sys/resource.h>  // getrusage: the job's peak memory
#include <sys/stat.h>      // stat

#include <algorithm>  // std::sort, std::min, std::max
#include <atomic>     // std::atomic
#include <chrono>     // std::chrono
#include <exception>  // std::exception_ptr
#include <filesystem>  // std::filesystem
#include <map>        // std::map
#include <regex>      // std::regex
#include <thread>     // std::thread

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "diagnose/trace/intervals.hpp"       // median
#include "diagnose/trace/job_analysis.hpp"    // analyze_job
#include "diagnose/trace/trace_diagnose.hpp"  // read_trace, diagnose_read
#include "harness/errors.hpp"                 // UsageError

namespace sb::diagnose {
namespace {

using json = nlohmann::ordered_json;
using readers::intervals::median;

bool is_trace_name(const std::string& n) {
  auto ends = [&](const std::string& s) { return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0; };
  return ends(".json") || ends(".json.gz");
}

struct RankRead {
  TraceRead read;
  readers::TraceAnalysis analysis;
  Result own;  // the rank's own diagnosis, as diagnose --trace FILE gives it
  std::int64_t rank = 0;
  std::string rank_source;
};

// Every file read, analysed and diagnosed on its own, `threads` at a time; the first error is rethrown.
std::vector<RankRead> read_all(const std::vector<std::string>& files, const json& meta, unsigned threads) {
  std::vector<RankRead> out(files.size());
  std::vector<std::exception_ptr> errors(files.size());
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next++) < files.size();) {
      try {
        out[i].read = read_trace(files[i]);
        out[i].analysis = readers::analyze(out[i].read.trace);
        out[i].own = diagnose_read(out[i].read, out[i].analysis, meta);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

// Each file's rank: distributedInfo's, else the digits after "rank" in its name, else its place.
void assign_ranks(std::vector<RankRead>& rs) {
  static const std::regex digits(R"(rank[_-]?(\d{1,7}))", std::regex::icase);
  std::map<std::int64_t, std::string> seen;
  std::vector<std::size_t> unnamed;  // neither distributedInfo nor the name says: numbered after the others
  for (std::size_t i = 0; i < rs.size(); ++i) {
    RankRead& r = rs[i];
    const std::string base = std::filesystem::path(r.read.path).filename().string();
    std::smatch m;
    if (r.read.trace.rank) {
      r.rank = *r.read.trace.rank, r.rank_source = "distributedInfo";
    } else if (std::regex_search(base, m, digits)) {
      r.rank = std::stoll(m[1].str()), r.rank_source = "file name";
    } else {
      unnamed.push_back(i);
      continue;
    }
    if (auto [it, fresh] = seen.emplace(r.rank, r.read.path); !fresh)
      throw UsageError(fmt::format("{} and {} both say rank {} ({}): give one job's traces, each rank once",
                                   it->second, r.read.path, r.rank, r.rank_source));
  }
  std::int64_t next = 0;  // the lowest numbers no file claims, in the files' order
  for (std::size_t i : unnamed) {
    while (seen.count(next)) ++next;
    rs[i].rank = next, rs[i].rank_source = "order of the files";
    seen.emplace(next, rs[i].read.path);
  }
  std::sort(rs.begin(), rs.end(), [](const RankRead& a, const RankRead& b) { return a.rank < b.rank; });
}

std::string ranks_text(const std::vector<std::int64_t>& v) {
  std::vector<std::string> s;
  for (auto r : v) s.push_back(std::to_string(r));
  return fmt::format("{}", fmt::join(s, ", "));
}

Point rank_point(const RankRead& r, const JobFigures& f) {
  Point p;
  p.params = json{{"check", fmt::format("rank {}", r.rank)}, {"rank", r.rank}};
  const double step = f.step_us;
  if (f.dev) {
    p.add({"idle_pct", f.dev->idle_pct, "%", Direction::lower, std::nullopt, "HTA temporal breakdown"});
    p.add({"compute_pct", f.dev->compute_pct, "%", Direction::higher, std::nullopt, "HTA temporal breakdown"});
    p.add({"non_compute_pct", f.dev->non_compute_pct, "%", Direction::lower, std::nullopt, "HTA temporal breakdown"});
  }
  p.add({"step_ms", step / 1e3, "ms", Direction::lower, std::nullopt,
         f.has_steps ? "its ProfilerStep#N time, summed" : "its GPU window (no ProfilerStep#N)"});
  p.add({"communication_pct", step > 0 ? 100 * f.comm_us / step : 0, "%", Direction::lower, std::nullopt,
         "its communication kernels' time over its step"});
  p.add({"wait_for_others_pct", step > 0 ? 100 * f.wait_us / step : 0, "%", Direction::lower, std::nullopt,
         "of its step, its collectives' kernels waiting for the last rank to arrive"});
  p.add({"late_ms", f.late_us / 1e3, "ms", Direction::lower, std::nullopt,
         "its arrivals at the collectives past the median rank's, summed"});
  const std::string first = r.own.findings.empty() ? "none found" : r.own.findings.front().cause;
  p.info["first_cause"] = first;
  p.info["file"] = r.read.path;
  p.info["rank_from"] = r.rank_source;
  p.info["reading"] = fmt::format("{}step {:.1f} ms, communication {:.0f}% of it, waiting for later ranks {:.0f}%; "
                                  "its own first cause: {}",
                                  f.dev ? fmt::format("idle {:.1f}%, compute {:.1f}%, non-compute {:.1f}% (HTA); ",
                                                      f.dev->idle_pct, f.dev->compute_pct, f.dev->non_compute_pct)
                                        : "no GPU events; ",
                                  step / 1e3, step > 0 ? 100 * f.comm_us / step : 0,
                                  step > 0 ? 100 * f.wait_us / step : 0, first);
  return p;
}

double median_step(const JobAnalysis& j) {
  std::vector<double> v;
  for (const auto& f : j.ranks) v.push_back(f.step_us);
  return median(v);
}

// The straggler: where it arrived late, how long the others waited, and whether its lateness was already
// there when its step began.
Point straggler_point(const JobAnalysis& j, const std::vector<RankRead>& rs, std::vector<Finding>& found,
                      const std::string& device) {
  Point p;
  p.params = json{{"check", "straggler"}};
  if (j.collectives.empty()) {
    p.status = Status::skipped;
    p.reason = j.match_note.empty() ? "no collective matched across the ranks (no communication kernels)"
                                    : "no collective matched across the ranks: " + j.match_note;
    return p;
  }
  p.add({"collectives_matched", double(j.collectives.size()), "collectives", Direction::none, std::nullopt,
         "communication kernels matched across every rank by their order"});
  p.add({"end_spread_us", j.end_spread_us, "us", Direction::lower, std::nullopt,
         "median over the collectives of their ends' spread across ranks, clocks aligned: near 0 when the match holds"});
  if (!j.match_note.empty()) p.info["note"] = j.match_note;
  if (!j.clocks_agree) {
    p.info["reading"] = fmt::format("the matched collectives do not end together ({:.0f} us apart, median): the "
                                    "ranks' traces are not of the same steps, or the match is wrong; no straggler "
                                    "named", j.end_spread_us);
    return p;
  }
  const double step = median_step(j);
  p.add({"late_arrival_ms", j.balanced_saving_us / 1e3, "ms", Direction::lower, std::nullopt,
         "summed over the collectives: the last rank's arrival past the median rank's"});
  if (j.straggler < 0) {
    p.info["reading"] = fmt::format("{} collectives matched; no rank stands out as late", j.collectives.size());
    return p;
  }
  const JobFigures& s = j.ranks[std::size_t(j.straggler)];
  std::vector<std::int64_t> also;
  for (auto i : j.also_late) also.push_back(j.ranks[i].rank);
  const auto waiter = std::max_element(j.ranks.begin(), j.ranks.end(), [](const auto& a, const auto& b) {
    return (a.step_us > 0 ? a.wait_us / a.step_us : 0) < (b.step_us > 0 ? b.wait_us / b.step_us : 0);
  });
  p.info["straggler"] = s.rank;
  p.info["also_late"] = also;
  // before the step or inside it: its step start against the first's, its time from step start to its first
  // arrival against the median rank's
  std::string when;
  std::vector<double> in_step, starts;
  for (const auto& f : j.ranks)
    if (f.has_steps && f.first_arrival_in_step_us >= 0)
      in_step.push_back(f.first_arrival_in_step_us), starts.push_back(f.step_start_us);
  if (s.has_steps && s.first_arrival_in_step_us >= 0 && !in_step.empty()) {
    // its lateness at the first collective, split: a later step start, or a longer way to the collective
    const double pre = s.step_start_us - median(starts), inside = s.first_arrival_in_step_us - median(in_step);
    const bool before = pre >= inside;
    when = fmt::format("; rank {} began its profiled step {:.2f} ms after the median rank and took {:.2f} ms from "
                       "there to its first collective (median rank {:.2f} ms): {}",
                       s.rank, pre / 1e3, s.first_arrival_in_step_us / 1e3, median(in_step) / 1e3,
                       before ? "the lateness was there before the step began (the previous step's tail, its loader "
                                "or host work outside the profiled window)"
                              : "the lateness grows inside the step (its own work before the collective)");
    p.info["late_before_step"] = before;
  }
  const std::string evidence = fmt::format(
      "rank {} arrives last at {} of {} collectives, {:.2f} ms past the median rank summed (at most {:.2f} ms at "
      "one){}; the others' collectives wait until it arrives: rank {} waits {:.2f} ms, {:.0f}% of its step{}; rank "
      "{}'s own trace names first: {}",
      s.rank, s.last_count, j.collectives.size(), s.late_us / 1e3, s.max_late_us / 1e3,
      also.empty() ? "" : fmt::format(" (ranks {} late too, by half as much or more)", ranks_text(also)), waiter->rank,
      waiter->wait_us / 1e3, waiter->step_us > 0 ? 100 * waiter->wait_us / waiter->step_us : 0, when, s.rank,
      rs[s.rank_index].own.findings.empty() ? "none found" : rs[s.rank_index].own.findings.front().cause);
  p.info["reading"] = evidence;
  const double gain = step > j.balanced_saving_us ? step / (step - j.balanced_saving_us) : 1.0;
  json ev{{"check", "straggler"},
          {"config_line", fmt::format("rank {}: find what it does that the others do not (its data shard, its "
                                      "loader, its node's clocks or thermals: stallbench watch there; py-spy dump "
                                      "of it)", s.rank)},
          {"command", fmt::format("mpirun -n {} stallbench run collective -p mismatch=straggler@1:{} -p delay_ms={:.0f} "
                                  "--device {}",
                                  j.ranks.size(), s.rank, std::max(1.0, s.max_late_us / 1e3), device)},
          {"evidence", evidence},
          {"share_pct", step > 0 ? 100 * j.balanced_saving_us / step : 0},
          {"confidence", j.also_late.empty() ? "high" : "medium"},
          {"estimated", true},
          {"basis", "modelled"},
          {"upper_bound", true}};
  found.push_back({"a straggler rank", fmt::format("straggler: up to {:.2f}x modelled (every rank arriving with the "
                                                   "median rank) -> {} ({})",
                                                   gain, ev["config_line"].get<std::string>(), evidence),
                   gain, ev});
  return p;
}

// The job's communication as the rank that waits least sees it: its kernels' time less their wait.
Point communication_point(const JobAnalysis& j, const std::vector<RankRead>& rs, std::vector<Finding>& found,
                          const std::string& device) {
  Point p;
  p.params = json{{"check", "communication"}};
  std::vector<double> cost, exposed_ratio;
  double comm = 0;
  for (std::size_t i = 0; i < j.ranks.size(); ++i) {
    const auto& f = j.ranks[i];
    comm += f.comm_us;
    if (f.step_us > 0) cost.push_back((f.comm_us - f.wait_us) / f.step_us);
    const auto& fam = rs[i].analysis.families;
    if (fam.nccl_us > 0) exposed_ratio.push_back(fam.nccl_exposed_us / fam.nccl_us);
  }
  if (cost.empty() || comm <= 0) {
    p.status = Status::skipped;
    p.reason = "no communication kernels (nor gloo spans) on any rank";
    return p;
  }
  // a CPU job's gloo work runs on gloo's threads while the step waits for it: all of it exposed (assumed)
  if (exposed_ratio.empty()) p.info["note"] = "no GPU: the collectives' time is taken as exposed (the step waits on it)";
  const double share = median(cost), exposed = share * (exposed_ratio.empty() ? 1.0 : median(exposed_ratio));
  p.add({"communication_cost_pct", 100 * share, "%", Direction::lower, std::nullopt,
         "median rank: its communication kernels' time less their wait for later ranks, over its step"});
  p.add({"exposed_cost_pct", 100 * exposed, "%", Direction::lower, std::nullopt,
         "of that, the share with no computation beside it (the ranks' median exposed fraction)"});
  p.info["reading"] = fmt::format("communication itself takes {:.1f}% of the median rank's step (its wait for late "
                                  "ranks apart), {:.1f}% with nothing computing beside it",
                                  100 * share, 100 * exposed);
  if (100 * share > 10) {
    const double gain = 1.0 / (1.0 - std::min(exposed, 0.99));
    json ev{{"check", "communication"},
            {"config_line", "gradient_accumulation_steps: 2x yours  # fewer all-reduces per sample; or larger DDP "
                            "buckets, or overlap (FSDP prefetch)"},
            {"command", fmt::format("mpirun -n {} stallbench run collective -p op=all_reduce --device {}",
                                    j.ranks.size(), device)},
            {"evidence", p.info["reading"]},
            {"share_pct", 100 * share},
            {"confidence", "medium"},
            {"estimated", true},
            {"basis", "modelled"},
            {"upper_bound", true}};
    found.push_back({"waiting on collectives",
                     fmt::format("communication: up to {:.2f}x modelled (the exposed part hidden) -> {} ({}; over "
                                 "10%: the TensorBoard plugin's rule)",
                                 gain, ev["config_line"].get<std::string>(), p.info["reading"].get<std::string>()),
                     gain, ev});
  }
  return p;
}

// The causes the ranks' own diagnoses name, each once for the job: on which ranks, the median gain.
void rank_causes(const std::vector<RankRead>& rs, std::vector<Finding>& found) {
  std::map<std::string, std::vector<std::size_t>> by;
  std::vector<std::string> order;
  for (std::size_t i = 0; i < rs.size(); ++i)
    for (const Finding& f : rs[i].own.findings) {
      if (f.cause == "none found" || f.cause == "waiting on collectives") continue;  // the job's own check
      auto& v = by[f.cause];
      if (v.empty()) order.push_back(f.cause);
      if (v.empty() || v.back() != i) v.push_back(i);
    }
  for (const auto& cause : order) {
    const auto& idx = by[cause];
    std::vector<double> gains;
    std::vector<std::int64_t> ranks;
    const Finding* first = nullptr;
    for (auto i : idx)
      for (const Finding& f : rs[i].own.findings)
        if (f.cause == cause) {
          if (!first) first = &f;
          if (f.speedup) gains.push_back(*f.speedup);
          ranks.push_back(rs[i].rank);
          break;
        }
    Finding f = *first;
    f.speedup = gains.empty() ? std::nullopt : std::optional<double>(median(gains));
    f.evidence["ranks"] = ranks;
    f.evidence["ranks_of"] = rs.size();
    f.summary = fmt::format("on {} of {} ranks ({}){}: {}", ranks.size(), rs.size(), ranks_text(ranks),
                            gains.size() > 1 ? fmt::format(", median gain {:.2f}x", *f.speedup) : "", first->summary);
    found.push_back(std::move(f));
  }
}

json job_json(const JobAnalysis& j, const std::vector<RankRead>& rs) {
  json ranks = json::array();
  double job_peak = 0;
  json peak_rank = nullptr;
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const auto& f = j.ranks[i];
    // its devices' largest Total Allocated ([memory] events, profile_memory=True), GiB
    double peak = 0;
    for (const auto& m : rs[i].analysis.memory) peak = std::max(peak, double(m.peak_allocated) / double(1ull << 30));
    if (peak > job_peak) job_peak = peak, peak_rank = rs[i].rank;
    json findings = json::array();
    for (const Finding& x : rs[i].own.findings)
      findings.push_back({{"cause", x.cause}, {"speedup", x.speedup ? json(*x.speedup) : json(nullptr)}});
    ranks.push_back({{"rank", rs[i].rank},
                     {"rank_from", rs[i].rank_source},
                     {"file", rs[i].read.path},
                     {"step_ms", f.step_us / 1e3},
                     {"step_start_ms", f.step_start_us / 1e3},
                     {"clock_offset_us", f.clock_offset_us},
                     {"communication_ms", f.comm_us / 1e3},
                     {"wait_ms", f.wait_us / 1e3},
                     {"late_ms", f.late_us / 1e3},
                     {"last_at", f.last_count},
                     {"peak_allocated_gib", peak},
                     {"findings", findings},
                     {"trace_analysis", readers::to_json(rs[i].analysis)}});
  }
  json cols = json::array();
  for (const auto& c : j.collectives)
    cols.push_back({{"name", c.name},
                    {"last_rank", rs[c.last].rank},
                    {"spread_us", c.spread_us},
                    {"over_median_us", c.over_median_us}});
  return json{{"ranks", ranks},
              {"peak_allocated_gib", job_peak},
              {"peak_allocated_rank", peak_rank},
              {"collectives", cols},
              {"unmatched_kernels", j.unmatched},
              {"match_note", j.match_note},
              {"end_spread_us", j.end_spread_us},
              {"clocks_agree", j.clocks_agree},
              {"straggler", j.straggler >= 0 ? json(rs[std::size_t(j.straggler)].rank) : json(nullptr)}};
}

}  // namespace

std::vector<std::string> trace_files(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const auto& a : args) {
    std::error_code ec;
    const auto st = std::filesystem::status(a, ec);
    if (ec || !std::filesystem::exists(st))
      throw UsageError(fmt::format("{}: no such file or directory (--trace takes a trace, several, or a directory "
                                   "of one job's rank traces)", a));
    if (!std::filesystem::is_directory(st)) {
      out.push_back(a);
      continue;
    }
    std::vector<std::string> in;
    std::error_code fe;  // a broken link or an unreadable entry is left out, not the listing's error
    for (const auto& e : std::filesystem::directory_iterator(a, ec))
      if (is_trace_name(e.path().filename().string()) && e.is_regular_file(fe)) in.push_back(e.path().string());
    if (ec) throw UsageError(fmt::format("{}: cannot list the directory: {}", a, ec.message()));
    if (in.empty()) throw UsageError(fmt::format("{}: no .json or .json.gz trace in the directory", a));
    // the profiler's own names (tensorboard_trace_handler: <worker>.<ts>.pt.trace.json) when there are some: a
    // manifest or a config beside them is not a rank
    auto named = [](const std::string& p) {
      return std::filesystem::path(p).filename().string().find("trace") != std::string::npos;
    };
    if (std::any_of(in.begin(), in.end(), named)) in.erase(std::remove_if(in.begin(), in.end(), [&](const auto& p) {
                                                             return !named(p);
                                                           }),
                                                           in.end());
    std::sort(in.begin(), in.end());
    out.insert(out.end(), in.begin(), in.end());
  }
  // one file given twice (a directory and a file in it, or a path twice) is one rank, read once
  std::vector<std::string> unique;
  for (const auto& f : out) {
    bool dup = false;
    for (const auto& u : unique) {
      std::error_code eq;
      dup = dup || std::filesystem::equivalent(f, u, eq);
    }
    if (!dup) unique.push_back(f);
  }
  return unique;
}

Result diagnose_job(const std::vector<std::string>& files, const std::string& label, const json& meta) {
  const auto t0 = std::chrono::steady_clock::now();
  const unsigned threads = std::max(1u, std::min<unsigned>(unsigned(files.size()), std::thread::hardware_concurrency()));
  std::vector<RankRead> rs = read_all(files, meta, threads);
  assign_ranks(rs);
  const double read_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<JobRank> in;
  for (const auto& r : rs) in.push_back({&r.read.trace, &r.analysis, r.rank});
  const JobAnalysis j = analyze_job(in);
  const std::string device = meta.value("/device/id"_json_pointer, std::string("cpu"));

  Result r;
  r.scenario = "diagnose";
  r.meta = meta;
  std::uint64_t file_bytes = 0, json_bytes = 0, events = 0;
  json devs = json::array(), worlds = json::array();
  for (const auto& x : rs) {
    file_bytes += x.read.trace.file_bytes, json_bytes += x.read.trace.json_bytes, events += x.read.trace.events.size();
    for (const auto& d : x.read.trace.device_properties)
      if (d.is_object() && devs.empty()) devs.push_back(d.value("name", std::string()));
    if (x.read.trace.world_size && std::find(worlds.begin(), worlds.end(), *x.read.trace.world_size) == worlds.end())
      worlds.push_back(*x.read.trace.world_size);
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  r.meta["diagnose"] = json{{"source", "trace"}, {"trace", fmt::format("{} ({} ranks)", label, rs.size())}};
  r.meta["trace"] = json{{"path", label},
                         {"files", files.size()},
                         {"file_bytes", file_bytes},
                         {"json_bytes", json_bytes},
                         {"read_s", read_s},
                         {"read_mb_per_s", read_s > 0 ? double(json_bytes) / 1e6 / read_s : 0},
                         {"threads", threads},
                         {"peak_rss_mib", double(ru.ru_maxrss) / 1024.0},
                         {"events_kept", events},
                         {"rank", nullptr},
                         {"ranks", rs.size()},
                         {"world_size", worlds.size() == 1 ? worlds[0] : json(nullptr)},
                         {"devices", devs}};
  if (worlds.size() > 1)
    r.meta["trace"]["note"] = fmt::format("the files disagree on the world size ({}): traces of several jobs?",
                                          worlds.dump());
  else if (worlds.size() == 1 && worlds[0].get<std::int64_t>() != std::int64_t(rs.size()))
    r.meta["trace"]["note"] = fmt::format("{} of the job's {} ranks: the others' traces are not here",
                                          rs.size(), worlds[0].get<std::int64_t>());
  r.meta["job"] = job_json(j, rs);
  r.params = json{{"check", json::array({"rank", "straggler", "communication"})}};
  for (std::size_t i = 0; i < rs.size(); ++i) r.points.push_back(rank_point(rs[i], j.ranks[i]));
  std::vector<Finding> found;
  r.points.push_back(straggler_point(j, rs, found, device));
  r.points.push_back(communication_point(j, rs, found, device));
  rank_causes(rs, found);
  std::stable_sort(found.begin(), found.end(), [](const Finding& x, const Finding& y) {
    return x.speedup.value_or(0) > y.speedup.value_or(0);
  });
  r.findings = found;
  if (r.findings.empty())
    r.findings.push_back({"none found", "no rule fired on any rank, and no rank stands out as late", std::nullopt,
                          json::object()});
  return r;
}

}  // namespace sb::diagnose
