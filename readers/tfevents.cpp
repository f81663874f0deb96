// TensorBoard event files (tfevents.hpp): TFRecord framing with both CRCs checked, and a minimal
// protobuf reader (varint, fixed32, fixed64, length-delimited; the wire format of
// protobuf.dev/programming-guides/encoding) for the fields of a scalar.
#include "readers/tfevents.hpp"

#include <array>    // std::array
#include <cstring>  // std::memcpy

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // UsageError
#include "harness/files.hpp"   // read_regular_file

namespace sb {

namespace {

// CRC-32C's table: the reflected Castagnoli polynomial 0x82F63B78.
constexpr std::array<std::uint32_t, 256> make_crc32c_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr auto kCrc32cTable = make_crc32c_table();

// TensorFlow's DataType numbers (types.proto) of the scalars read.
enum DType : std::uint64_t { kFloat = 1, kDouble = 2, kInt32 = 3, kInt64 = 9 };

enum Wire : std::uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

// One field of a message: its number, wire type, and value (a varint or fixed value in `u`, or the
// bytes of a length-delimited one in `b`); `at` is its offset in the file.
struct Field {
  std::uint32_t num = 0, wire = 0;
  std::uint64_t u = 0;
  std::string_view b;
  std::size_t at = 0;
};

// A message's fields in order. `base` is the message's offset in the file, for messages.
class Proto {
 public:
  Proto(std::string_view b, std::size_t base, const std::string& file) : b_(b), base_(base), file_(file) {}
  [[noreturn]] void fail(std::size_t at, const std::string& what) const {
    throw UsageError(fmt::format("{}: tfevents: {} at offset {}", file_, what, at));
  }
  bool next(Field& f) {
    if (pos_ >= b_.size()) return false;
    f.at = base_ + pos_;
    const std::uint64_t key = varint(f.at);
    f.num = std::uint32_t(key >> 3);
    f.wire = std::uint32_t(key & 7);
    if ((key >> 3) == 0 || (key >> 3) > 0x1FFFFFFF) fail(f.at, fmt::format("a field number {} (protobuf: 1 to 2^29-1)", key >> 3));
    switch (f.wire) {
      case kVarint: f.u = varint(f.at); break;
      case kFixed64: f.u = fixed(f.at, 8); break;
      case kFixed32: f.u = fixed(f.at, 4); break;
      case kBytes: {
        const std::uint64_t n = varint(f.at);
        if (n > b_.size() - pos_) fail(f.at, fmt::format("field {}'s {} bytes run past their message", f.num, n));
        f.b = b_.substr(pos_, std::size_t(n));
        pos_ += std::size_t(n);
        break;
      }
      default: fail(f.at, fmt::format("field {} of wire type {} (groups and unknown types are not read)", f.num, f.wire));
    }
    return true;
  }
  // A field of a known number with another wire type is a message of another kind.
  void expect(const Field& f, std::uint32_t wire, const char* what) const {
    if (f.wire != wire) fail(f.at, fmt::format("{} (field {}) has wire type {}, not {}", what, f.num, f.wire, wire));
  }
  std::size_t offset_of(const Field& f) const {  // where a length-delimited field's bytes start in the file
    return base_ + std::size_t(f.b.data() - b_.data());
  }

