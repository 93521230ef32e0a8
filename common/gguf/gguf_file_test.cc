// Round trips through GgufWriter and hand-built images into GgufFile.
#include "common/gguf/gguf_file.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "common/gguf/gguf_test_util.h"
#include "common/gguf/gguf_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::gguf {
namespace {

using testing::ByteBuilder;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<GgufFile> MustParse(std::string bytes) {
  auto file = GgufFile::FromBytes(std::move(bytes));
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? std::move(file).value() : nullptr;
}

TEST(GgufWriterTest, MetadataRoundTrip) {
  GgufWriter w;
  w.SetUint32("u32", 4000000000u);
  w.SetInt32("i32", -7);
  w.SetFloat32("f32", 0.1f);
  w.SetBool("yes", true);
  w.SetBool("no", false);
  w.SetString("s", "héllo\nworld");
  w.SetString("empty", "");
  w.SetStringArray("sa", {"a", "", "\xc4\xa0x"});
  w.SetStringArray("sa_empty", {});
  w.SetInt32Array("ia", {1, -2, std::numeric_limits<int32_t>::max()});
  w.SetUint32("replaced", 1);
  w.SetUint32("replaced", 2);  // a second Set replaces, never duplicates
  auto file = MustParse(w.Serialize());
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->version(), 3u);
  EXPECT_EQ(file->GetUint32("u32").value(), 4000000000u);
  EXPECT_EQ(file->GetInt64("u32").value(), 4000000000);
  EXPECT_EQ(file->GetInt64("i32").value(), -7);
  EXPECT_EQ(file->GetFloat("f32").value(), 0.1f);
  EXPECT_TRUE(file->GetBool("yes").value());
  EXPECT_FALSE(file->GetBool("no").value());
  EXPECT_EQ(file->GetString("s").value(), "héllo\nworld");
  EXPECT_EQ(file->GetString("empty").value(), "");
  EXPECT_THAT(file->GetStringArray("sa").value(), ElementsAre("a", "", "\xc4\xa0x"));
  EXPECT_TRUE(file->GetStringArray("sa_empty").value().empty());
  EXPECT_THAT(file->GetIntArray("ia").value(), ElementsAre(1, -2, std::numeric_limits<int32_t>::max()));
  EXPECT_EQ(file->GetUint32("replaced").value(), 2u);
  EXPECT_THAT(file->Keys(),
              ElementsAre("empty", "f32", "i32", "ia", "no", "replaced", "s", "sa", "sa_empty", "u32", "yes"));
  EXPECT_EQ(file->Find("i32")->type, GgufValueType::kInt32);
  EXPECT_EQ(file->Find("ia")->array_type, GgufValueType::kInt32);
  EXPECT_TRUE(file->tensors().empty());
}

// Every value type the format has, written by hand since GgufWriter only
// writes the ones tandem's tools need.
std::string AllValueTypesImage() {
  ByteBuilder b;
  b.Header(3, 0, 25);
  b.Key("u8", 0).U8(200).Key("i8", 1).U8(0x80).Key("u16", 2).U16(60000).Key("i16", 3).U16(0xffff);
  b.Key("u32", 4).U32(7).Key("i32", 5).U32(0xfffffff9u).Key("f32", 6).F32(1.5f).Key("bool", 7).U8(1);
  b.Key("str", 8).Str("text").Key("u64", 10).U64(std::numeric_limits<uint64_t>::max());
  b.Key("i64", 11).I64(std::numeric_limits<int64_t>::min()).Key("f64", 12).F64(0.1);
  b.Key("a_u8", 9).U32(0).U64(2).U8(1).U8(255);
  b.Key("a_i8", 9).U32(1).U64(2).U8(1).U8(0xff);
  b.Key("a_u16", 9).U32(2).U64(1).U16(65535);
  b.Key("a_i16", 9).U32(3).U64(1).U16(0x8000);
  b.Key("a_u32", 9).U32(4).U64(1).U32(4294967295u);
  b.Key("a_i32", 9).U32(5).U64(1).U32(0x80000000u);
  b.Key("a_f32", 9).U32(6).U64(2).F32(0.5f).F32(-2.0f);
  b.Key("a_bool", 9).U32(7).U64(3).U8(1).U8(0).U8(1);
  b.Key("a_str", 9).U32(8).U64(2).Str("x").Str("yz");
  b.Key("a_u64", 9).U32(10).U64(1).U64(uint64_t{1} << 62);
  b.Key("a_i64", 9).U32(11).U64(1).I64(-5);
  b.Key("a_f64", 9).U32(12).U64(1).F64(1e300);
  b.Key("a_empty", 9).U32(4).U64(0);
  return b.bytes();
}

