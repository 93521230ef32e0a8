#include "scheduler/server/openai/logits_fields.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tandem::openai {

std::optional<std::string> ParseLogitBias(const nlohmann::json* v, std::vector<std::pair<TokenId, float>>* out) {
  out->clear();
  if (v == nullptr) return std::nullopt;
  if (!v->is_object()) return "'logit_bias' must be an object mapping token ids to biases";
  if (v->size() > static_cast<size_t>(kMaxLogitBias)) {
    return absl::StrCat("'logit_bias' may have at most ", kMaxLogitBias, " entries; got ", v->size());
  }
  for (const auto& [key, value] : v->items()) {
    TokenId id = -1;
    const char* end = key.data() + key.size();
    const auto [ptr, ec] = std::from_chars(key.data(), end, id);
    if (key.empty() || ec != std::errc() || ptr != end || id < 0) {
      return absl::StrCat("'logit_bias' keys must be token ids (non-negative integers); got \"", key, "\"");
    }
    if (!value.is_number() || !std::isfinite(value.get<double>()) ||
        std::fabs(value.get<double>()) > kMaxAbsLogitBias) {
      return absl::StrCat("'logit_bias' values must be numbers between -100 and 100; token ", key, " has ",
                          value.dump());
    }
    out->emplace_back(id, static_cast<float>(value.get<double>()));
  }
  std::sort(out->begin(), out->end());
  // "7" and "007" name one token: a client's ambiguity, refused.
  for (size_t i = 1; i < out->size(); ++i) {
    if ((*out)[i].first == (*out)[i - 1].first) {
      return absl::StrCat("'logit_bias' names token ", (*out)[i].first, " twice");
    }
  }
  return std::nullopt;
}

std::optional<std::string> ParseBadWords(const nlohmann::json* v, std::vector<std::string>* out) {
  out->clear();
  if (v == nullptr) return std::nullopt;
  if (!v->is_array()) return "'bad_words' must be a list of strings";
  if (v->size() > static_cast<size_t>(kMaxBadWords)) {
    return absl::StrCat("'bad_words' may have at most ", kMaxBadWords, " words; got ", v->size());
  }
  for (const nlohmann::json& word : *v) {
    if (!word.is_string()) return "'bad_words' must be a list of strings";
    if (absl::StripAsciiWhitespace(word.get<std::string>()).empty()) return "'bad_words' entries must not be blank";
    out->push_back(word.get<std::string>());
  }
  return std::nullopt;
}

std::optional<std::string> CheckLogitBiasVocab(const std::vector<std::pair<TokenId, float>>& bias,
                                               const Tokenizer& tokenizer) {
  for (const auto& [id, value] : bias) {
    if (id >= tokenizer.vocab_size()) {
      return absl::StrCat("'logit_bias' names token ", id, ", outside the vocabulary (", tokenizer.vocab_size(),
                          " tokens)");
    }
  }
  return std::nullopt;
}

std::vector<std::vector<TokenId>> TokenizeBadWords(const std::vector<std::string>& words, const Tokenizer& tokenizer) {
  std::vector<std::vector<TokenId>> out;
  auto add = [&out](std::vector<TokenId> ids) {
    if (!ids.empty() && std::find(out.begin(), out.end(), ids) == out.end()) out.push_back(std::move(ids));
  };
  for (const std::string& word : words) {
    const std::string bare(absl::StripLeadingAsciiWhitespace(word));
    std::vector<TokenId> plain = tokenizer.Encode(bare, /*add_special=*/false, /*parse_special=*/false);
    std::vector<TokenId> spaced = tokenizer.Encode(" " + bare, /*add_special=*/false, /*parse_special=*/false);
    // The spaced form counts when it is another spelling of the same word
    // (same length, other first token), not the space as a token of its own.
    const bool spaced_differs = !plain.empty() && spaced.size() == plain.size() && spaced.front() != plain.front();
    add(std::move(plain));
    if (spaced_differs) add(std::move(spaced));
  }
  return out;
}

}  // namespace tandem::openai
