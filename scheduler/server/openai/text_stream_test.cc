// TextStream: incremental detokenization with stop strings. Most tests use
// the byte vocabulary of the random test models (one token per byte, ids
// 0..255 = bytes 0..255), so that tokens can split characters and stop
// strings anywhere; one uses the real SmolLM2 tokenizer when present.
#include "scheduler/server/openai/text_stream.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/gguf/gguf_file.h"
#include "common/tokenizer/incremental_decoder.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/tokenizer_test_util.h"
#include "common/tokenizer/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::openai {
namespace {

using ::testing::ElementsAre;

constexpr char kWave[] = "\xF0\x9F\x91\x8B";     // U+1F44B
constexpr char kThumbs[] = "\xF0\x9F\x91\x8D";   // U+1F44D
constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// The byte vocabulary's ids of `text`, one per byte.
std::vector<TokenId> Bytes(std::string_view text) {
  std::vector<TokenId> ids;
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

class TextStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tokenizer = Tokenizer::Create(tokenizer_test::ByteVocabularyData());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
  }

  // Adds `text` one byte-token at a time; returns each delta's text.
  static std::vector<std::string> AddEach(TextStream* stream, std::string_view text) {
    std::vector<std::string> texts;
    for (TokenId id : Bytes(text)) texts.push_back(stream->Add({id}).text);
    return texts;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(TextStreamTest, WithoutStopStringsMatchesIncrementalDecoder) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<TokenId> ids(rng() % 60);
    for (TokenId& id : ids) id = static_cast<TokenId>(rng() % 260);  // any byte, and the specials
    const bool skip_special = rng() % 2;
    TextStream stream(tokenizer_.get(), {}, false, skip_special);
    IncrementalDecoder decoder(tokenizer_.get(), skip_special);
    size_t i = 0;
    while (i < ids.size()) {
      const size_t n = std::min<size_t>(1 + rng() % 4, ids.size() - i);
      const absl::Span<const TokenId> chunk = absl::MakeConstSpan(ids).subspan(i, n);
      const TextDelta delta = stream.Add(chunk);
      EXPECT_EQ(delta.text, decoder.Add(chunk));
      EXPECT_FALSE(delta.stopped);
      i += n;
    }
    EXPECT_EQ(stream.Finish(), decoder.Finish());
    EXPECT_EQ(stream.num_tokens(), static_cast<int32_t>(ids.size()));
  }
}

TEST_F(TextStreamTest, MinTokensDefersStopStrings) {
  // "ab" completes at token 2 and again at token 5; with min_tokens 3 only
  // the second counts, and the text before it, the first "ab" included, is out.
  TextStream stream(tokenizer_.get(), {"ab"}, false, true, /*min_tokens=*/3);
  const TextDelta delta = stream.Add(Bytes("abxab!"));
  EXPECT_TRUE(delta.stopped);
  EXPECT_EQ(delta.text, "abx");
  EXPECT_EQ(stream.num_tokens(), 5);
  // A match that completes exactly at min_tokens counts.
  TextStream at(tokenizer_.get(), {"ab"}, false, true, /*min_tokens=*/2);
  EXPECT_TRUE(at.Add(Bytes("ab")).stopped);
}

TEST_F(TextStreamTest, StopAtTheStart) {
  TextStream stream(tokenizer_.get(), {"Hello"});
  EXPECT_THAT(AddEach(&stream, "Hell"), ElementsAre("", "", "", ""));
  const TextDelta delta = stream.Add(Bytes("o world"));
  EXPECT_TRUE(delta.stopped);
  EXPECT_EQ(delta.stop, "Hello");
  EXPECT_EQ(delta.text, "");
  EXPECT_EQ(stream.emitted(), "");
  EXPECT_EQ(stream.num_tokens(), 5);  // through the "o"
  EXPECT_TRUE(stream.stopped());
}

TEST_F(TextStreamTest, HoldsBackAPossibleStopAcrossTokens) {
  TextStream stream(tokenizer_.get(), {"STOP"});
  EXPECT_EQ(stream.Add(Bytes("ab")).text, "ab");
  EXPECT_EQ(stream.Add(Bytes("S")).text, "");
  EXPECT_EQ(stream.Add(Bytes("T")).text, "");
  EXPECT_EQ(stream.Add(Bytes("x")).text, "STx");  // not a stop after all
  EXPECT_EQ(stream.Add(Bytes("ST")).text, "");
  EXPECT_EQ(stream.Add(Bytes("O")).text, "");
  const TextDelta delta = stream.Add(Bytes("P"));
  EXPECT_TRUE(delta.stopped);
  EXPECT_EQ(delta.text, "");
  EXPECT_EQ(stream.emitted(), "abSTx");
  EXPECT_EQ(stream.num_tokens(), 9);
}

