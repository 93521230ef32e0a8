// Sampling on the GPU: the rule of worker/backends/portable/sampling_rule.h
// (the CPU sampler's, worker/backends/cpu/sampler.h), one CTA per row, with
// every input and output in device memory; the sampled ids stay there for
// the next step's placeholder substitution.
//
// One CTA walks its row several times (no copy of the row is kept):
//   penalties   zero the row of penalty_counts, then count the history into
//               it with integer atomics (order-independent);
//   max         the largest penalized, masked value and the number of
//               candidates (greedy stops here: the argmax, lowest id on ties);
//   top-k       four radix levels of per-warp histograms of counts;
//   top-p       the integer mass of the kept set, then four radix levels of
//               per-warp histograms of masses;
//   draw        the Gumbel-max argmax over the allowed set;
//   logprobs    a log-sum-exp of the raw logits, a radix selection of the
//               n-th largest raw logit, the tokens above it and the lowest-id
//               ties at it, ranked by (value desc, id asc).
// Every reduction is over integers or in a fixed order, so a row's results
// are bitwise the same whatever the batch, the row's index and the run.
//
// Host launcher: no CUDA header here.
#ifndef TANDEM_WORKER_BACKENDS_CUDA_SAMPLING_H_
#define TANDEM_WORKER_BACKENDS_CUDA_SAMPLING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "worker/backends/backend.h"

struct CUstream_st;

namespace tandem::worker {

// The most top-n logprobs a row may ask for on the GPU (SampleParams::max_top;
// a CTA ranks them in shared memory). The OpenAI API allows 20.
inline constexpr int32_t kCudaMaxTopLogprobs = 1024;

// Enqueues the sampling of `p` on `stream`. InvalidArgument for bad sizes
// (vocab outside [1, 2^23], words_per_row too small, max_top above
// kCudaMaxTopLogprobs, a missing array). Rows are read on the device: a row
// whose history, counts, mask row or biases lie outside the arrays samples
// without that penalty, mask or bias, and a row asking for more top logprobs than max_top
// gets max_top (the CPU backend returns InvalidArgument for both).
absl::Status LaunchSampling(const SampleParams& p, CUstream_st* stream);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_CUDA_SAMPLING_H_
