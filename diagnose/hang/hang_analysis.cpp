// The analysis behind `stallbench analyze-hang`: align the ranks' rings by
// seq, find the first seq where they disagree, decide which side is wrong and
// say so in one line. Reading dumps from a directory and printing the report
// live in hang_report.cpp.
#include "diagnose/hang/hang_analysis.hpp"

#include <algorithm>  // std::max, std::min, std::stable_sort, std::find_if, std::min_element
#include <iterator>   // std::next
#include <limits>  // std::numeric_limits
#include <map>        // std::map: seq -> entry, call index -> call
#include <optional>   // std::optional
#include <set>        // std::set: call indices seen per step
#include <utility>    // std::pair

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/errors.hpp"  // UsageError

namespace sb {

namespace {

// A wait above this is worth a sentence in the summary; below it, arrival
// jitter (launch skew, a page fault) explains it.
constexpr double kSignificantStallMs = 50.0;

// A call's program position: training step and index within it.
struct Pos {
  int step = -1, call = -1;
  bool operator==(const Pos&) const = default;
  bool valid() const { return step >= 0 && call >= 0; }
};

Pos pos_of(const FlightEntry& e) { return {e.step, e.call_index}; }

std::string pos_text(Pos p) {
  return p.valid() ? fmt::format("step {} call {}", p.step, p.call) : "outside a step";
}

// The position after p in a program of cps calls per step.
Pos successor(Pos p, int cps) { return p.call + 1 < cps ? Pos{p.step, p.call + 1} : Pos{p.step + 1, 0}; }

// The first field in which two calls differ, in PyTorch's analyzer's order.
// Fields an op ignores (root of an all-reduce, reduce op of a broadcast) are
// not compared: the recorder stores their defaults, not what the rank meant.
DivergenceKind first_difference(const CollCall& a, const CollCall& b) {
  if (a.op != b.op || (reduces(a.op) && a.reduce != b.reduce)) return DivergenceKind::op;
  if (a.count != b.count) return DivergenceKind::count;
  if (a.dtype != b.dtype) return DivergenceKind::dtype;
  if (is_rooted(a.op) && a.root != b.root) return DivergenceKind::root;
  return DivergenceKind::none;
}

bool same_call(const CollCall& a, const CollCall& b) {
  return first_difference(a, b) == DivergenceKind::none;
}

std::string entry_text(const FlightEntry& e) {
  return fmt::format("{}: {}", pos_text(pos_of(e)), describe(e.call));
}

std::string ranks_text(const std::vector<int>& rs) {
  return fmt::format("{} {}", rs.size() == 1 ? "rank" : "ranks", fmt::join(rs, ", "));
}

// One rank's dump, looked up by seq.
struct RankView {
  const RankDump* dump = nullptr;
  int rank = 0;
  std::map<std::int64_t, const FlightEntry*> by_seq;
  std::int64_t last_enqueued = -1;

