// Kernel of sampling.h: one CTA of kThreads threads per row. Every thread
// runs every loop and every barrier (row-level decisions are uniform: they
// depend on the row's parameters or on values every thread holds after an
// all-reduce), so no barrier is ever skipped by part of the CTA.
#include "worker/backends/cuda/sampling.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/backends/portable/sampling_rule.h"

namespace tandem::worker {
namespace {

namespace sr = sampling;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int32_t kNoToken = std::numeric_limits<int32_t>::max();
constexpr unsigned kFullMask = 0xffffffffu;

// A (score, id) pair and the rule's order on it: the larger score, then the
// lower id. The order is total, so max-reductions in any shape agree.
struct Best {
  double score;
  int32_t id;
};

__device__ Best BetterOf(Best a, Best b) { return sr::Beats(b.score, b.id, a.score, a.id) ? b : a; }

// Top-n entries collected in shared memory.
struct TopEntry {
  uint32_t key;
  int32_t id;
};

// Shared memory of one CTA (about 19 KiB, plus the top-n list).
struct Shared {
  unsigned long long histogram[kWarps][sr::kRadixBins];  // per-warp radix histograms
  uint64_t merged[sr::kRadixBins];
  uint32_t prefix;                                       // radix selection state
  uint64_t above;
  double reduce_score[kWarps];
  int32_t reduce_id[kWarps];
  unsigned long long reduce_u64[kWarps];
  double reduce_f64[kWarps];
  uint32_t warp_count[kWarps];
  uint32_t collected;
};

// --- all-reductions: every thread gets the same result ---
//
// A butterfly within the warp exchanges the same two operands at each step
// on both lanes, so even floating-point sums agree across lanes; the warps'
// partials are then folded in warp order by every thread.

__device__ Best AllReduceBest(Best v, Shared& sh) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    Best other;
    other.score = __shfl_xor_sync(kFullMask, v.score, offset);
    other.id = __shfl_xor_sync(kFullMask, v.id, offset);
    v = BetterOf(v, other);
  }
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) {
    sh.reduce_score[warp] = v.score;
    sh.reduce_id[warp] = v.id;
  }
  __syncthreads();
  Best result{sh.reduce_score[0], sh.reduce_id[0]};
  for (int w = 1; w < kWarps; ++w) result = BetterOf(result, Best{sh.reduce_score[w], sh.reduce_id[w]});
  __syncthreads();
  return result;
}

__device__ unsigned long long AllReduceSum(unsigned long long v, Shared& sh) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  if (threadIdx.x % 32 == 0) sh.reduce_u64[threadIdx.x / 32] = v;
  __syncthreads();
  unsigned long long result = 0;
  for (int w = 0; w < kWarps; ++w) result += sh.reduce_u64[w];
  __syncthreads();
  return result;
}

__device__ double AllReduceSum(double v, Shared& sh) {
  for (int offset = 16; offset > 0; offset >>= 1) v = __dadd_rn(v, __shfl_xor_sync(kFullMask, v, offset));
  if (threadIdx.x % 32 == 0) sh.reduce_f64[threadIdx.x / 32] = v;
  __syncthreads();
  double result = sh.reduce_f64[0];
  for (int w = 1; w < kWarps; ++w) result = __dadd_rn(result, sh.reduce_f64[w]);
  __syncthreads();
  return result;
}

__device__ float AllReduceMax(float v, Shared& sh) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  if (threadIdx.x % 32 == 0) sh.reduce_f64[threadIdx.x / 32] = v;
  __syncthreads();
  float result = static_cast<float>(sh.reduce_f64[0]);
  for (int w = 1; w < kWarps; ++w) result = fmaxf(result, static_cast<float>(sh.reduce_f64[w]));
  __syncthreads();
  return result;
}

// The largest key x with sum{weight(t) : key(t) >= x} >= target, over
// tokens [0, vocab): sampling_rule.h's radix selection, as the CPU sampler's
// RadixSelect. `entry(t, &key, &weight)` gives a token's key and weight (0:
// not counted). Returns x; *above is the weight of keys > x.
// REQUIRES: 0 < target <= the total weight; called by every thread.
template <typename Entry>
__device__ uint32_t RadixSelect(int32_t vocab, Entry entry, unsigned long long target, Shared& sh,
                                unsigned long long* above) {
  unsigned long long* flat = &sh.histogram[0][0];
  const int warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    sh.prefix = 0;
    sh.above = 0;
  }
  for (int32_t level = 0; level < sr::kRadixLevels; ++level) {
    for (int i = threadIdx.x; i < kWarps * sr::kRadixBins; i += kThreads) flat[i] = 0;
    __syncthreads();
    const uint32_t prefix = sh.prefix;
    for (int32_t t = threadIdx.x; t < vocab; t += kThreads) {
      uint32_t key;
      unsigned long long weight;
      entry(t, &key, &weight);
      if (weight == 0 || !sr::RadixInPrefix(key, prefix, level)) continue;
      atomicAdd(&sh.histogram[warp][sr::RadixDigit(key, level)], weight);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < sr::kRadixBins; b += kThreads) {
      uint64_t sum = 0;
      for (int w = 0; w < kWarps; ++w) sum += sh.histogram[w][b];
      sh.merged[b] = sum;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t a = sh.above;
      const uint32_t digit = sr::PickDigit(sh.merged, target, &a);
      sh.above = a;
      sh.prefix = prefix | (digit << sr::RadixShift(level));
    }
    __syncthreads();
  }
  const uint32_t result = sh.prefix;
  *above = sh.above;
  __syncthreads();  // sh.prefix and sh.above may be reused
  return result;
}

