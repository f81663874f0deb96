// The Kineto trace reader (readers/kineto.hpp): the five real traces of HTA's
// test data ($STALLBENCH_SHARED_DATA/traces, outside the repository: those
// tests skip without it) against counts computed independently
// with python3's json module; gzip, plain file and text in memory giving the
// same Trace; the bare-array form; string pids, args, fractional ts, memory
// samples, copies; an 8+ MiB trace whose kernel names imitate event
// boundaries ("}, {", \" and \\ escapes) across the 4 MiB chunk, so that the
// batch parser's fallback runs; arrays of objects after traceEvents and
// inside args; malformed files refused with the byte offset; FIFOs and
// directories refused without blocking; corrupt .gz files.
#include <gtest/gtest.h>

#include <fcntl.h>     // ::open
#include <sys/stat.h>  // ::mkfifo
#include <unistd.h>    // ::close, ::getpid
#include <zlib.h>      // gzopen, gzread, gzwrite

#include <chrono>      // std::chrono
#include <cstdint>     // std::int64_t
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream, std::ofstream
#include <functional>  // std::function
#include <future>      // std::async
#include <map>         // std::map
#include <string>      // std::string
#include <vector>      // std::vector

#include <fmt/format.h>  // fmt::format

#include "harness/errors.hpp"  // sb::UsageError
#include "readers/kineto.hpp"
#include "shared_data.hpp"  // sb::test::shared_data, SB_NEED_SHARED_DATA

namespace sb::readers {
namespace {

namespace fs = std::filesystem;

// HTA's traces (third-party data, not in the repository).
const std::string kTraces = sb::test::shared_data("traces");

class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(fs::temp_directory_path() / fmt::format("sb_test_kineto_{}_{}", name, ::getpid())) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& f) const { return (path_ / f).string(); }

 private:
  fs::path path_;
};

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}
std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
std::string gunzip(const std::string& path) {
  gzFile g = gzopen(path.c_str(), "rb");
  EXPECT_NE(g, nullptr) << path;
  if (!g) return {};
  std::string out;
  char buf[1 << 16];
  for (int k; (k = gzread(g, buf, sizeof buf)) > 0;) out.append(buf, std::size_t(k));
  gzclose(g);
  return out;
}
void gzip_file(const std::string& path, const std::string& bytes) {
  gzFile g = gzopen(path.c_str(), "wb1");
  ASSERT_NE(g, nullptr) << path;
  ASSERT_EQ(gzwrite(g, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
  ASSERT_EQ(gzclose(g), Z_OK);
}

// Every field of two Traces but file_bytes and gzip (how the bytes were stored).
void expect_same(const Trace& a, const Trace& b) {
  ASSERT_EQ(a.events.size(), b.events.size());
  for (std::size_t i = 0; i < a.events.size(); ++i) {
    const Event &x = a.events[i], &y = b.events[i];
    ASSERT_TRUE(x.ts == y.ts && x.dur == y.dur && x.pid == y.pid && x.tid == y.tid &&
                x.correlation == y.correlation && x.stream == y.stream && x.bytes == y.bytes &&
                x.external_id == y.external_id && a.name(x) == b.name(y) && x.cat == y.cat && x.copy == y.copy &&
                x.pageable == y.pageable)
        << "event " << i << ": " << a.name(x) << " / " << b.name(y);
  }
  EXPECT_EQ(a.names, b.names);
  ASSERT_EQ(a.memory.size(), b.memory.size());
  for (std::size_t i = 0; i < a.memory.size(); ++i) {
    EXPECT_EQ(a.memory[i].ts, b.memory[i].ts);
    EXPECT_EQ(a.memory[i].device, b.memory[i].device);
    EXPECT_EQ(a.memory[i].total_allocated, b.memory[i].total_allocated);
    EXPECT_EQ(a.memory[i].total_reserved, b.memory[i].total_reserved);
    EXPECT_EQ(a.memory[i].limit, b.memory[i].limit);
  }
  EXPECT_EQ(a.device_properties, b.device_properties);
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.world_size, b.world_size);
  EXPECT_EQ(a.base_time_ns, b.base_time_ns);
  EXPECT_EQ(a.distributed_backend, b.distributed_backend);
  EXPECT_EQ(a.category_counts, b.category_counts);
  EXPECT_EQ(a.phase_counts, b.phase_counts);
  EXPECT_EQ(a.flows, b.flows);
  EXPECT_EQ(a.json_bytes, b.json_bytes);
  EXPECT_EQ(a.fractional_ts, b.fractional_ts);
}

std::map<std::string, std::int64_t> kept_by_cat(const Trace& t) {
  std::map<std::string, std::int64_t> n;
  for (const auto& e : t.events) ++n[to_string(e.cat)];
  return n;
}

// The message of the UsageError that f throws ("" and a failure if none).
std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a UsageError: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no error";
  return "";
}
// parse_kineto(text) refuses it at byte `at` for a reason containing `why`.
void expect_refused(const std::string& text, std::uint64_t at, const std::string& why) {
  const std::string msg = usage_error([&] { parse_kineto(text); });
  EXPECT_NE(msg.find(fmt::format("at byte {}:", at)), std::string::npos) << msg;
  EXPECT_NE(msg.find(why), std::string::npos) << msg;
}

