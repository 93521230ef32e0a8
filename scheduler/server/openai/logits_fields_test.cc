#include "scheduler/server/openai/logits_fields.h"

#include "absl/strings/str_cat.h"
#include "common/tokenizer/tokenizer_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/server/openai/openai_protocol.h"

namespace tandem::openai {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

GenerationRequest ParseOk(const std::string& body) {
  auto parsed = ParseGenerationRequest(Endpoint::kCompletions, body);
  if (auto* e = std::get_if<ApiError>(&parsed)) ADD_FAILURE() << body << " -> " << e->message;
  return std::get_if<GenerationRequest>(&parsed) ? std::get<GenerationRequest>(parsed) : GenerationRequest{};
}

ApiError ParseError(const std::string& body) {
  auto parsed = ParseGenerationRequest(Endpoint::kChatCompletions, body);
  EXPECT_TRUE(std::holds_alternative<ApiError>(parsed)) << body << " was accepted";
  return std::holds_alternative<ApiError>(parsed) ? std::get<ApiError>(parsed) : ApiError{};
}

TEST(LogitsFieldsTest, LogitBiasIsSortedByToken) {
  const GenerationRequest r = ParseOk(R"({"prompt": "x", "logit_bias": {"50": -100, "7": 2.5, "300": 100}})");
  EXPECT_THAT(r.sampling.logit_bias, ElementsAre(Pair(7, 2.5f), Pair(50, -100.0f), Pair(300, 100.0f)));
  EXPECT_TRUE(ParseOk(R"({"prompt": "x", "logit_bias": {}})").sampling.logit_bias.empty());
}

TEST(LogitsFieldsTest, BadLogitBiasIsNamedOnBothEndpoints) {
  const char* const kMessages = R"("messages": [{"role": "user", "content": "x"}])";
  for (const char* bias : {R"({"1": 100.5})", R"({"1": -101})", R"({"1.5": 1})", R"({"-1": 1})", R"({"": 1})",
                           R"({"1": "5"})", R"({"1": 1, "01": 2})", R"({"99999999999": 1})", R"([1])", R"(3)"}) {
    const ApiError e = ParseError(absl::StrCat("{", kMessages, R"(, "logit_bias": )", bias, "}"));
    EXPECT_EQ(e.status, 400) << bias;
    EXPECT_EQ(e.param, "logit_bias") << bias << ": " << e.message;
  }
  std::string many = "{";
  for (int i = 0; i <= kMaxLogitBias; ++i) absl::StrAppend(&many, i > 0 ? ", " : "", "\"", i, "\": 1");
  many += "}";
  const ApiError e = ParseError(absl::StrCat("{", kMessages, R"(, "logit_bias": )", many, "}"));
  EXPECT_THAT(e.message, HasSubstr("at most 300"));
  const GenerationRequest ok = ParseOk(absl::StrCat(R"({"prompt": "x", "logit_bias": )",
                                                    many.substr(0, many.rfind(", ")), "}}"));
  EXPECT_EQ(ok.sampling.logit_bias.size(), static_cast<size_t>(kMaxLogitBias));
}

TEST(LogitsFieldsTest, LogitBiasOutsideTheVocabulary) {
  auto tokenizer = Tokenizer::Create(tokenizer_test::ByteVocabularyData());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const int32_t vocab = (*tokenizer)->vocab_size();
  EXPECT_FALSE(CheckLogitBiasVocab({{0, 1.0f}, {vocab - 1, 1.0f}}, **tokenizer).has_value());
  const std::optional<std::string> e = CheckLogitBiasVocab({{3, 1.0f}, {vocab, 1.0f}}, **tokenizer);
  ASSERT_TRUE(e.has_value());
  EXPECT_THAT(*e, HasSubstr(absl::StrCat("token ", vocab, ", outside the vocabulary")));
}

TEST(LogitsFieldsTest, BadWordsParseAndAreRefusedWhenMalformed) {
  EXPECT_THAT(ParseOk(R"({"prompt": "x", "bad_words": ["Paris", " the city"]})").bad_words,
              ElementsAre("Paris", " the city"));
  for (const char* words : {R"("Paris")", R"([1])", R"([""])", R"(["\n "])", R"({"a": 1})"}) {
    const ApiError e = ParseError(absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}], "bad_words": )",
                                               words, "}"));
    EXPECT_EQ(e.param, "bad_words") << words << ": " << e.message;
  }
}

TEST(LogitsFieldsTest, BadWordsTokenizeWithAndWithoutALeadingSpace) {
  // The byte vocabulary: " ab" is three tokens, not another spelling of "ab".
  auto bytes = Tokenizer::Create(tokenizer_test::ByteVocabularyData());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_THAT(TokenizeBadWords({"  ab", "ab", "c"}, **bytes),
              ElementsAre(ElementsAre('a', 'b'), ElementsAre('c')));

  auto real = LoadTokenizerFile(tokenizer_test::SmolLm2Path());
  if (!real.ok()) GTEST_SKIP() << "no SmolLM2 model: " << real.status();
  const Tokenizer& t = **real;
  const std::vector<TokenId> plain = t.Encode("Paris", false, false);
  const std::vector<TokenId> spaced = t.Encode(" Paris", false, false);
  ASSERT_EQ(spaced.size(), 1u);  // one token inside a sentence
  EXPECT_THAT(TokenizeBadWords({"Paris"}, t), ElementsAre(plain, spaced));
}

}  // namespace
}  // namespace tandem::openai
