// analyze-hang on a real PyTorch job's Flight Recorder dumps (readers/torch_fr reads them): per
// process group, the ranks' collectives aligned by collective_seq_id, sends and recvs paired, who
// waits on whom. What it follows and what it does not model: readers/torch_fr.hpp's header and
// diagnose/hang/torch_fr_analysis.hpp.
#include "diagnose/hang/torch_fr_analysis.hpp"
#include "diagnose/hang/fr_calls.hpp"  // describe, size_rule, parse_p2p, total_bytes
#include "diagnose/hang/missing_dump.hpp"  // DumpWait, explain_missing_dumps
#include "diagnose/hang/wait_ring.hpp"  // WaitEdge, shortest_ring
#include "harness/text.hpp"  // parse_whole


#include <algorithm>  // std::sort, std::max, std::min, std::count
#include <cctype>     // std::isdigit
#include <map>        // std::map
#include <memory>     // std::shared_ptr: what frames_of reads from
#include <deque>      // std::deque
#include <optional>   // std::optional
#include <queue>      // std::priority_queue: recvs from any source
#include <set>        // std::set
#include <tuple>      // std::tuple: a p2p lane
#include <unordered_map>  // std::unordered_map: op names, numbered

#include <limits>     // std::numeric_limits

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/errors.hpp"       // UsageError
#include "harness/json_read.hpp"    // JsonRef, parse_json_text


