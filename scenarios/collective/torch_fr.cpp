#include "scenarios/collective/torch_fr.hpp"

#include <algorithm>  // std::sort, std::max, std::min, std::count
#include <cctype>     // std::isdigit
#include <filesystem>  // std::filesystem::path: the file name
#include <map>        // std::map
#include <memory>     // std::shared_ptr: what frames_of reads from
#include <optional>   // std::optional
#include <set>        // std::set

#include <limits>     // std::numeric_limits

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/errors.hpp"       // UsageError
#include "harness/json_read.hpp"    // JsonRef, parse_json_text
#include "harness/pickle_read.hpp"  // PickleDoc, looks_like_pickle

namespace sb {

namespace {

using json = nlohmann::ordered_json;

// A value of a pickled dump with JsonRef's reading interface, so that one
// template reads both forms. Its path is built only for an error message.
class PVal {
 public:
  PVal(std::optional<PickleDoc::Ref> r, const std::string& file, const PVal* parent, std::string_view key,
       std::size_t index = 0, std::size_t* budget = nullptr)
      : r_(r), file_(&file), parent_(parent), key_(key), index_(index),
        budget_(budget ? budget : parent ? parent->budget_ : nullptr) {}
  bool present() const { return r_.has_value(); }
  // Values copied out of the document so far are charged here: one shared
  // (memoized) list can stand in a thousand places for two bytes each, so
  // what is copied is bounded by the file's size, not by each place's.
  void spend(std::size_t n) const {
    if (!budget_) return;
    if (n > *budget_) fail("the dump's shared values expand past what its size allows (a damaged or hostile file)");
    *budget_ -= n;
  }
  [[noreturn]] void fail(std::string_view detail) const {
    throw UsageError(fmt::format("{}: {}: {}", *file_, where(), detail));
  }
  std::string where() const {
    if (!parent_) return "the document";
    const std::string up = parent_->parent_ ? parent_->where() : "";
    return key_.empty() ? fmt::format("{}[{}]", up, index_) : up.empty() ? std::string(key_) : up + "." + std::string(key_);
  }
  bool is_null() const { return !r_ || r_->is_null(); }
  bool is_string() const { return r_ && r_->is_str(); }
  bool is_array() const { return r_ && r_->is_seq(); }
  std::string str() const {
    if (!is_string()) fail(kind_error("a string"));
    return std::string(r_->str());
  }
  std::int64_t integer(std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                       std::int64_t hi = std::numeric_limits<std::int64_t>::max()) const {
    if (!r_ || !r_->is_int()) fail(kind_error("an integer"));
    const std::int64_t v = r_->integer();
    if (v < lo || v > hi) fail(fmt::format("{} is outside {}..{}", v, lo, hi));
    return v;
  }
  int int32(int lo, int hi) const { return int(integer(lo, hi)); }
  bool boolean() const {
    if (!r_ || !r_->is_bool()) fail(kind_error("a boolean"));
    return r_->integer() != 0;
  }
  double number() const {
    if (r_ && r_->is_int()) return double(r_->integer());
    if (!r_ || !r_->is_real()) fail(kind_error("a number"));
    return r_->real();
  }
  const PVal& array() const {
    if (!is_array()) fail(kind_error("a list"));
    return *this;
  }
  std::size_t size() const {
    if (!r_ || (!r_->is_seq() && !r_->is_dict())) fail(kind_error("a list or a dict"));
    return r_->size();
  }
  PVal at(std::size_t i) const { return PVal(r_->at(i), *file_, this, {}, i); }
  PVal at(std::string_view key) const {
    if (!r_ || !r_->is_dict()) fail(kind_error("a dict"));
    return PVal(r_->find(key, &hint_), *file_, this, key);
  }
  std::optional<PVal> find(std::string_view key) const {
    if (!r_ || !r_->is_dict()) fail(kind_error("a dict"));
    auto v = r_->find(key, &hint_);
    if (!v) return std::nullopt;
    return PVal(v, *file_, this, key);
  }
  std::vector<std::pair<std::string, PVal>> members() const {
    if (!r_ || !r_->is_dict()) fail(kind_error("a dict"));
    std::vector<std::pair<std::string, PVal>> out;
    for (std::size_t i = 0; i < r_->size(); ++i) {
      const PickleDoc::Ref k = r_->key(i);
      std::string name = k.is_str() ? std::string(k.str()) : std::to_string(k.integer());
      out.emplace_back(name, PVal(r_->value(i), *file_, this, {}, i));
    }
    return out;
  }

