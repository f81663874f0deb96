// A strict reader of the pickle subset that PyTorch's Flight Recorder dumps
// and torch.save'd Python objects (a TrainingArguments) use (protocol 2 from
// torch's C++ pickler and torch.save; protocols up to 5 from Python's),
// read in place (PickleDoc) or turned into JSON values: dict -> object (keys must be strings or ints, ints
// become their decimal text), list and tuple -> array, None -> null, bool,
// int (up to 64 bits), float, str, an object -> its state. Nothing is ever
// executed or imported: a global is accepted only when the caller's allow-list
// names it (module and name), and then only recorded, never looked up:
//   - identity: REDUCE returns its first argument (torch.jit._pickle's
//     restore_type_tag, build_intlist, build_doublelist, build_boollist: the
//     default list; build_tensorlist is refused);
//   - enum_value: REDUCE of one argument (IntervalStrategy('steps')) is an
//     object of that class whose state is the argument;
//   - object: NEWOBJ (or NEWOBJ_EX, or REDUCE) makes an object of that class
//     with no state, and BUILD gives it one (a dataclass's field dict).
// Any other opcode or global, a truncated stream, a bad memo index or more than
// kMaxPickleNodes values is a UsageError naming the file, the opcode or global and its
// byte offset; nesting deeper than kMaxPickleDepth (or a container that holds
// itself) is one where the values are walked whole (to_json).
#pragma once

#include <cstddef>      // std::size_t
#include <cstdint>      // std::int64_t, std::uint32_t, std::uint8_t
#include <optional>     // std::optional
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

namespace sb {

inline constexpr int kMaxPickleDepth = 64;
inline constexpr std::size_t kMaxPickleNodes = std::size_t(1) << 24;  // ~1 GiB of arena; a 20k-entry dump has ~1M

// True when bytes start like a pickle (PROTO 2..5).
bool looks_like_pickle(std::string_view bytes);

// A global a reader accepts, and what applying it means (see the top of this file).
struct PickleGlobal {
  enum class Call : std::uint8_t { identity, enum_value, object };
  std::string_view module, name;
  Call call = Call::identity;
};
// A reader's allow-list: its globals, and how a refusal names what is accepted.
struct PickleAllow {
  std::span<const PickleGlobal> globals;
  std::string_view accepted;  // "torch.jit._pickle's identity helpers"
};
// The Flight Recorder's: torch.jit._pickle's identity helpers.
PickleAllow torch_jit_globals();

struct PickleScratch;

// A parsed pickle: its values in an arena, read in place (a large dump's
// millions of values are never copied into JSON). Strings point into the
// input bytes, which must outlive the document.
class PickleDoc {
 public:
  // 24 bytes a value: a large dump is millions of them. A container's items
  // live in one shared pool, in chunks (one per APPENDS/SETITEMS batch, as
  // picklers fill a memoized container in batches), chained from the node.
  struct Node {
    enum class K : std::uint8_t { none, boolean, integer, real, str, list, tuple, dict, global, object };
    K k = K::none;
    std::uint32_t count = 0;  // str: bytes; containers: items (a dict's keys and values both)
    std::uint32_t first = 0;  // str: offset in the input; containers: first chunk + 1 (0: none); object: state + 1
    std::uint32_t last = 0;   // containers: last chunk + 1
    union {
      std::int64_t i;  // boolean, integer; global, object: its entry in the allow-list
      double d;
    };
    Node() : i(0) {}
    explicit Node(K kind) : k(kind), i(0) {}
  };
  struct Chunk {
    std::uint32_t start = 0, count = 0, next = 0;  // next chunk + 1 (0: none)
  };
  // A value of the document.
  class Ref {
   public:
    Ref(const PickleDoc* doc, std::uint32_t n) : doc_(doc), n_(n) {}
    // The value's index in the document: the same value fetched from the
    // memo twice (a shared key string, a shared list) has the same id.
    std::uint32_t id() const { return n_; }
    bool is_null() const { return node().k == Node::K::none; }
    bool is_str() const { return node().k == Node::K::str; }
    bool is_int() const { return node().k == Node::K::integer; }
    bool is_bool() const { return node().k == Node::K::boolean; }
    bool is_real() const { return node().k == Node::K::real; }
    bool is_seq() const { return node().k == Node::K::list || node().k == Node::K::tuple; }
    bool is_dict() const { return node().k == Node::K::dict; }
    bool is_global() const { return node().k == Node::K::global; }
    bool is_object() const { return node().k == Node::K::object; }
    // An object's class (or a global's), as the allow-list names it; nullptr for other values.
    const PickleGlobal* global() const;
    // An object's state (BUILD's argument, an enum's value, REDUCE's argument tuple); nullopt: none.
    std::optional<Ref> state() const;
    std::string_view str() const { return doc_->bytes_.substr(node().first, node().count); }
    std::int64_t integer() const { return node().i; }  // also a boolean's 0 or 1
    double real() const { return node().d; }
    std::size_t size() const { return is_dict() ? node().count / 2 : node().count; }
    Ref at(std::size_t i) const { return {doc_, doc_->kid(n_, i)}; }
    // A dict's member by string key (nullopt when absent or not a dict).
    // With a hint (the pair after the previous hit), a reader that asks for
    // the fields in about the order they were written compares few keys.
    std::optional<Ref> find(std::string_view key, std::size_t* hint = nullptr) const;
    // A dict's i-th key and value.
    Ref key(std::size_t i) const { return {doc_, doc_->kid(n_, 2 * i)}; }
    Ref value(std::size_t i) const { return {doc_, doc_->kid(n_, 2 * i + 1)}; }