// ---- the five real traces ----

// What python3's json module finds in each file (gzip.open + json.load, then
// over traceEvents: Counter of "ph"; flows = ph in s/f/t; Counter of "cat"
// ("" when absent) over the other events; the "ph": "X" events of the kept
// categories counted by category (Kernel counted as kernel), their distinct
// names, the sum of the kernels' dur, how many have a number in args.stream
// (the AMD trace's hip calls have "stream": "0x0", a string, left at -1) and
// an args.correlation; fractional = some ts is a float or missing; "[memory]"
// instants with args "Total Allocated"; distributedInfo's rank and
// world_size, len(deviceProperties), baseTimeNanoseconds, the inflated size).
struct Expected {
  std::string file;
  std::map<std::string, std::int64_t> phases, cats, kept;
  std::int64_t flows, names;
  double kernel_dur;
  std::int64_t with_stream, with_correlation, memory;
  bool fractional;
  std::optional<std::int64_t> rank, world_size;
  std::size_t device_properties;
  std::optional<std::int64_t> base_time_ns;
  std::uint64_t json_bytes;
};

const std::vector<Expected>& expected_traces() {
  static const std::vector<Expected> v = {
      {"amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
       {{"X", 113}, {"f", 25}, {"s", 20}, {"M", 60}, {"i", 2}},
       {{"cpu_op", 70}, {"user_annotation", 3}, {"cuda_runtime", 21}, {"gpu_memcpy", 2}, {"kernel", 14},
        {"gpu_user_annotation", 2}, {"", 62}, {"Trace", 1}},
       {{"cpu_op", 70}, {"user_annotation", 3}, {"cuda_runtime", 21}, {"gpu_memcpy", 2}, {"kernel", 14},
        {"gpu_user_annotation", 2}},
       45, 63, 110.881, 16, 37, 0, true, std::nullopt, std::nullopt, 4, 1735632360000000000, 66897},
      {"cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
       {{"X", 16}, {"M", 12}, {"i", 2}},
       {{"user_annotation", 11}, {"cpu_op", 4}, {"", 14}, {"Trace", 1}},
       {{"user_annotation", 11}, {"cpu_op", 4}},
       0, 3, 0.0, 0, 0, 0, true, 34, 300, 0, 1719853884000000000, 25192},
      {"nccl_parser_config__nccl_data.json.gz",
       {{"X", 26933}, {"f", 9195}, {"s", 4405}, {"M", 38}, {"i", 2}},
       {{"cpu_op", 14346}, {"user_annotation", 42}, {"cuda_runtime", 8740}, {"kernel", 2700}, {"gpu_memset", 114},
        {"gpu_memcpy", 960}, {"gpu_user_annotation", 30}, {"", 40}, {"Trace", 1}},
       {{"cpu_op", 14346}, {"user_annotation", 42}, {"cuda_runtime", 8740}, {"kernel", 2700}, {"gpu_memset", 114},
        {"gpu_memcpy", 960}, {"gpu_user_annotation", 30}},
       13600, 189, 162532.34, 3774, 12514, 0, true, 0, 2, 8, 1711964646000000000, 9778890},
      {"ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
       {{"X", 45420}, {"f", 15928}, {"s", 7306}, {"M", 36}, {"i", 2}},
       {{"cpu_op", 23910}, {"user_annotation", 70}, {"kernel", 4350}, {"cuda_runtime", 15329}, {"gpu_memcpy", 1600},
        {"gpu_memset", 145}, {"gpu_user_annotation", 15}, {"", 38}, {"Trace", 1}},
       {{"cpu_op", 23910}, {"user_annotation", 70}, {"kernel", 4350}, {"cuda_runtime", 15329}, {"gpu_memcpy", 1600},
        {"gpu_memset", 145}, {"gpu_user_annotation", 15}},
       23234, 192, 468153.602, 6095, 21424, 0, true, 0, 1, 8, std::nullopt, 15377659},
      {"timeline_analysis__sampled_rank-0.json.gz",
       {{"X", 4811}, {"M", 44}},
       {{"cpu_op", 2329}, {"user_annotation", 73}, {"kernel", 1154}, {"cuda_runtime", 1204}, {"gpu_memcpy", 40},
        {"gpu_memset", 10}, {"", 44}, {"Trace", 1}},
       {{"cpu_op", 2329}, {"user_annotation", 73}, {"kernel", 1154}, {"cuda_runtime", 1204}, {"gpu_memcpy", 40},
        {"gpu_memset", 10}},
       0, 398, 606519.0, 1204, 2408, 0, false, 0, 128, 0, std::nullopt, 1759570},
  };
  return v;
}