namespace sb {

using namespace fr;  // the entry's op, sizes and bytes (fr_calls.hpp)

namespace {

// What the checks at every seq read of one rank's collective, gathered in
// one pass over the entries: a 16-rank, 20,000-entry job is 100 MB of
// entries, and reading them seq by seq, rank by rank, is a cache miss per
// field. Sizes and dtypes point at the entries' shared values.
struct Row {
  std::int64_t seq;
  const TorchFrEntry* e;
  const std::vector<std::vector<std::int64_t>>* in;  // input_sizes
  const std::vector<std::vector<std::int64_t>>* out;
  const std::vector<std::string>* din;  // input_dtypes
  const std::vector<std::string>* dout;
  std::int64_t created;  // time_created_ns
  std::uint32_t op;      // op_name(profiling_name), numbered by the analysis
  std::uint8_t state;    // state_rank
  SizeRule rule;
};

// One rank's collectives in one process group, by seq.
using SeqList = std::vector<Row>;

// In seq order (a dump's ring is, nearly always, already), one entry a seq:
// of entries with the same seq, the last in the dump's order, except a
// coalesced group (its ops, then the "coalesced" marker endCoalescing records
// with no sizes, all at one seq): merge(first, last) makes its row from them.
template <class Merge>
void settle(SeqList& v, Merge merge) {
  auto by_seq = [](const Row& a, const Row& b) { return a.seq < b.seq; };
  if (!std::is_sorted(v.begin(), v.end(), by_seq)) std::stable_sort(v.begin(), v.end(), by_seq);
  std::size_t out = 0;
  for (std::size_t i = 0, j = 0; i < v.size(); i = j) {
    for (j = i + 1; j < v.size() && v[j].seq == v[i].seq;) ++j;
    const Row& last = v[j - 1];
    v[out++] = j - i > 1 && op_name(last.e->profiling_name) == "coalesced" ? merge(v.begin() + std::ptrdiff_t(i),
                                                                                  v.begin() + std::ptrdiff_t(j))
                                                                            : last;
  }
  v.resize(out);
}

// The row at seq (null: none).
const Row* find_seq(const SeqList& v, std::int64_t seq) {
  auto it = std::lower_bound(v.begin(), v.end(), seq, [](const Row& x, std::int64_t s) { return x.seq < s; });
  return it != v.end() && it->seq == seq ? &*it : nullptr;
}

template <class T>
bool same_value(const T* a, const T* b) {
  return a == b || *a == *b;
}

}  // namespace

namespace {

// A send or a recv: "send 0->1", "recv 1<-0" (op_name of its profiling_name), in the group's ranks, as
// ProcessGroupNCCL writes them and fr_trace's Op reads them; "recv 1<-?" is a recv from any source.
struct P2pCall {
  const TorchFrEntry* e;
  int rank, peer;  // global ranks; peer -1: any source
  bool send;
  bool batched = false;  // one op of a batch_isend_irecv (a coalesced group), not a plain send or recv
  bool done = false;     // completed, as its state says (a batch's ops: the batch's closing marker's state)
  const P2pCall* with = nullptr;    // the matched counterpart
  const P2pCall* behind = nullptr;  // a plain call queued behind this one on its pair's NCCL queue, with `with` behind
                                    // that call's peer's: an ordering deadlock (see match_p2p)
};

// A backend whose plain sends and recvs run in issue order on one queue per pair of ranks (ProcessGroupNCCL);
// gloo's are not modelled so (and gloo records none: tests/data/fr/README.md).
bool queued_per_pair(const TorchFrEntry& e) { return !e.profiling_name.starts_with("gloo:"); }

// What the p2p matching found in one process group: the first call nobody answers (and who owes
// the answer), or the first send and recv that were paired with different sizes or dtypes.
struct P2pFinding {
  DivergenceKind kind = DivergenceKind::none;
  std::string pattern, pg, summary, expected, torch_match_state;
  std::int64_t seq = -1;
  std::vector<int> culprits;
  std::map<int, std::string> calls;      // what each rank concerned is doing
  const TorchFrEntry* culprit_entry = nullptr;  // a mismatch's culprit side: its frames
  int culprit_rank = -1;
  std::int64_t made = std::numeric_limits<std::int64_t>::max();  // when its call was made
};

struct P2pGroupInput {
  std::string pg;
  std::vector<int> members;                                      // sorted: group rank -> global rank
  std::map<int, std::vector<const TorchFrEntry*>> p2p;           // each rank's p2p entries, dump order
  // Where a rank's ring, if it dropped its oldest entries, holds every call of the group from: a collective
  // seq (the group's seqs are shared, so both sides of a pair cut at the same place), or, where no collective
  // of the group follows to cut at (a pipeline group of sends and recvs alone), the time of its oldest entry.
  struct Cut {
    std::int64_t seq = std::numeric_limits<std::int64_t>::min(), time = std::numeric_limits<std::int64_t>::min();
  };
  std::map<int, Cut> cut;
};

// Pairs each rank's sends to a peer with that peer's recvs from it, in each side's order (NCCL and
// gloo deliver in order per pair; p2p_seq_id counts a rank's p2p calls in the group, so it numbers
// the two sides of a pair differently as soon as a rank talks to two peers), then checks each pair's
// element count and dtype (fr_trace's Op.match compares the send's input_sizes with the recv's
// output_sizes). A rank's first call not completed and left unmatched (or stuck in NCCL's per-pair order,
// below) is taken as where it waits: on its peer, which either owes the counterpart (a rank waiting on no
// one, or with no dump: the culprit) or waits in turn (a cycle: a deadlock). An approximation: a rank
// may wait elsewhere (a collective, another stream) while the dump shows an older call still pending.
struct P2pGroupResult {
  std::optional<P2pFinding> finding;
  std::set<int> blocked;  // ranks waiting at an unmatched call
  std::size_t pairs = 0;
  // Where each blocked rank waits, and on whom (peer -1: any source): for the wait cycles across groups.
  struct Wait {
    int rank, peer;
    const TorchFrEntry* e;
  };
  std::vector<Wait> waits;
};

P2pGroupResult match_p2p(const P2pGroupInput& in, const std::map<int, const TorchFrDump*>& by_rank,
                         std::vector<std::string>& warnings) {
  P2pGroupResult out;
  auto local_of = [&](int rank) {
    auto it = std::lower_bound(in.members.begin(), in.members.end(), rank);
    return it != in.members.end() && *it == rank ? int(it - in.members.begin()) : -1;
  };
  std::deque<P2pCall> store;  // stable addresses
  std::map<int, std::vector<P2pCall*>> calls;
  std::size_t cut_out = 0, seen = 0;  // calls left out where a ring had wrapped; calls read
  std::size_t unnamed = 0;             // calls naming no peer
  constexpr std::size_t kShown = 5;    // of those, warned about one by one
  for (const auto& [rank, entries] : in.p2p) {
    const int me_local = local_of(rank);
    // Batches: ProcessGroupNCCL bumps the p2p seq once for a whole coalesced group (batch_isend_irecv), so its
    // ops share one p2p_seq_id, and endCoalescing closes it with a "coalesced" entry of that id, which holds the
    // batch's state (its ops are recorded without events). A run of entries of one id that has the marker or
    // more than one op is a batch; a plain call has an id of its own.
    std::vector<char> in_batch(entries.size(), 0), batch_done(entries.size(), 0);
    for (std::size_t i = 0, j = 0; i < entries.size(); i = j) {
      for (j = i + 1; j < entries.size() && entries[i]->p2p_seq_id >= 0 &&
                      entries[j]->p2p_seq_id == entries[i]->p2p_seq_id;)
        ++j;
      bool marker = false, marker_done = false;
      for (std::size_t k = i; k < j; ++k)
        if (op_name(entries[k]->profiling_name).ends_with("coalesced")) {
          marker = true;
          marker_done = marker_done || entries[k]->state == "completed";
        }
      if (!marker && j - i < 2) continue;
      for (std::size_t k = i; k < j; ++k) {
        in_batch[k] = 1;
        batch_done[k] = marker_done || entries[k]->state == "completed";
      }
    }
    for (std::size_t k = 0; k < entries.size(); ++k) {
      const TorchFrEntry* e = entries[k];
      const std::string_view op = op_name(e->profiling_name);
      if (op.ends_with("coalesced")) continue;  // a batch's closing marker: its ops are recorded one by one
      ++seen;
      bool send = false;
      int me = -1, peer = -1;
      const TorchFrDump& d = *by_rank.at(rank);
      if (!parse_p2p(op, send, me, peer)) {
        if (++unnamed <= kShown)  // (the first few: a damaged dump can hold thousands)
          warnings.push_back(fmt::format("{}: entries[{}]: p2p call \"{}\" names no peer (\"send A->B\", \"recv A<-B\"): "
                                         "left out of the send/recv matching", d.path, e->index, e->profiling_name));
        continue;
      }
      if (me != me_local || (peer >= 0 && std::size_t(peer) >= in.members.size())) {
        // the group's ranks are not what the call says (a group pg_config does not list): no pairing is sound
        warnings.push_back(fmt::format("{}: entries[{}]: \"{}\" does not fit process group {} of ranks [{}] "
                                       "(rank {} is its rank {}): its send/recv calls are not matched",
                                       d.path, e->index, e->profiling_name, in.pg, fmt::join(in.members, ", "), rank,
                                       me_local));
        return {};
      }
      const int gpeer = peer < 0 ? -1 : in.members[std::size_t(peer)];
      // (a peer that left no dump keeps its calls: they stay unmatched, and a wait that ends at that rank names it)
      // a ring that dropped its oldest entries: only what both sides still hold in full is paired
      // (a call of the pair before where either side's ring holds everything: its counterpart may be lost)
      if (gpeer >= 0) {
        const P2pGroupInput::Cut mine = in.cut.count(rank) ? in.cut.at(rank) : P2pGroupInput::Cut{},
                                 theirs = in.cut.count(gpeer) ? in.cut.at(gpeer) : P2pGroupInput::Cut{};
        if (e->collective_seq_id < std::max(mine.seq, theirs.seq) || e->time_created_ns < std::max(mine.time, theirs.time)) {
          ++cut_out;
          continue;
        }
      }
      P2pCall& c = store.emplace_back(P2pCall{e, rank, gpeer, send});
      c.batched = in_batch[k];
      c.done = in_batch[k] ? batch_done[k] : e->state == "completed";
      calls[rank].push_back(&c);
    }
  }
  if (unnamed > kShown)
    warnings.push_back(fmt::format("process group {}: {} more p2p calls name no peer (left out of the matching)",
                                   in.pg, unnamed - kShown));
  if (cut_out > 0) {
    std::vector<int> wrapped;
    for (const auto& [rank, c] : in.cut) wrapped.push_back(rank);
    warnings.push_back(fmt::format("process group {}: the Flight Recorder ring of rank{} {} had dropped its oldest "
                                   "entries: {} of {} send/recv calls, made before what both sides of their pair "
                                   "still hold, are left out of the matching",
                                   in.pg, wrapped.size() == 1 ? "" : "s", fmt::join(wrapped, ", "), cut_out, seen));
  }
  // per pair, direction and lane (plain or batched), in each side's order: a batched op pairs only with a
  // batched one (a batch runs on the group's communicator, a plain call on the pair's own)
  using Lane = std::tuple<int, int, bool>;                  // (from, to, batched)
  std::map<Lane, std::vector<P2pCall*>> sends, recvs;
  std::map<int, std::vector<P2pCall*>> any_source;  // by receiver
  for (auto& [rank, v] : calls)
    for (P2pCall* c : v) {
      if (c->send) sends[{rank, c->peer, c->batched}].push_back(c);
      else if (c->peer < 0) any_source[rank].push_back(c);
      else recvs[{c->peer, rank, c->batched}].push_back(c);
    }
  std::optional<P2pFinding> mismatch;
  // Per call: whether its lane's earlier calls used its element count, its dtypes; computed once a lane, when
  // a mismatch first asks (a walk of the lane per mismatch was quadratic in a dump of many).
  struct Seen {
    bool count = false, dtype = false;
  };
  std::unordered_map<const P2pCall*, Seen> seen_before;
  std::set<const std::vector<P2pCall*>*> lanes_seen;
  auto history = [&](const std::vector<P2pCall*>& lane) {
    if (!lanes_seen.insert(&lane).second) return;
    std::set<std::int64_t> counts;
    std::set<std::vector<std::string>> dtypes;
    for (const P2pCall* h : lane) {
      const std::int64_t n = total_numel(h->send ? h->e->input_sizes : h->e->output_sizes);
      const auto& d = (h->send ? h->e->input_dtypes : h->e->output_dtypes).get();
      seen_before[h] = Seen{counts.count(n) > 0, dtypes.count(d) > 0};
      counts.insert(n);
      dtypes.insert(d);
    }
  };
  auto pair = [&](P2pCall* s, P2pCall* q) {
    s->with = q;
    q->with = s;
    ++out.pairs;
    const bool count_ok = total_numel(s->e->input_sizes) == total_numel(q->e->output_sizes);
    const bool dtype_ok = s->e->input_dtypes == q->e->output_dtypes;
    if (count_ok && dtype_ok) return;
    const std::int64_t made = std::min(s->e->time_created_ns, q->e->time_created_ns);
    if (mismatch && mismatch->made <= made) return;
    P2pFinding f;
    f.kind = count_ok ? DivergenceKind::dtype : DivergenceKind::count;
    f.pattern = "p2p";
    f.made = made;
    // The side that changed: its own earlier calls of this pair and direction never used this size
    // (dtype); the other side's did. Neither or both: both are named.
    auto novel = [&](const P2pCall* c, const std::vector<P2pCall*>& lane) {
      history(lane);
      auto it = seen_before.find(c);
      return it == seen_before.end() || !(count_ok ? it->second.dtype : it->second.count);
    };
    const bool s_new = novel(s, sends[{s->rank, s->peer, s->batched}]),
               q_new = novel(q, recvs[{s->rank, q->rank, q->batched}]);
    const P2pCall* culprit = s_new && !q_new ? s : q_new && !s_new ? q : nullptr;
    if (culprit) f.culprits = {culprit->rank};
    else f.culprits = {std::min(s->rank, q->rank), std::max(s->rank, q->rank)};
    const P2pCall* named = culprit ? culprit : s->rank < q->rank ? s : q;
    const P2pCall* other = named == s ? q : s;
    if (culprit) {
      f.culprit_entry = culprit->e;
      f.culprit_rank = culprit->rank;
    }
    f.seq = named->e->p2p_seq_id;
    f.expected = fmt::format("{} (rank {}'s, p2p seq {})", describe(*other->e), other->rank, other->e->p2p_seq_id);
    f.calls[s->rank] = fmt::format("{} p2p seq {}", describe(*s->e), s->e->p2p_seq_id);
    f.calls[q->rank] = fmt::format("{} p2p seq {}", describe(*q->e), q->e->p2p_seq_id);
    f.summary = fmt::format("process group {} p2p: rank {}'s send of {} (p2p seq {}) is received by rank {}'s recv into "
                            "{} (p2p seq {}): {}; {}",
                            in.pg, s->rank, sizes_text(s->e->input_sizes, s->e->input_dtypes), s->e->p2p_seq_id,
                            q->rank, sizes_text(q->e->output_sizes, q->e->output_dtypes), q->e->p2p_seq_id,
                            [&] {
                              const std::int64_t ns = total_numel(s->e->input_sizes), nq = total_numel(q->e->output_sizes);
                              const std::int64_t bs = total_bytes(s->e->input_sizes, s->e->input_dtypes),
                                                 bq = total_bytes(q->e->output_sizes, q->e->output_dtypes);
                              const std::string bytes = bs >= 0 && bq >= 0 ? fmt::format(": {} bytes sent, {} bytes "
                                                                                         "received", bs, bq)
                                                                           : std::string();
                              if (count_ok) return fmt::format("the dtypes differ ({} elements each{})", ns, bytes);
                              return fmt::format("the element counts differ ({} vs {} elements{}{})", ns, nq,
                                                 dtype_ok ? "" : "; the dtypes differ too", dtype_ok ? "" : bytes);
                            }(),
                            culprit ? fmt::format("rank {}'s earlier {} {} rank {} never did this", culprit->rank,
                                                  culprit->send ? "sends" : "recvs", culprit->send ? "to" : "from",
                                                  other->rank)
                                    : std::string("neither side's earlier calls of this pair tell which changed"));
    f.torch_match_state = count_ok ? "FULLY_MATCHED for this pair (fr_trace compares a send's and a recv's sizes, "
                                     "not their dtypes)"
                                   : "SIZE_OR_SYNTAX_MISMATCH (fr_trace: the send's input_sizes against the recv's "
                                     "output_sizes)";
    mismatch = std::move(f);
  };
  std::set<Lane> dirs;
  for (const auto& [k, v] : sends) dirs.insert(k);
  for (const auto& [k, v] : recvs) dirs.insert(k);
  for (const auto& k : dirs) {
    auto& s = sends[k];
    auto& q = recvs[k];
    for (std::size_t i = 0; i < std::min(s.size(), q.size()); ++i) pair(s[i], q[i]);
  }
  // a recv from any source takes the oldest send to its rank still unmatched (of its lane): the lanes' first
  // unmatched sends in a heap by creation time, each lane's cursor moving on as they are taken
  for (auto& [rank, v] : any_source)
    for (const bool batched : {false, true}) {
      using Head = std::pair<std::int64_t, std::pair<std::vector<P2pCall*>*, std::size_t>>;
      std::priority_queue<Head, std::vector<Head>, std::greater<Head>> heads;
      auto push = [&](std::vector<P2pCall*>* lane, std::size_t i) {
        while (i < lane->size() && (*lane)[i]->with) ++i;
        if (i < lane->size()) heads.push({(*lane)[i]->e->time_created_ns, {lane, i}});
      };
      for (auto& [k, lane] : sends)
        if (std::get<1>(k) == rank && std::get<2>(k) == batched) push(&lane, 0);
      for (P2pCall* q : v) {
        if (q->batched != batched) continue;
        if (heads.empty()) break;
        const auto [t, at] = heads.top();
        heads.pop();
        pair((*at.first)[at.second], q);
        push(at.first, at.second + 1);
      }
    }

  // NCCL's order within a pair. ProcessGroupNCCL runs a plain send or recv on a communicator of the two
  // ranks alone (pointToPoint, getKeySendRecv): one queue per pair, both directions on it, in issue order.
  // So walk the pair's plain calls on both sides at once: the two heads go on when they are each other's
  // counterpart, or one is done (an eager send that completed, or a call whose counterpart completed). Heads
  // that are both matched, but each to a call queued behind the other head (both receive first, or both
  // send a tensor too large to be buffered), wait on each other forever: an ordering deadlock, though every
  // call has its counterpart. Heads left unmatched are the waits found below. A batch's ops are exempt (a
  // batch runs as one group call on the group's communicator: order within it does not matter, and it
  // never meets a plain call); a recv from any source, and backends other than NCCL, are not modelled.
  {
    std::map<std::pair<int, int>, std::pair<std::vector<P2pCall*>, std::vector<P2pCall*>>> queues;  // (lo, hi)
    for (auto& [rank, v] : calls)
      for (P2pCall* c : v)
        if (!c->batched && c->peer >= 0 && c->peer != rank && queued_per_pair(*c->e)) {
          auto& q = queues[{std::min(rank, c->peer), std::max(rank, c->peer)}];
          (rank < c->peer ? q.first : q.second).push_back(c);
        }
    auto free = [](const P2pCall* c) { return c->done || (c->with && c->with->done); };
    for (auto& [key, q] : queues) {
      std::size_t i = 0, j = 0;
      for (;;) {
        P2pCall* a = i < q.first.size() ? q.first[i] : nullptr;
        P2pCall* b = j < q.second.size() ? q.second[j] : nullptr;
        if (a && free(a)) ++i;
        else if (b && free(b)) ++j;
        else if (a && b && a->with == b) ++i, ++j;
        else {
          // (a's counterpart, were it before b, was passed only with a: it is behind b, and b's behind a)
          if (a && b && a->with && b->with) {
            a->behind = b;
            b->behind = a;
          }
          break;
        }
      }
    }
  }
  // Each rank's first call left unmatched, or stuck in its pair's order: where it waits, and on whom. A call
  // whose state says completed waits on nothing: unmatched, a completed recv proves the peer sent it (its dump
  // lost the send: a warning); an unmatched completed send may be an eager send whose recv is not posted yet.
  std::map<int, const P2pCall*> waits;
  std::size_t lost = 0;
  std::string lost_first;
  for (const auto& [rank, v] : calls)
    for (const P2pCall* c : v) {
      if (c->done) {
        if (!c->with && !c->send && c->peer >= 0 && by_rank.count(c->peer) && lost++ == 0)
          lost_first = fmt::format("{}: entries[{}]: \"{}\" (p2p seq {})", by_rank.at(rank)->path, c->e->index,
                                   c->e->profiling_name, c->e->p2p_seq_id);
        continue;
      }
      if (!c->with || c->behind) {
        waits[rank] = c;
        out.blocked.insert(rank);
        out.waits.push_back({rank, c->peer, c->e});
        break;
      }
    }
  if (lost > 0)
    warnings.push_back(fmt::format("process group {}: {} recv{} completed with no matching send in the peer's dump "
                                   "(the first: {}): the peer's dump lost {} (its ring, or an entry written late); "
                                   "not taken as where a rank waits",
                                   in.pg, lost, lost == 1 ? "" : "s", lost_first, lost == 1 ? "it" : "them"));
  std::optional<P2pFinding> unmatched;
  if (!waits.empty()) {
    // the chain from the call made first (on a tie, the lowest rank's)
    int start = waits.begin()->first;
    for (const auto& [rank, c] : waits)
      if (c->e->time_created_ns < waits.at(start)->e->time_created_ns) start = rank;
    std::vector<int> chain = {start};
    int sink = -1;
    std::size_t cycle_from = 0;
    bool cycle = false, any = false, no_dump = false;
    for (;;) {
      const P2pCall* c = waits.at(chain.back());
      if (c->peer < 0) {
        any = true;
        break;
      }
      if (auto it = std::find(chain.begin(), chain.end(), c->peer); it != chain.end()) {
        cycle = true;
        cycle_from = std::size_t(it - chain.begin());
        break;
      }
      if (!waits.count(c->peer)) {
        sink = c->peer;
        no_dump = !by_rank.count(sink);
        break;
      }
      chain.push_back(c->peer);
    }
    P2pFinding f;
    f.kind = DivergenceKind::missing;
    f.made = waits.at(start)->e->time_created_ns;
    auto what = [&](const P2pCall* c) {
      std::string t = fmt::format("{}{} {} {} (p2p seq {}, {})", c->batched ? "batched " : "", c->send ? "send" : "recv",
                                  c->send ? "to" : "from",
                                  c->peer < 0 ? std::string("any rank") : fmt::format("rank {}", c->peer),
                                  c->e->p2p_seq_id,
                                  sizes_text(c->send ? c->e->input_sizes : c->e->output_sizes,
                                             c->send ? c->e->input_dtypes : c->e->output_dtypes));
      // its counterpart issued in the other lane: plain against batched never pairs
      if (auto it = c->with || c->peer < 0 ? calls.end() : calls.find(c->peer); it != calls.end())
        for (const P2pCall* x : it->second)
          if (!x->with && x->peer == c->rank && x->send != c->send && x->batched != c->batched) {
            t += fmt::format(" [rank {}'s {} {} (p2p seq {}) cannot pair with it: a batch_isend_irecv runs on the "
                             "group's communicator, a plain send or recv on the pair's own]",
                             x->rank, x->batched ? "batched" : "plain", x->send ? "send" : "recv", x->e->p2p_seq_id);
            break;
          }
      return t;
    };
    for (int rank : chain) {
      const P2pCall* c = waits.at(rank);
      f.calls[rank] = fmt::format("{} p2p seq {} {}{}, {}: waits for {}", describe(*c->e), c->e->p2p_seq_id,
                                  c->e->state, c->e->retired ? " (retired)" : "",
                                  c->with ? "matched but queued behind the peer's own wait" : "unmatched",
                                  c->peer < 0 ? std::string("any rank") : fmt::format("rank {}", c->peer));
    }
    std::vector<std::string> behind;  // ranks waiting in turn on the ones named
    // the other waiting ranks whose waits lead into this chain wait on it in turn
    auto on_chain = [&](int m) { return m == sink || std::find(chain.begin(), chain.end(), m) != chain.end(); };
    std::vector<int> in_turn;
    for (const auto& [rank, c] : waits) {
      if (on_chain(rank)) continue;
      std::set<int> seen;
      int at = rank;
      while (!on_chain(at) && waits.count(at) && waits.at(at)->peer >= 0 && seen.insert(at).second)
        at = waits.at(at)->peer;
      if (on_chain(at) && (at != sink || sink >= 0)) in_turn.push_back(rank);
    }
    for (int rank : in_turn) {
      const P2pCall* c = waits.at(rank);
      f.calls[rank] = fmt::format("{} p2p seq {} {}{}, {}: waits for rank {}", describe(*c->e), c->e->p2p_seq_id,
                                  c->e->state, c->e->retired ? " (retired)" : "",
                                  c->with ? "matched but queued behind the peer's own wait" : "unmatched", c->peer);
    }
    if (cycle) {
      std::vector<int> ring(chain.begin() + std::ptrdiff_t(cycle_from), chain.end());
      f.culprits = ring;
      std::sort(f.culprits.begin(), f.culprits.end());
      f.pattern = "p2p cycle";
      f.seq = waits.at(f.culprits.front())->e->p2p_seq_id;
      std::vector<std::string> each;
      bool ordering = false;  // a wait on a matched call queued behind the peer's own wait (NCCL's per-pair order)
      for (int rank : f.culprits) {
        const P2pCall* c = waits.at(rank);
        std::string t = fmt::format("rank {} in {}", rank, what(c));
        if (c->with && c->behind) {
          ordering = true;
          t += fmt::format(", whose {} (rank {}'s p2p seq {}) is queued behind rank {}'s {} {} rank {} (p2p seq {})",
                           c->send ? "recv" : "send", c->with->rank, c->with->e->p2p_seq_id, c->behind->rank,
                           c->behind->send ? "send" : "recv", c->behind->send ? "to" : "from", c->behind->peer,
                           c->behind->e->p2p_seq_id);
        }
        each.push_back(t);
      }
      for (std::size_t i = 0; i < cycle_from; ++i) in_turn.push_back(chain[i]);
      f.expected = ordering ? "the pair's calls issued in an order that alternates (one side's send where the other "
                              "receives), or batched with batch_isend_irecv"
                            : "one of them to answer first: the program orders its sends and recvs so that each waits "
                              "on the other";
      f.summary = fmt::format("process group {} p2p: ranks {} wait on each other, none answering: {} ({})", in.pg,
                              fmt::join(f.culprits, ", "), fmt::join(each, "; "),
                              ordering ? "an ordering deadlock: NCCL runs a pair's plain sends and recvs in issue "
                                         "order, both directions on one queue, so each call waits for one the other "
                                         "rank queued behind its own"
                                       : "a deadlock in the order of sends and recvs");
    } else {
      const int waiter = chain.back();
      const P2pCall* c = waits.at(waiter);
      f.pattern = any ? "p2p any source" : no_dump ? "p2p no dump" : "p2p";
      f.seq = c->e->p2p_seq_id;
      if (any) {
        for (int m : in.members)
          if (m != waiter) f.culprits.push_back(m);
      } else {
        f.culprits = {sink};
      }
      for (std::size_t i = 0; i + 1 < chain.size(); ++i) in_turn.push_back(chain[i]);
      std::string newest;
      bool skew = false;  // the waiting call is the waiter's newest entry, and the sink's newest is a call of this pair
      if (!any && no_dump) {
        newest = "it left no dump";
        f.calls[sink] = fmt::format("no dump: its calls with rank {} are unknown", waiter);
      } else if (!any) {
        const TorchFrDump& d = *by_rank.at(sink);
        if (d.entries.empty()) newest = "it has no entries";
        else {
          const TorchFrEntry& e = d.entries.back();
          newest = fmt::format("its newest call: {} {} seq {}", describe(e), e.is_p2p ? "p2p" : "collective",
                               e.is_p2p ? e.p2p_seq_id : e.collective_seq_id);
          const TorchFrDump& w = *by_rank.at(waiter);
          auto it = calls.find(sink);
          skew = !w.entries.empty() && c->e == &w.entries.back() && it != calls.end() && !it->second.empty() &&
                 it->second.back()->e == &e && it->second.back()->peer == waiter;
        }
        // what the sink did of this pair: its calls the waiter's earlier ones matched
        const auto& owed = c->send ? recvs[{waiter, sink, c->batched}] : sends[{sink, waiter, c->batched}];
        f.calls[sink] = fmt::format("no {} rank {} after its {} matched; {}", c->send ? "recv from" : "send to",
                                    waiter, std::count_if(owed.begin(), owed.end(), [](const P2pCall* x) { return x->with; }),
                                    newest);
      }
      f.expected = any ? fmt::format("a send to rank {}", waiter)
                       : fmt::format("{} rank {} of {}", c->send ? "a recv on rank " + std::to_string(sink) + " from"
                                                                 : "a send on rank " + std::to_string(sink) + " to",
                                     waiter, sizes_text(c->send ? c->e->input_sizes : c->e->output_sizes,
                                                        c->send ? c->e->input_dtypes : c->e->output_dtypes));
      f.summary = any ? fmt::format("process group {} p2p seq {}: rank {} waits in {}: no rank sent it", in.pg, f.seq,
                                    waiter, what(c))
                 : no_dump ? fmt::format("process group {} p2p seq {}: rank {} waits in {}; rank {} left no dump (it "
                                         "crashed or was killed?): the waits end there, and whether it ever {} it is "
                                         "unknown",
                                         in.pg, f.seq, waiter, what(c), sink, c->send ? "received" : "sent")
                 : skew ? fmt::format("process group {} p2p seq {}: rank {} waits in {}; rank {} had not {} it when "
                                      "its dump was taken ({}; both dumps end at this pair's calls, so the dumps may "
                                      "be a moment apart: a later dump decides)",
                                      in.pg, f.seq, waiter, what(c), sink, c->send ? "received" : "sent", newest)
                      : fmt::format("process group {} p2p seq {}: rank {} waits in {}; rank {} never {} it ({})", in.pg,
                                    f.seq, waiter, what(c), sink, c->send ? "received" : "sent", newest);
    }
    std::sort(in_turn.begin(), in_turn.end());
    for (int rank : in_turn) behind.push_back(fmt::format("rank {} in {}", rank, what(waits.at(rank))));
    if (!behind.empty()) f.summary += fmt::format("; waiting on it in turn: {}", fmt::join(behind, "; "));
    // (tests/data/fr/p2p-*/fr_trace_pgfix.txt: it pairs a p2p call with every other rank's entry of the same
    // collective_seq_id, so on 2 ranks a recv meets a recv, and on 3 matched pairs are flagged too)
    const bool ordering_cycle =
        cycle && std::any_of(f.culprits.begin(), f.culprits.end(), [&](int m) { return waits.at(m)->behind != nullptr; });
    f.torch_match_state = ordering_cycle ? "not modelled by fr_trace (it pairs p2p calls by collective_seq_id and has "
                                           "no per-pair issue order)"
                          : cycle ? "SIZE_OR_SYNTAX_MISMATCH (fr_trace pairs p2p calls by collective_seq_id, not by "
                                  "peer and order: it finds a recv where it looks for a send)"
                                : "not all ranks joining (fr_trace pairs p2p calls by collective_seq_id, not by peer "
                                  "and order)";
    unmatched = std::move(f);
  }
  // the one whose call was made first (a send and recv of different sizes can leave both waiting)
  if (mismatch && (!unmatched || mismatch->made <= unmatched->made)) out.finding = std::move(mismatch);
  else if (unmatched) out.finding = std::move(unmatched);
  if (out.finding) out.finding->pg = in.pg;
  return out;
}

// The ring of waits through a culprit of a `missing` finding (HangReport::wait_cycle), across calls
// and process groups. Who waits on whom: a rank waits at a collective of a group that some members
// of the group never reached (their newest seq there is lower: it cannot have completed), on those
// members; and at its first p2p call left unmatched (match_p2p's), on its peer. A rank with several
// such calls waits on all of them (a rank goes on only when each completes), so any ring is a
// deadlock if each rank blocks in its call. Members without a dump, or whose wrapped ring holds
// nothing of the group, are not known to be behind and hold nobody back. The ring with the fewest
// ranks of those found breadth first from each of the first 16 culprits is kept. Work: linear in
// the ranks of each group (one node per distinct newest seq, chained), 16 searches at most.
template <class Pgs, class MembersOf>
void find_wait_cycle(HangReport& r, const Pgs& pgs, const MembersOf& members_of,
                     const std::map<int, const TorchFrDump*>& by_rank,
                     const std::vector<std::pair<std::string, P2pGroupResult::Wait>>& p2p_waits) {
  struct Label {
    const TorchFrEntry* e;
    bool p2p;
    const std::string* pg;  // the group's key: its name, or name and ranks where one name has two rank sets
  };
  std::vector<Label> labels;
  std::vector<std::vector<WaitEdge>> out;  // by node: ranks with a dump, and per group one for each newest seq
  std::vector<int> rank_of;            // node -> global rank, -1 for a seq's node
  std::unordered_map<int, int> node_of;
  auto new_node = [&](int rank) {
    out.emplace_back();
    rank_of.push_back(rank);
    return int(out.size() - 1);
  };
  auto rank_node = [&](int rank) {
    auto [it, fresh] = node_of.try_emplace(rank, -1);
    if (fresh) it->second = new_node(rank);
    return it->second;
  };
  for (const auto& [pg, ranks_view] : pgs) {
    // how far each member with a dump got in the group: its newest seq there (-1: none, where its ring
    // holds everything)
    std::vector<std::pair<std::int64_t, int>> reached;
    for (int m : members_of(pg, ranks_view)) {
      auto d = by_rank.find(m);
      if (d == by_rank.end()) continue;
      auto v = ranks_view.find(m);
      if (v != ranks_view.end() && !v->second.coll.empty()) reached.emplace_back(v->second.coll.back().seq, m);
      else if (d->second->entries.empty() || d->second->entries.front().record_id <= 0) reached.emplace_back(-1, m);
    }
    if (reached.size() < 2) continue;
    std::sort(reached.begin(), reached.end());
    // The members at each newest seq (a level) hold back every member past it: a call past a level cannot
    // have completed without the members at that level and below. One node per level, pointing at its
    // members and at the level below, so that a wait is one edge whatever the group's size. A rank waits
    // at its first call past the highest level below its own newest seq, on everyone below it. (A call
    // that is retired but not completed is a wait: a call that failed or timed out is retired.)
    std::vector<std::pair<std::int64_t, int>> levels;  // (seq, node)
    for (const auto& [seq, m] : reached) {
      if (levels.empty() || levels.back().first != seq) {
        const int below = levels.empty() ? -1 : levels.back().second;
        const int level = new_node(-1);
        levels.emplace_back(seq, level);
        if (below >= 0) out[std::size_t(level)].push_back({below, -1});
      }
      const int node = rank_node(m);  // (made before out[] is indexed: making one may move the others)
      out[std::size_t(levels.back().second)].push_back({node, -1});
    }
    for (const auto& [rank, v] : ranks_view) {
      if (v.coll.empty()) continue;
      // the highest level below this rank's newest seq
      auto lv = std::lower_bound(levels.begin(), levels.end(), v.coll.back().seq,
                                 [](const std::pair<std::int64_t, int>& l, std::int64_t seq) { return l.first < seq; });
      if (lv == levels.begin()) continue;  // at the lowest level: it waits on nobody here
      --lv;
      auto it = std::upper_bound(v.coll.begin(), v.coll.end(), lv->first,
                                 [](std::int64_t seq, const Row& x) { return seq < x.seq; });
      if (it == v.coll.end() || it->e->state == "completed") continue;  // (completed: the dumps disagree)
      labels.push_back({it->e, false, &pg});
      const int waiter = rank_node(rank);
      out[std::size_t(waiter)].push_back({lv->second, int(labels.size() - 1)});
    }
  }
  for (const auto& [pg, w] : p2p_waits) {
    if (w.peer < 0 || w.peer == w.rank || !by_rank.count(w.peer)) continue;  // (a call to itself: damage)
    labels.push_back({w.e, true, &pg});
    const int from = rank_node(w.rank), to = rank_node(w.peer);
    out[std::size_t(from)].push_back({to, int(labels.size() - 1)});
  }
  // the shortest ring through a culprit: breadth first from it, back to it
  const std::vector<std::pair<int, int>> best = shortest_ring(out, rank_of, node_of, r.culprits);
  if (best.size() < 2) return;
  for (std::size_t i = 0; i < best.size(); ++i) {
    const Label& l = labels[std::size_t(best[i].second)];
    HangReport::WaitStep w;
    w.rank = rank_of[std::size_t(best[i].first)];
    w.call = describe(*l.e);
    w.process_group = *l.pg;
    w.p2p = l.p2p;
    w.seq = l.p2p ? l.e->p2p_seq_id : l.e->collective_seq_id;
    w.waits_for = rank_of[std::size_t(best[(i + 1) % best.size()].first)];
    // the group's desc where the program gave one (new_group(group_desc=...): "pp", "dp"), as users name them
    const std::string& desc = l.e->pg_desc;
    const bool named = !desc.empty() && desc != "undefined" && desc != "default_pg" && desc != w.process_group;
    w.where = fmt::format("process group {}{} {} seq {} ({})", w.process_group, named ? " \"" + desc + "\"" : "",
                          w.p2p ? "p2p" : "collective", w.seq, l.e->profiling_name);
    r.wait_cycle.push_back(std::move(w));
  }
  std::vector<int> ranks;
  std::vector<std::string> each;
  std::set<std::string> groups;
  bool collectives_only = true;
  for (const auto& w : r.wait_cycle) {
    ranks.push_back(w.rank);
    each.push_back(fmt::format("rank {} in {} for rank {}", w.rank, w.where, w.waits_for));
    groups.insert(w.process_group);
    collectives_only = collectives_only && !w.p2p;
  }
  std::sort(ranks.begin(), ranks.end());
  // fr_trace checks each group apart (tests/data/fr/group-order-*/fr_trace_pgfix.txt): a ring through
  // several groups' collectives is one "not all ranks joining" per group there, never linked
  if (collectives_only && groups.size() > 1)
    r.torch_match_state += fmt::format(", once in each of the ring's {} groups (fr_trace does not link them)",
                                       groups.size());
  r.summary += fmt::format("; the waits close a cycle (ranks {}: {}): blocked so, none of them can go on (a deadlock: "
                           "they make these calls in different orders, or one of them skipped its call)",
                           fmt::join(ranks, ", "), fmt::join(each, "; "));
}

}  // namespace

HangReport analyze_torch_fr(const std::vector<TorchFrDump>& dumps) {
  if (dumps.empty()) throw UsageError("analyze-hang: no PyTorch Flight Recorder dumps to analyse");
  HangReport r;
  r.format = kTorchFlightRecorderFormat;
  r.run_id = "pytorch";
  // One dump per rank: a second file of the same rank is a warning.
  std::map<int, const TorchFrDump*> by_rank;
  for (const auto& d : dumps) {
    if (by_rank.count(d.rank)) {
      r.warnings.push_back(fmt::format("two dumps of rank {}: {} ignored", d.rank, d.path));
      continue;
    }
    by_rank[d.rank] = &d;
  }
  // The process groups and who is in them, from every dump's pg_config.
  // A name two dumps give different rank sets (torch's split_group: "5" is [0, 1] on ranks 0 and 1 and
  // [2, 3] on ranks 2 and 3) is two groups: each rank's entries in it belong to the set that holds the
  // rank, keyed "5 [2, 3]" (fr_trace keys groups by their uid and rank set too).
  std::map<std::string, std::set<std::vector<int>>> sets_of;
  for (const auto& [rank, d] : by_rank)
    for (const auto& g : d->groups)
      if (!g.ranks.empty()) sets_of[g.name].insert(g.ranks);
  std::map<std::pair<int, std::string>, std::string> key_of_rank;  // (rank, name) -> group key, where split
  for (const auto& [rank, d] : by_rank)
    for (const auto& g : d->groups)
      if (sets_of[g.name].size() > 1 && std::find(g.ranks.begin(), g.ranks.end(), rank) != g.ranks.end())
        key_of_rank[{rank, g.name}] = fmt::format("{} [{}]", g.name, fmt::join(g.ranks, ", "));
  auto group_key = [&](int rank, const std::string& name) -> const std::string& {
    auto it = key_of_rank.find({rank, name});
    return it == key_of_rank.end() ? name : it->second;
  };
  std::map<std::string, std::vector<int>> group_ranks;
  for (const auto& [rank, d] : by_rank)
    for (const auto& g : d->groups) {
      const std::string& key = group_key(rank, g.name);
      if (!group_ranks.count(key) || group_ranks[key].size() < g.ranks.size()) group_ranks[key] = g.ranks;
    }
  // The job: the largest group (the default one), else the ranks seen.
  std::vector<int> world;
  for (const auto& [name, ranks] : group_ranks)
    if (ranks.size() > world.size()) world = ranks;
  for (const auto& [rank, d] : by_rank)
    if (std::find(world.begin(), world.end(), rank) == world.end()) world.push_back(rank);
  std::sort(world.begin(), world.end());
  r.size = world.empty() ? 0 : world.back() + 1;
  for (int k = 0; k < r.size; ++k) (by_rank.count(k) ? r.ranks_found : r.ranks_missing).push_back(k);
  const auto n = std::size_t(r.size);
  r.last_completed.assign(n, -2);
  r.last_enqueued.assign(n, -2);
  r.where.assign(n, "");
  r.per_rank_call.assign(n, "-");

  // Collectives by process group, then rank, then seq (p2p calls apart):
  // each rank's in seq order, one a seq (a seq written twice: the later
  // entry, as the dump's order has it). A rank with only p2p calls in a
  // group still has its (empty) view there. One pass over each dump's
  // entries, in order, gathers everything the checks below read.
  struct View {
    SeqList coll;
    std::vector<const TorchFrEntry*> p2p;  // its sends and recvs, in the dump's order
  };
  std::map<std::string, std::map<int, View>> pgs;
  std::map<std::string, std::map<int, std::pair<std::int64_t, std::int64_t>>> last_by_pg;  // enqueued, completed
  std::unordered_map<std::string_view, std::uint32_t> op_ids;  // op names, numbered
  std::map<std::string, std::uint32_t> coalesced_ops;          // a coalesced group's ops, numbered after them
  std::vector<SizeRule> op_rules;                              // by number
  for (const auto& [rank, d] : by_rank) {
    View* v = nullptr;
    const std::string* pg = nullptr;
    const std::string* pg_key = nullptr;  // its group's key (the name, or the name and ranks where split)
    for (const auto& e : d->entries) {
      if (!pg || e.pg_name != *pg) {  // a dump's entries mostly stay in one group
        // (room for every entry in the first group only: a reservation per
        // group would be entries x groups, which a damaged dump makes huge)
        const std::string& key = group_key(rank, e.pg_name);
        if (!pg) pgs[key][rank].coll.reserve(d->entries.size());
        pg = &e.pg_name;
        v = &pgs[key][rank];
        pg_key = &key;
      }
      // A batch's closing "coalesced" entry belongs to the batch whatever its is_p2p says: some torch versions
      // record it with is_p2p false (initWork's isP2POp(COALESCED) is false) and the previous collective's seq
      // (startCoalescing does not bump it), where it would be merged into that collective on the ranks that
      // batched and not on the others. It follows the batch's ops, which carry its p2p seq.
      if (e.is_p2p || (e.p2p_seq_id >= 0 && !v->p2p.empty() && v->p2p.back()->index + 1 == e.index &&
                       v->p2p.back()->p2p_seq_id == e.p2p_seq_id && op_name(e.profiling_name) == "coalesced")) {
        v->p2p.push_back(&e);
        continue;
      }
      // the rank's last enqueued and completed collective in this group (groups count their seqs apart:
      // a maximum over groups set a tensor-parallel group's seq 5000 beside a data-parallel group's 40)
      auto& [enq, done] = last_by_pg[*pg_key].try_emplace(rank, -1, -1).first->second;
      enq = std::max(enq, e.collective_seq_id);
      if (torch_fr_done(e)) done = std::max(done, e.collective_seq_id);
      const auto [op, fresh] = op_ids.try_emplace(op_name(e.profiling_name), std::uint32_t(op_ids.size()));
      if (fresh) op_rules.push_back(size_rule(e.profiling_name));
      v->coll.push_back(Row{e.collective_seq_id, &e, &e.input_sizes.get(), &e.output_sizes.get(),
                            &e.input_dtypes.get(), &e.output_dtypes.get(), e.time_created_ns, op->second,
                            std::uint8_t(state_rank(e)), op_rules[op->second]});
    }
    r.last_enqueued[std::size_t(rank)] = -1;  // a rank with a dump: -1 until its group's figures below
    r.last_completed[std::size_t(rank)] = -1;
    if (!d->entries.empty()) r.where[std::size_t(rank)] = fmt::format("{} entries, last: {} ({})", d->entries.size(),
                                                                   d->entries.back().profiling_name, d->entries.back().state);
  }
  // A coalesced group's row: its ops' names, sizes and dtypes in order, compared as one call (fr_trace's
  // match_coalesced_groups compares each op of the group); the marker's entry for its state and frames.
  struct Merged {
    std::vector<std::vector<std::int64_t>> in, out;
    std::vector<std::string> din, dout;
  };
  std::deque<Merged> merged;  // stable addresses for the rows' pointers
  auto merge = [&](SeqList::iterator first, SeqList::iterator last) {
    Merged& m = merged.emplace_back();
    std::string ops = "coalesced[";
    for (auto it = first; it != last - 1; ++it) {
      m.in.insert(m.in.end(), it->in->begin(), it->in->end());
      m.out.insert(m.out.end(), it->out->begin(), it->out->end());
      m.din.insert(m.din.end(), it->din->begin(), it->din->end());
      m.dout.insert(m.dout.end(), it->dout->begin(), it->dout->end());
      ops += std::string(it != first ? "," : "") + std::string(op_name(it->e->profiling_name));
    }
    ops += "]";
    Row r = *(last - 1);
    const auto [op, fresh] = coalesced_ops.try_emplace(ops, std::uint32_t(op_ids.size() + coalesced_ops.size()));
    r.op = op->second;
    r.in = &m.in;
    r.out = &m.out;
    r.din = &m.din;
    r.dout = &m.dout;
    r.rule = SizeRule::none;
    return r;
  };
  for (auto& [pg, ranks_view] : pgs)
    for (auto& [rank, v] : ranks_view) settle(v.coll, merge);

  // Each present rank's row at the seq being checked (null: none), by
  // rank, looked up once per seq: the checks below read it many times.
  std::vector<const Row*> at_seq(n, nullptr);
  // Each rank's newest completed collective in the group being checked.
  std::vector<std::int64_t> max_done(n, std::numeric_limits<std::int64_t>::min());
  // Per group: the last collective every rank completed (seq, description).
  std::map<std::string, std::pair<std::int64_t, std::string>> all_done_by_pg;
  // The first divergence in each group, in the order of checks; of those, the earliest made.
  const HangReport base = r;
  std::optional<HangReport> best;
  std::int64_t best_at = std::numeric_limits<std::int64_t>::max(), diverged_at = best_at;
  // The group's ranks from pg_config; the default group (gloo's dumps key
  // its pg_config by "" while entries name it "0") is the whole job. Never
  // the ranks that happen to have a dump: a missing file must not shrink
  // the group an all-gather's sizes are checked against.
  auto members_of = [&](const std::string& pg, const std::map<int, View>& ranks_view) {
    std::vector<int> members = group_ranks.count(pg) ? group_ranks[pg] : std::vector<int>{};
    std::string desc;
    for (const auto& [rank, v] : ranks_view)
      if (desc.empty()) desc = !v.coll.empty() ? v.coll.front().e->pg_desc : !v.p2p.empty() ? v.p2p.front()->pg_desc : "";
    // A group pg_config does not list (gloo keys every group's config by "": a new_group's too) is the
    // whole job only when it is the default group; another is the ranks whose entries name it, as a
    // group of [0, 1] beside ranks 2 and 3 would otherwise read as "ranks 2, 3 never joined".
    if (members.empty() && (pg == "0" || desc == "default_pg")) members = world;
    if (members.empty())
      for (const auto& [rank, v] : ranks_view) members.push_back(rank);
    return members;
  };
  for (const auto& pg_views : pgs) {
    // (not a structured binding: lambdas below capture these, which clang before 16 refuses)
    const std::string& pg = pg_views.first;
    const auto& ranks_view = pg_views.second;
    const std::vector<int> members = members_of(pg, ranks_view);
    std::vector<int> present;  // members with a dump
    for (int m : members)
      if (by_rank.count(m)) present.push_back(m);
    if (present.empty()) continue;
    // Each present rank's collectives here (null: none in this group), by its place in `present`.
    std::vector<const SeqList*> colls(present.size(), nullptr);
    for (std::size_t j = 0; j < present.size(); ++j)
      if (auto it = ranks_view.find(present[j]); it != ranks_view.end()) colls[j] = &it->second.coll;
    auto coll_of = [&](int rank) -> const SeqList* {
      auto it = ranks_view.find(rank);
      return it == ranks_view.end() ? nullptr : &it->second.coll;
    };
    // The window every present rank's ring still holds.
    std::int64_t lo = 0, hi = -1;
    for (const SeqList* c : colls)
      if (c && !c->empty()) {
        lo = std::max(lo, c->front().seq);
        hi = std::max(hi, c->back().seq);
      }
    // Each rank's newest completed collective, and the last seq every rank
    // of the group completed.
    std::int64_t all_done = hi;
    for (std::size_t j = 0; j < present.size(); ++j) {
      std::int64_t newest = std::numeric_limits<std::int64_t>::min();
      if (colls[j])
        for (auto it = colls[j]->rbegin(); it != colls[j]->rend(); ++it)
          if (it->state == 2) {
            newest = it->seq;
            break;
          }
      max_done[std::size_t(present[j])] = newest;
      all_done = std::min(all_done, std::max<std::int64_t>(newest, -1));
    }
    {
      std::string what;
      if (all_done >= 0)
        for (const SeqList* c : colls)
          if (const Row* x = c ? find_seq(*c, all_done) : nullptr) {
            what = describe(*x->e);
            break;
          }
      all_done_by_pg[pg] = {all_done, what};
    }

    // Who differs from the majority by `same` (an equivalence) at the seq
    // being checked; on a tie, those who differ from the lowest rank. Groups
    // are found by comparison, not by formatting a key: this runs for every
    // seq of every rank, and nearly always finds everyone the same.
    auto minority = [&](auto same) {
      const Row* first = at_seq[std::size_t(present.front())];
      if (std::all_of(present.begin() + 1, present.end(),
                      [&](int m) { return same(*first, *at_seq[std::size_t(m)]); }))
        return std::vector<int>{};
      std::vector<std::pair<const Row*, std::vector<int>>> groups;
      for (int m : present) {
        const Row* x = at_seq[std::size_t(m)];
        auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& y) { return same(*y.first, *x); });
        if (g == groups.end()) groups.push_back({x, {m}});
        else g->second.push_back(m);
      }
      std::size_t best = 0;
      int ties = 0;
      for (const auto& g : groups) best = std::max(best, g.second.size());
      for (const auto& g : groups) ties += g.second.size() == best;
      std::vector<int> out;
      for (std::size_t k = 0; k < groups.size(); ++k)
        if (ties > 1 ? k != 0 : groups[k].second.size() != best)
          out.insert(out.end(), groups[k].second.begin(), groups[k].second.end());
      std::sort(out.begin(), out.end());
      return out;
    };
    // The seqs any rank holds in the window, in order (never a count from lo
    // to hi: a damaged dump's seq can be 2^62), walked by one cursor a rank.
    std::vector<std::size_t> cursor(present.size(), 0);
    for (std::size_t j = 0; j < present.size(); ++j)
      if (colls[j])
        cursor[j] = std::size_t(std::lower_bound(colls[j]->begin(), colls[j]->end(), lo,
                                                 [](const Row& x, std::int64_t s) { return x.seq < s; }) -
                                colls[j]->begin());
    std::vector<int> have, lack;
    for (;;) {
      bool any = false;
      std::int64_t seq = 0;
      for (std::size_t j = 0; j < present.size(); ++j)
        if (colls[j] && cursor[j] < colls[j]->size() && (*colls[j])[cursor[j]].seq <= hi &&
            (!any || (*colls[j])[cursor[j]].seq < seq)) {
          seq = (*colls[j])[cursor[j]].seq;
          any = true;
        }
      if (!any) break;
      have.clear();
      lack.clear();
      for (std::size_t j = 0; j < present.size(); ++j) {
        const int m = present[j];
        const bool has = colls[j] && cursor[j] < colls[j]->size() && (*colls[j])[cursor[j]].seq == seq;
        at_seq[std::size_t(m)] = has ? &(*colls[j])[cursor[j]++] : nullptr;
        (has ? have : lack).push_back(m);
      }
      DivergenceKind kind = DivergenceKind::none;
      std::vector<int> culprits;
      if (!lack.empty()) {
        kind = DivergenceKind::missing;
        culprits = lack;
      } else if (auto c = minority([](const Row& a, const Row& b) { return a.op == b.op; }); !c.empty()) {
        kind = DivergenceKind::op;
        culprits = c;
      } else if (auto c = minority([](const Row& a, const Row& b) {
                   // fr_trace: inputs unless scatter (non-roots pass none), outputs unless gather; all-to-all's
                   // sizes are each rank's own
                   const SizeRule rule = a.rule;
                   if (rule == SizeRule::all_to_all) return true;
                   return (rule == SizeRule::rooted_scatter || same_value(a.in, b.in)) &&
                          (rule == SizeRule::rooted_gather || same_value(a.out, b.out));
                 });
                 !c.empty()) {
        kind = DivergenceKind::count;
        culprits = c;
      } else if (std::vector<int> bad; [&] {
                   // all-to-all: what the group sends is what it receives (fr_trace's check_size_alltoall)
                   const Row& first = *at_seq[std::size_t(present.front())];
                   if (first.rule != SizeRule::all_to_all || present.size() != members.size()) return false;
                   __int128 sent = 0, received = 0;
                   for (int m : present) {
                     const Row& x = *at_seq[std::size_t(m)];
                     for (const auto& d : *x.in) sent += numel(d);
                     for (const auto& d : *x.out) received += numel(d);
                   }
                   if (sent == received) return false;
                   bad = present;
                   return true;
                 }()) {
        kind = DivergenceKind::count;
        culprits = bad;
      } else if (std::vector<int> bad; [&] {
                   for (int m : present) {
                     const Row& x = *at_seq[std::size_t(m)];
                     if (!sizes_fit_group(x.rule, *x.in, *x.out, members.size())) bad.push_back(m);
                   }
                   return !bad.empty();
                 }()) {
        kind = DivergenceKind::count;
        culprits = bad;
      } else if (auto c = minority([](const Row& a, const Row& b) {
                   // fr_trace's dtype_mismatch: input dtypes unless scatter, gather or broadcast, output dtypes
                   // unless scatter, each only where both sides have tensors
                   const SizeRule rule = a.rule;
                   const bool in_ok = rule == SizeRule::rooted_scatter || rule == SizeRule::rooted_gather ||
                                      rule == SizeRule::broadcast || a.in->empty() || b.in->empty() ||
                                      same_value(a.din, b.din);
                   const bool out_ok = rule == SizeRule::rooted_scatter || a.out->empty() || b.out->empty() ||
                                       same_value(a.dout, b.dout);
                   return in_ok && out_ok;
                 });
                 !c.empty()) {
        kind = DivergenceKind::dtype;
        culprits = c;
        // An even split (two ranks, or a lost dump) has no majority: the odd
        // one out is then the side whose dtype its own earlier calls never used.
        std::vector<int> novel;
        for (std::size_t j = 0; j < present.size(); ++j) {
          const auto* mine = at_seq[std::size_t(present[j])]->din;
          bool seen = false;
          for (auto it = colls[j]->begin(); it != colls[j]->end() && it->seq < seq && !seen; ++it)
            seen = same_value(it->din, mine);
          if (!seen) novel.push_back(present[j]);
        }
        if (!novel.empty() && novel.size() < present.size() && 2 * c.size() >= present.size()) culprits = novel;
      } else {
        // Same call everywhere: the ranks least far along with it, when not
        // all agree. A group's collectives complete in order on a rank, so a
        // later completed call means this one completed too.
        auto state_of = [&](int m) {
          return seq <= max_done[std::size_t(m)] ? 2 : int(at_seq[std::size_t(m)]->state);
        };
        int lo_state = 2, hi_state = 0;
        for (int m : present) {
          const int s = state_of(m);
          lo_state = std::min(lo_state, s);
          hi_state = std::max(hi_state, s);
        }
        // (fr_trace's COLLECTIVE_STATE_MISMATCH: a call some ranks finished
        // and others did not, or that some started and others never did.)
        if (lo_state != hi_state)
          for (int m : present)
            if (state_of(m) == lo_state) culprits.push_back(m);
        if (!culprits.empty()) kind = DivergenceKind::state;
      }
      if (kind == DivergenceKind::none) continue;

      r.kind = kind;
      r.seq = seq;
      r.culprits = culprits;
      r.process_group = pg;
      for (int m : present)
        if (const Row* x = at_seq[std::size_t(m)])
          r.per_rank_call[std::size_t(m)] = describe(*x->e) + " " + x->e->state + (x->e->retired ? " (retired)" : "");
      // What the others issued there: the first rank not among the culprits.
      for (int m : have)
        if (std::find(culprits.begin(), culprits.end(), m) == culprits.end()) {
          r.expected = describe(*at_seq[std::size_t(m)]->e);
          break;
        }
      // A rank that skipped a call shows, at this seq, what the others issue at seq+1.
      if ((kind == DivergenceKind::op || kind == DivergenceKind::count || kind == DivergenceKind::dtype) &&
          seq < std::numeric_limits<std::int64_t>::max()) {
        const int c0 = culprits.front();
        for (int m : have)
          if (std::find(culprits.begin(), culprits.end(), m) == culprits.end()) {
            if (const Row* next = find_seq(*coll_of(m), seq + 1);
                next && describe(*next->e) == describe(*at_seq[std::size_t(c0)]->e))
              r.pattern = "skip";
            break;
          }
      }
      if (const Row* x = at_seq[std::size_t(culprits.front())]) {
        const TorchFrEntry& e = *x->e;
        const TorchFrDump& owner = *by_rank.at(culprits.front());
        try {
          r.culprit_frames = !e.frames.empty() || !owner.frames_of ? e.frames : owner.frames_of(e.index);
        } catch (const UsageError& err) {
          r.warnings.push_back(fmt::format("the culprit's frames are unreadable: {}", err.what()));
        }
      }
      static const std::map<DivergenceKind, const char*> kMatch = {
          {DivergenceKind::missing, "not all ranks joining the collective"},
          {DivergenceKind::op, "COLLECTIVE_TYPE_MISMATCH"},
          {DivergenceKind::count, "SIZE_OR_SYNTAX_MISMATCH"},
          {DivergenceKind::dtype, "COLLECTIVE_DTYPE_MISMATCH"},
          {DivergenceKind::state, "COLLECTIVE_STATE_MISMATCH"}};
      r.torch_match_state = kMatch.at(kind);
      if (kind == DivergenceKind::state) {
        // fr_trace compares the `state` strings alone; stallbench also reads `retired` and a later
        // completed call (gloo records every entry as scheduled)
        bool same_strings = true;
        for (int m : present)
          same_strings = same_strings && at_seq[std::size_t(m)]->e->state == at_seq[std::size_t(present.front())]->e->state;
        if (same_strings)
          r.torch_match_state = "FULLY_MATCHED at this seq (every rank's state reads " +
                                at_seq[std::size_t(present.front())]->e->state +
                                "; fr_trace compares that string alone, not retired or a later completed call)";
      }
      // The last call every rank completed comes before the divergence (a retired entry is done for
      // stallbench, and gloo retires a call that timed out: the divergent call itself read as completed).
      if (auto it = all_done_by_pg.find(pg); it != all_done_by_pg.end() && it->second.first >= seq) {
        it->second.first = seq - 1 >= lo ? seq - 1 : -1;  // every earlier seq matched on every rank
        it->second.second.clear();
        if (it->second.first >= 0)
          if (const SeqList* cl = coll_of(present.front()))
            if (const Row* x = find_seq(*cl, it->second.first)) it->second.second = describe(*x->e);
      }
      const char* what = kind == DivergenceKind::missing ? "never joined"
                         : kind == DivergenceKind::op    ? "issued a different collective"
                         : kind == DivergenceKind::count ? "issued different sizes"
                         : kind == DivergenceKind::dtype ? "issued a different dtype"
                                                         : "did not get as far";
      r.summary = fmt::format("process group {} collective seq {}: rank{} {} {}{} ({}){}", pg, seq,
                              culprits.size() == 1 ? "" : "s", fmt::join(culprits, ", "), what,
                              r.pattern == "skip" ? " (it skipped the call the others are in)" : "",
                              r.expected.empty() ? "-" : r.expected,
                              r.ranks_missing.empty() ? ""
                                                      : fmt::format("; no dump from rank{} {}",
                                                                    r.ranks_missing.size() == 1 ? "" : "s",
                                                                    rank_ranges(r.ranks_missing)));
      // when its divergent call was made: the earliest creation of it on any rank that has it
      for (int m : present)
        if (const Row* x = at_seq[std::size_t(m)]) diverged_at = std::min(diverged_at, x->created);
      break;
    }
    // Every group is checked, and the divergence reported is the one whose call was made first: a rank
    // that skips a call in its subgroup ("2") and goes on to the world group blocks the others there
    // later, and the groups' names ("0", "10", "2") say nothing of time.
    if (r.kind != DivergenceKind::none) {
      if (!best || diverged_at < best_at) {
        best = r;
        best_at = diverged_at;
      }
      r = base;
      diverged_at = std::numeric_limits<std::int64_t>::max();
    }
  }
  if (best) r = std::move(*best);

  // Point-to-point calls, matched by peer and order in each group (match_p2p). Their finding is the
  // answer when no collective diverges; when a collective's missing ranks all wait at an unmatched
  // send or recv (they never reached it because of that); else when its call was made first.
  std::optional<P2pFinding> p2p;
  std::set<int> p2p_blocked;
  std::size_t p2p_pairs = 0;
  bool p2p_wide = false;  // p2p calls in a group of more than 2 ranks
  std::vector<std::string> p2p_warnings;
  std::vector<std::pair<std::string, P2pGroupResult::Wait>> p2p_waits;  // every group's (by key), for the wait cycles
  for (const auto& [pg, ranks_view] : pgs) {
    P2pGroupInput in;
    in.pg = pg;
    for (const auto& [rank, v] : ranks_view) {
      if (v.p2p.empty()) continue;
      in.p2p[rank] = v.p2p;
    }
    if (in.p2p.empty()) continue;
    for (const auto& [rank, v] : ranks_view) {
      // where this rank's ring holds every call of the group: all, unless it dropped its oldest entries
      // (record_id counts every entry from 0); then from its first collective held, or after the collective its
      // first p2p call follows where a later collective of the group is held; else (a group with no collective
      // after its first p2p call held: its calls all carry one collective seq) from its oldest entry's time. The
      // ring is one per process, shared by all groups: its oldest entry is where it holds everything from.
      const TorchFrDump& d = *by_rank.at(rank);
      if (d.entries.empty() || d.entries.front().record_id <= 0) continue;
      P2pGroupInput::Cut c;
      const bool coll_first = !v.coll.empty() && (v.p2p.empty() || v.coll.front().e->index < v.p2p.front()->index);
      if (coll_first) c.seq = v.coll.front().seq;
      else if (!v.p2p.empty() && !v.coll.empty() && v.p2p.front()->collective_seq_id < v.coll.back().seq)
        c.seq = v.p2p.front()->collective_seq_id + 1;
      else c.time = d.entries.front().time_created_ns;
      in.cut[rank] = c;
    }
    in.members = members_of(pg, ranks_view);
    p2p_wide = p2p_wide || in.members.size() > 2;
    P2pGroupResult res = match_p2p(in, by_rank, p2p_warnings);
    p2p_pairs += res.pairs;
    p2p_blocked.insert(res.blocked.begin(), res.blocked.end());
    for (const auto& w : res.waits) p2p_waits.emplace_back(pg, w);
    if (res.finding && (!p2p || res.finding->made < p2p->made)) p2p = std::move(res.finding);
  }
  bool use_p2p = false;
  if (p2p) {
    if (r.kind == DivergenceKind::none) use_p2p = true;
    else if (r.kind == DivergenceKind::missing)
      use_p2p = std::all_of(r.culprits.begin(), r.culprits.end(), [&](int m) { return p2p_blocked.count(m) > 0; });
    else use_p2p = p2p->made < best_at;
  }
  if (use_p2p) {
    HangReport q = base;
    q.kind = p2p->kind;
    q.pattern = p2p->pattern;
    q.seq = p2p->seq;
    q.culprits = p2p->culprits;
    q.process_group = p2p->pg;
    q.expected = p2p->expected;
    q.torch_match_state = p2p->torch_match_state;
    for (const auto& [rank, text] : p2p->calls)
      if (rank >= 0 && std::size_t(rank) < q.per_rank_call.size()) q.per_rank_call[std::size_t(rank)] = text;
    q.summary = p2p->summary;
    if (r.kind == DivergenceKind::missing)
      q.summary += fmt::format("; so rank{} {} never reached collective seq {} of process group {} ({}), where the "
                               "others wait",
                               r.culprits.size() == 1 ? "" : "s", fmt::join(r.culprits, ", "), r.seq,
                               r.process_group, r.expected.empty() ? "-" : r.expected);
    if (p2p->culprit_entry) {
      const TorchFrDump& owner = *by_rank.at(p2p->culprit_rank);
      try {
        q.culprit_frames = !p2p->culprit_entry->frames.empty() || !owner.frames_of
                               ? p2p->culprit_entry->frames
                               : owner.frames_of(p2p->culprit_entry->index);
      } catch (const UsageError& err) {
        r.warnings.push_back(fmt::format("the culprit's frames are unreadable: {}", err.what()));
      }
    }
    q.warnings = std::move(r.warnings);
    r = std::move(q);
  }
  r.warnings.insert(r.warnings.end(), p2p_warnings.begin(), p2p_warnings.end());

  if (r.kind == DivergenceKind::none && !r.ranks_missing.empty()) {
    // The dumps present agree: if every one still waits in its newest call of a group, the group's
    // ranks without a dump are the ones they wait for (missing_dump.hpp)
    std::int64_t newest_ns = 0;
    for (const auto& [rank, d] : by_rank)
      for (const TorchFrEntry& e : d->entries) newest_ns = std::max(newest_ns, e.time_created_ns);
    for (const auto& pg_views : pgs) {
      std::vector<DumpWait> waits;
      for (const auto& [rank, v] : pg_views.second)
        if (!v.coll.empty()) waits.push_back(dump_wait(rank, *v.coll.back().e));
      if (name_missing_dumps(r, pg_views.first, waits, members_of(pg_views.first, pg_views.second), newest_ns)) break;
    }
  }
  if (r.kind == DivergenceKind::missing && r.pattern != "p2p cycle" && !r.culprits.empty())
    find_wait_cycle(r, pgs, members_of, by_rank, p2p_waits);
  {
    // The group the report is about: the divergent one, else the default
    // group ("0"), else the first.
    std::string pg = r.process_group;
    if (pg.empty() || !all_done_by_pg.count(pg)) pg = all_done_by_pg.count("0") ? "0" : "";
    if (pg.empty() && !all_done_by_pg.empty()) pg = all_done_by_pg.begin()->first;
    if (auto it = all_done_by_pg.find(pg); it != all_done_by_pg.end()) {
      r.last_all_completed_seq = it->second.first;
      r.last_all_completed = it->second.second;
      if (r.process_group.empty()) r.process_group = pg;
    }
    // each rank's last enqueued and completed collective in that group
    if (auto it = last_by_pg.find(pg); it != last_by_pg.end())
      for (const auto& [rank, ed] : it->second) {
        r.last_enqueued[std::size_t(rank)] = ed.first;
        r.last_completed[std::size_t(rank)] = ed.second;
      }
    // a p2p finding's seq is a p2p_seq_id: the table then counts each rank's p2p calls in its group
    if (use_p2p)
      if (auto it = pgs.find(r.process_group); it != pgs.end())
        for (const auto& [rank, v] : it->second) {
          std::int64_t enq = -1, done = -1;
          for (const TorchFrEntry* e : v.p2p) {
            enq = std::max(enq, e->p2p_seq_id);
            if (torch_fr_done(*e)) done = std::max(done, e->p2p_seq_id);
          }
          r.last_enqueued[std::size_t(rank)] = enq;
          r.last_completed[std::size_t(rank)] = done;
        }
  }
  if (r.kind == DivergenceKind::none) {
    // Every rank issued the same calls: the slowest arrival at any seq (the
    // earliest seq of the largest spread; at a seq, the highest rank of
    // those that came last).
    struct Arrival {
      std::int64_t seq, t;
      int rank;
    };
    std::vector<Arrival> arrivals;
    for (const auto& [pg, ranks_view] : pgs) {
      arrivals.clear();
      for (const auto& [rank, v] : ranks_view)
        for (const Row& x : v.coll)
          if (x.created > 0) arrivals.push_back({x.seq, x.created, rank});
      std::stable_sort(arrivals.begin(), arrivals.end(), [](const Arrival& a, const Arrival& b) { return a.seq < b.seq; });
      for (std::size_t i = 0; i < arrivals.size();) {
        std::int64_t first = arrivals[i].t, last = arrivals[i].t;
        int last_rank = arrivals[i].rank;
        std::size_t j = i + 1;
        for (; j < arrivals.size() && arrivals[j].seq == arrivals[i].seq; ++j) {
          first = std::min(first, arrivals[j].t);
          if (arrivals[j].t >= last) last_rank = arrivals[j].rank;
          last = std::max(last, arrivals[j].t);
        }
        const double lost = (double(last) - double(first)) / 1e6;
        if (lost > r.stall_lost_ms) {
          r.stall_lost_ms = lost;
          r.stall_seq = arrivals[i].seq;
          r.stall_rank = last_rank;
        }
        i = j;
      }
    }
    r.torch_match_state = "FULLY_MATCHED";
    if (!r.ranks_missing.empty()) {
      // fr_trace --allow-incomplete-ranks "cannot decide what's wrong with this collective entry because
      // we missed FR dumps from ranks ({1})" (tests/data/fr/dump-missing-*/fr_trace_pgfix_allow_incomplete.txt):
      // it never says FULLY_MATCHED here.
      const std::string set = "{" + fmt::format("{}", fmt::join(r.ranks_missing, ", ")) + "}";
      r.torch_match_state = fmt::format("cannot decide: dumps missing from ranks {}", set);
    }
    r.summary = fmt::format("{}{}{}", r.ranks_missing.empty() ? "every rank issued the same collectives"
                                                                : "the ranks with a dump issued the same collectives",
                            r.stall_lost_ms > 1.0 ? fmt::format("; slowest arrival rank {} at seq {}, {:.1f} ms after the first",
                                                                r.stall_rank, r.stall_seq, r.stall_lost_ms)
                                                  : std::string(),
                            r.ranks_missing.empty()
                                ? ""
                                : fmt::format("; no dump from rank{} {}: whether {} issued them is unknown (its "
                                              "log, or a dump written again, decides)",
                                              r.ranks_missing.size() == 1 ? "" : "s", rank_ranges(r.ranks_missing),
                                              r.ranks_missing.size() == 1 ? "it" : "they"));
    if (p2p_wide)
      r.torch_match_state += " for the collectives (fr_trace pairs p2p calls by collective_seq_id across the whole "
                             "group: on more than 2 ranks it reports matched sends and recvs as mismatches)";
    if (p2p_pairs > 0)
      r.summary += fmt::format("; every send met its recv in peer and order ({} pair{}), of equal sizes and dtypes",
                               p2p_pairs, p2p_pairs == 1 ? "" : "s");
  }
  return r;
}

}  // namespace sb
