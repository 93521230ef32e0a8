// SmolLM2-135M-Instruct's tokenizer read from its GGUF file, against
// reference ids. Skipped when models/SmolLM2-135M-Instruct.Q4_1.gguf is
// absent (tools/setup.sh fetches it).
//
// Reference: PyPI `tokenizers` 0.23.3 (Hugging Face's Rust tokenizer)
// rebuilt from this same GGUF file's vocabulary, merges and token types by
// tools/reference_tokenize.py (BPE, pre-tokenizer Sequence[Digits(
// individual_digits=True), ByteLevel(add_prefix_space=False)], the control
// tokens as special added tokens):
//   python3 tools/reference_tokenize.py --cpp --strings-json strings.json
//       --model models/SmolLM2-135M-Instruct.Q4_1.gguf
// `transformers`' AutoTokenizer needs the hub and is not available offline,
// so that reconstruction is the reference. As a second source, every
// string below was also encoded by llama.cpp's own tokenizer
// (llama-cpp-python 0.3.36, vocab_only) from the same file: identical ids.
// The two differ only when a byte without a token sits inside a word (HF
// drops it before merging, so its neighbours may merge; llama.cpp does
// not merge across it); tandem follows HF.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/gguf/gguf_file.h"
#include "common/tokenizer/byte_alphabet.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/tokenizer_test_util.h"
#include "common/tokenizer/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

struct Reference {
  const char* text;
  std::vector<TokenId> ids;
};

// Encode(text) with special tokens parsed.
const std::vector<Reference>& ParsedReferences() {
  static const auto* references = new std::vector<Reference>{
      {"Hello world", {19556, 905}},
      {"The quick brown fox jumps over the lazy dog.",
       {504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30}},
      {"SmolLM2 is a family of compact language models available in three sizes: 135M, 360M, and "
       "1.7B parameters.",
       {9207, 308,  34519, 34, 314, 253, 1564, 282, 12633, 1789, 2859, 1770,
        281,  1296, 7804,  42, 216, 33,  35,   37,  61,    28,   216,  35,
        38,   32,   61,    28, 284, 216, 33,   30,  39,    50,   6116, 30}},
      {"12345 and 3.14", {33, 34, 35, 36, 37, 284, 216, 35, 30, 33, 36}},
      {"Call 555-0123 before 2024-01-31, or pay $1,000,000.99!",
       {12800, 216, 37, 37,  37,   29,   32, 33, 34, 35, 1092, 216, 34, 32, 34, 36, 29, 32, 33, 29,
        35,    33,  28, 355, 2290, 1885, 33, 28, 32, 32, 32,   28,  32, 32, 32, 30, 41, 41, 17}},
      {"def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
       {1604, 3987, 24, 94,  727, 472, 585, 304,  2067, 216, 34, 42,  448, 1003, 304, 472, 1003,
        3987, 24,   94, 731, 216, 33,  25,  1232, 3987, 24,  94, 731, 216, 34,   25,  198}},
      {"int main() {\n\treturn 0;\t// done\n}\n\n\n",
       {591, 1085, 1000, 1662, 198, 197, 5406, 216, 32, 43, 197, 1559, 2294, 198, 109, 16506}},
      {"x  =   y    +\tz\t\t\n  \n",
       {104, 216, 446, 256, 329, 333, 1232, 197, 106, 1656, 11181, 198}},
      {"don't I'll we're they've she'd it's I'm DON'T",
       {12420, 982, 339, 3060, 392, 2316, 502, 3543, 1041, 6737, 357, 506, 339, 5248, 422, 2154, 23,
        68}},
      {"Wait... what?!?! (really) [yes] {no} <ok> --- *** ### ~~~",
       {33359, 2026, 732,  17593, 17593, 365,   40311, 25,    933, 10407, 77, 1662,
        4607,  109,  2067, 2231,  46,    21749, 33117, 20749, 216, 9493,  110}},
      {"👋🏽 hello 👨\u200D👩\u200D👧\u200D👦 family",
       {10813, 235, 229, 10813, 233,   138, 33662, 15107, 235, 118,   321, 231, 10813,
        235,   119, 321, 231,   10813, 235, 117,   321,   231, 10813, 235, 116, 1564}},
      {"日本語のテキスト",
       {23274, 115, 40993, 179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134, 11100, 226}},
      {"naïve café résumé", {3546, 46494, 37366, 412, 2756, 5422, 2756}},
      {"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
       {1, 4093, 198, 6004, 2, 198, 1, 520, 9531, 198}},
      {"   leading and trailing   ", {256, 2899, 284, 35079, 333}},
      {"\n\nnewlines\n\n", {198, 198, 2241, 5110, 1116}},
      {"", {}},
      {"Ünïcödé: Привет, мир! مرحبا بالعالم",
       {142,   246,   94,    25972, 83,    7466,  84,    2756,  42,   5470,
        249,   46879, 16464, 32547, 28,    41337, 7872,  9175,  17,   36395,
        20602, 44626, 31462, 10805, 45726, 22208, 34966, 22208, 21706}},
      {"e\u0301 combining a\u0308", {85, 151, 219, 9301, 253, 151, 226}},
      {"tab\tseparated\tvalues\t", {15999, 197, 19509, 483, 197, 6347, 197}},
      {"a\u00A0b\u3000\u3000c\u2028d  \u2003x",
       {81, 15442, 82, 12109, 218, 12109, 218, 83, 321, 118, 84, 256, 321, 221, 104}},
      {"hello<|endoftext|>world", {28120, 0, 6693}},
      {"٣٤٥ ½ Ⅻ ① x²",
       {164, 113, 164, 114, 164, 115, 216, 16738, 216, 173, 223, 121, 216, 173, 235, 250, 1792,
        19133}},
      {"<repo_name>x<reponame>y<filename", {3, 104, 4, 105, 44, 5805}},
      {" ", {216}},
      {"  ", {256}},
      {"\t", {197}},
      {"a\r\nb\r\n", {81, 201, 198, 82, 2738}},
      {"I'm  'quoted' ''s", {57, 5248, 216, 637, 385, 5036, 23, 10922, 99}},
      // Bytes without a token (0x04, 0x13, 0x1D) are dropped.
      {"a\004b", {81, 82}},
      {"x\035\035 y\023", {104, 329}},
      {"ctrl \001\033[0m\177", {39673, 216, 191, 212, 75, 32, 93, 217}},
  };
  return *references;
}

