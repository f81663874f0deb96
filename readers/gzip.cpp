#include "readers/gzip.hpp"

#include <zlib.h>  // deflateInit2, deflate

#include <limits>  // std::numeric_limits

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // Error

namespace sb::readers {

std::string gzip_compress(std::string_view text) {
  if (text.size() > std::numeric_limits<uInt>::max())
    throw Error(ErrorKind::runtime, fmt::format("a {} byte trace is too large to gzip in one piece", text.size()));
  z_stream z{};
  // windowBits 15 + 16: the gzip wrapper (header and CRC), what gzopen and Python's gzip read
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    throw Error(ErrorKind::runtime, "zlib: deflateInit2 failed");
  std::string out(deflateBound(&z, static_cast<uLong>(text.size())), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) throw Error(ErrorKind::runtime, fmt::format("zlib: deflate failed ({})", rc));
  return out;
}

}  // namespace sb::readers
