// The pictures of diagnose --trace's HTML report, drawn from the result alone: each steady iteration's
// GPU busy and idle stretches, each idle stretch coloured by what the host was doing (meta.timeline), and
// a job's ranks as small multiples (meta.job). Internal to report/.
#pragma once

#include <string>  // std::string

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

namespace sb::report {

std::string html_escape(const std::string& s);
// "" when the result has no timeline
std::string trace_timeline_html(const nlohmann::ordered_json& meta);
// "" when the result is not a job's
std::string job_ranks_html(const nlohmann::ordered_json& meta);
// where the trace came from: its GPU(s) and ranks, not the machine reading it
std::string trace_origin_html(const nlohmann::ordered_json& meta);

}  // namespace sb::report
