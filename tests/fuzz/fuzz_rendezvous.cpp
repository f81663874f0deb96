// The env:// rendezvous' parsers (kernels/tcp/env_group.hpp): what rank 0 reads of a connection on
// its port (anyone's: a port scanner, another job, a damaged peer) and what a rank reads from rank 0.
// The first byte picks the parser; the rest is the payload. A hello that does not parse is nullopt,
// a damaged roster or gather is an Error of kind runtime naming it; anything else is a finding.
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint8_t
#include <string>   // std::string

#include "kernels/tcp/env_group.hpp"  // parse_rdzv_hello, parse_rdzv_roster, unpack_parts
#include "tests/fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view payload = sb::fuzz::as_text(data + 1, size - 1);
  try {
    switch (data[0] % 3) {
      case 0:
        if (const auto m = sb::parse_rdzv_hello(payload)) {
          // what parsed is written back the same
          const auto again = sb::parse_rdzv_hello(sb::rdzv_hello_text(*m));
          sb::fuzz::require(again && again->rank == m->rank && again->pid == m->pid && again->host == m->host,
                            "a hello read back from its text is the same");
        }
        break;
      case 1: {
        const auto ms = sb::parse_rdzv_roster(payload, 8);
        sb::fuzz::require(ms.size() <= 8, "a roster of 8 ranks holds at most 8");
        for (const auto& m : ms) sb::fuzz::require(m.rank >= 0 && m.rank < 8, "every rank of a roster is in range");
        break;
      }
      default: {
        const auto parts = sb::unpack_parts(payload, 16);
        sb::fuzz::require(parts.size() <= 16, "at most max_parts parts");
        std::size_t bytes = 0;
        for (const auto& p : parts) bytes += p.size();
        sb::fuzz::require(bytes <= payload.size(), "the parts are within the bytes");
        sb::fuzz::require(sb::unpack_parts(sb::pack_parts(parts), 16) == parts, "parts packed read back the same");
      }
    }
  } catch (const sb::Error& e) {
    if (e.kind() != sb::ErrorKind::runtime || std::string_view(e.what()).find("damaged") == std::string_view::npos)
      throw;
  }
  return 0;
}
