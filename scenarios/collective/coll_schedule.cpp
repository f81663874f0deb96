#include "scenarios/collective/coll_schedule.hpp"
#include "harness/text.hpp"  // parse_whole

#include <utility>   // std::swap

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // UsageError

namespace sb {

namespace {
constexpr MismatchKind kKinds[] = {MismatchKind::skip, MismatchKind::order, MismatchKind::count,
                                   MismatchKind::dtype, MismatchKind::root, MismatchKind::straggler};

bool parse_int(std::string_view s, int& out) {
  const auto v = text::parse_whole<int>(s);
  if (!v || *v < 0) return false;
  out = *v;
  return true;
}
}  // namespace

std::optional<Mismatch> parse_mismatch(const std::string& text) {
  if (text == "none" || text.empty()) return std::nullopt;
  const auto bad = [&](const std::string& why) {
    return UsageError(fmt::format("mismatch '{}': {}; expected none or KIND@STEP:RANK with KIND one of skip, order, "
                                  "count, dtype, root, straggler (e.g. skip@5:1)",
                                  text, why));
  };
  const auto at = text.find('@');
  const auto colon = text.find(':', at == std::string::npos ? 0 : at);
  if (at == std::string::npos || colon == std::string::npos) throw bad("missing '@' or ':'");
  Mismatch m;
  const std::string kind = text.substr(0, at);
  bool found = false;
  for (MismatchKind k : kKinds)
    if (to_string(k) == kind) m.kind = k, found = true;
  if (!found) throw bad(fmt::format("unknown kind '{}'", kind));
  if (!parse_int(std::string_view(text).substr(at + 1, colon - at - 1), m.step)) throw bad("STEP is not an integer >= 0");
  if (!parse_int(std::string_view(text).substr(colon + 1), m.rank)) throw bad("RANK is not an integer >= 0");
  return m;
}

std::vector<PlannedCall> step_calls(CollOp main_op, std::int64_t main_count, CommDtype dtype, int nranks) {
  std::vector<PlannedCall> v;
  CollCall a;
  a.op = main_op;
  a.count = round_count(main_op, main_count, nranks);
  a.dtype = dtype;
  v.push_back({0, a, 0});
  // The second call is smaller, as a step's parameter broadcast is next to
  // its gradient all-reduce, and of another op, so that swapping the two is
  // an op mismatch.
  CollCall b;
  b.op = is_rooted(main_op) ? CollOp::all_reduce : CollOp::broadcast;
  b.count = round_count(b.op, std::max<std::int64_t>(main_count / 4, 1), nranks);
  b.dtype = dtype;
  v.push_back({1, b, 0});
  return v;
}

std::vector<PlannedCall> planned_calls(const std::vector<PlannedCall>& healthy, const std::optional<Mismatch>& m,
                                       int step, int rank, int nranks, double delay_ms) {
  std::vector<PlannedCall> v = healthy;
  if (!m || m->step != step || m->rank != rank) return v;
  switch (m->kind) {
    case MismatchKind::skip: v.erase(v.begin()); break;
    case MismatchKind::order: std::swap(v[0], v[1]); break;
    case MismatchKind::count:
      v[0].call.count = round_count(v[0].call.op, std::max<std::int64_t>(v[0].call.count / 2, 1), nranks);
      break;
    case MismatchKind::dtype:
      v[0].call.dtype = v[0].call.dtype == CommDtype::fp32 ? CommDtype::fp64 : CommDtype::fp32;
      break;
    case MismatchKind::root:
      for (auto& p : v)
        if (is_rooted(p.call.op)) p.call.root = (p.call.root + 1) % nranks;
      break;
    case MismatchKind::straggler: v[0].sleep_ms = delay_ms; break;
  }
  return v;
}

}  // namespace sb
