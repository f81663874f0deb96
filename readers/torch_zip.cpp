// torch.save's zip container (torch_zip.hpp): the central directory, ZIP64's fields where the
// 32-bit ones say 0xFFFFFFFF, stored and deflated entries, CRC-32. The layout is PKWARE's
// APPNOTE.TXT (sections 4.3.7 local header, 4.3.12 central directory header, 4.3.14-16 ZIP64 end
// of central directory record and locator, 4.5.3 the ZIP64 extra field).
#include "readers/torch_zip.hpp"

#include <algorithm>  // std::min

#include <fmt/format.h>  // fmt::format
#include <zlib.h>        // crc32, inflate

#include "harness/errors.hpp"  // UsageError

namespace sb {

namespace {

constexpr std::uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50,
                        kEnd64Sig = 0x06064b50, kLocator64Sig = 0x07064b50;
constexpr std::size_t kEndBytes = 22, kCentralBytes = 46, kLocalBytes = 30, kLocatorBytes = 20, kEnd64Bytes = 56;

// Little-endian reads, every one bounds-checked against the archive.
class Bytes {
 public:
  Bytes(std::string_view b, const std::string& file) : b_(b), file_(file) {}
  [[noreturn]] void fail(std::uint64_t at, const std::string& what) const {
    throw UsageError(fmt::format("{}: zip: {} at offset {}", file_, what, at));
  }
  bool has(std::uint64_t at, std::uint64_t n) const { return at <= b_.size() && b_.size() - at >= n; }
  std::uint64_t le(std::uint64_t at, int n, const char* what) const {
    if (!has(at, std::uint64_t(n))) fail(at, fmt::format("{} runs past the end of the file (truncated)", what));
    std::uint64_t v = 0;
    for (int k = n - 1; k >= 0; --k) v = (v << 8) | static_cast<unsigned char>(b_[std::size_t(at) + std::size_t(k)]);
    return v;
  }
  std::uint32_t u32(std::uint64_t at, const char* what) const { return std::uint32_t(le(at, 4, what)); }
  std::uint16_t u16(std::uint64_t at, const char* what) const { return std::uint16_t(le(at, 2, what)); }
  std::string_view sub(std::uint64_t at, std::uint64_t n, const char* what) const {
    if (!has(at, n)) fail(at, fmt::format("{} of {} bytes runs past the end of the file (truncated)", what, n));
    return b_.substr(std::size_t(at), std::size_t(n));
  }
  std::size_t size() const { return b_.size(); }

