#include "worker/backends/cpu/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/splitmix.h"

namespace tandem::worker {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int32_t ArgMax(const float* v, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) {
    if (v[i] > v[best]) best = i;
  }
  return best;
}

float LogSumExp(const float* v, int32_t n) {
  float max = v[0];
  for (int32_t i = 1; i < n; ++i) max = std::max(max, v[i]);
  double sum = 0;
  for (int32_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(v[i] - max));
  return max + static_cast<float>(std::log(sum));
}

void ApplyPenalties(const SampleRow& row, int32_t vocab, float* values, SamplerScratch* s) {
  const SamplingOptions& o = *row.options;
  if (o.repetition_penalty != 1.0f && o.repetition_penalty > 0.0f) {
    if (++s->stamp_value == 0) {  // wrapped: clear the stamps once in 2^32 rows
      std::fill(s->stamp.begin(), s->stamp.end(), 0);
      s->stamp_value = 1;
    }
    auto penalize = [&](const TokenId* ids, int32_t n) {
      for (int32_t i = 0; i < n; ++i) {
        const TokenId t = ids[i];
        if (t < 0 || t >= vocab || s->stamp[t] == s->stamp_value) continue;
        s->stamp[t] = s->stamp_value;
        values[t] = values[t] > 0 ? values[t] / o.repetition_penalty : values[t] * o.repetition_penalty;
      }
    };
    penalize(row.prompt, row.prompt_len);
    penalize(row.output, row.output_len);
  }
  if (o.frequency_penalty != 0.0f || o.presence_penalty != 0.0f) {
    for (int32_t i = 0; i < row.output_len; ++i) {
      const TokenId t = row.output[i];
      if (t >= 0 && t < vocab) ++s->counts[t];
    }
    for (int32_t i = 0; i < row.output_len; ++i) {
      const TokenId t = row.output[i];
      if (t < 0 || t >= vocab || s->counts[t] == 0) continue;
      values[t] -= o.frequency_penalty * s->counts[t] + o.presence_penalty;
      s->counts[t] = 0;  // once per distinct token; leaves the counts zeroed
    }
  }
}

// Keeps the smallest prefix of `cand` (sorted by probability as it goes)
// whose mass reaches top_p of `total`; returns its length. Sorting grows in
// steps, since a peaked distribution reaches top_p within a few entries.
int32_t TopPCut(std::vector<int32_t>& cand, int32_t n, const float* probs, double total, float top_p) {
  auto by_prob = [probs](int32_t a, int32_t b) { return probs[a] > probs[b]; };
  const double target = top_p * total;
  int32_t sorted = 0;
  double cumulative = 0;
  for (int32_t k = std::min(n, 64);; k = std::min(n, k * 4)) {
    std::partial_sort(cand.begin() + sorted, cand.begin() + k, cand.begin() + n, by_prob);
    for (; sorted < k; ++sorted) {
      cumulative += probs[cand[sorted]];
      if (cumulative >= target) return sorted + 1;
    }
    if (k == n) return n;
  }
}

}  // namespace

double UniformDraw(uint64_t key, int32_t position) {
  const uint64_t bits = SplitMix64(key ^ SplitMix64(static_cast<uint64_t>(position) + 0x51ed27f3ULL));
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

SampledToken SampleLogits(const float* logits, int32_t vocab, const SampleRow& row, SamplerScratch* s) {
  const SamplingOptions& o = *row.options;
  if (static_cast<int32_t>(s->values.size()) < vocab) {
    s->values.resize(vocab);
    s->indices.resize(vocab);
    s->stamp.assign(vocab, 0);
    s->counts.assign(vocab, 0);
  }
  SampledToken result;
  float* values = s->values.data();
  std::copy(logits, logits + vocab, values);
  ApplyPenalties(row, vocab, values, s);
  if (row.allowed != nullptr) {
    for (int32_t t = 0; t < vocab; ++t) {
      if (!(row.allowed[t / 32] & (1u << (t % 32)))) values[t] = kNegInf;
    }
  }

  if (o.temperature <= 1e-5f) {
    result.token = ArgMax(values, vocab);
  } else {
    // Unnormalized probabilities relative to the best token (exp(0) = 1).
    const float max = values[ArgMax(values, vocab)];
    const float inv_t = 1.0f / o.temperature;
    std::vector<int32_t>& cand = s->indices;
    int32_t n = 0;
    for (int32_t t = 0; t < vocab; ++t) {
      if (values[t] != kNegInf) cand[n++] = t;
    }
    if (o.top_k > 0 && o.top_k < n) {
      std::nth_element(cand.begin(), cand.begin() + o.top_k, cand.begin() + n,
                       [values](int32_t a, int32_t b) { return values[a] > values[b]; });
      n = o.top_k;
    }
    double total = 0;
    for (int32_t i = 0; i < n; ++i) {
      const int32_t t = cand[i];
      values[t] = std::exp((values[t] - max) * inv_t);
    }
    if (o.min_p > 0.0f) {  // relative to the best token, whose value is 1
      int32_t kept = 0;
      for (int32_t i = 0; i < n; ++i) {
        if (values[cand[i]] >= o.min_p) cand[kept++] = cand[i];
      }
      n = kept;
    }
    for (int32_t i = 0; i < n; ++i) total += values[cand[i]];
    if (o.top_p < 1.0f) {
      n = TopPCut(cand, n, values, total, o.top_p);
      total = 0;
      for (int32_t i = 0; i < n; ++i) total += values[cand[i]];
    }
    const double target = UniformDraw(row.rng_key, row.position) * total;
    double cumulative = 0;
    result.token = cand[n - 1];
    for (int32_t i = 0; i < n; ++i) {
      cumulative += values[cand[i]];
      if (cumulative > target) {
        result.token = cand[i];
        break;
      }
    }
  }

  if (o.logprobs >= 0) {
    const float lse = LogSumExp(logits, vocab);
    result.logprob = logits[result.token] - lse;
    const int32_t top = std::min(o.logprobs, vocab);
    std::vector<int32_t>& idx = s->indices;
    for (int32_t t = 0; t < vocab; ++t) idx[t] = t;
    std::partial_sort(idx.begin(), idx.begin() + top, idx.begin() + vocab,
                      [logits](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    for (int32_t i = 0; i < top; ++i) result.top.emplace_back(idx[i], logits[idx[i]] - lse);
  }
  return result;
}

}  // namespace tandem::worker
