#include "scenarios/collective/coll_findings.hpp"

#include <algorithm>  // std::find
#include <map>        // std::map
#include <utility>    // std::pair
#include <vector>     // std::vector

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

namespace sb {

using json = nlohmann::ordered_json;

std::string bytes_text(std::int64_t b) {
  if (b >= (1 << 30) && b % (1 << 30) == 0) return fmt::format("{} GiB", b >> 30);
  if (b >= (1 << 20) && b % (1 << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b >= (1 << 10) && b % (1 << 10) == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

std::string coll_call_family(const std::string& backend, CollOp op, bool blocking) {
  // Indexed by CollOp: all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all.
  static constexpr const char* kMpi[] = {"Allreduce", "Allgather", "Reduce_scatter_block",
                                         "Bcast",     "Reduce",    "Alltoall"};
  static constexpr const char* kMpiStart[] = {"Iallreduce", "Iallgather", "Ireduce_scatter_block",
                                              "Ibcast",     "Ireduce",    "Ialltoall"};
  static constexpr const char* kNccl[] = {"ncclAllReduce", "ncclAllGather", "ncclReduceScatter",
                                          "ncclBroadcast", "ncclReduce",    "ncclSend/ncclRecv"};
  const auto i = static_cast<std::size_t>(op);
  if (backend == "mpi")
    return blocking ? fmt::format("MPI_{}", kMpi[i]) : fmt::format("MPI_{} + MPI_Test", kMpiStart[i]);
  if (backend == "nccl") return fmt::format("{} on a stream", kNccl[i]);
  return backend;
}

Point coll_size_point(const CollCall& c, int n, std::int64_t size_bytes, const std::vector<double>& times,
                      std::int64_t wrong, const CollPath& path) {
  double sum = 0;
  for (double t : times) sum += t;
  const double mean_us = times.empty() ? 0 : sum / double(times.size());
  Point p;
  // ranks is a row parameter: expected busbw figures are per rank count.
  p.params = json{{"ranks", n}, {"bytes", size_bytes}};
  const double algbw = mean_us > 0 ? double(size_bytes) / (mean_us * 1e-6) / 1e9 : 0;
  p.add({"count", double(c.count), "elements", Direction::none, std::nullopt,
         "nccl-tests' count: elements of the larger buffer", false});
  p.add({"time_us", mean_us, "us", Direction::lower, std::nullopt, "mean over ranks of the per-call time"});
  p.add({"algbw", algbw, "GB/s", Direction::higher, std::nullopt, "size / time"});
  if (n > 1)
    p.add({"busbw", algbw * bus_factor(c.op, n), "GB/s", Direction::higher, std::nullopt,
           fmt::format("algbw × {:.4g} ({} on {} ranks)", bus_factor(c.op, n), to_string(c.op), n)});
  p.add({"wrong", double(wrong), "elements", Direction::lower, std::nullopt,
         "elements that differ from the exact result, summed over ranks"});
  p.info["time_us_per_rank"] = times;
  p.info["bus_factor"] = bus_factor(c.op, n);
  p.info["ranks"] = n;
  p.info["backend"] = path.backend;
  p.info["library"] = path.library;
  p.info["mode"] = path.blocking ? "blocking" : "nonblocking";
  p.info["calls"] = coll_call_family(path.backend, c.op, path.blocking);
  if (wrong > 0) {
    p.status = Status::error;
    p.reason = fmt::format("{} wrong element(s) after {} (first checked on each rank after the timed calls)", wrong,
                           describe(c));
  }
  return p;
}

Point step_loop_point(int steps, double loop_ms, std::int64_t wrong_total, std::int64_t first_wrong,
                      const HangReport* rep) {
  Point p;
  p.add({"steps", double(steps), "steps", Direction::none});
  p.add({"loop_ms", loop_ms, "ms", Direction::lower, std::nullopt, "the step loop's wall time on rank 0"});
  p.add({"wrong", double(wrong_total), "elements", Direction::lower, std::nullopt,
         "elements that differ from the exact result, summed over ranks and calls"});
  if (!rep) return p;
  p.info["analysis"] = to_json(*rep);
  if (rep->stall_rank >= 0)
    p.add({"stall_lost_ms", rep->stall_lost_ms, "ms", Direction::lower, std::nullopt,
           fmt::format("what the other ranks lost waiting for rank {} at seq {}", rep->stall_rank, rep->stall_seq)});
  if (rep->kind != DivergenceKind::none) {
    p.status = Status::error;
    p.reason = fmt::format("no hang, but {}{}", rep->summary,
                           wrong_total > 0 ? fmt::format("; {} wrong element(s): the library paired mismatched "
                                                         "calls silently", wrong_total)
                                           : "");
  } else if (wrong_total > 0) {
    p.status = Status::error;
    p.reason = fmt::format("{} wrong element(s) from step {} on, with no divergence in the flight recorders' "
                           "window: {}", wrong_total, first_wrong, rep->summary);
  }
  return p;
}

void collective_findings(Result& r) {
  int n = 1;
  for (const auto& p : r.points)
    if (p.params.contains("ranks") && p.params["ranks"].is_number_integer()) n = std::max(n, p.params["ranks"].get<int>());
  // The message sizes are rows of their own (like nccl-tests' table): an axis.
  json sizes = json::array();
  for (const auto& p : r.points)
    if (p.params.contains("bytes") && std::find(sizes.begin(), sizes.end(), p.params["bytes"]) == sizes.end())
      sizes.push_back(p.params["bytes"]);
  if (!sizes.empty()) {
    r.params["ranks"] = json::array({n});
    r.params["bytes"] = sizes;
  }
  // Healthy rows: the peak bus bandwidth per op and dtype, and the latency floor.
  std::map<std::string, std::pair<const Point*, const Point*>> best;  // key -> (peak busbw, smallest size)
  for (const auto& p : r.points) {
    if (p.status != Status::ok || !p.params.contains("bytes") || p.params.value("check", "off") != "off") continue;
    // A run that swept mode=blocking,nonblocking has a peak for each (results
    // from before the parameter have no mode and keep their old summary).
    std::string key = fmt::format("{} {}", p.params.value("op", ""), p.params.value("dtype", ""));
    if (p.params.contains("mode")) key += fmt::format(" {}", p.params.value("mode", ""));
    auto& [peak, first] = best[key];
    const Metric* bw = p.metric(n > 1 ? "busbw" : "algbw");
    if (!peak || (bw && bw->value > peak->metric(bw->name)->value)) peak = &p;
    if (!first) first = &p;
  }
  for (const auto& [key, pr] : best) {
    const auto& [peak, first] = pr;
    Finding f;
    if (n > 1)
      f.summary = fmt::format("healthy {} on {} ranks ({}): busbw peaks at {:.2f} GB/s at {}; {:.1f} us per call at {}",
                              key, n, peak->info.value("backend", "?"), peak->metric("busbw")->value,
                              bytes_text(peak->params["bytes"].get<std::int64_t>()), first->metric("time_us")->value,
                              bytes_text(first->params["bytes"].get<std::int64_t>()));
    else
      f.summary = fmt::format("{} on one rank: no bus bandwidth to measure; launch with mpirun -np N (N >= 2)", key);
    f.evidence = json{{"ranks", n}, {"peak_bytes", peak->params["bytes"]}};
    r.findings.push_back(std::move(f));
  }
  // check=fingerprint against check=off, size by size, per op and dtype:
  // what a DETAIL-style check costs each call.
  std::map<std::string, std::pair<std::vector<std::string>, json>> overhead;
  for (const auto& p : r.points) {
    if (p.status != Status::ok || p.params.value("check", "") != "fingerprint" || !p.params.contains("bytes")) continue;
    for (const auto& q : r.points) {
      if (q.status != Status::ok || q.params.value("check", "") != "off" || q.params["bytes"] != p.params["bytes"] ||
          q.params["op"] != p.params["op"] || q.params["dtype"] != p.params["dtype"] ||
          q.params["backend"] != p.params["backend"] || q.params.value("mode", "") != p.params.value("mode", ""))
        continue;
      const double on = p.metric("time_us")->value, off = q.metric("time_us")->value;
      std::string key = fmt::format("{} {}", p.params.value("op", ""), p.params.value("dtype", ""));
      if (p.params.contains("mode")) key += fmt::format(" {}", p.params.value("mode", ""));
      auto& [texts, ev] = overhead[key];
      texts.push_back(fmt::format("{:+.1f} us ({:+.0f}%) at {}", on - off, (on / off - 1) * 100,
                                  bytes_text(p.params["bytes"].get<std::int64_t>())));
      ev.push_back(json{{"bytes", p.params["bytes"]}, {"off_us", off}, {"fingerprint_us", on}, {"added_us", on - off},
                        {"overhead", on / off - 1}});
    }
  }
  for (const auto& [key, v] : overhead) {
    Finding f;
    f.summary = fmt::format("check=fingerprint on {} (a 16-byte all-reduce before each call): {}", key,
                            fmt::join(v.first, ", "));
    f.evidence = json{{"sizes", v.second}};
    r.findings.push_back(std::move(f));
  }
  for (const auto& p : r.points) {
    if (!p.info.contains("analysis")) continue;
    const json& a = p.info["analysis"];
    Finding f;
    f.summary = a.value("summary", "");
    f.evidence = json{{"kind", a.value("kind", "")}, {"culprits", a.value("culprits", json::array())},
                      {"stall", a.value("stall", json::object())}};
    r.findings.push_back(std::move(f));
  }
}

}  // namespace sb
