// The tensor element types a GGUF file may hold (ggml's numbering), their
// block layout, and conversion of rows to and from float32.
//
// Quantized types store fixed-size blocks of 32 elements:
//   Q8_0: f16 scale d, 32 x int8 q            -> x = d * q
//   Q4_0: f16 scale d, 16 bytes of nibbles    -> x = d * (q - 8)
//   Q4_1: f16 scale d, f16 min m, 16 bytes    -> x = d * q + m
// Nibble order: byte j holds element j in its low nibble and element j + 16
// in its high nibble.
//
// Thread-safe: free functions without state.
#ifndef TANDEM_COMMON_GGUF_GGML_TYPES_H_
#define TANDEM_COMMON_GGUF_GGML_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::gguf {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ8_0 = 8,
  kBF16 = 30,
};

// Name for messages: ggml's name for any type it defines ("Q4_1", "Q5_K"),
// supported or not; "unknown" for a number ggml does not define.
std::string_view GgmlTypeName(uint32_t type);
// Whether tandem can read tensors of this numeric type.
bool IsSupportedType(uint32_t type);
// Elements per block (1 for F32/F16/BF16, 32 for the quantized types).
int64_t BlockElements(GgmlType type);
// Bytes per block.
int64_t BlockBytes(GgmlType type);
// Bytes of a row of `n` elements. REQUIRES: n is a multiple of BlockElements.
int64_t RowBytes(GgmlType type, int64_t n);

// Converts `n` elements starting at `src` to float32. `src` and `dst` must
// not overlap. Returns InvalidArgument if n is not a whole number of blocks.
absl::Status DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n);
// Converts `n` floats to `type`, writing RowBytes(type, n) bytes at `dst`.
absl::Status QuantizeRow(GgmlType type, const float* src, void* dst, int64_t n);

// IEEE half and bfloat16 conversions (round to nearest even).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float Bf16ToFloat(uint16_t b);
uint16_t FloatToBf16(float f);

}  // namespace tandem::gguf

#endif  // TANDEM_COMMON_GGUF_GGML_TYPES_H_
