#include "worker/runner/prompt_logprobs.h"

#include "worker/backends/portable/raw_logprobs.h"

namespace tandem::worker {
namespace {

// One row: its target's logprob and rank, and the top k.
void ScoreRow(const float* l, int32_t vocab, TokenId target, int32_t k, std::vector<int32_t>* ids,
              v1::PromptLogprobs* out) {
  const double lse = sampling::LogSumExp(l, vocab);
  int32_t above = 0;
  for (int32_t t = 0; t < vocab; ++t) above += l[t] > l[target] ? 1 : 0;
  out->add_token_ids(target);
  out->add_logprobs(static_cast<float>(static_cast<double>(l[target]) - lse));
  out->add_ranks(1 + above);
  const int32_t top = sampling::TopLogitIds(l, vocab, k, ids);
  for (int32_t i = 0; i < top; ++i) {
    out->add_top_token_ids((*ids)[i]);
    out->add_top_logprobs(static_cast<float>(static_cast<double>(l[(*ids)[i]]) - lse));
  }
}

}  // namespace

void ScorePrompt(const float* logits, int32_t vocab, const PromptScores& scores, v1::PromptLogprobs* out) {
  out->set_row(scores.row);
  out->set_first_position(scores.first_position);
  out->set_num_top(std::min(scores.top, vocab));
  std::vector<int32_t> ids;
  for (size_t i = 0; i < scores.targets.size(); ++i) {
    const float* row = logits + (scores.first_logits_row + static_cast<int64_t>(i)) * vocab;
    ScoreRow(row, vocab, scores.targets[i], scores.top, &ids, out);
  }
}

}  // namespace tandem::worker