TEST(GgufFileTest, EveryValueType) {
  auto file = MustParse(AllValueTypesImage());
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->GetUint32("u8").value(), 200u);
  EXPECT_EQ(file->GetInt64("i8").value(), -128);
  EXPECT_EQ(file->GetUint32("u16").value(), 60000u);
  EXPECT_EQ(file->GetInt64("i16").value(), -1);
  EXPECT_EQ(file->GetUint32("u32").value(), 7u);
  EXPECT_EQ(file->GetInt64("i32").value(), -7);
  EXPECT_EQ(file->GetFloat("f32").value(), 1.5f);
  EXPECT_TRUE(file->GetBool("bool").value());
  EXPECT_EQ(file->GetString("str").value(), "text");
  EXPECT_EQ(std::get<uint64_t>(file->Find("u64")->value), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(file->GetInt64("i64").value(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(std::get<double>(file->Find("f64")->value), 0.1);
  EXPECT_EQ(file->GetFloat("f64").value(), 0.1f);
  EXPECT_EQ(file->GetFloat("u32").value(), 7.0f);  // integers read as the number they are
  EXPECT_THAT(file->GetIntArray("a_u8").value(), ElementsAre(1, 255));
  EXPECT_THAT(file->GetIntArray("a_i8").value(), ElementsAre(1, -1));
  EXPECT_THAT(file->GetIntArray("a_u16").value(), ElementsAre(65535));
  EXPECT_THAT(file->GetIntArray("a_i16").value(), ElementsAre(-32768));
  EXPECT_THAT(file->GetIntArray("a_u32").value(), ElementsAre(4294967295));
  EXPECT_THAT(file->GetIntArray("a_i32").value(), ElementsAre(std::numeric_limits<int32_t>::min()));
  EXPECT_THAT(std::get<std::vector<double>>(file->Find("a_f32")->value), ElementsAre(0.5, -2.0));
  EXPECT_THAT(std::get<std::vector<bool>>(file->Find("a_bool")->value), ElementsAre(true, false, true));
  EXPECT_THAT(file->GetStringArray("a_str").value(), ElementsAre("x", "yz"));
  EXPECT_THAT(file->GetIntArray("a_u64").value(), ElementsAre(int64_t{1} << 62));
  EXPECT_THAT(file->GetIntArray("a_i64").value(), ElementsAre(-5));
  EXPECT_THAT(std::get<std::vector<double>>(file->Find("a_f64")->value), ElementsAre(1e300));
  EXPECT_TRUE(file->GetIntArray("a_empty").value().empty());
  EXPECT_EQ(file->Find("a_u16")->type, GgufValueType::kArray);
  EXPECT_EQ(file->Find("a_u16")->array_type, GgufValueType::kUint16);
  EXPECT_EQ(file->Find("i16")->type, GgufValueType::kInt16);
}

TEST(GgufFileTest, GetterErrorsNameTheKey) {
  auto file = MustParse(AllValueTypesImage());
  ASSERT_NE(file, nullptr);
  auto missing = file->GetUint32("llama.block_count");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("'llama.block_count'"));
  auto wrong = file->GetUint32("str");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("'str' has type string; expected an integer"));
  EXPECT_THAT(file->GetString("a_u8").status().message(), HasSubstr("'a_u8' has type array of uint8"));
  EXPECT_THAT(file->GetUint32("i8").status().message(), HasSubstr("does not fit uint32"));
  EXPECT_THAT(file->GetUint32("u64").status().message(), HasSubstr("does not fit uint32"));
  EXPECT_THAT(file->GetInt64("u64").status().message(), HasSubstr("does not fit int64"));
  EXPECT_FALSE(file->GetBool("u8").ok());
  EXPECT_FALSE(file->GetFloat("str").ok());
  EXPECT_FALSE(file->GetStringArray("a_i32").ok());
  EXPECT_FALSE(file->GetIntArray("a_str").ok());
  EXPECT_FALSE(file->GetIntArray("a_f32").ok());
}

