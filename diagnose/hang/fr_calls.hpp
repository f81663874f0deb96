// One Flight Recorder entry as analyze-hang reads it (torch_fr_analysis.cpp, missing_dump.cpp): its
// op, its sizes and bytes, how its sizes relate across a group, a send's or recv's ranks.
#pragma once

#include <cstdint>      // std::int64_t, std::uint8_t
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "readers/torch_fr.hpp"  // TorchFrEntry, TorchFrSizes, TorchFrDtypes

namespace sb::fr {

// Elements of a shape; INT64_MAX when the product overflows.
std::int64_t numel(const std::vector<std::int64_t>& dims);
// "all_reduce" of "nccl:all_reduce".
std::string_view op_name(std::string_view profiling_name);
// "nccl:all_reduce in [8] Float out [8] Float", as the report writes a call.
std::string describe(const TorchFrEntry& e);
// 2 done, 1 started, 0 scheduled.
int state_rank(const TorchFrEntry& e);

// How an op's sizes relate across a group (fr_trace's Op.match and dtype_mismatch): all-gather's output
// is n inputs, reduce-scatter's input n outputs; all-to-all's sizes are each rank's own (an uneven split,
// a mixture of experts' token dispatch, is legal: only the totals must agree); gather's output and scatter's
// input exist on the root alone; broadcast's input dtypes are not compared.
enum class SizeRule : std::uint8_t { none, gather, scatter, all_to_all, rooted_gather, rooted_scatter, broadcast };
SizeRule size_rule(std::string_view profiling_name);
// false when an entry's own sizes contradict its group of n ranks.
bool sizes_fit_group(SizeRule rule, const std::vector<std::vector<std::int64_t>>& in_sizes,
                     const std::vector<std::vector<std::int64_t>>& out_sizes, std::size_t n);

// Reads "send A->B" / "recv A<-B" into (send, me, peer; peer -1 for "?"); false when it is neither.
bool parse_p2p(std::string_view op, bool& send, int& me, int& peer);
// "[8], [2x4] Float,Float"
std::string sizes_text(const TorchFrSizes& s, const TorchFrDtypes& d);
// Bytes per element of a dtype as FR names it (c10's ScalarType names); 0: unknown.
std::int64_t dtype_bytes(std::string_view d);
// The bytes of a call's tensors (one dtype a tensor); -1 where a dtype is unknown or the shapes and dtypes differ
// in number.
std::int64_t total_bytes(const TorchFrSizes& s, const TorchFrDtypes& d);
// Elements of all of a call's tensors; INT64_MAX on overflow.
std::int64_t total_numel(const TorchFrSizes& s);

}  // namespace sb::fr