   private:
    const Node& node() const { return doc_->nodes_[n_]; }
    const PickleDoc* doc_;
    std::uint32_t n_;
  };

  // Throws UsageError("<file>: pickle: ... at offset N"). bytes must
  // outlive the document (strings are read in place). With scratch, the
  // arena is the scratch's storage, handed back when the document ends
  // (the scratch must outlive it, and serve one document at a time).
  // allow: the globals accepted (by default torch.jit._pickle's identity helpers); its globals must
  // outlive the document.
  PickleDoc(std::string_view bytes, const std::string& file, PickleScratch* scratch = nullptr,
            PickleAllow allow = torch_jit_globals());
  ~PickleDoc();
  PickleDoc(const PickleDoc&) = delete;
  PickleDoc& operator=(const PickleDoc&) = delete;
  Ref root() const { return {this, root_}; }
  nlohmann::ordered_json to_json() const;

 private:
  friend class PickleParser;
  friend class PickleKeys;
  // The i-th item of container n.
  std::uint32_t kid(std::uint32_t n, std::size_t i) const;
  void parse(PickleScratch& s);
  void give_back() noexcept;
  std::string_view bytes_;
  std::vector<Node> nodes_;
  std::vector<Chunk> chunks_;
  std::vector<std::uint32_t> pool_;
  std::uint32_t root_ = 0;
  std::string file_;
  PickleScratch* scratch_ = nullptr;
  PickleAllow allow_;
};

// Storage that a reader of many documents (a thread reading a directory of
// dumps) reuses from one to the next: a 20,000-entry dump is a million
// values, ~30 MB of arena, which fresh each time is page faults and zeroing.
struct PickleScratch {
  std::vector<PickleDoc::Node> nodes;
  std::vector<PickleDoc::Chunk> chunks;
  std::vector<std::uint32_t> pool, stack, memo, multi;
  std::vector<std::size_t> marks;
};

// Reads records (dicts) by a fixed list of string keys in one pass over
// each record's pairs. A pickler memoizes a key string once and every
// record fetches that same value, so each distinct key value is compared
// with the names once per document, and after that by its id. A key that
// is no string, or no name on the list, is skipped; a repeated key's last
// value wins (as Python's unpickler and to_json have it).
class PickleKeys {
 public:
  static constexpr std::uint32_t kAbsent = 0xFFFFFFFFu;
  // At most 250 names; names must outlive this. With buffer, its storage
  // (a byte a value of the document) is used, and left there.
  PickleKeys(const PickleDoc& doc, const std::string_view* names, std::size_t count,
             std::vector<std::uint8_t>* buffer = nullptr);
  ~PickleKeys();
  PickleKeys(const PickleKeys&) = delete;
  PickleKeys& operator=(const PickleKeys&) = delete;
  // out[k]: the id of names[k]'s value in dict (kAbsent: not there, or
  // dict is no dict); out holds count slots.
  void read(PickleDoc::Ref dict, std::uint32_t* out) const;

 private:
  const PickleDoc& doc_;
  const std::string_view* names_;
  std::size_t count_;
  std::vector<std::uint8_t>* buffer_;
  mutable std::vector<std::uint8_t> of_node_;  // 0: not yet seen; 1: no name; 2 + k: names_[k]
};

// The document as JSON values. Throws UsageError as PickleDoc does.
nlohmann::ordered_json read_pickle(std::string_view bytes, const std::string& file,
                                   PickleAllow allow = torch_jit_globals());

}  // namespace sb
