// SampleLogits: turns one row of logits into a token, as the request's
// sampling options say. The CPU backend runs it for each sampling row; a GPU
// backend implements the same semantics on the device.
//
// Order of operations (as vLLM's sampler):
//  1. logprobs, if asked, come from the raw logits (log-softmax);
//  2. penalties over the request's own history, never placeholders:
//     repetition (prompt and output: positive logits divided, negative
//     multiplied), then frequency and presence (output only);
//  3. the grammar mask: disallowed tokens get -inf;
//  4. temperature 0: greedy argmax; otherwise divide by the temperature, keep
//     top-k, then min-p (relative to the most likely token), then top-p, and
//     draw. The draw is keyed by (rng_key, position) alone, so the same seed
//     gives the same tokens whatever else is in the batch.
//
// Thread-compatible: a SamplerScratch per thread.
#ifndef TANDEM_WORKER_BACKENDS_CPU_SAMPLER_H_
#define TANDEM_WORKER_BACKENDS_CPU_SAMPLER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "common/types.h"
#include "worker/backends/backend.h"

namespace tandem::worker {

// Per-thread buffers, reused across rows.
struct SamplerScratch {
  std::vector<float> values;
  std::vector<int32_t> indices;
  std::vector<uint32_t> stamp;   // marks tokens already penalized in this row
  std::vector<int32_t> counts;   // output-token counts for frequency penalties
  uint32_t stamp_value = 0;
};

struct SampledToken {
  TokenId token = 0;
  float logprob = 0.0f;                       // of the sampled token, raw logits
  std::vector<std::pair<TokenId, float>> top; // top-n raw logprobs, most likely first
};

// Samples one row. `logits` has `vocab` entries.
SampledToken SampleLogits(const float* logits, int32_t vocab, const SampleRow& row, SamplerScratch* scratch);

// A uniform draw in [0, 1) determined by (key, position).
double UniformDraw(uint64_t key, int32_t position);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_CPU_SAMPLER_H_
