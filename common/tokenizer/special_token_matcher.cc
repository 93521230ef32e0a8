#include "common/tokenizer/special_token_matcher.h"

#include <algorithm>
#include <cstdint>

namespace tandem::tokenizer_internal {

SpecialTokenMatcher::SpecialTokenMatcher(std::vector<std::pair<std::string, TokenId>> tokens)
    : tokens_(std::move(tokens)) {
  for (int32_t i = 0; i < static_cast<int32_t>(tokens_.size()); ++i) {
    if (tokens_[i].first.empty()) continue;
    by_first_byte_[static_cast<uint8_t>(tokens_[i].first[0])].push_back(i);
  }
  for (auto& candidates : by_first_byte_) {
    // Longest first; a stable sort keeps the first of equal texts ahead.
    std::stable_sort(candidates.begin(), candidates.end(), [this](int32_t a, int32_t b) {
      return tokens_[a].first.size() > tokens_[b].first.size();
    });
  }
}

std::optional<SpecialTokenMatcher::Match> SpecialTokenMatcher::FindNext(std::string_view text,
                                                                        size_t from) const {
  if (tokens_.empty()) return std::nullopt;
  for (size_t pos = from; pos < text.size(); ++pos) {
    const auto& candidates = by_first_byte_[static_cast<uint8_t>(text[pos])];
    for (int32_t i : candidates) {
      const std::string& token = tokens_[i].first;
      if (text.compare(pos, token.size(), token) == 0) {
        return Match{pos, token.size(), tokens_[i].second};
      }
    }
  }
  return std::nullopt;
}

}  // namespace tandem::tokenizer_internal