 private:
  std::string kind_error(const char* want) const {
    return fmt::format("expected {}, got {}", want, !r_ ? "nothing: the field is missing" : "another type");
  }
  std::optional<PickleDoc::Ref> r_;
  const std::string* file_;
  const PVal* parent_;
  std::string_view key_;
  std::size_t index_;
  std::size_t* budget_;          // shared by the whole document (null: unbounded)
  mutable std::size_t hint_ = 0;  // where the next find starts (fields are read in about written order)
};

void spend(const JsonRef&, std::size_t) {}  // JSON shares nothing: its size bounds it already
void spend(const PVal& v, std::size_t n) { v.spend(n); }

bool is_null(const JsonRef& v) { return !v.present() || v.raw().is_null(); }
bool is_string(const JsonRef& v) { return v.present() && v.raw().is_string(); }
bool is_array(const JsonRef& v) { return v.present() && v.raw().is_array(); }
bool is_null(const PVal& v) { return v.is_null(); }
bool is_string(const PVal& v) { return v.is_string(); }
bool is_array(const PVal& v) { return v.is_array(); }

// A timestamp or counter the JSON form writes as 0 or a string where the
// pickle has None or an int: 0 for none.
template <class V>
std::int64_t int_or_zero(const V& v) {
  if (is_null(v)) return 0;
  if (is_string(v)) {
    const std::string s = v.str();
    try {
      std::size_t used = 0;
      const long long x = std::stoll(s, &used);
      if (used == s.size()) return x;
    } catch (const std::exception&) {
    }
    v.fail(fmt::format("expected an integer, got the string \"{}\"", s));
  }
  return v.integer();
}

// Bounds on what one entry may hold: a shared (memoized) list is copied
// where each entry uses it, and these keep that linear in the file.
constexpr std::size_t kMaxTensorsPerEntry = 4096, kMaxDims = 16, kMaxFrames = 64;
// More ranks than any job has run (as our own dumps' limit): a larger rank
// number in a dump or a file name is damage, not a job.
constexpr int kMaxRank = (1 << 20) - 1;

template <class V>
std::vector<std::vector<std::int64_t>> sizes(const V& v) {
  std::vector<std::vector<std::int64_t>> out;
  if (is_null(v)) return out;
  const std::size_t n = v.array().size();
  if (n > kMaxTensorsPerEntry) v.fail(fmt::format("{} tensors in one collective (at most {})", n, kMaxTensorsPerEntry));
  for (std::size_t i = 0; i < n; ++i) {
    const V t = v.at(i);
    const std::size_t nd = t.array().size();
    if (nd > kMaxDims) t.fail(fmt::format("{} dimensions (at most {})", nd, kMaxDims));
    spend(t, nd + 1);
    std::vector<std::int64_t> dims;
    for (std::size_t k = 0; k < nd; ++k) dims.push_back(t.at(k).integer(0, std::int64_t(1) << 48));
    out.push_back(std::move(dims));
  }
  return out;
}

template <class V>
std::vector<std::string> strings(const V& v) {
  std::vector<std::string> out;
  if (is_null(v)) return out;
  const std::size_t n = v.array().size();
  if (n > kMaxTensorsPerEntry) v.fail(fmt::format("{} dtypes in one collective (at most {})", n, kMaxTensorsPerEntry));
  spend(v, n);
  for (std::size_t i = 0; i < n; ++i) out.push_back(v.at(i).str());
  return out;
}

// "[0, 1, 2]" (how the dumps write a group's ranks) or a list of ints.
template <class V>
std::vector<int> rank_list(const V& v) {
  std::vector<int> out;
  if (is_array(v)) {
    spend(v, v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out.push_back(v.at(i).int32(0, kMaxRank));
  } else {
  const std::string s = v.str();
  std::int64_t cur = -1;
  for (char c : s) {
    if (std::isdigit(static_cast<unsigned char>(c))) {
      cur = (cur < 0 ? 0 : cur) * 10 + (c - '0');
      if (cur > kMaxRank) v.fail(fmt::format("a rank above {}", kMaxRank));
    } else if (c == ',' || c == ']') {
      if (cur >= 0) out.push_back(int(cur));
      cur = -1;
    } else if (c != '[' && c != ' ') {
      v.fail(fmt::format("expected a list of ranks like \"[0, 1]\", got \"{}\"", s));
    }
  }
  if (cur >= 0) out.push_back(int(cur));
  }
  // Sorted and unique: the lowest rank decides ties.
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

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

// The group size an all-gather's or reduce-scatter's sizes imply against
// its group: output numel = n x input numel (all-gather), input = n x output
// (reduce-scatter). false when the entry's own sizes contradict the group.
bool sizes_fit_group(const TorchFrEntry& e, std::size_t n) {
  if (e.input_sizes.empty() || e.output_sizes.empty()) return true;
  __int128 in = 0, out = 0;
  for (const auto& d : e.input_sizes) in += numel(d);
  for (const auto& d : e.output_sizes) out += numel(d);
  const std::string_view op = op_name(e.profiling_name);
  if (op.find("all_gather") != std::string::npos || op == "_allgather_base") return out == in * __int128(n);
  if (op.find("reduce_scatter") != std::string::npos) return in == out * __int128(n);
  return true;
}

}  // namespace

bool is_torch_fr_json(const json& j) {
  return j.is_object() && j.contains("entries") && j.contains("version") && !j.contains("format");
}

int rank_from_file_name(const std::string& path) {
  std::string name = std::filesystem::path(path).filename().string();
  for (const char* ext : {".json", ".pkl", ".pickle"})
    if (name.size() > std::string(ext).size() && name.ends_with(ext)) name.resize(name.size() - std::string(ext).size());
  std::size_t i = name.size();
  while (i > 0 && std::isdigit(static_cast<unsigned char>(name[i - 1]))) --i;
  if (i == name.size() || name.size() - i > 7) return -1;
  const int r = std::stoi(name.substr(i));
  return r > kMaxRank ? -1 : r;
}

namespace {

template <class V>
std::vector<std::string> read_frames(const V& entry) {
  std::vector<std::string> out;
  if (auto fr = entry.find("frames"); fr && is_array(*fr))
    for (std::size_t k = 0; k < std::min(fr->size(), kMaxFrames); ++k) {
      const V f = fr->at(k);
      spend(f, 3);
      out.push_back(fmt::format("{} ({}:{})", f.at("name").str(), f.at("filename").str(), int_or_zero(f.at("line"))));
    }
  return out;
}

template <class V>
TorchFrDump torch_fr_from(const V& root, const std::string& path, int rank) {
  TorchFrDump d;
  d.rank = rank;
  d.path = path;
  const V ver = root.at("version");
  d.version = is_string(ver) ? ver.str() : fmt::format("{}", ver.number());
  if (auto pgc = root.find("pg_config"))
    for (const auto& [key, g] : pgc->members()) {
      TorchFrDump::Group grp;
      grp.name = g.find("name") && !g.at("name").str().empty() ? g.at("name").str() : key;
      grp.desc = g.find("desc") ? g.at("desc").str() : "";
      grp.ranks = rank_list(g.at("ranks"));
      d.groups.push_back(std::move(grp));
    }
  const V entries = root.at("entries");
  d.entries.reserve(entries.array().size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const V e = entries.at(i);
    spend(e, 24);  // the entry's own fields
    TorchFrEntry x;
    x.record_id = int_or_zero(e.at("record_id"));
    if (auto pg = e.find("process_group")) {
      if (is_array(*pg) && pg->size() >= 1) {
        x.pg_name = pg->at(std::size_t(0)).str();
        if (pg->size() >= 2) x.pg_desc = pg->at(std::size_t(1)).str();
      } else {
        x.pg_name = pg->str();
      }
    } else if (auto pid = e.find("pg_id")) {
      x.pg_name = std::to_string(int_or_zero(*pid));
    }
    // In the order PyTorch writes the fields (the lookups start where the
    // previous one ended).
    x.collective_seq_id = int_or_zero(e.at("collective_seq_id"));
    if (auto p = e.find("p2p_seq_id")) x.p2p_seq_id = int_or_zero(*p);
    if (auto p = e.find("op_id")) x.op_id = int_or_zero(*p);
    x.profiling_name = is_null(e.at("profiling_name")) ? "" : e.at("profiling_name").str();
    x.time_created_ns = int_or_zero(e.at("time_created_ns"));
    x.input_sizes = sizes(e.at("input_sizes"));
    x.input_dtypes = strings(e.at("input_dtypes"));
    x.output_sizes = sizes(e.at("output_sizes"));
    x.output_dtypes = strings(e.at("output_dtypes"));
    x.state = e.at("state").str();
    if (auto t = e.find("time_discovered_started_ns")) x.time_started_ns = int_or_zero(*t);
    if (auto t = e.find("time_discovered_completed_ns")) x.time_completed_ns = int_or_zero(*t);
    if (auto t = e.find("retired"); t && !is_null(*t)) x.retired = t->boolean();
    if (auto t = e.find("timeout_ms"); t && !is_null(*t)) x.timeout_ms = int_or_zero(*t);
    if (auto p = e.find("is_p2p"); p && !is_null(*p)) x.is_p2p = p->boolean();
    if (auto t = e.find("duration_ms"); t && !is_null(*t)) x.duration_ms = t->number();  // NCCL only
    x.index = i;
    d.entries.push_back(std::move(x));
  }
  return d;
}

}  // namespace

TorchFrDump torch_fr_from_json(json j, const std::string& path, int rank) {
  auto doc = std::make_shared<const json>(std::move(j));
  TorchFrDump d = torch_fr_from(JsonRef(*doc, path), path, rank);
  d.frames_of = [doc, path](std::size_t i) {
    return read_frames(JsonRef(*doc, path).at("entries").at(i));
  };
  return d;
}

TorchFrDump read_torch_fr_file(const std::string& path, std::string bytes) {
  const int rank = rank_from_file_name(path);
  if (rank < 0) throw UsageError(fmt::format("{}: no rank number at the end of the file name (rank_0, rank_1, ...)", path));
  const auto not_a_dump = [&] {
    return UsageError(fmt::format("{}: not a PyTorch Flight Recorder dump (no version and entries)", path));
  };
  if (looks_like_pickle(bytes)) {
    // Read in place: a 20,000-entry dump is a million values. Only the bytes
    // are kept, for frames_of, which parses them again for the one dump
    // whose frames a report shows (tens of ms) rather than holding every
    // rank's parsed document (40 MB each at that size).
    auto held = std::make_shared<const std::string>(std::move(bytes));
    TorchFrDump d;
    {
      const PickleDoc doc(*held, path);
      std::size_t budget = 8 * held->size() + (std::size_t(1) << 20);
      const PVal root(doc.root(), path, nullptr, {}, 0, &budget);
      if (!doc.root().is_dict() || !root.find("entries") || !root.find("version")) throw not_a_dump();
      d = torch_fr_from(root, path, rank);
    }
    d.frames_of = [held, path](std::size_t i) {
      const PickleDoc doc(*held, path);
      std::size_t budget = 8 * held->size() + (std::size_t(1) << 20);
      const PVal r(doc.root(), path, nullptr, {}, 0, &budget);
      const PVal entries = r.at("entries");
      return read_frames(entries.at(i));
    };
    return d;
  }
  json j = parse_json_text(bytes, path);
  if (!is_torch_fr_json(j)) throw not_a_dump();
  return torch_fr_from_json(std::move(j), path, rank);
}

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
  std::map<std::string, std::vector<int>> group_ranks;
  for (const auto& [rank, d] : by_rank)
    for (const auto& g : d->groups)
      if (!group_ranks.count(g.name) || group_ranks[g.name].size() < g.ranks.size()) group_ranks[g.name] = g.ranks;
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

  // Collectives by process group, then rank, then seq (p2p calls apart).
  struct View {
    std::map<std::int64_t, const TorchFrEntry*> coll, p2p;
  };
  std::map<std::string, std::map<int, View>> pgs;
  for (const auto& [rank, d] : by_rank) {
    for (const auto& e : d->entries) {
      View& v = pgs[e.pg_name][rank];
      (e.is_p2p ? v.p2p[e.p2p_seq_id] : v.coll[e.collective_seq_id]) = &e;
    }
  }
  // Each rank's last enqueued and completed collective (default group first).
  for (const auto& [rank, d] : by_rank) {
    std::int64_t enq = -1, done = -1;
    for (const auto& e : d->entries) {
      if (e.is_p2p) continue;
      enq = std::max(enq, e.collective_seq_id);
      if (torch_fr_done(e)) done = std::max(done, e.collective_seq_id);
    }
    r.last_enqueued[std::size_t(rank)] = enq;
    r.last_completed[std::size_t(rank)] = done;
    if (!d->entries.empty()) r.where[std::size_t(rank)] = fmt::format("{} entries, last: {} ({})", d->entries.size(),
                                                                   d->entries.back().profiling_name, d->entries.back().state);
  }

  // Each present rank's entry at the seq being checked (null: none), by
  // rank, looked up once per seq: the checks below read it many times.
  std::vector<const TorchFrEntry*> at_seq(n, nullptr);
  // Per group: the last collective every rank completed (seq, description).
  std::map<std::string, std::pair<std::int64_t, std::string>> all_done_by_pg;
  // The first divergence in any group, in the order of checks.
  for (const auto& pg_views : pgs) {
    // (not a structured binding: lambdas below capture these, which clang before 16 refuses)
    const std::string& pg = pg_views.first;
    const auto& ranks_view = pg_views.second;
    // The group's ranks from pg_config; the default group (gloo's dumps key
    // its pg_config by "" while entries name it "0") is the whole job. Never
    // the ranks that happen to have a dump: a missing file must not shrink
    // the group an all-gather's sizes are checked against.
    std::vector<int> members = group_ranks.count(pg) ? group_ranks[pg] : std::vector<int>{};
    const std::string& desc = ranks_view.begin()->second.coll.empty()
                                  ? std::string()
                                  : ranks_view.begin()->second.coll.begin()->second->pg_desc;
    if (members.empty() && (pg == "0" || desc == "default_pg" || group_ranks.size() <= 1)) members = world;
    if (members.empty())
      for (const auto& [rank, v] : ranks_view) members.push_back(rank);
    std::vector<int> present;  // members with a dump
    for (int m : members)
      if (by_rank.count(m)) present.push_back(m);
    if (present.empty()) continue;
    auto view = [&](int rank) -> const View* {
      auto it = ranks_view.find(rank);
      return it == ranks_view.end() ? nullptr : &it->second;
    };
    // The window every present rank's ring still holds.
    std::int64_t lo = 0, hi = -1;
    for (int m : present) {
      const View* v = view(m);
      if (v && !v->coll.empty()) {
        lo = std::max(lo, v->coll.begin()->first);
        hi = std::max(hi, v->coll.rbegin()->first);
      }
    }
    // Last seq every rank of the group completed.
    std::int64_t all_done = hi;
    for (int m : present) {
      const View* v = view(m);
      std::int64_t done = -1;
      if (v)
        for (const auto& [seq, e] : v->coll)
          if (torch_fr_done(*e)) done = std::max(done, seq);
      all_done = std::min(all_done, done);
    }
    {
      std::string what;
      if (all_done >= 0)
        for (int m : present)
          if (const View* v = view(m); v && v->coll.count(all_done)) {
            what = describe(*v->coll.at(all_done));
            break;
          }
      all_done_by_pg[pg] = {all_done, what};
    }

    // Who differs from the majority by `same` at one seq; on a tie, those
    // who differ from the lowest rank. Groups are found by comparison, not
    // by formatting a key: this runs for every seq of every rank.
    auto minority = [&](std::int64_t seq, auto same) {
      std::vector<std::pair<const TorchFrEntry*, std::vector<int>>> groups;
      for (int m : present) {
        const TorchFrEntry* e = at_seq[std::size_t(m)];
        auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return same(*x.first, *e); });
        if (g == groups.end()) groups.push_back({e, {m}});
        else g->second.push_back(m);
      }
      if (groups.size() < 2) return std::vector<int>{};
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
    // Each rank's newest completed collective in this group.
    std::map<int, std::int64_t> max_done;
    for (int m : present) {
      std::int64_t done = std::numeric_limits<std::int64_t>::min();
      if (const View* v = view(m))
        for (auto it = v->coll.rbegin(); it != v->coll.rend(); ++it)
          if (torch_fr_done(*it->second)) {
            done = it->first;
            break;
          }
      max_done[m] = done;
    }
    // The seqs any rank holds in the window, in order (never a count from lo
    // to hi: a damaged dump's seq can be 2^62).
    std::set<std::int64_t> seqs;
    for (int m : present)
      if (const View* v = view(m))
        for (auto it = v->coll.lower_bound(lo); it != v->coll.end() && it->first <= hi; ++it) seqs.insert(it->first);
    for (const std::int64_t seq : seqs) {
      std::vector<int> have, lack;
      for (int m : present) {
        const View* v = view(m);
        const auto it = v ? v->coll.find(seq) : decltype(v->coll.end()){};
        const bool has = v && it != v->coll.end();
        at_seq[std::size_t(m)] = has ? it->second : nullptr;
        (has ? have : lack).push_back(m);
      }
      if (have.empty()) continue;
      DivergenceKind kind = DivergenceKind::none;
      std::vector<int> culprits;
      if (!lack.empty()) {
        kind = DivergenceKind::missing;
        culprits = lack;
      } else if (auto c = minority(seq, [](const TorchFrEntry& a, const TorchFrEntry& b) {
                   return op_name(a.profiling_name) == op_name(b.profiling_name);
                 });
                 !c.empty()) {
        kind = DivergenceKind::op;
        culprits = c;
      } else if (auto c = minority(seq, [](const TorchFrEntry& a, const TorchFrEntry& b) {
                   return a.input_sizes == b.input_sizes;
                 });
                 !c.empty()) {
        kind = DivergenceKind::count;
        culprits = c;
      } else if (std::vector<int> bad; [&] {
                   for (int m : present)
                     if (!sizes_fit_group(*at_seq[std::size_t(m)], members.size())) bad.push_back(m);
                   return !bad.empty();
                 }()) {
        kind = DivergenceKind::count;
        culprits = bad;
      } else if (auto c = minority(seq, [](const TorchFrEntry& a, const TorchFrEntry& b) {
                   return a.input_dtypes == b.input_dtypes && a.output_dtypes == b.output_dtypes;
                 });
                 !c.empty()) {
        kind = DivergenceKind::dtype;
        culprits = c;
        // An even split (two ranks, or a lost dump) has no majority: the odd
        // one out is then the side whose dtype its own earlier calls never used.
        std::vector<int> novel;
        for (int m : present) {
          const View* v = view(m);
          const auto& mine = v->coll.at(seq)->input_dtypes;
          bool seen = false;
          for (auto it = v->coll.begin(); it != v->coll.end() && it->first < seq && !seen; ++it)
            seen = it->second->input_dtypes == mine;
          if (!seen) novel.push_back(m);
        }
        if (!novel.empty() && novel.size() < present.size() && 2 * c.size() >= present.size()) culprits = novel;
      } else {
        // Same call everywhere: the ranks least far along with it, when not
        // all agree. A group's collectives complete in order on a rank, so a
        // later completed call means this one completed too.
        auto state_of = [&](int m) {
          return seq <= max_done.at(m) ? 2 : state_rank(*at_seq[std::size_t(m)]);
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
        if (const View* v = view(m); v && v->coll.count(seq))
          r.per_rank_call[std::size_t(m)] = describe(*v->coll.at(seq)) + " " + v->coll.at(seq)->state +
                                            (v->coll.at(seq)->retired ? " (retired)" : "");
      // What the others issued there: the first rank not among the culprits.
      for (int m : have)
        if (std::find(culprits.begin(), culprits.end(), m) == culprits.end()) {
          r.expected = describe(*view(m)->coll.at(seq));
          break;
        }
      // A rank that skipped a call shows, at this seq, what the others issue at seq+1.
      if ((kind == DivergenceKind::op || kind == DivergenceKind::count || kind == DivergenceKind::dtype) &&
          seq < std::numeric_limits<std::int64_t>::max()) {
        const int c0 = culprits.front();
        for (int m : have)
          if (std::find(culprits.begin(), culprits.end(), m) == culprits.end()) {
            const View* v = view(m);
            if (v->coll.count(seq + 1) &&
                describe(*v->coll.at(seq + 1)) == describe(*view(c0)->coll.at(seq)))
              r.pattern = "skip";
            break;
          }
      }
      if (const View* v = view(culprits.front()); v && v->coll.count(seq)) {
        const TorchFrEntry& e = *v->coll.at(seq);
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
      break;
    }
    if (r.kind != DivergenceKind::none) break;
  }

  if (r.kind == DivergenceKind::none && !r.ranks_missing.empty()) {
    // The dumps present agree, but every one of them still waits in its
    // newest call: the ranks without a dump are the ones they wait for (a
    // crashed or killed rank writes none).
    for (const auto& pg_views : pgs) {
      std::int64_t newest = -1;
      bool all_waiting = true, any = false;
      for (const auto& [rank, v] : pg_views.second) {
        if (v.coll.empty()) continue;
        any = true;
        const TorchFrEntry& e = *v.coll.rbegin()->second;
        if (newest < 0) newest = e.collective_seq_id;
        all_waiting = all_waiting && !torch_fr_done(e) && e.collective_seq_id == newest;
      }
      if (!any || !all_waiting) continue;
      r.kind = DivergenceKind::missing;
      r.pattern = "no dump";
      r.seq = newest;
      r.culprits = r.ranks_missing;
      r.process_group = pg_views.first;
      r.torch_match_state = "not all ranks joining the collective";
      for (const auto& [rank, v] : pg_views.second)
        if (!v.coll.empty()) {
          r.expected = describe(*v.coll.rbegin()->second);
          break;
        }
      for (const auto& [rank, v] : pg_views.second)
        if (!v.coll.empty()) r.per_rank_call[std::size_t(rank)] = describe(*v.coll.rbegin()->second) + " waiting";
      r.summary = fmt::format("process group {} collective seq {}: every rank with a dump waits in it ({}); "
                              "rank{} {} left no dump and never completed it",
                              pg_views.first, newest, r.expected, r.ranks_missing.size() == 1 ? "" : "s",
                              rank_ranges(r.ranks_missing));
      break;
    }
  }
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
  }
  if (r.kind == DivergenceKind::none) {
    // Every rank issued the same calls: the slowest arrival at any seq.
    for (const auto& [pg, ranks_view] : pgs) {
      std::map<std::int64_t, std::pair<std::int64_t, std::int64_t>> span;  // seq -> (min, max) created
      std::map<std::int64_t, int> last_rank;
      for (const auto& [rank, v] : ranks_view)
        for (const auto& [seq, e] : v.coll) {
          if (e->time_created_ns <= 0) continue;
          auto [it, fresh] = span.try_emplace(seq, e->time_created_ns, e->time_created_ns);
          it->second.first = std::min(it->second.first, e->time_created_ns);
          if (fresh || e->time_created_ns >= it->second.second) last_rank[seq] = rank;
          it->second.second = std::max(it->second.second, e->time_created_ns);
        }
      for (const auto& [seq, mm] : span) {
        const double lost = (double(mm.second) - double(mm.first)) / 1e6;
        if (lost > r.stall_lost_ms) {
          r.stall_lost_ms = lost;
          r.stall_seq = seq;
          r.stall_rank = last_rank[seq];
        }
      }
    }
    r.torch_match_state = "FULLY_MATCHED";
    r.summary = fmt::format("every rank issued the same collectives{}{}", 
                            r.stall_lost_ms > 1.0 ? fmt::format("; slowest arrival rank {} at seq {}, {:.1f} ms after the first",
                                                                r.stall_rank, r.stall_seq, r.stall_lost_ms)
                                                  : std::string(),
                            r.ranks_missing.empty() ? "" : fmt::format("; no dump from rank{} {}",
                                                                       r.ranks_missing.size() == 1 ? "" : "s",
                                                                       rank_ranges(r.ranks_missing)));
  }
  return r;
}

}  // namespace sb
