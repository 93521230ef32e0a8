// Prompt logprobs in the API's formats: vLLM's choice["prompt_logprobs"]
// (both endpoints) and the completions API's echo with logprobs (OpenAI's
// legacy form: the prompt's tokens first, the first with null). Pure.
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_PROMPT_LOGPROBS_JSON_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_PROMPT_LOGPROBS_JSON_H_

#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "scheduler/core/sampling_params.h"

namespace tandem::openai {

// null, then per scored prompt token {"<id>": {"logprob", "rank",
// "decoded_token"}} holding the token itself and its top alternatives.
nlohmann::json PromptLogprobsJson(const std::vector<scheduler::PromptTokenLogprob>& scores,
                                  const Tokenizer& tokenizer);

// `completion` (a legacy logprobs object: tokens, token_logprobs,
// top_logprobs, text_offset) with the prompt's tokens before its own: the
// first prompt token's logprob and top entries null, the others' from
// `scores` (top `top` of each, and the token itself), text offsets from the
// start of the prompt and the completion's moved past the prompt's text.
nlohmann::json EchoLogprobs(const std::vector<TokenId>& prompt,
                            const std::vector<scheduler::PromptTokenLogprob>& scores, int32_t top,
                            const Tokenizer& tokenizer, const nlohmann::json& completion);

}  // namespace tandem::openai

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_PROMPT_LOGPROBS_JSON_H_
