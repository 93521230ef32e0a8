// Every kind of malformed GGUF image is refused with a Status naming what is
// wrong, never a crash.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::gguf {
namespace {

using testing::ByteBuilder;
using ::testing::HasSubstr;

constexpr uint64_t kMax64 = std::numeric_limits<uint64_t>::max();

struct Malformed {
  std::string name;
  std::string bytes;
  absl::StatusCode code;
  std::vector<std::string> message_parts;
};

// One metadata entry, after the header.
ByteBuilder OneKv() {
  ByteBuilder b;
  b.Header(3, 0, 1);
  return b;
}

// One tensor directory entry (no metadata), after the header.
ByteBuilder OneTensor() {
  ByteBuilder b;
  b.Header(3, 1, 0);
  return b;
}

std::vector<Malformed> HeaderAndMetadataCases() {
  using C = absl::StatusCode;
  return {
      {"empty", "", C::kInvalidArgument, {"not a GGUF file", "0 bytes"}},
      {"bad magic", "GGML\x03\0\0\0", C::kInvalidArgument, {"not a GGUF file", "GGML", "offset 0"}},
      {"version 1", ByteBuilder().Header(1, 0, 0).bytes(), C::kUnimplemented, {"version 1 (32-bit counts)"}},
      {"version 4", ByteBuilder().Header(4, 0, 0).bytes(), C::kUnimplemented, {"GGUF version 4", "offset 4"}},
      {"big-endian", ByteBuilder().Header(0x03000000u, 0, 0).bytes(), C::kUnimplemented, {"big-endian"}},
      {"truncated header",
       ByteBuilder().Bytes("GGUF").U32(3).U32(0).bytes(),
       C::kDataLoss,
       {"tensor count needs 8 bytes at offset 8"}},
      {"huge kv count",
       ByteBuilder().Header(3, 0, uint64_t{1} << 60).bytes(),
       C::kDataLoss,
       {"metadata count 1152921504606846976"}},
      {"huge tensor count", ByteBuilder().Header(3, kMax64, 0).bytes(), C::kDataLoss, {"tensor count"}},
      {"key length past end",
       OneKv().U64(uint64_t{1} << 40).Bytes(std::string(16, 'x')).bytes(),
       C::kDataLoss,
       {"key of metadata entry 0", "string length 1099511627776 at offset 24"}},
      {"empty key", OneKv().Str("").U32(4).U32(1).bytes(), C::kInvalidArgument, {"metadata entry 0", "empty key"}},
      {"unknown value type",
       OneKv().Key("k", 13).U32(0).bytes(),
       C::kInvalidArgument,
       {"'k'", "unknown value type 13", "offset"}},
      {"bool not 0 or 1", OneKv().Key("flag", 7).U8(2).bytes(), C::kInvalidArgument, {"'flag'", "must be 0 or 1"}},
      {"array of arrays",
       OneKv().Key("nested", 9).U32(9).U64(1).U32(4).U64(0).bytes(),
       C::kUnimplemented,
       {"'nested'", "array of arrays"}},
      {"unknown array element type",
       OneKv().Key("arr", 9).U32(42).U64(0).bytes(),
       C::kInvalidArgument,
       {"'arr'", "unknown array element type 42"}},
      {"array count past end",
       OneKv().Key("arr", 9).U32(4).U64(uint64_t{1} << 40).U32(0).bytes(),
       C::kDataLoss,
       {"'arr'", "array count 1099511627776"}},
      {"string array count past end",
       OneKv().Key("toks", 9).U32(8).U64(10).Str("a").bytes(),
       C::kDataLoss,
       {"'toks'", "array count 10"}},
      {"string element past end",
       OneKv().Key("toks", 9).U32(8).U64(2).Str("a").U64(100).bytes(),
       C::kDataLoss,
       {"'toks'", "string length 100"}},
      {"truncated value", OneKv().Key("k", 10).U32(1).bytes(), C::kDataLoss, {"'k' needs 8 bytes"}},
      {"string value past end",
       OneKv().Key("s", 8).U64(100).Bytes("abc").bytes(),
       C::kDataLoss,
       {"'s'", "string length 100"}},
      {"uint64 array element too big",
       OneKv().Key("big", 9).U32(10).U64(1).U64(kMax64).bytes(),
       C::kInvalidArgument,
       {"'big'", "does not fit int64"}},
      {"duplicate key",
       ByteBuilder().Header(3, 0, 2).Key("a", 4).U32(1).Key("a", 4).U32(2).bytes(),
       C::kInvalidArgument,
       {"duplicate metadata key 'a' at offset 41"}},
      {"alignment zero",
       OneKv().Key("general.alignment", 4).U32(0).bytes(),
       C::kInvalidArgument,
       {"general.alignment", "power of two", "got 0"}},
      {"alignment not a power of two",
       OneKv().Key("general.alignment", 4).U32(48).bytes(),
       C::kInvalidArgument,
       {"general.alignment", "got 48"}},
      {"alignment negative",
       OneKv().Key("general.alignment", 5).U32(0xffffffe0u).bytes(),
       C::kInvalidArgument,
       {"general.alignment"}},
      {"alignment a string",
       OneKv().Key("general.alignment", 8).Str("32").bytes(),
       C::kInvalidArgument,
       {"general.alignment has type string"}},
  };
}

std::vector<Malformed> TensorCases() {
  using C = absl::StatusCode;
  return {
      {"truncated tensor info",
       OneTensor().Str("w").U32(4).U64(4).U64(4).U64(4).bytes(),
       C::kDataLoss,
       {"tensor w needs 8 bytes at offset 61"}},
      {"empty tensor name",
       OneTensor().TensorInfo("", {4, 1}, 0, 0).bytes(),
       C::kInvalidArgument,
       {"tensor 0", "empty name"}},
      {"n_dims 5",
       OneTensor().TensorInfo("w", {1, 1, 1, 1, 32}, 0, 0).bytes(),
       C::kInvalidArgument,
       {"tensor w has n_dims 5"}},
      {"n_dims 0",
       OneTensor().TensorInfo("w", {}, 0, 0).Bytes(std::string(16, 'x')).bytes(),
       C::kInvalidArgument,
       {"tensor w has n_dims 0"}},
      {"zero dimension",
       OneTensor().TensorInfo("w", {4, 0}, 0, 0).bytes(),
       C::kInvalidArgument,
       {"tensor w has dimension 1 = 0"}},
      {"negative dimension",
       OneTensor().TensorInfo("w", {kMax64}, 0, 0).bytes(),
       C::kInvalidArgument,
       {"tensor w has dimension 0 = -1"}},
      {"element count overflow",
       OneTensor().TensorInfo("w", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0).bytes(),
       C::kInvalidArgument,
       {"tensor w", "element count overflows"}},
      {"byte size overflow",
       OneTensor().TensorInfo("w", {uint64_t{1} << 62}, 0, 0).bytes(),
       C::kInvalidArgument,
       {"tensor w", "byte size overflows"}},
      {"unsupported type",
       OneTensor().TensorInfo("blk.0.attn_q.weight", {32}, 13, 0).bytes(),
       C::kUnimplemented,
       {"tensor blk.0.attn_q.weight has type Q5_K (13), which tandem does not support"}},
      {"unknown type",
       OneTensor().TensorInfo("w", {32}, 99, 0).bytes(),
       C::kUnimplemented,
       {"tensor w has type unknown (99)"}},
      {"partial block row",
       OneTensor().TensorInfo("w", {48, 2}, 8, 0).bytes(),
       C::kInvalidArgument,
       {"tensor w", "48 elements", "Q8_0 block size 32"}},
      {"misaligned offset",
       OneTensor().TensorInfo("w", {4}, 0, 4).PadTo(32).Bytes(std::string(64, '\0')).bytes(),
       C::kInvalidArgument,
       {"tensor w has data offset 4", "alignment 32"}},
      {"duplicate tensor name",
       ByteBuilder()
           .Header(3, 2, 0)
           .TensorInfo("w", {8}, 0, 0)
           .TensorInfo("w", {8}, 0, 32)
           .PadTo(32)
           .Bytes(std::string(64, '\0'))
           .bytes(),
       C::kInvalidArgument,
       {"duplicate tensor name 'w' at offset 57"}},
      {"tensor past end",
       OneTensor().TensorInfo("w", {8}, 0, 0).PadTo(32).Bytes(std::string(16, '\0')).bytes(),
       C::kDataLoss,
       {"tensor w (32 bytes at data offset 0", "extends past the end of the file (80 bytes)"}},
      {"tensor offset far past end",
       OneTensor().TensorInfo("w", {8}, 0, uint64_t{1} << 40).PadTo(32).Bytes(std::string(32, '\0')).bytes(),
       C::kDataLoss,
       {"tensor w", "data offset 1099511627776", "extends past the end"}},
      {"data section past end",
       OneTensor().TensorInfo("w", {8}, 0, 0).bytes(),
       C::kDataLoss,
       {"data section would start at offset 64", "57 bytes"}},
  };
}

void ExpectRefused(const Malformed& c) {
  auto file = GgufFile::FromBytes(c.bytes);
  ASSERT_FALSE(file.ok()) << c.name << " was accepted";
  EXPECT_EQ(file.status().code(), c.code) << c.name << ": " << file.status();
  for (const std::string& part : c.message_parts) {
    EXPECT_THAT(std::string(file.status().message()), HasSubstr(part)) << c.name;
  }
}

TEST(GgufMalformedTest, HeaderAndMetadata) {
  for (const Malformed& c : HeaderAndMetadataCases()) ExpectRefused(c);
}

TEST(GgufMalformedTest, TensorDirectory) {
  for (const Malformed& c : TensorCases()) ExpectRefused(c);
}

TEST(GgufMalformedTest, EveryTruncationIsRefused) {
  testing::TinyLlama tiny;
  tiny.layers = 1;
  tiny.hidden = 32;
  tiny.heads = 2;
  tiny.kv_heads = 1;
  tiny.intermediate = 32;
  tiny.vocab = 8;
  const std::string image = testing::TinyLlamaImage(tiny);
  auto full = GgufFile::FromBytes(image);
  ASSERT_TRUE(full.ok()) << full.status();
  // The writer pads the data to 32 bytes at the end; cutting only that
  // padding is harmless, cutting anything before it must be refused.
  const GgufTensor& first = (*full)->tensors().front();
  const GgufTensor& last = (*full)->tensors().back();
  const size_t data_bytes = static_cast<size_t>(last.data - first.data) + static_cast<size_t>(last.num_bytes);
  const size_t data_start = image.size() - (data_bytes + 31) / 32 * 32;
  const size_t data_end = data_start + data_bytes;
  for (size_t length = 0; length < data_end; ++length) {
    auto file = GgufFile::FromBytes(image.substr(0, length));
    ASSERT_FALSE(file.ok()) << "a prefix of " << length << " of " << data_end << " bytes was accepted";
  }
  EXPECT_TRUE(GgufFile::FromBytes(image.substr(0, data_end)).ok());
}

}  // namespace
}  // namespace tandem::gguf
