#include "readers/torch_fr.hpp"

#include <algorithm>  // std::sort, std::max, std::min, std::count
#include <array>      // std::array: Sharer
#include <cctype>     // std::isdigit
#include <filesystem>  // std::filesystem::path: the file name
#include <map>        // std::map
#include <memory>     // std::shared_ptr: what frames_of reads from
#include <deque>      // std::deque
#include <charconv>  // std::from_chars: the ranks a p2p call names
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
#include "readers/pickle.hpp"  // PickleDoc, looks_like_pickle

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
  void str_into(std::string& out) const {
    if (!is_string()) fail(kind_error("a string"));
    out.assign(r_->str());
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
  // The member `key` found by id (PickleKeys::kAbsent: missing), as at(key) would give it.
  PVal member(const PickleDoc& doc, std::uint32_t id, std::string_view key) const {
    return PVal(id == PickleKeys::kAbsent ? std::nullopt : std::optional<PickleDoc::Ref>(PickleDoc::Ref(&doc, id)),
                *file_, this, key);
  }
  // Fails as at(key) does on a value that is not a dict.
  const PVal& dict() const {
    if (!r_ || !r_->is_dict()) fail(kind_error("a dict"));
    return *this;
  }
  const PickleDoc::Ref& ref() const { return *r_; }
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
// A string read into `out` (its buffer reused).
void str_into(const JsonRef& v, std::string& out) { out = v.str(); }
void str_into(const PVal& v, std::string& out) { v.str_into(out); }
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

// Equal values of a dump held once: a direct-mapped cache of the distinct
// values seen last (one hash and at most one comparison a lookup, whatever
// the file holds; a dump with many distinct values only shares fewer).
template <class T>
class Sharer {
 public:
  TorchFrShared<T> share(const T& v) {
    if (v.empty()) return {};
    const std::size_t h = hash(v);
    Slot& s = slots_[(h ^ (h >> 29) ^ (h >> 47)) % kSlots];  // (the high bits too: sizes differ there)
    if (!s.p || s.h != h || *s.p != v) {
      s.p = std::make_shared<const T>(v);
      s.h = h;
    }
    return TorchFrShared<T>(s.p);
  }

 private:
  static std::size_t mix(std::size_t h, std::size_t x) { return (h ^ x) * 0x100000001b3ull; }
  static std::size_t hash(const std::vector<std::vector<std::int64_t>>& v) {
    std::size_t h = 0xcbf29ce484222325ull;
    for (const auto& t : v) {
      h = mix(h, t.size());
      for (const std::int64_t d : t) h = mix(h, std::size_t(d));
    }
    return h;
  }
  static std::size_t hash(const std::vector<std::string>& v) {
    std::size_t h = 0xcbf29ce484222325ull;
    for (const auto& x : v) {
      h = mix(h, x.size());
      for (const char c : x) h = mix(h, static_cast<unsigned char>(c));
    }
    return h;
  }
  static constexpr std::size_t kSlots = 64;
  struct Slot {
    std::size_t h = 0;
    std::shared_ptr<const T> p;
  };
  std::array<Slot, kSlots> slots_;
};

// What one dump's entries share, and the buffers values are read into.
struct EntryValues {
  Sharer<std::vector<std::vector<std::int64_t>>> sizes;
  Sharer<std::vector<std::string>> dtypes;
  std::vector<std::vector<std::int64_t>> sizes_buf;
  std::vector<std::string> dtypes_buf;
};

template <class V>
TorchFrSizes sizes(const V& v, EntryValues& ev) {
  if (is_null(v)) return {};
  const std::size_t n = v.array().size();
  if (n > kMaxTensorsPerEntry) v.fail(fmt::format("{} tensors in one collective (at most {})", n, kMaxTensorsPerEntry));
  auto& out = ev.sizes_buf;  // its vectors' capacity is kept from entry to entry
  if (out.size() < n) out.resize(n);
  while (out.size() > n) out.pop_back();
  for (std::size_t i = 0; i < n; ++i) {
    const V t = v.at(i);
    const std::size_t nd = t.array().size();
    if (nd > kMaxDims) t.fail(fmt::format("{} dimensions (at most {})", nd, kMaxDims));
    spend(t, nd + 1);
    std::vector<std::int64_t>& dims = out[i];
    dims.clear();
    for (std::size_t k = 0; k < nd; ++k) dims.push_back(t.at(k).integer(0, std::int64_t(1) << 48));
  }
  return ev.sizes.share(out);
}

template <class V>
TorchFrDtypes strings(const V& v, EntryValues& ev) {
  if (is_null(v)) return {};
  const std::size_t n = v.array().size();
  if (n > kMaxTensorsPerEntry) v.fail(fmt::format("{} dtypes in one collective (at most {})", n, kMaxTensorsPerEntry));
  spend(v, n);
  auto& out = ev.dtypes_buf;
  if (out.size() < n) out.resize(n);
  while (out.size() > n) out.pop_back();
  for (std::size_t i = 0; i < n; ++i) str_into(v.at(i), out[i]);
  return ev.dtypes.share(out);
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

}  // namespace

bool is_torch_fr_json(const json& j) {
  // "entries" is absent from PyTorch's JSON when it is empty: its pg_config or pg_status then says what it is
  return j.is_object() && j.contains("version") && !j.contains("format") &&
         (j.contains("entries") || j.contains("pg_config") || j.contains("pg_status"));
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

// An entry's fields, in the order PyTorch writes them.
enum Field : std::uint8_t {
  kRecordId, kProcessGroup, kPgId, kCollectiveSeqId, kP2pSeqId, kOpId, kProfilingName, kTimeCreatedNs,
  kInputSizes, kInputDtypes, kOutputSizes, kOutputDtypes, kState, kTimeStartedNs, kTimeCompletedNs, kRetired,
  kTimeoutMs, kIsP2p, kDurationMs, kSeqId, kFieldCount
};
constexpr std::string_view kFieldNames[kFieldCount] = {
    "record_id", "process_group", "pg_id", "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name",
    "time_created_ns", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "state",
    "time_discovered_started_ns", "time_discovered_completed_ns", "retired", "timeout_ms", "is_p2p", "duration_ms",
    "seq_id"};  // the last: format 1.x (PyTorch 2.2-2.3) named the collective's seq seq_id

// An entry's fields by name: the JSON form's members looked up by name.
class JsonFields {
 public:
  explicit JsonFields(const JsonRef& e) : e_(e) {}
  JsonRef at(Field f) const { return e_.at(kFieldNames[f]); }
  std::optional<JsonRef> find(Field f) const { return e_.find(kFieldNames[f]); }

 private:
  const JsonRef& e_;
};

// A pickled entry's fields, read in one pass over its pairs (PickleKeys:
// the key strings are the document's shared values, resolved once).
class PickleFields {
 public:
  PickleFields(const PVal& e, const PickleDoc& doc, const PickleKeys& keys) : e_(e), doc_(doc) {
    keys.read(e.dict().ref(), ids_);
  }
  PVal at(Field f) const { return e_.member(doc_, ids_[f], kFieldNames[f]); }
  std::optional<PVal> find(Field f) const {
    if (ids_[f] == PickleKeys::kAbsent) return std::nullopt;
    return at(f);
  }

 private:
  const PVal& e_;
  const PickleDoc& doc_;
  std::uint32_t ids_[kFieldCount];
};

// fields(e): the entry e's fields (JsonFields, PickleFields).
template <class V, class MakeFields>
TorchFrDump torch_fr_from(const V& root, const std::string& path, int rank, MakeFields fields) {
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
  // PyTorch's JSON writer leaves "entries" out when there are none (an onlyActive dump, a rank that hung
  // before its first collective): a dump with no entries, not a file of another kind
  const auto has_entries = root.find("entries");
  if (!has_entries) return d;
  const V entries = *has_entries;
  d.entries.reserve(entries.array().size());
  EntryValues ev;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const V e = entries.at(i);
    spend(e, 24);  // the entry's own fields
    const auto f = fields(e);
    TorchFrEntry& x = d.entries.emplace_back();  // (d is dropped whole if a field throws)
    x.record_id = int_or_zero(f.at(kRecordId));
    if (auto pg = f.find(kProcessGroup)) {
      if (is_array(*pg) && pg->size() >= 1) {
        x.pg_name = pg->at(std::size_t(0)).str();
        if (pg->size() >= 2) x.pg_desc = pg->at(std::size_t(1)).str();
      } else {
        x.pg_name = pg->str();
      }
    } else if (auto pid = f.find(kPgId)) {
      x.pg_name = std::to_string(int_or_zero(*pid));
    }
    // collective_seq_id, or seq_id in a format 1.x dump (without either, every entry would read as seq 0
    // and one call per rank would be analysed: fr_trace refuses such a dump, and so does this)
    if (auto cs = f.find(kCollectiveSeqId)) x.collective_seq_id = int_or_zero(*cs);
    else if (auto sq = f.find(kSeqId)) x.collective_seq_id = int_or_zero(*sq);
    else
      throw UsageError(fmt::format("{}: entry {} has neither collective_seq_id nor seq_id: not a Flight Recorder "
                                   "dump this reader knows (format {})", path, i, d.version));
    if (auto p = f.find(kP2pSeqId)) x.p2p_seq_id = int_or_zero(*p);
    if (auto p = f.find(kOpId)) x.op_id = int_or_zero(*p);
    {
      const V pn = f.at(kProfilingName);
      x.profiling_name = is_null(pn) ? "" : pn.str();
    }
    x.time_created_ns = int_or_zero(f.at(kTimeCreatedNs));
    x.input_sizes = sizes(f.at(kInputSizes), ev);
    x.input_dtypes = strings(f.at(kInputDtypes), ev);
    x.output_sizes = sizes(f.at(kOutputSizes), ev);
    x.output_dtypes = strings(f.at(kOutputDtypes), ev);
    x.state = f.at(kState).str();
    if (auto t = f.find(kTimeStartedNs)) x.time_started_ns = int_or_zero(*t);
    if (auto t = f.find(kTimeCompletedNs)) x.time_completed_ns = int_or_zero(*t);
    if (auto t = f.find(kRetired); t && !is_null(*t)) x.retired = t->boolean();
    if (auto t = f.find(kTimeoutMs); t && !is_null(*t)) x.timeout_ms = int_or_zero(*t);
    if (auto p = f.find(kIsP2p); p && !is_null(*p)) x.is_p2p = p->boolean();
    if (auto t = f.find(kDurationMs); t && !is_null(*t)) x.duration_ms = t->number();  // NCCL only
    x.index = i;
  }
  return d;
}

}  // namespace

