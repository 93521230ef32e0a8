// SpecialTokenMatcher: finds special-token strings (e.g. "<|im_start|>") in
// text, leftmost first and longest among those starting at the same byte,
// as Hugging Face's added-token pass does before pre-tokenization.
//
// Thread-safe after construction (immutable).
#ifndef TANDEM_COMMON_TOKENIZER_SPECIAL_TOKEN_MATCHER_H_
#define TANDEM_COMMON_TOKENIZER_SPECIAL_TOKEN_MATCHER_H_

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/types.h"

namespace tandem::tokenizer_internal {

class SpecialTokenMatcher {
 public:
  struct Match {
    size_t pos;
    size_t length;
    TokenId id;
  };

  // `tokens`: (text, id) pairs; empty texts are ignored, and of two equal
  // texts the first wins.
  explicit SpecialTokenMatcher(std::vector<std::pair<std::string, TokenId>> tokens);

  // The first special token at or after byte `from` of `text`, if any.
  std::optional<Match> FindNext(std::string_view text, size_t from) const;

 private:
  std::vector<std::pair<std::string, TokenId>> tokens_;
  // Indices into tokens_ by first byte, longest text first.
  std::array<std::vector<int32_t>, 256> by_first_byte_;
};

}  // namespace tandem::tokenizer_internal

#endif  // TANDEM_COMMON_TOKENIZER_SPECIAL_TOKEN_MATCHER_H_
