// The Kineto trace reader (what and why in kineto.hpp). simdjson.h is large:
// this is the only translation unit that includes it.
#include "readers/kineto.hpp"

#include <fcntl.h>     // open
#include <sys/stat.h>  // fstat
#include <unistd.h>    // close
#include <zlib.h>      // gzdopen, gzread

#include <algorithm>      // std::min
#include <array>          // std::array
#include <charconv>       // std::from_chars
#include <cmath>          // std::isfinite
#include <cstring>        // std::memmove
#include <string_view>    // std::string_view
#include <system_error>   // std::errc
#include <unordered_map>  // std::unordered_map

#include <fmt/format.h>  // fmt::format
#include <simdjson.h>    // simdjson::ondemand

#include "harness/errors.hpp"  // UsageError

namespace sb::readers {
namespace {

using json = nlohmann::ordered_json;
namespace od = simdjson::ondemand;

// One value (an event, a top-level field) larger than this is not a trace.
constexpr std::size_t kMaxValueBytes = std::size_t(256) << 20;
constexpr std::size_t kChunk = std::size_t(4) << 20;
// batch() parses at least this much at once, else the exact path reads on.
constexpr std::size_t kMinBatch = std::size_t(64) << 10;
// Brackets nested deeper than this are not a trace (simdjson's default
// limit; nlohmann's copy of a top-level value recurses once a level).
constexpr int kMaxDepth = 1024;

// The bytes that matter to the value scanner outside strings.
constexpr auto kStructural = [] {
  std::array<bool, 256> t{};
  for (unsigned char c : {'"', '{', '}', '[', ']'}) t[c] = true;
  return t;
}();

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

Cat cat_of(std::string_view c) {
  switch (c.size()) {
    case 6:
      if (c == "kernel") return Cat::kernel;
      if (c == "Kernel") return Cat::kernel;  // some ROCm traces, and the Kineto of 2021
      if (c == "cpu_op") return Cat::cpu_op;
      if (c == "Memcpy") return Cat::gpu_memcpy;  // the Kineto of 2021
      if (c == "Memset") return Cat::gpu_memset;
      break;
    case 7:
      if (c == "Runtime") return Cat::cuda_runtime;  // the Kineto of 2021
      break;
    case 8:
      if (c == "Operator") return Cat::cpu_op;  // the Kineto of 2021: ProfilerStep#N and __next__ too
      break;
    case 9:
      if (c == "cuda_sync") return Cat::cuda_sync;
      break;
    case 10:
      if (c == "gpu_memcpy") return Cat::gpu_memcpy;
      if (c == "gpu_memset") return Cat::gpu_memset;
      break;
    case 11:
      if (c == "cuda_driver") return Cat::cuda_driver;
      break;
    case 12:
      if (c == "cuda_runtime") return Cat::cuda_runtime;
      break;
    case 15:
      if (c == "user_annotation") return Cat::user_annotation;
      if (c == "python_function") return Cat::python_function;
      break;
    case 19:
      if (c == "gpu_user_annotation") return Cat::gpu_user_annotation;
      break;
    default:
      break;
  }
  return Cat::other;
}

void copy_kind(std::string_view name, Event& e) {
  if (name.find("HtoD") != std::string_view::npos) e.copy = CopyKind::htod;
  else if (name.find("DtoH") != std::string_view::npos) e.copy = CopyKind::dtoh;
  else if (name.find("DtoD") != std::string_view::npos) e.copy = CopyKind::dtod;
  else if (name.find("HtoH") != std::string_view::npos) e.copy = CopyKind::htoh;
  else e.copy = CopyKind::other;
  e.pageable = name.find("Pageable") != std::string_view::npos;
  e.pinned = name.find("Pinned") != std::string_view::npos;
}

// Where the bytes come from: a gzip stream (zlib reads a plain file as it is) or memory.
class Source {
 public:
  explicit Source(const std::string& text) : text_(&text) {}
  explicit Source(gzFile f) : gz_(f) {}
  ~Source() {
    if (gz_) gzclose(gz_);
  }
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;
  // Up to n bytes into dst; 0 at the end, or after a damaged gzip stream
  // (error() then says what is wrong).
  std::size_t read(char* dst, std::size_t n) {
    if (text_) {
      const std::size_t k = std::min(n, text_->size() - at_);
      std::memcpy(dst, text_->data() + at_, k);
      at_ += k;
      return k;
    }
    const int k = gzread(gz_, dst, unsigned(std::min<std::size_t>(n, 1u << 30)));
    int code = Z_OK;
    const char* msg = k <= 0 ? gzerror(gz_, &code) : nullptr;
    // gzread gives 0, not -1, for a stream cut short (Z_BUF_ERROR,
    // "unexpected end of file"): what it inflated so far may even be whole
    // JSON, but the file is damaged.
    if (k < 0 || (k == 0 && code != Z_OK)) {
      error_ = msg && *msg ? msg : "read error";
      return 0;
    }
    return std::size_t(k);
  }
  const std::string& error() const { return error_; }
  bool gzip() const { return gz_ && gzdirect(gz_) == 0; }

