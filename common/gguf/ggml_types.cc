#include "common/gguf/ggml_types.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/check.h"

// GGUF is little-endian and tandem reads it in place; a big-endian host would
// need byte swaps everywhere below.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "tandem's GGUF code assumes a little-endian host");

namespace tandem::gguf {
namespace {

constexpr int64_t kQuantBlock = 32;

// Byte layouts of the quantized blocks (ggml's block_q8_0 / q4_0 / q4_1).
constexpr int64_t kQ8_0Bytes = 2 + kQuantBlock;
constexpr int64_t kQ4_0Bytes = 2 + kQuantBlock / 2;
constexpr int64_t kQ4_1Bytes = 4 + kQuantBlock / 2;

uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

void StoreU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, sizeof(v)); }

// Clamps before converting so that NaN or out-of-range inputs give a defined
// (if meaningless) code instead of undefined behaviour in the float->int cast.
int ClampToInt(float v, float lo, float hi) { return static_cast<int>(std::fmin(std::fmax(v, lo), hi)); }

// __restrict: without it GCC at -O2 will not vectorize these loops (it would
// need run-time alias checks), which halves the model's load time.
void DequantizeQ8_0(const uint8_t* __restrict src, float* __restrict dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += kQ8_0Bytes, dst += kQuantBlock) {
    const float d = HalfToFloat(LoadU16(src));
    const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
    for (int j = 0; j < kQuantBlock; ++j) dst[j] = d * static_cast<float>(q[j]);
  }
}

void DequantizeQ4_0(const uint8_t* __restrict src, float* __restrict dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += kQ4_0Bytes, dst += kQuantBlock) {
    const float d = HalfToFloat(LoadU16(src));
    const uint8_t* q = src + 2;
    for (int j = 0; j < kQuantBlock / 2; ++j) {
      dst[j] = d * static_cast<float>((q[j] & 0x0f) - 8);
      dst[j + kQuantBlock / 2] = d * static_cast<float>((q[j] >> 4) - 8);
    }
  }
}

void DequantizeQ4_1(const uint8_t* __restrict src, float* __restrict dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += kQ4_1Bytes, dst += kQuantBlock) {
    const float d = HalfToFloat(LoadU16(src));
    const float m = HalfToFloat(LoadU16(src + 2));
    const uint8_t* q = src + 4;
    for (int j = 0; j < kQuantBlock / 2; ++j) {
      dst[j] = d * static_cast<float>(q[j] & 0x0f) + m;
      dst[j + kQuantBlock / 2] = d * static_cast<float>(q[j] >> 4) + m;
    }
  }
}

