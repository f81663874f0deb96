#include "harness/runner.hpp"

#include <algorithm>  // std::sort
#include <optional>   // std::optional
#include <vector>     // std::vector

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"     // typed errors
#include "harness/host_load.hpp"  // read_cpu_ticks, host_load: what else ran

namespace sb {

void finish_findings(Result& r, const Scenario& sc, bool simulated) {
  // Findings rest on the points: when some carry a warning (a busy machine, trials that did not settle),
  // each finding says so, as the table does under those rows.
  std::size_t ok = 0, warned = 0;
  for (const auto& p : r.points)
    if (p.status == Status::ok) {
      ++ok;
      warned += p.info.is_object() && p.info.contains("warning");
    }
  for (auto& f : r.findings) {
    if (f.cause.empty()) f.cause = sc.cause;
    // A simulated figure is never shown as measured, findings included.
    if (simulated) f.summary += " [simulated, not measured]";
    if (warned) {
      if (!f.evidence.is_object()) f.evidence = nlohmann::ordered_json::object();
      f.evidence["caveat"] = fmt::format("{} of the {} measured points carry a warning (see the table): the "
                                         "figures it rests on may be rough",
                                         warned, ok);
    }
  }
}

void append_text(nlohmann::ordered_json& obj, const char* key, const std::string& text) {
  obj[key] = obj.contains(key) && obj[key].is_string() ? obj[key].get<std::string>() + "; " + text : text;
}

void add_warning(Point& p, const std::string& w) { append_text(p.info, "warning", w); }

namespace {

// A point whose trials never settled (the budget or the trial cap ended them far above --noise: 46% and
// 487% were seen with a short --budget) is flagged, not passed off as ok: the table's noise column is the
// first metric with trial statistics, and so is this.
void warn_unsettled(Point& p, double max_noise) {
  for (const auto& m : p.metrics) {
    if (!m.in_table || !m.stats) continue;
    if (m.stats->n >= 2 && m.stats->stdrel > std::max(3 * max_noise, 0.10))
      add_warning(p, fmt::format("its trials did not settle: they spread {:.0f}% (sd/mean) against --noise {:.0f}%; "
                                 "read its figures as rough: more --budget, or a quieter machine",
                                 100 * m.stats->stdrel, 100 * max_noise));
    return;
  }
}
}  // namespace

Result run_scenario(const Scenario& sc, RunContext& ctx, const RunOptions& opts,
                    const nlohmann::ordered_json& meta,
                    const std::function<void(const Point&, const Result&)>& on_point) {
  const SweepProfile profile{opts.quick, ctx.device.info().kind == DeviceKind::cuda};
  const Sweep sweep = expand_sweep(sc.params, opts.assignments, profile);

  Result r;
  r.meta = meta;
  r.meta["measurement_params"] = nlohmann::ordered_json::array();
  for (const auto& s : sc.params)
    if (!s.workload) r.meta["measurement_params"].push_back(s.name);
  r.scenario = sc.name;
  r.params = sweep.axes;
  if (ctx.expected) r.expected = nlohmann::ordered_json{{"id", ctx.expected->id()}, {"path", ctx.expected->path}};

  if (sc.validate)
    for (const auto& ps : sweep.points) sc.validate(ps, ctx);
  auto run = sc.start(ctx);
  bool hung = false;
  std::vector<double> steal;  // % per ok point
  auto failed_point = [](const ParamSet& ps, Status st, std::string reason) {
    Point p;
    p.params = ps.to_json();
    p.status = st;
    p.reason = std::move(reason);
    return p;
  };
  for (std::size_t index = 0; index < sweep.points.size(); ++index) {
    const ParamSet& ps = sweep.points[index];
    std::vector<Point> got;
    // every point, a skipped one too: the CLI's [k/N] is the point's own
    if (opts.on_point_start) opts.on_point_start(ps, index, sweep.points.size());
    if (hung) {
      got.push_back(failed_point(ps, Status::skipped, "not run: an earlier point hung"));
    } else {
      try {
        // What else ran on the machine meanwhile (a rank's peers are the job itself: not judged, not read).
        const CpuTicks before = sc.needs_ranks ? CpuTicks{} : read_cpu_ticks();
        got = run->run_points(ps);
        const std::optional<HostLoad> load = sc.needs_ranks ? std::nullopt : host_load(before, read_cpu_ticks());
        for (auto& p : got) {
          nlohmann::ordered_json params = ps.to_json();
          for (const auto& [k, v] : p.params.items()) params[k] = v;  // the point's own rows (bytes=...)
          p.params = std::move(params);
          if (p.status == Status::ok) warn_unsettled(p, ctx.measure.max_noise);
          if (!load || p.status != Status::ok) continue;
          p.info["host_cpu"] = {{"other_pct", load->other_pct},
                                {"steal_pct", load->steal_pct},
                                {"window_s", load->window_s},
                                {"note", "while this point ran (/proc/stat): other processes' share of the CPU time "
                                         "this machine got, and the hypervisor's share of all of it (steal)"}};
          steal.push_back(load->steal_pct);
          if (load->other_pct >= kOtherWarnPct) {
            const std::string w = fmt::format(
                "the machine was busy with other work while this ran (other processes took {:.0f}% of its CPUs): "
                "its timings may be inflated; run it again on a quiet machine",
                load->other_pct);
            add_warning(p, w);
          }
        }
      } catch (const Error& e) {
        Status st = Status::error;
        switch (e.kind()) {
          case ErrorKind::oom: st = Status::oom; break;
          case ErrorKind::unsupported: st = Status::skipped; break;
          case ErrorKind::hang:
            st = Status::hang;
            hung = true;
            break;
          case ErrorKind::usage:  // a combination of valid values the scenario rejects
          case ErrorKind::mismatch:
          case ErrorKind::runtime: st = Status::error; break;
        }
        got = {failed_point(ps, st, e.what())};
      } catch (const std::bad_alloc&) {
        got = {failed_point(ps, Status::oom, "host allocation failed (std::bad_alloc)")};
      } catch (const std::exception& e) {
        got = {failed_point(ps, Status::error, e.what())};
      }
    }
    for (auto& p : got) {
      if (on_point) on_point(p, r);
      r.points.push_back(std::move(p));
    }
  }
  // Steal is the machine's, not the moment's (a 2-vCPU VM here lost 61% of its CPU time to the
  // hypervisor over 5 s with both vCPUs busy): said once for the run, not on every point.
  if (!steal.empty()) {
    std::sort(steal.begin(), steal.end());
    const double max = steal.back(), median = steal[steal.size() / 2];
    if (max >= kStealWarnPct)
      r.meta["host_steal"] = {
          {"median_pct", median},
          {"max_pct", max},
          {"note", fmt::format("the hypervisor took {:.0f}% of the CPUs' time while the points ran (median; up to "
                               "{:.0f}%): a virtual machine whose host is oversubscribed, so its timings are slower "
                               "and noisier than the same CPU's with dedicated cores",
                               median, max)}};
  }
  ctx.progress(fmt::format("{}: analysis", sc.name));
  run->analyze(r);
  finish_findings(r, sc, ctx.device.info().simulated);
  return r;
}

int run_exit_code(const Result& r) {
  int code = 0;
  for (const auto& p : r.points) {
    if (p.status == Status::hang) return 4;
    if (p.status == Status::error) code = 1;
  }
  return code;
}

}  // namespace sb