 private:
  std::uint64_t varint(std::size_t at) {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (pos_ >= b_.size()) fail(at, "a varint runs past its message");
      const auto c = static_cast<std::uint8_t>(b_[pos_++]);
      if (shift == 63 && c > 1) fail(at, "a varint over 64 bits");
      v |= std::uint64_t(c & 0x7F) << shift;
      if (!(c & 0x80)) return v;
    }
    fail(at, "a varint over 10 bytes");
  }
  std::uint64_t fixed(std::size_t at, int n) {
    if (b_.size() - pos_ < std::size_t(n)) fail(at, "a fixed-width value runs past its message");
    std::uint64_t v = 0;
    for (int k = n - 1; k >= 0; --k) v = (v << 8) | static_cast<std::uint8_t>(b_[pos_ + std::size_t(k)]);
    pos_ += std::size_t(n);
    return v;
  }
  std::string_view b_;
  std::size_t base_;
  const std::string& file_;
  std::size_t pos_ = 0;
};

double as_double(std::uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}
double as_float(std::uint64_t bits) {
  const auto u = std::uint32_t(bits);
  float f;
  std::memcpy(&f, &u, sizeof f);
  return double(f);
}
std::uint64_t le(std::string_view s, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | static_cast<std::uint8_t>(s[at + std::size_t(k)]);
  return v;
}

// The first element of a repeated numeric field (float_val 5, double_val 6, int_val 7, int64_val 10),
// packed (wire type 2) or not; nullopt when it is empty.
std::optional<double> first_of(const Proto& m, const Field& f) {
  const bool int32 = f.num == 7;
  if (f.wire != kBytes) {
    if (f.num == 5) {
      m.expect(f, kFixed32, "float_val");
      return as_float(f.u);
    }
    if (f.num == 6) {
      m.expect(f, kFixed64, "double_val");
      return as_double(f.u);
    }
    m.expect(f, kVarint, int32 ? "int_val" : "int64_val");
    return int32 ? double(std::int32_t(std::uint32_t(f.u))) : double(std::int64_t(f.u));
  }
  if (f.b.empty()) return std::nullopt;
  if (f.num == 5 || f.num == 6) {
    const std::size_t w = f.num == 5 ? 4 : 8;
    if (f.b.size() % w) m.fail(f.at, fmt::format("a packed {} of {} bytes", f.num == 5 ? "float_val" : "double_val", f.b.size()));
    return w == 4 ? as_float(le(f.b, 0, 4)) : as_double(le(f.b, 0, 8));
  }
  std::uint64_t v = 0;  // the first of the packed varints
  for (std::size_t k = 0; k < f.b.size() && k < 10; ++k) {
    v |= std::uint64_t(static_cast<std::uint8_t>(f.b[k]) & 0x7F) << (7 * k);
    if (!(static_cast<std::uint8_t>(f.b[k]) & 0x80))
      return int32 ? double(std::int32_t(std::uint32_t(v))) : double(std::int64_t(v));
  }
  m.fail(f.at, "a packed varint that does not end within 10 bytes");
}

// A TensorProto of one float or integer element: its value; nullopt for anything else.
std::optional<double> tensor_scalar(std::string_view bytes, std::size_t base, const std::string& file) {
  Proto m(bytes, base, file);
  Field f;
  std::uint64_t dtype = 0, elements = 1;
  std::optional<double> value;
  std::string_view content;
  while (m.next(f)) {
    if (f.num == 1) {
      m.expect(f, kVarint, "TensorProto.dtype");
      dtype = f.u;
    } else if (f.num == 2) {
      m.expect(f, kBytes, "TensorProto.tensor_shape");
      Proto shape(f.b, m.offset_of(f), file);
      Field d;
      while (shape.next(d)) {
        if (d.num == 3 && d.wire == kVarint && d.u) return std::nullopt;  // unknown_rank
        if (d.num != 2) continue;
        shape.expect(d, kBytes, "TensorShapeProto.dim");
        Proto dim(d.b, shape.offset_of(d), file);
        Field s;
        while (dim.next(s))
          if (s.num == 1) {
            dim.expect(s, kVarint, "Dim.size");
            if (s.u != 1) elements = 0;  // more than one element (or none, or -1: unknown)
          }
      }
    } else if (f.num == 4) {
      m.expect(f, kBytes, "TensorProto.tensor_content");
      content = f.b;
    } else if ((f.num >= 5 && f.num <= 7) || f.num == 10) {
      if (!value) value = first_of(m, f);
    }
  }
  if (elements != 1) return std::nullopt;
  const bool fp = dtype == kFloat || dtype == kDouble, in = dtype == kInt32 || dtype == kInt64;
  if (!fp && !in) return std::nullopt;
  if (!content.empty()) {
    const std::size_t w = dtype == kFloat || dtype == kInt32 ? 4 : 8;
    if (content.size() != w) return std::nullopt;
    const std::uint64_t bits = le(content, 0, int(w));
    if (dtype == kFloat) return as_float(bits);
    if (dtype == kDouble) return as_double(bits);
    return dtype == kInt32 ? double(std::int32_t(std::uint32_t(bits))) : double(std::int64_t(bits));
  }
  return value;
}

// One Event's scalars into `out`.
void read_event(std::string_view data, std::size_t base, TfEvents& out) {
  Proto ev(data, base, out.path);
  Field f;
  double wall = 0;
  std::int64_t step = 0;
  std::vector<std::pair<std::string, double>> values;
  while (ev.next(f)) {
    if (f.num == 1) {
      ev.expect(f, kFixed64, "Event.wall_time");
      wall = as_double(f.u);
    } else if (f.num == 2) {
      ev.expect(f, kVarint, "Event.step");
      step = std::int64_t(f.u);
    } else if (f.num == 3) {
      ev.expect(f, kBytes, "Event.file_version");
      out.file_version = std::string(f.b.substr(0, 64));
    } else if (f.num == 5) {
      ev.expect(f, kBytes, "Event.summary");
      Proto sum(f.b, ev.offset_of(f), out.path);
      Field v;
      while (sum.next(v)) {
        if (v.num != 1) continue;
        sum.expect(v, kBytes, "Summary.value");
        Proto val(v.b, sum.offset_of(v), out.path);
        Field x;
        std::optional<std::string_view> tag;
        std::optional<double> simple, tensor;
        while (val.next(x)) {
          if (x.num == 1) {
            val.expect(x, kBytes, "Value.tag");
            tag = x.b;
          } else if (x.num == 2) {
            val.expect(x, kFixed32, "Value.simple_value");
            simple = as_float(x.u);
          } else if (x.num == 8) {
            val.expect(x, kBytes, "Value.tensor");
            tensor = tensor_scalar(x.b, val.offset_of(x), out.path);
          }
        }
        if (tag && (simple || tensor)) values.emplace_back(std::string(*tag), simple ? *simple : *tensor);
        else ++out.skipped_values;
      }
    }
  }
  for (auto& [tag, value] : values) out.scalars[tag].push_back({step, wall, value});
}

}  // namespace

