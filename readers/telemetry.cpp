// The telemetry log reader (formats and rules in telemetry.hpp): one pass over
// the lines, a header turned into a plan (which column fills which Sample
// field, in which unit), then each row read by the plan.
#include "readers/telemetry.hpp"

#include "harness/text.hpp"  // trim, split, parse_whole

#include <algorithm>     // std::find, std::max
#include <charconv>      // std::from_chars
#include <cmath>         // std::isfinite
#include <cstdlib>       // std::llabs
#include <deque>         // std::deque
#include <map>           // std::map
#include <set>           // std::set
#include <system_error>  // std::errc
#include <utility>       // std::move
#include <vector>        // std::vector

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/errors.hpp"  // UsageError
#include "harness/files.hpp"   // read_regular_file, quoted_text

namespace sb::telemetry {
namespace {

constexpr auto npos = std::string_view::npos;

// ---------------------------------------------------------------- text

using text::trim;
using text::split;

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.substr(s.size() - p.size()) == p; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// At most 60 bytes of a line for a message, escaped: a binary file must not put its bytes on the terminal.
std::string snippet(std::string_view s) { return quoted_text(s, 60); }

// "1 value", "3 values"
std::string count(std::size_t n, const char* what) { return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s"); }

std::vector<std::string_view> words(std::string_view s) {
  std::vector<std::string_view> out;
  for (std::size_t i = 0; i < s.size();) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    const std::size_t b = i;
    while (i < s.size() && s[i] != ' ' && s[i] != '\t') ++i;
    if (i > b) out.push_back(s.substr(b, i - b));
  }
  return out;
}

// The lines of a text, "\n" or "\r\n" ended, a UTF-8 byte-order mark skipped;
// number() is the 1-based number of the line last returned.
class Lines {
 public:
  explicit Lines(std::string_view text) : text_(text) {
    if (starts_with(text_, "\xEF\xBB\xBF")) text_.remove_prefix(3);
  }
  bool next(std::string_view& line) {
    if (pos_ >= text_.size()) return false;
    auto nl = text_.find('\n', pos_);
    if (nl == npos) nl = text_.size();
    line = text_.substr(pos_, nl - pos_);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    pos_ = nl + 1;
    ++number_;
    return true;
  }
  std::size_t number() const { return number_; }

