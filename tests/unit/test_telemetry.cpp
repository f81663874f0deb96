// The telemetry log reader (readers/telemetry.hpp): the real recordings of
// $STALLBENCH_SHARED_DATA/telemetry (outside the repository: those tests skip
// without it; an nvidia-smi CSV of a V100S, dcgmi dmon output of an
// H800, a log without header it must refuse and one without index it reads as
// one GPU) and the made fixtures of tests/data/telemetry, of 400+ rows (8 GPUs interleaved with a
// restart, 4 GPUs with dcgmi's header reprints) read to exact values, and of 3
// GPUs without index (refused: they cannot be told apart); each rule of the formats on small texts
// (units or none, N/A, hex reasons, column aliases, CRLF, repeated and changed
// headers, clock steps, MIG rows, values with blanks, cut values); every
// refusal naming FILE:LINE; FIFOs, directories and oversized files refused
// without blocking; and mutated fixtures that must parse or be refused, never crash.
#include <gtest/gtest.h>

#include <fcntl.h>     // ::open
#include <sys/stat.h>  // ::mkfifo
#include <unistd.h>    // ::close, ::getpid, ::truncate

#include <chrono>      // std::chrono
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream, std::ofstream
#include <functional>  // std::function
#include <future>      // std::async
#include <random>      // std::mt19937
#include <sstream>     // std::ostringstream
#include <string>      // std::string
#include <vector>      // std::vector

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "harness/errors.hpp"  // sb::UsageError
#include "readers/telemetry.hpp"
#include "shared_data.hpp"  // sb::test::shared_data, SB_NEED_SHARED_DATA