 private:
  const std::string* text_ = nullptr;
  std::size_t at_ = 0;
  gzFile gz_ = nullptr;
  std::string error_;
};

// record_shapes=True's arrays, read as far as they are what they should be: "Input Dims" a list of lists of
// integers ([[32, 3, 224, 224], [64, 3, 7, 7], [], ...]), "Input type" and "Concrete Inputs" lists of strings.
// At most 32 inputs of at most 8 dims: anything else ends the read, what was read so far stays.
void shape_dims(od::value v, OpShape& s) {
  od::array arr;
  if (v.get_array().get(arr)) return;
  for (auto x : arr) {
    if (s.dims.size() >= 32) return;
    od::array inner;
    std::vector<std::int64_t> d;
    if (x.get_array().get(inner)) {
      s.dims.push_back({});  // a nested list (TensorList) or a scalar: no dims of its own
      continue;
    }
    for (auto y : inner) {
      std::int64_t i = 0;
      if (y.get_int64().get(i) || d.size() >= 8) {
        d.clear();
        break;
      }
      d.push_back(i);
    }
    s.dims.push_back(std::move(d));
  }
}
void shape_strings(od::value v, std::vector<std::string>& out) {
  od::array arr;
  if (v.get_array().get(arr)) return;
  for (auto x : arr) {
    if (out.size() >= 32) return;
    std::string_view sv;
    out.emplace_back(x.get_string().get(sv) ? std::string_view() : sv);
  }
}
void shape_types(od::value v, OpShape& s) {
  std::vector<std::string> t;
  shape_strings(v, t);
  for (const auto& x : t) s.types.push_back(elem_type(x));
}
void shape_concrete(od::value v, OpShape& s) { shape_strings(v, s.concrete); }

class Reader {
 public:
  Reader(Source& src, std::string what, Trace& out, const ReadOptions& opt)
      : src_(src), what_(std::move(what)), t_(out), opt_(opt) {
    buf_.resize(kChunk + simdjson::SIMDJSON_PADDING);
  }

  void run() {
    ws();
    const char c = peek();
    if (c == '[') {  // the Chrome trace format's other form: a bare array of events
      ++pos_;
      events();
    } else if (c == '{') {
      ++pos_;
      object();
      // An object without the field is some other JSON (a stallbench result, a config): read
      // as a trace it would say "none of the rules fired", a clean bill of health.
      if (!saw_events_) fail("the top-level object has no traceEvents field (a PyTorch profiler trace has one)", 0);
    } else {
      fail(at_end() ? "empty: no JSON in it" : "not a trace: it starts with neither '{' nor '['");
    }
    ws();
    if (!at_end()) fail("text after the end of the trace's JSON");
    t_.json_bytes = consumed_ + len_;
  }

