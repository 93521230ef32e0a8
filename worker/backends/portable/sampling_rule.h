// The sampling rule: how one row of logits becomes a token, on the CPU
// (worker/backends/cpu/sampler.cc) and on the GPU (worker/backends/cuda/
// sampling.cu) alike. The per-element math is here, in host/device functions,
// so both backends compute the same numbers; both search thresholds with the
// same radix steps (PickDigit), so they find the same sets without sorting.
//
// The rule, for one row with logits l[0..V) and its SamplingOptions:
//
//  1. Logprobs, if asked (logprobs = n >= 0), come from the raw logits:
//     logprob(t) = l[t] - logsumexp(l). The top n are the n largest raw logits
//     in the order (value descending, token id ascending); slots beyond V are
//     id -1, logprob 0.
//  1b. Logit bias (OpenAI's logit_bias, and -inf for the tokens vLLM's
//     bad_words ban at this step): v[t] = l[t] + bias[t] in float, for the
//     row's listed tokens (RowBias); the rest keep l[t]. It comes before the
//     penalties, the mask and the temperature, as in vLLM, so a bias is in
//     logit units whatever the temperature, and a penalty sees the biased
//     value. The logprobs of step 1 stay those of the raw logits (vLLM's
//     default logprobs_mode, raw_logprobs): a client sees what the model
//     thinks, not what the bias made of it.
//  2. Penalties over the request's own history (never placeholders), in
//     float: repetition (when != 1 and > 0) on tokens in prompt or output,
//     once per distinct token: v > 0 ? v / r : v * r; then frequency and
//     presence on tokens of the output with count c > 0, once per distinct
//     token: v - (frequency * c + presence). See PenalizedLogit.
//  3. The grammar mask: a token whose bit is clear gets -inf. NaN logits are
//     -inf too. The candidates C are the tokens with v > -inf; when C is
//     empty the token is 0.
//  4. Greedy (temperature <= kGreedyTemperature, or NaN): the candidate with
//     the largest v, the lowest id on ties.
//  5. Otherwise, with vmax the largest v, in float with round-to-nearest
//     and no fused multiply-add:
//        inv_t = 1 / temperature,  d[t] = (v[t] - vmax) * inv_t,
//        e[t] = exp(d[t]) in (0, 1],  m[t] = floor(e[t] * 2^40) (an integer
//        "mass": sums of masses are exact, so every reduction is
//        order-independent and deterministic).
//     The allowed set A is C cut by three thresholds on v, each of which
//     keeps every token tied with the threshold value:
//      - top-k (0 < k < |C|): keep v >= the k-th largest v of C (counted
//        with multiplicity; vLLM keeps ties the same way);
//      - min-p (min_p > 0): keep e[t] >= min(min_p, 1);
//        K is C after top-k and min-p; S = sum of m over K;
//      - top-p (0 < top_p < 1): target = clamp(ceil(top_p * S), 1, S) in
//        double; keep v >= the largest value x of K whose kept mass
//        sum{m[t] : t in K, v[t] >= x} reaches target. That is the sorted
//        cumulative-probability cut of vLLM with ties at the cut kept, where
//        tokens with m = 0 (e < 2^-40 of the best) weigh nothing.
//     Thresholds are found by radix selection over OrderKey(v) (four levels
//     of 8 bits, PickDigit), never by sorting.
//  6. The draw is Gumbel-max: the token of A with the largest score
//        s[t] = double(d[t]) + G(key, position, t),
//     the lowest id on ties, where G is Gumbel noise computed from a
//     counter-based hash of (request key, position, token id) alone
//     (GumbelNoise). A token's score does not depend on any other row of
//     the batch, nor on the order in which a backend visits tokens, so a
//     seed gives the same tokens whatever the batch, and the same tokens on
//     the CPU and the GPU except where two quantities the backends compute
//     with different exp/log implementations (a few ulps apart) fall on
//     opposite sides of a comparison: a near-tie.
//
// Everything here compiles with the host compiler and nvcc (portable.h):
// no std:: containers, fixed-size types, explicit round-to-nearest on the
// device so that nvcc does not contract a * b + c into an FMA.
#ifndef TANDEM_WORKER_BACKENDS_PORTABLE_SAMPLING_RULE_H_
#define TANDEM_WORKER_BACKENDS_PORTABLE_SAMPLING_RULE_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "worker/backends/portable/portable.h"

