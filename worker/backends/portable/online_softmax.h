// Online softmax (Milakov & Gimelshein 2018; FlashAttention's running
// rescale): the softmax-weighted sum of values over scores seen a block at a
// time, and the merge of two such partial results (flash-decoding's split of
// the context). The paged-attention kernels and their host model
// (attention_model.h) call exactly these functions, so online_softmax_test
// checks the arithmetic the GPU runs.
//
// A partial result over scores s_j and value rows v_j is
//   state.max = max_j s_j,  state.sum = sum_j exp(s_j - max),
//   acc[i]    = sum_j exp(s_j - max) * v_j[i]   (unnormalized),
// and the output is acc * SoftmaxInvSum(state). The accumulator is the
// caller's (on the GPU each lane holds a slice of it in registers), so these
// functions return the factors by which the caller rescales it.
//
// Masked scores are -inf: their weight is exactly 0 and they never produce a
// NaN, even when every score seen so far is masked (max -inf). An empty or
// fully masked state has max -inf, sum 0, acc 0, and its output is 0.
#ifndef TANDEM_WORKER_BACKENDS_PORTABLE_ONLINE_SOFTMAX_H_
#define TANDEM_WORKER_BACKENDS_PORTABLE_ONLINE_SOFTMAX_H_

#include <math.h>

#include "worker/backends/portable/portable.h"

// Full unrolling on the device keeps a lane's arrays in registers; the host
// compiler (also nvcc's host pass) knows no such pragma.
#if defined(__CUDA_ARCH__)
#define TANDEM_SOFTMAX_UNROLL _Pragma("unroll")
#else
#define TANDEM_SOFTMAX_UNROLL
#endif

namespace tandem::worker {

struct SoftmaxState {
  float max;  // the largest score seen, -inf when none (or all masked)
  float sum;  // sum of exp(score - max) over the scores seen
};

TANDEM_HD SoftmaxState EmptySoftmaxState() { return SoftmaxState{-INFINITY, 0.0f}; }

// exp(score - max): 0 for a masked score, including when max is -inf too
// (exp(-inf - -inf) would be NaN).
TANDEM_HD float SoftmaxWeight(float score, float max) {
  return score == -INFINITY ? 0.0f : expf(score - max);
}

// The factor exp(old_max - new_max) that moves sums taken under old_max to
// new_max (new_max >= old_max); 0 when nothing was seen under old_max.
TANDEM_HD float SoftmaxRescale(float old_max, float new_max) {
  return old_max == -INFINITY ? 0.0f : expf(old_max - new_max);
}

// Folds a block of kN scores (masked ones -inf) into `s`: writes their
// weights under the new max to `weights` and returns the factor the caller
// must apply to its accumulator before adding sum_j weights[j] * v_j
// (SoftmaxAccumulate). Sums in j order.
template <int kN>
TANDEM_HD float SoftmaxUpdate(SoftmaxState* s, const float (&scores)[kN], float (&weights)[kN]) {
  float block_max = -INFINITY;
  TANDEM_SOFTMAX_UNROLL
  for (int j = 0; j < kN; ++j) block_max = fmaxf(block_max, scores[j]);
  const float new_max = fmaxf(s->max, block_max);
  const float factor = SoftmaxRescale(s->max, new_max);
  float block_sum = 0.0f;
  TANDEM_SOFTMAX_UNROLL
  for (int j = 0; j < kN; ++j) {
    weights[j] = SoftmaxWeight(scores[j], new_max);
    block_sum += weights[j];
  }
  s->max = new_max;
  s->sum = s->sum * factor + block_sum;
  return factor;
}

// acc[i] = acc[i] * factor + sum_j weights[j] * values[j][i], in j order:
// the accumulator side of SoftmaxUpdate for kDims elements of each value row
// (a lane's slice on the GPU, the whole row in the host model; each element's
// arithmetic is the same either way). A masked row must hold finite values
// (the kernels load zeros there): its weight is 0, but 0 * inf is NaN.
template <int kN, int kDims>
TANDEM_HD void SoftmaxAccumulate(float (&acc)[kDims], float factor, const float (&weights)[kN],
                                 const float (&values)[kN][kDims]) {
  TANDEM_SOFTMAX_UNROLL
  for (int i = 0; i < kDims; ++i) {
    float a = acc[i] * factor;
    TANDEM_SOFTMAX_UNROLL
    for (int j = 0; j < kN; ++j) a += weights[j] * values[j][i];
    acc[i] = a;
  }
}

// The merge of two partial results: returns the state over both and sets the
// factors with which to combine their accumulators,
// acc = acc_a * *factor_a + acc_b * *factor_b. Either side may be empty.
TANDEM_HD SoftmaxState SoftmaxMerge(SoftmaxState a, SoftmaxState b, float* factor_a, float* factor_b) {
  SoftmaxState m;
  m.max = fmaxf(a.max, b.max);
  *factor_a = SoftmaxRescale(a.max, m.max);
  *factor_b = SoftmaxRescale(b.max, m.max);
  m.sum = a.sum * *factor_a + b.sum * *factor_b;
  return m;
}

// What multiplies the accumulator to give the output: 1 / sum, and 0 for an
// empty or fully masked state (whose accumulator is 0: the output is 0, as
// the CPU backend writes for a query that sees no key).
TANDEM_HD float SoftmaxInvSum(SoftmaxState s) { return s.sum > 0.0f ? 1.0f / s.sum : 0.0f; }

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_PORTABLE_ONLINE_SOFTMAX_H_