 private:
  Source& src_;
  std::string what_;
  Trace& t_;
  ReadOptions opt_;
  std::vector<char> buf_;
  std::size_t pos_ = 0, len_ = 0;
  std::uint64_t consumed_ = 0;  // bytes dropped before buf_[0]
  bool saw_events_ = false;     // the top-level object had traceEvents
  // A batch that failed ended here (an offset in the JSON text): the exact
  // path reads up to it before batch() tries again.
  std::uint64_t exact_until_ = 0;
  bool eof_ = false;
  od::parser parser_;
  std::unordered_map<std::string, std::uint32_t, StringHash, std::equal_to<>> name_ids_;
  std::unordered_map<std::string, std::int64_t, StringHash, std::equal_to<>> string_ids_;  // string pid/tid
  std::map<std::string, std::int64_t, std::less<>> cats_;
  std::array<std::int64_t, 256> phase1_{};  // one-letter phases, counted without a string

  [[noreturn]] void fail(const std::string& why, std::uint64_t at) const {
    throw UsageError(fmt::format("{}: not a Kineto trace at byte {}: {}", what_, at, why));
  }
  [[noreturn]] void fail(const std::string& why) const { fail(why, consumed_ + pos_); }

  // Reads more, keeping buf_[keep..len_); returns false at the end of input.
  bool more(std::size_t& keep) {
    if (eof_) return false;
    if (keep > 0) --keep;  // one byte before what is kept stays: batch() writes its '[' there
    if (keep > 0) {
      std::memmove(buf_.data(), buf_.data() + keep, len_ - keep);
      consumed_ += keep;
      len_ -= keep;
      pos_ -= keep;
      keep = 0;
    }
    if (buf_.size() - simdjson::SIMDJSON_PADDING - len_ < kChunk / 2) {
      if (len_ > kMaxValueBytes) fail(fmt::format("one value longer than {} MiB", kMaxValueBytes >> 20));
      buf_.resize(buf_.size() * 2);
    }
    const std::size_t k = src_.read(buf_.data() + len_, buf_.size() - simdjson::SIMDJSON_PADDING - len_);
    if (k == 0) {
      if (!src_.error().empty()) fail("the gzip stream is damaged: " + src_.error(), consumed_ + len_);
      eof_ = true;
      return false;
    }
    len_ += k;
    return true;
  }
  // The byte at pos_, 0 at the end of the input (and for a NUL byte: at_end() tells them apart).
  char peek() {
    if (pos_ >= len_) {
      std::size_t keep = pos_;
      if (!more(keep)) return 0;
    }
    return buf_[pos_];
  }
  bool at_end() { return peek() == 0 && pos_ >= len_; }
  void ws() {
    for (;;) {
      const char c = peek();
      if (c == ' ' || c == '\n' || c == '\r' || c == '\t') ++pos_;
      else return;
    }
  }
  void expect(char c, const char* where) {
    ws();
    if (peek() != c) fail(fmt::format("expected '{}' {}", c, where));
    ++pos_;
  }

