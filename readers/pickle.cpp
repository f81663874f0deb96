#include "readers/pickle.hpp"

#include <cstdint>        // std::uint8_t, std::uint32_t, std::int64_t
#include <algorithm>      // std::max, std::min
#include <cstring>        // std::memcpy
#include <string>         // std::string
#include <vector>         // std::vector

#include <fmt/format.h>  // fmt::format

#include "harness/files.hpp"  // first_invalid_utf8

#include "harness/errors.hpp"  // UsageError

namespace sb {

namespace {

using json = nlohmann::ordered_json;

using Node = PickleDoc::Node;

// torch.jit._pickle's helpers: each returns its first argument.
constexpr PickleGlobal kTorchJitGlobals[] = {
    {"torch.jit._pickle", "restore_type_tag", PickleGlobal::Call::identity},
    {"torch.jit._pickle", "build_intlist", PickleGlobal::Call::identity},
    {"torch.jit._pickle", "build_doublelist", PickleGlobal::Call::identity},
    {"torch.jit._pickle", "build_boollist", PickleGlobal::Call::identity},
};

// Well-formed UTF-8 (harness/files: first_invalid_utf8): what the JSON writer accepts later.
bool valid_utf8(std::string_view s) { return !first_invalid_utf8(s); }

}  // namespace

// Values live in an arena and refer to each other by index, so that a
// container memoized before it is filled (as picklers do) is the same
// container when it is fetched from the memo later.
class PickleParser {
 public:
  // The stack, MARKs, memo and the list of containers filled in several
  // batches live in `scratch` (cleared here; their capacity is reused).
  PickleParser(std::string_view b, const std::string& file, PickleDoc& doc, PickleScratch& scratch)
      : b_(b), file_(file), doc_(doc), allow_(doc.allow_), nodes_(doc.nodes_), stack_(scratch.stack), marks_(scratch.marks),
        memo_(scratch.memo), multi_(scratch.multi) {
    stack_.clear();
    marks_.clear();
    memo_.clear();
    multi_.clear();
  }

  // The root value's index.
  std::uint32_t run() {
    if (!looks_like_pickle(b_)) fail(0, "not a pickle (no PROTO 2..5 opcode at the start)");
    for (;;) {
      const std::size_t at = pos_;
      const std::uint8_t op = byte(at);
      ++pos_;
      switch (op) {
        case 0x80: pos_ += 1; need(at, 0); break;  // PROTO n
        case 0x95: pos_ += 8; need(at, 0); break;  // FRAME len: framing only
        case 0x2e: {                               // STOP
          if (stack_.size() != 1 || !marks_.empty()) fail(at, "STOP with a stack that is not one value");
          return stack_.back();
        }
        case 0x7d: push(make(Node::K::dict)); break;   // EMPTY_DICT
        case 0x5d: push(make(Node::K::list)); break;   // EMPTY_LIST
        case 0x29: push(make(Node::K::tuple)); break;  // EMPTY_TUPLE
        case 0x28:  // MARK
          if (marks_.size() >= std::size_t(4 * kMaxPickleDepth)) fail(at, "MARKs nested deeper than any dump's");
          marks_.push_back(stack_.size());
          break;
        case 0x58: str(at, le(at, 4)); break;               // BINUNICODE
        case 0x8c: str(at, le(at, 1)); break;               // SHORT_BINUNICODE
        case 0x8d: str(at, le(at, 8)); break;               // BINUNICODE8
        case 0x71: put(at, le(at, 1)); break;         // BINPUT
        case 0x72: put(at, le(at, 4)); break;         // LONG_BINPUT
        case 0x94: put(at, memo_.size()); break;      // MEMOIZE
        case 0x68: get(at, le(at, 1)); break;  // BINGET
        case 0x6a: get(at, le(at, 4)); break;  // LONG_BINGET
        case 0x4e: push(make(Node::K::none)); break;  // NONE
        case 0x88: boolean(true); break;              // NEWTRUE
        case 0x89: boolean(false); break;             // NEWFALSE
        case 0x4b: integer(le(at, 1)); break;         // BININT1
        case 0x4d: integer(le(at, 2)); break;         // BININT2
        case 0x4a: integer(std::int64_t(std::int32_t(std::uint32_t(le(at, 4))))); break;  // BININT
        case 0x8a: long1(at); break;                  // LONG1
        case 0x47: binfloat(at); break;               // BINFLOAT
        case 0x61: append(at, 1); break;              // APPEND
        case 0x65: append(at, -1); break;             // APPENDS
        case 0x73: setitems(at, 1); break;            // SETITEM
        case 0x75: setitems(at, -1); break;           // SETITEMS
        case 0x85: tuple(at, 1); break;               // TUPLE1
        case 0x86: tuple(at, 2); break;               // TUPLE2
        case 0x87: tuple(at, 3); break;               // TUPLE3
        case 0x74: tuple(at, -1); break;              // TUPLE
        case 0x63: global(at); break;                 // GLOBAL
        case 0x93: stack_global(at); break;           // STACK_GLOBAL
        case 0x52: reduce(at); break;                 // REDUCE
        case 0x81: newobj(at, false); break;          // NEWOBJ
        case 0x92: newobj(at, true); break;           // NEWOBJ_EX
        case 0x62: build(at); break;                  // BUILD
        default:
          fail(at, fmt::format("opcode 0x{:02x}{} is not in the subset a Flight Recorder dump or a torch.save'd "
                               "object uses", op,
                               op >= 0x20 && op < 0x7f ? fmt::format(" ('{}')", char(op)) : std::string()));
      }
    }
  }

