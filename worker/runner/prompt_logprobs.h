// Prompt logprobs (vLLM's prompt_logprobs, the completions API's echo with
// logprobs): the logits a step computes at a prompt position p score the
// prompt's token p + 1. The runner asks the model for those rows, copies
// them to the host with the step's sample, and the output thread scores them
// here when it serializes the step (ModelRunner, StepOutput::Serialize).
//
// Per scored token, from the raw logits l of its position, in double:
// logprob = l[token] - logsumexp(l); rank = 1 + the number of tokens with a
// larger logit (vLLM's rank: ties share the better one); the top k in the
// order (value descending, token id ascending), as the sampler's logprobs.
//
// Thread-compatible.
#ifndef TANDEM_WORKER_RUNNER_PROMPT_LOGPROBS_H_
#define TANDEM_WORKER_RUNNER_PROMPT_LOGPROBS_H_

#include <cstdint>
#include <vector>

#include "common/types.h"
#include "tandem/v1/step.pb.h"

namespace tandem::worker {

// The prompt positions of one request that one step scores.
struct PromptScores {
  int32_t row = 0;             // the request's row in the step
  int32_t first_position = 0;  // the position of the first scored row's logits
  int32_t top = 0;             // top-k alternatives per token
  std::vector<TokenId> targets;  // the prompt token each row scores (position + 1)
  int64_t first_logits_row = 0;  // its rows in the step's host copy of the logits
};

// Scores `scores.targets.size()` rows of `logits` ([rows, vocab], the
// first at scores.first_logits_row) into `out`.
void ScorePrompt(const float* logits, int32_t vocab, const PromptScores& scores, v1::PromptLogprobs* out);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_RUNNER_PROMPT_LOGPROBS_H_
