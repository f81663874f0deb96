#include <sched.h>  // sched_getaffinity, CPU_COUNT

#include <gtest/gtest.h>

#include "harness/device.hpp"
#include "harness/errors.hpp"
#include "harness/expected.hpp"
#include "harness/fingerprint.hpp"

namespace sb {
namespace {

TEST(Fingerprint, ParsesModelAndIsaOfInterest) {
  const std::string text =
      "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
      "flags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile avx512_fp16\n"
      "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n";
  const CpuInfo c = parse_cpuinfo(text, 2);
  EXPECT_EQ(c.model, "Intel(R) Xeon(R) Platinum 8480+");
  EXPECT_EQ(c.logical_cores, 2);
  EXPECT_EQ(c.isa, (std::vector<std::string>{"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"}));
  EXPECT_EQ(parse_cpuinfo("", 1).model, "unknown CPU");
  EXPECT_EQ(c.vendor, "");  // no vendor_id line
  EXPECT_EQ(c.family, -1);
}

TEST(Fingerprint, ParsesVendorAndFamily) {
  // the lines of an AMD EPYC (Zen 4) as a 2-vCPU guest shows them, trimmed
  const std::string text =
      "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n"
      "flags\t\t: fpu sse4a avx2 avx512f avx512_bf16 clzero\n";
  const CpuInfo c = parse_cpuinfo(text, 2);
  EXPECT_EQ(c.vendor, "AuthenticAMD");
  EXPECT_EQ(c.family, 25);
  EXPECT_EQ(c.model, "AMD EPYC");
  EXPECT_EQ(c.isa, (std::vector<std::string>{"avx2", "avx512f", "avx512_bf16"}));
  // a family that is not a whole non-negative number is left unknown, not guessed
  for (const char* bad : {"cpu family\t: 6x\n", "cpu family\t: -3\n", "cpu family\t: \n"})
    EXPECT_EQ(parse_cpuinfo(bad, 1).family, -1) << bad;
}

TEST(Fingerprint, ParsesAarch64Cpuinfo) {
  // An aarch64 /proc/cpuinfo (Neoverse V2, as on a Grace CPU) has no "model name".
  const std::string text =
      "processor\t: 0\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd sve2 bf16 i8mm\n"
      "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd4f\n";
  const CpuInfo c = parse_cpuinfo(text, 72);
  EXPECT_EQ(c.model, "Arm CPU implementer 0x41 part 0xd4f");
  EXPECT_EQ(c.logical_cores, 72);
  EXPECT_TRUE(c.isa.empty());  // none of the x86 extensions of interest
}

TEST(Fingerprint, ThisMachineHasAModelAndCores) {
  const CpuInfo c = read_cpu_info();
  // parse_cpuinfo falls back to "unknown CPU": on Linux the model is read.
  EXPECT_NE(c.model, "unknown CPU");
  // The count read is the machine's: at least the CPUs this process may run on.
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  EXPECT_GE(c.logical_cores, CPU_COUNT(&set));
}

TEST(DeviceSpec, ParsesAndRejects) {
  EXPECT_TRUE(parse_device_spec("auto").automatic);
  EXPECT_EQ(parse_device_spec("cpu").kind, DeviceKind::cpu);
  const DeviceSpec d = parse_device_spec("cuda:3");
  EXPECT_EQ(d.kind, DeviceKind::cuda);
  EXPECT_EQ(d.index, 3);
  EXPECT_EQ(d.str(), "cuda:3");
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", "", "sim:", "sim:H 100"}) {
    try {
      parse_device_spec(bad);
      ADD_FAILURE() << bad;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("valid: auto, cpu, cuda:N"), std::string::npos) << e.what();
    }
  }
}

TEST(Expected, FilesInTheSourceTreeLoadAndMatch) {
  const auto files = load_expected_files();
  ASSERT_GE(files.size(), 3u) << "results/expected not found; searched the data dirs";
  DeviceInfo h200;
  h200.kind = DeviceKind::cuda;
  h200.name = "NVIDIA H200";
  const auto m = match_expected(h200, CpuInfo{.logical_cores = 16});
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->id(), "h200-sxm");
  const auto peak = m->peak_tflops(DType::bf16);
  ASSERT_TRUE(peak.has_value());
  EXPECT_DOUBLE_EQ(peak->first, 989.4);
  DeviceInfo other;
  other.kind = DeviceKind::cuda;
  other.name = "NVIDIA GeForce GTX 1080";
  EXPECT_FALSE(match_expected(other, CpuInfo{.logical_cores = 16}).has_value());
  // Every figure of every file names its source and kind.
  for (const auto& f : files)
    for (const auto& fig : f.doc.value("figures", nlohmann::ordered_json::array())) {
      EXPECT_FALSE(fig.value("source", "").empty()) << f.path;
      const std::string kind = fig.value("kind", "");
      EXPECT_TRUE(kind == "datasheet" || kind == "published" || kind == "measured") << f.path << " " << kind;
    }
}

}  // namespace
}  // namespace sb
