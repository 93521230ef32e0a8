// The sampler's semantics (worker/backends/cpu/sampler.h): greedy, temperature, top-k,
// top-p, min-p, keyed draws, penalties over the history, the grammar mask and
// raw logprobs.
#include "worker/backends/cpu/sampler.h"

#include <cmath>
#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::worker {
namespace {

struct Fixture {
  SamplingOptions options;
  SamplerScratch scratch;
  SampleRow Row(int32_t position = 0) {
    SampleRow row;
    row.options = &options;
    row.rng_key = 42;
    row.position = position;
    return row;
  }
};

TEST(SamplerTest, GreedyTakesTheArgmax) {
  Fixture f;
  f.options.temperature = 0.0f;
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f};
  EXPECT_EQ(SampleLogits(logits.data(), 4, f.Row(), &f.scratch).token, 1);
}

TEST(SamplerTest, TemperatureSamplingFollowsTheSoftmax) {
  Fixture f;
  f.options.temperature = 1.0f;
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  std::map<TokenId, int> counts;
  constexpr int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i) ++counts[SampleLogits(logits.data(), 3, f.Row(i), &f.scratch).token];
  EXPECT_NEAR(counts[0] / double{kDraws}, 0.5, 0.02);
  EXPECT_NEAR(counts[1] / double{kDraws}, 0.3, 0.02);
  EXPECT_NEAR(counts[2] / double{kDraws}, 0.2, 0.02);
}

TEST(SamplerTest, DrawsAreKeyedByKeyAndPositionOnly) {
  Fixture f;
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = std::sin(i * 0.37f);
  std::vector<TokenId> first, again;
  for (int p = 0; p < 50; ++p) first.push_back(SampleLogits(logits.data(), 100, f.Row(p), &f.scratch).token);
  for (int p = 0; p < 50; ++p) again.push_back(SampleLogits(logits.data(), 100, f.Row(p), &f.scratch).token);
  EXPECT_EQ(first, again);
  SampleRow other = f.Row(0);
  other.rng_key = 43;
  int differ = 0;
  for (int p = 0; p < 50; ++p) {
    other.position = p;
    differ += SampleLogits(logits.data(), 100, other, &f.scratch).token != first[p] ? 1 : 0;
  }
  EXPECT_GT(differ, 10);
}

TEST(SamplerTest, TopKTopPAndMinPRestrictTheSupport) {
  Fixture f;
  const std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
  auto support = [&](SamplingOptions o) {
    f.options = o;
    std::map<TokenId, int> seen;
    for (int i = 0; i < 4000; ++i) ++seen[SampleLogits(logits.data(), 4, f.Row(i), &f.scratch).token];
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
  SamplingOptions min_p;
  min_p.min_p = 0.6f;  // keeps tokens with p >= 0.6 * 0.4 = 0.24
  seen = support(min_p);
  EXPECT_EQ(seen.size(), 2u);
}

TEST(SamplerTest, PenaltiesUseTheHistory) {
  Fixture f;
  f.options.temperature = 0.0f;
  const std::vector<float> logits = {1.0f, 0.9f, 0.5f};
  const std::vector<TokenId> output = {0, 0};
  SampleRow row = f.Row();
  row.output = output.data();
  row.output_len = 2;
  f.options.repetition_penalty = 1.2f;  // 1.0 / 1.2 < 0.9
  EXPECT_EQ(SampleLogits(logits.data(), 3, row, &f.scratch).token, 1);
  f.options.repetition_penalty = 1.0f;
  f.options.frequency_penalty = 0.3f;  // 1.0 - 2 * 0.3 = 0.4 < 0.9
  EXPECT_EQ(SampleLogits(logits.data(), 3, row, &f.scratch).token, 1);
  f.options.frequency_penalty = 0.0f;
  f.options.presence_penalty = 0.05f;  // 0.95 > 0.9: still token 0
  EXPECT_EQ(SampleLogits(logits.data(), 3, row, &f.scratch).token, 0);
  f.options.presence_penalty = 0.2f;
  EXPECT_EQ(SampleLogits(logits.data(), 3, row, &f.scratch).token, 1);
  // Penalties apply once per distinct token and leave no state behind.
  row.output_len = 0;
  EXPECT_EQ(SampleLogits(logits.data(), 3, row, &f.scratch).token, 0);
}

TEST(SamplerTest, GrammarMaskExcludesTokens) {
  Fixture f;
  f.options.temperature = 0.0f;
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f};
  const uint32_t allowed = 0b100;
  SampleRow row = f.Row();
  row.allowed = &allowed;
  EXPECT_EQ(SampleLogits(logits.data(), 3, row, &f.scratch).token, 2);
}

TEST(SamplerTest, LogprobsComeFromTheRawLogits) {
  Fixture f;
  f.options.temperature = 0.0f;
  f.options.logprobs = 2;
  f.options.repetition_penalty = 5.0f;  // must not change the reported logprobs
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f};
  const std::vector<TokenId> output = {1};
  SampleRow row = f.Row();
  row.output = output.data();
  row.output_len = 1;
  const SampledToken s = SampleLogits(logits.data(), 3, row, &f.scratch);
  const double lse = std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.0));
  EXPECT_EQ(s.token, 2);  // 3 / 5 < 2
  EXPECT_NEAR(s.logprob, 2.0 - lse, 1e-5);
  ASSERT_EQ(s.top.size(), 2u);
  EXPECT_EQ(s.top[0].first, 1);
  EXPECT_NEAR(s.top[0].second, 3.0 - lse, 1e-5);
  EXPECT_EQ(s.top[1].first, 2);
}

}  // namespace
}  // namespace tandem::worker