// What one row reads: its parameters, its slice of each array, validated.
struct RowInputs {
  const float* logits;
  const uint32_t* counts;   // null: no penalties
  const TokenId* prompt;
  const uint32_t* mask;     // null: no mask
  const TokenId* bias_ids;  // bias_len entries, ascending
  const float* biases;
  int32_t bias_len;
  SamplingOptions o;
  int32_t vocab;

  __device__ float Value(int32_t t) const {
    const float l = bias_len > 0 ? sr::BiasedLogit(logits[t], sr::RowBias(bias_ids, biases, bias_len, t)) : logits[t];
    const float v = counts != nullptr ? sr::PenalizedLogit(l, counts[t], o.repetition_penalty, o.frequency_penalty,
                                                           o.presence_penalty)
                                      : l;
    return sr::Candidate(v, sr::MaskAllows(mask, t));
  }
};

// Counts the row's history into its (zeroed) row of the counts scratch.
__device__ void CountHistory(uint32_t* counts, const TokenId* prompt, int32_t prompt_len, int32_t output_len,
                             int32_t vocab) {
  for (int32_t t = threadIdx.x; t < vocab; t += kThreads) counts[t] = 0;
  __syncthreads();
  for (int32_t i = threadIdx.x; i < prompt_len; i += kThreads) {
    const TokenId t = prompt[i];
    if (t >= 0 && t < vocab) atomicOr(&counts[t], sr::kInPromptBit);
  }
  const TokenId* output = prompt + prompt_len;
  for (int32_t i = threadIdx.x; i < output_len; i += kThreads) {
    const TokenId t = output[i];
    if (t >= 0 && t < vocab) atomicAdd(&counts[t], 1u);
  }
  __syncthreads();
}

// Step 5 and 6: the sampled token of a row that is not greedy.
__device__ int32_t Draw(const RowInputs& in, float vmax, int32_t max_id, int32_t num_candidates, uint64_t row_key,
                        Shared& sh) {
  const SamplingOptions& o = in.o;
  const float inv_t = sr::InverseTemperature(o.temperature);
  const float min_p = o.min_p > 0.0f ? sr::MinPThreshold(o.min_p) : 0.0f;
  uint32_t key_cut = 0;
  unsigned long long above;
  if (sr::TopKActive(o.top_k, num_candidates)) {
    key_cut = RadixSelect(
        in.vocab,
        [&](int32_t t, uint32_t* key, unsigned long long* weight) {
          const float v = in.Value(t);
          *key = sr::OrderKey(v);
          *weight = v > -INFINITY ? 1 : 0;
        },
        static_cast<unsigned long long>(o.top_k), sh, &above);
  }
  // K: candidates that top-k and min-p keep, with their masses.
  auto kept_mass = [&](int32_t t, uint32_t* key, unsigned long long* weight) {
    const float v = in.Value(t);
    *key = sr::OrderKey(v);
    *weight = 0;
    if (!(v > -INFINITY) || *key < key_cut) return;
    const float e = sr::RelativeProb(sr::ScaledLogit(v, vmax, inv_t));
    if (min_p > 0.0f && e < min_p) return;
    *weight = sr::Mass(e);
  };
  if (sr::TopPActive(o.top_p)) {
    unsigned long long total = 0;
    for (int32_t t = threadIdx.x; t < in.vocab; t += kThreads) {
      uint32_t key;
      unsigned long long weight;
      kept_mass(t, &key, &weight);
      total += weight;
    }
    total = AllReduceSum(total, sh);
    key_cut = RadixSelect(in.vocab, kept_mass, sr::TopPTarget(o.top_p, total), sh, &above);
  }
  // Every thread starts from the best value's token (always allowed), so
  // that sampling::CannotWin skips most tokens without their logs.
  Best best{sr::GumbelScore(sr::ScaledLogit(vmax, vmax, inv_t), row_key, max_id), max_id};
  for (int32_t t = threadIdx.x; t < in.vocab; t += kThreads) {
    const float v = in.Value(t);
    if (t == max_id || !(v > -INFINITY) || sr::OrderKey(v) < key_cut) continue;
    const float d = sr::ScaledLogit(v, vmax, inv_t);
    if (min_p > 0.0f && sr::RelativeProb(d) < min_p) continue;
    if (sr::CannotWin(d, best.score, row_key, t)) continue;
    best = BetterOf(best, Best{sr::GumbelScore(d, row_key, t), t});
  }
  return AllReduceBest(best, sh).id;
}