TEST(GgufFileTest, TensorsOfEveryTypeRoundTrip) {
  struct Case {
    const char* name;
    GgmlType type;
    std::vector<int64_t> shape;
  };
  const std::vector<Case> cases = {
      {"f32", GgmlType::kF32, {5, 3}},          {"f16", GgmlType::kF16, {7}},
      {"bf16", GgmlType::kBF16, {3, 2, 2}},     {"q8_0", GgmlType::kQ8_0, {64, 3}},
      {"q4_0", GgmlType::kQ4_0, {32, 2, 1, 2}}, {"q4_1", GgmlType::kQ4_1, {96, 5}},
  };
  GgufWriter w;
  w.SetString("general.architecture", "test");
  std::vector<std::vector<float>> inputs;
  for (size_t i = 0; i < cases.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : cases[i].shape) n *= d;
    inputs.push_back(testing::RandomValues(n, static_cast<uint32_t>(i + 1), 4.0f));
    ASSERT_TRUE(w.AddTensor(cases[i].name, cases[i].shape, cases[i].type, inputs.back()).ok());
  }
  const std::string image = w.Serialize();
  auto file = MustParse(image);
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(file->tensors().size(), cases.size());
  const uint8_t* first = file->tensors()[0].data;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const GgufTensor* t = file->FindTensor(c.name);
    ASSERT_NE(t, nullptr) << c.name;
    EXPECT_EQ(t, &file->tensors()[i]);  // directory order is kept
    EXPECT_EQ(t->shape, c.shape);
    EXPECT_EQ(t->type, c.type);
    const int64_t n = static_cast<int64_t>(inputs[i].size());
    EXPECT_EQ(t->num_elements, n);
    EXPECT_EQ(t->num_bytes, RowBytes(c.type, n));
    EXPECT_EQ((t->data - first) % 32, 0) << c.name;
    // The stored bytes are exactly what QuantizeRow makes of the input...
    std::string expected(static_cast<size_t>(t->num_bytes), '\0');
    ASSERT_TRUE(QuantizeRow(c.type, inputs[i].data(), expected.data(), n).ok());
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(t->data), t->num_bytes), expected) << c.name;
    // ...and read back within the type's precision.
    std::vector<float> y(n);
    ASSERT_TRUE(DequantizeRow(t->type, t->data, y.data(), n).ok());
    const float tolerance = c.type == GgmlType::kF32    ? 0.0f
                            : c.type == GgmlType::kF16  ? 4.0f / 1024
                            : c.type == GgmlType::kBF16 ? 4.0f / 128
                            : c.type == GgmlType::kQ8_0 ? 4.0f / 127
                                                        : 8.0f / 15 + 0.05f;
    for (int64_t j = 0; j < n; ++j) ASSERT_LE(std::fabs(y[j] - inputs[i][j]), tolerance) << c.name << " " << j;
  }
  EXPECT_EQ(file->FindTensor("nope"), nullptr);
}

