// PreTokenizer: splits text into the words that BPE merges within, as
// Hugging Face's ByteLevel pre-tokenizer (use_regex) does with the GPT-2
// pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// "smollm" first isolates every \p{N} character (HF's Digits with
// individual_digits), then splits each remaining piece by that pattern.
//
// \s is Oniguruma's Unicode \s (what HF uses): \t \n \v \f \r, U+0085 and
// the Z categories; not RE2's ASCII \s, and not U+001C..U+001F.
//
// Thread-safe after Create (immutable).
#ifndef TANDEM_COMMON_TOKENIZER_PRE_TOKENIZER_H_
#define TANDEM_COMMON_TOKENIZER_PRE_TOKENIZER_H_

#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace re2 {
class RE2;
}  // namespace re2

namespace tandem::tokenizer_internal {

// Whether `cp` is whitespace in the GPT-2 pattern's sense (see above).
bool IsPatternWhitespace(char32_t cp);

class PreTokenizer {
 public:
  // `pre` is tokenizer.ggml.pre: "gpt2" or "default" (the GPT-2 pattern) or
  // "smollm" (digits first). Anything else is Unimplemented, naming it.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(std::string_view pre);
  ~PreTokenizer();

  // Appends the words of `text` to `words`: non-empty views into `text` that
  // concatenate to it. A byte that is not valid UTF-8 becomes a word of its
  // own (HF never sees one; this keeps Encode total).
  void Split(std::string_view text, std::vector<std::string_view>* words) const;

 private:
  PreTokenizer(bool split_digits, std::unique_ptr<re2::RE2> word, std::unique_ptr<re2::RE2> digit);
  // The GPT-2 pattern on one piece (a digit-free span for "smollm").
  void SplitPiece(std::string_view piece, std::vector<std::string_view>* words) const;

  const bool split_digits_;
  // The GPT-2 pattern without `\s+(?!\S)`: RE2 has no lookahead, so
  // SplitPiece applies that rule by hand.
  const std::unique_ptr<re2::RE2> word_;
  const std::unique_ptr<re2::RE2> digit_;  // \p{N}
};

}  // namespace tandem::tokenizer_internal

#endif  // TANDEM_COMMON_TOKENIZER_PRE_TOKENIZER_H_
