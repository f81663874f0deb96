// Recorded GPU telemetry (for `stallbench watch --from FILE`): the CSV that
// `nvidia-smi --query-gpu=... --format=csv` writes and the table that
// `dcgmi dmon -e ...` prints, read into one Sample per GPU per reading, all on
// one clock. Which format a file is comes from its first non-blank line.
//
// nvidia-smi (--format=csv, csv,nounits; -l / -lms loops):
//   - the header names the columns ("timestamp, index, utilization.gpu [%]"),
//     in any order and any subset; columns this reader does not use are listed
//     in Recording::ignored. --format=csv,noheader is refused: without the
//     header nothing says which value is which (the order is the user's
//     --query-gpu list, which the file does not keep).
//   - "index" names each GPU (several GPUs are interleaved, one row each per
//     reading). Without it, GPUs are numbered by pci.bus_id or uuid, in order
//     of first appearance (a note says so); without those either, the log is
//     read as one GPU, GPU 0 (a note says so), and refused when its rows show
//     several: two rows sharing a timestamp, or rows in groups of a few ms
//     apart once per interval (nvidia-smi stamps each GPU's row on its own).
//     With no index, bus id, uuid nor timestamp it is refused.
//   - values may carry the header's unit ("45 %", "1410 MHz") or not (nounits);
//     "N/A" and any bracketed value ("[N/A]", "[Not Supported]",
//     "[Insufficient Permissions]") leave the field empty.
//   - "timestamp" is nvidia-smi's local wall clock, "YYYY/MM/DD HH:MM:SS.mmm";
//     t_s is seconds from the first row. The wall clock can step back (NTP): a
//     step back of up to 1 s is held at the latest earlier time (a note counts
//     them), more than 1 s is refused, except a daylight-saving change: a step
//     of an hour, back or forward, that less the hour is the log's regular
//     interval (whatever its length, -lms 100 or -l 60), taken out with a note.
//     Without a timestamp column the caller must give the -l/-lms interval (a
//     new reading starts when an index repeats).
//   - the header repeated mid-file (nvidia-smi restarted, appending to the
//     same file) is accepted, even with other columns; the time simply jumps.
//   - column names: nvidia-smi prints the long form (clocks.current.sm for a
//     query of clocks.sm); both are accepted. Where two columns give one field
//     the first of this order is used, the other ignored: power.draw,
//     power.draw.instant, power.draw.average; enforced.power.limit,
//     power.limit; clocks_event_reasons.active, clocks_throttle_reasons.active
//     (hex "0x0000000000000004"). memory.total missing but memory.free there:
//     total = used + free (a note says so).
//
// dcgmi dmon (DCGM's dcgmi/DeviceMonitor.cpp; -d default 1000 ms):
//   - a "#Entity" line names the fields by DCGM short name, an "ID" line under
//     it gives their units, then one row per entity per tick ("GPU 0  45  0.450").
//     dcgmi reprints both lines every 14 ticks; a "#Entity" line with other
//     fields starts a new table.
//   - field short names used (DCGM field id, unit as printed -> Sample field):
//       GPUTL 203 %   -> util_pct            MCUTL 204 %   -> mem_util_pct
//       SMCLK 100 MHz -> sm_clock_mhz        SMMAX 113 MHz -> sm_clock_max_mhz
//       POWER 155 W   -> power_w (POWINST, instantaneous W, when POWER is absent)
//       EPLMT enforced power limit W -> power_limit_w (PMLMT, management limit, when absent)
//       TMPTR 150 C   -> temp_c
//       FBUSD 252 / FBTTL 250 / FBFRE 251, MiB -> mem_used_mib, mem_total_mib (FBUSD+FBFRE
//         when FBTTL is absent)
//       PCITX 1009 / PCIRX 1010, bytes/s -> pcie_tx_mb_s, pcie_rx_mb_s (divided by 1e6)
//       DVCCTR 112, decimal bitmask -> clock_event_reasons
//       SMACT 1002, SMOCC 1003, TENSO 1004, DRAMA 1005, ratios 0..1 -> as they are
//     Every other field (MMCLK, NVLTX, TXTPT in KB/s of an unstated KB, ...) is ignored.
//   - dmon prints no timestamps (through DCGM 4.x; NVIDIA/DCGM#14): a tick
//     ends when an entity repeats, and ticks are interval_ms apart (1000 ms,
//     dmon's default, when 0 is given; a note says which).
//   - "N/A" (a blank DCGM value) leaves the field empty; so does a value cut
//     to the column's width ("12345..."), with a note. Rows of other entities
//     (GPU-I, GPU-CI, Switch, vGPU, CPU, ...) are skipped with a note; "dmon
//     was stopped ..." is skipped. Values are split on blanks, or by the
//     header's column positions when a value has blanks in it (a name).
//
// Errors are UsageError (exit 2) naming FILE:LINE and what is wrong: a value
// that is not a number, a row with the wrong number of values, a file in
// neither format, an empty file, a header without rows, timestamps stepping
// back more than 1 s (other than a daylight-saving hour), several GPUs that no
// column tells apart (no index, pci.bus_id or uuid), no index column and no
// timestamp, no header. Parsing is one pass over the lines (then one over the
// gaps of a log without index): time and memory grow with the file, nothing else.
#pragma once

