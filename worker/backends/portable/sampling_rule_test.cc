// The sampling rule's host/device functions (sampling_rule.h): the noise's
// determinism and distribution, the order keys, and the threshold search
// (the CPU sampler's radix selection, which the GPU kernel mirrors) against a
// sort-based reference on 1,000 random rows.
#include "worker/backends/portable/sampling_rule.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/splitmix.h"
#include "gtest/gtest.h"
#include "worker/backends/cpu/sampler.h"

namespace tandem::worker::sampling {
namespace {

TEST(SamplingRuleTest, Mix64IsSplitMix64) {
  for (uint64_t x : {0ULL, 1ULL, 42ULL, 0xdeadbeefcafef00dULL, ~0ULL}) EXPECT_EQ(Mix64(x), SplitMix64(x));
}

TEST(SamplingRuleTest, NoiseIsAFunctionOfKeyPositionAndToken) {
  const uint64_t row = NoiseRowKey(SplitMix64(7), 12);
  EXPECT_EQ(row, NoiseRowKey(SplitMix64(7), 12));
  EXPECT_EQ(NoiseBits(row, 5), NoiseBits(row, 5));
  EXPECT_EQ(GumbelNoise(row, 5), GumbelNoise(row, 5));
  // Different keys, positions and tokens give different bits (no collision
  // among 3 x 100,000 draws of 64 bits).
  std::set<uint64_t> seen;
  for (int32_t t = 0; t < 100000; ++t) {
    seen.insert(NoiseBits(row, t));
    seen.insert(NoiseBits(NoiseRowKey(SplitMix64(7), 13), t));
    seen.insert(NoiseBits(NoiseRowKey(SplitMix64(8), 12), t));
  }
  EXPECT_EQ(seen.size(), 300000u);
}

// Pearson correlation of two samples.
double Correlation(const std::vector<double>& a, const std::vector<double>& b) {
  const double n = static_cast<double>(a.size());
  double ma = 0, mb = 0;
  for (size_t i = 0; i < a.size(); ++i) ma += a[i] / n, mb += b[i] / n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return sab / std::sqrt(saa * sbb);
}

// Uniforms over tokens, over positions and over seeds: a chi-square test on
// 100 cells and a Kolmogorov-Smirnov bound, each over 100,000 draws; the
// Gumbel transform's mean and variance; neighbours uncorrelated.
TEST(SamplingRuleTest, NoiseIsUniformAndGumbelIsStandard) {
  constexpr int32_t kDraws = 100000;
  const uint64_t row = NoiseRowKey(SplitMix64(1234), 0);
  struct Stream {
    const char* name;
    std::vector<double> u;
  };
  std::vector<Stream> streams = {{"over tokens", {}}, {"over positions", {}}, {"over seeds", {}}};
  for (int32_t i = 0; i < kDraws; ++i) {
    streams[0].u.push_back(NoiseUniform(row, i));
    streams[1].u.push_back(NoiseUniform(NoiseRowKey(SplitMix64(1234), i), 17));
    streams[2].u.push_back(NoiseUniform(NoiseRowKey(SplitMix64(i), 3), 17));
  }
  for (Stream& s : streams) {
    std::vector<int> cells(100, 0);
    for (double u : s.u) {
      ASSERT_GT(u, 0.0);
      ASSERT_LT(u, 1.0);
      ++cells[static_cast<int>(u * 100)];
    }
    double chi2 = 0;
    for (int c : cells) chi2 += (c - kDraws / 100.0) * (c - kDraws / 100.0) / (kDraws / 100.0);
    // 99 degrees of freedom: P(chi2 > 148) < 0.1%.
    EXPECT_LT(chi2, 148.0) << s.name;
    std::sort(s.u.begin(), s.u.end());
    double ks = 0;
    for (int32_t i = 0; i < kDraws; ++i) {
      ks = std::max({ks, std::abs(s.u[i] - static_cast<double>(i) / kDraws), std::abs(s.u[i] - static_cast<double>(i + 1) / kDraws)});
    }
    // Critical value at 0.1%: 1.95 / sqrt(n).
    EXPECT_LT(ks, 1.95 / std::sqrt(double{kDraws})) << s.name;
    RecordProperty(std::string("chi2 ") + s.name, std::to_string(chi2));
    RecordProperty(std::string("ks ") + s.name, std::to_string(ks));
  }
  double mean = 0, var = 0;
  std::vector<double> g(kDraws), next(kDraws);
  for (int32_t i = 0; i < kDraws; ++i) {
    g[i] = GumbelNoise(row, i);
    next[i] = GumbelNoise(row, i + 1);
    mean += g[i] / kDraws;
  }
  for (double x : g) var += (x - mean) * (x - mean) / kDraws;
  // Standard Gumbel: mean 0.5772 (Euler's gamma), variance pi^2 / 6; the
  // standard errors over 1e5 draws are 0.004 and 0.008.
  EXPECT_NEAR(mean, 0.5772156649, 0.02);
  EXPECT_NEAR(var, M_PI * M_PI / 6, 0.05);
  EXPECT_LT(std::abs(Correlation(g, next)), 0.015);
  std::vector<double> by_position(kDraws);
  for (int32_t i = 0; i < kDraws; ++i) by_position[i] = GumbelNoise(NoiseRowKey(SplitMix64(1234), 1), i);
  EXPECT_LT(std::abs(Correlation(g, by_position)), 0.015);
  RecordProperty("gumbel_mean", std::to_string(mean));
  RecordProperty("gumbel_variance", std::to_string(var));
}

TEST(SamplingRuleTest, RowBiasFindsATokensBiasOrZero) {
  const int32_t ids[] = {2, 5, 9, 40};
  const float biases[] = {1.5f, -INFINITY, -3.0f, 100.0f};
  for (int32_t t = 0; t < 50; ++t) {
    float expected = 0.0f;
    for (int i = 0; i < 4; ++i) expected = ids[i] == t ? biases[i] : expected;
    EXPECT_EQ(RowBias(ids, biases, 4, t), expected) << t;
  }
  EXPECT_EQ(RowBias(ids, biases, 0, 2), 0.0f);
  EXPECT_EQ(BiasedLogit(1.0f, 1.5f), 2.5f);
  EXPECT_EQ(BiasedLogit(1.0f, -INFINITY), -INFINITY);
  // +inf and a ban: NaN, which Candidate makes -inf.
  EXPECT_EQ(Candidate(BiasedLogit(INFINITY, -INFINITY), true), -INFINITY);
}

TEST(SamplingRuleTest, OrderKeysFollowTheFloatOrder) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> values = {-INFINITY, -1e30f, -1.0f, -1e-40f, 0.0f, 1e-40f, 1.0f, 1e30f, INFINITY};
  for (int i = 0; i < 10000; ++i) {
    const uint32_t b = bits(rng);
    float v;
    std::memcpy(&v, &b, sizeof(v));
    if (!std::isnan(v)) values.push_back(v);
  }
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(KeyValue(OrderKey(values[i])), values[i]);
    for (size_t j = i + 1; j < std::min(values.size(), i + 30); ++j) {
      EXPECT_EQ(values[i] < values[j], OrderKey(values[i]) < OrderKey(values[j]));
      EXPECT_EQ(values[i] == values[j], OrderKey(values[i]) == OrderKey(values[j]));
    }
  }
  EXPECT_EQ(OrderKey(-0.0f), OrderKey(0.0f));
  EXPECT_LT(OrderKey(NAN), OrderKey(-INFINITY));
}

