// Tokenizer on small vocabularies built in the test: the byte vocabulary
// (one token per byte), hand-written merges, special tokens, and the data
// that Create must refuse. The real-model tests are in
// smollm2_tokenizer_test.cc.
#include "common/tokenizer/tokenizer.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/tokenizer/byte_alphabet.h"
#include "common/tokenizer/tokenizer_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using tokenizer_internal::EncodeByteAlphabet;
using tokenizer_test::ByteVocabularyData;
using tokenizer_test::kByteVocabEndOfText;
using tokenizer_test::kByteVocabImEnd;
using tokenizer_test::kByteVocabImStart;
using tokenizer_test::kByteVocabUserDefined;

std::unique_ptr<Tokenizer> MustCreate(TokenizerData data) {
  auto tokenizer = Tokenizer::Create(std::move(data));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

// The byte vocabulary plus tokens and merges written as raw text
// ("a b" merges "a" and "b"; a space in them means 'Ġ').
TokenizerData WithMerges(const std::vector<std::string>& extra_tokens,
                         const std::vector<std::pair<std::string, std::string>>& merges) {
  TokenizerData data = ByteVocabularyData();
  for (const std::string& token : extra_tokens) {
    data.tokens.push_back(EncodeByteAlphabet(token));
    data.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
  }
  for (const auto& [left, right] : merges) {
    data.merges.push_back(EncodeByteAlphabet(left) + " " + EncodeByteAlphabet(right));
  }
  return data;
}

std::vector<TokenId> Bytes(std::string_view text) {
  std::vector<TokenId> ids;
  for (char c : text) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

absl::Status CreateStatus(TokenizerData data) {
  return Tokenizer::Create(std::move(data)).status();
}

TEST(ByteVocabularyTest, OneTokenPerByte) {
  auto tokenizer = MustCreate(ByteVocabularyData());
  EXPECT_EQ(tokenizer->vocab_size(), 260);
  EXPECT_EQ(tokenizer->Encode("hello, world"), Bytes("hello, world"));
  const std::string cjk = "\u65e5\u672c";  // 6 bytes, 6 tokens
  EXPECT_EQ(tokenizer->Encode(cjk), Bytes(cjk));
  EXPECT_THAT(tokenizer->Encode(""), IsEmpty());
}

TEST(ByteVocabularyTest, RoundTripsTheCorpus) {
  auto tokenizer = MustCreate(ByteVocabularyData());
  for (const std::string& text : tokenizer_test::Utf8Corpus()) {
    const std::vector<TokenId> ids = tokenizer->Encode(text, true, false);
    // One token per byte, except the user-defined "<tool>" (always matched).
    if (text.find("<tool>") == std::string::npos) {
      EXPECT_EQ(ids.size(), text.size()) << text;
    }
    EXPECT_EQ(tokenizer->Decode(ids), text);
    EXPECT_EQ(tokenizer->Decode(tokenizer->Encode(text, true, true)), text);
  }
}

// Not promised by the header (only valid UTF-8 is), but Encode must never
// crash on bytes a client sends, and here it even round-trips them.
TEST(ByteVocabularyTest, EncodesEveryByteValue) {
  auto tokenizer = MustCreate(ByteVocabularyData());
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(tokenizer->Encode(all), Bytes(all));
  EXPECT_EQ(tokenizer->Decode(tokenizer->Encode(all)), all);
}

TEST(SpecialTokenTest, ParsedOnlyWhenAsked) {
  auto tokenizer = MustCreate(ByteVocabularyData());
  const std::string text = "<|im_start|>hi<|im_end|>";
  std::vector<TokenId> expected = {kByteVocabImStart, 'h', 'i', kByteVocabImEnd};
  EXPECT_EQ(tokenizer->Encode(text, true, true), expected);
  EXPECT_EQ(tokenizer->Encode(text, true, false), Bytes(text));
  EXPECT_EQ(tokenizer->Decode(tokenizer->Encode(text, true, false)), text);
  // Near misses stay text.
  EXPECT_EQ(tokenizer->Encode("<|im_start|"), Bytes("<|im_start|"));
}

// User-defined tokens are added vocabulary, not control: Hugging Face and
// llama.cpp match them in any text and keep them when skipping specials.
TEST(SpecialTokenTest, UserDefinedTokensAreAlwaysMatched) {
  auto tokenizer = MustCreate(ByteVocabularyData());
  EXPECT_THAT(tokenizer->Encode("a<tool>", true, false), ElementsAre('a', kByteVocabUserDefined));
  EXPECT_THAT(tokenizer->Encode("a<tool>", true, true), ElementsAre('a', kByteVocabUserDefined));
  EXPECT_TRUE(tokenizer->IsSpecial(kByteVocabUserDefined));
}

TEST(SpecialTokenTest, DecodeSkipsControlTokensOnRequest) {
  auto tokenizer = MustCreate(ByteVocabularyData());
  const std::vector<TokenId> ids = {
      kByteVocabImStart, 'h', kByteVocabUserDefined, 'i', kByteVocabImEnd, kByteVocabEndOfText};
  EXPECT_EQ(tokenizer->Decode(ids), "<|im_start|>h<tool>i<|im_end|><|endoftext|>");
  EXPECT_EQ(tokenizer->Decode(ids, /*skip_special=*/true), "h<tool>i");
  EXPECT_EQ(tokenizer->Decode({'a', -1, 260, 1 << 30, 'b'}), "ab");  // unknown ids: nothing
}

TEST(SpecialTokenTest, LookupsAndBytes) {
  auto tokenizer = MustCreate(ByteVocabularyData());
  EXPECT_TRUE(tokenizer->IsSpecial(kByteVocabImStart));
  EXPECT_FALSE(tokenizer->IsSpecial('a'));
  EXPECT_FALSE(tokenizer->IsSpecial(-1));
  EXPECT_FALSE(tokenizer->IsSpecial(260));
  EXPECT_EQ(tokenizer->FindToken("<|im_end|>"), kByteVocabImEnd);
  EXPECT_EQ(tokenizer->FindToken("\u0120"), ' ');  // tokens are in the byte alphabet
  EXPECT_EQ(tokenizer->FindToken(" "), -1);
  EXPECT_EQ(tokenizer->FindToken("<|im_end"), -1);
  EXPECT_EQ(tokenizer->TokenBytes(kByteVocabEndOfText), "<|endoftext|>");
  EXPECT_EQ(tokenizer->TokenBytes(0xE6), "\xE6");  // the first byte of U+65E5
  EXPECT_EQ(tokenizer->TokenBytes(' '), " ");
  EXPECT_EQ(tokenizer->TokenBytes(-3), "");
  EXPECT_EQ(tokenizer->bos_token_id(), kByteVocabImStart);
  EXPECT_EQ(tokenizer->eos_token_id(), kByteVocabImEnd);
  EXPECT_EQ(tokenizer->data().tokens.size(), 260u);
}

TEST(SpecialTokenTest, LongestMatchWinsAtTheSamePlace) {
  TokenizerData data = ByteVocabularyData();
  data.tokens.push_back("<|im_start|>x");
  data.token_types.push_back(static_cast<int32_t>(TokenType::kControl));
  auto tokenizer = MustCreate(std::move(data));
  EXPECT_THAT(tokenizer->Encode("<|im_start|>x<|im_start|>y"),
              ElementsAre(260, kByteVocabImStart, 'y'));
}

TEST(EncodeTest, AddsBosOnlyWhenTheModelAsks) {
  TokenizerData data = ByteVocabularyData();
  auto without = MustCreate(data);
  EXPECT_THAT(without->Encode("a"), ElementsAre('a'));
  data.add_bos_token = true;
  auto with = MustCreate(data);
  EXPECT_THAT(with->Encode("a"), ElementsAre(kByteVocabImStart, 'a'));
  EXPECT_THAT(with->Encode("a", /*add_special=*/false), ElementsAre('a'));
  EXPECT_THAT(with->Encode(""), ElementsAre(kByteVocabImStart));
}

// Merges apply by rank, whatever order the pairs appear in the word.
TEST(BpeTest, MergesByRank) {
  // Ids: 260 "ab", 261 "bc", 262 "abc".
  auto ab_first =
      MustCreate(WithMerges({"ab", "bc", "abc"}, {{"a", "b"}, {"b", "c"}, {"ab", "c"}}));
  EXPECT_THAT(ab_first->Encode("abc"), ElementsAre(262));
  EXPECT_THAT(ab_first->Encode("abd"), ElementsAre(260, 'd'));
  EXPECT_THAT(ab_first->Encode("bcd"), ElementsAre(261, 'd'));
  // "b c" first: "a" + "bc", and no merge joins those.
  auto bc_first =
      MustCreate(WithMerges({"ab", "bc", "abc"}, {{"b", "c"}, {"a", "b"}, {"ab", "c"}}));
  EXPECT_THAT(bc_first->Encode("abc"), ElementsAre('a', 261));
}

TEST(BpeTest, EqualRanksMergeLeftmostFirst) {
  auto tokenizer = MustCreate(WithMerges({"aa"}, {{"a", "a"}}));
  EXPECT_THAT(tokenizer->Encode("aaa"), ElementsAre(260, 'a'));
  EXPECT_THAT(tokenizer->Encode("aaaa"), ElementsAre(260, 260));
  EXPECT_THAT(tokenizer->Encode("aaaaa"), ElementsAre(260, 260, 'a'));
}

TEST(BpeTest, MergesStayInsideWords) {
  // " a" is a token, "a " is not: the space starts the next word.
  auto tokenizer = MustCreate(WithMerges({" a", "a "}, {{" ", "a"}, {"a", " "}}));
  EXPECT_THAT(tokenizer->Encode("a a"), ElementsAre('a', 260));
  // Two spaces before "a": " " alone, then " a".
  EXPECT_THAT(tokenizer->Encode("a  a"), ElementsAre('a', ' ', 260));
}

TEST(BpeTest, LongWordIsFast) {
  auto tokenizer = MustCreate(WithMerges({"aa", "aaaa"}, {{"a", "a"}, {"aa", "aa"}}));
  const std::string word(200000, 'a');
  const std::vector<TokenId> ids = tokenizer->Encode(word);
  ASSERT_EQ(ids.size(), 50000u);
  EXPECT_EQ(ids.front(), 261);
  EXPECT_EQ(tokenizer->Decode(ids), word);
}

TEST(EncodeTest, ConcurrentCallsAgree) {
  auto tokenizer =
      MustCreate(WithMerges({"ab", "bc", "abc"}, {{"a", "b"}, {"b", "c"}, {"ab", "c"}}));
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "abc abd <|im_end|> bcd ";
  const std::vector<TokenId> expected = tokenizer->Encode(text);
  std::vector<std::thread> threads;
  // One int per thread, not std::vector<bool>: its bits share words, so
  // threads writing neighbouring elements would race on the same memory.
  std::vector<int> same(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] { same[t] = tokenizer->Encode(text) == expected ? 1 : 0; });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_THAT(same, ElementsAre(1, 1, 1, 1));
}

TEST(CreateTest, RefusesOtherTokenizerModels) {
  TokenizerData data = ByteVocabularyData();
  data.model = "llama";
  const absl::Status status = CreateStatus(data);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("\"llama\" (SentencePiece)"));
  EXPECT_THAT(status.message(), HasSubstr("byte-level BPE"));
  data.model = "bert";
  EXPECT_THAT(CreateStatus(data).message(), HasSubstr("\"bert\" (WordPiece)"));
}

