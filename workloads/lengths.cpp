// Sequence-length specs for the packing scenario: parsing (fixed, uniform,
// lognormal, @FILE of lengths or a CSV histogram) and seeded generation.
#include "workloads/lengths.hpp"

#include "harness/text.hpp"  // trim, split, parse_whole

#include <algorithm>     // std::max, std::min, std::shuffle
#include <cctype>        // std::isalpha
#include <cerrno>        // errno
#include <charconv>      // std::from_chars
#include <cmath>         // std::exp, std::log, std::sqrt, std::cos
#include <cstring>       // std::strerror
#include <sstream>       // std::istringstream
#include <limits>        // std::numeric_limits
#include <numbers>       // std::numbers::pi
#include <optional>      // std::optional
#include <string_view>   // std::string_view

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // sb::UsageError
#include "harness/random.hpp"  // counter_hash
#include "harness/files.hpp"   // read_regular_file

namespace sb::packing {

namespace {


constexpr std::int64_t kMaxLength = std::numeric_limits<std::int32_t>::max();
constexpr const char* kForms =
    "expected fixed:N, uniform:LO,HI, lognormal:MEAN,SIGMA or @FILE";

// ---- parsing ---------------------------------------------------------------

using text::trim;
using text::split;

template <class T>
std::optional<T> number(std::string_view s) { return text::parse_whole<T>(s); }

std::optional<std::int32_t> length_field(std::string_view s) {
  const auto v = number<std::int64_t>(s);
  if (!v || *v < 1 || *v > kMaxLength) return std::nullopt;
  return std::int32_t(*v);
}

// Reads "@FILE". The first data line decides the format: a comma makes it a
// CSV histogram (and a first line whose length field is not a number is its
// header); every later line must then have the same shape.
void parse_length_text(std::string text, const std::string& path, LengthSpec& out) {
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);  // a UTF-8 byte-order mark (spreadsheets write one)
  std::istringstream in(std::move(text));
  enum class Shape { unknown, per_line, csv } shape = Shape::unknown;
  std::int64_t total = 0;
  std::string raw;
  for (std::int64_t line_no = 1; std::getline(in, raw); ++line_no) {
    std::string_view line = raw;
    if (const auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty()) continue;
    const auto bad = [&](std::string_view what) {
      return UsageError(fmt::format("lengths file '{}' line {}: expected {}, got '{}'", path,
                                    line_no, what, line));
    };
    const bool comma = line.find(',') != std::string_view::npos;
    if (shape == Shape::unknown) {
      shape = comma ? Shape::csv : Shape::per_line;
      const std::string_view first = split(line, ',')[0];
      if (comma && !first.empty() && std::isalpha(static_cast<unsigned char>(first[0])))
        continue;  // a "length,count" header
    }
    if (shape == Shape::per_line) {
      const auto len = comma ? std::nullopt : length_field(line);
      if (!len) throw bad("one length per line (an integer in [1, 2147483647])");
      out.lengths.push_back(*len);
      ++total;
    } else {
      const auto fields = split(line, ',');
      const auto len = fields.size() == 2 ? length_field(fields[0]) : std::nullopt;
      const auto count = fields.size() == 2 ? number<std::int64_t>(fields[1]) : std::nullopt;
      if (!len || !count || *count < 0 || *count > (std::int64_t(1) << 40))
        throw bad("'length,count' (length in [1, 2147483647], count in [0, 2^40])");
      out.histogram.push_back({*len, *count});
      // Counts up to 2^40 each: the sum is capped at 2^50 sequences (a
      // million times Wikipedia's), far below where int64 sums overflow.
      if (total > (std::int64_t(1) << 50) - *count)
        throw UsageError(fmt::format("lengths file '{}' holds over 2^50 sequences in all", path));
      total += *count;
    }
  }
  if (in.bad()) throw UsageError(fmt::format("cannot read lengths file '{}'", path));
  if (total == 0) throw UsageError(fmt::format("lengths file '{}' holds no lengths", path));
  out.kind = shape == Shape::csv ? LengthSpec::Kind::file_histogram : LengthSpec::Kind::file_lengths;
}

void read_length_file(const std::string& path, LengthSpec& out) {
  // A regular file only (a FIFO or /dev/zero would block or never end), and
  // at most kMaxInputBytes: work is bounded by the data actually present.
  parse_length_text(read_regular_file(path, "lengths file"), path, out);
}

// ---- counter-based random numbers: value(seed, index), so runs repeat -------

std::uint64_t draw(std::uint64_t seed, std::uint64_t index) { return counter_hash(seed, index); }
double unit(std::uint64_t h) { return double(h >> 11) * 0x1p-53; }  // [0, 1)
// Uniform in [0, range) without modulo bias worth naming (Lemire's multiply-high).
std::uint64_t below(std::uint64_t h, std::uint64_t range) {
  return std::uint64_t((unsigned __int128)h * range >> 64);
}


}  // namespace