  // The extent of the value at pos_: [begin, end) in buf_ after the call
  // (buf_ may move while it is read). Strings and brackets only: the parser
  // checks the rest.
  std::pair<std::size_t, std::size_t> value() {
    ws();
    const char first = peek();
    if (first == 0 && pos_ >= len_) fail("the file ends inside the trace");
    std::size_t i = pos_;  // the value starts at pos_, which more() keeps in the buffer
    int depth = 0;
    bool in_str = false;
    const bool scalar = first != '{' && first != '[' && first != '"';
    for (;;) {
      if (i >= len_) {
        const std::size_t off = i - pos_;
        std::size_t keep = pos_;
        const bool got = more(keep);  // moves pos_ when it drops bytes
        i = pos_ + off;
        if (!got) {
          if (scalar) return {pos_, i};
          fail("the file ends inside a value", consumed_ + pos_);
        }
        continue;
      }
      if (in_str) {
        // to the next quote; it ends the string unless an odd run of backslashes precedes it
        const void* q = std::memchr(buf_.data() + i, '"', len_ - i);
        if (!q) {
          i = len_;
          continue;
        }
        std::size_t k = std::size_t(static_cast<const char*>(q) - buf_.data());
        std::size_t bs = 0;
        while (buf_[k - 1 - bs] == '\\') ++bs;  // stops at the opening quote at the latest
        i = k + 1;
        if (bs % 2 == 0) {
          in_str = false;
          if (depth == 0) return {pos_, i};
        }
        continue;
      }
      const char c = buf_[i];
      if (scalar) {
        if (c == ',' || c == '}' || c == ']' || c == ' ' || c == '\n' || c == '\r' || c == '\t') return {pos_, i};
        ++i;
        continue;
      }
      if (!kStructural[static_cast<unsigned char>(c)]) {
        ++i;
        continue;
      }
      if (c == '"') {
        in_str = true;
      } else if (c == '{' || c == '[') {
        if (++depth > kMaxDepth) fail(fmt::format("brackets nested deeper than {}", kMaxDepth), consumed_ + i);
      } else if (--depth == 0) {
        return {pos_, i + 1};
      } else if (depth < 0) {
        fail("unbalanced brackets", consumed_ + i);
      }
      ++i;
    }
  }

  void object() {
    bool first = true;
    for (;;) {
      ws();
      if (peek() == '}') {
        ++pos_;
        return;
      }
      if (!first) expect(',', "between the trace's fields");
      first = false;
      auto [kb, ke] = value();
      if (buf_[kb] != '"') fail("a field name must be a string", consumed_ + kb);
      const std::string key(buf_.data() + kb + 1, ke - kb - 2);
      pos_ = ke;
      expect(':', "after a field name");
      ws();
      if (key == "traceEvents") {
        if (peek() != '[') fail("traceEvents is not an array");
        saw_events_ = true;
        ++pos_;
        events();
        continue;
      }
      auto [vb, ve] = value();
      // value() checks strings and brackets only: a scalar (a number, true,
      // false, null) is checked here, and "x": } (no value at all) refused.
      if (vb == ve) fail("the field " + key + " has no value", consumed_ + vb);
      if (buf_[vb] != '{' && buf_[vb] != '[' && buf_[vb] != '"' && !json::accept(buf_.data() + vb, buf_.data() + ve))
        fail("the value of " + key + " is not JSON", consumed_ + vb);
      if (key == "deviceProperties" || key == "distributedInfo" || key == "baseTimeNanoseconds") {
        const std::uint64_t at = consumed_ + vb;
        const json v = json::parse(buf_.data() + vb, buf_.data() + ve, nullptr, false);
        if (v.is_discarded()) fail("the value of " + key + " is not JSON", at);
        top_level(key, v);
      }
      pos_ = ve;
    }
  }

  void top_level(const std::string& key, const json& v) {
    if (key == "deviceProperties" && v.is_array()) t_.device_properties = v;
    if (key == "baseTimeNanoseconds" && v.is_number_integer()) t_.base_time_ns = v.get<std::int64_t>();
    if (key == "distributedInfo" && v.is_object()) {
      if (v.contains("rank") && v["rank"].is_number_integer()) t_.rank = v["rank"].get<std::int64_t>();
      if (v.contains("world_size") && v["world_size"].is_number_integer())
        t_.world_size = v["world_size"].get<std::int64_t>();
      if (v.contains("backend") && v["backend"].is_string()) t_.distributed_backend = v["backend"].get<std::string>();
    }
  }