 private:
  [[noreturn]] void fail(std::size_t at, const std::string& what) const {
    throw UsageError(fmt::format("{}: pickle: {} at offset {}", file_, what, at));
  }
  std::uint8_t byte(std::size_t at) const {
    if (pos_ >= b_.size()) fail(at, "the stream ends before STOP (truncated)");
    return static_cast<std::uint8_t>(b_[pos_]);
  }
  void need(std::size_t at, std::size_t n) const {
    if (pos_ > b_.size() || b_.size() - pos_ < n) fail(at, "the stream ends inside an opcode's argument (truncated)");
  }
  // n little-endian bytes at pos_, unsigned; advances.
  std::uint64_t le(std::size_t at, int n) {
    need(at, std::size_t(n));
    std::uint64_t v = 0;
    for (int k = n - 1; k >= 0; --k) v = (v << 8) | static_cast<std::uint8_t>(b_[pos_ + std::size_t(k)]);
    pos_ += std::size_t(n);
    return v;
  }
  std::uint32_t make(Node::K k) {
    if (nodes_.size() >= kMaxPickleNodes) fail(pos_, fmt::format("more than {} values", kMaxPickleNodes));
    nodes_.emplace_back(k);
    return std::uint32_t(nodes_.size() - 1);
  }
  void push(std::uint32_t n) { stack_.push_back(n); }
  std::uint32_t top(std::size_t at) const {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) fail(at, "memo store with nothing on the stack");
    return stack_.back();
  }
  std::uint32_t pop(std::size_t at) {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) fail(at, "stack underflow");
    const std::uint32_t n = stack_.back();
    stack_.pop_back();
    return n;
  }
  // Where the last MARK is (the values above it are its items); the mark is removed.
  std::size_t pop_mark(std::size_t at) {
    if (marks_.empty()) fail(at, "no MARK to pop to");
    const std::size_t m = marks_.back();
    marks_.pop_back();
    return m;
  }
  // Appends stack_[from, end) to container n as one chunk and drops them.
  void add_items(std::uint32_t n, std::size_t from) {
    const std::size_t count = stack_.size() - from;
    if (count == 0) return;
    if (doc_.pool_.size() + count >= 0xFFFFFFFFu) fail(pos_, "more container items than 2^32");
    const auto start = std::uint32_t(doc_.pool_.size());
    if (count == 1) {  // APPEND, TUPLE1: most batches of a dump
      doc_.pool_.push_back(stack_.back());
      stack_.pop_back();
    } else {
      doc_.pool_.insert(doc_.pool_.end(), stack_.begin() + std::ptrdiff_t(from), stack_.end());
      stack_.resize(from);
    }
    doc_.chunks_.push_back({start, std::uint32_t(count), 0});
    const auto c = std::uint32_t(doc_.chunks_.size());  // its index + 1
    Node& x = nodes_[n];
    if (x.last && x.first == x.last) multi_.push_back(n);  // its second batch: made one chunk after parsing
    if (x.last) doc_.chunks_[x.last - 1].next = c;
    else x.first = c;
    x.last = c;
    x.count += std::uint32_t(count);
  }
  void str(std::size_t at, std::uint64_t len) {
    need(at, 0);
    if (len > b_.size() - pos_) fail(at, fmt::format("a string of {} bytes runs past the end (truncated)", len));
    const std::string_view s = b_.substr(pos_, std::size_t(len));
    if (!valid_utf8(s)) fail(at, "a string that is not UTF-8");
    const std::uint32_t n = make(Node::K::str);
    nodes_[n].first = std::uint32_t(pos_);  // the input is at most kMaxInputBytes
    nodes_[n].count = std::uint32_t(len);
    pos_ += std::size_t(len);
    push(n);
  }
  // Picklers number the memo from 0 as they go; an index far beyond the
  // values read so far is damage, and would make the table huge.
  void put(std::size_t at, std::uint64_t idx) {
    const std::uint32_t v = top(at);
    if (idx > nodes_.size() + 16) fail(at, fmt::format("memo index {} beyond the {} values read", idx, nodes_.size()));
    if (idx >= memo_.size()) memo_.resize(idx + 1, kNoMemo);
    memo_[idx] = v;
  }
  void get(std::size_t at, std::uint64_t idx) {
    if (idx >= memo_.size() || memo_[idx] == kNoMemo) fail(at, fmt::format("memo index {} was never stored", idx));
    push(memo_[idx]);
  }
  void boolean(bool v) {
    const std::uint32_t n = make(Node::K::boolean);
    nodes_[n].i = v;
    push(n);
  }
  void integer(std::int64_t v) {
    const std::uint32_t n = make(Node::K::integer);
    nodes_[n].i = v;
    push(n);
  }
  void long1(std::size_t at) {
    const auto len = int(le(at, 1));
    if (len > 8) fail(at, fmt::format("an integer of {} bytes (more than 64 bits)", len));
    if (len == 0) return integer(0);
    std::uint64_t v = le(at, len);
    if (len < 8 && (v >> (8 * len - 1)) & 1) v |= ~std::uint64_t(0) << (8 * len);  // sign-extend
    integer(std::int64_t(v));
  }
  void binfloat(std::size_t at) {
    need(at, 8);
    std::uint64_t v = 0;
    for (int k = 0; k < 8; ++k) v = (v << 8) | static_cast<std::uint8_t>(b_[pos_ + std::size_t(k)]);  // big-endian
    pos_ += 8;
    double d;
    std::memcpy(&d, &v, sizeof d);
    const std::uint32_t n = make(Node::K::real);
    nodes_[n].d = d;
    push(n);
  }
  Node& container(std::size_t at, std::uint32_t n, Node::K k, const char* op) {
    if (nodes_[n].k != k) fail(at, fmt::format("{} on a value that is not a {}", op, k == Node::K::dict ? "dict" : "list"));
    return nodes_[n];
  }
  void append(std::size_t at, int count) {
    std::size_t from;
    if (count < 0) {
      from = pop_mark(at);
    } else {
      (void)top(at);  // the item
      from = stack_.size() - 1;
    }
    if (from == 0 || (!marks_.empty() && from <= marks_.back())) fail(at, "APPEND with no list below its items");
    const std::uint32_t target = stack_[from - 1];
    container(at, target, Node::K::list, count < 0 ? "APPENDS" : "APPEND");
    add_items(target, from);
  }
  void setitems(std::size_t at, int count) {
    std::size_t from;
    if (count < 0) {
      from = pop_mark(at);
    } else {
      if (stack_.size() < 2 + (marks_.empty() ? 0 : marks_.back())) fail(at, "SETITEM without a key and a value");
      from = stack_.size() - 2;
    }
    if ((stack_.size() - from) % 2) fail(at, "SETITEMS with a key and no value");
    if (from == 0 || (!marks_.empty() && from <= marks_.back())) fail(at, "SETITEMS with no dict below its items");
    const std::uint32_t target = stack_[from - 1];
    container(at, target, Node::K::dict, count < 0 ? "SETITEMS" : "SETITEM");
    for (std::size_t i = from; i < stack_.size(); i += 2) {
      const Node::K kk = nodes_[stack_[i]].k;
      if (kk != Node::K::str && kk != Node::K::integer) fail(at, "a dict key that is neither a string nor an int");
    }
    add_items(target, from);
  }
  void tuple(std::size_t at, int count) {
    std::size_t from;
    if (count < 0) {
      from = pop_mark(at);
    } else {
      if (stack_.size() < std::size_t(count) + (marks_.empty() ? 0 : marks_.back()))
        fail(at, "stack underflow");
      from = stack_.size() - std::size_t(count);
    }
    const std::uint32_t n = make(Node::K::tuple);
    add_items(n, from);
    push(n);
  }
  void global(std::size_t at) {
    auto line = [&]() {
      const std::size_t nl = b_.find('\n', pos_);
      if (nl == std::string_view::npos || nl - pos_ > 256) fail(at, "GLOBAL without its newline-ended name");
      const std::string_view s = b_.substr(pos_, nl - pos_);
      pos_ = nl + 1;
      return s;
    };
    const std::string_view mod = line(), name = line();
    accept(at, mod, name);
  }
  // STACK_GLOBAL (protocol 4+): the module and the name are the two strings on the stack.
  void stack_global(std::size_t at) {
    const std::uint32_t name = pop(at), mod = pop(at);
    if (nodes_[name].k != Node::K::str || nodes_[mod].k != Node::K::str)
      fail(at, "STACK_GLOBAL of values that are not two strings");
    accept(at, b_.substr(nodes_[mod].first, nodes_[mod].count), b_.substr(nodes_[name].first, nodes_[name].count));
  }
  // A global on the allow-list is recorded (its entry), never imported; any other ends the read.
  void accept(std::size_t at, std::string_view mod, std::string_view name) {
    for (std::size_t k = 0; k < allow_.globals.size(); ++k)
      if (allow_.globals[k].module == mod && allow_.globals[k].name == name) {
        const std::uint32_t n = make(Node::K::global);
        nodes_[n].i = std::int64_t(k);
        return push(n);
      }
    fail(at, fmt::format("global {}.{} refused (nothing is imported or executed): only {} are accepted",
                         printable(mod), printable(name), allow_.accepted));
  }
  // A name from the input, for a message: bytes outside printable ASCII as \xNN, at most 80.
  static std::string printable(std::string_view s) {
    std::string out;
    for (std::size_t k = 0; k < s.size() && k < 80; ++k) {
      const auto c = static_cast<unsigned char>(s[k]);
      out += c >= 0x20 && c < 0x7f ? std::string(1, char(c)) : fmt::format("\\x{:02x}", c);
    }
    return s.size() > 80 ? out + "..." : out;
  }
  const PickleGlobal& callable(std::size_t at, std::uint32_t n, const char* op) const {
    if (nodes_[n].k != Node::K::global) fail(at, fmt::format("{} of something that is not an accepted global", op));
    return allow_.globals[std::size_t(nodes_[n].i)];
  }
  // An object of class `cls` (a global node), its state `state` (kNoState: none yet).
  std::uint32_t object(std::uint32_t cls, std::uint32_t state) {
    const std::uint32_t n = make(Node::K::object);
    nodes_[n].i = nodes_[cls].i;
    nodes_[n].first = state == kNoState ? 0 : state + 1;
    return n;
  }
  void reduce(std::size_t at) {
    const std::uint32_t args = pop(at), cls = pop(at);
    const PickleGlobal& g = callable(at, cls, "REDUCE");
    if (nodes_[args].k != Node::K::tuple) fail(at, "REDUCE with no argument tuple");
    switch (g.call) {
      case PickleGlobal::Call::identity:  // the helpers return their first argument
        if (nodes_[args].count == 0) fail(at, "REDUCE with no argument tuple");
        return push(doc_.kid(args, 0));
      case PickleGlobal::Call::enum_value:
        if (nodes_[args].count != 1) fail(at, fmt::format("REDUCE of enum {}.{} with {} arguments, not 1", g.module,
                                                          g.name, nodes_[args].count));
        return push(object(cls, doc_.kid(args, 0)));
      case PickleGlobal::Call::object: return push(object(cls, args));
    }
  }
  // NEWOBJ cls args / NEWOBJ_EX cls args kwargs: an object with no state yet (BUILD gives it one).
  void newobj(std::size_t at, bool ex) {
    if (ex && nodes_[pop(at)].k != Node::K::dict) fail(at, "NEWOBJ_EX whose keyword arguments are not a dict");
    const std::uint32_t args = pop(at), cls = pop(at);
    const PickleGlobal& g = callable(at, cls, ex ? "NEWOBJ_EX" : "NEWOBJ");
    if (nodes_[args].k != Node::K::tuple) fail(at, "NEWOBJ with no argument tuple");
    if (g.call == PickleGlobal::Call::identity) fail(at, fmt::format("NEWOBJ of {}.{}, which is no class", g.module, g.name));
    if (g.call == PickleGlobal::Call::enum_value && nodes_[args].count == 1) return push(object(cls, doc_.kid(args, 0)));
    push(object(cls, kNoState));
  }
  // BUILD state: the object below it takes it (a dataclass's __dict__, or (dict, slots)).
  void build(std::size_t at) {
    const std::uint32_t state = pop(at), obj = top(at);
    if (nodes_[obj].k != Node::K::object || allow_.globals[std::size_t(nodes_[obj].i)].call != PickleGlobal::Call::object)
      fail(at, "BUILD on a value that is not an object of an accepted class");
    nodes_[obj].first = state + 1;
  }

  std::string_view b_;
  const std::string& file_;
  std::size_t pos_ = 0;
  PickleDoc& doc_;
  const PickleAllow& allow_;
  static constexpr std::uint32_t kNoState = 0xFFFFFFFFu;
  std::vector<Node>& nodes_;
  std::vector<std::uint32_t>& stack_;
  std::vector<std::size_t>& marks_;
  static constexpr std::uint32_t kNoMemo = 0xFFFFFFFFu;
  std::vector<std::uint32_t>& memo_;  // memo index -> node
  std::vector<std::uint32_t>& multi_;  // containers filled in more than one batch

 public:
  const std::vector<std::uint32_t>& multi() const { return multi_; }
};

