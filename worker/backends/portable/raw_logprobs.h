// Logprobs of raw logits on the host: the sampler's (step 1 of
// sampling_rule.h) and the prompt scores' (worker/runner/prompt_logprobs.h)
// share these, so a token's logprob is the same number either way.
#ifndef TANDEM_WORKER_BACKENDS_PORTABLE_RAW_LOGPROBS_H_
#define TANDEM_WORKER_BACKENDS_PORTABLE_RAW_LOGPROBS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "worker/backends/portable/sampling_rule.h"

namespace tandem::worker::sampling {

// Log-sum-exp of the raw logits, in double (-inf when every logit is).
inline double LogSumExp(const float* v, int32_t n) {
  float max = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < n; ++i) max = std::max(max, v[i]);
  if (max == -std::numeric_limits<float>::infinity()) return max;
  double sum = 0;
  for (int32_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(v[i]) - static_cast<double>(max));
  return static_cast<double>(max) + std::log(sum);
}

// Puts the ids of the top min(n, vocab) logits first in *ids, by (value
// desc, id asc) under sampling_rule's OrderKey; returns how many.
inline int32_t TopLogitIds(const float* logits, int32_t vocab, int32_t n, std::vector<int32_t>* ids) {
  const int32_t top = std::min(n, vocab);
  ids->resize(vocab);
  for (int32_t t = 0; t < vocab; ++t) (*ids)[t] = t;
  std::partial_sort(ids->begin(), ids->begin() + top, ids->end(), [logits](int32_t a, int32_t b) {
    const uint32_t ka = OrderKey(logits[a]), kb = OrderKey(logits[b]);
    return ka > kb || (ka == kb && a < b);
  });
  return top;
}

}  // namespace tandem::worker::sampling

#endif  // TANDEM_WORKER_BACKENDS_PORTABLE_RAW_LOGPROBS_H_