// KMP's classic case: after "aa" a failed "aab" still leaves "aa" pending.
TEST_F(TextStreamTest, HoldsBackTheLongestPendingPrefix) {
  TextStream stream(tokenizer_.get(), {"aab"});
  EXPECT_THAT(AddEach(&stream, "xaaab"), ElementsAre("x", "", "", "a", ""));
  EXPECT_TRUE(stream.stopped());
  EXPECT_EQ(stream.emitted(), "xa");
}

TEST_F(TextStreamTest, DropsEverythingAfterTheStop) {
  TextStream stream(tokenizer_.get(), {"STOP"});
  const TextDelta delta = stream.Add(Bytes("abSTOPcdSTOP"));
  EXPECT_TRUE(delta.stopped);
  EXPECT_EQ(delta.stop, "STOP");
  EXPECT_EQ(delta.text, "ab");
  EXPECT_EQ(stream.num_tokens(), 6);
  const TextDelta after = stream.Add(Bytes("more"));
  EXPECT_FALSE(after.stopped);
  EXPECT_EQ(after.text, "");
  EXPECT_EQ(stream.num_tokens(), 6);
  EXPECT_EQ(stream.Finish(), "");
  EXPECT_EQ(stream.emitted(), "ab");
}

TEST_F(TextStreamTest, IncludeStopInOutput) {
  TextStream stream(tokenizer_.get(), {"STOP"}, /*include_stop_in_output=*/true);
  EXPECT_EQ(stream.Add(Bytes("xST")).text, "x");
  const TextDelta delta = stream.Add(Bytes("OPy"));
  EXPECT_TRUE(delta.stopped);
  EXPECT_EQ(delta.text, "STOP");
  EXPECT_EQ(stream.emitted(), "xSTOP");
}

// With stops "ab", "abc" and "b", whichever completes first wins; at equal
// ends the longer (earlier) one, so "ab" beats "b" in "xab".
TEST_F(TextStreamTest, OverlappingStopStrings) {
  const std::vector<std::string> stops = {"b", "abc", "ab"};
  struct Case {
    const char* text;
    const char* emitted;
    const char* stop;
  };
  for (const Case& c : {Case{"xab", "x", "ab"}, Case{"xcb", "xc", "b"}, Case{"abc", "", "ab"},
                        Case{"aacab", "aac", "ab"}, Case{"ccc", "ccc", ""}}) {
    for (bool at_once : {false, true}) {
      TextStream stream(tokenizer_.get(), stops);
      std::string stop;
      if (at_once) {
        stop = stream.Add(Bytes(c.text)).stop;
      } else {
        for (TokenId id : Bytes(c.text)) stop += stream.Add({id}).stop;
      }
      stream.Finish();
      EXPECT_EQ(stream.emitted(), c.emitted) << c.text << " at_once=" << at_once;
      EXPECT_EQ(stop, c.stop) << c.text;
    }
  }
  // "bc" completes before "abcd" does, even when both arrive in one token.
  TextStream stream(tokenizer_.get(), {"abcd", "bc"}, /*include_stop_in_output=*/true);
  const TextDelta delta = stream.Add(Bytes("abcd"));
  EXPECT_EQ(delta.stop, "bc");
  EXPECT_EQ(delta.text, "abc");
  EXPECT_EQ(stream.num_tokens(), 3);
}

TEST_F(TextStreamTest, MultiByteCharactersSplitAcrossTokens) {
  {
    TextStream stream(tokenizer_.get(), {});
    EXPECT_THAT(AddEach(&stream, std::string("a") + kWave + "b"),
                ElementsAre("a", "", "", "", kWave, "b"));
  }
  {  // The stop string is the emoji: found when its last byte arrives.
    TextStream stream(tokenizer_.get(), {kWave});
    EXPECT_THAT(AddEach(&stream, std::string("a") + kWave + "b"),
                ElementsAre("a", "", "", "", "", ""));
    EXPECT_EQ(stream.emitted(), "a");
    EXPECT_EQ(stream.num_tokens(), 5);
  }
  {  // "a" is held until the character after it is known.
    TextStream stream(tokenizer_.get(), {std::string("a") + kThumbs});
    EXPECT_THAT(AddEach(&stream, std::string("a") + kWave),
                ElementsAre("", "", "", "", std::string("a") + kWave));
    EXPECT_FALSE(stream.stopped());
  }
  {  // A stop string never matches inside a character.
    TextStream stream(tokenizer_.get(), {"\x91\x8B", "\xF0"});
    stream.Add(Bytes(kWave));
    EXPECT_EQ(stream.Finish(), "");
    EXPECT_EQ(stream.emitted(), kWave);
    EXPECT_FALSE(stream.stopped());
  }
}