namespace sb::telemetry {
namespace {

namespace fs = std::filesystem;

#ifdef SB_TEST_DATA
const std::string kDir = std::string(SB_TEST_DATA) + "/telemetry";  // the made fixtures (make_fixtures.py)
#else
const std::string kDir = (fs::path(__FILE__).parent_path() / ".." / "data" / "telemetry").lexically_normal().string();
#endif
// The real recordings, copied from public repositories (third-party data, not in the repository).
const std::string kReal = sb::test::shared_data("telemetry");

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The message of the UsageError `f` throws; a test failure when it throws none.
std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError";
  return {};
}

std::string parse_error(const std::string& text, double interval_ms = 0) {
  return usage_error([&] { parse_telemetry(text, "log.csv", interval_ms); });
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

bool has_note(const Recording& r, const std::string& part) {
  for (const std::string& n : r.notes)
    if (has(n, part)) return true;
  return false;
}

std::string notes(const Recording& r) {
  std::string s;
  for (const std::string& n : r.notes) s += n + "\n";
  return s;
}

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("sb_telemetry_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

// ---------------------------------------------------------------- real recordings

TEST(TelemetryReal, NvidiaSmiV100S) {
  SB_NEED_SHARED_DATA(kReal + "/nvsmi_v100s_1gpu.csv");
  // AndyZzzZzzZzz/miris gpu_log.csv: nvidia-smi --format=csv -l 1 on one Tesla V100S
  const Recording r = read_telemetry(kReal + "/nvsmi_v100s_1gpu.csv");
  EXPECT_EQ(r.format, "nvidia-smi");
  EXPECT_EQ(r.columns, (std::vector<std::string>{"timestamp", "index", "name", "utilization.gpu [%]", "utilization.memory [%]",
                                                 "memory.total [MiB]", "memory.used [MiB]", "temperature.gpu"}));
  EXPECT_EQ(r.ignored, std::vector<std::string>{"name"});
  EXPECT_TRUE(r.notes.empty()) << notes(r);
  ASSERT_EQ(r.samples.size(), 107u);
  EXPECT_EQ(r.gpus, 1);
  const Sample& s0 = r.samples[0];  // 2025/06/13 00:27:52.195, 0, ..., 0 %, 0 %, 32768 MiB, 1 MiB, 27
  EXPECT_EQ(s0.t_s, 0);
  EXPECT_EQ(s0.gpu, 0);
  EXPECT_EQ(s0.util_pct, 0.0);
  EXPECT_EQ(s0.mem_util_pct, 0.0);
  EXPECT_EQ(s0.mem_total_mib, 32768.0);
  EXPECT_EQ(s0.mem_used_mib, 1.0);
  EXPECT_EQ(s0.temp_c, 27.0);
  EXPECT_FALSE(s0.power_w || s0.sm_clock_mhz || s0.clock_event_reasons || s0.sm_active || s0.pcie_tx_mb_s);
  const Sample& s16 = r.samples[16];  // 00:28:08.203, 19 %, 5 %, 966 MiB, 28
  EXPECT_NEAR(s16.t_s, 16.008, 1e-9);
  EXPECT_EQ(s16.util_pct, 19.0);
  EXPECT_EQ(s16.mem_util_pct, 5.0);
  EXPECT_EQ(s16.mem_used_mib, 966.0);
  EXPECT_EQ(s16.temp_c, 28.0);
  const Sample& last = r.samples.back();  // 00:29:38.248, ..., 1 MiB, 28
  EXPECT_NEAR(last.t_s, 106.053, 1e-9);
  EXPECT_EQ(last.mem_used_mib, 1.0);
  EXPECT_EQ(last.temp_c, 28.0);
  for (std::size_t i = 1; i < r.samples.size(); ++i) EXPECT_GT(r.samples[i].t_s, r.samples[i - 1].t_s);
  // the same text in memory, and with Windows line endings
  std::string text = read_file(kReal + "/nvsmi_v100s_1gpu.csv");
  EXPECT_EQ(parse_telemetry(text, "x").samples.size(), 107u);
  std::string crlf;
  for (char c : text) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  const Recording w = parse_telemetry(crlf, "x");
  ASSERT_EQ(w.samples.size(), 107u);
  EXPECT_EQ(w.columns, r.columns);
  EXPECT_EQ(w.samples[16].mem_used_mib, 966.0);
  EXPECT_EQ(w.samples.back().temp_c, 28.0);
}

TEST(TelemetryReal, DcgmiH800Pcie) {
  SB_NEED_SHARED_DATA(kReal + "/dcgmi_h800_pcie.txt");
  // liguodongiot/llm-action docs/llm-base/dcgmi.md: dcgmi dmon -i 0 -e 1011,1012,1009,1010 -c 5 (DCGM 3.1.8, H800)
  const Recording r = read_telemetry(kReal + "/dcgmi_h800_pcie.txt");
  EXPECT_EQ(r.format, "dcgmi");
  EXPECT_EQ(r.columns, (std::vector<std::string>{"NVLTX", "NVLRX", "PCITX", "PCIRX"}));
  EXPECT_EQ(r.ignored, (std::vector<std::string>{"NVLTX", "NVLRX"}));
  ASSERT_EQ(r.samples.size(), 5u);
  EXPECT_EQ(r.gpus, 1);
  EXPECT_TRUE(has_note(r, "no timestamps: dcgmi dmon's delay of 1000 ms assumed")) << notes(r);
  EXPECT_TRUE(has_note(r, "'PCITX': 2 of 5 values empty")) << notes(r);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(r.samples[std::size_t(i)].t_s, double(i));
    EXPECT_EQ(r.samples[std::size_t(i)].gpu, 0);
  }
  EXPECT_FALSE(r.samples[0].pcie_tx_mb_s || r.samples[0].pcie_rx_mb_s || r.samples[1].pcie_tx_mb_s);
  EXPECT_DOUBLE_EQ(*r.samples[2].pcie_tx_mb_s, 0.498948);  // 498948 bytes/s
  EXPECT_DOUBLE_EQ(*r.samples[2].pcie_rx_mb_s, 0.001555);
  EXPECT_DOUBLE_EQ(*r.samples[3].pcie_tx_mb_s, 0.449138);
  EXPECT_DOUBLE_EQ(*r.samples[3].pcie_rx_mb_s, 0.002074);
  EXPECT_DOUBLE_EQ(*r.samples[4].pcie_tx_mb_s, 0.548740);
  EXPECT_FALSE(r.samples[4].util_pct);
  // -d 100: the ticks 100 ms apart
  const Recording fast = read_telemetry(kReal + "/dcgmi_h800_pcie.txt", 100);
  EXPECT_DOUBLE_EQ(fast.samples[4].t_s, 0.4);
  EXPECT_TRUE(has_note(fast, "100 ms apart")) << notes(fast);
}

TEST(TelemetryReal, RefusedRecordings) {
  SB_NEED_SHARED_DATA(kReal + "/nvsmi_noheader.csv");
  // beam11221/plato gpu_log.csv: --format=csv,noheader
  std::string msg = usage_error([&] { read_telemetry(kReal + "/nvsmi_noheader.csv"); });
  EXPECT_TRUE(has(msg, "nvsmi_noheader.csv:1: no header line")) << msg;
  EXPECT_TRUE(has(msg, "noheader")) << msg;
}

TEST(TelemetryReal, OneGpuWithoutAnIndexIsGpuZero) {
  SB_NEED_SHARED_DATA(kReal + "/nvsmi_no_index.csv");
  // PranavDani/Flame nvidia-smi.csv: timestamp and power.draw only, no index
  const Recording r = read_telemetry(kReal + "/nvsmi_no_index.csv");
  ASSERT_EQ(r.samples.size(), 5u);
  EXPECT_EQ(r.gpus, 1);
  EXPECT_EQ(r.samples[4].gpu, 0);
  EXPECT_NEAR(r.samples[4].t_s, 0.201, 1e-9);
  EXPECT_DOUBLE_EQ(*r.samples[0].power_w, 22.89);
  EXPECT_TRUE(has_note(r, "every row read as GPU 0")) << notes(r);
}

// ---------------------------------------------------------------- made fixtures (make_fixtures.py)

TEST(TelemetryMade, NvidiaSmiEightGpusWithRestart) {
  const Recording r = read_telemetry(kDir + "/nvsmi_8gpu_100ms.csv");
  EXPECT_EQ(r.format, "nvidia-smi");
  ASSERT_EQ(r.samples.size(), 560u);
  EXPECT_EQ(r.gpus, 8);
  EXPECT_EQ(r.columns.size(), 15u);
  EXPECT_EQ(r.columns[6], "clocks.current.sm [MHz]");
  EXPECT_EQ(r.ignored, (std::vector<std::string>{"name", "pci.bus_id", "pstate"}));
  EXPECT_TRUE(has_note(r, "the header is repeated at line 482")) << notes(r);
  EXPECT_TRUE(has_note(r, "'power.draw [W]': 7 of 560 values empty")) << notes(r);
  // reading 0, GPU 0: 12:00:00.000, 0 %, 0 %, 345 MHz, 1980 MHz, 70.00 W, 700.00 W, 31, 0 MiB, 81559 MiB, 0x...01
  const Sample& a = r.samples[0];
  EXPECT_EQ(a.t_s, 0);
  EXPECT_EQ(a.gpu, 0);
  EXPECT_EQ(a.util_pct, 0.0);
  EXPECT_EQ(a.sm_clock_mhz, 345.0);
  EXPECT_EQ(a.sm_clock_max_mhz, 1980.0);
  EXPECT_EQ(a.power_w, 70.0);
  EXPECT_EQ(a.power_limit_w, 700.0);
  EXPECT_EQ(a.temp_c, 31.0);
  EXPECT_EQ(a.mem_used_mib, 0.0);
  EXPECT_EQ(a.mem_total_mib, 81559.0);
  EXPECT_EQ(a.clock_event_reasons, 0x1u);
  // GPUs interleaved: row 1 is GPU 1, 2 ms later; GPU 7's power is [N/A] at reading 0
  EXPECT_EQ(r.samples[1].gpu, 1);
  EXPECT_NEAR(r.samples[1].t_s, 0.002, 1e-9);
  EXPECT_EQ(r.samples[1].power_w, 71.25);
  EXPECT_EQ(r.samples[7].gpu, 7);
  EXPECT_FALSE(r.samples[7].power_w);
  EXPECT_EQ(r.samples[7].power_limit_w, 700.0);
  // reading 59, GPU 7: 12:00:05.933, 100 %, 60 %, 1665 MHz, 700.00 W, 48, 12800 MiB, 0x0000000000000004 (SW power cap)
  const Sample& b = r.samples[59 * 8 + 7];
  EXPECT_EQ(b.gpu, 7);
  EXPECT_NEAR(b.t_s, 5.933, 1e-9);
  EXPECT_EQ(b.util_pct, 100.0);
  EXPECT_EQ(b.mem_util_pct, 60.0);
  EXPECT_EQ(b.sm_clock_mhz, 1665.0);
  EXPECT_EQ(b.power_w, 700.0);
  EXPECT_EQ(b.temp_c, 48.0);
  EXPECT_EQ(b.mem_used_mib, 12800.0);
  EXPECT_EQ(b.clock_event_reasons, 0x4u);
  // after the restart (line 482): 12:00:08.520, GPU 0, 16 %, 238.00 W
  const Sample& c = r.samples[480];
  EXPECT_EQ(c.gpu, 0);
  EXPECT_NEAR(c.t_s, 8.52, 1e-9);
  EXPECT_EQ(c.util_pct, 16.0);
  EXPECT_EQ(c.power_w, 238.0);
  EXPECT_EQ(c.clock_event_reasons, 0x0u);
  for (std::size_t i = 1; i < r.samples.size(); ++i) EXPECT_GE(r.samples[i].t_s, r.samples[i - 1].t_s) << i;
}

TEST(TelemetryMade, DcgmiFourGpusWithReprintedHeaders) {
  const Recording r = read_telemetry(kDir + "/dcgmi_4gpu_100ms.txt", 100);
  EXPECT_EQ(r.format, "dcgmi");
  ASSERT_EQ(r.samples.size(), 400u);
  EXPECT_EQ(r.gpus, 4);
  EXPECT_EQ(r.columns, (std::vector<std::string>{"GPUTL", "MCUTL", "SMCLK", "POWER", "TMPTR", "FBUSD", "FBTTL", "DVCCTR", "SMACT",
                                                 "SMOCC", "TENSO", "DRAMA", "PCITX", "PCIRX"}));
  EXPECT_TRUE(r.ignored.empty());
  EXPECT_TRUE(has_note(r, "printed 8 times")) << notes(r);
  EXPECT_TRUE(has_note(r, "'TENSO': 2 of 400 values empty")) << notes(r);
  EXPECT_TRUE(has_note(r, "'PCITX': 4 of 400 values empty")) << notes(r);
  EXPECT_TRUE(has_note(r, "dmon was stopped")) << notes(r);
  for (std::size_t i = 0; i < r.samples.size(); ++i) {  // one tick: the 4 GPUs in order, 100 ms apart
    EXPECT_EQ(r.samples[i].gpu, int(i % 4));
    EXPECT_NEAR(r.samples[i].t_s, double(i / 4) * 0.1, 1e-9) << i;
  }
  // tick 0, GPU 1: 17 8 1410 117.925 39 1512 81920 0 0.136 0.068 0.034 0.068 N/A N/A
  const Sample& a = r.samples[1];
  EXPECT_EQ(a.util_pct, 17.0);
  EXPECT_EQ(a.mem_util_pct, 8.0);
  EXPECT_EQ(a.sm_clock_mhz, 1410.0);
  EXPECT_DOUBLE_EQ(*a.power_w, 117.925);
  EXPECT_EQ(a.temp_c, 39.0);
  EXPECT_EQ(a.mem_used_mib, 1512.0);
  EXPECT_EQ(a.mem_total_mib, 81920.0);
  EXPECT_EQ(a.clock_event_reasons, 0u);
  EXPECT_DOUBLE_EQ(*a.sm_active, 0.136);
  EXPECT_DOUBLE_EQ(*a.sm_occupancy, 0.068);
  EXPECT_DOUBLE_EQ(*a.tensor_active, 0.034);
  EXPECT_DOUBLE_EQ(*a.dram_active, 0.068);
  EXPECT_FALSE(a.pcie_tx_mb_s || a.pcie_rx_mb_s || a.sm_clock_max_mhz || a.power_limit_w);
  EXPECT_FALSE(r.samples[3].tensor_active);  // GPU 3's TENSO is N/A in ticks 0 and 1
  EXPECT_FALSE(r.samples[7].tensor_active);
  EXPECT_TRUE(r.samples[11].tensor_active);
  // tick 11, GPU 0: util 99 -> DVCCTR 4
  EXPECT_EQ(r.samples[44].util_pct, 99.0);
  EXPECT_EQ(r.samples[44].clock_event_reasons, 4u);
  // the last row: GPU 3 33 16 1410 172.575 44 7175 81920 0 0.264 0.132 0.066 0.132 1012288 1001536
  const Sample& z = r.samples.back();
  EXPECT_EQ(z.gpu, 3);
  EXPECT_NEAR(z.t_s, 9.9, 1e-9);
  EXPECT_DOUBLE_EQ(*z.power_w, 172.575);
  EXPECT_EQ(z.mem_used_mib, 7175.0);
  EXPECT_DOUBLE_EQ(*z.pcie_tx_mb_s, 1.012288);
  EXPECT_DOUBLE_EQ(*z.pcie_rx_mb_s, 1.001536);
  // the default interval: 1000 ms, said in a note
  const Recording slow = read_telemetry(kDir + "/dcgmi_4gpu_100ms.txt");
  EXPECT_DOUBLE_EQ(slow.samples.back().t_s, 99.0);
  EXPECT_TRUE(has_note(slow, "1000 ms assumed")) << notes(slow);
}

// ---------------------------------------------------------------- nvidia-smi rules

TEST(TelemetryNvidiaSmi, TheBriefsExampleWithSeveralGpus) {
  const Recording r = parse_telemetry(
      "timestamp, index, utilization.gpu [%], utilization.memory [%], clocks.current.sm [MHz], power.draw [W], memory.used [MiB]\n"
      "2024/05/01 12:00:00.123, 0, 45 %, 30 %, 1410 MHz, 350.12 W, 40000 MiB\n"
      "2024/05/01 12:00:00.124, 1, 46 %, 31 %, 1395 MHz, 351.50 W, 40001 MiB\n"
      "2024/05/01 12:00:00.223, 0, 47 %, 32 %, 1410 MHz, 352.00 W, 40002 MiB\n"
      "2024/05/01 12:00:00.224, 1, 48 %, 33 %, 1380 MHz, 353.25 W, 40003 MiB\n",
      "smi.csv");
  ASSERT_EQ(r.samples.size(), 4u);
  EXPECT_EQ(r.gpus, 2);
  EXPECT_TRUE(r.ignored.empty());
  const Sample& s = r.samples[3];
  EXPECT_EQ(s.gpu, 1);
  EXPECT_NEAR(s.t_s, 0.101, 1e-9);
  EXPECT_EQ(s.util_pct, 48.0);
  EXPECT_EQ(s.mem_util_pct, 33.0);
  EXPECT_EQ(s.sm_clock_mhz, 1380.0);
  EXPECT_EQ(s.power_w, 353.25);
  EXPECT_EQ(s.mem_used_mib, 40003.0);
}

TEST(TelemetryNvidiaSmi, NoUnitsAnyOrderUnknownColumnsAndAliases) {
  // csv,nounits; the index last; clocks.sm (the short alias); both power limits
  // (enforced preferred); the throttle name of older drivers; unknown columns
  const Recording r = parse_telemetry(
      "fan.speed [%], timestamp, clocks.sm [MHz], power.limit [W], enforced.power.limit [W], clocks_throttle_reasons.active, "
      "pcie.link.gen.current, memory.used [MiB], memory.free [MiB], index\n"
      "30, 2024/12/31 23:59:59.900, 1755, 400.00, 350.00, 0x0000000000000020, 4, 1000, 79000, 3\n"
      "31, 2025/01/01 00:00:00.400, 1740, 400.00, 350.00, 0x00000000000000A4, 4, 1500, 78500, 3\n",
      "nounits.csv");
  ASSERT_EQ(r.samples.size(), 2u);
  EXPECT_EQ(r.ignored, (std::vector<std::string>{"fan.speed [%]", "power.limit [W]", "pcie.link.gen.current"}));
  EXPECT_TRUE(has_note(r, "memory.used + memory.free")) << notes(r);
  const Sample& s = r.samples[1];
  EXPECT_EQ(s.gpu, 3);
  EXPECT_NEAR(s.t_s, 0.5, 1e-9);  // across midnight and the new year
  EXPECT_EQ(s.sm_clock_mhz, 1740.0);
  EXPECT_EQ(s.power_limit_w, 350.0);
  EXPECT_EQ(s.clock_event_reasons, 0xA4u);
  EXPECT_EQ(r.samples[0].clock_event_reasons, 0x20u);
  EXPECT_EQ(s.mem_used_mib, 1500.0);
  EXPECT_EQ(s.mem_total_mib, 80000.0);
  // the newer name wins over the older when both are there; power.draw over .instant
  const Recording both = parse_telemetry(
      "index, clocks_throttle_reasons.active, clocks_event_reasons.active, power.draw.instant [W], power.draw [W], timestamp\n"
      "0, 0x0000000000000001, 0x0000000000000004, 100.5 W, 99.5 W, 2024/05/01 12:00:00.000\n",
      "b.csv");
  EXPECT_EQ(both.samples[0].clock_event_reasons, 0x4u);
  EXPECT_EQ(both.samples[0].power_w, 99.5);
  EXPECT_EQ(both.ignored, (std::vector<std::string>{"clocks_throttle_reasons.active", "power.draw.instant [W]"}));
}

TEST(TelemetryNvidiaSmi, NotAvailableValuesLeaveFieldsEmpty) {
  const Recording r = parse_telemetry(
      "timestamp, index, power.draw [W], temperature.gpu, clocks.max.sm [MHz], memory.used [MiB], clocks_event_reasons.active\n"
      "2024/05/01 12:00:00.000, 0, [N/A], [Not Supported], N/A, [Insufficient Permissions], [N/A]\n"
      "2024/05/01 12:00:01.000, 0, 12.50 W, 40, 1980 MHz, 10 MiB, 0x0000000000000000\n",
      "na.csv");
  ASSERT_EQ(r.samples.size(), 2u);
  const Sample& a = r.samples[0];
  EXPECT_FALSE(a.power_w || a.temp_c || a.sm_clock_max_mhz || a.mem_used_mib || a.clock_event_reasons);
  const Sample& b = r.samples[1];
  EXPECT_EQ(b.power_w, 12.5);
  EXPECT_EQ(b.temp_c, 40.0);
  EXPECT_EQ(b.sm_clock_max_mhz, 1980.0);
  EXPECT_EQ(b.clock_event_reasons, 0u);
  EXPECT_TRUE(has_note(r, "'power.draw [W]': 1 of 2 values empty")) << notes(r);
  EXPECT_TRUE(has_note(r, "'temperature.gpu': 1 of 2 values empty")) << notes(r);
}

TEST(TelemetryNvidiaSmi, HeaderRepeatedOrChangedMidFile) {
  const Recording r = parse_telemetry(
      "timestamp, index, utilization.gpu [%]\n"
      "2024/05/01 12:00:00.000, 0, 10 %\n"
      "\n"
      "timestamp, index, utilization.gpu [%]\n"
      "2024/05/01 12:05:00.000, 0, 20 %\n"
      "timestamp, index, power.draw [W], name\n"
      "2024/05/01 12:06:00.000, 0, 30.00 W, NVIDIA A100-SXM4-40GB\n",
      "restart.csv");
  ASSERT_EQ(r.samples.size(), 3u);
  EXPECT_EQ(r.samples[1].t_s, 300.0);
  EXPECT_EQ(r.samples[1].util_pct, 20.0);
  EXPECT_EQ(r.samples[2].t_s, 360.0);
  EXPECT_FALSE(r.samples[2].util_pct);
  EXPECT_EQ(r.samples[2].power_w, 30.0);
  EXPECT_EQ(r.columns, (std::vector<std::string>{"timestamp", "index", "utilization.gpu [%]", "power.draw [W]", "name"}));
  EXPECT_EQ(r.ignored, std::vector<std::string>{"name"});
  EXPECT_TRUE(has_note(r, "repeated at line 4")) << notes(r);
  EXPECT_TRUE(has_note(r, "other columns starts at line 6")) << notes(r);
}

TEST(TelemetryNvidiaSmi, ClockStepsBack) {
  // up to 1 s back (an NTP step of the wall clock): held at the latest time
  const Recording r = parse_telemetry(
      "timestamp, index, utilization.gpu [%]\n"
      "2024/05/01 12:00:01.000, 0, 1 %\n"
      "2024/05/01 12:00:02.000, 0, 2 %\n"
      "2024/05/01 12:00:01.000, 0, 3 %\n"
      "2024/05/01 12:00:02.500, 0, 4 %\n",
      "step.csv");
  ASSERT_EQ(r.samples.size(), 4u);
  EXPECT_EQ(r.samples[1].t_s, 1.0);
  EXPECT_EQ(r.samples[2].t_s, 1.0);
  EXPECT_EQ(r.samples[3].t_s, 1.5);
  EXPECT_EQ(r.notes.size(), 1u) << notes(r);
  // an interval given for a log with timestamps: not used, and said so
  const Recording given = parse_telemetry("index, timestamp\n0, 2024/05/01 12:00:01.000\n0, 2024/05/01 12:00:01.100\n", "x", 500);
  EXPECT_NEAR(given.samples[1].t_s, 0.1, 1e-9);
  EXPECT_TRUE(has_note(given, "the interval given (500 ms) is not used")) << notes(given);
  EXPECT_TRUE(has_note(r, "1 timestamp stepped back (up to 1.000 s")) << notes(r);
  // more than 1 s back: refused, naming the line and the one it steps back from
  const std::string msg = parse_error(
      "timestamp, index, utilization.gpu [%]\n"
      "2024/05/01 12:00:01.000, 0, 1 %\n"
      "2024/05/01 12:00:02.000, 0, 2 %\n"
      "2024/05/01 12:00:00.999, 1, 3 %\n");
  EXPECT_TRUE(has(msg, "log.csv:4: timestamp '2024/05/01 12:00:00.999' is 1.001 s before line 3's")) << msg;
}

TEST(TelemetryNvidiaSmi, NoTimestampColumnNeedsTheInterval) {
  const std::string text =
      "index, utilization.gpu [%]\n"
      "0, 10 %\n1, 11 %\n0, 20 %\n1, 21 %\n0, 30 %\n";
  EXPECT_TRUE(has(parse_error(text), "log.csv:1: the header has no 'timestamp' column: give the sampling interval"));
  const Recording r = parse_telemetry(text, "x", 250);
  ASSERT_EQ(r.samples.size(), 5u);
  EXPECT_EQ(r.samples[1].t_s, 0.0);
  EXPECT_EQ(r.samples[2].t_s, 0.25);
  EXPECT_EQ(r.samples[4].t_s, 0.5);
  EXPECT_TRUE(has_note(r, "250 ms apart")) << notes(r);
}

TEST(TelemetryNvidiaSmi, Refusals) {
  const std::string head = "timestamp, index, utilization.gpu [%], memory.used [MiB]\n";
  const std::string row = "2024/05/01 12:00:00.000, 0, 45 %, 40000 MiB\n";
  std::string msg = parse_error(head + row + "2024/05/01 12:00:00.100, 0, forty %, 40000 MiB\n");
  EXPECT_TRUE(has(msg, "log.csv:3: column 'utilization.gpu [%]': 'forty %' is not a number")) << msg;
  msg = parse_error(head + row + "2024/05/01 12:00:00.100, 0, 45 MHz, 40000 MiB\n");  // a unit that is not the header's
  EXPECT_TRUE(has(msg, "log.csv:3: column 'utilization.gpu [%]': '45 MHz' is not a number")) << msg;
  msg = parse_error(head + row + row + "2024/05/01 12:00:00.100, 0, 45 %\n");
  EXPECT_TRUE(has(msg, "log.csv:4: 3 values, but the header (line 1) names 4 columns")) << msg;
  msg = parse_error(head + "2024/05/01 12:00:00.100, 0, 45 %, 40000 MiB, 7\n");
  EXPECT_TRUE(has(msg, "log.csv:2: 5 values")) << msg;
  msg = parse_error(head + "2024-05-01T12:00:00Z, 0, 45 %, 40000 MiB\n");
  EXPECT_TRUE(has(msg, "log.csv:2: timestamp '2024-05-01T12:00:00Z' is not nvidia-smi's")) << msg;
  msg = parse_error(head + "2024/13/01 12:00:00.000, 0, 45 %, 40000 MiB\n");
  EXPECT_TRUE(has(msg, "log.csv:2: timestamp")) << msg;
  msg = parse_error(head + "2024/05/01 12:00:00.000, GPU0, 45 %, 40000 MiB\n");
  EXPECT_TRUE(has(msg, "log.csv:2: index 'GPU0' is not a GPU index")) << msg;
  msg = parse_error(head + "2024/05/01 12:00:00.000, [N/A], 45 %, 40000 MiB\n");
  EXPECT_TRUE(has(msg, "log.csv:2: index '[N/A]'")) << msg;
  msg = parse_error("timestamp, index, memory.used [KiB]\n");
  EXPECT_TRUE(has(msg, "log.csv:1: column 'memory.used [KiB]' is in KiB, not MiB")) << msg;
  // several GPUs without an index or a bus id: rows share a timestamp
  msg = parse_error("timestamp, utilization.gpu [%]\n2024/05/01 12:00:00.000, 1 %\n2024/05/01 12:00:00.000, 2 %\n");
  EXPECT_TRUE(has(msg, "log.csv:3: shares its timestamp with line 2")) << msg;
  msg = parse_error("utilization.gpu [%], memory.used [MiB]\n1 %, 2 MiB\n");
  EXPECT_TRUE(has(msg, "log.csv:1: no 'index' column and no timestamp")) << msg;
  msg = parse_error("\n\ntimestamp, index, utilization.gpu [%]\n");  // a header and nothing else
  EXPECT_TRUE(has(msg, "log.csv:3: no GPU samples")) << msg;
  msg = parse_error("2024/05/01 12:00:00.000, 0, 45 %, 40000 MiB\n");
  EXPECT_TRUE(has(msg, "log.csv:1: no header line")) << msg;
  msg = parse_error("0, 45, 40000\n");  // --format=csv,noheader,nounits
  EXPECT_TRUE(has(msg, "log.csv:1: no header line")) << msg;
  msg = parse_error(head + row + "Unable to determine the device handle for GPU 0000:18:00.0: GPU is lost\n");
  EXPECT_TRUE(has(msg, "log.csv:3: 1 value, but the header (line 1) names 4 columns")) << msg;
}

// ---------------------------------------------------------------- dcgmi rules

// A dcgmi table laid out as DeviceMonitor.cpp prints it: names and values
// left-aligned in columns `width` wide.
std::string dmon(const std::vector<std::vector<std::string>>& rows, std::size_t width = 10) {
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (const std::string& cell : row) line += cell + std::string(cell.size() < width ? width - cell.size() : 1, ' ');
    out += line + "\n";
  }
  return out;
}

TEST(TelemetryDcgmi, TheBriefsExampleAndMigRows) {
  const Recording r = parse_telemetry(dmon({{"#Entity", "GPUTL", "MCUTL", "SMACT", "SMOCC"},
                                            {"ID"},
                                            {"GPU 0", "45", "30", "0.450", "0.200"},
                                            {"GPU-I 1", "N/A", "N/A", "0.225", "0.100"},
                                            {"GPU-CI 0", "N/A", "N/A", "0.225", "0.100"},
                                            {"GPU 1", "50", "31", "0.500", "0.250"},
                                            {"GPU 0", "46", "29", "0.460", "0.210"},
                                            {"GPU-I 1", "N/A", "N/A", "0.230", "0.105"},
                                            {"GPU-CI 0", "N/A", "N/A", "0.230", "0.105"},
                                            {"GPU 1", "51", "32", "0.510", "0.260"}}),
                                      "mig.txt", 200);
  ASSERT_EQ(r.samples.size(), 4u);
  EXPECT_EQ(r.gpus, 2);
  EXPECT_TRUE(has_note(r, "rows of other entities than GPUs skipped: GPU-CI (2), GPU-I (2)")) << notes(r);
  EXPECT_EQ(r.samples[0].util_pct, 45.0);
  EXPECT_EQ(r.samples[0].sm_active, 0.45);
  EXPECT_EQ(r.samples[0].sm_occupancy, 0.2);
  EXPECT_EQ(r.samples[1].gpu, 1);
  EXPECT_EQ(r.samples[1].t_s, 0.0);  // one tick
  EXPECT_EQ(r.samples[2].gpu, 0);
  EXPECT_EQ(r.samples[2].t_s, 0.2);
  EXPECT_EQ(r.samples[3].mem_util_pct, 32.0);
}

TEST(TelemetryDcgmi, FieldsAndUnits) {
  // POWINST stands in for POWER, PMLMT for EPLMT; FBUSD + FBFRE when no FBTTL; DVCCTR is decimal
  const Recording r = parse_telemetry(
      dmon({{"#Entity", "POWINST", "PMLMT", "SMCLK", "SMMAX", "TMPTR", "FBUSD", "FBFRE", "DVCCTR", "TENSO", "DRAMA", "PCITX", "PCIRX", "MMCLK"},
            {"ID", "W", "W", "", "", "C"},
            {"GPU 2", "301.250", "700.000", "1980", "1980", "61", "40000", "41559", "164", "0.333", "0.125", "2500000000", "125000", "2619"}}),
      "units.txt");
  ASSERT_EQ(r.samples.size(), 1u);
  const Sample& s = r.samples[0];
  EXPECT_EQ(s.gpu, 2);
  EXPECT_EQ(s.power_w, 301.25);
  EXPECT_EQ(s.power_limit_w, 700.0);
  EXPECT_EQ(s.sm_clock_mhz, 1980.0);
  EXPECT_EQ(s.sm_clock_max_mhz, 1980.0);
  EXPECT_EQ(s.temp_c, 61.0);
  EXPECT_EQ(s.mem_used_mib, 40000.0);
  EXPECT_EQ(s.mem_total_mib, 81559.0);
  EXPECT_EQ(s.clock_event_reasons, 164u);
  EXPECT_EQ(s.tensor_active, 0.333);
  EXPECT_EQ(s.dram_active, 0.125);
  EXPECT_DOUBLE_EQ(*s.pcie_tx_mb_s, 2500.0);
  EXPECT_DOUBLE_EQ(*s.pcie_rx_mb_s, 0.125);
  EXPECT_EQ(r.ignored, std::vector<std::string>{"MMCLK"});
  EXPECT_TRUE(has_note(r, "FBUSD + FBFRE")) << notes(r);
  // both power fields: POWER is used, POWINST ignored
  const Recording both = parse_telemetry(dmon({{"#Entity", "POWINST", "POWER"}, {"GPU 0", "1.000", "2.000"}}), "b.txt");
  EXPECT_EQ(both.samples[0].power_w, 2.0);
  EXPECT_EQ(both.ignored, std::vector<std::string>{"POWINST"});
}

TEST(TelemetryDcgmi, ValuesWithBlanksAndCutValues) {
  // DVNAM ("NVIDIA H800") has a blank: the row is cut at the header's column starts
  const std::string text = dmon({{"#Entity", "DVNAM", "GPUTL", "FBUSD"},
                                 {"ID"},
                                 {"GPU 0", "NVIDIA H800", "7", "1234..."},
                                 {"GPU 0", "NVIDIA H800", "8", "N/A"}},
                                14);
  const Recording r = parse_telemetry(text, "names.txt");
  ASSERT_EQ(r.samples.size(), 2u);
  EXPECT_EQ(r.samples[0].util_pct, 7.0);
  EXPECT_FALSE(r.samples[0].mem_used_mib);
  EXPECT_EQ(r.samples[1].util_pct, 8.0);
  EXPECT_EQ(r.samples[1].t_s, 1.0);
  EXPECT_EQ(r.ignored, std::vector<std::string>{"DVNAM"});
  EXPECT_TRUE(has_note(r, "'FBUSD': 1 value cut to the column's width")) << notes(r);
  // a blank in the last column: more values than fields, not a name
  const std::string msg = parse_error(dmon({{"#Entity", "GPUTL", "DVNAM"}, {"GPU 0", "7", "NVIDIA H800"}}, 14));
  EXPECT_TRUE(has(msg, "log.csv:2: 3 values, but the '#Entity' header (line 1) names 2 fields")) << msg;
  EXPECT_TRUE(has_note(r, "'FBUSD': 1 of 2 values empty")) << notes(r);
}

TEST(TelemetryDcgmi, ChangedHeaderCommentsAndCrlf) {
  std::string text = dmon({{"#Entity", "GPUTL"}, {"ID"}, {"GPU 0", "1"}, {"GPU 0", "2"},
                           {"# a note someone added"},
                           {"#Entity", "TMPTR", "GPUTL"}, {"ID", "C"}, {"GPU 0", "50", "3"}});
  std::string crlf;
  for (char c : text) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  for (const std::string& t : {text, crlf}) {
    const Recording r = parse_telemetry(t, "changed.txt");
    ASSERT_EQ(r.samples.size(), 3u);
    EXPECT_EQ(r.samples[2].util_pct, 3.0);
    EXPECT_EQ(r.samples[2].temp_c, 50.0);
    EXPECT_EQ(r.samples[2].t_s, 2.0);
    EXPECT_EQ(r.columns, (std::vector<std::string>{"GPUTL", "TMPTR"}));
    EXPECT_TRUE(has_note(r, "other fields starts at line 6")) << notes(r);
    EXPECT_TRUE(has_note(r, "1 line starting with '#'")) << notes(r);
  }
}

TEST(TelemetryDcgmi, Refusals) {
  const std::string head = dmon({{"#Entity", "GPUTL", "SMACT"}, {"ID"}});
  std::string msg = parse_error(head + dmon({{"GPU 0", "45", "0.450"}, {"GPU 0", "4S", "0.450"}}));
  EXPECT_TRUE(has(msg, "log.csv:4: field GPUTL: '4S' is not a number")) << msg;
  msg = parse_error(head + dmon({{"GPU 0", "45"}}));
  EXPECT_TRUE(has(msg, "log.csv:3: 1 value, but the '#Entity' header (line 1) names 2 fields")) << msg;
  msg = parse_error(head + dmon({{"GPU 0", "45", "0.450", "12"}}));
  EXPECT_TRUE(has(msg, "log.csv:3: 3 values")) << msg;
  msg = parse_error(head + "Error setting watches. Result: -29: Insufficient permissions\n");
  EXPECT_TRUE(has(msg, "log.csv:3: not a dcgmi dmon row")) << msg;
  msg = parse_error(dmon({{"GPU 0", "45", "0.450"}}));
  EXPECT_TRUE(has(msg, "log.csv:1: dcgmi dmon rows without the '#Entity' header")) << msg;
  msg = parse_error(head);
  EXPECT_TRUE(has(msg, "log.csv:2: no GPU samples")) << msg;
  msg = parse_error(head + dmon({{"GPU-I 1", "N/A", "0.450"}}));  // MIG rows only
  EXPECT_TRUE(has(msg, "no GPU samples")) << msg;
  msg = parse_error("#Entity\nGPU 0\n");
  EXPECT_TRUE(has(msg, "log.csv:1: the '#Entity' header names no fields")) << msg;
  msg = parse_error(head + dmon({{"GPU 0", "45", "0.450"}}), -5);
  EXPECT_TRUE(has(msg, "log.csv: the sampling interval must be a positive number")) << msg;
}

// ---------------------------------------------------------------- files and garbage

TEST(TelemetryRefusals, EmptyAndForeignText) {
  for (const std::string& empty : {std::string(), std::string("\n\n  \r\n\t\n"), std::string("\xEF\xBB\xBF")}) {
    const std::string msg = parse_error(empty);
    EXPECT_TRUE(has(msg, "log.csv:") && has(msg, ": empty: no telemetry")) << msg;
  }
  std::string msg = parse_error("{\"traceEvents\": []}\n");
  EXPECT_TRUE(has(msg, "log.csv:1: neither nvidia-smi --query-gpu CSV")) << msg;
  msg = parse_error(std::string("\x7f" "ELF\x02\x01\x01\0\0\0", 10));
  EXPECT_TRUE(has(msg, "log.csv:1: neither") && has(msg, "\\x7fELF\\x02")) << msg;
  msg = parse_error("# gpu    pwr  gtemp  mtemp     sm    mem\n# Idx      W      C      C      %      %\n    0     69     13      -    100     30\n");
  EXPECT_TRUE(has(msg, "log.csv:1: neither")) << msg;  // nvidia-smi dmon, another format
}

TEST(TelemetryRefusals, FilesFifosAndDirectories) {
  TempDir dir("files");
  std::string msg = usage_error([&] { read_telemetry(dir / "missing.csv"); });
  EXPECT_TRUE(has(msg, "cannot read")) << msg;
  msg = usage_error([&] { read_telemetry(dir.path.string()); });
  EXPECT_TRUE(has(msg, "is a directory")) << msg;
  // a FIFO with no writer: refused at once (an open or a read would block)
  const std::string fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto fut = std::async(std::launch::async, [&] { return usage_error([&] { read_telemetry(fifo); }); });
  if (fut.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    ADD_FAILURE() << "read_telemetry blocks on a FIFO";
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // unblocks it: a writer that closes at once
    if (w >= 0) ::close(w);
  }
  msg = fut.get();
  EXPECT_TRUE(has(msg, "a FIFO")) << msg;
  // over the 1 GiB cap (a sparse file): refused by its size, unread
  const std::string big = dir / "big.csv";
  { std::ofstream(big) << "timestamp, index\n"; }
  ASSERT_EQ(::truncate(big.c_str(), off_t(kMaxTelemetryBytes) + 1), 0);
  msg = usage_error([&] { read_telemetry(big); });
  EXPECT_TRUE(has(msg, "over the 1.0 GiB limit")) << msg;
  // an empty file names its path
  const std::string empty = dir / "empty.csv";
  { std::ofstream(empty) << ""; }
  msg = usage_error([&] { read_telemetry(empty); });
  EXPECT_TRUE(has(msg, empty + ":1: empty")) << msg;
}

// Every fixture cut, with bytes flipped, dropped or doubled, must parse or be
// refused with a UsageError: no other exception, no crash, no hang. Without the
// shared data, the made fixtures alone are mutated, and the test then skips.
TEST(TelemetryRefusals, MutatedFixturesNeverCrash) {
  std::mt19937 rng(20240501);
  int parsed = 0, refused = 0;
  std::string missing;  // why a real recording was left out
  struct Fixture {
    bool real;
    const char* f;
  };
  for (const auto& [real, f] : {Fixture{true, "nvsmi_v100s_1gpu.csv"}, Fixture{false, "nvsmi_8gpu_100ms.csv"},
                                Fixture{true, "dcgmi_h800_pcie.txt"}, Fixture{false, "dcgmi_4gpu_100ms.txt"}}) {
    const std::string path = (real ? kReal : kDir) + "/" + f;
    if (std::string why = real ? sb::test::shared_data_missing(path) : ""; !why.empty()) {
      if (missing.empty()) missing = why;
      continue;
    }
    const std::string base = read_file(path);
    ASSERT_FALSE(base.empty()) << f;
    for (int i = 0; i < 300; ++i) {
      std::string t = base;
      const int edits = 1 + int(rng() % 4);
      for (int e = 0; e < edits && !t.empty(); ++e) {
        const std::size_t at = rng() % t.size();
        switch (rng() % 5) {
          case 0: t[at] = char(rng() % 256); break;
          case 1: t.erase(at, 1 + rng() % 40); break;
          case 2: t.insert(at, t.substr(at, 1 + rng() % 80)); break;
          case 3: t.resize(at); break;
          default: t.insert(at, 1, ",\n \t#.[]x"[rng() % 9]); break;
        }
      }
      try {
        const Recording r = parse_telemetry(t, f, double(rng() % 3) * 100);
        EXPECT_FALSE(r.samples.empty());
        ++parsed;
      } catch (const UsageError& e) {
        EXPECT_TRUE(has(e.what(), f)) << e.what();
        ++refused;
      }
    }
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(refused, 0);
  if (!missing.empty()) GTEST_SKIP() << "mutated the made fixtures only; the real recordings were left out: " << missing;
}

}  // namespace
}  // namespace sb::telemetry