// Step 1: the sampled token's raw logprob and the top n (n <= max_top) into
// the row's outputs, padded to max_top.
__device__ void Logprobs(const float* logits, int32_t vocab, int32_t token, int32_t n, int32_t max_top, float* lp,
                         TokenId* top_ids, TopEntry* list, Shared& sh) {
  if (n < 0) {
    for (int32_t i = threadIdx.x; i <= max_top; i += kThreads) {
      lp[i] = 0.0f;
      if (i < max_top) top_ids[i] = -1;
    }
    return;
  }
  float max = -INFINITY;
  for (int32_t t = threadIdx.x; t < vocab; t += kThreads) max = fmaxf(max, logits[t]);
  max = AllReduceMax(max, sh);
  double sum = 0.0;
  for (int32_t t = threadIdx.x; t < vocab; t += kThreads) {
    sum = __dadd_rn(sum, exp(static_cast<double>(logits[t]) - static_cast<double>(max)));
  }
  sum = AllReduceSum(sum, sh);
  const double lse = max == -INFINITY ? static_cast<double>(max) : static_cast<double>(max) + log(sum);
  if (threadIdx.x == 0) lp[0] = static_cast<float>(static_cast<double>(logits[token]) - lse);
  const int32_t top = n < vocab ? n : vocab;
  if (top > 0) {
    // The top-th largest raw key; the tokens above it, then the lowest-id ties.
    unsigned long long above = 0;
    const uint32_t cut = RadixSelect(
        vocab,
        [&](int32_t t, uint32_t* key, unsigned long long* weight) {
          *key = sr::OrderKey(logits[t]);
          *weight = 1;
        },
        static_cast<unsigned long long>(top), sh, &above);
    if (threadIdx.x == 0) sh.collected = 0;
    __syncthreads();
    for (int32_t t = threadIdx.x; t < vocab; t += kThreads) {
      const uint32_t key = sr::OrderKey(logits[t]);
      if (key <= cut) continue;
      const uint32_t i = atomicAdd(&sh.collected, 1u);
      if (i < static_cast<uint32_t>(top)) list[i] = TopEntry{key, t};
    }
    const int32_t need = top - static_cast<int32_t>(above);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int32_t found = 0;
    for (int32_t base = 0; base < vocab && found < need; base += kThreads) {
      const int32_t t = base + threadIdx.x;
      const bool tie = t < vocab && sr::OrderKey(logits[t]) == cut;
      const unsigned ballot = __ballot_sync(kFullMask, tie);
      if (lane == 0) sh.warp_count[warp] = __popc(ballot);
      __syncthreads();
      int32_t offset = 0, total = 0;
      for (int w = 0; w < kWarps; ++w) {
        if (w < warp) offset += sh.warp_count[w];
        total += sh.warp_count[w];
      }
      __syncthreads();
      const int32_t rank = found + offset + __popc(ballot & ((1u << lane) - 1u));
      if (tie && rank < need) list[static_cast<int32_t>(above) + rank] = TopEntry{cut, t};
      found += total;
    }
    __syncthreads();
    // Each entry's place in (key desc, id asc) order.
    for (int32_t i = threadIdx.x; i < top; i += kThreads) {
      const TopEntry e = list[i];
      int32_t place = 0;
      for (int32_t j = 0; j < top; ++j) {
        const TopEntry f = list[j];
        place += (f.key > e.key || (f.key == e.key && f.id < e.id)) ? 1 : 0;
      }
      top_ids[place] = e.id;
      lp[1 + place] = static_cast<float>(static_cast<double>(logits[e.id]) - lse);
    }
  }
  for (int32_t i = top + threadIdx.x; i < max_top; i += kThreads) {
    top_ids[i] = -1;
    lp[1 + i] = 0.0f;
  }
}