namespace tandem::worker::sampling {

// Temperatures at or below this are greedy.
inline constexpr float kGreedyTemperature = 1e-5f;
// m[t] = floor(e[t] * kMassScale); with V <= kMaxVocab, sums fit in 63 bits.
inline constexpr float kMassScale = 1099511627776.0f;  // 2^40
inline constexpr int32_t kMaxVocab = 1 << 23;
// Radix selection: 4 levels of 8 bits over 32-bit order keys.
inline constexpr int32_t kRadixBits = 8;
inline constexpr int32_t kRadixBins = 1 << kRadixBits;
inline constexpr int32_t kRadixLevels = 32 / kRadixBits;
// Counts in the penalty scratch: bit 30 marks "in the prompt", the bits
// below count the token in the output.
inline constexpr uint32_t kInPromptBit = 1u << 30;
inline constexpr uint32_t kOutputCountMask = kInPromptBit - 1;

// --- float arithmetic that is the same on the host and the device ---

TANDEM_HD float SubRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
TANDEM_HD float MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TANDEM_HD float AddRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TANDEM_HD float DivRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
TANDEM_HD double DAddRn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
TANDEM_HD uint32_t FloatBits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
#endif
}
TANDEM_HD float BitsFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
#endif
}

// --- counter-based noise ---

// SplitMix64's finalizer (the same function as common/splitmix.h, which is
// host-only): a bijective scrambler with full avalanche.
TANDEM_HD uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The key of one row's draw: the request's key (its seed, scrambled) and the
// index of the token being sampled.
TANDEM_HD uint64_t NoiseRowKey(uint64_t rng_key, int32_t position) {
  return Mix64(rng_key ^ Mix64(static_cast<uint64_t>(static_cast<uint32_t>(position)) + 0x51ed27f3ULL));
}

// 64 random bits for `token`: output number token + 1 of the SplitMix64
// generator seeded with the row key.
TANDEM_HD uint64_t NoiseBits(uint64_t row_key, int32_t token) {
  return Mix64(row_key + static_cast<uint64_t>(static_cast<uint32_t>(token)) * 0x9e3779b97f4a7c15ULL);
}

// Uniform in the open interval (0, 1): 52 bits, centred in their cell, so
// neither 0 nor 1 (1 - 2^-53 is a double) can occur.
TANDEM_HD double NoiseUniform(uint64_t row_key, int32_t token) {
  return (static_cast<double>(NoiseBits(row_key, token) >> 12) + 0.5) * (1.0 / 4503599627370496.0);
}

// Standard Gumbel: -log(-log(u)), finite (in [-3.6, 36.8]).
TANDEM_HD double GumbelNoise(uint64_t row_key, int32_t token) {
  return -::log(-::log(NoiseUniform(row_key, token)));
}

// --- values, keys and masses ---