TEST(SamplingRuleTest, PickDigitTakesTheHighestDigitReachingTheTarget) {
  uint64_t histogram[kRadixBins] = {};
  histogram[200] = 3;
  histogram[100] = 5;
  histogram[7] = 1;
  uint64_t above = 2;
  EXPECT_EQ(PickDigit(histogram, 5, &above), 200u);  // 2 + 3 reaches 5
  EXPECT_EQ(above, 2u);
  above = 2;
  EXPECT_EQ(PickDigit(histogram, 6, &above), 100u);
  EXPECT_EQ(above, 5u);
  above = 0;
  histogram[0] = 4;
  EXPECT_EQ(PickDigit(histogram, 12, &above), 0u);
  EXPECT_EQ(above, 9u);
}

// The allowed set by sorting, straight from the rule's definition: sort the
// candidates by (v descending, id ascending), cut at the k-th, filter by
// min-p, accumulate masses until the top-p target, keep ties at each cut.
std::vector<bool> SortedSupport(const std::vector<float>& v, const SamplingOptions& o) {
  const int32_t vocab = static_cast<int32_t>(v.size());
  std::vector<int32_t> order;
  for (int32_t t = 0; t < vocab; ++t) {
    if (v[t] != -INFINITY) order.push_back(t);
  }
  std::vector<bool> allowed(vocab, false);
  if (order.empty()) return allowed;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  const float vmax = v[order[0]];
  const float inv_t = InverseTemperature(o.temperature);
  auto prob = [&](int32_t t) { return RelativeProb(ScaledLogit(v[t], vmax, inv_t)); };
  if (TopKActive(o.top_k, static_cast<int32_t>(order.size()))) {
    const float kth = v[order[o.top_k - 1]];
    order.erase(std::remove_if(order.begin(), order.end(), [&](int32_t t) { return v[t] < kth; }), order.end());
  }
  if (o.min_p > 0.0f) {
    const float min_p = MinPThreshold(o.min_p);
    order.erase(std::remove_if(order.begin(), order.end(), [&](int32_t t) { return prob(t) < min_p; }), order.end());
  }
  if (TopPActive(o.top_p)) {
    uint64_t total = 0;
    for (int32_t t : order) total += Mass(prob(t));
    const uint64_t target = TopPTarget(o.top_p, total);
    uint64_t cumulative = 0;
    size_t cut = 0;
    while (cumulative < target) cumulative += Mass(prob(order[cut++]));
    const float last = v[order[cut - 1]];
    while (cut < order.size() && v[order[cut]] == last) ++cut;
    order.resize(cut);
  }
  for (int32_t t : order) allowed[t] = true;
  return allowed;
}

