// The xgrammar adapter on the real SmolLM2 vocabulary: masks, accepting and
// rejecting tokens, the compile cache, errors a client can cause.
#include "scheduler/server/structured/grammar_factory.h"

#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/tokenizer_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/server/structured/xgrammar_grammar.h"

namespace tandem::structured {
namespace {

using ::testing::HasSubstr;

constexpr char kSchema[] =
    R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"]})";

class GrammarFactoryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tokenizer = LoadTokenizerFile(tokenizer_test::SmolLm2Path());
    if (tokenizer.ok()) tokenizer_ = tokenizer->release();
  }
  void SetUp() override {
    if (tokenizer_ == nullptr) GTEST_SKIP() << "the default model is absent; run tools/setup.sh";
    factory_ = std::make_unique<GrammarFactory>(tokenizer_);
  }

  std::unique_ptr<scheduler::Grammar> Matcher(const StructuredSpec& spec) {
    auto compiled = factory_->Compile(spec);
    EXPECT_TRUE(compiled.ok()) << compiled.status();
    if (!compiled.ok()) return nullptr;
    return GrammarFactory::NewGrammar(*compiled, {tokenizer_->eos_token_id()});
  }
  std::vector<uint32_t> Mask(const scheduler::Grammar& g) const {
    std::vector<uint32_t> row((tokenizer_->vocab_size() + 31) / 32, 0);
    g.FillBitmask(absl::MakeSpan(row), tokenizer_->vocab_size());
    return row;
  }
  static bool Allowed(const std::vector<uint32_t>& row, TokenId t) { return (row[t / 32] >> (t % 32)) & 1u; }
  TokenId Id(const std::string& text) const {
    std::vector<TokenId> ids = tokenizer_->Encode(text, /*add_special=*/false, /*parse_special=*/false);
    EXPECT_EQ(ids.size(), 1u) << "'" << text << "' is not one token";
    return ids.empty() ? -1 : ids[0];
  }
  // Feeds `text` token by token; false at the first token refused.
  bool Feed(scheduler::Grammar& g, const std::string& text) const {
    for (TokenId t : tokenizer_->Encode(text, false, false)) {
      if (!Allowed(Mask(g), t)) return false;
      if (!g.AcceptTokens({t})) return false;
    }
    return true;
  }

  static inline const Tokenizer* tokenizer_ = nullptr;
  std::unique_ptr<GrammarFactory> factory_;
};

TEST_F(GrammarFactoryTest, JsonSchemaMaskAllowsBraceFirstAndNotText) {
  auto g = Matcher({StructuredKind::kJsonSchema, kSchema, {}, "response_format"});
  ASSERT_NE(g, nullptr);
  const std::vector<uint32_t> row = Mask(*g);
  EXPECT_TRUE(Allowed(row, Id("{")));
  EXPECT_FALSE(Allowed(row, Id("x")));
  EXPECT_FALSE(Allowed(row, Id("[")));
  EXPECT_FALSE(Allowed(row, tokenizer_->eos_token_id()));  // an empty output is not an object
}

TEST_F(GrammarFactoryTest, AcceptsAValidObjectThenOnlyTheStopToken) {
  auto g = Matcher({StructuredKind::kJsonSchema, kSchema, {}, "response_format"});
  ASSERT_NE(g, nullptr);
  ASSERT_TRUE(Feed(*g, R"({"name": "Ada", "age": 36})"));
  const std::vector<uint32_t> row = Mask(*g);
  EXPECT_TRUE(Allowed(row, tokenizer_->eos_token_id()));
  EXPECT_FALSE(Allowed(row, Id("}")));
  EXPECT_TRUE(g->AcceptTokens({tokenizer_->eos_token_id()}));
  EXPECT_TRUE(static_cast<XgrammarGrammar&>(*g).IsTerminated());
}

