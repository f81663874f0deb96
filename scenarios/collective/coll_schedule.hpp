// The collective scenario's step loop and the mismatches it injects.
// Every step issues the calls of a data-parallel training step: the main
// collective (the gradient all-reduce, or the op under test) and a smaller
// rooted one (a broadcast of rank 0's state), or an all-reduce when the
// main one is itself rooted. `mismatch=KIND@STEP:RANK` changes what RANK
// issues at STEP:
//   skip       the rank does not issue call 0
//   order      it issues call 1 before call 0
//   count      call 0 with half the element count
//   dtype      call 0 in another dtype (fp32 <-> fp64, bf16 -> fp32)
//   root       the rooted call with root (root + 1) % ranks
//   straggler  it sleeps delay_ms before call 0: a stall, or a hang when
//              longer than the watchdog's timeout
#pragma once

#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

#include "harness/comm.hpp"  // CollCall
#include "harness/names.hpp"  // NameTable: to_string, parse and choices from one table

namespace sb {

enum class MismatchKind { skip, order, count, dtype, root, straggler };
inline constexpr NameTable<MismatchKind, 6> kMismatchKindNames{{{{MismatchKind::skip, "skip"}, {MismatchKind::order, "order"}, {MismatchKind::count, "count"}, {MismatchKind::dtype, "dtype"}, {MismatchKind::root, "root"}, {MismatchKind::straggler, "straggler"}}}};
inline std::string_view to_string(MismatchKind v) { return kMismatchKindNames.name(v); }

struct Mismatch {
  MismatchKind kind = MismatchKind::skip;
  int step = 0;
  int rank = 0;
};

// "none" -> nullopt; "skip@5:1" -> {skip, 5, 1}. Throws UsageError naming
// the grammar and the valid kinds.
std::optional<Mismatch> parse_mismatch(const std::string& text);

struct PlannedCall {
  int call_index = 0;  // the program position within the step
  CollCall call;
  double sleep_ms = 0;  // the straggler's delay before this call
};

// The two calls every rank should issue in a step.
std::vector<PlannedCall> step_calls(CollOp main_op, std::int64_t main_count, CommDtype dtype, int nranks);

// What `rank` issues at `step`: step_calls() changed by the mismatch when it
// targets this rank and step.
std::vector<PlannedCall> planned_calls(const std::vector<PlannedCall>& healthy, const std::optional<Mismatch>& m,
                                       int step, int rank, int nranks, double delay_ms);

}  // namespace sb