TEST(KinetoRealTraces, CountsMatchAnIndependentReading) {
  for (const auto& x : expected_traces()) SB_NEED_SHARED_DATA(kTraces + "/" + x.file);
  for (const auto& x : expected_traces()) {
    SCOPED_TRACE(x.file);
    const std::string path = kTraces + "/" + x.file;
    const Trace t = read_kineto(path);
    EXPECT_TRUE(t.gzip);
    EXPECT_EQ(t.file_bytes, fs::file_size(path));
    EXPECT_EQ(t.json_bytes, x.json_bytes);
    EXPECT_EQ(t.phase_counts, x.phases);
    EXPECT_EQ(t.category_counts, x.cats);
    EXPECT_EQ(kept_by_cat(t), x.kept);
    EXPECT_EQ(t.flows, x.flows);
    EXPECT_EQ(std::int64_t(t.names.size()), x.names);
    double kdur = 0;
    std::int64_t with_stream = 0, with_corr = 0;
    for (const auto& e : t.events) {
      if (e.cat == Cat::kernel) kdur += e.dur;
      with_stream += e.stream >= 0;
      with_corr += e.correlation >= 0;
      EXPECT_LT(e.name, t.names.size());
      EXPECT_EQ(e.is_gpu(), e.cat == Cat::kernel || e.cat == Cat::gpu_memcpy || e.cat == Cat::gpu_memset);
      if (e.cat == Cat::gpu_memcpy) {
        EXPECT_NE(e.copy, CopyKind::none) << t.name(e);
      } else {
        EXPECT_EQ(e.copy, CopyKind::none);
      }
    }
    EXPECT_NEAR(kdur, x.kernel_dur, 1e-3);
    EXPECT_EQ(with_stream, x.with_stream);
    EXPECT_EQ(with_corr, x.with_correlation);
    EXPECT_EQ(std::int64_t(t.memory.size()), x.memory);
    EXPECT_EQ(t.fractional_ts, x.fractional);
    EXPECT_EQ(t.rank, x.rank);
    EXPECT_EQ(t.world_size, x.world_size);
    EXPECT_TRUE(t.device_properties.is_array());
    EXPECT_EQ(t.device_properties.size(), x.device_properties);
    EXPECT_EQ(t.base_time_ns, x.base_time_ns);
  }
}

TEST(KinetoRealTraces, NamedFlagsAndFields) {
  for (const char* f : {"ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
                        "timeline_analysis__sampled_rank-0.json.gz", "nccl_parser_config__nccl_data.json.gz"})
    SB_NEED_SHARED_DATA(kTraces + "/" + f);
  // ns_resolution's timestamps have fractions; timeline_analysis's are whole µs.
  const Trace ns = read_kineto(kTraces + "/ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz");
  EXPECT_TRUE(ns.fractional_ts);
  bool some_fraction = false;
  for (const auto& e : ns.events) some_fraction |= e.ts != double(std::int64_t(e.ts));
  EXPECT_TRUE(some_fraction);
  const Trace tl = read_kineto(kTraces + "/timeline_analysis__sampled_rank-0.json.gz");
  EXPECT_FALSE(tl.fractional_ts);
  for (const auto& e : tl.events) ASSERT_EQ(e.ts, double(std::int64_t(e.ts)));
  EXPECT_TRUE(tl.device_properties.empty());  // it has none
  // nccl_data: a rank of two, NCCL kernels, A100s; its copies are device to device.
  const Trace nccl = read_kineto(kTraces + "/nccl_parser_config__nccl_data.json.gz");
  EXPECT_EQ(nccl.distributed_backend, "nccl");
  EXPECT_TRUE(nccl.device_properties[0].contains("name"));
  bool nccl_kernel = false, dtod = false;
  for (const auto& e : nccl.events) {
    nccl_kernel |= e.cat == Cat::kernel && nccl.name(e).rfind("ncclKernel", 0) == 0;
    if (e.cat == Cat::gpu_memcpy) {
      ASSERT_EQ(e.copy, CopyKind::dtod) << nccl.name(e);
      ASSERT_GT(e.bytes, 0);
      ASSERT_FALSE(e.pageable);
      dtod = true;
    }
    if (e.cat == Cat::kernel) {
      ASSERT_GE(e.stream, 0) << nccl.name(e);
    }
  }
  EXPECT_TRUE(nccl_kernel);
  EXPECT_TRUE(dtod);
}

TEST(KinetoRealTraces, GzipPlainFileAndTextGiveTheSameTrace) {
  for (const auto& x : expected_traces()) SB_NEED_SHARED_DATA(kTraces + "/" + x.file);
  TempDir dir("same");
  for (const auto& x : expected_traces()) {
    SCOPED_TRACE(x.file);
    const std::string gz = kTraces + "/" + x.file;
    const std::string text = gunzip(gz);
    ASSERT_EQ(text.size(), x.json_bytes);
    const std::string plain = dir / "trace.json";
    write_file(plain, text);
    const Trace a = read_kineto(gz), b = read_kineto(plain), c = parse_kineto(text);
    EXPECT_TRUE(a.gzip);
    EXPECT_FALSE(b.gzip);
    EXPECT_FALSE(c.gzip);
    EXPECT_EQ(b.file_bytes, text.size());
    EXPECT_EQ(c.file_bytes, text.size());
    expect_same(a, b);
    expect_same(b, c);
  }
}