TEST(CreateTest, RefusesUnknownPreTokenizer) {
  TokenizerData data = ByteVocabularyData();
  data.pre = "qwen2";
  const absl::Status status = CreateStatus(data);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("tokenizer.ggml.pre \"qwen2\""));
}

TEST(CreateTest, RefusesMergesThatNameUnknownTokens) {
  TokenizerData data = WithMerges({"ab"}, {{"a", "b"}});
  data.merges.push_back("a zz");
  absl::Status status = CreateStatus(data);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("merge 1 \"a zz\" names \"zz\""));

  data = WithMerges({}, {{"a", "b"}});  // "ab" is not a token
  EXPECT_THAT(CreateStatus(data).message(), HasSubstr("merge 0 \"a b\" makes \"ab\""));

  data = WithMerges({}, {});
  data.merges.push_back("ab");
  EXPECT_THAT(CreateStatus(data).message(), HasSubstr("is not \"left right\""));
}

TEST(CreateTest, RefusesAnIncompleteByteAlphabet) {
  TokenizerData data = ByteVocabularyData();
  data.tokens['\n'] = "<newline>";
  const absl::Status status = CreateStatus(data);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("no token for byte 0x0A"));
}

// Real vocabularies may lack rare bytes (SmolLM2 lacks 21); Encode drops
// them before merging, as HF's BPE does, so their neighbours may merge.
TEST(CreateTest, AcceptsMissingRareBytesAndDropsThem) {
  TokenizerData data = WithMerges({"ab"}, {{"a", "b"}});
  data.tokens[0x04] = "<eot>";
  data.tokens[0xFF] = "<ff>";
  data.tokens[0xC3] = "<c3>";  // with 0xA9: "\u00e9" has no bytes left
  data.tokens[0xA9] = "<a9>";
  auto tokenizer = MustCreate(std::move(data));
  EXPECT_THAT(tokenizer->Encode("a\004b"), ElementsAre('a', 'b'));  // three words
  EXPECT_THAT(tokenizer->Encode("a\u00E9b"), ElementsAre(260));     // one word
  EXPECT_THAT(tokenizer->Encode("x\xFF"), ElementsAre('x'));
  EXPECT_THAT(tokenizer->Encode("\x04"), IsEmpty());
}