TEST_F(TextStreamTest, FinishFlushesHeldBackText) {
  TextStream stream(tokenizer_.get(), {"STOP"});
  EXPECT_EQ(stream.Add(Bytes("abST")).text, "ab");
  EXPECT_EQ(stream.Finish(), "ST");
  EXPECT_EQ(stream.emitted(), "abST");
  EXPECT_FALSE(stream.stopped());
  EXPECT_EQ(stream.Finish(), "");
}

TEST_F(TextStreamTest, FinishTurnsAnIncompleteCharacterIntoReplacements) {
  TextStream stream(tokenizer_.get(), {"xyz"});
  EXPECT_EQ(stream.Add(Bytes("x\xF0\x9F")).text, "");
  EXPECT_EQ(stream.Finish(), std::string("x") + kReplacement + kReplacement);
}

// Only a stop string containing U+FFFD can match in the flushed tail.
TEST_F(TextStreamTest, FinishStillHonorsStopStrings) {
  TextStream stream(tokenizer_.get(), {std::string("x") + kReplacement});
  EXPECT_EQ(stream.Add(Bytes("ax\xF0")).text, "a");
  EXPECT_EQ(stream.Finish(), "");
  EXPECT_TRUE(stream.stopped());
  EXPECT_EQ(stream.emitted(), "a");
}

TEST_F(TextStreamTest, IgnoresEmptyAndInvalidStopStrings) {
  TextStream stream(tokenizer_.get(), {"", "\xA9", "\xC3"});
  EXPECT_EQ(stream.Add(Bytes("caf\xC3\xA9!")).text, "caf\xC3\xA9!");
  EXPECT_FALSE(stream.stopped());
}

TEST_F(TextStreamTest, SpecialTokens) {
  const TokenId im_end = tokenizer_test::kByteVocabImEnd;
  const TokenId tool = tokenizer_test::kByteVocabUserDefined;
  {  // Skipped control tokens decode to nothing, so cannot match.
    TextStream stream(tokenizer_.get(), {"<|im_end|>"});
    EXPECT_EQ(stream.Add({'h', 'i', im_end, '!'}).text, "hi!");
    EXPECT_FALSE(stream.stopped());
    EXPECT_EQ(stream.num_tokens(), 4);
  }
  {
    TextStream stream(tokenizer_.get(), {"<|im_end|>"}, false, /*skip_special=*/false);
    const TextDelta delta = stream.Add({'h', 'i', im_end, '!'});
    EXPECT_TRUE(delta.stopped);
    EXPECT_EQ(delta.text, "hi");
    EXPECT_EQ(stream.num_tokens(), 3);
  }
  {  // User-defined tokens are text even with skip_special.
    TextStream stream(tokenizer_.get(), {"l>"});
    EXPECT_EQ(stream.Add({'a', tool, 'b'}).text, "a<too");
    EXPECT_TRUE(stream.stopped());
  }
}

// A long stop string that the text keeps almost matching: each byte costs
// O(1) per stop string (a rescan of the held-back tail would be quadratic).
TEST_F(TextStreamTest, LongStopStringsStayCheap) {
  const std::string stop = std::string(4096, 'a') + "b";
  TextStream stream(tokenizer_.get(), {stop, "ab"});
  std::string out;
  for (int i = 0; i < 50000; ++i) out += stream.Add({'a'}).text;
  EXPECT_EQ(out, std::string(50000 - 4096, 'a'));
  EXPECT_EQ(stream.Finish(), std::string(4096, 'a'));
  EXPECT_FALSE(stream.stopped());

  TextStream stops(tokenizer_.get(), {stop});
  out.clear();
  for (int i = 0; i < 5000; ++i) out += stops.Add({'a'}).text;
  EXPECT_TRUE(stops.Add({'b'}).stopped);
  EXPECT_EQ(stops.emitted(), std::string(5000 - 4096, 'a'));
}

