#include "diagnose/hang/fr_calls.hpp"

#include <limits>  // std::numeric_limits

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/text.hpp"  // parse_whole

namespace sb::fr {

std::int64_t numel(const std::vector<std::int64_t>& dims) {
  std::int64_t n = 1;
  for (auto d : dims)
    if (__builtin_mul_overflow(n, d, &n)) return std::numeric_limits<std::int64_t>::max();
  return n;
}

std::string_view op_name(std::string_view profiling_name) {
  const auto colon = profiling_name.find(':');
  return colon == std::string_view::npos ? profiling_name : profiling_name.substr(colon + 1);
}

std::string describe(const TorchFrEntry& e) {
  std::vector<std::string> in, out;
  for (const auto& d : e.input_sizes) in.push_back(fmt::format("{}", fmt::join(d, "x")));
  for (const auto& d : e.output_sizes) out.push_back(fmt::format("{}", fmt::join(d, "x")));
  return fmt::format("{} in [{}] {} out [{}] {}", e.profiling_name, fmt::join(in, ", "), fmt::join(e.input_dtypes, ","),
                     fmt::join(out, ", "), fmt::join(e.output_dtypes, ","));
}

int state_rank(const TorchFrEntry& e) { return torch_fr_done(e) ? 2 : e.state == "started" ? 1 : 0; }

SizeRule size_rule(std::string_view profiling_name) {
  const std::string_view op = op_name(profiling_name);
  if (op.find("all_gather") != std::string::npos || op == "_allgather_base") return SizeRule::gather;
  if (op.find("reduce_scatter") != std::string::npos) return SizeRule::scatter;
  if (op.find("all_to_all") != std::string::npos || op.find("alltoall") != std::string::npos) return SizeRule::all_to_all;
  if (op == "gather") return SizeRule::rooted_gather;
  if (op == "scatter") return SizeRule::rooted_scatter;
  if (op == "broadcast" || op == "_broadcast_oop") return SizeRule::broadcast;
  return SizeRule::none;
}

// false when an entry's own sizes contradict its group of n ranks.
bool sizes_fit_group(SizeRule rule, const std::vector<std::vector<std::int64_t>>& in_sizes,
                     const std::vector<std::vector<std::int64_t>>& out_sizes, std::size_t n) {
  if ((rule != SizeRule::gather && rule != SizeRule::scatter) || in_sizes.empty() || out_sizes.empty()) return true;
  __int128 in = 0, out = 0;
  for (const auto& d : in_sizes) in += numel(d);
  for (const auto& d : out_sizes) out += numel(d);
  return rule == SizeRule::gather ? out == in * __int128(n) : in == out * __int128(n);
}

// Reads "send A->B" / "recv A<-B" into (send, me, peer; peer -1 for "?"); false when it is neither.
bool parse_p2p(std::string_view op, bool& send, int& me, int& peer) {
  const bool is_send = op.starts_with("send "), is_recv = op.starts_with("recv ");
  if (!is_send && !is_recv) return false;
  op.remove_prefix(5);
  const std::size_t arrow = op.find(is_send ? "->" : "<-");
  if (arrow == std::string_view::npos) return false;
  auto number = [](std::string_view t, int& out) {
    const auto v = text::parse_whole<int>(t);
    return v && *v >= 0 && *v <= kMaxRank && (out = *v, true);
  };
  const std::string_view other = op.substr(arrow + 2);
  send = is_send;
  if (!number(op.substr(0, arrow), me)) return false;
  if (is_recv && other == "?") {
    peer = -1;
    return true;
  }
  return number(other, peer);
}

std::string sizes_text(const TorchFrSizes& s, const TorchFrDtypes& d) {
  std::vector<std::string> t;
  for (const auto& dims : s) t.push_back(fmt::format("[{}]", fmt::join(dims, "x")));
  return fmt::format("{} {}", fmt::join(t, ", "), fmt::join(d, ","));
}
// Bytes per element of a dtype as FR names it (c10's ScalarType names); 0: unknown.
std::int64_t dtype_bytes(std::string_view d) {
  if (d == "Double" || d == "Long" || d == "ComplexFloat" || d == "UInt64") return 8;
  if (d == "Float" || d == "Int" || d == "UInt32") return 4;
  if (d == "Half" || d == "BFloat16" || d == "Short" || d == "UInt16") return 2;
  if (d == "Byte" || d == "Char" || d == "Bool" || d.starts_with("Float8")) return 1;
  if (d == "ComplexDouble") return 16;
  return 0;
}
// The bytes of a call's tensors (one dtype a tensor); -1 where a dtype is unknown or the shapes and dtypes differ
// in number.
std::int64_t total_bytes(const TorchFrSizes& s, const TorchFrDtypes& d) {
  if (s.size() != d.size()) return -1;
  std::int64_t n = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const std::int64_t b = dtype_bytes(d[i]);
    std::int64_t t = 0;
    if (b == 0 || __builtin_mul_overflow(numel(s[i]), b, &t) || __builtin_add_overflow(n, t, &n)) return -1;
  }
  return n;
}
std::int64_t total_numel(const TorchFrSizes& s) {
  std::int64_t n = 0;
  for (const auto& dims : s)
    if (__builtin_add_overflow(n, numel(dims), &n)) return std::numeric_limits<std::int64_t>::max();
  return n;
}

}  // namespace sb::fr