namespace sb::telemetry {
namespace {
TEST(TelemetryMade, ValuesNoGpuReportsAreRefused) {
  const std::string head = "timestamp, index, utilization.gpu [%], power.draw [W]\n2024/05/01 12:00:00.000, 0, ";
  for (const char* bad : {"150 %, 10 W", "-5 %, 10 W", "50 %, -1 W", "50 %, 1e308 W"}) {
    try {
      parse_telemetry(head + bad + "\n", "log.csv");
      ADD_FAILURE() << bad << " accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("log.csv:2: column"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
    }
  }
  // dcgmi: a ratio over 1
  try {
    parse_telemetry("#Entity   SMACT\nID\nGPU 0     1.500\n", "d.txt", 100);
    ADD_FAILURE() << "SMACT 1.5 accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
  }
  // the edges are fine
  EXPECT_EQ(parse_telemetry(head + "100 %, 0 W\n", "log.csv").samples.size(), 1u);
}

TEST(TelemetryMade, ADaylightSavingChangeIsTakenOut) {
  // autumn: local time steps back an hour between two rows 1 s apart
  const Recording r = parse_telemetry(
      "timestamp, index, utilization.gpu [%]\n"
      "2026/10/25 02:59:58.000, 0, 10 %\n"
      "2026/10/25 02:59:59.000, 0, 20 %\n"
      "2026/10/25 02:00:00.000, 0, 30 %\n"
      "2026/10/25 02:00:01.000, 0, 40 %\n",
      "log.csv");
  ASSERT_EQ(r.samples.size(), 4u);
  EXPECT_NEAR(r.samples[2].t_s, 2.0, 1e-9);
  EXPECT_NEAR(r.samples[3].t_s, 3.0, 1e-9);
  bool noted = false;
  for (const auto& n : r.notes) noted |= n.find("daylight-saving") != std::string::npos;
  EXPECT_TRUE(noted);
  // spring: forward an hour
  const Recording f = parse_telemetry(
      "timestamp, index, utilization.gpu [%]\n"
      "2026/03/29 01:59:59.000, 0, 10 %\n"
      "2026/03/29 02:00:00.000, 0, 10 %\n"
      "2026/03/29 03:00:01.000, 0, 20 %\n",
      "log.csv");
  EXPECT_NEAR(f.samples[2].t_s, 2.0, 1e-9);
  // a real pause of an hour with no rows in between looks the same only when the
  // rows before it were seconds apart; two rows an hour apart from the start are kept
  const Recording g = parse_telemetry(
      "timestamp, index, utilization.gpu [%]\n"
      "2026/03/29 01:00:00.000, 0, 10 %\n"
      "2026/03/29 02:00:00.000, 0, 20 %\n",
      "log.csv");
  EXPECT_NEAR(g.samples[1].t_s, 3600.0, 1e-9);
}

TEST(TelemetryMade, BusIdsNameTheGpusWhenThereIsNoIndex) {
  const Recording r = parse_telemetry(
      "timestamp, pci.bus_id, utilization.gpu [%]\n"
      "2024/05/01 12:00:00.000, 00000000:18:00.0, 10 %\n"
      "2024/05/01 12:00:00.000, 00000000:2A:00.0, 20 %\n"
      "2024/05/01 12:00:00.100, 00000000:18:00.0, 30 %\n"
      "2024/05/01 12:00:00.100, 00000000:2A:00.0, 40 %\n",
      "log.csv");
  ASSERT_EQ(r.samples.size(), 4u);
  EXPECT_EQ(r.gpus, 2);
  EXPECT_EQ(r.samples[1].gpu, 1);
  EXPECT_EQ(r.samples[2].gpu, 0);
  EXPECT_DOUBLE_EQ(*r.samples[3].util_pct, 40);
  EXPECT_NEAR(r.samples[3].t_s, 0.1, 1e-9);
}

// nvidia-smi rows of `rows` readings `every_ms` apart, the GPUs of one reading `apart_ms` apart
// (nvidia-smi stamps each row on its own), utilization alternating busy and idle GPUs; no index.
std::string unnamed_log(int gpus, int rows, int every_ms, int apart_ms) {
  std::string out = "timestamp, utilization.gpu [%]\n";
  for (int r = 0; r < rows; ++r)
    for (int g = 0; g < gpus; ++g) {
      const int ms = r * every_ms + g * apart_ms + (r * 7) % 3;
      out += fmt::format("2024/05/01 12:{:02d}:{:02d}.{:03d}, {} %\n", ms / 60000, ms / 1000 % 60, ms % 1000, g % 2 ? 0 : 97);
    }
  return out;
}

TEST(TelemetryMade, SeveralGpusWithoutAnIndexAreRefusedNotMerged) {
  // make_fixtures.py: 3 GPUs, -l 1, each reading's rows 11 and 4 ms apart (as nvidia-smi stamps
  // them); no two rows share a timestamp. Read as one GPU it alternated 97% and 0%: spiky.
  std::string msg = usage_error([&] { read_telemetry(kDir + "/nvsmi_3gpu_no_index.csv"); });
  EXPECT_TRUE(has(msg, "nvsmi_3gpu_no_index.csv:2: no 'index' column, and the rows come in groups of 3")) << msg;
  EXPECT_TRUE(has(msg, "lines 2 to 4: 11, 4 ms")) << msg;
  EXPECT_TRUE(has(msg, "--query-gpu=timestamp,index")) << msg;
  // two GPUs 5 ms apart every 500 ms; eight, from the made 8-GPU log without index and bus id
  msg = parse_error(unnamed_log(2, 10, 500, 5));
  EXPECT_TRUE(has(msg, "log.csv:2: no 'index' column, and the rows come in groups of 2")) << msg;
  std::string eight;
  std::istringstream in(read_file(kDir + "/nvsmi_8gpu_100ms.csv"));
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells;
    for (std::size_t b = 0;;) {
      const std::size_t e = line.find(", ", b);
      cells.push_back(line.substr(b, e == std::string::npos ? std::string::npos : e - b));
      if (e == std::string::npos) break;
      b = e + 2;
    }
    cells.erase(cells.begin() + 3);  // pci.bus_id
    cells.erase(cells.begin() + 1);  // index
    eight += fmt::format("{}\n", fmt::join(cells, ", "));
  }
  msg = parse_error(eight);
  EXPECT_TRUE(has(msg, "log.csv:2: no 'index' column, and the rows come in groups of 8")) << msg;
}

TEST(TelemetryMade, OneGpuWithoutAnIndexIsStillRead) {
  // -l 1 with jitter, a pause of 30 s and nvidia-smi restarted: one kind of gap, and pauses
  // that do not cut the rows into groups of one size
  std::string text = "timestamp, utilization.gpu [%]\n";
  for (int r = 0; r < 60; ++r) {
    const int ms = r * 1000 + (r * 37) % 90 + (r >= 20 ? 30000 : 0) + (r >= 45 ? 5000 : 0);
    if (r == 45) text += "timestamp, utilization.gpu [%]\n";
    text += fmt::format("2024/05/01 12:{:02d}:{:02d}.{:03d}, {} %\n", ms / 60000, ms / 1000 % 60, ms % 1000, 90 + r % 7);
  }
  const Recording r = parse_telemetry(text, "log.csv");
  EXPECT_EQ(r.gpus, 1);
  EXPECT_EQ(r.samples.size(), 60u);
  EXPECT_TRUE(has_note(r, "every row read as GPU 0")) << notes(r);
  // -lms 100 with a slow query every fifth reading (400 ms): groups of five, but spread over
  // as long as the gap between them, which one GPU's rows are and a reading's are not
  text = "timestamp, utilization.gpu [%]\n";
  for (int i = 0, ms = 0; i < 40; ++i, ms += i % 5 == 0 ? 400 : 100)
    text += fmt::format("2024/05/01 12:00:{:02d}.{:03d}, 50 %\n", ms / 1000, ms % 1000);
  EXPECT_EQ(parse_telemetry(text, "log.csv").gpus, 1);
  // a short log of one GPU: too few rows to tell
  EXPECT_EQ(parse_telemetry(unnamed_log(2, 2, 500, 5), "log.csv").samples.size(), 4u);
}

// nvidia-smi rows of one GPU (index 0) at these local times, 50% each.
std::string rows_at(const std::vector<std::string>& times) {
  std::string out = "timestamp, index, utilization.gpu [%]\n";
  for (const std::string& t : times) out += "2026/10/25 " + t + ", 0, 50 %\n";
  return out;
}

TEST(TelemetryMade, ADaylightSavingChangeIsTakenOutWhateverTheInterval) {
  // nvidia-smi -l 60 across the autumn change: 02:59:00 then, 60 s later, 02:00:00 (-3540 s)
  Recording r = parse_telemetry(rows_at({"02:57:00.000", "02:58:00.000", "02:59:00.000", "02:00:00.000", "02:01:00.000"}), "log.csv");
  ASSERT_EQ(r.samples.size(), 5u);
  EXPECT_NEAR(r.samples[3].t_s, 180.0, 1e-9);
  EXPECT_NEAR(r.samples[4].t_s, 240.0, 1e-9);
  EXPECT_TRUE(has_note(r, "line 5: the clock steps back by an hour (a daylight-saving change")) << notes(r);
  // -l 120, and -l 60 in spring (01:59:00 then 03:00:00)
  r = parse_telemetry(rows_at({"02:54:00.000", "02:56:00.000", "02:58:00.000", "02:00:00.000"}), "log.csv");
  EXPECT_NEAR(r.samples[3].t_s, 360.0, 1e-9);
  r = parse_telemetry(rows_at({"01:58:00.000", "01:59:00.000", "03:00:00.000"}), "log.csv");
  EXPECT_NEAR(r.samples[2].t_s, 120.0, 1e-9);
  EXPECT_TRUE(has_note(r, "jumps forward by an hour")) << notes(r);
  // two GPUs 5 ms apart, -l 60
  r = parse_telemetry(
      "timestamp, index, utilization.gpu [%]\n"
      "2026/10/25 02:58:00.000, 0, 50 %\n2026/10/25 02:58:00.005, 1, 50 %\n"
      "2026/10/25 02:59:00.000, 0, 50 %\n2026/10/25 02:59:00.005, 1, 50 %\n"
      "2026/10/25 02:00:00.000, 0, 50 %\n2026/10/25 02:00:00.005, 1, 50 %\n",
      "log.csv");
  EXPECT_NEAR(r.samples[4].t_s, 120.0, 1e-9);
  EXPECT_NEAR(r.samples[5].t_s, 120.005, 1e-9);
  // an hourly log (-l 3600): every step is an hour, none of them a daylight-saving change
  r = parse_telemetry(rows_at({"01:00:00.000", "02:00:00.000", "03:00:00.000", "04:00:00.000"}), "log.csv");
  EXPECT_NEAR(r.samples[3].t_s, 10800.0, 1e-9);
  EXPECT_FALSE(has_note(r, "daylight-saving")) << notes(r);
  // a real step back is still refused: 49 minutes, or an hour after an irregular gap (11 min)
  std::string msg = parse_error(rows_at({"02:57:00.000", "02:58:00.000", "02:59:00.000", "02:11:00.000"}));
  EXPECT_TRUE(has(msg, "log.csv:5: timestamp '2026/10/25 02:11:00.000' is 2880.000 s before line 4's")) << msg;
  msg = parse_error(rows_at({"02:50:00.000", "02:51:00.000", "02:52:00.000", "02:53:00.000", "03:04:00.000", "02:05:00.000"}));
  EXPECT_TRUE(has(msg, "log.csv:7: timestamp '2026/10/25 02:05:00.000' is 3540.000 s before line 6's")) << msg;
}

}  // namespace
}  // namespace sb::telemetry