// ---- made traces ----

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o + "\"";
}

TEST(KinetoMade, BareArrayStringIdsArgsAndTimes) {
  const std::string text = R"([
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 10, "dur": 5,
     "args": {"stream": 7, "correlation": 42, "device": 0, "External id": 9}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 101, "ts": 8, "dur": 1,
     "args": {"correlation": 42}},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": "Spans", "tid": "PyTorch Profiler", "ts": 1, "dur": 20},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": "Spans", "tid": "other", "ts": 2, "dur": 3},
    {"ph": "X", "cat": "python_function", "name": "f", "pid": 1, "tid": 1, "ts": 2, "dur": 3},
    {"ph": "s", "cat": "ac2g", "id": 42, "pid": 100, "tid": 101, "ts": 8},
    {"ph": "f", "cat": "ac2g", "id": 42, "pid": 0, "tid": 7, "ts": 10, "bp": "e"},
    {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "ts": 0, "args": {"name": "GPU 0"}}
  ])";
  const Trace t = parse_kineto(text);
  ASSERT_EQ(t.events.size(), 4u);  // python_function, flows and metadata are counted, not kept
  const Event &k = t.events[0], &rt = t.events[1], &step = t.events[2], &op = t.events[3];
  EXPECT_EQ(k.cat, Cat::kernel);
  EXPECT_EQ(t.name(k), "gemm");
  EXPECT_EQ(k.ts, 10);
  EXPECT_EQ(k.dur, 5);
  EXPECT_EQ(k.end(), 15);
  EXPECT_EQ(k.pid, 0);
  EXPECT_EQ(k.tid, 7);
  EXPECT_EQ(k.stream, 7);
  EXPECT_EQ(k.correlation, 42);
  EXPECT_EQ(k.external_id, 9);
  EXPECT_TRUE(k.is_gpu());
  EXPECT_EQ(rt.cat, Cat::cuda_runtime);
  EXPECT_EQ(rt.stream, -1);  // args without stream
  EXPECT_EQ(rt.correlation, 42);
  EXPECT_FALSE(rt.is_gpu());
  // string pid/tid: one id per distinct string, apart from the numeric ones
  EXPECT_EQ(step.pid, op.pid);
  EXPECT_NE(step.tid, op.tid);
  EXPECT_LT(step.pid, 0);
  EXPECT_LT(step.tid, 0);
  EXPECT_NE(step.pid, step.tid);
  EXPECT_EQ(step.stream, -1);  // no args at all
  EXPECT_EQ(step.correlation, -1);
  EXPECT_EQ(step.cat, Cat::user_annotation);
  EXPECT_EQ(op.cat, Cat::cpu_op);
  EXPECT_EQ(t.flows, 2);
  EXPECT_EQ(t.phase_counts, (std::map<std::string, std::int64_t>{{"X", 5}, {"s", 1}, {"f", 1}, {"M", 1}}));
  EXPECT_EQ(t.category_counts,
            (std::map<std::string, std::int64_t>{{"kernel", 1}, {"cuda_runtime", 1}, {"user_annotation", 1},
                                                 {"cpu_op", 1}, {"python_function", 1}, {"", 1}}));
  EXPECT_FALSE(t.fractional_ts);  // every ts an integer
  EXPECT_FALSE(t.rank.has_value());
  EXPECT_TRUE(t.device_properties.empty());
  EXPECT_EQ(t.json_bytes, text.size());
}

TEST(KinetoMade, FractionalTimestamps) {
  auto one = [](const std::string& ts) {
    return parse_kineto(R"({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "dur": 1)" + ts + "}]}");
  };
  EXPECT_FALSE(one(R"(, "ts": 1712195495505583)").fractional_ts);
  const Trace f = one(R"(, "ts": 1712195495505583.5)");
  EXPECT_TRUE(f.fractional_ts);
  EXPECT_EQ(f.events.at(0).ts, 1712195495505583.5);
  EXPECT_TRUE(one(R"(, "ts": 1712195495505583.0)").fractional_ts);  // a float without a fraction: float all the same
  EXPECT_TRUE(one(R"(, "ts": 17e2)").fractional_ts);
  EXPECT_EQ(one(R"(, "ts": 17e2)").events.at(0).ts, 1700);
  // a metadata event without ts: the column has a NaN, HTA rounds
  EXPECT_TRUE(parse_kineto(R"({"traceEvents": [{"ph": "M", "name": "x"}, {"ph": "X", "cat": "kernel", "ts": 1, "dur": 1}]})")
                  .fractional_ts);
}

