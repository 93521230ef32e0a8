// The request fields that reach the worker's logits: OpenAI's logit_bias and
// vLLM's bad_words. Parsed with the rest of the request (openai_protocol.cc);
// checked against the vocabulary and tokenized once the tokenizer is at hand
// (openai_frontend.cc). Pure: no engine.
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_LOGITS_FIELDS_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_LOGITS_FIELDS_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace tandem::openai {

// OpenAI's limit on logit_bias entries.
inline constexpr int32_t kMaxLogitBias = 300;
inline constexpr double kMaxAbsLogitBias = 100.0;
// Ours: bad_words is vLLM's, which sets none.
inline constexpr int32_t kMaxBadWords = 256;

// logit_bias: an object {"<token id>": bias in [-100, 100]}, at most
// kMaxLogitBias entries. `v` null: absent. Fills `out` sorted by token id;
// returns the message of a 400 (param "logit_bias") otherwise.
std::optional<std::string> ParseLogitBias(const nlohmann::json* v, std::vector<std::pair<TokenId, float>>* out);

// bad_words: a list of at most kMaxBadWords non-blank strings.
std::optional<std::string> ParseBadWords(const nlohmann::json* v, std::vector<std::string>* out);

// The first logit_bias token outside the tokenizer's vocabulary, as a 400's
// message; nullopt when all are inside.
std::optional<std::string> CheckLogitBiasVocab(const std::vector<std::pair<TokenId, float>>& bias,
                                               const Tokenizer& tokenizer);

// Each bad word as vLLM tokenizes it: the word with its leading whitespace
// stripped, and again after one space (the form it takes inside a sentence)
// when that gives as many tokens with another first token. Without special
// tokens. Distinct sequences only.
std::vector<std::vector<TokenId>> TokenizeBadWords(const std::vector<std::string>& words, const Tokenizer& tokenizer);

}  // namespace tandem::openai

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_LOGITS_FIELDS_H_
