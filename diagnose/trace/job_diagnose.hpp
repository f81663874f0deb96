// diagnose --trace on a whole job: every rank's trace (a directory of them, or several files), each rank's
// figures and causes side by side, the straggler the others wait for at each collective (job_analysis.hpp),
// and the job's causes named from all ranks, not rank 0's alone.
#pragma once

#include <string>  // std::string
#include <vector>  // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "harness/result.hpp"  // Result

namespace sb::diagnose {

// The trace files the --trace arguments name: a file as is, a directory's *.json and *.json.gz files
// (sorted; exit 2 when it holds none). Exit 2 on a path that is neither.
std::vector<std::string> trace_files(const std::vector<std::string>& args);

// Reads every file (in parallel, up to the machine's cores), one rank each (distributedInfo's rank, else
// the digits after "rank" in its name, else its place), and diagnoses the job. Exit 2 when two files say
// the same rank.
Result diagnose_job(const std::vector<std::string>& files, const std::string& label, const nlohmann::ordered_json& meta);

}  // namespace sb::diagnose