TEST(KinetoMade, TopLevelFieldsMemoryAndCopies) {
  const std::string text = R"json({
    "schemaVersion": 1,
    "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}, {"id": 1, "name": "NVIDIA H100"}],
    "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8},
    "traceEvents": [
      {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 5, "s": "t",
       "args": {"Device Type": 1, "Device Id": 2, "Addr": 1, "Bytes": 512, "Total Allocated": 4096, "Total Reserved": 8192}},
      {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 6, "s": "t",
       "args": {"Device Type": 0, "Device Id": -1, "Total Allocated": 100}},
      {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 7, "s": "t",
       "args": {"Device Type": 1, "Device Id": 2}},
      {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7, "ts": 10, "dur": 2,
       "args": {"stream": 7, "bytes": 1048576, "memory bandwidth (GB/s)": 0.5}},
      {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": 0, "tid": 7, "ts": 20, "dur": 2,
       "args": {"stream": 7, "bytes": 64}},
      {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7, "ts": 30, "dur": 1, "args": {"stream": 7, "bytes": 8}},
      {"ph": "X", "cat": "Kernel", "name": "rocm_kernel", "pid": 2, "tid": 3, "ts": 40, "dur": 1}
    ],
    "traceName": "t.json", "displayTimeUnit": "ms", "baseTimeNanoseconds": 1700000000000000000
  })json";
  const Trace t = parse_kineto(text);
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.world_size, 8);
  EXPECT_EQ(t.distributed_backend, "nccl");
  ASSERT_EQ(t.device_properties.size(), 2u);
  EXPECT_EQ(t.device_properties[1]["name"], "NVIDIA H100");
  EXPECT_EQ(t.base_time_ns, 1700000000000000000);
  ASSERT_EQ(t.memory.size(), 2u);  // the third has no Total Allocated
  EXPECT_EQ(t.memory[0].ts, 5);
  EXPECT_EQ(t.memory[0].device, 2);
  EXPECT_EQ(t.memory[0].total_allocated, 4096);
  EXPECT_EQ(t.memory[0].total_reserved, 8192);
  EXPECT_EQ(t.memory[1].device, -1);  // host
  EXPECT_EQ(t.memory[1].total_allocated, 100);
  EXPECT_EQ(t.memory[1].total_reserved, 0);
  ASSERT_EQ(t.events.size(), 4u);
  EXPECT_EQ(t.events[0].copy, CopyKind::htod);
  EXPECT_TRUE(t.events[0].pageable);
  EXPECT_EQ(t.events[0].bytes, 1048576);
  EXPECT_EQ(t.events[1].copy, CopyKind::dtoh);
  EXPECT_FALSE(t.events[1].pageable);
  EXPECT_EQ(t.events[2].cat, Cat::gpu_memset);
  EXPECT_EQ(t.events[2].copy, CopyKind::none);
  EXPECT_EQ(t.events[3].cat, Cat::kernel);  // ROCm's "Kernel"
  EXPECT_EQ(t.phase_counts.at("i"), 3);
  EXPECT_EQ(t.category_counts.at("cpu_instant_event"), 3);
  EXPECT_STREQ(to_string(Cat::gpu_user_annotation), "gpu_user_annotation");
  EXPECT_STREQ(to_string(Cat::other), "other");
}

// An event per line; kernel names imitate the boundary between two events
// ("}, {", also after \" so that a scanner ignoring escapes would leave the
// string there) and end in a backslash (\\ before the closing quote); some
// events carry an array of objects in their args ("}, {" outside strings,
// inside an event). `every`: how often an event has the imitations.
// One event is placed so that the first read (kineto.cpp reads 4 MiB, from
// memory and from a file alike) ends right after a look-alike "}, {": the
// last boundary in the buffer is a false one, the batch up to it fails and
// the exact path reads on, across the chunk boundary, where `cut` puts an
// escaped quote, a run of two backslashes or the array of objects.
enum class Cut { escaped_quote, backslashes, nested_args };
struct Big {
  std::string text;
  std::vector<std::string> names;
};
std::string big_event(int i, const std::string& name, bool nested) {
  std::string args = fmt::format(R"("stream": 7, "correlation": {})", i);
  if (nested) args += R"(, "list": [{"a": 1}, {"b": [{"c": 2}, {"d": "}, {"}]}])";
  return fmt::format(R"({{"ph": "X", "cat": "kernel", "name": {}, "pid": 0, "tid": 7, "ts": {}, "dur": 1, "args": {{{}}}}})",
                     json_string(name), i, args);
}
Big big_trace(std::size_t min_bytes, int every, std::size_t cut_at, Cut cut) {
  Big b;
  bool placed = false;
  b.text = "{\"traceEvents\": [\n";
  for (int i = 0; b.text.size() < min_bytes; ++i) {
    std::string name = fmt::format("void k{}<at::native::{{lambda(float)#1}}>(float*)", i);
    if (i % every == 0)
      name = fmt::format("void k{}<{{lambda()#1}}, {{lambda()#2}}>(char const* \"}}, {{\\\"x}}, {{\") \\}}, {{ \\", i);
    std::string ev = big_event(i, name, i % (every * 3) == 1);
    const std::size_t start = b.text.size() + (i > 0 ? 2 : 0);
    if (!placed && start + ev.size() + 400 > cut_at) {
      placed = true;
      // m: where in the event the byte at cut_at is, the name's fill left out
      auto with = [&](std::size_t fill) {
        const std::string f(fill, 'a');
        switch (cut) {
          case Cut::escaped_quote: name = f + "}, {\"x"; break;    // ...}, {\ | "x
          case Cut::backslashes: name = f + "}, {\\"; break;       // ...}, {\\ | "
          case Cut::nested_args: name = f; break;                  // [{"a": 1}, { | "b"
        }
        ev = big_event(i, name, cut == Cut::nested_args);
        switch (cut) {
          case Cut::escaped_quote: return ev.find("}, {\\\"x") + 5;
          case Cut::backslashes: return ev.find("}, {\\\\\"") + 6;
          case Cut::nested_args: return ev.find("{\"b\"") + 1;
        }
        return std::string::npos;
      };
      const std::size_t m = with(0);
      with(cut_at - start - m);
      EXPECT_EQ(start + with(cut_at - start - m), cut_at);
      EXPECT_EQ(ev.substr(cut_at - start - 4, 4), cut == Cut::nested_args ? "}, {" : (cut == Cut::escaped_quote ? ", {\\" : " {\\\\"));
    }
    if (i > 0) b.text += ",\n";
    b.text += ev;
    b.names.push_back(name);
  }
  b.text += "\n], \"traceName\": \"big\"}\n";
  return b;
}