  void events() {
    bool first = true;
    for (;;) {
      ws();
      const char c = peek();
      if (c == ']') {
        ++pos_;
        break;
      }
      if (c == 0 && pos_ >= len_) fail("the file ends inside traceEvents");
      if (!first) {
        if (c != ',') fail("expected ',' between events");
        ++pos_;
        ws();
      }
      first = false;
      if (batch()) continue;
      auto [b, e] = value();
      if (buf_[b] != '{') fail("an event is not an object", consumed_ + b);
      event(b, e);
      pos_ = e;
    }
    for (auto& [k, n] : cats_) t_.category_counts[k] += n;
    cats_.clear();
    for (std::size_t c = 0; c < phase1_.size(); ++c)
      if (phase1_[c]) t_.phase_counts[std::string(1, char(c))] += phase1_[c];
    phase1_.fill(0);
  }

  std::int64_t id_of(od::value v) {
    od::json_type ty;
    if (v.type().get(ty)) return 0;
    if (ty == od::json_type::number) {
      std::int64_t i = 0;
      if (!v.get_int64().get(i)) return i;
      double d = 0;
      if (!v.get_double().get(d)) return in_int64(d) ? std::int64_t(d) : 0;
      return 0;
    }
    if (ty == od::json_type::string) {
      std::string_view s;
      if (v.get_string().get(s)) return 0;
      auto it = string_ids_.find(s);
      if (it != string_ids_.end()) return it->second;
      const std::int64_t id = -1000 - std::int64_t(string_ids_.size());  // apart from real ids
      string_ids_.emplace(std::string(s), id);
      return id;
    }
    return 0;
  }
  // Whether a double converts to int64 (finite, inside its range): an id or count written as 1e65 is none.
  static bool in_int64(double d) { return d > -9.2e18 && d < 9.2e18; }
  static bool number(od::value v, double& out) {
    double d = 0;
    if (v.get_double().get(d)) return false;
    out = d;
    return true;
  }
  // The first element of an "Input type" array that names a tensor's element type ("" and "Scalar",
  // "TensorList", ... name none); anything but an array of strings reads as none.
  static ElemType first_elem_type(od::value v) {
    od::array arr;
    if (v.get_array().get(arr)) return ElemType::none;
    for (auto x : arr) {
      std::string_view s;
      if (x.get_string().get(s)) return ElemType::none;
      if (const ElemType e = elem_type(s); e != ElemType::none) return e;
    }
    return ElemType::none;
  }
  static bool integer(od::value v, std::int64_t& out) {
    std::int64_t i = 0;
    if (!v.get_int64().get(i)) {
      out = i;
      return true;
    }
    double d = 0;
    if (!v.get_double().get(d)) {
      if (!in_int64(d)) return false;  // 1e65, NaN: no integer (the cast would be undefined)
      out = std::int64_t(d);
      return true;
    }
    // a decimal string ("stream": "7"), which HTA reads with int() as well
    std::string_view sv;
    std::int64_t x = 0;
    if (!v.get_string().get(sv) && !sv.empty() && sv.front() != '-') {
      const auto [end, ec] = std::from_chars(sv.data(), sv.data() + sv.size(), x);
      if (ec == std::errc() && end == sv.data() + sv.size()) {
        out = x;
        return true;
      }
    }
    return false;
  }

  void event(std::size_t b, std::size_t e) {
    const std::uint64_t at = consumed_ + b;
    od::document doc;
    if (parser_.iterate(simdjson::padded_string_view(buf_.data() + b, e - b, buf_.size() - b)).get(doc))
      fail("an event is not JSON", at);
    od::object obj;
    if (doc.get_object().get(obj)) fail("an event is not a JSON object", at);
    fields(obj, at);
  }