// The full decoded text cut at the first completed stop string, by a naive
// search; `*stop` is the stop string or "".
std::string NaiveTruncate(const std::string& full, const std::vector<std::string>& stops,
                          bool include, std::string* stop) {
  for (size_t end = 1; end <= full.size(); ++end) {
    size_t best = 0;
    for (const std::string& s : stops) {
      if (!s.empty() && s.size() <= end && full.compare(end - s.size(), s.size(), s) == 0) {
        best = std::max(best, s.size());
      }
    }
    if (best > 0) {
      *stop = full.substr(end - best, best);
      return full.substr(0, include ? end : end - best);
    }
  }
  stop->clear();
  return full;
}

TEST_F(TextStreamTest, RandomizedAgainstNaiveSearch) {
  // Units that build both the token stream and the stop strings, so that
  // matches and near-matches are frequent.
  const std::vector<std::string> units = {"a", "b", "c", " ", "\xC3\xA9", kWave};
  std::mt19937 rng(2024);
  int stopped_count = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<TokenId> ids;
    const int length = static_cast<int>(rng() % 40);
    for (int k = 0; k < length; ++k) {
      const uint32_t r = rng() % 20;
      if (r < 16) {
        for (TokenId id : Bytes(units[rng() % units.size()])) ids.push_back(id);
      } else if (r < 18) {
        ids.push_back(static_cast<TokenId>(0x80 + rng() % 0x80));  // stray byte
      } else {
        ids.push_back(static_cast<TokenId>(256 + rng() % 4));  // special
      }
    }
    std::vector<std::string> stops(rng() % 4);
    for (std::string& s : stops) {
      const int n = static_cast<int>(rng() % 4);  // 0: an ignored empty stop
      for (int k = 0; k < n; ++k) s += units[rng() % units.size()];
    }
    const bool include = rng() % 2;
    const bool skip_special = rng() % 3 != 0;

    IncrementalDecoder decoder(tokenizer_.get(), skip_special);
    std::string full = decoder.Add(ids);
    full += decoder.Finish();
    std::string expected_stop;
    const std::string expected = NaiveTruncate(full, stops, include, &expected_stop);
    // The stopping token: the first whose decoded prefix holds a stop string.
    int32_t expected_tokens = static_cast<int32_t>(ids.size());
    if (!expected_stop.empty()) {
      IncrementalDecoder prefix(tokenizer_.get(), skip_special);
      std::string text;
      for (size_t k = 0; k < ids.size(); ++k) {
        text += prefix.Add({ids[k]});
        std::string found;
        NaiveTruncate(text, stops, include, &found);
        if (!found.empty()) {
          expected_tokens = static_cast<int32_t>(k + 1);
          break;
        }
      }
      ++stopped_count;
    }

    for (int grouping = 0; grouping < 3; ++grouping) {  // one by one, random chunks, all at once
      TextStream stream(tokenizer_.get(), stops, include, skip_special);
      std::string out, stop;
      size_t i = 0;
      while (i < ids.size()) {
        const size_t n = grouping == 0 ? 1 : grouping == 2 ? ids.size() : 1 + rng() % 5;
        const TextDelta delta =
            stream.Add(absl::MakeConstSpan(ids).subspan(i, std::min(n, ids.size() - i)));
        EXPECT_TRUE(tokenizer_internal::IsValidUtf8(delta.text));
        out += delta.text;
        if (delta.stopped) stop = delta.stop;
        i += n;
      }
      out += stream.Finish();
      SCOPED_TRACE(::testing::Message() << "trial " << trial << " grouping " << grouping);
      EXPECT_EQ(out, expected);
      EXPECT_EQ(stream.emitted(), expected);
      EXPECT_EQ(stop, expected_stop);
      EXPECT_EQ(stream.stopped(), !expected_stop.empty());
      EXPECT_EQ(stream.num_tokens(), expected_tokens);
    }
  }
  EXPECT_GT(stopped_count, 1000);  // the test exercises stops, not just pass-through
  EXPECT_LT(stopped_count, 2900);
}