// 1,000 random rows: vocabularies of 1 to 3,000 tokens, logits with ties
// (some quantized) and masked tokens, random temperature, top-k, top-p and
// min-p. The radix-selected support equals the sorted one token for token,
// and the sampled token is the Gumbel-max over it.
TEST(SamplingRuleTest, ThresholdSearchEqualsSortingOn1000Rows) {
  std::mt19937 rng(2024);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  SamplerScratch scratch;
  int restricted_by_k = 0, restricted_by_p = 0, restricted_by_min_p = 0, singletons = 0;
  for (int row_index = 0; row_index < 1000; ++row_index) {
    const int32_t vocab = 1 + static_cast<int32_t>(rng() % 3000);
    std::normal_distribution<float> normal(0.0f, 0.5f + 4.0f * unit(rng));
    const bool quantize = rng() % 3 == 0;  // many exact ties
    const float masked_fraction = rng() % 4 == 0 ? 0.5f * unit(rng) : 0.0f;
    std::vector<float> logits(vocab);
    std::vector<uint32_t> mask((vocab + 31) / 32, 0);
    for (int32_t t = 0; t < vocab; ++t) {
      logits[t] = quantize ? std::round(normal(rng) * 4.0f) / 4.0f : normal(rng);
      if (unit(rng) >= masked_fraction) mask[t / 32] |= 1u << (t % 32);
    }
    SampleRow row;
    SamplingOptions& o = row.options;
    o.temperature = 0.2f + 2.0f * unit(rng);
    o.top_k = rng() % 2 == 0 ? 0 : 1 + static_cast<int32_t>(rng() % std::max(1, vocab / 2));
    o.top_p = rng() % 2 == 0 ? 1.0f : 0.05f + 0.95f * unit(rng);
    o.min_p = rng() % 3 == 0 ? 0.3f * unit(rng) : 0.0f;
    row.rng_key = SplitMix64(row_index);
    row.position = row_index % 97;
    row.mask_row = 0;
    SampleParams p;
    p.logits = logits.data();
    p.num_rows = 1;
    p.vocab = vocab;
    p.rows = &row;
    p.allowed = mask.data();
    p.num_mask_rows = 1;
    p.words_per_row = static_cast<int32_t>(mask.size());
    ASSERT_TRUE(ValidateSampleParams(p).ok());
    const TokenId token = SampleLogits(p, 0, &scratch).token;

    std::vector<float> v(vocab);
    for (int32_t t = 0; t < vocab; ++t) v[t] = MaskAllows(mask.data(), t) ? logits[t] : -INFINITY;
    const std::vector<bool> expected = SortedSupport(v, o);
    const SamplingSupport support = FindSupport(v.data(), vocab, o, &scratch);
    int32_t size = 0;
    TokenId best = -1;
    double best_score = -std::numeric_limits<double>::infinity();
    const uint64_t row_key = NoiseRowKey(row.rng_key, row.position);
    for (int32_t t = 0; t < vocab; ++t) {
      ASSERT_EQ(support.Allows(v[t]), expected[t]) << "row " << row_index << " token " << t;
      if (!expected[t]) continue;
      ++size;
      const double score = GumbelScore(ScaledLogit(v[t], support.vmax, support.inv_t), row_key, t);
      if (best < 0 || Beats(score, t, best_score, best)) best = t, best_score = score;
    }
    EXPECT_EQ(token, best < 0 ? 0 : best) << "row " << row_index;
    // Which cuts bound the set, to see that the rows exercise each.
    SamplingOptions only = o;
    only.top_p = 1.0f, only.min_p = 0.0f;
    auto count = [&](const SamplingOptions& x) {
      const std::vector<bool> s = SortedSupport(v, x);
      return std::count(s.begin(), s.end(), true);
    };
    const auto all = count(SamplingOptions{o.temperature, 1.0f, 0, 0.0f});
    restricted_by_k += count(only) < all ? 1 : 0;
    only = o, only.top_k = 0, only.min_p = 0.0f;
    restricted_by_p += count(only) < all ? 1 : 0;
    only = o, only.top_k = 0, only.top_p = 1.0f;
    restricted_by_min_p += count(only) < all ? 1 : 0;
    singletons += size == 1 ? 1 : 0;
  }
  EXPECT_GT(restricted_by_k, 300);
  EXPECT_GT(restricted_by_p, 300);
  EXPECT_GT(restricted_by_min_p, 100);
  EXPECT_LT(singletons, 500);
  RecordProperty("restricted_by_k", restricted_by_k);
  RecordProperty("restricted_by_p", restricted_by_p);
  RecordProperty("restricted_by_min_p", restricted_by_min_p);
  RecordProperty("singletons", singletons);
}

}  // namespace
}  // namespace tandem::worker::sampling