namespace {

// `budget` bounds the output: shared values are copied where each is used,
// and a small pickle can share its way to billions of them.
// Nesting is checked here, where it is walked (a reader of known fields,
// like torch_fr's, goes a fixed depth and never needs it): over
// kMaxPickleDepth, or a container that holds itself, is refused.
json to_json_rec(const PickleDoc& doc, PickleDoc::Ref x, std::size_t& budget, int depth, const std::string& file) {
  if (budget-- == 0)
    throw UsageError(fmt::format("{}: pickle: expands to more than {} values", file, kMaxPickleNodes));
  if (depth > kMaxPickleDepth)
    throw UsageError(fmt::format("{}: pickle: values nested deeper than {} (or a container that holds itself)", file,
                                 kMaxPickleDepth));
  if (x.is_global()) throw UsageError(fmt::format("{}: pickle: a global left unapplied (no REDUCE)", file));
  if (x.is_object()) {
    const auto st = x.state();
    return st ? to_json_rec(doc, *st, budget, depth + 1, file) : json(nullptr);
  }
  if (x.is_null()) return nullptr;
  if (x.is_bool()) return x.integer() != 0;
  if (x.is_int()) return x.integer();
  if (x.is_real()) return x.real();
  if (x.is_str()) return std::string(x.str());
  if (x.is_seq()) {
    json a = json::array();
    for (std::size_t k = 0; k < x.size(); ++k) a.push_back(to_json_rec(doc, x.at(k), budget, depth + 1, file));
    return a;
  }
  json o = json::object();
  for (std::size_t k = 0; k < x.size(); ++k) {
    const PickleDoc::Ref key = x.key(k);
    std::string name = key.is_str() ? std::string(key.str()) : std::to_string(key.integer());
    o[std::move(name)] = to_json_rec(doc, x.value(k), budget, depth + 1, file);
  }
  return o;
}

}  // namespace