TorchFrDump torch_fr_from_json(json j, const std::string& path, int rank) {
  auto doc = std::make_shared<const json>(std::move(j));
  TorchFrDump d = torch_fr_from(JsonRef(*doc, path), path, rank, [](const JsonRef& e) { return JsonFields(e); });
  d.frames_of = [doc, path](std::size_t i) {
    return read_frames(JsonRef(*doc, path).at("entries").at(i));
  };
  return d;
}

namespace {

// What a thread reuses from one pickle to the next (the reader threads of
// a directory, and then the frames of the culprit read again): a dump's
// parse is ~30 MB of arena, which fresh each time is page faults.
struct ThreadArena {
  PickleScratch scratch;
  std::vector<std::uint8_t> keys;  // PickleKeys' buffer
};
ThreadArena& thread_arena() {
  thread_local ThreadArena arena;
  return arena;
}

}  // namespace

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
      ThreadArena& arena = thread_arena();
      const PickleDoc doc(*held, path, &arena.scratch);
      std::size_t budget = 8 * held->size() + (std::size_t(1) << 20);
      const PVal root(doc.root(), path, nullptr, {}, 0, &budget);
      if (!doc.root().is_dict() || !root.find("entries") || !root.find("version")) throw not_a_dump();
      const PickleKeys keys(doc, kFieldNames, kFieldCount, &arena.keys);
      d = torch_fr_from(root, path, rank, [&](const PVal& e) { return PickleFields(e, doc, keys); });
    }
    d.frames_of = [held, path](std::size_t i) {
      const PickleDoc doc(*held, path, &thread_arena().scratch);
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
}  // namespace sb