void expect_big(const Trace& t, const Big& b) {
  ASSERT_EQ(t.events.size(), b.names.size());
  for (std::size_t i = 0; i < b.names.size(); ++i) {
    const Event& e = t.events[i];
    ASSERT_EQ(t.name(e), b.names[i]) << "event " << i;
    ASSERT_EQ(e.ts, double(i)) << "event " << i;
    ASSERT_EQ(e.correlation, std::int64_t(i));
    ASSERT_EQ(e.stream, 7);
  }
  EXPECT_EQ(t.phase_counts, (std::map<std::string, std::int64_t>{{"X", std::int64_t(b.names.size())}}));
  EXPECT_EQ(t.category_counts, (std::map<std::string, std::int64_t>{{"kernel", std::int64_t(b.names.size())}}));
  EXPECT_EQ(t.json_bytes, b.text.size());
}

// The quadratic-time guards below bound a read's wall time: a regression is 5 s to 5 minutes where
// the linear read takes a fraction of a second. Unoptimized or sanitized builds (CI's ASan + UBSan
// build is -O0) run the same read several times slower, so their bound is 10x; a quadratic read still
// exceeds it by far.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || !defined(__OPTIMIZE__)
constexpr double kSlowBuild = 10.0;
#else
constexpr double kSlowBuild = 1.0;
#endif

TEST(KinetoMade, BoundaryLookAlikesAcrossChunks) {
  constexpr std::size_t kChunk = std::size_t(4) << 20;  // kineto.cpp's first read
  TempDir dir("big");
  struct Case {
    int every;
    Cut cut;
  };
  for (const Case c : {Case{1, Cut::escaped_quote}, Case{997, Cut::backslashes}, Case{13, Cut::nested_args}}) {
    SCOPED_TRACE(fmt::format("every {}, cut {}", c.every, int(c.cut)));
    const Big b = big_trace((std::size_t(8) << 20) + 100000, c.every, kChunk, c.cut);
    ASSERT_GT(b.text.size(), std::size_t(8) << 20);
    const auto t0 = std::chrono::steady_clock::now();
    const Trace t = parse_kineto(b.text);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 2.0 * kSlowBuild) << "a failed batch must not make the reading quadratic";
    expect_big(t, b);
    if (c.every == 13) {  // through the files too (plain and gzip: other read sizes)
      write_file(dir / "big.json", b.text);
      gzip_file(dir / "big.json.gz", b.text);
      expect_same(read_kineto(dir / "big.json"), t);
      expect_same(read_kineto(dir / "big.json.gz"), t);
    }
  }
}

// A trace whose events fill more than the batch's minimum, then `last`.
std::string many_then(const std::string& last, const std::string& after = "", int n = 2000,
                      const std::string& ph = R"("ph": "X", )") {
  std::string s = "{\"traceEvents\": [";
  for (int i = 0; i < n; ++i)
    s += fmt::format(R"({{{}"cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": {}, "dur": 1, "args": {{"stream": 7}}}}, )",
                     ph, i);
  return s + last + "]" + after + "}";
}