// Tokens are released (their logprobs may go out) with the delta that emits
// their last byte: held back by a possible stop string, inside a character,
// and cut by a stop string (never released).
TEST_F(TextStreamTest, ReleasesTokensWithTheirText) {
  {  // A stop string in the middle.
    TextStream stream(tokenizer_.get(), {"STOP"});
    std::vector<int32_t> released;
    for (std::string_view chunk : {"ab", "ST", "x", "S", "TO", "Pyz"}) {
      stream.Add(Bytes(chunk));
      released.push_back(stream.num_released());
    }
    EXPECT_THAT(released, ElementsAre(2, 2, 5, 5, 5, 5));
    EXPECT_EQ(stream.emitted(), "abSTx");
    EXPECT_EQ(stream.num_tokens(), 9);  // through the P
    EXPECT_EQ(stream.Finish(), "");
    EXPECT_EQ(stream.num_released(), 5);  // S, T, O, P were cut
  }
  {  // Included in the output, the stop string's tokens are released with it.
    TextStream stream(tokenizer_.get(), {"STOP"}, /*include_stop_in_output=*/true);
    stream.Add(Bytes("aSTOPb"));
    EXPECT_EQ(stream.num_released(), 5);
  }
  {  // A character split over four tokens: all four go with it.
    TextStream stream(tokenizer_.get(), {});
    std::vector<int32_t> released;
    for (TokenId id : Bytes(std::string("a") + kWave + "b")) {
      stream.Add({id});
      released.push_back(stream.num_released());
    }
    EXPECT_THAT(released, ElementsAre(1, 1, 1, 1, 5, 6));
  }
  {  // A token that ends inside a character is held with it, even after text of its own.
    TextStream stream(tokenizer_.get(), {"xyz"});
    EXPECT_EQ(stream.Add({'a'}).text, "a");
    EXPECT_EQ(stream.Add(Bytes("x\xF0\x9F")).text, "");
    EXPECT_EQ(stream.num_released(), 1);
    EXPECT_EQ(stream.Finish(), std::string("x") + kReplacement + kReplacement);
    EXPECT_EQ(stream.num_released(), 4);
  }
  {  // A skipped special token emits nothing and goes out with the text before it.
    TextStream stream(tokenizer_.get(), {});
    stream.Add({'h', 'i', tokenizer_test::kByteVocabImEnd});
    EXPECT_EQ(stream.num_released(), 3);
  }
}

// With one ASCII byte per token, the released tokens are exactly the emitted
// text, whatever the stop strings and however the tokens are grouped.
TEST_F(TextStreamTest, ReleasedTokensMatchEmittedTextRandomized) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text(rng() % 40, 'a');
    for (char& c : text) c = static_cast<char>('a' + rng() % 3);
    std::vector<std::string> stops(rng() % 3);
    for (std::string& stop : stops) {
      stop.resize(1 + rng() % 4);
      for (char& c : stop) c = static_cast<char>('a' + rng() % 3);
    }
    TextStream stream(tokenizer_.get(), stops, /*include_stop_in_output=*/rng() % 2);
    const std::vector<TokenId> ids = Bytes(text);
    for (size_t i = 0; i < ids.size();) {
      const size_t n = std::min<size_t>(1 + rng() % 4, ids.size() - i);
      stream.Add(absl::MakeConstSpan(ids).subspan(i, n));
      ASSERT_EQ(stream.num_released(), static_cast<int32_t>(stream.emitted().size())) << text;
      i += n;
    }
    stream.Finish();
    ASSERT_EQ(stream.num_released(), static_cast<int32_t>(stream.emitted().size())) << text;
  }
}

// The real SmolLM2 tokenizer splits an emoji over three byte-level tokens.
TEST(SmolLm2TextStreamTest, StopStringOnASplitEmoji) {
  const std::string path = tokenizer_test::SmolLm2Path();
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << path << " is absent; tools/setup.sh fetches it";
  auto tokenizer = LoadTokenizerFile(path);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();

  const std::string text = std::string("Hello ") + kWave + " world";
  const std::vector<TokenId> ids = (*tokenizer)->Encode(text, /*add_special=*/false);
  // The tokens that start and complete the emoji.
  size_t first = ids.size(), last = ids.size();
  for (size_t k = 1; k <= ids.size(); ++k) {
    const std::string prefix = (*tokenizer)->Decode(absl::MakeConstSpan(ids).first(k));
    if (first == ids.size() && prefix.find('\xF0') != std::string::npos) first = k - 1;
    if (prefix.find(kWave) != std::string::npos) {
      last = k - 1;
      break;
    }
  }
  ASSERT_LT(last, ids.size());
  EXPECT_LT(first, last) << "the emoji should span several tokens";
  {
    TextStream stream(tokenizer->get(), {});
    std::string out;
    for (TokenId id : ids) out += stream.Add({id}).text;
    EXPECT_EQ(out + stream.Finish(), text);
  }
  TextStream stream(tokenizer->get(), {kWave, "xyz"});
  for (TokenId id : ids) stream.Add({id});
  EXPECT_TRUE(stream.stopped());
  EXPECT_EQ(stream.emitted(), "Hello ");
  EXPECT_EQ(stream.num_tokens(), static_cast<int32_t>(last + 1));
}

}  // namespace
}  // namespace tandem::openai
