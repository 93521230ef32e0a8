// The CPU sampler (worker/backends/cpu/sampler.h) against the rule of
// worker/backends/portable/sampling_rule.h: greedy, temperature, top-k,
// top-p, min-p, keyed Gumbel draws, penalties over the history, the grammar
// mask and raw logprobs; and CpuBackend::Sample's batch invariance.
#include "worker/backends/cpu/sampler.h"

#include <cmath>
#include <map>
#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backends/cpu/cpu_backend.h"

namespace tandem::worker {
namespace {

// One row with its history and mask, sampled through SampleParams.
struct Fixture {
  SamplingOptions options;
  SamplerScratch scratch;
  std::vector<TokenId> prompt, output;
  std::vector<uint32_t> mask;
  std::vector<TokenId> bias_ids;  // ascending
  std::vector<float> biases;
  uint64_t rng_key = 42;

  SampledToken Sample(const std::vector<float>& logits, int32_t position = 0) {
    SampleRow row;
    row.options = options;
    row.rng_key = rng_key;
    row.position = position;
    std::vector<TokenId> history = prompt;
    history.insert(history.end(), output.begin(), output.end());
    SampleParams p;
    p.logits = logits.data();
    p.num_rows = 1;
    p.vocab = static_cast<int32_t>(logits.size());
    p.rows = &row;
    if (!history.empty()) {
      row.penalty_row = 0;
      row.prompt_len = static_cast<int32_t>(prompt.size());
      row.output_len = static_cast<int32_t>(output.size());
      p.history = history.data();
      p.history_len = static_cast<int64_t>(history.size());
      p.num_penalty_rows = 1;
    }
    if (!mask.empty()) {
      row.mask_row = 0;
      p.allowed = mask.data();
      p.num_mask_rows = 1;
      p.words_per_row = static_cast<int32_t>(mask.size());
    }
    if (!bias_ids.empty()) {
      row.bias_len = static_cast<int32_t>(bias_ids.size());
      p.bias_ids = bias_ids.data();
      p.bias_values = biases.data();
      p.num_bias = row.bias_len;
    }
    std::vector<float> logprobs(1 + std::max(0, options.logprobs));
    std::vector<TokenId> top(std::max(1, options.logprobs));
    if (options.logprobs >= 0) {
      p.logprobs = logprobs.data();
      p.top_ids = top.data();
      p.max_top = options.logprobs;
    }
    EXPECT_TRUE(ValidateSampleParams(p).ok()) << ValidateSampleParams(p);
    return SampleLogits(p, 0, &scratch);
  }
};

TEST(SamplerTest, GreedyTakesTheArgmaxAndTheLowestIdOnTies) {
  Fixture f;
  f.options.temperature = 0.0f;
  EXPECT_EQ(f.Sample({0.1f, 2.0f, -1.0f, 1.9f}).token, 1);
  EXPECT_EQ(f.Sample({0.1f, 2.0f, -1.0f, 2.0f}).token, 1);
  EXPECT_EQ(f.Sample({NAN, 0.5f, NAN, 0.5f}).token, 1);  // NaN is never a candidate
}

// Greedy without bias or penalty takes one pass over the raw logits; a
// neutral penalty (repetition 1, frequency and presence 0) sends the same row
// through the general path (copy, penalties, mask, argmax): the same token for
// NaN, -inf, ties and masks.
TEST(SamplerTest, GreedyOnePassMatchesTheGeneralPath) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> kind(0, 9);
  std::uniform_int_distribution<int> level(-3, 3);  // few values: many ties
  for (int trial = 0; trial < 400; ++trial) {
    const int32_t vocab = 1 + trial % 97;
    std::vector<float> logits(vocab);
    for (float& v : logits) {
      const int k = kind(rng);
      v = k == 0 ? NAN : k == 1 ? -INFINITY : static_cast<float>(level(rng));
    }
    if (trial % 5 == 0) std::fill(logits.begin(), logits.end(), NAN);
    Fixture fast, general;
    fast.options.temperature = general.options.temperature = 0.0f;
    general.output = {0};
    if (trial % 2 == 1) {
      std::vector<uint32_t> mask((vocab + 31) / 32);
      for (uint32_t& w : mask) w = static_cast<uint32_t>(rng());
      fast.mask = general.mask = mask;
    }
    EXPECT_EQ(fast.Sample(logits).token, general.Sample(logits).token) << "trial " << trial;
  }
}

// Sampling without bias, penalty, mask or NaN reads the logits in place; a
// neutral penalty sends the same row through RowValues' copy: the same draws
// under top-k, top-p and min-p, with and without a NaN.
TEST(SamplerTest, SamplingInPlaceMatchesTheGeneralPath) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> logits(1 + trial % 61);
    for (float& v : logits) v = normal(rng);
    if (trial % 3 == 0) logits[trial % logits.size()] = NAN;
    Fixture fast, general;
    general.output = {0};
    for (Fixture* f : {&fast, &general}) {
      f->options.temperature = 0.3f + 0.1f * (trial % 9);
      f->options.top_k = trial % 4 == 1 ? 5 : 0;
      f->options.top_p = trial % 4 == 2 ? 0.8f : 1.0f;
      f->options.min_p = trial % 4 == 3 ? 0.1f : 0.0f;
    }
    EXPECT_EQ(fast.Sample(logits, trial).token, general.Sample(logits, trial).token) << "trial " << trial;
  }
}