std::uint32_t PickleDoc::kid(std::uint32_t n, std::size_t i) const {
  for (std::uint32_t c = nodes_[n].first; c; c = chunks_[c - 1].next) {
    const Chunk& ch = chunks_[c - 1];
    if (i < ch.count) return pool_[ch.start + i];
    i -= ch.count;
  }
  return 0;  // out of range: callers check size() first
}

std::optional<PickleDoc::Ref> PickleDoc::Ref::find(std::string_view key, std::size_t* hint) const {
  if (!is_dict()) return std::nullopt;
  const std::size_t pairs = size();
  if (pairs == 0) return std::nullopt;
  if (node().first == node().last) {  // one chunk (the usual): pairs by index, from the hint round
    const Chunk& ch = doc_->chunks_[node().first - 1];
    const std::size_t start = hint ? *hint % pairs : 0;
    for (std::size_t j = 0; j < pairs; ++j) {
      const std::size_t p = (start + j) % pairs;
      const Ref k{doc_, doc_->pool_[ch.start + 2 * p]};
      if (k.is_str() && k.str() == key) {
        if (hint) *hint = p + 1;
        return Ref{doc_, doc_->pool_[ch.start + 2 * p + 1]};
      }
    }
    return std::nullopt;
  }
  for (std::uint32_t c = node().first; c; c = doc_->chunks_[c - 1].next) {
    const Chunk& ch = doc_->chunks_[c - 1];
    for (std::uint32_t j = 0; j + 1 < ch.count; j += 2) {
      const Ref k{doc_, doc_->pool_[ch.start + j]};
      if (k.is_str() && k.str() == key) return Ref{doc_, doc_->pool_[ch.start + j + 1]};
    }
  }
  return std::nullopt;
}