TEST(GgufWriterTest, AddTensorRefusesBadInput) {
  GgufWriter w;
  const std::vector<float> v(64, 0.0f);
  EXPECT_THAT(w.AddTensor("a", {33}, GgmlType::kQ8_0, absl::MakeSpan(v).subspan(0, 33)).message(),
              HasSubstr("not whole blocks"));
  EXPECT_THAT(w.AddTensor("a", {8, 8}, GgmlType::kF32, absl::MakeSpan(v).subspan(0, 60)).message(),
              HasSubstr("64 elements but 60 values"));
  EXPECT_THAT(w.AddTensor("a", {1, 1, 1, 1, 64}, GgmlType::kF32, v).message(), HasSubstr("5 dimensions"));
  EXPECT_THAT(w.AddTensor("a", {0}, GgmlType::kF32, {}).message(), HasSubstr("bad dimension 0"));
  EXPECT_THAT(w.AddTensor("", {64}, GgmlType::kF32, v).message(), HasSubstr("empty"));
  EXPECT_THAT(w.AddTensor("a", {64}, static_cast<GgmlType>(13), v).message(), HasSubstr("unsupported type 13"));
  ASSERT_TRUE(w.AddTensor("a", {64}, GgmlType::kF32, v).ok());
  EXPECT_THAT(w.AddTensor("a", {64}, GgmlType::kF32, v).message(), HasSubstr("already added"));
}

TEST(GgufFileTest, VersionTwoAndCustomAlignment) {
  ByteBuilder b;
  b.Header(2, 2, 1).Key("general.alignment", 4).U32(64);
  b.TensorInfo("a", {4}, 0, 0).TensorInfo("b", {2}, 0, 64);
  b.PadTo(64);
  const size_t data_start = b.size();
  b.F32(1).F32(2).F32(3).F32(4).PadTo(64).F32(5).F32(6);
  auto file = MustParse(b.bytes());
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->version(), 2u);
  const auto* base = file->tensors()[0].data - data_start;
  EXPECT_EQ(file->FindTensor("b")->data - base, static_cast<ptrdiff_t>(data_start + 64));
  float y[2];
  ASSERT_TRUE(DequantizeRow(GgmlType::kF32, file->FindTensor("b")->data, y, 2).ok());
  EXPECT_EQ(y[0], 5.0f);
  EXPECT_EQ(y[1], 6.0f);
}

TEST(GgufFileTest, NoTensorsNeedsNoPadding) {
  ByteBuilder b;
  b.Header(3, 0, 1).Key("k", 8).Str("v");
  auto file = MustParse(b.bytes());
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->GetString("k").value(), "v");
}

class GgufOpenTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) { return ::testing::TempDir() + "/gguf_open_test_" + name; }
};

TEST_F(GgufOpenTest, OpenMapsWhatTheWriterWrote) {
  GgufWriter w;
  testing::AddTinyLlama(testing::TinyLlama(), &w);
  const std::string path = Path("tiny.gguf");
  ASSERT_TRUE(w.WriteFile(path).ok());
  auto opened = GgufFile::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status();
  auto parsed = MustParse(w.Serialize());
  ASSERT_NE(parsed, nullptr);
  const GgufFile& f = **opened;
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.Keys(), parsed->Keys());
  ASSERT_EQ(f.tensors().size(), parsed->tensors().size());
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const GgufTensor& a = f.tensors()[i];
    const GgufTensor& b = parsed->tensors()[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.shape, b.shape);
    ASSERT_EQ(a.num_bytes, b.num_bytes);
    EXPECT_EQ(std::memcmp(a.data, b.data, a.num_bytes), 0) << a.name;
  }
  std::remove(path.c_str());
}

TEST_F(GgufOpenTest, OpenErrorsNameThePath) {
  auto missing = GgufFile::Open(Path("does_not_exist.gguf"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("does_not_exist.gguf"));

  auto dir = GgufFile::Open(::testing::TempDir());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dir.status().message(), HasSubstr("not a regular file"));

  const std::string empty = Path("empty.gguf");
  std::fclose(std::fopen(empty.c_str(), "wb"));
  auto opened = GgufFile::Open(empty);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(opened.status().message(), HasSubstr(empty + ": not a GGUF file"));
  std::remove(empty.c_str());

  GgufWriter w;
  EXPECT_EQ(w.WriteFile(Path("no_such_dir/x.gguf")).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::gguf