// Encode(text, add_special, parse_special=false): special tokens as text.
const std::vector<Reference>& TextReferences() {
  static const auto* references = new std::vector<Reference>{
      {"<|im_start|>user\nhi<|im_end|>",
       {44, 108, 306, 79, 3738, 108, 46, 4093, 198, 6004, 44, 108, 306, 79, 486, 108, 46}},
      {"hello<|endoftext|>world", {28120, 44, 108, 486, 1714, 2692, 108, 46, 6693}},
  };
  return *references;
}

class SmolLm2TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = tokenizer_test::SmolLm2Path();
    if (!std::filesystem::exists(path)) return;
    auto tokenizer = LoadTokenizerFile(path);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = tokenizer->release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  void SetUp() override {
    if (tokenizer_ == nullptr) {
      GTEST_SKIP() << tokenizer_test::SmolLm2Path() << " is absent; tools/setup.sh fetches it";
    }
  }

  static const Tokenizer* tokenizer_;
};

const Tokenizer* SmolLm2TokenizerTest::tokenizer_ = nullptr;

TEST_F(SmolLm2TokenizerTest, ReadsTheMetadata) {
  const TokenizerData& data = tokenizer_->data();
  EXPECT_EQ(data.model, "gpt2");
  EXPECT_EQ(data.pre, "smollm");
  EXPECT_EQ(tokenizer_->vocab_size(), 49152);
  EXPECT_EQ(data.merges.size(), 48900u);
  EXPECT_EQ(data.token_types.size(), 49152u);
  EXPECT_EQ(tokenizer_->bos_token_id(), 1);
  EXPECT_EQ(tokenizer_->eos_token_id(), 2);
  EXPECT_EQ(data.unknown_token_id, 0);
  EXPECT_EQ(data.padding_token_id, 2);
  EXPECT_FALSE(data.add_bos_token);
  EXPECT_THAT(data.chat_template, HasSubstr("<|im_start|>"));
}

TEST_F(SmolLm2TokenizerTest, MatchesReferenceIds) {
  int matched = 0;
  for (const Reference& ref : ParsedReferences()) {
    const std::vector<TokenId> ids = tokenizer_->Encode(ref.text);
    EXPECT_EQ(ids, ref.ids) << "text: \"" << ref.text << "\"";
    matched += ids == ref.ids;
  }
  for (const Reference& ref : TextReferences()) {
    const std::vector<TokenId> ids = tokenizer_->Encode(ref.text, true, /*parse_special=*/false);
    EXPECT_EQ(ids, ref.ids) << "text: \"" << ref.text << "\"";
    matched += ids == ref.ids;
  }
  std::printf("[ info     ] %d of %zu reference strings match\n", matched,
              ParsedReferences().size() + TextReferences().size());
}