  const FlightEntry* at(std::int64_t seq) const {
    auto it = by_seq.find(seq);
    return it == by_seq.end() ? nullptr : it->second;
  }
  // false: the rank never issued seq. An issued seq may still be absent from
  // the ring (at() null): then nothing is known about it.
  bool issued(std::int64_t seq) const { return seq <= last_enqueued; }
  bool has_pos(Pos p) const {
    for (const auto& [s, e] : by_seq)
      if (pos_of(*e) == p) return true;
    return false;
  }
};

// Two dumps of one rank (a rerun into the same directory, a second watchdog
// dump): the newer one is the rank's last word.
std::vector<const RankDump*> newest_per_rank(const std::vector<RankDump>& dumps,
                                             std::vector<std::string>& warnings) {
  std::map<int, const RankDump*> by_rank;
  for (const auto& d : dumps) {
    auto [it, fresh] = by_rank.emplace(d.header.rank, &d);
    if (fresh) continue;
    const RankDump* keep = d.time_us > it->second->time_us ? &d : it->second;
    const RankDump* drop = keep == &d ? it->second : &d;
    warnings.push_back(fmt::format("two dumps claim rank {}: kept {} (newer), ignored {}", d.header.rank,
                                   keep->path.empty() ? "one" : keep->path,
                                   drop->path.empty() ? "the other" : drop->path));
    it->second = keep;
  }
  std::vector<const RankDump*> out;
  for (const auto& [rank, d] : by_rank) out.push_back(d);
  return out;
}

struct Divergence {
  std::int64_t seq = -1;
  DivergenceKind kind = DivergenceKind::none;
};

// Step 1 of the analysis: walk the common window and stop at the first seq
// where the ranks' calls differ (the earliest differing field), or where some
// ranks issued the seq and others never did.
Divergence find_divergence(const std::vector<RankView>& vs, std::int64_t lo, std::int64_t hi) {
  for (std::int64_t seq = lo; seq <= hi; ++seq) {
    const FlightEntry* first = nullptr;
    DivergenceKind kind = DivergenceKind::none;
    bool absent = false;
    for (const auto& v : vs) {
      const FlightEntry* e = v.at(seq);
      if (!e) {
        absent = absent || !v.issued(seq);
        continue;
      }
      if (!first) {
        first = e;
        continue;
      }
      // The minimum over differences from one rank is the earliest field in
      // which any two ranks differ: everyone agrees on the fields before it.
      const DivergenceKind d = first_difference(first->call, e->call);
      if (d != DivergenceKind::none && (kind == DivergenceKind::none || d < kind)) kind = d;
    }
    if (kind != DivergenceKind::none) return {seq, kind};
    if (absent && first) return {seq, DivergenceKind::missing};
  }
  return {};
}

// What the program should have issued at the divergent seq, and who did not.
struct Reference {
  bool tie = false;  // no way to tell which side is wrong
  CollCall call;
  Pos pos;
  std::vector<int> culprits;
  int cps = 0;  // calls per step of the agreed prefix; 0 when unknown
};

// Ranks that did not issue ref at div: a different call or position there, or
// nothing at all. Ranks whose entry is unknown are given the benefit of the doubt.
std::vector<int> deviants(const std::vector<RankView>& vs, std::int64_t div, const CollCall& call,
                          const std::optional<Pos>& pos) {
  std::vector<int> out;
  for (const auto& v : vs) {
    const FlightEntry* e = v.at(div);
    if (e ? !same_call(e->call, call) || (pos && !(pos_of(*e) == *pos)) : !v.issued(div))
      out.push_back(v.rank);
  }
  return out;
}

// 3a: the program's pattern, learnt from the agreed prefix. It is what makes
// two ranks decidable: the prefix says which call comes next, so the rank
// that issued something else is the culprit.
std::optional<Reference> pattern_reference(const std::vector<RankView>& vs, std::int64_t lo,
                                           std::int64_t div) {
  std::map<int, CollCall> calls;            // call index -> call
  std::map<int, std::set<int>> step_calls;  // step -> call indices seen
  for (std::int64_t s = lo; s < div; ++s) {
    for (const auto& v : vs) {
      const FlightEntry* e = v.at(s);
      if (!e || !pos_of(*e).valid()) continue;
      auto [it, fresh] = calls.emplace(e->call_index, e->call);
      if (!fresh && !same_call(it->second, e->call)) return std::nullopt;  // not a fixed program
      step_calls[e->step].insert(e->call_index);
    }
  }
  if (calls.empty()) return std::nullopt;
  const int cps = calls.rbegin()->first + 1;
  if (static_cast<int>(calls.size()) != cps) return std::nullopt;
  // A full step: every call index seen in a step that a later step followed,
  // so no call of it can be missing from the count. The later step may be
  // the divergent seq itself when every rank is already past the step there
  // (a mismatch in step 1, after step 0 agreed).
  int past = std::numeric_limits<int>::max();  // the least step any rank is at, at div
  for (const auto& v : vs) {
    const FlightEntry* e = v.at(div);
    past = std::min(past, e && pos_of(*e).valid() ? e->step : std::numeric_limits<int>::min());
  }
  bool full = false;
  for (auto it = step_calls.begin(); it != step_calls.end(); ++it)
    full = full || (static_cast<int>(it->second.size()) == cps &&
                    (std::next(it) != step_calls.end() || past > it->first));
  if (!full) return std::nullopt;

  std::optional<Pos> expected;
  for (const auto& v : vs) {
    const FlightEntry* e = v.at(div - 1);
    if (!e || !pos_of(*e).valid()) return std::nullopt;
    const Pos p = successor(pos_of(*e), cps);
    if (expected && !(*expected == p)) return std::nullopt;
    expected = p;
  }
  auto it = calls.find(expected->call);
  if (it == calls.end()) return std::nullopt;
  Reference ref;
  ref.call = it->second;
  ref.pos = *expected;
  ref.cps = cps;
  ref.culprits = deviants(vs, div, ref.call, ref.pos);
  if (ref.culprits.empty() || ref.culprits.size() == vs.size()) return std::nullopt;
  return ref;
}

// 3b: the most common call at div. A tie (two ranks, no usable prefix)
// leaves every rank a suspect.
Reference majority_reference(const std::vector<RankView>& vs, std::int64_t div) {
  struct Group {
    CollCall call;
    std::vector<const FlightEntry*> entries;
  };
  std::vector<Group> groups;
  for (const auto& v : vs) {
    const FlightEntry* e = v.at(div);
    if (!e) continue;
    auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& g) { return same_call(g.call, e->call); });
    if (g == groups.end()) groups.push_back({e->call, {e}});
    else g->entries.push_back(e);
  }
  std::stable_sort(groups.begin(), groups.end(),
                   [](const Group& a, const Group& b) { return a.entries.size() > b.entries.size(); });
  Reference ref;
  if (groups.empty() || (groups.size() > 1 && groups[0].entries.size() == groups[1].entries.size())) {
    ref.tie = true;
    for (const auto& v : vs) ref.culprits.push_back(v.rank);
    // Where it happened is still known when every rank was at one position.
    std::optional<Pos> common;
    bool same = true;
    for (const auto& v : vs) {
      const FlightEntry* e = v.at(div);
      if (!e) { same = false; break; }
      if (common && !(*common == pos_of(*e))) same = false;
      common = pos_of(*e);
    }
    if (same && common) ref.pos = *common;
    return ref;
  }
  ref.call = groups[0].call;
  // The majority's position: the most common among the ranks that issued it.
  std::map<std::pair<int, int>, int> votes;
  for (const FlightEntry* e : groups[0].entries) ++votes[{e->step, e->call_index}];
  int best = 0;
  for (const auto& [p, n] : votes) {
    if (n > best) {
      best = n;
      ref.pos = {p.first, p.second};
    }
  }
  ref.culprits = deviants(vs, div, ref.call, std::nullopt);
  return ref;
}