TEST_F(GrammarFactoryTest, RejectsATokenTheSchemaForbids) {
  auto g = Matcher({StructuredKind::kJsonSchema, kSchema, {}, "response_format"});
  ASSERT_NE(g, nullptr);
  ASSERT_TRUE(Feed(*g, R"({"name": "Ada", "age": )"));
  EXPECT_FALSE(Allowed(Mask(*g), Id("\"")));  // age is an integer
  EXPECT_FALSE(g->AcceptTokens({Id("\"")}));
}

TEST_F(GrammarFactoryTest, CompilesEachStructureOnce) {
  const StructuredSpec spec{StructuredKind::kJsonSchema, kSchema, {}, "response_format"};
  auto first = factory_->Compile(spec);
  auto second = factory_->Compile(spec);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->get(), second->get());
  EXPECT_EQ(factory_->stats().compiled, 1);
  EXPECT_EQ(factory_->stats().cache_hits, 1);
  // The same text as a regex is another structure.
  ASSERT_TRUE(factory_->Compile({StructuredKind::kRegex, "[a-z]+", {}, "guided_regex"}).ok());
  EXPECT_EQ(factory_->stats().compiled, 2);
}

TEST_F(GrammarFactoryTest, UncompilableSchemaNamesTheProblem) {
  auto bad = factory_->Compile({StructuredKind::kJsonSchema, R"({"type":"no-such-type"})", {}, "response_format"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("response_format"));
  EXPECT_THAT(bad.status().message(), HasSubstr("no-such-type"));
  EXPECT_FALSE(factory_->Compile({StructuredKind::kRegex, "(unclosed", {}, "guided_regex"}).ok());
  EXPECT_FALSE(factory_->Compile({StructuredKind::kGrammar, "root ::= undefined_rule", {}, "guided_grammar"}).ok());
  EXPECT_FALSE(factory_->Compile({StructuredKind::kChoice, "", {}, "guided_choice"}).ok());
}

TEST_F(GrammarFactoryTest, ChoiceAllowsExactlyTheChoices) {
  const StructuredSpec spec{StructuredKind::kChoice, "", {"yes", "no", "say \"maybe\"\n"}, "guided_choice"};
  for (const std::string& choice : spec.choices) {
    auto g = Matcher(spec);
    ASSERT_TRUE(Feed(*g, choice)) << choice;
    EXPECT_TRUE(Allowed(Mask(*g), tokenizer_->eos_token_id())) << choice;
  }
  auto g = Matcher(spec);
  EXPECT_FALSE(Feed(*g, "yesno"));
  EXPECT_FALSE(Feed(*Matcher(spec), "perhaps"));
}

TEST_F(GrammarFactoryTest, RegexAndEbnfGrammar) {
  auto digits = Matcher({StructuredKind::kRegex, "[0-9]{3}-[0-9]{4}", {}, "guided_regex"});
  EXPECT_TRUE(Feed(*digits, "555-1234"));
  EXPECT_TRUE(Allowed(Mask(*digits), tokenizer_->eos_token_id()));
  EXPECT_FALSE(Feed(*Matcher({StructuredKind::kRegex, "[0-9]{3}-[0-9]{4}", {}, "guided_regex"}), "55a"));
  auto ebnf = Matcher({StructuredKind::kGrammar, R"g(root ::= "(" [a-c]+ ")")g", {}, "guided_grammar"});
  EXPECT_TRUE(Feed(*ebnf, "(abcab)"));
  EXPECT_FALSE(Feed(*Matcher({StructuredKind::kGrammar, R"g(root ::= "(" [a-c]+ ")")g", {}, "guided_grammar"}), "(d"));
}

TEST_F(GrammarFactoryTest, WiderRowsLeavePaddedIdsDisallowed) {
  auto g = Matcher({StructuredKind::kJsonObject, "", {}, "response_format"});
  const int32_t padded = tokenizer_->vocab_size() + 100;
  std::vector<uint32_t> row((padded + 31) / 32, 0);
  g->FillBitmask(absl::MakeSpan(row), padded);
  EXPECT_TRUE(Allowed(row, Id("{")));
  for (TokenId t = tokenizer_->vocab_size(); t < padded; ++t) EXPECT_FALSE(Allowed(row, t)) << t;
}

}  // namespace
}  // namespace tandem::structured