  // The fast path: the events from pos_ up to the last event boundary in the
  // buffer, parsed as one array (simdjson indexes it in one pass). A boundary
  // is found by its look ("}" "," "{" with whitespace between), which a
  // string could imitate: any failure undoes the batch and the exact path
  // (value() then event(), one at a time) reads the same bytes and reports
  // what is wrong where. Returns false when it read nothing.
  bool batch() {
    if (pos_ == 0 || buf_[pos_] != '{' || consumed_ + pos_ <= exact_until_) return false;
    auto is_ws = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
    std::size_t open = len_;  // the '{' of the last event that starts in the buffer
    std::size_t comma = 0, close = 0;
    while (open > pos_ + kMinBatch) {
      const void* q = memrchr(buf_.data() + pos_, '{', open - pos_);
      if (!q) return false;
      open = std::size_t(static_cast<const char*>(q) - buf_.data());
      std::size_t k = open;
      while (k > pos_ && is_ws(buf_[k - 1])) --k;
      if (k <= pos_ || buf_[k - 1] != ',') continue;
      comma = k - 1;
      while (k > pos_ + 1 && is_ws(buf_[k - 2])) --k;
      if (buf_[k - 2] != '}') continue;
      close = k - 2;
      break;
    }
    if (close == 0) return false;
    const std::size_t begin = pos_ - 1;
    const char saved = buf_[begin];
    buf_[begin] = '[';
    buf_[comma] = ']';
    const std::size_t n_events = t_.events.size(), n_memory = t_.memory.size(), n_names = t_.names.size();
    const auto cats = cats_;
    const auto phases = phase1_;
    const auto long_phases = t_.phase_counts;  // fields() counts phases of other lengths there
    const std::int64_t flows = t_.flows;
    const bool fractional_ts = t_.fractional_ts;
    bool ok = true;
    try {
      od::document doc;
      od::array arr;
      if (parser_.iterate(simdjson::padded_string_view(buf_.data() + begin, comma + 1 - begin, buf_.size() - begin))
              .get(doc) ||
          doc.get_array().get(arr))
        ok = false;
      if (ok)
        for (auto el : arr) {
          od::object obj;
          if (el.get_object().get(obj)) {
            ok = false;
            break;
          }
          fields(obj, consumed_ + pos_);
        }
      // The array must end where the batch does: a "}, {" after the end of
      // traceEvents (in "samples": [{...}, {...}], deviceProperties placed
      // last) closes the array early, and what follows it is not events.
      const char* rest = nullptr;
      if (ok && doc.current_location().get(rest) != simdjson::OUT_OF_BOUNDS) ok = false;
    } catch (const UsageError&) {
      ok = false;
    }
    buf_[begin] = saved;
    buf_[comma] = ',';
    if (!ok) {
      t_.events.resize(n_events);
      t_.memory.resize(n_memory);
      for (std::size_t i = n_names; i < t_.names.size(); ++i) name_ids_.erase(t_.names[i]);
      t_.names.resize(n_names);
      cats_ = cats;
      phase1_ = phases;
      t_.phase_counts = long_phases;
      t_.flows = flows;
      t_.fractional_ts = fractional_ts;
      // Not again before the exact path has passed this boundary: retried at
      // every event, each try parsing to the same look-alike, a chunk cost
      // O(events x chunk) (seconds to minutes for 4 MiB).
      exact_until_ = consumed_ + close;
      return false;
    }
    pos_ = close + 1;
    return true;
  }

