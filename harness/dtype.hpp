// Element types a device computes in, and the host-side rounding that the
// correctness references use. One enum so fp32 and bf16 run in one binary.
#pragma once

#include <cstdint>      // uint32_t
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector
#include "harness/names.hpp"  // NameTable: to_string, parse and choices from one table

namespace sb {

// tf32 is an fp32 GEMM whose tensor-core inputs are rounded to a 10-bit
// mantissa (cuBLAS CUBLAS_COMPUTE_32F_FAST_TF32); storage stays fp32.
enum class DType { fp32, tf32, bf16, fp16, fp8_e4m3 };

inline constexpr NameTable<DType, 5> kDTypeNames{{{{DType::fp32, "fp32"}, {DType::tf32, "tf32"}, {DType::bf16, "bf16"}, {DType::fp16, "fp16"}, {DType::fp8_e4m3, "fp8_e4m3"}}}};
inline std::string_view to_string(DType v) { return kDTypeNames.name(v); }
std::optional<DType> parse_dtype(std::string_view);  // the table, and "fp8"/"e4m3" for fp8_e4m3
const std::vector<DType>& all_dtypes();

// The element type a GPU GEMM of this dtype writes C in (cuBLAS and
// torch.matmul's convention): fp32 for fp32/tf32, the input type for bf16 and
// fp16, bf16 for fp8 (fp8 outputs need scaling recipes).
DType gpu_gemm_c_dtype(DType);

// Bytes of one stored element (tf32 is stored as fp32).
int storage_bytes(DType);

// Unit roundoff of the stored format (2^-(mantissa bits + 1)).
double unit_roundoff(DType);

// Round an fp32 value to the nearest value of the dtype (round to nearest even,
// saturating for fp8 e4m3 at +-448), returned as a float.
float round_to(DType, float);

// Raw conversions used when a device stores host data.
std::uint16_t float_to_bf16_bits(float);
float bf16_bits_to_float(std::uint16_t);
std::uint16_t float_to_fp16_bits(float);
float fp16_bits_to_float(std::uint16_t);
std::uint8_t float_to_e4m3_bits(float);
float e4m3_bits_to_float(std::uint8_t);

}  // namespace sb