const PickleGlobal* PickleDoc::Ref::global() const {
  if (!is_global() && !is_object()) return nullptr;
  return &doc_->allow_.globals[std::size_t(node().i)];
}

std::optional<PickleDoc::Ref> PickleDoc::Ref::state() const {
  if (!is_object() || node().first == 0) return std::nullopt;
  return Ref{doc_, node().first - 1};
}

PickleDoc::PickleDoc(std::string_view bytes, const std::string& file, PickleScratch* scratch, PickleAllow allow)
    : bytes_(bytes), file_(file), scratch_(scratch), allow_(allow) {
  PickleScratch own;
  PickleScratch& s = scratch ? *scratch : own;
  if (scratch) {  // borrowed until the destructor: cleared, capacity kept
    nodes_.swap(s.nodes);
    chunks_.swap(s.chunks);
    pool_.swap(s.pool);
    nodes_.clear();
    chunks_.clear();
    pool_.clear();
  }
  try {  // a document that throws hands the scratch's storage back (no destructor runs)
    parse(s);
  } catch (...) {
    give_back();
    throw;
  }
}

void PickleDoc::parse(PickleScratch& s) {
  // About one value per 3 bytes in a dump: no regrowth copies.
  nodes_.reserve(std::min(bytes_.size() / 3, kMaxPickleNodes));
  pool_.reserve(std::min(bytes_.size() / 3, kMaxPickleNodes));
  s.memo.reserve(std::min(bytes_.size() / 6, kMaxPickleNodes));
  PickleParser parser(bytes_, file_, *this, s);
  root_ = parser.run();
  // A container filled in several batches is one contiguous chunk from now
  // on, so that its i-th item is one lookup (a list of a million APPENDs
  // would otherwise make every access walk a million chunks).
  for (const std::uint32_t n : parser.multi()) {
    Node& x = nodes_[n];
    const auto start = std::uint32_t(pool_.size());
    for (std::uint32_t c = x.first; c; c = chunks_[c - 1].next)
      for (std::uint32_t j = 0; j < chunks_[c - 1].count; ++j) {
        const std::uint32_t item = pool_[chunks_[c - 1].start + j];  // a copy: push_back may reallocate
        pool_.push_back(item);
      }
    chunks_.push_back({start, x.count, 0});
    x.first = x.last = std::uint32_t(chunks_.size());
  }
}