  void fields(od::object obj, std::uint64_t at) {
    Event ev;
    std::string_view ph, cat, name;
    bool has_ts = false, has_dur = false, has_cat = false;
    std::int64_t mem_device = -2, mem_type = -1, total_alloc = -1, total_reserved = -1, mem_limit = 0;
    OpShape shape;  // read for the ops counted_op() names only (or before the name is known)
    bool has_shape = false;
    for (auto field : obj) {
      std::string_view k;
      if (field.unescaped_key().get(k)) fail("an event's field name is not a string", at);
      od::value v;
      if (field.value().get(v)) fail("an event's field has no value", at);
      if (k == "ph") {
        if (v.get_string().get(ph)) fail("\"ph\" is not a string", at);
      } else if (k == "cat") {
        if (v.get_string().get(cat)) fail("\"cat\" is not a string", at);
        has_cat = true;
      } else if (k == "name") {
        if (v.get_string().get(name)) name = {};
      } else if (k == "ts") {
        std::int64_t i = 0;
        if (!v.get_int64().get(i)) ev.ts = double(i);
        else if (number(v, ev.ts)) t_.fractional_ts = true;
        else fail("\"ts\" is not a number", at);
        has_ts = true;
      } else if (k == "dur") {
        if (!number(v, ev.dur)) fail("\"dur\" is not a number", at);
        has_dur = true;
      } else if (k == "pid") {
        ev.pid = id_of(v);
      } else if (k == "tid") {
        ev.tid = id_of(v);
      } else if (k == "args") {
        od::object args;
        if (v.get_object().get(args)) continue;
        for (auto a : args) {
          std::string_view ak;
          if (a.unescaped_key().get(ak)) fail("an args field name is not a string", at);
          od::value av;
          if (a.value().get(av)) fail("an args field has no value", at);
          if (ak == "correlation") integer(av, ev.correlation);
          else if (ak == "stream") integer(av, ev.stream);
          else if (ak == "bytes") integer(av, ev.bytes);
          else if (ak == "External id") integer(av, ev.external_id);
          else if (ak == "Sequence number") integer(av, ev.sequence);
          else if (ak == "Device Id") integer(av, mem_device);
          else if (ak == "Device Type") integer(av, mem_type);
          else if (ak == "Total Allocated") integer(av, total_alloc);
          else if (ak == "Total Reserved") integer(av, total_reserved);
          else if (ak == "Limit") integer(av, mem_limit);
          else if (ak == "Input type" && (name.empty() || counted_op(name))) {
            shape_types(av, shape);
            ev.input_type = ElemType::none;
            for (auto t : shape.types)
              if (t != ElemType::none) {
                ev.input_type = t;
                break;
              }
            has_shape = true;
          } else if (ak == "Input type") {
            ev.input_type = first_elem_type(av);
          } else if (ak == "Input Dims" && (name.empty() || counted_op(name))) {
            shape_dims(av, shape);
            has_shape = true;
          } else if (ak == "Concrete Inputs" && (name.empty() || counted_op(name))) {
            shape_concrete(av, shape);
          }
        }
      }
    }
    // counts: phases and categories (string_view keys into the buffer: looked up, copied once)
    if (!has_ts) t_.fractional_ts = true;  // pandas makes the column float64 (HTA then rounds)
    if (ph.size() == 1) ++phase1_[static_cast<unsigned char>(ph[0])];
    else ++t_.phase_counts[std::string(ph)];
    if (ph == "s" || ph == "f" || ph == "t") {
      ++t_.flows;
      return;
    }
    {
      auto it = cats_.find(cat);
      if (it == cats_.end()) it = cats_.emplace(std::string(cat), 0).first;
      ++it->second;
    }
    if ((ph == "i" || ph == "I") && name == "[memory]") {
      if (total_alloc >= 0)
        t_.memory.push_back({ev.ts, mem_type == 1 ? mem_device : -1, total_alloc, std::max<std::int64_t>(0, total_reserved),
                             std::max<std::int64_t>(0, mem_limit)});
      return;
    }
    if (ph != "X") return;
    if (!has_ts || !has_dur) fail("a complete event (\"ph\": \"X\") without ts or dur", at);
    // an end that is no number (1e308 + 1e308) is no interval; a negative length is read as an instant (what
    // happened, not when it ended: no wait or window may come out negative)
    if (!std::isfinite(ev.ts) || !std::isfinite(ev.dur) || !std::isfinite(ev.ts + ev.dur))
      fail("a complete event whose ts + dur is not a finite number", at);
    if (ev.dur < 0) ev.dur = 0;
    ev.cat = has_cat ? cat_of(cat) : Cat::other;
    // Trace and the rest, python_function unless asked for: counted above
    if (ev.cat == Cat::other || (ev.cat == Cat::python_function && !opt_.python_functions)) return;
    if (ev.cat == Cat::gpu_memcpy) copy_kind(name, ev);
    auto it = name_ids_.find(name);
    if (it == name_ids_.end()) {
      it = name_ids_.emplace(std::string(name), std::uint32_t(t_.names.size())).first;
      t_.names.emplace_back(name);
    }
    ev.name = it->second;
    if (ev.cat == Cat::cpu_op && has_shape && !shape.dims.empty() && counted_op(name)) {
      t_.shapes.push_back(std::move(shape));
      ev.shape = std::uint32_t(t_.shapes.size());
    }
    t_.events.push_back(ev);
  }
};

}  // namespace

const char* to_string(Cat c) {
  switch (c) {
    case Cat::kernel: return "kernel";
    case Cat::gpu_memcpy: return "gpu_memcpy";
    case Cat::gpu_memset: return "gpu_memset";
    case Cat::cuda_runtime: return "cuda_runtime";
    case Cat::cuda_driver: return "cuda_driver";
    case Cat::cpu_op: return "cpu_op";
    case Cat::user_annotation: return "user_annotation";
    case Cat::gpu_user_annotation: return "gpu_user_annotation";
    case Cat::cuda_sync: return "cuda_sync";
    case Cat::python_function: return "python_function";
    case Cat::other: return "other";
  }
  return "other";
}

const char* to_string(ElemType t) {
  switch (t) {
    case ElemType::none: return "";
    case ElemType::f32: return "f32";
    case ElemType::f64: return "f64";
    case ElemType::bf16: return "bf16";
    case ElemType::f16: return "f16";
    case ElemType::f8: return "fp8";
    case ElemType::integer: return "int";
    case ElemType::other: return "other";
  }
  return "";
}

bool counted_op(std::string_view n) {
  static constexpr std::string_view ops[] = {
      "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation", "aten::convolution",
      "aten::convolution_backward", "aten::_scaled_dot_product_flash_attention",
      "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
      "aten::_scaled_dot_product_flash_attention_backward", "aten::_scaled_dot_product_efficient_attention_backward",
      "aten::_scaled_dot_product_cudnn_attention_backward"};
  for (auto o : ops)
    if (n == o) return true;
  return false;
}

// c10's type names as the profiler writes them (c10::toString of a ScalarType's C++ type).
ElemType elem_type(std::string_view s) {
  if (s.empty() || s == "Scalar" || s == "ScalarList" || s == "TensorList" || s == "GenericList" || s == "None" ||
      s == "Tensor(undefined)")
    return ElemType::none;
  if (s == "float") return ElemType::f32;
  if (s == "double") return ElemType::f64;
  if (s == "c10::BFloat16") return ElemType::bf16;
  if (s == "c10::Half") return ElemType::f16;
  if (s.substr(0, 12) == "c10::Float8_") return ElemType::f8;
  if (s == "bool" || s == "long int" || s == "int" || s == "short int" || s == "signed char" ||
      s == "unsigned char" || s == "long long int" || s == "unsigned int")
    return ElemType::integer;
  return ElemType::other;
}

Trace read_kineto(const std::string& path, const ReadOptions& opt) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw UsageError(fmt::format("{}: cannot open the trace: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw UsageError(fmt::format("{}: not a regular file (a trace is a .json or .json.gz file)", path));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  gzFile gz = gzdopen(fd, "rb");
  if (!gz) {
    ::close(fd);
    throw UsageError(fmt::format("{}: cannot read the trace", path));
  }
  gzbuffer(gz, 1u << 20);
  Trace t;
  t.file_bytes = std::uint64_t(st.st_size);
  Source src(gz);
  Reader r(src, path, t, opt);
  r.run();
  t.gzip = src.gzip();
  return t;
}

Trace parse_kineto(const std::string& text, const ReadOptions& opt) {
  Trace t;
  t.file_bytes = text.size();
  Source src(text);
  Reader r(src, "trace", t, opt);
  r.run();
  return t;
}

}  // namespace sb::readers