TEST(SamplerTest, TemperatureSamplingFollowsTheSoftmax) {
  Fixture f;
  f.options.temperature = 1.0f;
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  std::map<TokenId, int> counts;
  constexpr int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i) ++counts[f.Sample(logits, i).token];
  EXPECT_NEAR(counts[0] / double{kDraws}, 0.5, 0.02);
  EXPECT_NEAR(counts[1] / double{kDraws}, 0.3, 0.02);
  EXPECT_NEAR(counts[2] / double{kDraws}, 0.2, 0.02);
  // Temperature 2 flattens: p ~ sqrt(0.5 : 0.3 : 0.2).
  f.options.temperature = 2.0f;
  counts.clear();
  for (int i = 0; i < kDraws; ++i) ++counts[f.Sample(logits, i).token];
  const double z = std::sqrt(0.5) + std::sqrt(0.3) + std::sqrt(0.2);
  EXPECT_NEAR(counts[0] / double{kDraws}, std::sqrt(0.5) / z, 0.02);
  EXPECT_NEAR(counts[2] / double{kDraws}, std::sqrt(0.2) / z, 0.02);
}

TEST(SamplerTest, DrawsAreKeyedByKeyAndPositionOnly) {
  Fixture f;
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = std::sin(i * 0.37f);
  std::vector<TokenId> first, again;
  for (int p = 0; p < 50; ++p) first.push_back(f.Sample(logits, p).token);
  for (int p = 0; p < 50; ++p) again.push_back(f.Sample(logits, p).token);
  EXPECT_EQ(first, again);
  f.rng_key = 43;
  int differ = 0;
  for (int p = 0; p < 50; ++p) differ += f.Sample(logits, p).token != first[p] ? 1 : 0;
  EXPECT_GT(differ, 10);
}

TEST(SamplerTest, TopKTopPAndMinPRestrictTheSupport) {
  Fixture f;
  const std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  auto support = [&](SamplingOptions o) {
    f.options = o;
    std::map<TokenId, int> seen;
    for (int i = 0; i < 4000; ++i) ++seen[f.Sample(logits, i).token];
    return seen;
  };
  SamplingOptions top_k;
  top_k.top_k = 2;
  auto seen = support(top_k);
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen.count(0) && seen.count(1));
  SamplingOptions top_p;
  top_p.top_p = 0.75f;  // 0.4 + 0.3 = 0.7 < 0.75: the third token is needed too
  seen = support(top_p);
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_FALSE(seen.count(3));
  top_p.top_p = 0.7f;   // 0.4 + 0.3 reaches 0.7 (up to float rounding of the logits)
  seen = support(top_p);
  EXPECT_LE(seen.size(), 3u);
  EXPECT_GE(seen.size(), 2u);
  SamplingOptions min_p;
  min_p.min_p = 0.6f;  // keeps tokens with p >= 0.6 * 0.4 = 0.24
  seen = support(min_p);
  EXPECT_EQ(seen.size(), 2u);
}

TEST(SamplerTest, TopKKeepsTiesAtTheThreshold) {
  Fixture f;
  f.options.top_k = 2;
  const std::vector<float> logits = {1.0f, 2.0f, 1.0f, 0.0f, 1.0f};
  std::map<TokenId, int> seen;
  for (int i = 0; i < 4000; ++i) ++seen[f.Sample(logits, i).token];
  EXPECT_EQ(seen.size(), 4u);  // 1, and the three tied at 1.0
  EXPECT_FALSE(seen.count(3));
}