const RankView& view_of(const std::vector<RankView>& vs, int rank) {
  return *std::find_if(vs.begin(), vs.end(), [&](const RankView& v) { return v.rank == rank; });
}

// Step 4: a culprit one call ahead that never issued the expected call skipped
// it; one that issues the expected call later in the same step swapped two.
std::string refine(const std::vector<RankView>& vs, std::int64_t div, int cps, Reference& ref,
                   DivergenceKind& kind) {
  if (ref.tie || !ref.pos.valid() || cps <= 0) return "";
  std::vector<int> skipped;
  bool swapped = false;
  for (int c : ref.culprits) {
    const RankView& v = view_of(vs, c);
    const FlightEntry* e = v.at(div);
    if (!e) continue;
    const Pos p = pos_of(*e);
    if (p == successor(ref.pos, cps) && !v.has_pos(ref.pos)) {
      skipped.push_back(c);
    } else if (p.step == ref.pos.step && p.call > ref.pos.call) {
      for (std::int64_t s = div + 1; v.at(s) && v.at(s)->step == ref.pos.step; ++s)
        swapped = swapped || pos_of(*v.at(s)) == ref.pos;
    }
  }
  if (!skipped.empty()) {
    kind = DivergenceKind::missing;  // a rank that skips a call is missing from that collective
    ref.culprits = skipped;
    return "skip";
  }
  return swapped ? "order" : "";
}