TEST(KinetoMade, ArraysOfObjectsAfterTraceEventsAndInArgs) {
  // Chrome's format allows more arrays of objects after traceEvents
  // ("samples"; deviceProperties may come last): their "}, {" is not an
  // event boundary.
  const std::string last = R"({"ph": "X", "cat": "kernel", "name": "last", "pid": 0, "tid": 7, "ts": 5000, "dur": 1})";
  const Trace a = parse_kineto(many_then(
      last, R"(, "deviceProperties": [{"id": 0, "name": "A"}, {"id": 1, "name": "B"}], "samples": [{"a": 1}, {"b": 2}])"));
  EXPECT_EQ(a.events.size(), 2001u);
  EXPECT_EQ(a.name(a.events.back()), "last");
  EXPECT_EQ(a.device_properties.size(), 2u);
  EXPECT_EQ(a.phase_counts, (std::map<std::string, std::int64_t>{{"X", 2001}}));
  EXPECT_EQ(a.category_counts, (std::map<std::string, std::int64_t>{{"kernel", 2001}}));
  // bare array form with trailing fields is not JSON
  EXPECT_FALSE(usage_error([&] { parse_kineto(many_then(last).substr(16) + "], [{\"a\": 1}, {\"b\": 2}]"); }).empty());
  // the last event holds an array of objects: the last "}, {" is inside it
  const Trace b = parse_kineto(many_then(
      R"({"ph": "X", "cat": "kernel", "name": "nested", "pid": 0, "tid": 7, "ts": 5000, "dur": 1, "args": {"list": [{"a": 1}, {"b": 2}], "stream": 9}})"));
  ASSERT_EQ(b.events.size(), 2001u);
  EXPECT_EQ(b.name(b.events.back()), "nested");
  EXPECT_EQ(b.events.back().stream, 9);
  EXPECT_EQ(b.phase_counts, (std::map<std::string, std::int64_t>{{"X", 2001}}));
}

TEST(KinetoMade, CountsSurviveTheFallback) {
  // Events without "ph" (and with a longer one) are counted once each, also
  // when the batch that read them is undone: the last "}, {" is inside the
  // last event's args, so the batch ends inside that event, reads every event
  // before it, then fails.
  const std::string last =
      R"({"ph": "X", "cat": "kernel", "name": "a}, {b", "pid": 0, "tid": 7, "ts": 1.5, "dur": 1, "args": {"l": [{"a": 1}, {"b": 2}]}})";
  const Trace t = parse_kineto(many_then(last, "", 2000, ""));
  EXPECT_EQ(t.phase_counts, (std::map<std::string, std::int64_t>{{"", 2000}, {"X", 1}}));
  EXPECT_EQ(t.category_counts, (std::map<std::string, std::int64_t>{{"kernel", 2001}}));
  ASSERT_EQ(t.events.size(), 1u);
  EXPECT_EQ(t.name(t.events[0]), "a}, {b");
  EXPECT_EQ(t.names, std::vector<std::string>{"a}, {b"});
  EXPECT_TRUE(t.fractional_ts);
  const Trace u = parse_kineto(many_then(last, "", 2000, R"("ph": "Xx", )"));
  EXPECT_EQ(u.phase_counts, (std::map<std::string, std::int64_t>{{"Xx", 2000}, {"X", 1}}));
  EXPECT_EQ(u.events.size(), 1u);
}

TEST(KinetoMade, AFalseBoundaryAtTheEndReadsInLinearTime) {
  // 3.5 MB of events in one buffer, the last "}, {" in the last event (in its
  // name, then in its args): one failed batch, then the exact path, not a
  // failed batch before every event (5 s and 5 minutes before the fix).
  for (const std::string last : {R"({"ph": "X", "cat": "kernel", "name": "a}, {b", "pid": 0, "tid": 7, "ts": 1, "dur": 1})",
                                 R"({"ph": "X", "cat": "kernel", "name": "n", "ts": 1, "dur": 1, "args": {"l": [{"a": 1}, {"b": 2}]}})"}) {
    const std::string text = many_then(last, "", 32000);
    const auto t0 = std::chrono::steady_clock::now();
    const Trace t = parse_kineto(text);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(t.events.size(), 32001u);
    EXPECT_LT(s, 1.0 * kSlowBuild) << last;
  }
}

// ---- refusals ----