LengthSpec parse_lengths(const std::string& spec) {
  LengthSpec out;
  out.text = spec;
  if (!spec.empty() && spec[0] == '@') {
    if (spec.size() == 1) throw UsageError("length spec '@' names no file; " + std::string(kForms));
    read_length_file(spec.substr(1), out);
    return out;
  }
  const auto colon = spec.find(':');
  const std::string_view word = std::string_view(spec).substr(0, colon);
  const auto args = colon == std::string::npos ? std::vector<std::string_view>{}
                                               : split(std::string_view(spec).substr(colon + 1), ',');
  const auto fail = [&](std::string_view why) {
    return UsageError(fmt::format("bad length spec '{}': {}; {}", spec, why, kForms));
  };
  const auto want = [&](std::size_t n) {
    if (args.size() != n) throw fail(fmt::format("'{}' takes {} number{}", word, n, n == 1 ? "" : "s"));
  };
  if (word == "fixed" || word == "uniform") {
    out.kind = word == "fixed" ? LengthSpec::Kind::fixed : LengthSpec::Kind::uniform;
    want(out.kind == LengthSpec::Kind::fixed ? 1 : 2);
    const auto lo = length_field(args[0]);
    const auto hi = length_field(args.back());
    if (!lo || !hi) throw fail("lengths are integers in [1, 2147483647]");
    if (*lo > *hi) throw fail("LO must be <= HI");
    out.lo = *lo;
    out.hi = *hi;
  } else if (word == "lognormal") {
    out.kind = LengthSpec::Kind::lognormal;
    want(2);
    const auto mean = number<double>(args[0]);
    const auto sigma = number<double>(args[1]);
    if (!mean || !(*mean > 0) || !std::isfinite(*mean)) throw fail("MEAN must be a number > 0");
    if (!sigma || !(*sigma >= 0) || *sigma > 20) throw fail("SIGMA must be a number in [0, 20]");
    out.mean = *mean;
    out.sigma = *sigma;
  } else {
    throw fail(fmt::format("unknown distribution '{}'", word));
  }
  return out;
}

LengthSpec parse_length_file_text(std::string text, const std::string& path) {
  LengthSpec out;
  out.text = "@" + path;
  parse_length_text(std::move(text), path, out);
  return out;
}

std::vector<std::int32_t> generate_lengths(const LengthSpec& spec, std::int64_t n,
                                           std::uint64_t seed, std::int32_t cap, std::int64_t* over_cap) {
  if (n < 0) throw UsageError(fmt::format("cannot generate {} lengths", n));
  const double top = cap > 0 ? double(cap) : double(kMaxLength);
  std::int64_t over = 0;
  const auto clip = [&](double x, std::int64_t times = 1) {  // NaN/inf from an extreme sigma land on the cap
    if (!(x <= top)) over += times;  // times: the values this one stands for
    return std::int32_t(!(x < top) ? top : x < 1 ? 1 : x);
  };
  std::vector<std::int32_t> out;
  switch (spec.kind) {
    case LengthSpec::Kind::fixed:
      out.assign(std::size_t(n), clip(double(spec.lo), n));
      break;
    case LengthSpec::Kind::uniform: {
      out.resize(std::size_t(n));
      const auto range = std::uint64_t(spec.hi - spec.lo + 1);
      for (std::int64_t i = 0; i < n; ++i)
        out[std::size_t(i)] = clip(double(spec.lo + std::int64_t(below(draw(seed, std::uint64_t(i)), range))));
      break;
    }
    case LengthSpec::Kind::lognormal: {
      // E[exp(mu + sigma Z)] = exp(mu + sigma^2/2) = MEAN. Box-Muller from two
      // counter draws per index, rounded to the nearest token.
      out.resize(std::size_t(n));
      const double mu = std::log(spec.mean) - 0.5 * spec.sigma * spec.sigma;
      for (std::int64_t i = 0; i < n; ++i) {
        const double u1 = 1.0 - unit(draw(seed, 2 * std::uint64_t(i)));  // (0, 1]: log is finite
        const double u2 = unit(draw(seed, 2 * std::uint64_t(i) + 1));
        const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
        out[std::size_t(i)] = clip(std::floor(std::exp(mu + spec.sigma * z) + 0.5));
      }
      break;
    }
    case LengthSpec::Kind::file_lengths: {
      const std::size_t m = spec.lengths.size();
      out.resize(n == 0 ? m : std::size_t(n));
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = clip(double(spec.lengths[i % m]));
      break;
    }
    case LengthSpec::Kind::file_histogram: {
      std::vector<std::int64_t> cumulative;
      std::int64_t total = 0;
      for (const auto& [len, count] : spec.histogram) cumulative.push_back(total += count);
      if (n == 0) {
        if (total > (std::int64_t(1) << 31))
          throw UsageError(fmt::format("'{}' holds {} sequences; give a count to sample", spec.text, total));
        out.reserve(std::size_t(total));
        for (const auto& [len, count] : spec.histogram) out.insert(out.end(), std::size_t(count), clip(len, count));
        for (std::size_t i = out.size(); i > 1; --i)  // Fisher-Yates with the seed
          std::swap(out[i - 1], out[below(draw(seed, i), i)]);
      } else {
        out.resize(std::size_t(n));
        for (std::int64_t i = 0; i < n; ++i) {
          const auto r = std::int64_t(below(draw(seed, std::uint64_t(i)), std::uint64_t(total)));
          const auto at = std::upper_bound(cumulative.begin(), cumulative.end(), r) - cumulative.begin();
          out[std::size_t(i)] = clip(spec.histogram[std::size_t(at)].length);
        }
      }
      break;
    }
  }
  if (over_cap) *over_cap = over;
  return out;
}
}  // namespace sb::packing
