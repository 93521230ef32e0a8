#include "common/gguf/ggml_types.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/gguf/gguf_test_util.h"
#include "gtest/gtest.h"

namespace tandem::gguf {
namespace {

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The textbook definition, for checking the bit-twiddling one.
float SlowHalfToFloat(uint16_t h) {
  const int sign = h >> 15;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else {
    v = std::ldexp(static_cast<float>(mant + 1024), exp - 25);
  }
  return sign ? -v : v;
}

TEST(HalfTest, MatchesDefinitionForEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float fast = HalfToFloat(static_cast<uint16_t>(h));
    const float slow = SlowHalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(slow)) {
      EXPECT_TRUE(std::isnan(fast)) << h;
    } else {
      EXPECT_EQ(fast, slow) << h;
      EXPECT_EQ(std::signbit(fast), std::signbit(slow)) << h;
    }
  }
}

TEST(HalfTest, RoundTripsEveryNonNanValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) continue;  // NaN payloads need not survive
    EXPECT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(HalfTest, KnownValues) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
  EXPECT_EQ(HalfToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0xfc01)));
}

TEST(HalfTest, RoundsToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  // 1 + 2^-11 is halfway between 1 and the next half: ties go to even (1).
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 0x3c01 and 0x3c02: even is 0x3c02.
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // Just above halfway rounds up.
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // halfway: even is "65536" = inf
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e6f), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  const uint16_t nan = FloatToHalf(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
}

TEST(HalfTest, Subnormals) {
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);   // halfway to 0x0001: even is 0
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);   // halfway 1..2: even is 2
  EXPECT_EQ(FloatToHalf(std::ldexp(1.25f, -25)), 0x0001);  // above halfway
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -30)), 0x0000);   // underflows to zero
  EXPECT_EQ(FloatToHalf(-std::ldexp(1.0f, -30)), 0x8000);  // ... keeping the sign
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.0f, -24)), 0x03ff);
  EXPECT_EQ(FloatToHalf(std::ldexp(2047.0f, -25)), 0x0400);  // rounds up into the normals
  EXPECT_EQ(FloatToHalf(FromBits(0x00000001)), 0x0000);      // float subnormal
}

TEST(Bf16Test, ConversionsAndRounding) {
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(0xc040), -3.0f);
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808000)), 0x3f80);  // tie, even stays
  EXPECT_EQ(FloatToBf16(FromBits(0x3f818000)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808001)), 0x3f81);  // above the tie
  EXPECT_EQ(FloatToBf16(FromBits(0x3f807fff)), 0x3f80);  // below the tie
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf
  const uint16_t nan = FloatToBf16(FromBits(0x7f800001));             // a NaN whose payload is all in the low bits
  EXPECT_TRUE(std::isnan(Bf16ToFloat(nan)));
  EXPECT_EQ(FloatToBf16(FromBits(0x00010000)), 0x0001);  // subnormal survives exactly
  EXPECT_EQ(Bf16ToFloat(0x0001), FromBits(0x00010000));
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
}

TEST(Bf16Test, RoundTripsEveryNonNanValue) {
  for (uint32_t b = 0; b < 65536; ++b) {
    if ((b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0) continue;
    EXPECT_EQ(FloatToBf16(Bf16ToFloat(static_cast<uint16_t>(b))), b) << b;
  }
}

TEST(GgmlTypesTest, NamesSizesAndSupport) {
  EXPECT_EQ(GgmlTypeName(3), "Q4_1");
  EXPECT_EQ(GgmlTypeName(13), "Q5_K");
  EXPECT_EQ(GgmlTypeName(30), "BF16");
  EXPECT_EQ(GgmlTypeName(999), "unknown");
  for (uint32_t t : {0u, 1u, 2u, 3u, 8u, 30u}) EXPECT_TRUE(IsSupportedType(t)) << t;
  for (uint32_t t : {4u, 6u, 7u, 9u, 12u, 13u, 14u, 28u, 31u, 999u}) EXPECT_FALSE(IsSupportedType(t)) << t;
  EXPECT_EQ(RowBytes(GgmlType::kF32, 64), 256);
  EXPECT_EQ(RowBytes(GgmlType::kF16, 64), 128);
  EXPECT_EQ(RowBytes(GgmlType::kBF16, 64), 128);
  EXPECT_EQ(RowBytes(GgmlType::kQ8_0, 64), 68);
  EXPECT_EQ(RowBytes(GgmlType::kQ4_0, 64), 36);
  EXPECT_EQ(RowBytes(GgmlType::kQ4_1, 64), 40);
  EXPECT_EQ(BlockElements(GgmlType::kQ4_1), 32);
}

TEST(GgmlTypesTest, PartialBlocksAreRefused) {
  std::vector<float> x(33, 0.0f);
  std::vector<uint8_t> bytes(64);
  absl::Status s = QuantizeRow(GgmlType::kQ8_0, x.data(), bytes.data(), 33);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("33 elements"), std::string::npos) << s;
  EXPECT_FALSE(DequantizeRow(GgmlType::kQ4_0, bytes.data(), x.data(), 16).ok());
  EXPECT_FALSE(DequantizeRow(static_cast<GgmlType>(13), bytes.data(), x.data(), 32).ok());
}

