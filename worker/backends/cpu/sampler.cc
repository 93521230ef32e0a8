#include "worker/backends/cpu/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backends/cpu/cpu_math.h"
#include "worker/backends/portable/raw_logprobs.h"
#include "worker/backends/portable/sampling_rule.h"

namespace tandem::worker {
namespace {

namespace sr = sampling;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The largest order key x with sum{weight(t) : key(t) >= x} >= target over
// `ids`, level by level as the GPU kernel does (sampling_rule.h, radix
// selection). REQUIRES: 0 < target <= the total weight.
template <typename Key, typename Weight>
uint32_t RadixSelect(const int32_t* ids, int32_t n, Key key, Weight weight, uint64_t target) {
  uint32_t prefix = 0;
  uint64_t above = 0;
  uint64_t histogram[sr::kRadixBins];
  for (int32_t level = 0; level < sr::kRadixLevels; ++level) {
    std::fill(histogram, histogram + sr::kRadixBins, 0);
    for (int32_t i = 0; i < n; ++i) {
      const uint32_t k = key(ids[i]);
      if (sr::RadixInPrefix(k, prefix, level)) histogram[sr::RadixDigit(k, level)] += weight(ids[i]);
    }
    prefix |= sr::PickDigit(histogram, target, &above) << sr::RadixShift(level);
  }
  return prefix;
}

// Step 1: the sampled token's logprob and the top n by (value desc, id asc).
void Logprobs(const float* logits, int32_t vocab, int32_t n, SampledToken* out, std::vector<int32_t>* ids) {
  const double lse = sr::LogSumExp(logits, vocab);
  out->logprob = static_cast<float>(static_cast<double>(logits[out->token]) - lse);
  const int32_t top = sr::TopLogitIds(logits, vocab, n, ids);
  for (int32_t i = 0; i < top; ++i) {
    const int32_t t = (*ids)[i];
    out->top.emplace_back(t, static_cast<float>(static_cast<double>(logits[t]) - lse));
  }
}

// Row r's biases lie inside the arrays, name tokens of the vocabulary in
// ascending order once each (RowBias searches them).
absl::Status ValidateRowBias(const SampleParams& p, int32_t r) {
  const SampleRow& row = p.rows[r];
  if (row.bias_len < 0 || row.bias_start < 0 || row.bias_start + row.bias_len > p.num_bias || p.bias_ids == nullptr ||
      p.bias_values == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("sampling row ", r, "'s logit biases are outside the arrays"));
  }
  for (int32_t i = 0; i < row.bias_len; ++i) {
    const TokenId t = p.bias_ids[row.bias_start + i];
    if (t < 0 || t >= p.vocab || (i > 0 && t <= p.bias_ids[row.bias_start + i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling row ", r, "'s logit bias names token ", t, " out of order or outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

// Greedy over the raw logits when nothing changes them (no bias, no
// penalty): one pass, no copy. The same choice as RowValues then the argmax
// below: NaN and masked tokens are -inf, the lowest id wins a tie, token 0
// when no token is a candidate.
#if defined(__x86_64__)
// The unmasked case eight lanes at a time: each lane keeps its first greater
// value (NaN never compares greater), then the lanes' best by (value desc, id
// asc), as the scalar loop.
__attribute__((target("avx2"))) TokenId GreedyRawAvx2(const float* logits, int32_t vocab) {
  __m256 best = _mm256_set1_ps(kNegInf);
  __m256i best_id = _mm256_setzero_si256();
  __m256i id = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i step = _mm256_set1_epi32(8);
  int32_t t = 0;
  for (; t + 8 <= vocab; t += 8) {
    const __m256 v = _mm256_loadu_ps(logits + t);
    const __m256 greater = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
    best = _mm256_blendv_ps(best, v, greater);
    best_id = _mm256_blendv_epi8(best_id, id, _mm256_castps_si256(greater));
    id = _mm256_add_epi32(id, step);
  }
  alignas(32) float lane_best[8];
  alignas(32) int32_t lane_id[8];
  _mm256_store_ps(lane_best, best);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lane_id), best_id);
  float value = kNegInf;
  TokenId token = 0;
  for (int i = 0; i < 8; ++i) {
    if (lane_best[i] > value || (lane_best[i] == value && lane_id[i] < token)) {
      value = lane_best[i];
      token = lane_id[i];
    }
  }
  for (; t < vocab; ++t) {
    if (logits[t] > value) {
      value = logits[t];
      token = t;
    }
  }
  return token;  // 0 when nothing beat -inf
}

#endif

TokenId GreedyRaw(const float* logits, int32_t vocab, const uint32_t* mask) {
#if defined(__x86_64__)
  if (mask == nullptr && cpu::UsingAvx2()) return GreedyRawAvx2(logits, vocab);
#endif
  TokenId best_id = 0;
  float best = sr::Candidate(logits[0], sr::MaskAllows(mask, 0));
  for (int32_t t = 1; t < vocab; ++t) {
    const float v = sr::Candidate(logits[t], sr::MaskAllows(mask, t));
    if (v > best) {
      best = v;
      best_id = t;
    }
  }
  return best_id;
}

}  // namespace

bool SamplingSupport::Allows(float v) const {
  if (!(v > kNegInf) || sr::OrderKey(v) < key_cut) return false;
  return min_p <= 0.0f || sr::RelativeProb(sr::ScaledLogit(v, vmax, inv_t)) >= min_p;
}

absl::Status ValidateSampleParams(const SampleParams& p) {
  if (p.vocab <= 0 || p.vocab > sr::kMaxVocab) {
    return absl::InvalidArgumentError(absl::StrCat("sampling over a vocabulary of ", p.vocab, " (at most 2^23)"));
  }
  if (p.num_rows < 0 || p.max_top < 0 || (p.logprobs != nullptr && p.max_top > 0 && p.top_ids == nullptr)) {
    return absl::InvalidArgumentError("sampling: bad row count or logprob outputs");
  }
  if (p.allowed != nullptr && int64_t{p.words_per_row} * 32 < p.vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("a grammar bitmask row of ", p.words_per_row, " words does not cover ", p.vocab, " tokens"));
  }
  for (int32_t r = 0; r < p.num_rows; ++r) {
    const SampleRow& row = p.rows[r];
    if (row.penalty_row >= 0 &&
        (row.penalty_row >= p.num_penalty_rows || row.prompt_len < 0 || row.output_len < 0 || row.history_start < 0 ||
         row.history_start + row.prompt_len + row.output_len > p.history_len)) {
      return absl::InvalidArgumentError(absl::StrCat("sampling row ", r, "'s history is outside the arrays"));
    }
    if (row.bias_len > 0) {
      TANDEM_RETURN_IF_ERROR(ValidateRowBias(p, r));
    }
    if (row.mask_row >= 0 && (p.allowed == nullptr || row.mask_row >= p.num_mask_rows)) {
      return absl::InvalidArgumentError(absl::StrCat("sampling row ", r, "'s grammar mask is outside the arrays"));
    }
    if (row.options.logprobs > p.max_top || (row.options.logprobs >= 0 && p.logprobs == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("sampling row ", r, " asks for ", row.options.logprobs,
                                                     " top logprobs, the outputs hold ", p.max_top));
    }
  }
  return absl::OkStatus();
}

void RowValues(const SampleParams& p, int32_t r, SamplerScratch* s) {
  const SampleRow& row = p.rows[r];
  const SamplingOptions& o = row.options;
  const int32_t vocab = p.vocab;
  const float* logits = p.logits + int64_t{r} * vocab;
  float* values = s->values.data();
  std::copy(logits, logits + vocab, values);
  // Step 1b: the biases first, so that the penalties below see them.
  const TokenId* bias_ids = p.bias_ids + row.bias_start;
  for (int32_t i = 0; i < row.bias_len; ++i) {
    values[bias_ids[i]] = sr::BiasedLogit(logits[bias_ids[i]], p.bias_values[row.bias_start + i]);
  }
  if (row.penalty_row >= 0) {
    // Counts as the GPU kernel's scratch holds them; zeroed again as applied.
    uint32_t* counts = s->counts.data();
    const TokenId* prompt = p.history + row.history_start;
    const TokenId* output = prompt + row.prompt_len;
    for (int32_t i = 0; i < row.prompt_len; ++i) {
      if (prompt[i] >= 0 && prompt[i] < vocab) counts[prompt[i]] |= sr::kInPromptBit;
    }
    for (int32_t i = 0; i < row.output_len; ++i) {
      if (output[i] >= 0 && output[i] < vocab) ++counts[output[i]];
    }
    auto apply = [&](const TokenId* ids, int32_t n) {
      for (int32_t i = 0; i < n; ++i) {
        const TokenId t = ids[i];
        if (t < 0 || t >= vocab || counts[t] == 0) continue;  // applied already
        values[t] = sr::PenalizedLogit(values[t], counts[t], o.repetition_penalty, o.frequency_penalty,
                                       o.presence_penalty);
        counts[t] = 0;
      }
    };
    apply(prompt, row.prompt_len);
    apply(output, row.output_len);
  }
  const uint32_t* mask = row.mask_row >= 0 ? p.allowed + int64_t{row.mask_row} * p.words_per_row : nullptr;
  for (int32_t t = 0; t < vocab; ++t) values[t] = sr::Candidate(values[t], sr::MaskAllows(mask, t));
}

SamplingSupport FindSupport(const float* v, int32_t vocab, const SamplingOptions& o, SamplerScratch* s) {
  SamplingSupport support;
  std::vector<int32_t>& ids = s->ids;
  ids.clear();
  const bool cuts = o.top_k > 0 || sr::TopPActive(o.top_p);  // the candidates' list is for those
  float vmax = kNegInf;
  for (int32_t t = 0; t < vocab; ++t) {
    if (v[t] == kNegInf) continue;
    ++support.num_candidates;
    if (cuts) ids.push_back(t);
    if (v[t] > vmax) {
      vmax = v[t];
      support.max_id = t;
    }
  }
  if (support.num_candidates == 0) return support;
  support.vmax = vmax;
  support.inv_t = sr::InverseTemperature(o.temperature);
  auto key = [v](int32_t t) { return sr::OrderKey(v[t]); };
  if (sr::TopKActive(o.top_k, support.num_candidates)) {
    support.key_cut =
        RadixSelect(ids.data(), support.num_candidates, key, [](int32_t) { return uint64_t{1}; }, o.top_k);
  }
  if (o.min_p > 0.0f) support.min_p = sr::MinPThreshold(o.min_p);
  if (!sr::TopPActive(o.top_p)) return support;
  // K: the candidates top-k and min-p keep; top-p cuts K by mass. Tokens of
  // mass 0 weigh nothing in the selection and are left out of its passes.
  float* probs = s->probs.data();
  int32_t kept = 0;
  uint64_t total = 0;
  for (int32_t t : ids) {
    if (key(t) < support.key_cut) continue;
    probs[t] = sr::RelativeProb(sr::ScaledLogit(v[t], vmax, support.inv_t));
    if (support.min_p > 0.0f && probs[t] < support.min_p) continue;
    const uint64_t mass = sr::Mass(probs[t]);
    if (mass == 0) continue;
    ids[kept++] = t;
    total += mass;
  }
  support.key_cut = RadixSelect(ids.data(), kept, key, [probs](int32_t t) { return sr::Mass(probs[t]); },
                                sr::TopPTarget(o.top_p, total));
  return support;
}

SampledToken SampleLogits(const SampleParams& p, int32_t r, SamplerScratch* s) {
  const SampleRow& row = p.rows[r];
  const SamplingOptions& o = row.options;
  const int32_t vocab = p.vocab;
  SampledToken result;
  if (sr::IsGreedy(o.temperature) && row.bias_len <= 0 && row.penalty_row < 0) {
    const float* logits = p.logits + int64_t{r} * vocab;
    result.token = GreedyRaw(logits, vocab, row.mask_row >= 0 ? p.allowed + int64_t{row.mask_row} * p.words_per_row
                                                              : nullptr);
    if (o.logprobs >= 0) Logprobs(logits, vocab, o.logprobs, &result, &s->ids);
    return result;
  }
  if (static_cast<int32_t>(s->values.size()) < vocab) {
    s->values.resize(vocab);
    s->probs.resize(vocab);
    s->ids.reserve(vocab);
    s->counts.assign(vocab, 0);
  }
  // Without bias, penalty, mask or NaN the values are the logits themselves.
  const float* logits = p.logits + int64_t{r} * vocab;
  const bool raw = row.bias_len <= 0 && row.penalty_row < 0 && row.mask_row < 0 &&
                   std::none_of(logits, logits + vocab, [](float v) { return v != v; });
  if (!raw) RowValues(p, r, s);
  const float* values = raw ? logits : s->values.data();
  if (sr::IsGreedy(o.temperature)) {
    for (int32_t t = 1; t < vocab; ++t) {
      if (sr::BeatsF(values[t], t, values[result.token], result.token)) result.token = t;
    }
  } else {
    const SamplingSupport support = FindSupport(values, vocab, o, s);
    const uint64_t row_key = sr::NoiseRowKey(row.rng_key, row.position);
    // The Gumbel-max over the allowed set, starting from the best value's
    // token (always allowed) so that sampling::CannotWin skips most others.
    if (support.num_candidates > 0) {
      int32_t best_id = support.max_id;
      double best = sr::GumbelScore(sr::ScaledLogit(values[best_id], support.vmax, support.inv_t), row_key, best_id);
      for (int32_t t = 0; t < vocab; ++t) {
        if (t == best_id || !support.Allows(values[t])) continue;
        const float d = sr::ScaledLogit(values[t], support.vmax, support.inv_t);
        if (sr::CannotWin(d, best, row_key, t)) continue;
        const double score = sr::GumbelScore(d, row_key, t);
        if (sr::Beats(score, t, best, best_id)) {
          best = score;
          best_id = t;
        }
      }
      result.token = best_id;
    }
  }
  if (o.logprobs >= 0) Logprobs(logits, vocab, o.logprobs, &result, &s->ids);
  return result;
}

}  // namespace tandem::worker