#include <cstddef>      // std::size_t
#include <cstdint>      // std::uint64_t
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

namespace sb::telemetry {

// One reading of one GPU. Every field but t_s/gpu is optional: a log has only the columns it has.
struct Sample {
  double t_s = 0;  // seconds from the first sample of the recording (all GPUs share the clock)
  int gpu = 0;     // GPU index as the log names it (nvidia-smi "index", dcgmi "GPU <id>")
  std::optional<double> util_pct, mem_util_pct;          // utilization.gpu / .memory (nvidia-smi) or GPUTL / MCUTL (dcgmi), 0..100
  std::optional<double> sm_clock_mhz, sm_clock_max_mhz;  // clocks.sm, clocks.max.sm / SMCLK, SMMAX
  std::optional<double> power_w, power_limit_w;          // power.draw, power.limit or enforced.power.limit / POWER, EPLMT
  std::optional<double> temp_c;                          // temperature.gpu / TMPTR
  std::optional<double> mem_used_mib, mem_total_mib;     // memory.used, memory.total / FBUSD, FBTTL (FBFRE+FBUSD when only those)
  std::optional<double> pcie_tx_mb_s, pcie_rx_mb_s;      // MB/s (1e6 bytes/s) whatever unit the log used
  std::optional<std::uint64_t> clock_event_reasons;      // NVML's clocks event (throttle) reasons bitmask
  std::optional<double> sm_active, sm_occupancy, tensor_active, dram_active;  // DCGM profiling fields, as fractions 0..1
};

struct Recording {
  std::string format;                // "nvidia-smi" or "dcgmi"
  std::vector<std::string> columns;  // the columns as the log names them, in order (every header's, first seen first)
  std::vector<std::string> ignored;  // columns read but not used
  std::vector<Sample> samples;       // in file order
  std::vector<std::string> notes;    // e.g. "no timestamps: dcgmi dmon's delay of 1000 ms assumed"
  int gpus = 0;                      // distinct GPU indices seen
};

// `name` is what messages call the text (the path for a file). interval_ms:
// the sampling interval to assume when the log has no timestamps (dcgmi dmon
// prints none; its -d default is 1000 ms, used for 0). Throws UsageError.
Recording parse_telemetry(std::string_view text, const std::string& name, double interval_ms = 0);

// A regular file of at most kMaxTelemetryBytes; a FIFO, a device or a
// directory is refused at once, without blocking. Throws UsageError.
inline constexpr std::size_t kMaxTelemetryBytes = std::size_t(1) << 30;
Recording read_telemetry(const std::string& path, double interval_ms = 0);

}  // namespace sb::telemetry
