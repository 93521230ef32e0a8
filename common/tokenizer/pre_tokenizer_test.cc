// The pieces under the tokenizer: UTF-8 decoding, the GPT-2 byte alphabet
// and the pre-tokenizer's splits. Expected splits were taken from Hugging
// Face's ByteLevel(use_regex) and Sequence[Digits(individual_digits),
// ByteLevel] pre-tokenizers (PyPI tokenizers 0.23.3), mapped back to bytes.
#include "common/tokenizer/pre_tokenizer.h"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/byte_alphabet.h"
#include "common/tokenizer/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::tokenizer_internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<std::string> Split(std::string_view pre, std::string_view text) {
  auto pre_tokenizer = PreTokenizer::Create(pre);
  EXPECT_TRUE(pre_tokenizer.ok()) << pre_tokenizer.status();
  std::vector<std::string_view> words;
  (*pre_tokenizer)->Split(text, &words);
  return std::vector<std::string>(words.begin(), words.end());
}

TEST(Utf8Test, DecodesAndRejects) {
  std::string text = "a\u00e9\u65e5\U0001F44B";
  size_t pos = 0;
  char32_t cp;
  std::vector<char32_t> cps;
  while (pos < text.size()) {
    ASSERT_TRUE(NextCodePoint(text, &pos, &cp));
    cps.push_back(cp);
  }
  EXPECT_THAT(cps, ElementsAre(U'a', U'\u00e9', U'\u65e5', U'\U0001F44B'));
  std::string round;
  for (char32_t c : cps) AppendUtf8(c, &round);
  EXPECT_EQ(round, text);

  EXPECT_TRUE(IsValidUtf8(text));
  EXPECT_FALSE(IsValidUtf8("\x80"));              // lone continuation
  EXPECT_FALSE(IsValidUtf8("\xC3"));              // truncated
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // surrogate U+D800
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xFF"));
}

TEST(ByteAlphabetTest, MatchesGpt2BytesToUnicode) {
  EXPECT_EQ(ByteToAlphabet('!'), U'!');
  EXPECT_EQ(ByteToAlphabet('~'), U'~');
  EXPECT_EQ(ByteToAlphabet(0xA1), U'\u00A1');
  EXPECT_EQ(ByteToAlphabet(0xAD), U'\u0143');  // the last stand-in
  EXPECT_EQ(ByteToAlphabet(0x00), U'\u0100');
  EXPECT_EQ(ByteToAlphabet(' '), U'\u0120');   // 'Ġ'
  EXPECT_EQ(ByteToAlphabet('\n'), U'\u010A');  // 'Ċ'
  EXPECT_EQ(EncodeByteAlphabet(" hello\n"), "\u0120hello\u010A");
}

TEST(ByteAlphabetTest, RoundTripsEveryByte) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string encoded = EncodeByteAlphabet(all);
  EXPECT_TRUE(IsValidUtf8(encoded));
  std::string decoded;
  ASSERT_TRUE(DecodeByteAlphabet(encoded, &decoded));
  EXPECT_EQ(decoded, all);
}

TEST(ByteAlphabetTest, RejectsCharactersOutsideIt) {
  std::string bytes;
  EXPECT_FALSE(DecodeByteAlphabet(" ", &bytes));       // a raw space is not a stand-in
  EXPECT_FALSE(DecodeByteAlphabet("\u0144", &bytes));  // one past the last
  EXPECT_FALSE(DecodeByteAlphabet("\u65e5", &bytes));
  EXPECT_FALSE(DecodeByteAlphabet("\xC3", &bytes));  // not UTF-8
}

