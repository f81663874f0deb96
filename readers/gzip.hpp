#pragma once
// gzip for what stallbench writes: a --trace NAME.json.gz is a gzip file (HTA's and TensorBoard's
// loaders open *.json.gz with gzip). Reading is kineto.cpp's (zlib's gzread, streamed).

#include <string>       // std::string
#include <string_view>  // std::string_view

namespace sb::readers {

// `text` as a gzip file's bytes, whole in memory (a trace stallbench writes is at most tens of MB).
// Throws Error when zlib fails or the text is over 4 GiB.
std::string gzip_compress(std::string_view text);

}  // namespace sb::readers
