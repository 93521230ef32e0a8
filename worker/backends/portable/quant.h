// Decoding of GGUF tensor elements, on the host and on the device: the CUDA
// backend uploads a tensor's raw blocks and a kernel turns each element into
// float32 (and then bf16) with these functions. They compute bit for bit what
// the GGUF reader's DequantizeRow computes (common/gguf/ggml_types.h, which
// documents the block layouts); quant_test.cc checks that on random blocks of
// every type, and FloatToBf16 against gguf::FloatToBf16.
//
// A tensor is a sequence of rows of whole blocks, so element i of the
// flattened tensor is element i % 32 of block i / 32 for the quantized types.
//
// Thread-safe: pure functions. Reads bytes one at a time, so no alignment is
// assumed (Q8_0 blocks are 34 bytes, Q4_0 18).
#ifndef TANDEM_WORKER_BACKENDS_PORTABLE_QUANT_H_
#define TANDEM_WORKER_BACKENDS_PORTABLE_QUANT_H_

#include <cstdint>

#include "worker/backends/portable/float_bits.h"
#include "worker/backends/portable/portable.h"

namespace tandem::worker::portable {

// ggml's type numbers (gguf::GgmlType; quant_test checks they agree). This
// header cannot include the GGUF reader's (absl, not device code).
inline constexpr uint32_t kGgmlF32 = 0;
inline constexpr uint32_t kGgmlF16 = 1;
inline constexpr uint32_t kGgmlQ4_0 = 2;
inline constexpr uint32_t kGgmlQ4_1 = 3;
inline constexpr uint32_t kGgmlQ8_0 = 8;
inline constexpr uint32_t kGgmlBF16 = 30;

inline constexpr int32_t kQuantBlockElements = 32;
inline constexpr int32_t kQ8_0BlockBytes = 2 + kQuantBlockElements;      // f16 d, 32 x int8
inline constexpr int32_t kQ4_0BlockBytes = 2 + kQuantBlockElements / 2;  // f16 d, 16 bytes of nibbles
inline constexpr int32_t kQ4_1BlockBytes = 4 + kQuantBlockElements / 2;  // f16 d, f16 m, nibbles

// Little-endian 16 bits at any address.
TANDEM_HD uint16_t LoadLe16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (static_cast<uint16_t>(p[1]) << 8));
}

// IEEE half to float: the GGUF reader's branch-free algorithm (Maratyszcza's),
// whose float operations are exact, so host and device agree on every
// non-NaN input (a NaN stays a NaN; its payload may differ on the device).
TANDEM_HD float HalfToFloat(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = MulRn(BitsAsFloat((two_w >> 4) + (0xE0u << 23)), 0x1.0p-112f);
  const float denormalized = SubRn(BitsAsFloat((two_w >> 17) | (126u << 23)), 0.5f);
  const uint32_t bits = two_w < (1u << 27) ? FloatAsBits(denormalized) : FloatAsBits(normalized);
  return BitsAsFloat(sign | bits);
}

TANDEM_HD float Bf16ToFloat(uint16_t b) { return BitsAsFloat(static_cast<uint32_t>(b) << 16); }

// Float to bf16 bits, round to nearest even; a NaN stays a quiet NaN.
TANDEM_HD uint16_t FloatToBf16(float f) {
  const uint32_t bits = FloatAsBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// Element j (0..31) of one block. x = d * q.
TANDEM_HD float DecodeQ8_0(const uint8_t* block, int32_t j) {
  const float d = HalfToFloat(LoadLe16(block));
  const int8_t q = static_cast<int8_t>(block[2 + j]);
  return MulRn(d, static_cast<float>(q));
}

// x = d * (q - 8); byte j holds element j (low nibble) and j + 16 (high).
TANDEM_HD float DecodeQ4_0(const uint8_t* block, int32_t j) {
  const float d = HalfToFloat(LoadLe16(block));
  const uint8_t byte = block[2 + (j & 15)];
  const int32_t q = j < 16 ? (byte & 0x0f) : (byte >> 4);
  return MulRn(d, static_cast<float>(q - 8));
}

// x = d * q + m, two roundings as on the host.
TANDEM_HD float DecodeQ4_1(const uint8_t* block, int32_t j) {
  const float d = HalfToFloat(LoadLe16(block));
  const float m = HalfToFloat(LoadLe16(block + 2));
  const uint8_t byte = block[4 + (j & 15)];
  const int32_t q = j < 16 ? (byte & 0x0f) : (byte >> 4);
  return AddRn(MulRn(d, static_cast<float>(q)), m);
}

// Whether DecodeElement knows `type`.
TANDEM_HD bool IsDecodableType(uint32_t type) {
  return type == kGgmlF32 || type == kGgmlF16 || type == kGgmlBF16 || type == kGgmlQ8_0 || type == kGgmlQ4_0 ||
         type == kGgmlQ4_1;
}

// Element i of a tensor of ggml `type` whose bytes start at `data`.
// REQUIRES: IsDecodableType(type); for the quantized types the tensor's rows
// are whole blocks. Returns 0 for an unknown type (the launcher refuses those
// first).
TANDEM_HD float DecodeElement(uint32_t type, const uint8_t* data, int64_t i) {
  const int64_t block = i / kQuantBlockElements;
  const int32_t j = static_cast<int32_t>(i % kQuantBlockElements);
  switch (type) {
    case kGgmlF32: return BitsAsFloat(static_cast<uint32_t>(LoadLe16(data + 4 * i)) |
                                      (static_cast<uint32_t>(LoadLe16(data + 4 * i + 2)) << 16));
    case kGgmlF16: return HalfToFloat(LoadLe16(data + 2 * i));
    case kGgmlBF16: return Bf16ToFloat(LoadLe16(data + 2 * i));
    case kGgmlQ8_0: return DecodeQ8_0(data + block * kQ8_0BlockBytes, j);
    case kGgmlQ4_0: return DecodeQ4_0(data + block * kQ4_0BlockBytes, j);
    case kGgmlQ4_1: return DecodeQ4_1(data + block * kQ4_1BlockBytes, j);
    default: return 0.0f;
  }
}

}  // namespace tandem::worker::portable

#endif  // TANDEM_WORKER_BACKENDS_PORTABLE_QUANT_H_