TEST(SamplerTest, PenaltiesUseTheHistory) {
  Fixture f;
  f.options.temperature = 0.0f;
  const std::vector<float> logits = {1.0f, 0.9f, 0.5f};
  f.output = {0, 0};
  f.options.repetition_penalty = 1.2f;  // 1.0 / 1.2 < 0.9
  EXPECT_EQ(f.Sample(logits).token, 1);
  f.options.repetition_penalty = 1.0f;
  f.options.frequency_penalty = 0.3f;  // 1.0 - 2 * 0.3 = 0.4 < 0.9
  EXPECT_EQ(f.Sample(logits).token, 1);
  f.options.frequency_penalty = 0.0f;
  f.options.presence_penalty = 0.05f;  // 0.95 > 0.9: still token 0
  EXPECT_EQ(f.Sample(logits).token, 0);
  f.options.presence_penalty = 0.2f;
  EXPECT_EQ(f.Sample(logits).token, 1);
  // The prompt counts for repetition only.
  f.output.clear();
  f.prompt = {0, 0};
  EXPECT_EQ(f.Sample(logits).token, 0);
  f.options.repetition_penalty = 1.2f;
  EXPECT_EQ(f.Sample(logits).token, 1);
  // Penalties apply once per distinct token and leave no state behind.
  f.prompt.clear();
  EXPECT_EQ(f.Sample(logits).token, 0);
}

TEST(SamplerTest, GrammarMaskExcludesTokens) {
  Fixture f;
  f.options.temperature = 0.0f;
  f.mask = {0b100};
  EXPECT_EQ(f.Sample({3.0f, 2.0f, 1.0f}).token, 2);
  f.options.temperature = 1.0f;
  for (int i = 0; i < 100; ++i) EXPECT_EQ(f.Sample({3.0f, 2.0f, 1.0f}, i).token, 2);
  f.mask = {0};  // nothing allowed: token 0, by the rule
  EXPECT_EQ(f.Sample({3.0f, 2.0f, 1.0f}).token, 0);
}

TEST(SamplerTest, LogprobsComeFromTheRawLogits) {
  Fixture f;
  f.options.temperature = 0.0f;
  f.options.logprobs = 2;
  f.options.repetition_penalty = 5.0f;  // must not change the reported logprobs
  f.output = {1};
  const SampledToken s = f.Sample({1.0f, 3.0f, 2.0f});
  const double lse = std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0));
  EXPECT_EQ(s.token, 2);  // 3 / 5 < 2
  EXPECT_NEAR(s.logprob, 2.0 - lse, 1e-5);
  ASSERT_EQ(s.top.size(), 2u);
  EXPECT_EQ(s.top[0].first, 1);
  EXPECT_NEAR(s.top[0].second, 3.0 - lse, 1e-5);
  EXPECT_EQ(s.top[1].first, 2);
  // Ties: the lowest id first.
  f.options.logprobs = 3;
  const SampledToken tied = f.Sample({2.0f, 3.0f, 2.0f, 2.0f});
  ASSERT_EQ(tied.top.size(), 3u);
  EXPECT_EQ(tied.top[1].first, 0);
  EXPECT_EQ(tied.top[2].first, 2);
}

// CpuBackend::Sample: a row's token depends on that row alone, whatever the
// other rows, their order and the thread that samples it.
TEST(SamplerTest, LogitBiasMovesTheChoiceAndLogprobsStayRaw) {
  Fixture f;
  f.options.temperature = 0.0f;
  f.options.logprobs = 1;
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, 1.5f};
  f.bias_ids = {0, 1};
  f.biases = {1.5f, -100.0f};
  const SampledToken biased = f.Sample(logits);
  EXPECT_EQ(biased.token, 0);  // 1 + 1.5 beats 1.5 and 2 - 100
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l));
  EXPECT_NEAR(biased.logprob, 1.0 - std::log(sum), 1e-6);  // the raw logit's
  ASSERT_EQ(biased.top.size(), 1u);
  EXPECT_EQ(biased.top[0].first, 1);  // the raw argmax, not the biased one
  // -inf bans a token outright, also when sampling.
  f.options.temperature = 1.0f;
  f.options.logprobs = -1;
  f.bias_ids = {1, 3};
  f.biases = {-INFINITY, -INFINITY};
  std::set<TokenId> seen;
  for (int i = 0; i < 2000; ++i) seen.insert(f.Sample(logits, i).token);
  EXPECT_EQ(seen, (std::set<TokenId>{0, 2}));
}

TEST(SamplerTest, LogitBiasComesBeforeThePenalties) {
  // Token 0 (logit 2, in the prompt) against token 1 (0.25). With bias -1
  // and repetition 2: biased first, (2 - 1) / 2 = 0.5 wins; penalized first,
  // 2 / 2 - 1 = 0 would lose.
  Fixture f;
  f.options.temperature = 0.0f;
  f.options.repetition_penalty = 2.0f;
  f.prompt = {0};
  f.bias_ids = {0};
  f.biases = {-1.0f};
  EXPECT_EQ(f.Sample({2.0f, 0.25f}).token, 0);
  EXPECT_EQ(f.scratch.values[0], 0.5f);
}