// The quantizers follow ggml's reference ones (quantize_row_*_ref) so that
// tandem writes the same bytes llama.cpp would for the same floats.
void QuantizeQ8_0(const float* src, uint8_t* dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += kQuantBlock, dst += kQ8_0Bytes) {
    float amax = 0.0f;
    for (int j = 0; j < kQuantBlock; ++j) amax = std::max(amax, std::fabs(src[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreU16(dst, FloatToHalf(d));
    int8_t* q = reinterpret_cast<int8_t*>(dst + 2);
    for (int j = 0; j < kQuantBlock; ++j) {
      q[j] = static_cast<int8_t>(ClampToInt(std::round(src[j] * id), -128.0f, 127.0f));
    }
  }
}

void QuantizeQ4_0(const float* src, uint8_t* dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += kQuantBlock, dst += kQ4_0Bytes) {
    // The signed value of largest magnitude maps to -8, the one code that
    // has no positive mirror, which buys a little precision.
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < kQuantBlock; ++j) {
      if (amax < std::fabs(src[j])) {
        amax = std::fabs(src[j]);
        max = src[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreU16(dst, FloatToHalf(d));
    uint8_t* q = dst + 2;
    for (int j = 0; j < kQuantBlock / 2; ++j) {
      const int lo = ClampToInt(src[j] * id + 8.5f, 0.0f, 15.0f);
      const int hi = ClampToInt(src[j + kQuantBlock / 2] * id + 8.5f, 0.0f, 15.0f);
      q[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void QuantizeQ4_1(const float* src, uint8_t* dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += kQuantBlock, dst += kQ4_1Bytes) {
    float min = src[0];
    float max = src[0];
    for (int j = 1; j < kQuantBlock; ++j) {
      min = std::min(min, src[j]);
      max = std::max(max, src[j]);
    }
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    StoreU16(dst, FloatToHalf(d));
    StoreU16(dst + 2, FloatToHalf(min));
    uint8_t* q = dst + 4;
    for (int j = 0; j < kQuantBlock / 2; ++j) {
      const int lo = ClampToInt((src[j] - min) * id + 0.5f, 0.0f, 15.0f);
      const int hi = ClampToInt((src[j + kQuantBlock / 2] - min) * id + 0.5f, 0.0f, 15.0f);
      q[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

absl::Status CheckWholeBlocks(GgmlType type, int64_t n) {
  if (!IsSupportedType(static_cast<uint32_t>(type))) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported ggml type ", static_cast<uint32_t>(type)));
  }
  if (n < 0 || n % BlockElements(type) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(n, " elements is not a whole number of ",
                                                   std::string(GgmlTypeName(static_cast<uint32_t>(type))),
                                                   " blocks of ", BlockElements(type)));
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view GgmlTypeName(uint32_t type) {
  // ggml's numbering; 4 and 5 (Q4_2, Q4_3) were removed long ago.
  static constexpr std::string_view kNames[] = {
      "F32",    "F16",      "Q4_0",     "Q4_1",     "Q4_2",  "Q4_3",  "Q5_0",       "Q5_1",       "Q8_0",       "Q8_1",
      "Q2_K",   "Q3_K",     "Q4_K",     "Q5_K",     "Q6_K",  "Q8_K",  "IQ2_XXS",    "IQ2_XS",     "IQ3_XXS",    "IQ1_S",
      "IQ4_NL", "IQ3_S",    "IQ2_S",    "IQ4_XS",   "I8",    "I16",   "I32",        "I64",        "F64",        "IQ1_M",
      "BF16",   "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4",
  };
  if (type < sizeof(kNames) / sizeof(kNames[0])) return kNames[type];
  return "unknown";
}

bool IsSupportedType(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1: return true;
  }
  return false;
}

int64_t BlockElements(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16: return 1;
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1: return kQuantBlock;
  }
  TANDEM_CHECK(false) << "BlockElements of unsupported ggml type " << static_cast<uint32_t>(type);
  return 0;
}

int64_t BlockBytes(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return 4;
    case GgmlType::kF16:
    case GgmlType::kBF16: return 2;
    case GgmlType::kQ8_0: return kQ8_0Bytes;
    case GgmlType::kQ4_0: return kQ4_0Bytes;
    case GgmlType::kQ4_1: return kQ4_1Bytes;
  }
  TANDEM_CHECK(false) << "BlockBytes of unsupported ggml type " << static_cast<uint32_t>(type);
  return 0;
}

int64_t RowBytes(GgmlType type, int64_t n) {
  TANDEM_DCHECK(n % BlockElements(type) == 0) << n << " elements of " << GgmlTypeName(static_cast<uint32_t>(type));
  return n / BlockElements(type) * BlockBytes(type);
}

absl::Status DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n) {
  if (absl::Status s = CheckWholeBlocks(type, n); !s.ok()) return s;
  const auto* in = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::kF32:
      if (n > 0) std::memcpy(dst, in, static_cast<size_t>(n) * sizeof(float));
      break;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(LoadU16(in + 2 * i));
      break;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(LoadU16(in + 2 * i));
      break;
    case GgmlType::kQ8_0: DequantizeQ8_0(in, dst, n / kQuantBlock); break;
    case GgmlType::kQ4_0: DequantizeQ4_0(in, dst, n / kQuantBlock); break;
    case GgmlType::kQ4_1: DequantizeQ4_1(in, dst, n / kQuantBlock); break;
  }
  return absl::OkStatus();
}

absl::Status QuantizeRow(GgmlType type, const float* src, void* dst, int64_t n) {
  if (absl::Status s = CheckWholeBlocks(type, n); !s.ok()) return s;
  auto* out = static_cast<uint8_t*>(dst);
  switch (type) {
    case GgmlType::kF32:
      if (n > 0) std::memcpy(out, src, static_cast<size_t>(n) * sizeof(float));
      break;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) StoreU16(out + 2 * i, FloatToHalf(src[i]));
      break;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) StoreU16(out + 2 * i, FloatToBf16(src[i]));
      break;
    case GgmlType::kQ8_0: QuantizeQ8_0(src, out, n / kQuantBlock); break;
    case GgmlType::kQ4_0: QuantizeQ4_0(src, out, n / kQuantBlock); break;
    case GgmlType::kQ4_1: QuantizeQ4_1(src, out, n / kQuantBlock); break;
  }
  return absl::OkStatus();
}

// Branch-free conversions after Maratyszcza's FP16 library (also ggml's):
// the float unit does the rounding, subnormals and overflow for us.
float HalfToFloat(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  // Rebias the exponent (15 -> 127) with an add and a multiply; exponent 31
  // lands on 255 before the multiply, so inf and NaN pass through.
  const float normalized = BitsToFloat((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  // Subnormals: place the mantissa under a 0.5 exponent and subtract 0.5.
  const float denormalized = BitsToFloat((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t bits = two_w < (1u << 27) ? FloatBits(denormalized) : FloatBits(normalized);
  return BitsToFloat(sign | bits);
}

uint16_t FloatToHalf(float f) {
  // Scaling up then down rounds the mantissa to 10 bits (nearest even) and
  // turns too-large values into infinity.
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = FloatBits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = BitsToFloat((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = FloatBits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

float Bf16ToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

uint16_t FloatToBf16(float f) {
  const uint32_t bits = FloatBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN: keep it a (quiet) NaN
  }
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace tandem::gguf
