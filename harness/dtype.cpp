#include "harness/dtype.hpp"

#include <bit>     // std::bit_cast
#include <cmath>   // std::isnan, std::fabs, std::ldexp, std::frexp
#include <cstring> // std::memcpy

namespace sb {

std::optional<DType> parse_dtype(std::string_view s) {
  if (auto t = kDTypeNames.parse(s)) return t;
  if (s == "fp8" || s == "e4m3") return DType::fp8_e4m3;
  return std::nullopt;
}

const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> v{DType::fp32, DType::tf32, DType::bf16, DType::fp16,
                                    DType::fp8_e4m3};
  return v;
}

DType gpu_gemm_c_dtype(DType t) {
  switch (t) {
    case DType::fp32:
    case DType::tf32: return DType::fp32;
    case DType::fp16: return DType::fp16;
    case DType::bf16:
    case DType::fp8_e4m3: return DType::bf16;
  }
  return DType::fp32;
}

int storage_bytes(DType t) {
  switch (t) {
    case DType::fp32:
    case DType::tf32: return 4;
    case DType::bf16:
    case DType::fp16: return 2;
    case DType::fp8_e4m3: return 1;
  }
  return 4;
}

double unit_roundoff(DType t) {
  switch (t) {
    case DType::fp32: return std::ldexp(1.0, -24);
    case DType::tf32: return std::ldexp(1.0, -11);
    case DType::bf16: return std::ldexp(1.0, -8);
    case DType::fp16: return std::ldexp(1.0, -11);
    case DType::fp8_e4m3: return std::ldexp(1.0, -4);
  }
  return 0;
}

namespace {
// Round the fp32 bit pattern to keep `keep` mantissa bits, nearest-even.
float round_mantissa(float x, int keep) {
  if (std::isnan(x) || std::isinf(x)) return x;
  std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const int drop = 23 - keep;
  const std::uint32_t half = 1u << (drop - 1);
  const std::uint32_t lsb = (u >> drop) & 1u;
  u += half - 1 + lsb;
  u &= ~((1u << drop) - 1);
  return std::bit_cast<float>(u);
}
}  // namespace

std::uint16_t float_to_bf16_bits(float x) {
  if (std::isnan(x)) return 0x7fc0;
  return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(round_mantissa(x, 7)) >> 16);
}
float bf16_bits_to_float(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

std::uint16_t float_to_fp16_bits(float x) {
  const _Float16 h = static_cast<_Float16>(x);  // GCC >= 12 on x86-64: IEEE binary16, RNE
  std::uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
float fp16_bits_to_float(std::uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}

// OCP fp8 e4m3 (the "fn" variant): bias 7, 3 mantissa bits, no infinities,
// max normal 448, min normal 2^-6, subnormals down to 2^-9. Saturates.
std::uint8_t float_to_e4m3_bits(float x) {
  if (std::isnan(x)) return 0x7f;
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0;
  double a = std::fabs(double(x));
  if (a >= 448.0) return sign | 0x7e;
  if (a < std::ldexp(1.0, -10)) return sign;  // below half the smallest subnormal
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  int exp = e - 1;    // a in [2^exp, 2^(exp+1))
  if (exp < -6) exp = -6;  // subnormal range shares the 2^-6 scale
  const double step = std::ldexp(1.0, exp - 3);
  double q = std::nearbyint(a / step);  // round to nearest even (default FE mode)
  double v = q * step;
  if (v >= 448.0) return sign | 0x7e;
  // Re-encode v.
  if (v < std::ldexp(1.0, -6)) {
    const int m = int(std::nearbyint(v / std::ldexp(1.0, -9)));
    return sign | static_cast<std::uint8_t>(m);
  }
  std::frexp(v, &e);
  exp = e - 1;
  const int m = int(std::nearbyint((v / std::ldexp(1.0, exp) - 1.0) * 8.0));
  return sign | static_cast<std::uint8_t>(((exp + 7) << 3) | m);
}
float e4m3_bits_to_float(std::uint8_t b) {
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int exp = (b >> 3) & 0xf;
  const int man = b & 0x7;
  if (exp == 0xf && man == 0x7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(float(man), -9);
  return sign * std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
}

float round_to(DType t, float x) {
  switch (t) {
    case DType::fp32: return x;
    case DType::tf32: return round_mantissa(x, 10);
    case DType::bf16: return bf16_bits_to_float(float_to_bf16_bits(x));
    case DType::fp16: return fp16_bits_to_float(float_to_fp16_bits(x));
    case DType::fp8_e4m3: return e4m3_bits_to_float(float_to_e4m3_bits(x));
  }
  return x;
}

}  // namespace sb