TEST(SamplerTest, SameSeedSameTokenWhateverTheBatch) {
  constexpr int32_t kVocab = 1000;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  constexpr int32_t kRows = 24;
  std::vector<float> logits(kRows * kVocab);
  for (float& l : logits) l = normal(rng);
  std::vector<SampleRow> rows(kRows);
  for (int32_t r = 0; r < kRows; ++r) {
    rows[r].rng_key = 1000 + r % 5;
    rows[r].position = r;
    rows[r].options.temperature = 0.5f + 0.1f * (r % 7);
    rows[r].options.top_k = r % 3 == 0 ? 0 : 40;
    rows[r].options.top_p = r % 4 == 0 ? 1.0f : 0.9f;
    rows[r].options.min_p = r % 5 == 0 ? 0.05f : 0.0f;
  }
  auto sample = [&](const std::vector<int32_t>& order, int32_t threads) {
    std::vector<float> batch_logits;
    std::vector<SampleRow> batch_rows;
    for (int32_t r : order) {
      batch_logits.insert(batch_logits.end(), logits.begin() + r * kVocab, logits.begin() + (r + 1) * kVocab);
      batch_rows.push_back(rows[r]);
    }
    std::vector<TokenId> tokens(order.size());
    SampleParams p;
    p.logits = batch_logits.data();
    p.num_rows = static_cast<int32_t>(order.size());
    p.vocab = kVocab;
    p.rows = batch_rows.data();
    p.tokens = tokens.data();
    CpuBackend backend(threads);
    EXPECT_TRUE(backend.Sample(p).ok());
    std::map<int32_t, TokenId> by_row;
    for (size_t i = 0; i < order.size(); ++i) by_row[order[i]] = tokens[i];
    return by_row;
  };
  std::vector<int32_t> all(kRows);
  for (int32_t r = 0; r < kRows; ++r) all[r] = r;
  const auto whole = sample(all, 1);
  std::vector<int32_t> shuffled = all;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  EXPECT_EQ(sample(shuffled, 3), whole);
  for (int32_t r = 0; r < kRows; ++r) EXPECT_EQ(sample({r}, 1).at(r), whole.at(r)) << "row " << r;
  std::set<TokenId> distinct;
  for (const auto& [r, t] : whole) distinct.insert(t);
  EXPECT_GT(distinct.size(), 5u);
}

TEST(SamplerTest, BadParametersAreInvalidArgument) {
  CpuBackend backend(1);
  std::vector<float> logits(64);
  SampleRow row;
  row.penalty_row = 0;
  row.output_len = 3;
  TokenId token;
  SampleParams p;
  p.logits = logits.data();
  p.num_rows = 1;
  p.vocab = 64;
  p.rows = &row;
  p.tokens = &token;
  EXPECT_EQ(backend.Sample(p).code(), absl::StatusCode::kInvalidArgument);  // no history
  row.penalty_row = -1;
  row.mask_row = 0;
  EXPECT_EQ(backend.Sample(p).code(), absl::StatusCode::kInvalidArgument);  // no mask
  row.mask_row = -1;
  row.options.logprobs = 2;
  EXPECT_EQ(backend.Sample(p).code(), absl::StatusCode::kInvalidArgument);  // no logprob outputs
  row.options.logprobs = -1;
  EXPECT_TRUE(backend.Sample(p).ok());
  const TokenId bias_ids[] = {5, 3, 64};
  const float biases[] = {1.0f, 1.0f, 1.0f};
  row.bias_len = 1;
  EXPECT_EQ(backend.Sample(p).code(), absl::StatusCode::kInvalidArgument);  // no bias arrays
  p.bias_ids = bias_ids;
  p.bias_values = biases;
  p.num_bias = 3;
  EXPECT_TRUE(backend.Sample(p).ok());
  row.bias_len = 2;
  EXPECT_EQ(backend.Sample(p).code(), absl::StatusCode::kInvalidArgument);  // 5 then 3: out of order
  row.bias_start = 2;
  row.bias_len = 1;
  EXPECT_EQ(backend.Sample(p).code(), absl::StatusCode::kInvalidArgument);  // 64: outside the vocabulary
  row.bias_len = 2;
  EXPECT_EQ(backend.Sample(p).code(), absl::StatusCode::kInvalidArgument);  // past the arrays
}

}  // namespace
}  // namespace tandem::worker