// Expected block bytes from hand-computed codes.
std::string HalfBytes(uint16_t h) { return std::string(reinterpret_cast<const char*>(&h), 2); }
std::string Nibbles(const std::vector<int>& q) {
  std::string out;
  for (int j = 0; j < 16; ++j) out.push_back(static_cast<char>(q[j] | (q[j + 16] << 4)));
  return out;
}

void ExpectQuantizes(GgmlType type, const std::vector<float>& x, const std::string& expected_bytes,
                     const std::vector<float>& expected_values) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::string bytes(static_cast<size_t>(RowBytes(type, n)), '\xff');
  ASSERT_TRUE(QuantizeRow(type, x.data(), bytes.data(), n).ok());
  EXPECT_EQ(bytes, expected_bytes);
  std::vector<float> y(x.size());
  ASSERT_TRUE(DequantizeRow(type, bytes.data(), y.data(), n).ok());
  EXPECT_EQ(y, expected_values);
}

TEST(QuantTest, Q8_0KnownBlocks) {
  // Block 1: amax 127 gives d = 1, codes = values.
  std::vector<float> x(96, 0.0f);
  x[0] = 127;
  x[1] = -127;
  for (int j = 2; j < 32; ++j) x[j] = static_cast<float>(j - 16);
  // Block 2: amax 254 gives d = 2; halves round away from zero (roundf).
  const float b2[] = {254, 3, -3, 1, -1, 0.9f};
  for (int j = 0; j < 6; ++j) x[32 + j] = b2[j];
  // Block 3: all zero gives d = 0.
  std::string expected = HalfBytes(0x3c00);
  for (int j = 0; j < 32; ++j) expected.push_back(static_cast<char>(static_cast<int8_t>(x[j])));
  expected += HalfBytes(0x4000);
  const int8_t q2[] = {127, 2, -2, 1, -1, 0};
  for (int j = 0; j < 32; ++j) expected.push_back(static_cast<char>(j < 6 ? q2[j] : 0));
  expected += std::string(34, '\0');
  std::vector<float> y = x;
  const float y2[] = {254, 4, -4, 2, -2, 0};
  for (int j = 0; j < 6; ++j) y[32 + j] = y2[j];
  ExpectQuantizes(GgmlType::kQ8_0, x, expected, y);
}

TEST(QuantTest, Q4_0KnownBlocks) {
  std::vector<float> x(64, 0.0f);
  // Block 1: the largest magnitude is -8, so d = -8 / -8 = 1; q = trunc(x + 8.5).
  x[0] = -8;
  for (int j = 1; j < 16; ++j) x[j] = static_cast<float>(j - 8);
  const float tail[] = {0.4f, 0.5f, -0.5f, -0.6f, 7.4f};
  for (int j = 0; j < 5; ++j) x[16 + j] = tail[j];
  std::vector<int> q1(32, 8);
  q1[0] = 0;
  for (int j = 1; j < 16; ++j) q1[j] = j;
  const int qtail[] = {8, 9, 8, 7, 15};
  for (int j = 0; j < 5; ++j) q1[16 + j] = qtail[j];
  // Block 2: the largest magnitude is +16, so d = -2; -15.5 clips to code 15.
  x[32 + 0] = -14;
  x[32 + 1] = -15.5f;
  x[32 + 2] = 3;
  x[32 + 5] = 16;
  std::vector<int> q2(32, 8);
  q2[0] = 15;
  q2[1] = 15;
  q2[2] = 7;
  q2[5] = 0;
  const std::string expected = HalfBytes(0x3c00) + Nibbles(q1) + HalfBytes(0xc000) + Nibbles(q2);
  std::vector<float> y(64);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q1[j] - 8);
  for (int j = 0; j < 32; ++j) y[32 + j] = -2.0f * static_cast<float>(q2[j] - 8);
  ExpectQuantizes(GgmlType::kQ4_0, x, expected, y);
}