 private:
  std::string_view text_;
  std::size_t pos_ = 0, number_ = 0;
};

// ---------------------------------------------------------------- numbers

std::optional<double> to_double(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);  // from_chars takes no '+'
  const auto v = text::parse_whole<double>(s);
  if (!v || !std::isfinite(*v)) return std::nullopt;
  return v;
}

template <typename Int>
std::optional<Int> to_int(std::string_view s, int base = 10) { return text::parse_whole<Int>(s, base); }

// A bitmask as nvidia-smi ("0x0000000000000004") or dcgmi ("4") prints it.
std::optional<std::uint64_t> to_mask(std::string_view s) {
  if (starts_with(s, "0x") || starts_with(s, "0X")) return to_int<std::uint64_t>(s.substr(2), 16);
  return to_int<std::uint64_t>(s);
}

// Microseconds since 1970-01-01 of nvidia-smi's "YYYY/MM/DD HH:MM:SS[.fff]",
// read as UTC: it is local time, but only differences are used.
std::optional<std::int64_t> smi_time(std::string_view s) {
  auto num = [&](std::size_t at, std::size_t n) -> int {
    int v = 0;
    for (std::size_t i = at; i < at + n; ++i) {
      if (!is_digit(s[i])) return -1;
      v = v * 10 + (s[i] - '0');
    }
    return v;
  };
  if (s.size() < 19 || s[4] != '/' || s[7] != '/' || s[10] != ' ' || s[13] != ':' || s[16] != ':') return std::nullopt;
  const int y = num(0, 4), mo = num(5, 2), d = num(8, 2), h = num(11, 2), mi = num(14, 2), sec = num(17, 2);
  if (y < 1970 || mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 || sec < 0 || sec > 60)
    return std::nullopt;
  std::int64_t us = 0;
  if (s.size() > 19) {
    if (s[19] != '.' || s.size() == 20 || s.size() > 29) return std::nullopt;
    std::int64_t scale = 100000;
    for (std::size_t i = 20; i < s.size(); ++i, scale /= 10) {
      if (!is_digit(s[i])) return std::nullopt;
      us += (s[i] - '0') * scale;  // digits past the sixth add 0
    }
  }
  // days from 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil)
  const int yy = y - (mo <= 2);
  const int era = yy / 400, yoe = yy - era * 400;
  const int doy = (153 * (mo + (mo > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const std::int64_t days = std::int64_t(era) * 146097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719468;
  return ((days * 24 + h) * 60 + mi) * std::int64_t(60'000'000) + std::int64_t(sec) * 1'000'000 + us;
}

// ---------------------------------------------------------------- fields

enum class Field : std::uint8_t {
  util, mem_util, sm_clock, sm_clock_max, power, power_limit, temp, mem_used, mem_total,
  mem_free,  // read only to derive mem_total
  pcie_tx, pcie_rx, reasons, sm_active, sm_occupancy, tensor_active, dram_active,
};
constexpr std::size_t kFields = std::size_t(Field::dram_active) + 1;

std::optional<double> Sample::*member(Field f) {
  switch (f) {
    case Field::util: return &Sample::util_pct;
    case Field::mem_util: return &Sample::mem_util_pct;
    case Field::sm_clock: return &Sample::sm_clock_mhz;
    case Field::sm_clock_max: return &Sample::sm_clock_max_mhz;
    case Field::power: return &Sample::power_w;
    case Field::power_limit: return &Sample::power_limit_w;
    case Field::temp: return &Sample::temp_c;
    case Field::mem_used: return &Sample::mem_used_mib;
    case Field::mem_total: return &Sample::mem_total_mib;
    case Field::pcie_tx: return &Sample::pcie_tx_mb_s;
    case Field::pcie_rx: return &Sample::pcie_rx_mb_s;
    case Field::sm_active: return &Sample::sm_active;
    case Field::sm_occupancy: return &Sample::sm_occupancy;
    case Field::tensor_active: return &Sample::tensor_active;
    case Field::dram_active: return &Sample::dram_active;
    case Field::mem_free:
    case Field::reasons: break;
  }
  return nullptr;
}

// A name the log may give a column, the field it fills, the unit nvidia-smi
// prints for it ("" for none), the factor to the Sample's unit, and its rank
// among the names of one field (0 is preferred; a second column of the same
// field is then ignored).
struct Known {
  std::string_view name;
  Field field;
  std::string_view unit;
  double scale;
  int rank;
};

// nvidia-smi --help-query-gpu names; the header prints the first, long form.
constexpr Known kSmiNames[] = {
    {"utilization.gpu", Field::util, "%", 1, 0},
    {"utilization.memory", Field::mem_util, "%", 1, 0},
    {"clocks.current.sm", Field::sm_clock, "MHz", 1, 0},
    {"clocks.sm", Field::sm_clock, "MHz", 1, 1},
    {"clocks.max.sm", Field::sm_clock_max, "MHz", 1, 0},
    {"power.draw", Field::power, "W", 1, 0},
    {"power.draw.instant", Field::power, "W", 1, 1},
    {"power.draw.average", Field::power, "W", 1, 2},
    {"enforced.power.limit", Field::power_limit, "W", 1, 0},
    {"power.limit", Field::power_limit, "W", 1, 1},
    {"temperature.gpu", Field::temp, "", 1, 0},
    {"memory.used", Field::mem_used, "MiB", 1, 0},
    {"memory.total", Field::mem_total, "MiB", 1, 0},
    {"memory.free", Field::mem_free, "MiB", 1, 0},
    {"clocks_event_reasons.active", Field::reasons, "", 1, 0},
    {"clocks_throttle_reasons.active", Field::reasons, "", 1, 1},
};

// dcgmi dmon short names (DCGM's dcgm_fields.cpp; `dcgmi dmon -l` lists them).
constexpr Known kDcgmNames[] = {
    {"GPUTL", Field::util, "", 1, 0},
    {"MCUTL", Field::mem_util, "", 1, 0},
    {"SMCLK", Field::sm_clock, "", 1, 0},
    {"SMMAX", Field::sm_clock_max, "", 1, 0},
    {"POWER", Field::power, "", 1, 0},
    {"POWINST", Field::power, "", 1, 1},
    {"EPLMT", Field::power_limit, "", 1, 0},
    {"PMLMT", Field::power_limit, "", 1, 1},
    {"TMPTR", Field::temp, "", 1, 0},
    {"FBUSD", Field::mem_used, "", 1, 0},
    {"FBTTL", Field::mem_total, "", 1, 0},
    {"FBFRE", Field::mem_free, "", 1, 0},
    {"PCITX", Field::pcie_tx, "", 1e-6, 0},  // bytes/s -> MB/s
    {"PCIRX", Field::pcie_rx, "", 1e-6, 0},
    {"DVCCTR", Field::reasons, "", 1, 0},
    {"SMACT", Field::sm_active, "", 1, 0},
    {"SMOCC", Field::sm_occupancy, "", 1, 0},
    {"TENSO", Field::tensor_active, "", 1, 0},
    {"DRAMA", Field::dram_active, "", 1, 0},
};

template <std::size_t N>
const Known* find_known(const Known (&table)[N], std::string_view name) {
  for (const Known& k : table)
    if (k.name == name) return &k;
  return nullptr;
}

// What one header makes of its columns.
struct Plan {
  std::vector<std::string> names;   // as the header gives them
  std::vector<std::string> units;   // nvidia-smi: the bracketed unit, or ""
  std::vector<const Known*> use;    // per column: the field it fills, or null
  std::vector<std::size_t> starts;  // dcgmi: where each name starts on the header line
  int index_col = -1, time_col = -1;
  int id_col = -1;  // without index: pci.bus_id or uuid, numbered in order of first appearance
  bool derive_total = false;  // mem_total = mem_used + mem_free
  std::size_t line = 0;       // of the header
};

// Marks, per field, the preferred column; the rest stay unused.
void choose(Plan& p, const std::vector<const Known*>& found) {
  p.use.assign(found.size(), nullptr);
  for (std::size_t f = 0; f < kFields; ++f) {
    int best = -1;
    for (std::size_t c = 0; c < found.size(); ++c)
      if (found[c] && std::size_t(found[c]->field) == f && (best < 0 || found[c]->rank < found[std::size_t(best)]->rank))
        best = int(c);
    if (best >= 0) p.use[std::size_t(best)] = found[std::size_t(best)];
  }
  bool total = false, free = false;
  for (const Known* k : p.use) {
    total = total || (k && k->field == Field::mem_total);
    free = free || (k && k->field == Field::mem_free);
  }
  p.derive_total = !total && free;
  if (total)  // memory.free / FBFRE is only a way to the total
    for (const Known*& k : p.use)
      if (k && k->field == Field::mem_free) k = nullptr;
}

// The Recording being built, with what its notes need.
class Builder {
 public:
  Builder(std::string name, std::string format) : name_(std::move(name)) { rec_.format = std::move(format); }

  std::string where(std::size_t line) const { return fmt::format("{}:{}", name_, line); }
  [[noreturn]] void fail(std::size_t line, const std::string& what) const { throw UsageError(where(line) + ": " + what); }

  void take_header(const Plan& p) {
    for (std::size_t c = 0; c < p.names.size(); ++c) {
      const std::string& n = p.names[c];
      if (std::find(rec_.columns.begin(), rec_.columns.end(), n) == rec_.columns.end()) rec_.columns.push_back(n);
      const bool used = p.use[c] || int(c) == p.index_col || int(c) == p.time_col;
      if (!used && std::find(rec_.ignored.begin(), rec_.ignored.end(), n) == rec_.ignored.end()) rec_.ignored.push_back(n);
    }
    if (p.derive_total && !derived_noted_) {
      rec_.notes.push_back(rec_.format == "dcgmi" ? "mem_total_mib is FBUSD + FBFRE (no FBTTL column)"
                                                  : "mem_total_mib is memory.used + memory.free (no memory.total column; "
                                                    "nvidia-smi's memory.total also counts reserved memory)");
      derived_noted_ = true;
    }
  }

  // Reads value `v` of column `c` (its unit already stripped) into `s`.
  // False when it is not a number; empty values are counted per column name.
  bool set(Sample& s, double& free_mib, const Plan& p, std::size_t c, std::string_view v) {
    const Known& k = *p.use[c];
    if (v.empty() || v == "N/A" || (v.front() == '[' && v.back() == ']')) {
      ++empty_[p.names[c]];
      return true;
    }
    if (k.field == Field::reasons) {
      const auto m = to_mask(v);
      if (!m) return false;
      s.clock_event_reasons = *m;
      return true;
    }
    const auto d = to_double(v);
    if (!d) return false;
    // A value no GPU reports is a damaged log, not a reading: a percentage
    // outside 0..100, a DCGM ratio outside 0..1 (a little over: DCGM rounds),
    // a negative or absurd clock, power, memory or rate.
    const double x = *d * k.scale;
    const bool pct = k.field == Field::util || k.field == Field::mem_util;
    const bool ratio = k.field == Field::sm_active || k.field == Field::sm_occupancy ||
                       k.field == Field::tensor_active || k.field == Field::dram_active;
    if (!std::isfinite(x) || x < (k.field == Field::temp ? -100 : 0) || (pct && x > 100) || (ratio && x > 1.01) ||
        x > 1e9) {
      range_error_ = true;
      return false;
    }
    if (k.field == Field::mem_free) free_mib = x;
    else s.*member(k.field) = *d * k.scale;
    return true;
  }

  void cut(const std::string& column) { ++cut_[column]; }

  // A pause far longer than the log's interval (a restarted nvidia-smi appending to one file, a clock that
  // jumped: a hostile review's 2024 -> 2099 was read as 75 years of watch) is named: the duration and the
  // stuck time count it.
  void gap_note() {
    std::map<int, std::vector<double>> times;
    for (const Sample& x : rec_.samples) times[x.gpu].push_back(x.t_s);
    double worst = 0, from = 0;
    int gpu = 0;
    for (auto& [g, t] : times) {
      if (t.size() < 3) continue;
      std::vector<double> dt;
      for (std::size_t i = 1; i < t.size(); ++i) dt.push_back(t[i] - t[i - 1]);
      std::vector<double> sorted = dt;
      std::nth_element(sorted.begin(), sorted.begin() + std::ptrdiff_t(sorted.size() / 2), sorted.end());
      const double median = sorted[sorted.size() / 2];
      for (std::size_t i = 0; i < dt.size(); ++i)
        if (dt[i] > std::max(60.0, 20 * median) && dt[i] > worst) worst = dt[i], from = t[i], gpu = g;
    }
    if (worst > 0)
      rec_.notes.push_back(fmt::format("GPU {}: no sample for {:.0f} s from t={:.1f} s (the log's interval is far "
                                       "shorter): a restarted log or a clock that jumped; the duration and any "
                                       "stuck time count the gap",
                                       gpu, worst, from));
  }
  // Why the last set() refused: "out of range" or "not a number".
  const char* refused() {
    const bool r = range_error_;
    range_error_ = false;
    return r ? "is out of range for it" : "is not a number";
  }

  void add(Sample s, const Plan& p, double free_mib) {
    if (p.derive_total && s.mem_used_mib && free_mib >= 0) s.mem_total_mib = *s.mem_used_mib + free_mib;
    gpus_.insert(s.gpu);
    rec_.samples.push_back(s);
  }

  std::vector<std::string>& notes() { return rec_.notes; }
  const std::string& name() const { return name_; }

  Recording finish(std::size_t last_line) {
    if (rec_.samples.empty()) fail(last_line, "no GPU samples: the log has a header but no rows of GPU readings");
    gap_note();
    for (const auto& [col, n] : empty_)
      rec_.notes.push_back(fmt::format("'{}': {} of {} values empty (N/A, [Not Supported] or another bracketed value)", col, n,
                                       rec_.samples.size()));
    for (const auto& [col, n] : cut_)
      rec_.notes.push_back(fmt::format("'{}': {} cut to the column's width by dcgmi (\"...\") read as empty", col, count(n, "value")));
    rec_.gpus = int(gpus_.size());
    return std::move(rec_);
  }

 private:
  std::string name_;
  Recording rec_;
  std::map<std::string, std::size_t> empty_, cut_;
  bool range_error_ = false;
  std::set<int> gpus_;
  bool derived_noted_ = false;
};

// "line 3, 17, 31 and 2 more" for notes.
std::string line_list(const std::vector<std::size_t>& lines) {
  std::string s;
  for (std::size_t i = 0; i < lines.size() && i < 5; ++i) s += (i ? ", " : "") + std::to_string(lines[i]);
  if (lines.size() > 5) s += fmt::format(" and {} more", lines.size() - 5);
  return s;
}

std::string interval_note(double interval_ms, bool defaulted, const char* what) {
  if (defaulted) return fmt::format("no timestamps: {}'s delay of 1000 ms assumed (its -d default; give the interval if another was used)", what);
  return fmt::format("no timestamps: readings taken as {} ms apart (the interval given)", interval_ms);
}

// ---------------------------------------------------------------- nvidia-smi

// "utilization.gpu [%]" -> name, unit. False when the text is not a field name.
bool smi_column(std::string_view f, std::string_view& base, std::string_view& unit) {
  base = f;
  unit = {};
  if (const auto b = f.find(" ["); b != npos) {
    if (f.back() != ']' || f.find(']') != f.size() - 1) return false;
    base = f.substr(0, b);
    unit = f.substr(b + 2, f.size() - b - 3);
  }
  if (base.empty() || !is_alpha(base.front())) return false;
  for (char c : base)
    if (!is_alpha(c) && !is_digit(c) && c != '_' && c != '.') return false;
  return true;
}

// A header line: every field a name, one of them "timestamp", "index" or
// dotted (nvidia-smi's names are: utilization.gpu, pci.bus_id); a data row
// always has a value that is none (a number, a date, a bus id).
bool smi_header(const std::vector<std::string_view>& fields) {
  bool ours = false;
  for (std::string_view f : fields) {
    std::string_view base, unit;
    if (!smi_column(f, base, unit)) return false;
    ours = ours || base == "timestamp" || base == "index" || base.find('.') != npos;
  }
  return ours;
}

Plan smi_plan(const Builder& b, const std::vector<std::string_view>& fields, std::size_t line) {
  Plan p;
  p.line = line;
  std::vector<const Known*> found;
  for (std::string_view f : fields) {
    std::string_view base, unit;
    smi_column(f, base, unit);
    const int c = int(p.names.size());
    p.names.emplace_back(f);
    p.units.emplace_back(unit);
    const Known* k = find_known(kSmiNames, base);
    if (base == "index" && p.index_col < 0) p.index_col = c;
    if (base == "timestamp" && p.time_col < 0) p.time_col = c;
    if ((base == "pci.bus_id" || base == "uuid") && p.id_col < 0) p.id_col = c;
    if (k && !k->unit.empty() && !unit.empty() && unit != k->unit)
      b.fail(line, fmt::format("column '{}' is in {}, not {} as nvidia-smi writes it", f, unit, k->unit));
    found.push_back(k);
  }
  // Without an index, a log names its GPUs by bus id or uuid, or is of one GPU
  // (refused when its rows show several: rows that share a timestamp, or
  // refuse_unnamed_gpus's groups of rows a few ms apart).
  if (p.index_col < 0 && p.id_col < 0 && p.time_col < 0)
    b.fail(line, "no 'index' column and no timestamp: nothing tells the GPU of each row (record with "
                 "--query-gpu=timestamp,index,...); columns: " + snippet(fmt::format("{}", fmt::join(p.names, ", "))));
  choose(p, found);
  return p;
}

constexpr std::int64_t kHourUs = 3'600'000'000LL;

// The median (the upper one of an even count) of a few values; a copy is partly sorted.
template <class Values>
std::int64_t median_of(const Values& xs) {
  std::vector<std::int64_t> v(xs.begin(), xs.end());
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// A row read as GPU 0 for want of an index: when, and its line.
struct UnnamedRow {
  std::int64_t at_us;
  std::size_t line;
};

// nvidia-smi reads the GPUs of one reading one after another and stamps each
// row on its own (11:27:05.177, .188, .192 for three GPUs), so a log of
// several GPUs without index, bus id or uuid has rows that share no timestamp:
// read as one GPU it alternates busy and idle GPUs and reads as spiky. Such a
// log has row gaps of two kinds: a few ms inside a reading, the -l interval
// between readings. It is refused when some split of the gaps (the longer at
// least 4 times the shorter) cuts the rows into groups of one size K >= 2 (three
// groups or more, three in four of that size) whose span is under half the gap
// between them. A one-GPU log has one kind of gap (and pauses, which do not
// cut it into groups of one size); rows of several GPUs spread evenly over the
// interval cannot be told from one GPU's, and are read as one.
void refuse_unnamed_gpus(const std::vector<UnnamedRow>& rows, Builder& b) {
  if (rows.size() < 6) return;
  std::vector<std::int64_t> gaps(rows.size() - 1);
  for (std::size_t i = 0; i + 1 < rows.size(); ++i) gaps[i] = rows[i + 1].at_us - rows[i].at_us;
  std::vector<std::int64_t> sorted = gaps;
  std::sort(sorted.begin(), sorted.end());
  const auto ms = [](std::int64_t us) { return std::max<std::int64_t>(us, 1000); };  // nvidia-smi prints ms
  int splits = 0;
  for (std::size_t j = 0; j + 1 < sorted.size() && splits < 8; ++j) {
    if (ms(sorted[j + 1]) < 4 * ms(sorted[j])) continue;
    ++splits;
    const std::int64_t short_max = sorted[j];
    // the groups: rows joined by gaps up to short_max
    std::vector<std::size_t> starts{0};
    std::vector<std::int64_t> long_gaps;
    for (std::size_t i = 0; i < gaps.size(); ++i)
      if (gaps[i] > short_max) {
        starts.push_back(i + 1);
        long_gaps.push_back(gaps[i]);
      }
    const std::size_t groups = starts.size();
    if (groups < 3) continue;
    std::map<std::size_t, std::size_t> by_size;
    for (std::size_t g = 0; g < groups; ++g) ++by_size[(g + 1 < groups ? starts[g + 1] : rows.size()) - starts[g]];
    const auto modal = std::max_element(by_size.begin(), by_size.end(),
                                        [](const auto& x, const auto& y) { return x.second < y.second; });
    const std::size_t k = modal->first;
    if (k < 2 || 4 * modal->second < 3 * groups) continue;
    std::vector<std::int64_t> spans;
    std::size_t first = groups;  // the first group of size k, for the message
    for (std::size_t g = 0; g < groups; ++g) {
      const std::size_t end = g + 1 < groups ? starts[g + 1] : rows.size();
      if (end - starts[g] != k) continue;
      spans.push_back(rows[end - 1].at_us - rows[starts[g]].at_us);
      if (first == groups) first = g;
    }
    const std::int64_t span = median_of(spans), between = median_of(long_gaps);
    if (2 * span >= between) continue;
    std::string within;
    for (std::size_t i = starts[first]; i + 1 < starts[first] + k && within.size() < 60; ++i)
      within += fmt::format("{}{:.0f}", within.empty() ? "" : ", ", double(rows[i + 1].at_us - rows[i].at_us) / 1e3);
    b.fail(rows[starts[first]].line,
           fmt::format("no 'index' column, and the rows come in groups of {} a few ms apart (lines {} to {}: {} ms) "
                       "every {:.3f} s: {} GPUs, one row each per reading, that nothing tells apart (read as one GPU, "
                       "a busy and an idle one would look spiky); record with the index column: "
                       "nvidia-smi --query-gpu=timestamp,index,...",
                       k, rows[starts[first]].line, rows[starts[first] + k - 1].line, within,
                       double(between + span) / 1e6, k));
  }
}

Recording parse_smi(Lines& lines, std::string_view first, Builder& b, double interval_ms, bool interval_defaulted) {
  Plan plan = smi_plan(b, split(first, ','), lines.number());
  b.take_header(plan);
  std::vector<std::size_t> repeats, changed;
  bool have_t0 = false;
  std::int64_t t0 = 0, latest = 0;
  std::size_t latest_line = 0, held = 0;
  std::int64_t dst_shift = 0;  // µs: the daylight-saving changes taken out
  std::int64_t held_most = 0;
  // the log's regular interval: each GPU's last time, the last gaps between a
  // GPU's rows, and the one the previous row made (-1: its GPU's first)
  std::map<int, std::int64_t> last_at_of;
  std::deque<std::int64_t> recent_gaps;
  std::int64_t prev_row_gap = -1;
  std::vector<UnnamedRow> unnamed;  // rows read as GPU 0 for want of an index
  // without a timestamp column: a reading ends when a GPU repeats
  std::set<int> tick_gpus;
  std::size_t tick = 0;
  bool tick_noted = false;
  // without an index column
  std::map<std::string, int> gpu_ids;
  std::string last_ts;
  std::size_t last_ts_line = 0;
  bool single_noted = false;
  std::string_view line;
  std::vector<std::string_view> fields;
  while (lines.next(line)) {
    if (trim(line).empty()) continue;
    const std::size_t n = lines.number();
    fields = split(line, ',');
    if (smi_header(fields)) {
      Plan next = smi_plan(b, fields, n);
      if (next.names == plan.names) repeats.push_back(n);
      else changed.push_back(n);
      plan = std::move(next);
      b.take_header(plan);
      continue;
    }
    if (fields.size() != plan.names.size())
      b.fail(n, fmt::format("{}, but the header (line {}) names {}: '{}'", count(fields.size(), "value"), plan.line,
                            count(plan.names.size(), "column"), snippet(line)));
    Sample s;
    if (plan.index_col >= 0) {
      const auto gpu = to_int<int>(fields[std::size_t(plan.index_col)]);
      if (!gpu || *gpu < 0) b.fail(n, fmt::format("index '{}' is not a GPU index", snippet(fields[std::size_t(plan.index_col)])));
      s.gpu = *gpu;
    } else if (plan.id_col >= 0) {
      const std::string id(trim(fields[std::size_t(plan.id_col)]));
      const auto [it, fresh] = gpu_ids.emplace(id, int(gpu_ids.size()));
      s.gpu = it->second;
      if (fresh)
        b.notes().push_back(fmt::format("no 'index' column: {} '{}' read as GPU {} (in order of first appearance)",
                                        plan.names[std::size_t(plan.id_col)], snippet(id), s.gpu));
    } else {
      s.gpu = 0;
      const std::string ts(trim(fields[std::size_t(plan.time_col)]));
      if (ts == last_ts)
        b.fail(n, fmt::format("shares its timestamp with line {}: a log of several GPUs needs the 'index' column "
                              "(--query-gpu=timestamp,index,...)", last_ts_line));
      last_ts = ts;
      last_ts_line = n;
      if (!single_noted) {
        b.notes().push_back("no 'index' column: every row read as GPU 0 (one GPU: no two rows share a timestamp, "
                            "and the rows do not come in groups a few ms apart)");
        single_noted = true;
      }
    }
    if (plan.time_col >= 0) {
      const std::string_view ts = fields[std::size_t(plan.time_col)];
      const auto t = smi_time(ts);
      if (!t) b.fail(n, fmt::format("timestamp '{}' is not nvidia-smi's YYYY/MM/DD HH:MM:SS.mmm", snippet(ts)));
      std::int64_t at = *t + dst_shift;
      bool first_row = false;
      if (!have_t0) {
        have_t0 = true;
        t0 = latest = at;
        latest_line = n;
        first_row = true;
      }
      // nvidia-smi writes local time: a daylight-saving change steps the clock by
      // an hour between two rows one interval apart. Taken out, with a note,
      // when the step less an hour is the log's regular interval (the median of
      // the last gaps between a GPU's rows), the step itself is not, and the
      // previous row came at that interval too (the log ran regularly up to it):
      // a -l 60 log's autumn step of -3540 s as well as a -lms 100 log's.
      // Any other step back of more than a second is refused below.
      if (const std::int64_t jump = at - latest;
          !first_row && prev_row_gap >= 0 && !recent_gaps.empty() && std::llabs(jump) >= kHourUs / 2) {
        const std::int64_t regular = median_of(recent_gaps);
        const std::int64_t tol = std::max<std::int64_t>(60'000'000LL, regular / 2);
        const std::int64_t less_hour = jump > 0 ? jump - kHourUs : jump + kHourUs;
        if (std::llabs(less_hour - regular) <= tol && std::llabs(jump - regular) > tol &&
            std::llabs(prev_row_gap - regular) <= tol) {
          const std::int64_t shift = jump > 0 ? -kHourUs : kHourUs;
          dst_shift += shift;
          at += shift;
          b.notes().push_back(fmt::format("line {}: the clock {} by an hour (a daylight-saving change: nvidia-smi "
                                          "writes local time); taken out",
                                          n, jump > 0 ? "jumps forward" : "steps back"));
        }
      }
      if (at < latest - 1'000'000)
        b.fail(n, fmt::format("timestamp '{}' is {:.3f} s before line {}'s: the clock stepped back more than 1 s", snippet(ts),
                              double(latest - at) / 1e6, latest_line));
      if (at < latest) {  // a small wall-clock step back: held at the latest time
        ++held;
        held_most = std::max(held_most, latest - at);
        at = latest;
      } else {
        latest = at;
        latest_line = n;
      }
      s.t_s = double(at - t0) / 1e6;
      if (const auto it = last_at_of.find(s.gpu); it != last_at_of.end()) {
        prev_row_gap = at - it->second;
        recent_gaps.push_back(prev_row_gap);
        if (recent_gaps.size() > 63) recent_gaps.pop_front();
      } else {
        prev_row_gap = -1;
      }
      last_at_of[s.gpu] = at;
      if (plan.index_col < 0 && plan.id_col < 0) unnamed.push_back({at, n});
    } else {
      if (interval_defaulted)
        b.fail(plan.line, "the header has no 'timestamp' column: give the sampling interval (nvidia-smi's -l or -lms value)");
      if (!tick_gpus.insert(s.gpu).second) {
        ++tick;
        tick_gpus = {s.gpu};
      }
      s.t_s = double(tick) * interval_ms / 1000.0;
      if (!tick_noted) {
        b.notes().push_back(interval_note(interval_ms, false, "nvidia-smi"));
        tick_noted = true;
      }
    }
    double free_mib = -1;
    for (std::size_t c = 0; c < fields.size(); ++c) {
      if (!plan.use[c]) continue;
      std::string_view v = fields[c];
      const std::string& unit = plan.units[c];
      if (!unit.empty() && v.size() > unit.size() && ends_with(v, unit) && v[v.size() - unit.size() - 1] == ' ')
        v = trim(v.substr(0, v.size() - unit.size()));
      if (!b.set(s, free_mib, plan, c, v))
        b.fail(n, fmt::format("column '{}': '{}' {}", plan.names[c], snippet(fields[c]), b.refused()));
    }
    b.add(s, plan, free_mib);
  }
  refuse_unnamed_gpus(unnamed, b);
  if (have_t0 && !interval_defaulted)
    b.notes().push_back(fmt::format("the interval given ({} ms) is not used: the log has timestamps", interval_ms));
  if (!repeats.empty())
    b.notes().push_back(fmt::format("the header is repeated at line {} (nvidia-smi restarted, appending to the file)", line_list(repeats)));
  if (!changed.empty())
    b.notes().push_back(fmt::format("a header with other columns starts at line {}", line_list(changed)));
  if (held)
    b.notes().push_back(fmt::format("{} stepped back (up to {:.3f} s: the wall clock was set back) and held at the latest earlier "
                                    "time", count(held, "timestamp"), double(held_most) / 1e6));
  return b.finish(lines.number());
}

// ---------------------------------------------------------------- dcgmi

bool entity_word(std::string_view w) {
  if (w.empty() || !is_alpha(w.front())) return false;
  for (char c : w)
    if (!is_alpha(c) && !is_digit(c) && c != '-' && c != '_') return false;
  return true;
}

bool entity_id(std::string_view w) {
  if (w.empty() || w.size() > 9) return false;
  for (char c : w)
    if (!is_digit(c)) return false;
  return true;
}

Plan dcgm_plan(std::string_view header, std::size_t line) {
  Plan p;
  p.line = line;
  std::vector<const Known*> found;
  const auto w = words(header);
  for (std::size_t i = 1; i < w.size(); ++i) {  // w[0] is "#Entity"
    p.names.emplace_back(w[i]);
    p.units.emplace_back();
    p.starts.push_back(std::size_t(w[i].data() - header.data()));
    found.push_back(find_known(kDcgmNames, w[i]));
  }
  choose(p, found);
  return p;
}

// The values of a row cut at the header's column starts (dcgmi pads every
// column to its width, names and values alike): for values with blanks in
// them. False when a cut falls inside a value, a value is missing or the last
// has a blank (nothing marks where the last column ends).
bool by_position(std::string_view row, const Plan& p, std::vector<std::string_view>& values) {
  values.clear();
  if (p.starts.empty() || row.size() <= p.starts.back()) return false;
  for (std::size_t i = 0; i < p.starts.size(); ++i) {
    const std::size_t b = p.starts[i];
    if (b > 0 && row[b - 1] != ' ' && row[b - 1] != '\t') return false;
    const std::size_t e = i + 1 < p.starts.size() ? p.starts[i + 1] : row.size();
    const std::string_view v = trim(row.substr(b, e - b));
    if (v.empty()) return false;
    values.push_back(v);
  }
  // the last column runs to the end of the line: a blank in it is more values, not one
  return values.back().find_first_of(" \t") == npos;
}

Recording parse_dcgm(Lines& lines, std::string_view first, Builder& b, double interval_ms, bool interval_defaulted) {
  Plan plan = dcgm_plan(first, lines.number());
  if (plan.names.empty()) b.fail(plan.line, "the '#Entity' header names no fields");
  b.take_header(plan);
  b.notes().push_back(interval_note(interval_ms, interval_defaulted, "dcgmi dmon"));
  const double step_s = interval_ms / 1000.0;
  std::size_t headers = 1, stopped = 0, comments = 0, tick = 0;
  std::vector<std::size_t> changed;
  std::set<std::string, std::less<>> in_tick;  // entities of the current tick
  std::map<std::string, std::size_t, std::less<>> others;
  std::string_view line;
  std::vector<std::string_view> values;
  while (lines.next(line)) {
    const std::string_view t = trim(line);
    if (t.empty()) continue;
    const std::size_t n = lines.number();
    if (starts_with(t, "#Entity")) {
      Plan next = dcgm_plan(line, n);
      if (next.names.empty()) b.fail(n, "the '#Entity' header names no fields");
      if (next.names == plan.names) ++headers;
      else changed.push_back(n);
      plan = std::move(next);
      b.take_header(plan);
      continue;
    }
    if (t.front() == '#') {  // not dcgmi's, a note someone added
      ++comments;
      continue;
    }
    const auto w = words(t);
    if (w[0] == "ID" || w[0] == "Id") continue;  // the units line under a header
    if (starts_with(t, "dmon was stopped")) {      // dcgmi's last line after Ctrl-C
      ++stopped;
      continue;
    }
    if (w.size() < 2 || !entity_word(w[0]) || !entity_id(w[1]))
      b.fail(n, fmt::format("not a dcgmi dmon row (an entity and its id, such as 'GPU 0', then the values): '{}'", snippet(t)));
    values.assign(w.begin() + 2, w.end());
    if (values.size() != plan.names.size() && !by_position(line, plan, values))
      b.fail(n, fmt::format("{}, but the '#Entity' header (line {}) names {}: '{}'", count(w.size() - 2, "value"), plan.line,
                            count(plan.names.size(), "field"), snippet(t)));
    const std::string entity = fmt::format("{} {}", w[0], w[1]);
    if (in_tick.count(entity)) {  // an entity again: the next tick
      ++tick;
      in_tick.clear();
    }
    in_tick.insert(entity);
    if (w[0] != "GPU") {
      ++others[std::string(w[0])];
      continue;
    }
    Sample s;
    s.gpu = *to_int<int>(w[1]);
    s.t_s = double(tick) * step_s;
    double free_mib = -1;
    for (std::size_t c = 0; c < values.size(); ++c) {
      if (!plan.use[c]) continue;
      const std::string_view v = values[c];
      if (ends_with(v, "...")) {  // cut to the column's width: the number is lost
        b.cut(plan.names[c]);
        continue;
      }
      if (!b.set(s, free_mib, plan, c, v))
        b.fail(n, fmt::format("field {}: '{}' {}", plan.names[c], snippet(values[c]), b.refused()));
    }
    b.add(s, plan, free_mib);
  }
  if (headers > 1) b.notes().push_back(fmt::format("the '#Entity' header is printed {} times (dcgmi reprints it every 14 ticks)", headers));
  if (!changed.empty()) b.notes().push_back(fmt::format("a '#Entity' header with other fields starts at line {}", line_list(changed)));
  if (!others.empty()) {
    std::string list;
    for (const auto& [entity, count] : others) list += fmt::format("{}{} ({})", list.empty() ? "" : ", ", entity, count);
    b.notes().push_back("rows of other entities than GPUs skipped: " + list);
  }
  if (stopped) b.notes().push_back("dcgmi's 'dmon was stopped' line skipped");
  if (comments) b.notes().push_back(fmt::format("{} starting with '#' (not '#Entity') skipped", count(comments, "line")));
  return b.finish(lines.number());
}

}  // namespace

Recording parse_telemetry(std::string_view text, const std::string& name, double interval_ms) {
  if (!std::isfinite(interval_ms) || interval_ms < 0)
    throw UsageError(fmt::format("{}: the sampling interval must be a positive number of milliseconds, not {}", name, interval_ms));
  const bool defaulted = interval_ms == 0;
  Lines lines(text);
  std::string_view first;
  while (lines.next(first))
    if (!trim(first).empty()) break;
  if (trim(first).empty())
    throw UsageError(fmt::format("{}:{}: empty: no telemetry (a header line and rows were expected)", name, std::max<std::size_t>(lines.number(), 1)));
  const std::size_t n = lines.number();
  const std::string_view t = trim(first);
  if (starts_with(t, "#Entity")) {
    Builder b(name, "dcgmi");
    return parse_dcgm(lines, first, b, defaulted ? 1000.0 : interval_ms, defaulted);
  }
  const auto fields = split(t, ',');
  if (smi_header(fields)) {
    Builder b(name, "nvidia-smi");
    return parse_smi(lines, t, b, interval_ms, defaulted);
  }
  const std::string where = fmt::format("{}:{}", name, n);
  if (fields.size() > 1 && (smi_time(fields[0]) || to_int<long>(fields[0]) || to_double(fields[0])))
    throw UsageError(where + ": no header line: this looks like nvidia-smi --format=csv,noheader output, and without the header "
                             "nothing says which value is which column (record with --format=csv or csv,nounits): '" + snippet(t) + "'");
  const auto w = words(t);
  if (w.size() >= 2 && ((entity_word(w[0]) && entity_id(w[1])) || w[0] == "ID"))
    throw UsageError(where + ": dcgmi dmon rows without the '#Entity' header line that names their fields: '" + snippet(t) + "'");
  throw UsageError(where + ": neither nvidia-smi --query-gpu CSV (a header such as 'timestamp, index, utilization.gpu [%]') "
                           "nor dcgmi dmon output (a '#Entity' header): '" + snippet(t) + "'");
}

Recording read_telemetry(const std::string& path, double interval_ms) {
  const std::string text = read_regular_file(path, "telemetry log", kMaxTelemetryBytes);
  return parse_telemetry(text, path, interval_ms);
}

}  // namespace sb::telemetry
