// What every scenario implements. A scenario owns its workload and its
// analysis; the harness (runner.hpp) owns the sweep, timing, statuses and
// output. Scenarios include harness headers only.
#pragma once

#include <functional>  // std::function
#include <memory>      // std::unique_ptr
#include <optional>    // std::optional
#include <string>      // std::string
#include <vector>      // std::vector

#include "harness/comm.hpp"      // ProcessGroup, Communicator
#include "harness/device.hpp"    // Device
#include "harness/expected.hpp"  // ExpectedFile
#include "harness/measure.hpp"   // MeasureConfig
#include "harness/params.hpp"    // ParamSpec, ParamSet
#include "harness/result.hpp"    // Point, Result
#include "harness/timeline.hpp"  // TraceProcess

namespace sb {

// What a scenario that runs on every rank of an mpirun/srun launch gets.
struct RankServices {
  // The launcher's process group.
  ProcessGroup* group = nullptr;
  // A communicator by backend name ("mpi", "nccl"; UnsupportedError when not built).
  std::function<std::unique_ptr<Communicator>(const std::string& backend)> open_comm;
  // Writes a result now, from any thread, before the job is ended (a caught
  // hang ends every rank with MPI_Abort, so the normal path never returns).
  // The scenario gives the point that stopped and its findings; the points
  // finished before it, meta and params are added by the writer.
  std::function<void(Result&)> write_result_now;
};

struct RunContext {
  Device& device;
  MeasureConfig measure;
  std::optional<ExpectedFile> expected;  // the device's expected numbers, if known
  bool quick = false;
  // Where a scenario with a step timeline appends one process per point
  // (--trace FILE); null when no trace was asked for.
  std::vector<TraceProcess>* trace = nullptr;
  // Reports where the run is ("precision size=2048 dtype=bf16: timing"); the
  // watchdog names the last one if the run stops making progress.
  std::function<void(const std::string&)> progress = [](const std::string&) {};
  // Services a scenario asks for by declaring Scenario::needs_ranks, set by
  // the CLI under an MPI launch; null for every other scenario.
  struct RankServices* ranks = nullptr;
};

// One run of a scenario over a sweep. run_point may throw the typed errors of
// errors.hpp: the runner turns OutOfMemory into status "oom", UnsupportedError
// into "skipped", MismatchError into "error" and HangError into "hang".
class ScenarioRun {
 public:
  virtual ~ScenarioRun() = default;
  virtual Point run_point(const ParamSet& params) = 0;
  // A point of the sweep that the scenario measures as several rows (the
  // collective's message sizes, like nccl-tests' -b/-e/-f): each returned
  // point's own params are added to the sweep point's.
  virtual std::vector<Point> run_points(const ParamSet& params) { return {run_point(params)}; }
  // After all points: findings (cause, evidence, measured gain of the fix).
  virtual void analyze(Result& result) = 0;
};

struct Scenario {
  std::string name;     // "precision"
  std::string cause;    // "fp32 where bf16 would do"
  std::string summary;  // one line for `stallbench list`
  std::vector<ParamSpec> params;
  std::function<std::unique_ptr<ScenarioRun>(RunContext&)> start;
  // true: runs on every rank of an MPI launch (mpirun/srun); only rank 0
  // prints and writes the result.
  bool needs_ranks = false;
  // Optional: rejects a point that only the running context can judge (a
  // rank that does not exist) with UsageError, before any point runs.
  std::function<void(const ParamSet&, const RunContext&)> validate;
};

}  // namespace sb