__global__ void __launch_bounds__(kThreads) SampleKernel(SampleParams p) {
  __shared__ Shared sh;
  extern __shared__ TopEntry list[];  // [max_top]
  const int32_t r = blockIdx.x;
  const SampleRow row = p.rows[r];
  const int32_t vocab = p.vocab;
  RowInputs in;
  in.logits = p.logits + static_cast<int64_t>(r) * vocab;
  in.o = row.options;
  in.vocab = vocab;
  in.counts = nullptr;
  in.prompt = nullptr;
  in.mask = nullptr;
  in.bias_ids = nullptr;
  in.biases = nullptr;
  in.bias_len = 0;
  if (row.bias_len > 0 && row.bias_start >= 0 && row.bias_start + row.bias_len <= p.num_bias && p.bias_ids != nullptr &&
      p.bias_values != nullptr) {
    in.bias_ids = p.bias_ids + row.bias_start;
    in.biases = p.bias_values + row.bias_start;
    in.bias_len = row.bias_len;
  }
  const bool penalties = row.penalty_row >= 0 && row.penalty_row < p.num_penalty_rows && p.penalty_counts != nullptr &&
                         p.history != nullptr && row.prompt_len >= 0 && row.output_len >= 0 &&
                         row.history_start >= 0 &&
                         row.history_start + row.prompt_len + row.output_len <= p.history_len;
  if (penalties) {
    uint32_t* counts = p.penalty_counts + static_cast<int64_t>(row.penalty_row) * vocab;
    in.prompt = p.history + row.history_start;
    CountHistory(counts, in.prompt, row.prompt_len, row.output_len, vocab);
    in.counts = counts;
  }
  if (row.mask_row >= 0 && row.mask_row < p.num_mask_rows && p.allowed != nullptr) {
    in.mask = p.allowed + static_cast<int64_t>(row.mask_row) * p.words_per_row;
  }

  // The largest value (greedy: with the lowest id) and the candidates.
  Best best{-INFINITY, kNoToken};
  unsigned long long candidates = 0;
  for (int32_t t = threadIdx.x; t < vocab; t += kThreads) {
    const float v = in.Value(t);
    best = BetterOf(best, Best{static_cast<double>(v), t});
    candidates += v > -INFINITY ? 1 : 0;
  }
  best = AllReduceBest(best, sh);
  int32_t token = best.id == kNoToken ? 0 : best.id;
  if (!sr::IsGreedy(in.o.temperature)) {
    candidates = AllReduceSum(candidates, sh);
    token = candidates == 0 ? 0
                            : Draw(in, static_cast<float>(best.score), best.id, static_cast<int32_t>(candidates),
                                   sr::NoiseRowKey(row.rng_key, row.position), sh);
  }
  if (threadIdx.x == 0) p.tokens[r] = token;
  if (p.logprobs != nullptr) {
    const int32_t n = in.o.logprobs < p.max_top ? in.o.logprobs : p.max_top;
    Logprobs(in.logits, vocab, token, n, p.max_top, p.logprobs + static_cast<int64_t>(r) * (1 + p.max_top),
             p.top_ids + static_cast<int64_t>(r) * p.max_top, list, sh);
  }
}

absl::Status Invalid(const std::string& why) { return absl::InvalidArgumentError(absl::StrCat("cuda sampling: ", why)); }

}  // namespace

absl::Status LaunchSampling(const SampleParams& p, CUstream_st* stream) {
  if (p.num_rows < 0) return Invalid(absl::StrCat("num_rows ", p.num_rows));
  if (p.num_rows == 0) return absl::OkStatus();
  if (p.vocab <= 0 || p.vocab > sr::kMaxVocab) return Invalid(absl::StrCat("vocab ", p.vocab, " outside [1, 2^23]"));
  if (p.logits == nullptr || p.rows == nullptr || p.tokens == nullptr) return Invalid("no logits, rows or tokens");
  if (p.num_penalty_rows > 0 && (p.penalty_counts == nullptr || p.history == nullptr)) {
    return Invalid("rows with penalties and no counts scratch or history");
  }
  if (p.allowed != nullptr && int64_t{p.words_per_row} * 32 < p.vocab) {
    return Invalid(absl::StrCat("a grammar bitmask row of ", p.words_per_row, " words for ", p.vocab, " tokens"));
  }
  if (p.max_top < 0 || p.max_top > kCudaMaxTopLogprobs) {
    return Invalid(absl::StrCat(p.max_top, " top logprobs (at most ", kCudaMaxTopLogprobs, ")"));
  }
  if (p.logprobs != nullptr && p.max_top > 0 && p.top_ids == nullptr) return Invalid("logprobs without top_ids");
  const size_t list_bytes = p.logprobs != nullptr ? static_cast<size_t>(p.max_top) * sizeof(TopEntry) : 0;
  SampleKernel<<<static_cast<unsigned>(p.num_rows), kThreads, list_bytes, stream>>>(p);
  return LaunchStatus("SampleKernel");
}

}  // namespace tandem::worker