 private:
  std::string_view b_;
  const std::string& file_;
};

// Where the central directory is and how many entries it holds.
struct Directory {
  std::uint64_t offset = 0, size = 0, entries = 0;
};

// The end-of-central-directory record: the last signature whose comment ends the file (a comment
// may itself hold the signature's bytes, so the search runs from the end).
Directory directory(const Bytes& b) {
  if (b.size() < kEndBytes) b.fail(0, "shorter than an end-of-central-directory record (truncated, or not a zip)");
  const std::uint64_t lowest = b.size() >= kEndBytes + 0xFFFF ? b.size() - kEndBytes - 0xFFFF : 0;
  std::uint64_t end = b.size() - kEndBytes;
  for (;; --end) {
    if (b.u32(end, "the end record") == kEndSig && end + kEndBytes + b.u16(end + 20, "the comment") == b.size()) break;
    if (end == lowest) b.fail(b.size(), "no end-of-central-directory record (truncated, or not a zip)");
  }
  if (b.u16(end + 4, "the disk number") != 0 || b.u16(end + 6, "the disk number") != 0)
    b.fail(end, "a multi-disk archive");
  Directory d{b.u32(end + 16, "the directory offset"), b.u32(end + 12, "the directory size"),
              b.u16(end + 10, "the entry count")};
  // ZIP64: a locator just before the record points at the 64-bit record, whose fields win
  if (end >= kLocatorBytes && b.u32(end - kLocatorBytes, "the ZIP64 locator") == kLocator64Sig) {
    const std::uint64_t at = b.le(end - kLocatorBytes + 8, 8, "the ZIP64 record's offset");
    if (!b.has(at, kEnd64Bytes) || at + kEnd64Bytes > end - kLocatorBytes)
      b.fail(end - kLocatorBytes, fmt::format("a ZIP64 record offset {} outside the file", at));
    if (b.u32(at, "the ZIP64 record") != kEnd64Sig) b.fail(at, "no ZIP64 end-of-central-directory record where its locator points");
    d.entries = b.le(at + 32, 8, "the ZIP64 entry count");
    d.size = b.le(at + 40, 8, "the ZIP64 directory size");
    d.offset = b.le(at + 48, 8, "the ZIP64 directory offset");
    end = at;
  }
  if (d.offset > end || d.size > end - d.offset)
    b.fail(end, fmt::format("a central directory of {} bytes at {} outside the file", d.size, d.offset));
  if (d.entries > kMaxZipEntries) b.fail(end, fmt::format("{} entries (over {})", d.entries, kMaxZipEntries));
  return d;
}

// The ZIP64 extra field's 64-bit values for the 32-bit fields saturated at 0xFFFFFFFF, in its order
// (size, compressed size, local header offset).
void zip64_extra(const Bytes& b, std::uint64_t at, std::uint64_t len, ZipEntry& e, bool big_size, bool big_csize,
                 bool big_offset) {
  for (std::uint64_t p = at; p + 4 <= at + len;) {
    const std::uint16_t id = b.u16(p, "an extra field"), n = b.u16(p + 2, "an extra field");
    if (p + 4 + n > at + len) b.fail(p, "an extra field runs past its entry");
    if (id == 0x0001) {
      std::uint64_t q = p + 4;
      auto next = [&](std::uint64_t& out) {
        if (q + 8 > p + 4 + n) b.fail(p, "a ZIP64 extra field shorter than the fields it stands for");
        out = b.le(q, 8, "a ZIP64 extra field");
        q += 8;
      };
      if (big_size) next(e.size);
      if (big_csize) next(e.compressed);
      if (big_offset) next(e.offset);
      return;
    }
    p += 4 + n;
  }
  if (big_size || big_csize || big_offset) b.fail(at, "a field saturated at 0xFFFFFFFF and no ZIP64 extra field");
}

std::uint32_t crc_of(std::string_view s) {
  uLong c = crc32(0L, Z_NULL, 0);
  for (std::size_t k = 0; k < s.size();) {
    const std::size_t n = std::min<std::size_t>(s.size() - k, std::size_t(1) << 30);
    c = crc32(c, reinterpret_cast<const Bytef*>(s.data() + k), uInt(n));
    k += n;
  }
  return std::uint32_t(c);
}

std::string inflate_raw(const Bytes& b, std::uint64_t at, std::string_view in, std::uint64_t size) {
  // deflate expands at most about 1032:1: a larger claim is damage, not worth allocating for
  if (size > std::uint64_t(in.size()) * 1032 + 1024)
    b.fail(at, fmt::format("a deflated entry of {} bytes claims {} (more than deflate can expand to)", in.size(), size));
  std::string out(std::size_t(size), '\0');
  z_stream z{};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) b.fail(at, "zlib would not start");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = uInt(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  const int rc = inflate(&z, Z_FINISH);
  const std::uint64_t produced = z.total_out;
  inflateEnd(&z);
  if (rc != Z_STREAM_END || produced != size)
    b.fail(at, fmt::format("a deflated entry that does not inflate to its {} bytes (zlib {})", size, rc));
  return out;
}

}  // namespace

std::vector<ZipEntry> zip_entries(std::string_view bytes, const std::string& file) {
  const Bytes b(bytes, file);
  const Directory d = directory(b);
  std::vector<ZipEntry> out;
  std::uint64_t p = d.offset;
  const std::uint64_t end = d.offset + d.size;
  for (std::uint64_t i = 0; i < d.entries; ++i) {
    if (p + kCentralBytes > end) b.fail(p, fmt::format("the central directory ends inside entry {}", i));
    if (b.u32(p, "a directory entry") != kCentralSig) b.fail(p, fmt::format("entry {} has no directory signature", i));
    ZipEntry e;
    const std::uint16_t flags = b.u16(p + 8, "the flags");
    e.method = b.u16(p + 10, "the method");
    e.crc32 = b.u32(p + 16, "the CRC");
    e.compressed = b.u32(p + 20, "the compressed size");
    e.size = b.u32(p + 24, "the size");
    const std::uint16_t nlen = b.u16(p + 28, "the name"), xlen = b.u16(p + 30, "the extra field"),
                        clen = b.u16(p + 32, "the comment");
    e.offset = b.u32(p + 42, "the local header offset");
    if (p + kCentralBytes + nlen + xlen + clen > end) b.fail(p, fmt::format("entry {} runs past the central directory", i));
    e.name = std::string(b.sub(p + kCentralBytes, nlen, "a name"));
    if (flags & 1) b.fail(p, fmt::format("entry {} is encrypted", e.name));
    zip64_extra(b, p + kCentralBytes + nlen, xlen, e, e.size == 0xFFFFFFFFu, e.compressed == 0xFFFFFFFFu,
                e.offset == 0xFFFFFFFFu);
    if (e.method != 0 && e.method != 8)
      b.fail(p, fmt::format("entry {} is compressed by method {} (only stored and deflated are read)", e.name, e.method));
    if (e.size > kMaxZipEntryBytes) b.fail(p, fmt::format("entry {} of {} bytes (over {})", e.name, e.size, kMaxZipEntryBytes));
    if (e.method == 0 && e.compressed != e.size)
      b.fail(p, fmt::format("stored entry {} with {} bytes stored for {}", e.name, e.compressed, e.size));
    out.push_back(std::move(e));
    p += kCentralBytes + nlen + xlen + clen;
  }
  return out;
}

std::string zip_read(std::string_view bytes, const ZipEntry& e, const std::string& file) {
  const Bytes b(bytes, file);
  const std::uint64_t at = e.offset;
  if (b.u32(at, "a local header") != kLocalSig) b.fail(at, fmt::format("entry {} has no local header there", e.name));
  const std::uint16_t nlen = b.u16(at + 26, "the local name"), xlen = b.u16(at + 28, "the local extra field");
  if (b.sub(at + kLocalBytes, nlen, "the local name") != e.name)
    b.fail(at, fmt::format("entry {}'s local header names another", e.name));
  const std::uint64_t data = at + kLocalBytes + nlen + xlen;
  const std::string_view in = b.sub(data, e.compressed, "an entry's data");
  std::string out = e.method == 0 ? std::string(in) : inflate_raw(b, data, in, e.size);
  const std::uint32_t crc = crc_of(out);
  if (crc != e.crc32)
    b.fail(data, fmt::format("entry {}'s CRC-32 is {:08x}, its directory says {:08x} (damaged)", e.name, crc, e.crc32));
  return out;
}

bool looks_like_zip(std::string_view bytes) { return bytes.size() >= 4 && bytes.substr(0, 4) == "PK\x03\x04"; }

}  // namespace sb