// Step 6: the (first) seq whose in-collective times spread the most. The rank that
// spent the least time inside arrived last; the others waited for it.
void find_stall(const std::vector<RankView>& vs, std::int64_t lo, std::int64_t hi, HangReport& r) {
  if (vs.size() < 2) return;
  std::int64_t best = -1;
  for (std::int64_t seq = lo; seq <= hi; ++seq) {
    std::vector<std::int64_t> d;
    for (const auto& v : vs) {
      const FlightEntry* e = v.at(seq);
      if (!e || e->state != CallState::completed || e->t_enqueue_us <= 0 || e->t_complete_us <= 0) break;
      d.push_back(e->t_complete_us - e->t_enqueue_us);
    }
    if (d.size() != vs.size()) continue;
    const auto last = std::min_element(d.begin(), d.end()) - d.begin();
    const std::int64_t lost = *std::max_element(d.begin(), d.end()) - d[last];
    // A later seq must beat an earlier one clearly (5%, or 1 ms): calls
    // issued together all wait for a late rank, and the first of them is
    // where it was late.
    if (best < 0 || lost > best + std::max<std::int64_t>(best / 20, 1000)) {
      best = lost;
      r.stall_seq = seq;
      r.stall_rank = vs[last].rank;
      r.stall_lost_ms = lost / 1000.0;
    }
  }
}

// Step 8, for a divergence: what each culprit issued against the reference.
std::string divergence_summary(const HangReport& r, const std::vector<RankView>& vs, const Reference& ref) {
  std::string head = fmt::format("first divergence at seq {}", r.seq);
  if (ref.pos.valid()) head += fmt::format(" (step {}, call {})", ref.pos.step, ref.pos.call);
  head += fmt::format(", kind {}", to_string(r.kind));
  if (!r.pattern.empty()) head += fmt::format(", pattern {}", r.pattern);
  std::vector<std::string> parts;
  if (ref.tie) {
    std::string issued;
    for (const auto& v : vs) {
      const FlightEntry* e = v.at(r.seq);
      issued += fmt::format("{}rank {} issued {}", issued.empty() ? "" : ", ", v.rank,
                            e ? entry_text(*e) : std::string("nothing"));
    }
    return fmt::format("{}: {}; cannot tell which side is wrong (no majority, and no full step agreed "
                       "before it to show the program's pattern)", head, issued);
  }
  for (int c : r.culprits) {
    const RankView& v = view_of(vs, c);
    const FlightEntry* e = v.at(r.seq);
    if (!e) {
      parts.push_back(fmt::format("rank {} never issued {} (its last enqueued seq is {}; where: \"{}\")", c,
                                  r.expected, v.last_enqueued, v.dump->where));
    } else if (r.pattern == "skip") {
      // A rank that stopped at this call (a hang, or a fingerprint refusal)
      // never showed whether the skipped call would have come later.
      parts.push_back(fmt::format("rank {} skipped {} (its seq {} is {}){}", c, r.expected, r.seq, entry_text(*e),
                                  v.at(r.seq + 1) ? ""
                                                  : "; it stopped there, so a swap with the next call looks the same"));
    } else if (r.pattern == "order" && pos_of(*e).step == ref.pos.step && pos_of(*e).call > ref.pos.call) {
      parts.push_back(fmt::format("rank {} issued {} before {} ({}): calls swapped", c, entry_text(*e),
                                  r.expected, pos_text(ref.pos)));
    } else {
      parts.push_back(fmt::format("rank {} issued {}, expected {}", c, entry_text(*e), r.expected));
    }
  }
  std::string s = head + ": ";
  for (std::size_t i = 0; i < parts.size(); ++i) s += (i ? "; " : "") + parts[i];
  return s;
}

