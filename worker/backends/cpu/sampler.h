// SampleLogits: turns one row of logits into a token by the sampling rule of
// worker/backends/portable/sampling_rule.h (logprobs of the raw logits;
// penalties over the request's own history; the grammar mask; greedy argmax,
// or temperature, top-k, min-p and top-p found by threshold search and a
// Gumbel-max draw keyed by (rng_key, position, token)). The CPU backend runs
// it for each row; the CUDA backend runs the same rule on the device, and
// this is the reference its tests compare with.
//
// It also serves as the host model of the GPU kernel's decomposition: the
// thresholds are found by the same four radix levels (sampling::PickDigit)
// over the same order keys and integer masses.
//
// Thread-compatible: a SamplerScratch per thread.
#ifndef TANDEM_WORKER_BACKENDS_CPU_SAMPLER_H_
#define TANDEM_WORKER_BACKENDS_CPU_SAMPLER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/types.h"
#include "worker/backends/backend.h"

namespace tandem::worker {

// Per-thread buffers, reused across rows.
struct SamplerScratch {
  std::vector<float> values;       // penalized, masked logits of the row
  std::vector<float> probs;        // e[t] of the candidates
  std::vector<int32_t> ids;        // candidates, then the kept set
  std::vector<uint32_t> counts;    // penalty counts; all zero between rows
};

struct SampledToken {
  TokenId token = 0;
  float logprob = 0.0f;                       // of the sampled token, raw logits
  std::vector<std::pair<TokenId, float>> top; // top-n raw logprobs, most likely first
};

// The allowed set of a row that samples (not greedy): the candidates whose
// order key is >= key_cut and, when min-p is on, whose e[t] >= min_p.
struct SamplingSupport {
  int32_t num_candidates = 0;  // 0: no candidate, the token is 0
  float vmax = 0.0f;
  int32_t max_id = 0;          // the lowest id with value vmax
  float inv_t = 1.0f;
  uint32_t key_cut = 0;
  float min_p = 0.0f;          // 0: min-p off
  bool Allows(float v) const;  // v: the candidate's value (-inf: never)
};

// OK, or InvalidArgument naming what in `p` is inconsistent (sizes, a row
// pointing outside the history, the counts or the mask).
absl::Status ValidateSampleParams(const SampleParams& p);

// Samples row `r` of `p` (host memory). REQUIRES: ValidateSampleParams(p).
SampledToken SampleLogits(const SampleParams& p, int32_t r, SamplerScratch* scratch);

// The penalized, masked values of row `r` (steps 2 and 3 of the rule) into
// scratch->values[0, vocab).
void RowValues(const SampleParams& p, int32_t r, SamplerScratch* scratch);

// Steps 5's thresholds for values `v` (-inf: not a candidate) and `options`,
// by radix selection. REQUIRES: !IsGreedy(options.temperature).
SamplingSupport FindSupport(const float* v, int32_t vocab, const SamplingOptions& options, SamplerScratch* scratch);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_CPU_SAMPLER_H_
