#include <cmath>

#include <gtest/gtest.h>

#include "harness/dtype.hpp"

namespace sb {
namespace {

TEST(DType, NamesRoundTripAndAliases) {
  for (DType t : all_dtypes()) EXPECT_EQ(parse_dtype(to_string(t)), t);
  EXPECT_EQ(parse_dtype("fp8"), DType::fp8_e4m3);
  EXPECT_FALSE(parse_dtype("fp64").has_value());
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(round_to(DType::bf16, 1.0f + std::ldexp(1.0f, -8)), 1.0f);
  // 1 + 3*2^-8 is halfway between 1+2^-7 and 1+2^-6: ties to even (1+2^-6).
  EXPECT_EQ(round_to(DType::bf16, 1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(bf16_bits_to_float(0xc040), -3.0f);
}

TEST(DType, Fp16AndTf32) {
  EXPECT_EQ(round_to(DType::fp16, 65504.0f), 65504.0f);
  EXPECT_EQ(fp16_bits_to_float(float_to_fp16_bits(0.5f)), 0.5f);
  EXPECT_EQ(round_to(DType::tf32, 1.0f + std::ldexp(1.0f, -12)), 1.0f);
  EXPECT_EQ(round_to(DType::tf32, 1.0f + std::ldexp(1.0f, -10)), 1.0f + std::ldexp(1.0f, -10));
}

TEST(DType, E4m3Encoding) {
  EXPECT_EQ(float_to_e4m3_bits(1.0f), 0x38);
  EXPECT_EQ(float_to_e4m3_bits(448.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3_bits(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(float_to_e4m3_bits(-2.0f), 0xc0);
  EXPECT_EQ(e4m3_bits_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_TRUE(std::isnan(e4m3_bits_to_float(0x7f)));
  // Every finite code decodes and re-encodes to itself.
  for (int b = 0; b < 256; ++b) {
    const float v = e4m3_bits_to_float(std::uint8_t(b));
    if (std::isnan(v) || (b & 0x7f) == 0) continue;
    EXPECT_EQ(float_to_e4m3_bits(v), b) << b;
  }
  EXPECT_EQ(round_to(DType::fp8_e4m3, 1.0625f), 1.0f);   // halfway: ties to even
  EXPECT_EQ(round_to(DType::fp8_e4m3, 1.1875f), 1.25f);  // halfway: ties to even
}

TEST(DType, GpuGemmOutputType) {
  EXPECT_EQ(gpu_gemm_c_dtype(DType::fp32), DType::fp32);
  EXPECT_EQ(gpu_gemm_c_dtype(DType::tf32), DType::fp32);
  EXPECT_EQ(gpu_gemm_c_dtype(DType::bf16), DType::bf16);
  EXPECT_EQ(gpu_gemm_c_dtype(DType::fp16), DType::fp16);
  EXPECT_EQ(gpu_gemm_c_dtype(DType::fp8_e4m3), DType::bf16);
}

TEST(DType, StorageAndRoundoff) {
  EXPECT_EQ(storage_bytes(DType::tf32), 4);
  EXPECT_EQ(storage_bytes(DType::bf16), 2);
  EXPECT_EQ(storage_bytes(DType::fp8_e4m3), 1);
  EXPECT_DOUBLE_EQ(unit_roundoff(DType::bf16), 1.0 / 256);
}

}  // namespace
}  // namespace sb