TEST(CreateTest, RefusesIdsOutOfRange) {
  TokenizerData data = ByteVocabularyData();
  data.bos_token_id = 5000;
  EXPECT_THAT(CreateStatus(data).message(),
              HasSubstr("tokenizer.ggml.bos_token_id 5000 is out of range for 260 tokens"));
  data = ByteVocabularyData();
  data.eos_token_id = -2;
  EXPECT_THAT(CreateStatus(data).message(), HasSubstr("eos_token_id -2"));
  data = ByteVocabularyData();
  data.padding_token_id = 260;
  EXPECT_THAT(CreateStatus(data).message(), HasSubstr("padding_token_id 260"));
}

TEST(CreateTest, RefusesBadTokenTypes) {
  TokenizerData data = ByteVocabularyData();
  data.token_types.pop_back();
  EXPECT_THAT(CreateStatus(data).message(), HasSubstr("259 entries for 260 tokens"));
  data = ByteVocabularyData();
  data.token_types[7] = 9;
  EXPECT_THAT(CreateStatus(data).message(), HasSubstr("token_type[7] = 9"));
  data = ByteVocabularyData();
  data.token_types.clear();  // empty: all normal
  EXPECT_TRUE(CreateStatus(data).ok());
}

TEST(CreateTest, RefusesAnEmptyVocabulary) {
  EXPECT_THAT(CreateStatus(TokenizerData()).message(), HasSubstr("tokenizer.ggml.tokens is empty"));
}

}  // namespace
}  // namespace tandem
