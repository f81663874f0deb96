// A strict reader of the pickle subset that PyTorch's Flight Recorder dumps
// use (protocol 2 from torch's C++ pickler; protocols up to 5 from Python's),
// turned into JSON values: dict -> object (keys must be strings or ints, ints
// become their decimal text), list and tuple -> array, None -> null, bool,
// int (up to 64 bits), float, str. Nothing is ever executed or imported: the
// only globals accepted are torch.jit._pickle's identity helpers
// (restore_type_tag, build_intlist, build_doublelist, build_boollist,
// build_tensorlist is refused), which return their first argument. Any other
// opcode or global, a truncated stream, a bad memo index, nesting deeper than
// kMaxPickleDepth or more than kMaxPickleNodes values is a UsageError naming
// the file, the opcode and its byte offset.
#pragma once

#include <cstddef>      // std::size_t
#include <string>       // std::string
#include <string_view>  // std::string_view

#include <nlohmann/json.hpp>  // nlohmann::ordered_json

namespace sb {

inline constexpr int kMaxPickleDepth = 64;
inline constexpr std::size_t kMaxPickleNodes = std::size_t(1) << 27;

// True when bytes start like a pickle (PROTO 2..5).
bool looks_like_pickle(std::string_view bytes);

// Throws UsageError("<file>: pickle: ... at offset N").
nlohmann::ordered_json read_pickle(std::string_view bytes, const std::string& file);

}  // namespace sb
