// A bounded, deterministic mutation fuzz test of the GGUF reader: valid
// images with random byte flips, truncations, insertions, deletions and
// corrupted length fields must parse or be refused, never crash, and what
// parses must be safe to read in full.
#include <chrono>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_test_util.h"
#include "common/gguf/llama_config.h"
#include "gtest/gtest.h"

namespace tandem::gguf {
namespace {

using testing::ByteBuilder;
using testing::TinyLlama;

constexpr int kInputs = 100000;
constexpr uint64_t kSeed = 20240611;

struct Seed {
  std::string image;
  size_t directory_end;  // where the tensor data starts: mutations focus before it
};

// Where the data section of a writer-style image (data padded to 32 at the
// end) starts.
size_t DataStart(const std::string& image) {
  auto file = GgufFile::FromBytes(image);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok() || (*file)->tensors().empty()) return image.size();
  const GgufTensor& first = (*file)->tensors().front();
  const GgufTensor& last = (*file)->tensors().back();
  const size_t data_bytes = static_cast<size_t>(last.data - first.data) + static_cast<size_t>(last.num_bytes);
  return image.size() - (data_bytes + 31) / 32 * 32;
}

std::vector<Seed> Seeds() {
  std::vector<std::string> images;
  TinyLlama tiny;
  tiny.layers = 1;
  tiny.hidden = 32;
  tiny.heads = 2;
  tiny.kv_heads = 1;
  tiny.intermediate = 32;
  tiny.vocab = 12;
  tiny.type = GgmlType::kQ4_1;
  images.push_back(testing::TinyLlamaImage(tiny));
  tiny.type = GgmlType::kQ8_0;
  tiny.tied = false;
  tiny.with_tokenizer = false;
  images.push_back(testing::TinyLlamaImage(tiny));
  // Every value type, and the float tensor types.
  ByteBuilder b;
  b.Header(3, 3, 7);
  b.Key("u8", 0).U8(1).Key("i16", 3).U16(2).Key("u64", 10).U64(3).Key("f64", 12).F64(0.5);
  b.Key("flags", 9).U32(7).U64(2).U8(1).U8(0);
  b.Key("names", 9).U32(8).U64(2).Str("a").Str("bc");
  b.Key("general.alignment", 4).U32(32);
  b.TensorInfo("f16", {4, 2}, 1, 0).TensorInfo("bf16", {8}, 30, 32).TensorInfo("q4_0", {32}, 2, 64);
  b.PadTo(32).Bytes(std::string(96, '\x3c'));
  images.push_back(b.bytes());

  std::vector<Seed> seeds;
  for (std::string& image : images) {
    const size_t end = DataStart(image);
    seeds.push_back(Seed{std::move(image), end});
  }
  return seeds;
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  std::string Mutate(const Seed& seed) {
    std::string s = seed.image;
    const int count = 1 + static_cast<int>(Below(3));
    for (int i = 0; i < count; ++i) MutateOnce(&s, seed.directory_end);
    return s;
  }

 private:
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  // Mostly inside the header and directory, where the parser's decisions are.
  size_t Position(const std::string& s, size_t directory_end) {
    if (s.empty()) return 0;
    const size_t limit = Below(4) == 0 ? s.size() : std::min(s.size(), directory_end);
    return static_cast<size_t>(Below(limit == 0 ? 1 : limit));
  }

  uint64_t InterestingValue(const std::string& s, size_t pos) {
    static constexpr uint64_t kValues[] = {0,
                                           1,
                                           2,
                                           3,
                                           4,
                                           5,
                                           8,
                                           9,
                                           12,
                                           13,
                                           30,
                                           31,
                                           32,
                                           33,
                                           0x7f,
                                           0x80,
                                           0xff,
                                           0xffff,
                                           0x7fffffff,
                                           0x80000000,
                                           0xffffffff,
                                           uint64_t{1} << 32,
                                           uint64_t{1} << 40,
                                           uint64_t{1} << 62,
                                           std::numeric_limits<int64_t>::max(),
                                           std::numeric_limits<uint64_t>::max()};
    switch (Below(4)) {
      case 0: return s.size();
      case 1: return s.size() - pos;
      case 2: return rng_();
      default: return kValues[Below(sizeof(kValues) / sizeof(kValues[0]))];
    }
  }

  void MutateOnce(std::string* s, size_t directory_end) {
    switch (Below(6)) {
      case 0: {  // random bytes
        const int n = 1 + static_cast<int>(Below(4));
        for (int i = 0; i < n && !s->empty(); ++i) (*s)[Position(*s, directory_end)] = static_cast<char>(rng_());
        break;
      }
      case 1:  // one bit
        if (!s->empty()) (*s)[Position(*s, directory_end)] ^= static_cast<char>(1 << Below(8));
        break;
      case 2:  // truncation
        s->resize(static_cast<size_t>(Below(s->size() + 1)));
        break;
      case 3: {  // insertion
        std::string bytes(1 + Below(16), '\0');
        for (char& c : bytes) c = static_cast<char>(rng_());
        s->insert(std::min(s->size(), Position(*s, directory_end)), bytes);
        break;
      }
      case 4:  // deletion
        if (!s->empty()) s->erase(Position(*s, directory_end), 1 + Below(16));
        break;
      default: {  // a length, count, type or offset field set to an edge value
        const size_t pos = Position(*s, directory_end);
        const uint64_t value = InterestingValue(*s, pos);
        const size_t width = Below(2) == 0 ? 4 : 8;
        for (size_t i = 0; i < width && pos + i < s->size(); ++i) (*s)[pos + i] = static_cast<char>(value >> (8 * i));
        break;
      }
    }
  }

  std::mt19937_64 rng_;
};

// Reads everything a loader would from an accepted file.
void TouchEverything(const GgufFile& file, std::vector<float>* buffer) {
  for (const GgufTensor& t : file.tensors()) {
    ASSERT_NE(t.data, nullptr);
    buffer->resize(static_cast<size_t>(t.num_elements));
    ASSERT_TRUE(DequantizeRow(t.type, t.data, buffer->data(), t.num_elements).ok()) << t.name;
  }
  for (const std::string& key : file.Keys()) {
    (void)file.GetUint32(key);
    (void)file.GetInt64(key);
    (void)file.GetFloat(key);
    (void)file.GetBool(key);
    (void)file.GetString(key);
    (void)file.GetStringArray(key);
    (void)file.GetIntArray(key);
  }
  (void)ReadLlamaConfig(file);
}

TEST(GgufFuzzTest, MutatedImagesNeverCrash) {
  const std::vector<Seed> seeds = Seeds();
  for (const Seed& seed : seeds) ASSERT_TRUE(GgufFile::FromBytes(seed.image).ok());
  Mutator mutator(kSeed);
  std::vector<float> buffer;
  int accepted = 0;
  int configs = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kInputs; ++i) {
    const Seed& seed = seeds[static_cast<size_t>(i) % seeds.size()];
    auto file = GgufFile::FromBytes(mutator.Mutate(seed));
    if (!file.ok()) {
      ASSERT_FALSE(file.status().message().empty()) << "input " << i;
      continue;
    }
    ++accepted;
    TouchEverything(**file, &buffer);
    if (ReadLlamaConfig(**file).ok()) ++configs;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("gguf fuzz: %d inputs, %d accepted (%d with a valid llama config), %.2f s\n", kInputs, accepted, configs,
              seconds);
  // Most mutations break something, but some (a flipped weight byte, a
  // changed name) must still parse, or the test only exercises refusal.
  EXPECT_GT(accepted, kInputs / 100);
  EXPECT_LT(accepted, kInputs);
}

}  // namespace
}  // namespace tandem::gguf
