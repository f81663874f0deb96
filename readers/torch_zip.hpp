// The container of a torch.save file (PyTorch 1.6+): a zip archive whose entries are
// `<archive>/data.pkl` (the pickled object), `<archive>/version`, `<archive>/byteorder`,
// `<archive>/data/<key>` (tensor storages) and a few more, written by PyTorch's miniz-based
// PyTorchStreamWriter uncompressed ("stored") and padded to 64-byte alignment.
//
// Read from the central directory at the end (ZIP64 where its fields say so), each entry's local
// header checked against it; stored entries read in place, deflated ones (a file re-zipped by a
// tool) inflated with zlib up to their declared size; each entry's CRC-32 checked. Every offset and
// length is bounds-checked against the file: a truncated archive, an entry past the end, an
// encrypted or multi-disk one, or a CRC that does not match is a UsageError naming the file, the
// entry and the byte offset (exit 2).
#pragma once

#include <cstdint>      // std::uint64_t
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

namespace sb {

inline constexpr std::size_t kMaxZipEntries = 65536;
inline constexpr std::uint64_t kMaxZipEntryBytes = std::uint64_t(256) << 20;  // as kMaxInputBytes

struct ZipEntry {
  std::string name;
  std::uint64_t offset = 0;  // of its local header
  std::uint64_t size = 0, compressed = 0;
  std::uint32_t crc32 = 0;
  std::uint16_t method = 0;  // 0 stored, 8 deflate
};

// The archive's entries, in the central directory's order. `file` names it in messages.
std::vector<ZipEntry> zip_entries(std::string_view bytes, const std::string& file);

// One entry's bytes (stored: a copy of them; deflated: inflated), its CRC-32 checked.
std::string zip_read(std::string_view bytes, const ZipEntry& e, const std::string& file);

// True when bytes start like a zip archive (a local file header).
bool looks_like_zip(std::string_view bytes);

}  // namespace sb