// The vocabulary has no token for these bytes: six ASCII controls, and
// bytes that valid UTF-8 never uses (C0 C1 F5..FF) or uses only for the
// unassigned planes 4..11 (F1 F2).
TEST_F(SmolLm2TokenizerTest, KnowsWhichBytesHaveNoToken) {
  std::vector<int> missing;
  for (int b = 0; b < 256; ++b) {
    const std::string byte(1, static_cast<char>(b));
    if (tokenizer_->FindToken(tokenizer_internal::EncodeByteAlphabet(byte)) < 0) {
      missing.push_back(b);
      EXPECT_THAT(tokenizer_->Encode(byte), IsEmpty()) << b;
    }
  }
  EXPECT_THAT(missing, ElementsAre(0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, 0xF5,
                                   0xF6, 0xF7, 0xF8, 0xF9, 0xFA, 0xFB, 0xFC, 0xFD, 0xFE, 0xFF));
}

// Decode(Encode(x)) == x, less the bytes that have no token (the corpus
// has one: 0x1D).
TEST_F(SmolLm2TokenizerTest, RoundTripsTheCorpus) {
  int changed = 0;
  for (const std::string& text : tokenizer_test::Utf8Corpus()) {
    ASSERT_TRUE(tokenizer_internal::IsValidUtf8(text));
    std::string representable;
    for (char c : text) {
      if (tokenizer_->FindToken(tokenizer_internal::EncodeByteAlphabet(std::string(1, c))) >= 0) {
        representable.push_back(c);
      }
    }
    changed += representable != text;
    EXPECT_EQ(tokenizer_->Decode(tokenizer_->Encode(text, true, false)), representable);
    EXPECT_EQ(tokenizer_->Decode(tokenizer_->Encode(text, true, true)), representable);
  }
  EXPECT_EQ(changed, 1);
}

TEST_F(SmolLm2TokenizerTest, SpecialTokens) {
  for (TokenId id = 0; id <= 16; ++id) EXPECT_TRUE(tokenizer_->IsSpecial(id)) << id;
  EXPECT_FALSE(tokenizer_->IsSpecial(17));
  EXPECT_EQ(tokenizer_->FindToken("<|im_start|>"), 1);
  EXPECT_EQ(tokenizer_->FindToken("<|im_end|>"), 2);
  EXPECT_EQ(tokenizer_->FindToken("\u0120\u0120"), 256);  // "  " in the byte alphabet
  EXPECT_EQ(tokenizer_->TokenBytes(2), "<|im_end|>");
  EXPECT_EQ(tokenizer_->Decode({1, 4093, 198, 6004, 2}, /*skip_special=*/true), "user\nhi");
}

// Tokens may end inside a UTF-8 sequence: U+1F44B is F0 9F 91 8B and
// U+65E5 is E6 97 A5, each split over several tokens.
TEST_F(SmolLm2TokenizerTest, TokenBytesCanEndMidCharacter) {
  EXPECT_THAT(tokenizer_->Encode("\U0001F44B"), ElementsAre(10813, 235, 229));
  EXPECT_EQ(tokenizer_->TokenBytes(10813), "\xF0\x9F");
  EXPECT_EQ(tokenizer_->TokenBytes(235), "\x91");
  EXPECT_EQ(tokenizer_->TokenBytes(23274), "\xE6\x97");
  EXPECT_FALSE(tokenizer_internal::IsValidUtf8(tokenizer_->TokenBytes(10813)));
}

// Not a test of speed (CI machines vary): prints the encode throughput of
// about 1 MB of English-like text and checks the round trip.
TEST_F(SmolLm2TokenizerTest, PrintsEncodeThroughput) {
  static const char* const kWords[] = {
      "the",     "of",      "and",       "to",     "in",         "a",          "is",    "that",
      "for",     "it",      "as",        "was",    "with",       "be",         "by",    "on",
      "not",     "he",      "this",      "are",    "or",         "his",        "from",  "at",
      "which",   "but",     "have",      "an",     "had",        "they",       "you",   "were",
      "serving", "tokens",  "scheduler", "memory", "language",   "model's",    "don't", "cache",
      "request", "latency", "batching",  "GPU",    "Kubernetes", "throughput", "2024",  "3.14"};
  std::string text;
  uint32_t state = 12345;
  int64_t count = 0;
  while (text.size() < (1 << 20)) {
    state = state * 1664525u + 1013904223u;
    text += kWords[(state >> 8) % (sizeof(kWords) / sizeof(kWords[0]))];
    ++count;
    text += count % 97 == 0 ? ".\n\n" : count % 13 == 0 ? ", " : " ";
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<TokenId> ids = tokenizer_->Encode(text);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(tokenizer_->Decode(ids), text);
  std::printf("[ info     ] encoded %zu bytes into %zu tokens in %.3f s (%.1f MB/s)\n", text.size(),
              ids.size(), seconds, text.size() / seconds / 1e6);
}

}  // namespace
}  // namespace tandem