// An unsigned key with the order of the float values: key(a) < key(b) iff
// a < b; -0 and +0 share one key; NaN gets key 0, below -inf.
TANDEM_HD uint32_t OrderKey(float v) {
  if (v != v) return 0;
  if (v == 0.0f) v = 0.0f;
  const uint32_t bits = FloatBits(v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
TANDEM_HD float KeyValue(uint32_t key) {
  return BitsFloat((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

TANDEM_HD bool IsGreedy(float temperature) { return !(temperature > kGreedyTemperature); }

// Step 2 for one token: `logit` penalized by `counts` (kInPromptBit | output
// count, as the penalty scratch holds it).
TANDEM_HD float PenalizedLogit(float logit, uint32_t counts, float repetition, float frequency, float presence) {
  float v = logit;
  if (counts == 0) return v;
  if (repetition != 1.0f && repetition > 0.0f) v = v > 0.0f ? DivRn(v, repetition) : MulRn(v, repetition);
  const uint32_t in_output = counts & kOutputCountMask;
  if (in_output > 0 && (frequency != 0.0f || presence != 0.0f)) {
    v = SubRn(v, AddRn(MulRn(frequency, static_cast<float>(in_output)), presence));
  }
  return v;
}

// Step 1b: the bias of `token` among a row's `n` biases (`ids` ascending,
// unique), 0 when it has none. A binary search, so the GPU, which visits a
// row's tokens several times without a copy, reads it in O(log n).
TANDEM_HD float RowBias(const int32_t* ids, const float* biases, int32_t n, int32_t token) {
  int32_t lo = 0, hi = n;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (ids[mid] < token) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < n && ids[lo] == token ? biases[lo] : 0.0f;
}
TANDEM_HD float BiasedLogit(float logit, float bias) { return bias == 0.0f ? logit : AddRn(logit, bias); }

// Step 3: the bit of `token` in a grammar bitmask row (null: all allowed).
TANDEM_HD bool MaskAllows(const uint32_t* allowed, int32_t token) {
  return allowed == nullptr || ((allowed[token >> 5] >> (token & 31)) & 1u) != 0;
}

// v as the candidate test sees it: NaN and masked tokens become -inf.
TANDEM_HD float Candidate(float v, bool allowed) {
  return (allowed && v == v) ? v : -INFINITY;
}

TANDEM_HD float InverseTemperature(float temperature) { return DivRn(1.0f, temperature); }
TANDEM_HD float ScaledLogit(float v, float vmax, float inv_t) { return MulRn(SubRn(v, vmax), inv_t); }
TANDEM_HD float RelativeProb(float d) { return ::expf(d); }
TANDEM_HD uint64_t Mass(float e) { return static_cast<uint64_t>(MulRn(e, kMassScale)); }
TANDEM_HD float MinPThreshold(float min_p) { return min_p < 1.0f ? min_p : 1.0f; }
TANDEM_HD bool TopKActive(int32_t top_k, int32_t num_candidates) { return top_k > 0 && top_k < num_candidates; }
TANDEM_HD bool TopPActive(float top_p) { return top_p > 0.0f && top_p < 1.0f; }

// The mass the top-p set must reach, in [1, total].
TANDEM_HD uint64_t TopPTarget(float top_p, uint64_t total) {
#if defined(__CUDA_ARCH__)
  const double x = ::ceil(__dmul_rn(static_cast<double>(top_p), __ull2double_rn(total)));
#else
  const double x = std::ceil(static_cast<double>(top_p) * static_cast<double>(total));
#endif
  if (!(x >= 1.0)) return 1;
  if (x >= static_cast<double>(total)) return total;
  return static_cast<uint64_t>(x);
}

TANDEM_HD double GumbelScore(float d, uint64_t row_key, int32_t token) {
  return DAddRn(static_cast<double>(d), GumbelNoise(row_key, token));
}

// An exact shortcut for the draw, not part of the rule: a token whose
// d[t] < best - kPruneGap and whose uniform is below kPruneUniform has
// G < -log(-log(0.9996)) = 7.83 < kPruneGap, so its score is below `best`
// (by more than 0.17, far beyond rounding) and it cannot win; the two logs
// are skipped for it. `best` may be any score already reached (a running or
// thread-local best), so the argmax is unchanged. Most tokens of a row lie
// more than 8 below the winner, and 99.96% of them are skipped this way.
inline constexpr float kPruneGap = 8.0f;
inline constexpr double kPruneUniform = 0.9996;
TANDEM_HD bool CannotWin(float d, double best, uint64_t row_key, int32_t token) {
  return static_cast<double>(d) < best - kPruneGap && NoiseUniform(row_key, token) < kPruneUniform;
}

// The better of two (score, id) pairs: the larger score, the lower id on ties.
TANDEM_HD bool Beats(double score, int32_t id, double other_score, int32_t other_id) {
  return score > other_score || (score == other_score && id < other_id);
}
TANDEM_HD bool BeatsF(float value, int32_t id, float other_value, int32_t other_id) {
  return value > other_value || (value == other_value && id < other_id);
}

// --- radix selection ---
//
// Finds the largest key x such that W(x) = sum{w[t] : key[t] >= x} reaches
// `target` (0 < target <= total weight), 8 bits at a time from the top.
// Level L (0..3) looks at the tokens whose key agrees with the prefix found
// so far in its top 8 * L bits, builds a histogram of their weights by the
// next 8 bits, and PickDigit chooses the highest digit whose bins, with the
// weight already known to lie above the prefix, reach the target.

TANDEM_HD int32_t RadixShift(int32_t level) { return 32 - kRadixBits * (level + 1); }
TANDEM_HD bool RadixInPrefix(uint32_t key, uint32_t prefix, int32_t level) {
  return level == 0 || (key >> (RadixShift(level) + kRadixBits)) == (prefix >> (RadixShift(level) + kRadixBits));
}
TANDEM_HD uint32_t RadixDigit(uint32_t key, int32_t level) {
  return (key >> RadixShift(level)) & (kRadixBins - 1);
}

// `above` holds the weight of keys above the current prefix range; returns
// the digit and adds the weight of the bins above it to `above`. Returns 0
// (and a target that is not reached) only if the weights do not reach it,
// which callers rule out.
TANDEM_HD uint32_t PickDigit(const uint64_t* histogram, uint64_t target, uint64_t* above) {
  uint64_t sum = *above;
  for (int32_t d = kRadixBins - 1; d > 0; --d) {
    if (sum + histogram[d] >= target) {
      *above = sum;
      return static_cast<uint32_t>(d);
    }
    sum += histogram[d];
  }
  *above = sum;
  return 0;
}

}  // namespace tandem::worker::sampling

#endif  // TANDEM_WORKER_BACKENDS_PORTABLE_SAMPLING_RULE_H_