TEST(PreTokenizerTest, RefusesUnknownPreTokenizer) {
  auto pre = PreTokenizer::Create("llama-bpe");
  ASSERT_FALSE(pre.ok());
  EXPECT_EQ(pre.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(pre.status().message(), HasSubstr("llama-bpe"));
  EXPECT_TRUE(PreTokenizer::Create("default").ok());
}

TEST(PreTokenizerTest, WordsAndContractions) {
  EXPECT_THAT(Split("gpt2", "hello world"), ElementsAre("hello", " world"));
  EXPECT_THAT(Split("gpt2", "don't"), ElementsAre("don", "'t"));
  EXPECT_THAT(Split("gpt2", "I'LL"), ElementsAre("I", "'", "LL"));  // contractions are lower case
  EXPECT_THAT(Split("gpt2", "...!!  ?"), ElementsAre("...!!", " ", " ?"));
  EXPECT_THAT(Split("gpt2", ""), IsEmpty());
}

// `\s+(?!\S)`: a whitespace run before more text gives up its last
// character, which starts the next word when it is a space.
TEST(PreTokenizerTest, WhitespaceLookaheadRule) {
  EXPECT_THAT(Split("gpt2", "a  b"), ElementsAre("a", " ", " b"));
  EXPECT_THAT(Split("gpt2", "a   b"), ElementsAre("a", "  ", " b"));
  EXPECT_THAT(Split("gpt2", "  <|x|>"), ElementsAre(" ", " <|", "x", "|>"));
  EXPECT_THAT(Split("gpt2", "\n\n  a"), ElementsAre("\n\n ", " a"));
  EXPECT_THAT(Split("gpt2", "a \n b"), ElementsAre("a", " \n", " b"));
}

TEST(PreTokenizerTest, TrailingWhitespaceStaysTogether) {
  EXPECT_THAT(Split("gpt2", "a  "), ElementsAre("a", "  "));
  EXPECT_THAT(Split("gpt2", "x  \n"), ElementsAre("x", "  \n"));
  EXPECT_THAT(Split("gpt2", "   "), ElementsAre("   "));
}

// A non-space character given up by a run cannot join the next word
// (only ' ' may prefix one), so it stands alone.
TEST(PreTokenizerTest, NewlinesAndTabs) {
  EXPECT_THAT(Split("gpt2", "a\n\nb"), ElementsAre("a", "\n", "\n", "b"));
  EXPECT_THAT(Split("gpt2", "a\t\tb"), ElementsAre("a", "\t", "\t", "b"));
  EXPECT_THAT(Split("gpt2", "a\r\nb"), ElementsAre("a", "\r", "\n", "b"));
}

// Oniguruma's \s: NBSP and the ideographic space are whitespace, the
// information separators U+001C..U+001F are not.
TEST(PreTokenizerTest, UnicodeWhitespace) {
  EXPECT_THAT(Split("gpt2", "a\u00A0\u00A0b"), ElementsAre("a", "\u00A0", "\u00A0", "b"));
  EXPECT_THAT(Split("gpt2", "a\u3000b"), ElementsAre("a", "\u3000", "b"));
  EXPECT_THAT(Split("gpt2", "a\034\034b"), ElementsAre("a", "\x1c\x1c", "b"));
  EXPECT_TRUE(IsPatternWhitespace(U'\u0085'));
  EXPECT_TRUE(IsPatternWhitespace(U'\u2028'));
  EXPECT_FALSE(IsPatternWhitespace(U'\u200B'));
  EXPECT_FALSE(IsPatternWhitespace(U'\u180E'));
}

TEST(PreTokenizerTest, Gpt2KeepsNumbersTogether) {
  EXPECT_THAT(Split("gpt2", "a 123 b"), ElementsAre("a", " 123", " b"));
  EXPECT_THAT(Split("gpt2", " 12ab34"), ElementsAre(" 12", "ab", "34"));
  EXPECT_THAT(Split("gpt2", "a  1"), ElementsAre("a", " ", " 1"));
}

// "smollm" isolates every \p{N} first; each piece between is then split
// on its own, so a space before a digit ends its piece.
TEST(PreTokenizerTest, SmolLmSplitsDigits) {
  EXPECT_THAT(Split("smollm", "a 123 b"), ElementsAre("a", " ", "1", "2", "3", " b"));
  EXPECT_THAT(Split("smollm", " 12ab34"), ElementsAre(" ", "1", "2", "ab", "3", "4"));
  EXPECT_THAT(Split("smollm", "a  1"), ElementsAre("a", "  ", "1"));
  EXPECT_THAT(Split("smollm", "\u216B\u00BD\u0663"), ElementsAre("\u216B", "\u00BD", "\u0663"));
  EXPECT_THAT(Split("gpt2", "\u216B\u00BD\u0663"), ElementsAre("\u216B\u00BD\u0663"));
}

TEST(PreTokenizerTest, InvalidUtf8BytesStandAlone) {
  EXPECT_THAT(Split("smollm", "ab\377\376cd"), ElementsAre("ab", "\xFF", "\xFE", "cd"));
}

TEST(PreTokenizerTest, WordsConcatenateToTheText) {
  const std::string text = "  x = f(3.14, 'don''t') \n\n\t\U0001F44B\U0001F3FD  \u65e5\u672c 42  ";
  for (std::string_view pre : {"gpt2", "smollm"}) {
    std::string joined;
    for (const std::string& word : Split(pre, text)) {
      EXPECT_FALSE(word.empty());
      joined += word;
    }
    EXPECT_EQ(joined, text) << pre;
  }
}

}  // namespace
}  // namespace tandem::tokenizer_internal