TEST(KinetoRefusals, MalformedTextNamesTheByte) {
  expect_refused("", 0, "empty");
  expect_refused("  \n", 3, "empty");
  expect_refused("hello", 0, "starts with neither");
  // some other JSON object (a stallbench result, {}): refused, never read as a trace where no rule fired
  expect_refused("{}", 0, "no traceEvents field");
  expect_refused(R"({"schema_version": 1, "kind": "result", "points": []})", 0, "no traceEvents field");
  expect_refused(std::string("\0{}", 3), 0, "starts with neither");
  // truncated: inside an event, inside traceEvents, inside the top level
  const std::string ev = R"({"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2})";
  const std::string whole = "{\"traceEvents\": [" + ev + "]}";
  expect_refused(whole.substr(0, 30), 17, "ends inside a value");
  expect_refused(whole.substr(0, 17 + ev.size()), 17 + ev.size(), "ends inside traceEvents");
  expect_refused(whole.substr(0, whole.size() - 1), whole.size() - 1, "expected ','");
  expect_refused(R"({"traceEvents")", 14, "expected ':'");
  // missing comma between events, and between fields
  const std::string two = "{\"traceEvents\": [" + ev + " " + ev + "]}";
  expect_refused(two, 17 + ev.size() + 1, "expected ',' between events");
  expect_refused(R"({"a": 1 "traceEvents": []})", 8, "expected ','");
  // an event's content
  expect_refused(R"({"traceEvents": [{"ph": "X", "cat": "kernel", "ts": "12", "dur": 1}]})", 17, "\"ts\" is not a number");
  expect_refused(R"({"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 12}]})", 17, "without ts or dur");
  expect_refused(R"({"traceEvents": [{"ph": "X", "cat": "python_function", "dur": 12}]})", 17, "without ts or dur");
  expect_refused(R"({"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "dur": "2"}]})", 17, "\"dur\" is not a number");
  expect_refused(R"({"traceEvents": [{"ph": 1}]})", 17, "\"ph\" is not a string");
  expect_refused(R"({"traceEvents": [{"ph": "X", "cat": ["kernel"]}]})", 17, "\"cat\" is not a string");
  expect_refused(R"({"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "dur": 1,}]})", 17, "field name is not a string");
  expect_refused(R"({"traceEvents": [1, 2]})", 17, "not an object");
  expect_refused(R"({"traceEvents": [{}, ]})", 21, "not an object");
  expect_refused(R"({"traceEvents": {}})", 16, "traceEvents is not an array");
  expect_refused(R"({"traceEvents": [], "distributedInfo": {"rank": 1,}})", 39, "distributedInfo is not JSON");
  expect_refused(R"({1: 2})", 1, "field name must be a string");
  expect_refused(R"({"traceEvents": [], "x": })", 25, "the field x has no value");
  expect_refused(R"({"traceEvents": [], "x": ]})", 25, "the field x has no value");
  expect_refused(R"({"traceEvents": [], "x": tru})", 25, "the value of x is not JSON");
  expect_refused(R"({"traceEvents": [], "baseTimeNanoseconds": 12x})", 43, "is not JSON");
  // text after the end
  expect_refused(R"({"traceEvents": []} x)", 20, "text after the end");
  expect_refused(R"([] [])", 3, "text after the end");
  expect_refused(std::string("{\"traceEvents\": []}\0junk", 24), 19, "text after the end");
  // brackets nested past any trace's
  // (nlohmann copies deviceProperties recursively: 100000 levels overflowed the stack)
  expect_refused("{\"deviceProperties\": " + std::string(100000, '[') + std::string(100000, ']') + "}", 21 + 1024,
                 "brackets nested deeper than 1024");
  expect_refused("[{\"args\": " + std::string(5000, '[') + std::string(5000, ']') + "}]", 10 + 1023, "nested deeper");
}

TEST(KinetoRefusals, FilesFifosAndDirectories) {
  TempDir dir("files");
  // a binary file, neither gzip nor JSON
  write_file(dir / "elf", std::string("\x7f" "ELF\x02\x01\x01\0\0\0", 10));
  std::string msg = usage_error([&] { read_kineto(dir / "elf"); });
  EXPECT_NE(msg.find(dir / "elf"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at byte 0:"), std::string::npos) << msg;
  write_file(dir / "empty.json", "");
  msg = usage_error([&] { read_kineto(dir / "empty.json"); });
  EXPECT_NE(msg.find("at byte 0: empty"), std::string::npos) << msg;
  msg = usage_error([&] { read_kineto(dir / "missing.json"); });
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
  // a directory and a FIFO: refused at once (a FIFO with no writer would block an open or a read)
  msg = usage_error([&] { read_kineto(dir / ""); });
  EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;
  const std::string fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto fut = std::async(std::launch::async, [&] { return usage_error([&] { read_kineto(fifo); }); });
  if (fut.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    ADD_FAILURE() << "read_kineto blocks on a FIFO";
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // unblocks it: a writer that closes at once
    if (w >= 0) ::close(w);
  }
  msg = fut.get();
  EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;
}

TEST(KinetoRefusals, CorruptGzip) {
  SB_NEED_SHARED_DATA(kTraces + "/cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz");
  TempDir dir("gz");
  const std::string gz = read_file(kTraces + "/cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz");
  ASSERT_GT(gz.size(), 100u);
  ASSERT_EQ(gz.substr(0, 2), "\x1f\x8b");
  struct Case {
    std::string name, bytes;
  };
  std::string flipped = gz;
  flipped[gz.size() / 2] = char(flipped[gz.size() / 2] ^ 0x55);
  std::string bad_crc = gz;
  bad_crc[gz.size() - 6] = char(bad_crc[gz.size() - 6] ^ 1);
  for (const Case& c : {Case{"half", gz.substr(0, gz.size() / 2)}, Case{"header only", gz.substr(0, 10)},
                        Case{"no trailer", gz.substr(0, gz.size() - 8)}, Case{"part of the trailer", gz.substr(0, gz.size() - 3)},
                        Case{"a flipped byte", flipped}, Case{"a wrong crc", bad_crc}}) {
    SCOPED_TRACE(c.name);
    write_file(dir / "t.json.gz", c.bytes);
    const std::string msg = usage_error([&] { read_kineto(dir / "t.json.gz"); });
    EXPECT_NE(msg.find(dir / "t.json.gz"), std::string::npos) << msg;
    EXPECT_NE(msg.find("at byte "), std::string::npos) << msg;
  }
  // the intact file reads
  write_file(dir / "t.json.gz", gz);
  EXPECT_EQ(read_kineto(dir / "t.json.gz").events.size(), 15u);
}

}  // namespace
}  // namespace sb::readers
