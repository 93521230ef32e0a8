// What a request asks of generation. The scheduler reads the stop conditions
// (max_tokens, min_tokens, EOS, stop ids); the rest travels to the worker in
// NewRequest and is applied by its sampler.
#ifndef TANDEM_SCHEDULER_CORE_SAMPLING_PARAMS_H_
#define TANDEM_SCHEDULER_CORE_SAMPLING_PARAMS_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "common/types.h"

namespace tandem::scheduler {

struct SamplingParams {
  // --- stop conditions (scheduler) ---
  int32_t max_tokens = 16;
  int32_t min_tokens = 0;
  std::optional<TokenId> eos_token_id;  // the model's EOS; ignored with ignore_eos
  bool ignore_eos = false;
  std::vector<TokenId> stop_token_ids;

  // --- sampling (worker) ---
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::optional<uint64_t> seed;
  int32_t logprobs = -1;  // -1: none; n >= 0: sampled token plus top-n
  // OpenAI's logit_bias: (token, bias) sorted by token, unique, bias in
  // [-100, 100]; the worker adds it to the raw logit before penalties.
  std::vector<std::pair<TokenId, float>> logit_bias;
  // vLLM's bad_words as token sequences (each non-empty): the worker bans the
  // last token of each whose other tokens end the generated output.
  std::vector<std::vector<TokenId>> bad_words_token_ids;
  // vLLM's prompt_logprobs: -1 none; k >= 0 each prompt token's logprob,
  // rank and top k. Such a request does not read the prefix cache (cached
  // positions have no logits).
  int32_t prompt_logprobs = -1;
};

// The logprob of one prompt token, from the logits of the position before it.
struct PromptTokenLogprob {
  TokenId token = 0;
  float logprob = 0.0f;
  int32_t rank = 0;                            // 1 + tokens with a larger logit
  std::vector<std::pair<TokenId, float>> top;  // top-k (id, logprob), most likely first
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_CORE_SAMPLING_PARAMS_H_