// Step 7: every rank issued the same calls. Either one of them never finished
// (a hang inside the library, not a mismatch) or all did.
std::string agreement_summary(const HangReport& r, const std::vector<RankView>& vs, std::int64_t lo,
                              std::int64_t hi) {
  if (hi < lo) return "no collective recorded in the common window of the rings";
  std::string s;
  std::vector<int> hung;
  std::int64_t first_open = hi + 1;
  for (const auto& v : vs) {
    if (v.dump->last_completed_seq >= v.last_enqueued) continue;
    hung.push_back(v.rank);
    first_open = std::min(first_open, v.dump->last_completed_seq + 1);
  }
  if (!hung.empty()) {
    const FlightEntry* e = nullptr;
    std::string error;
    for (const auto& v : vs) {
      if (const FlightEntry* x = v.at(first_open)) {
        e = e ? e : x;
        if (x->state == CallState::failed && error.empty())
          error = fmt::format("; it failed on rank {}: {}", v.rank, x->error);
      }
    }
    s = fmt::format("no divergence in seqs {}..{}: every rank issued the same calls; seq {} ({}) never "
                    "completed on {}{}: hung inside the library with matched calls (not a mismatch)",
                    lo, hi, first_open, e ? entry_text(*e) : std::string("not in the rings"), ranks_text(hung),
                    error);
  } else if (lo > 0) {
    s = fmt::format("no divergence within the rings' window: every rank issued the same {} calls (seqs {}..{}) and "
                    "all completed; seqs 0..{} were overwritten (raise ring to see them)",
                    hi - lo + 1, lo, hi, lo - 1);
  } else {
    s = fmt::format("no divergence: every rank issued the same {} calls (seqs {}..{}) and all completed",
                    hi - lo + 1, lo, hi);
  }
  if (r.stall_seq >= 0 && r.stall_lost_ms > kSignificantStallMs) {
    const FlightEntry* e = view_of(vs, r.stall_rank).at(r.stall_seq);
    s += fmt::format("; slowest arrival: rank {} at seq {} ({}), the others waited up to {:.1f} ms for it",
                     r.stall_rank, r.stall_seq, pos_text(pos_of(*e)), r.stall_lost_ms);
  } else if (r.stall_seq >= 0 && r.stall_lost_ms > 1.0) {
    s += fmt::format("; no significant stall (the largest wait for a late rank was {:.1f} ms, at seq {})",
                     r.stall_lost_ms, r.stall_seq);
  } else if (r.stall_seq >= 0) {
    s += "; no significant stall";
  }
  return s;
}

}  // namespace