std::uint32_t crc32c(std::string_view data) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (const char ch : data) c = kCrc32cTable[(c ^ static_cast<std::uint8_t>(ch)) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::uint32_t masked_crc32c(std::string_view data) {
  const std::uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TfEvents parse_tfevents(std::string_view bytes, const std::string& path) {
  TfEvents out;
  out.path = path;
  auto fail = [&](std::size_t at, const std::string& what) {
    throw UsageError(fmt::format("{}: tfevents: {} at offset {}", path, what, at));
  };
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    if (bytes.size() - pos < 12) {  // not even a length and its CRC
      out.truncated_at = pos;
      break;
    }
    const std::string_view len_bytes = bytes.substr(pos, 8);
    const std::uint64_t len = le(bytes, pos, 8);
    if (std::uint32_t(le(bytes, pos + 8, 4)) != masked_crc32c(len_bytes))
      fail(pos, "a record length whose CRC-32C does not match (damaged, or not an event file)");
    if (len > kMaxTfRecordBytes) fail(pos, fmt::format("a record of {} bytes (over {})", len, kMaxTfRecordBytes));
    if (bytes.size() - pos - 12 < len + 4) {  // the writer had not finished it
      out.truncated_at = pos;
      break;
    }
    const std::string_view data = bytes.substr(pos + 12, std::size_t(len));
    if (std::uint32_t(le(bytes, pos + 12 + std::size_t(len), 4)) != masked_crc32c(data))
      fail(pos, "a record whose data's CRC-32C does not match (damaged)");
    read_event(data, pos + 12, out);
    ++out.records;
    pos += 12 + std::size_t(len) + 4;
  }
  if (out.records == 0)
    fail(out.truncated_at.value_or(0), bytes.empty() ? "an empty file (no record)" : "no complete record (truncated)");
  return out;
}

TfEvents read_tfevents(const std::string& path) {
  const std::string bytes = read_regular_file(path, "the event file");
  return parse_tfevents(bytes, path);
}

bool is_tfevents_name(std::string_view filename) { return filename.rfind("events.out.tfevents.", 0) == 0; }

}  // namespace sb
