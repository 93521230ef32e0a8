// ReadTokenizerData on GGUF images written in memory by GgufWriter.
#include <memory>
#include <string>
#include <vector>

#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_writer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/tokenizer_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The byte vocabulary with two merges, as a GGUF writer would store it.
gguf::GgufWriter TokenizerWriter() {
  TokenizerData data = tokenizer_test::ByteVocabularyData();
  data.tokens.push_back("\u0120a");  // " a"
  data.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
  gguf::GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetString("tokenizer.ggml.pre", "smollm");
  w.SetStringArray("tokenizer.ggml.tokens", data.tokens);
  w.SetInt32Array("tokenizer.ggml.token_type", data.token_types);
  w.SetStringArray("tokenizer.ggml.merges", {"\u0120 a"});
  w.SetUint32("tokenizer.ggml.bos_token_id", tokenizer_test::kByteVocabImStart);
  w.SetUint32("tokenizer.ggml.eos_token_id", tokenizer_test::kByteVocabImEnd);
  w.SetUint32("tokenizer.ggml.padding_token_id", tokenizer_test::kByteVocabEndOfText);
  w.SetBool("tokenizer.ggml.add_bos_token", true);
  w.SetString("tokenizer.chat_template", "{{ messages }}");
  return w;
}

absl::StatusOr<TokenizerData> Read(const gguf::GgufWriter& w) {
  auto file = gguf::GgufFile::FromBytes(w.Serialize());
  if (!file.ok()) return file.status();
  return ReadTokenizerData(**file);
}

TEST(ReadTokenizerDataTest, ReadsEveryField) {
  auto data = Read(TokenizerWriter());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->model, "gpt2");
  EXPECT_EQ(data->pre, "smollm");
  EXPECT_EQ(data->tokens.size(), 261u);
  EXPECT_EQ(data->tokens[256], "<|endoftext|>");
  EXPECT_EQ(data->token_types[257], static_cast<int32_t>(TokenType::kControl));
  EXPECT_THAT(data->merges, ElementsAre("\u0120 a"));
  EXPECT_EQ(data->bos_token_id, tokenizer_test::kByteVocabImStart);
  EXPECT_EQ(data->eos_token_id, tokenizer_test::kByteVocabImEnd);
  EXPECT_EQ(data->unknown_token_id, -1);
  EXPECT_EQ(data->padding_token_id, tokenizer_test::kByteVocabEndOfText);
  EXPECT_TRUE(data->add_bos_token);
  EXPECT_EQ(data->chat_template, "{{ messages }}");

  auto tokenizer = Tokenizer::Create(*std::move(data));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_THAT((*tokenizer)->Encode("b a"),
              ElementsAre(tokenizer_test::kByteVocabImStart, 'b', 260));
}

TEST(ReadTokenizerDataTest, OptionalKeysDefault) {
  gguf::GgufWriter w;
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetStringArray("tokenizer.ggml.tokens", tokenizer_test::ByteVocabularyData().tokens);
  auto data = Read(w);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->pre, "default");
  EXPECT_TRUE(data->token_types.empty());
  EXPECT_TRUE(data->merges.empty());
  EXPECT_EQ(data->bos_token_id, -1);
  EXPECT_EQ(data->eos_token_id, -1);
  EXPECT_FALSE(data->add_bos_token);
  EXPECT_TRUE(data->chat_template.empty());
  EXPECT_TRUE(Tokenizer::Create(*std::move(data)).ok());
}

TEST(ReadTokenizerDataTest, MissingKeysAreNamed) {
  gguf::GgufWriter no_model;
  no_model.SetStringArray("tokenizer.ggml.tokens", {"a"});
  auto data = Read(no_model);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(data.status().message(), HasSubstr("tokenizer.ggml.model"));

  gguf::GgufWriter no_tokens;
  no_tokens.SetString("tokenizer.ggml.model", "gpt2");
  data = Read(no_tokens);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(data.status().message(), HasSubstr("tokenizer.ggml.tokens"));
}

TEST(ReadTokenizerDataTest, WrongTypesAreNamed) {
  gguf::GgufWriter w;
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetStringArray("tokenizer.ggml.tokens", tokenizer_test::ByteVocabularyData().tokens);
  w.SetString("tokenizer.ggml.bos_token_id", "one");
  auto data = Read(w);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(data.status().message(), HasSubstr("tokenizer.ggml.bos_token_id"));

  gguf::GgufWriter tokens_as_string;
  tokens_as_string.SetString("tokenizer.ggml.model", "gpt2");
  tokens_as_string.SetString("tokenizer.ggml.tokens", "a b c");
  data = Read(tokens_as_string);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(data.status().message(), HasSubstr("tokenizer.ggml.tokens"));
}

// A SentencePiece model reads fine; Create is what refuses it, by name.
TEST(ReadTokenizerDataTest, SentencePieceModelIsRefusedByCreate) {
  gguf::GgufWriter w;
  w.SetString("tokenizer.ggml.model", "llama");
  w.SetStringArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "\u2581the"});
  w.SetInt32Array("tokenizer.ggml.token_type", {2, 3, 3, 1});
  auto data = Read(w);
  ASSERT_TRUE(data.ok()) << data.status();
  const absl::Status status = Tokenizer::Create(*std::move(data)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("tokenizer.ggml.model \"llama\" (SentencePiece)"));
}

}  // namespace
}  // namespace tandem