HangReport analyze_dumps(const std::vector<RankDump>& dumps) {
  if (dumps.empty()) throw UsageError("analyze-hang: no flight-recorder dumps to analyse");
  HangReport r;
  const std::vector<const RankDump*> ds = newest_per_rank(dumps, r.warnings);
  r.run_id = ds.front()->header.run_id;

  // 1. Who is here.
  int min_size = ds.front()->header.size;
  for (const RankDump* d : ds) {
    r.size = std::max(r.size, d->header.size);
    min_size = std::min(min_size, d->header.size);
    if (d->header.run_id != r.run_id)
      r.warnings.push_back(fmt::format("rank {}'s dump is of run {}, not {}", d->header.rank,
                                       d->header.run_id, r.run_id));
  }
  if (min_size != r.size)
    r.warnings.push_back(fmt::format("the dumps disagree on the job size ({} to {}): using {}", min_size,
                                     r.size, r.size));
  std::vector<RankView> vs;
  for (const RankDump* d : ds) {
    if (d->header.rank < 0 || d->header.rank >= r.size) {
      r.warnings.push_back(fmt::format("ignored a dump of rank {}: outside 0..{}", d->header.rank, r.size - 1));
      continue;
    }
    RankView v;
    v.dump = d;
    v.rank = d->header.rank;
    v.last_enqueued = d->last_enqueued_seq;
    for (const auto& e : d->entries) {
      v.by_seq[e.seq] = &e;
      v.last_enqueued = std::max(v.last_enqueued, e.seq);
    }
    vs.push_back(std::move(v));
  }
  const auto n = static_cast<std::size_t>(r.size);
  r.last_completed.assign(n, -2);
  r.last_enqueued.assign(n, -2);
  r.where.assign(n, "");
  std::vector<bool> found(n, false);
  for (const auto& v : vs) {
    found[v.rank] = true;
    r.ranks_found.push_back(v.rank);
    r.last_completed[v.rank] = v.dump->last_completed_seq;
    r.last_enqueued[v.rank] = v.last_enqueued;
    r.where[v.rank] = v.dump->where;
  }
  for (int k = 0; k < r.size; ++k)
    if (!found[k]) r.ranks_missing.push_back(k);

  // 2. Align by seq over the rings' common window.
  std::int64_t lo = 0, hi = -1;
  for (const auto& v : vs) {
    if (!v.by_seq.empty()) lo = std::max(lo, v.by_seq.begin()->first);
    hi = std::max(hi, v.last_enqueued);
  }
  if (lo > 0 && lo <= hi)
    r.warnings.push_back(fmt::format("the rings' common window starts at seq {}: earlier calls were overwritten "
                                     "(a larger recorder capacity keeps more)", lo));
  const Divergence div = find_divergence(vs, lo, hi);
  r.kind = div.kind;
  r.seq = div.seq;

  // 5. Silent mispairing leaves wrong data behind, whatever else happened.
  for (const auto& v : vs) {
    for (const auto& [seq, e] : v.by_seq) {
      if (e->wrong > 0) {
        r.wrong_data_from.emplace_back(v.rank, seq);
        break;
      }
    }
  }

  if (r.kind == DivergenceKind::none) {
    find_stall(vs, lo, hi, r);
    r.summary = agreement_summary(r, vs, lo, hi);
  } else {
    // 3. The reference call, then 4. the pattern.
    std::optional<Reference> pat;
    if (r.kind != DivergenceKind::missing) pat = pattern_reference(vs, lo, r.seq);
    Reference ref = pat ? *pat : majority_reference(vs, r.seq);
    int cps = ref.cps;
    if (cps == 0) {
      for (const auto& v : vs)
        for (const auto& [s, e] : v.by_seq) cps = std::max(cps, e->call_index + 1);
    }
    if (r.kind != DivergenceKind::missing) r.pattern = refine(vs, r.seq, cps, ref, r.kind);
    r.culprits = ref.culprits;
    r.step = ref.pos.step;
    r.call_index = ref.pos.call;
    if (!ref.tie) r.expected = describe(ref.call);
    r.per_rank_call.assign(n, "-");
    for (const auto& v : vs)
      if (const FlightEntry* e = v.at(r.seq)) r.per_rank_call[v.rank] = entry_text(*e);
    r.summary = divergence_summary(r, vs, ref);
  }

  if (!r.ranks_missing.empty()) {
    r.summary += r.ranks_missing.size() == 1
                     ? fmt::format("; rank {}'s dump is missing", r.ranks_missing[0])
                     : fmt::format("; the dumps of {} are missing", ranks_text(r.ranks_missing));
  }
  if (!r.wrong_data_from.empty()) {
    std::string w;
    for (const auto& [rank, seq] : r.wrong_data_from)
      w += fmt::format("{}rank {} from seq {}", w.empty() ? "" : ", ", rank, seq);
    r.summary += fmt::format("; wrong data ({}): the library paired mismatched calls silently", w);
  }
  return r;
}

}  // namespace sb
