// A TensorBoard event file (events.out.tfevents.*: what torch.utils.tensorboard's SummaryWriter,
// tensorboardX and TensorFlow write, and so Hugging Face's TensorBoardCallback): its scalars by tag.
//
// The file is TFRecord framing, record after record:
//   uint64 length (little-endian), uint32 masked CRC-32C of those 8 bytes,
//   length bytes of data,             uint32 masked CRC-32C of the data,
// with masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 (TensorFlow's crc32c::Mask). Each record's
// data is an Event protobuf, read here with a minimal reader of the fields a scalar needs:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; TensorProto tensor = 8; }
//   TensorProto { DataType dtype = 1; TensorShapeProto tensor_shape = 2; bytes tensor_content = 4;
//                 repeated float float_val = 5; repeated double double_val = 6;
//                 repeated int32 int_val = 7; repeated int64 int64_val = 10; }
// A scalar is a simple_value (SummaryWriter.add_scalar), or a tensor of one element of a float or
// integer dtype (TensorFlow 2's tf.summary.scalar): its float_val/double_val/int_val/int64_val, or
// its tensor_content read as the dtype says. Other values (histograms, images, text) are counted and
// skipped; every other field is skipped by its wire type. Non-finite values are kept as such.
//
// Both CRCs are checked. A damaged file (a CRC that does not match, a length over
// kMaxTfRecordBytes, a protobuf that is malformed or has a known field of the wrong wire type, no
// record at all) is a UsageError naming the file and the byte offset (exit 2). A file whose last
// record is cut short (a writer still running, or killed) keeps the records before it, with
// truncated_at saying where.
#pragma once

#include <cstdint>      // std::int64_t
#include <map>          // std::map
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

namespace sb {

inline constexpr std::uint64_t kMaxTfRecordBytes = std::uint64_t(64) << 20;

struct TfScalar {
  std::int64_t step = 0;
  double wall_time = 0;
  double value = 0;
};

struct TfEvents {
  std::string path;
  std::string file_version;  // "brain.Event:2"
  std::map<std::string, std::vector<TfScalar>> scalars;  // by tag, in file order
  std::size_t records = 0, skipped_values = 0;           // skipped: values that are no scalar
  std::optional<std::uint64_t> truncated_at;             // the offset of an incomplete last record
};

// CRC-32C (Castagnoli), and TensorFlow's mask of it.
std::uint32_t crc32c(std::string_view data);
std::uint32_t masked_crc32c(std::string_view data);

TfEvents parse_tfevents(std::string_view bytes, const std::string& path);
TfEvents read_tfevents(const std::string& path);

// True for a file name TensorBoard reads as an event file (events.out.tfevents.<...>).
bool is_tfevents_name(std::string_view filename);

}  // namespace sb
