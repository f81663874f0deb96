// `watch --exec` where NVML answers nothing (no GPU, no driver: a CPU job, a gloo job): the job is
// run, its signals forwarded and its exit code returned as with GPUs, and it is watched by its own
// progress alone (watch/progress.hpp): the stuck alarm, the dumps asked for, analyze-hang, py-spy.
#pragma once

#include <functional>  // std::function
#include <optional>    // std::optional
#include <string>      // std::string

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "watch/child.hpp"     // ChildGuard
#include "watch/progress.hpp"  // ProgressOptions, ProgressWatch
#include "watch/watch.hpp"     // Args, Outcome

namespace sb::watch {

// The watch's options for the job's progress.
ProgressOptions progress_options(const Args& a);
// The job's progress at t: the stuck alarm's text once it went silent (said on stderr at once),
// and what its dumps say in alarms; with --kill-on-stuck the job gets SIGTERM and
// kill_at is armed for SIGKILL kill_after_s later, as a forwarded signal arms it.
std::optional<std::string> progress_alarm(ProgressWatch& pw, double t, const ChildGuard& child, double kill_after_s,
                                         double& kill_at, std::vector<std::string>& alarms);

// why_no_gpus: what NVML said, kept in the result and the summary.
Outcome run_exec_without_gpus(
    const Args& a,
    const std::function<nlohmann::ordered_json(const std::string&, const std::string&, const nlohmann::ordered_json&)>&
        meta_for,
    const std::function<void(const Result&)>& write_json, const std::string& why_no_gpus);

}  // namespace sb::watch