PickleDoc::~PickleDoc() { give_back(); }

void PickleDoc::give_back() noexcept {
  if (!scratch_) return;
  nodes_.swap(scratch_->nodes);
  chunks_.swap(scratch_->chunks);
  pool_.swap(scratch_->pool);
  scratch_ = nullptr;
}

PickleKeys::PickleKeys(const PickleDoc& doc, const std::string_view* names, std::size_t count,
                       std::vector<std::uint8_t>* buffer)
    : doc_(doc), names_(names), count_(std::min<std::size_t>(count, 250)), buffer_(buffer) {
  if (buffer_) of_node_.swap(*buffer_);
  of_node_.assign(doc.nodes_.size(), 0);
}

PickleKeys::~PickleKeys() {
  if (buffer_) of_node_.swap(*buffer_);
}

void PickleKeys::read(PickleDoc::Ref dict, std::uint32_t* out) const {
  std::fill(out, out + count_, kAbsent);
  if (!dict.is_dict()) return;
  const Node& x = doc_.nodes_[dict.id()];
  // A dict's batches hold whole pairs (SETITEMS checks), so pairs never straddle chunks.
  for (std::uint32_t c = x.first; c; c = doc_.chunks_[c - 1].next) {
    const PickleDoc::Chunk& ch = doc_.chunks_[c - 1];
    const std::uint32_t* p = doc_.pool_.data() + ch.start;
    for (std::uint32_t j = 0; j + 1 < ch.count; j += 2) {
      std::uint8_t& tag = of_node_[p[j]];
      if (tag == 0) {
        tag = 1;
        const Node& k = doc_.nodes_[p[j]];
        if (k.k == Node::K::str) {
          const std::string_view key = doc_.bytes_.substr(k.first, k.count);
          for (std::size_t i = 0; i < count_; ++i)
            if (names_[i] == key) {
              tag = std::uint8_t(2 + i);
              break;
            }
        }
      }
      if (tag >= 2) out[tag - 2] = p[j + 1];
    }
  }
}

json PickleDoc::to_json() const {
  std::size_t budget = kMaxPickleNodes;
  return to_json_rec(*this, root(), budget, 0, file_);
}

PickleAllow torch_jit_globals() { return {kTorchJitGlobals, "torch.jit._pickle's identity helpers"}; }

bool looks_like_pickle(std::string_view bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x80 && bytes[1] >= 2 && bytes[1] <= 5;
}

json read_pickle(std::string_view bytes, const std::string& file, PickleAllow allow) {
  return PickleDoc(bytes, file, nullptr, allow).to_json();
}

}  // namespace sb