TEST(QuantTest, Q4_1KnownBlocks) {
  // Block 1: min -1, max 14, so d = 1 and m = -1; q = trunc(x - m + 0.5).
  std::vector<float> x(64, -1.0f);
  x[1] = 14;
  x[2] = 0.49f;
  x[3] = 0.5f;
  x[4] = 6;
  std::vector<int> q1(32, 0);
  q1[1] = 15;
  q1[2] = 1;
  q1[3] = 2;
  q1[4] = 7;
  // Block 2: constant 3, so d = 0 and m = 3 reproduce it exactly.
  for (int j = 32; j < 64; ++j) x[j] = 3.0f;
  const std::string expected = HalfBytes(0x3c00) + HalfBytes(0xbc00) + Nibbles(q1) + HalfBytes(0x0000) +
                               HalfBytes(0x4200) + Nibbles(std::vector<int>(32, 0));
  std::vector<float> y(64, 3.0f);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q1[j]) - 1.0f;
  ExpectQuantizes(GgmlType::kQ4_1, x, expected, y);
}

TEST(QuantTest, RandomRowsStayWithinTheQuantizationError) {
  const int64_t n = 32 * 64;
  const std::vector<float> x = testing::RandomValues(n, 7, 3.0f);
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    std::string bytes(static_cast<size_t>(RowBytes(type, n)), '\0');
    std::vector<float> y(n);
    ASSERT_TRUE(QuantizeRow(type, x.data(), bytes.data(), n).ok());
    ASSERT_TRUE(DequantizeRow(type, bytes.data(), y.data(), n).ok());
    for (int64_t b = 0; b < n / 32; ++b) {
      float lo = x[b * 32], hi = x[b * 32], amax = 0;
      for (int j = 0; j < 32; ++j) {
        lo = std::min(lo, x[b * 32 + j]);
        hi = std::max(hi, x[b * 32 + j]);
        amax = std::max(amax, std::fabs(x[b * 32 + j]));
      }
      // Half a step, plus the half-precision rounding of the scale (and a
      // whole step for Q4_0, whose positive side has one code less).
      const float bound = type == GgmlType::kQ8_0   ? amax / 127 * 0.5f + amax * 1e-3f
                          : type == GgmlType::kQ4_0 ? amax / 8 + amax * 1e-2f
                                                    : (hi - lo) / 15 * 0.5f + (hi - lo) * 1e-2f;
      for (int j = 0; j < 32; ++j) {
        ASSERT_LE(std::fabs(y[b * 32 + j] - x[b * 32 + j]), bound)
            << GgmlTypeName(static_cast<uint32_t>(type)) << " block " << b << " element " << j;
      }
    }
  }
}

TEST(QuantTest, FloatTypesAreExactWhereRepresentable) {
  const std::vector<float> x = {1.0f, -2.5f, 0.0f, 65504.0f, std::ldexp(1.0f, -24), -0.125f, 3.0f, 1024.0f};
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    std::string bytes(static_cast<size_t>(RowBytes(type, 8)), '\0');
    std::vector<float> y(8);
    ASSERT_TRUE(QuantizeRow(type, x.data(), bytes.data(), 8).ok());
    ASSERT_TRUE(DequantizeRow(type, bytes.data(), y.data(), 8).ok());
    for (int j = 0; j < 8; ++j) {
      if (type == GgmlType::kBF16 && j == 3) continue;  // 65504 needs 11 mantissa bits; bf16 has 8
      EXPECT_EQ(y[j], x[j]) << GgmlTypeName(static_cast<uint32_t>(type)) << " " << j;
    }
  }
}

TEST(QuantTest, NanInputsDoNotCrash) {
  std::vector<float> x(32, std::numeric_limits<float>::quiet_NaN());
  x[3] = 1.0f;
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    std::string bytes(static_cast<size_t>(RowBytes(type, 32)), '\0');
    EXPECT_TRUE(QuantizeRow(type, x.data(), bytes.data(), 32).ok());
  }
}

}  // namespace
}  // namespace tandem::gguf
