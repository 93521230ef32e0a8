// The device's element decoding (quant.h) computes bit for bit what the GGUF
// reader's DequantizeRow computes, on random blocks of every type (random
// bytes: every scale, NaN and infinity included) and on blocks the reader's
// quantizer wrote from random floats; FloatToBf16 and HalfToFloat agree with
// the reader's on every half and on random floats.
#include "worker/backends/portable/quant.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/gguf/ggml_types.h"
#include "gtest/gtest.h"

namespace tandem::worker::portable {
namespace {

using gguf::GgmlType;

static_assert(kGgmlF32 == static_cast<uint32_t>(GgmlType::kF32));
static_assert(kGgmlF16 == static_cast<uint32_t>(GgmlType::kF16));
static_assert(kGgmlBF16 == static_cast<uint32_t>(GgmlType::kBF16));
static_assert(kGgmlQ8_0 == static_cast<uint32_t>(GgmlType::kQ8_0));
static_assert(kGgmlQ4_0 == static_cast<uint32_t>(GgmlType::kQ4_0));
static_assert(kGgmlQ4_1 == static_cast<uint32_t>(GgmlType::kQ4_1));

const GgmlType kTypes[] = {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16,
                           GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1};

std::string Name(GgmlType type) { return std::string(gguf::GgmlTypeName(static_cast<uint32_t>(type))); }

// Decodes `n` elements both ways and counts the elements whose bits differ.
void ExpectSameBits(GgmlType type, const std::vector<uint8_t>& raw, int64_t n) {
  std::vector<float> expected(n);
  ASSERT_TRUE(gguf::DequantizeRow(type, raw.data(), expected.data(), n).ok());
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float got = DecodeElement(static_cast<uint32_t>(type), raw.data(), i);
    if (FloatAsBits(got) != FloatAsBits(expected[i])) {
      if (++mismatches <= 5) {
        ADD_FAILURE() << Name(type) << " element " << i << ": " << got << " (0x" << std::hex << FloatAsBits(got)
                      << ") vs the reader's " << expected[i] << " (0x" << FloatAsBits(expected[i]) << ")";
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << Name(type);
}

TEST(QuantTest, RandomBytesDecodeAsTheReaderDoes) {
  std::mt19937_64 rng(11);
  constexpr int64_t kElements = 32 * 512;
  for (GgmlType type : kTypes) {
    ASSERT_TRUE(IsDecodableType(static_cast<uint32_t>(type))) << Name(type);
    std::vector<uint8_t> raw(gguf::RowBytes(type, kElements));
    for (uint8_t& b : raw) b = static_cast<uint8_t>(rng());
    ExpectSameBits(type, raw, kElements);
  }
}

TEST(QuantTest, QuantizedRandomFloatsDecodeAsTheReaderDoes) {
  std::mt19937_64 rng(12);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  constexpr int64_t kElements = 32 * 256;
  std::vector<float> values(kElements);
  for (float& v : values) v = normal(rng);
  for (GgmlType type : kTypes) {
    std::vector<uint8_t> raw(gguf::RowBytes(type, kElements));
    ASSERT_TRUE(gguf::QuantizeRow(type, values.data(), raw.data(), kElements).ok());
    ExpectSameBits(type, raw, kElements);
  }
}

TEST(QuantTest, UnknownTypesAreNotDecodable) {
  for (uint32_t type : {4u, 5u, 6u, 7u, 9u, 10u, 14u, 29u, 31u, 1000u}) EXPECT_FALSE(IsDecodableType(type)) << type;
}

TEST(QuantTest, HalfToFloatMatchesTheReaderOnEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = HalfToFloat(static_cast<uint16_t>(h));
    const float expected = gguf::HalfToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(FloatAsBits(got), FloatAsBits(expected)) << "half 0x" << std::hex << h;
  }
}

TEST(QuantTest, Bf16ConversionsMatchTheReader) {
  std::mt19937 rng(13);
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                                0xffffffffu, 0x00000001u, 0x007fffffu, 0x3f808000u, 0x3f818000u, 0x7f7fffffu};
  for (int i = 0; i < 200000; ++i) bits.push_back(rng());
  for (uint32_t b : bits) {
    const float f = BitsAsFloat(b);
    ASSERT_EQ(FloatToBf16(f), gguf::FloatToBf16(f)) << "float bits 0x" << std::hex << b;
  }
  for (uint32_t b = 0; b < 65536; ++b) {
    const float got = Bf16ToFloat(static_cast<uint16_t>(b));
    const float expected = gguf::Bf16ToFloat(static_cast<uint16_t>(b));
    ASSERT_EQ(FloatAsBits(got), FloatAsBits(expected)) << "bf16 0x" << std::hex << b;
  }
}

}  // namespace
}  // namespace tandem::worker::portable
