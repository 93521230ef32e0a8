// online_softmax.h against a plain two-pass softmax-weighted sum (in double):
// block by block at several block sizes, the merge of two partial states at
// every split position, masked (-inf) scores, fully masked inputs and large
// magnitudes.
#include "worker/backends/portable/online_softmax.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backends/portable/attention_testing.h"

namespace tandem::worker {
namespace {

constexpr int kDims = 5;
using Row = std::vector<float>;

// Two passes: max, then sum_j exp(s_j - max) v_j / sum_j exp(s_j - max);
// 0 when every score is masked.
Row TwoPass(const std::vector<float>& scores, const std::vector<Row>& values) {
  double max = -INFINITY;
  for (float s : scores) max = std::max(max, static_cast<double>(s));
  Row out(kDims, 0.0f);
  if (max == -INFINITY) return out;
  double sum = 0;
  std::vector<double> acc(kDims, 0.0);
  for (size_t j = 0; j < scores.size(); ++j) {
    const double w = std::exp(scores[j] - max);
    sum += w;
    for (int i = 0; i < kDims; ++i) acc[i] += w * values[j][i];
  }
  for (int i = 0; i < kDims; ++i) out[i] = static_cast<float>(acc[i] / sum);
  return out;
}

// A partial result: state and unnormalized accumulator.
struct Partial {
  SoftmaxState state = EmptySoftmaxState();
  float acc[kDims] = {};
};

// Scores [begin, end) folded kN at a time, the last block padded with -inf
// (and zero values), as the kernels pad a chunk past the end of a range.
template <int kN>
Partial Online(const std::vector<float>& scores, const std::vector<Row>& values, size_t begin, size_t end) {
  Partial p;
  for (size_t c = begin; c < end; c += kN) {
    float s[kN];
    float v[kN][kDims];
    for (int j = 0; j < kN; ++j) {
      const bool in = c + j < end;
      s[j] = in ? scores[c + j] : -INFINITY;
      for (int i = 0; i < kDims; ++i) v[j][i] = in ? values[c + j][i] : 0.0f;
    }
    float w[kN];
    const float factor = SoftmaxUpdate(&p.state, s, w);
    SoftmaxAccumulate(p.acc, factor, w, v);
  }
  return p;
}

Partial Merge(const Partial& a, const Partial& b) {
  Partial m;
  float fa, fb;
  m.state = SoftmaxMerge(a.state, b.state, &fa, &fb);
  for (int i = 0; i < kDims; ++i) m.acc[i] = a.acc[i] * fa + b.acc[i] * fb;
  return m;
}

Row Output(const Partial& p) {
  Row out(kDims);
  const float inv_sum = SoftmaxInvSum(p.state);
  for (int i = 0; i < kDims; ++i) out[i] = p.acc[i] * inv_sum;
  return out;
}

void ExpectRowNear(const Row& got, const Row& want, const std::string& where) {
  for (int i = 0; i < kDims; ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << where << " dim " << i;
    ASSERT_NEAR(got[i], want[i], 1e-5f) << where << " dim " << i;
  }
}

struct Input {
  std::vector<float> scores;
  std::vector<Row> values;
};

// n scores of the given spread around `offset`; masked with probability
// mask_permille / 1000.
Input Random(int n, float spread, float offset, int mask_permille, uint64_t seed) {
  attention_testing::Draws draws(seed);
  Input in;
  for (int j = 0; j < n; ++j) {
    in.scores.push_back(draws.Below(1000) < mask_permille ? -INFINITY : offset + draws.Uniform(-spread, spread));
    Row v(kDims);
    for (float& x : v) x = draws.Uniform(-1.0f, 1.0f);
    in.values.push_back(v);
  }
  return in;
}

struct Spread {
  float spread;
  float offset;
  int mask_permille;
};

// Ordinary scores; scores far from 0 (exp would overflow without the
// running max); a wide range where most weights underflow to 0; heavy
// masking.
const Spread kSpreads[] = {{3.0f, 0.0f, 0}, {5.0f, 1e4f, 100}, {80.0f, -3e4f, 0}, {2.0f, 0.0f, 700}};

TEST(OnlineSoftmaxTest, BlockByBlockEqualsTwoPass) {
  uint64_t seed = 1;
  for (const Spread& sp : kSpreads) {
    for (int n : {1, 2, 7, 8, 9, 31, 64, 257}) {
      const Input in = Random(n, sp.spread, sp.offset, sp.mask_permille, seed++);
      const Row want = TwoPass(in.scores, in.values);
      const std::string where = "n " + std::to_string(n) + " offset " + std::to_string(sp.offset);
      ExpectRowNear(Output(Online<1>(in.scores, in.values, 0, n)), want, where + " kN 1");
      ExpectRowNear(Output(Online<3>(in.scores, in.values, 0, n)), want, where + " kN 3");
      ExpectRowNear(Output(Online<8>(in.scores, in.values, 0, n)), want, where + " kN 8");
    }
  }
}

TEST(OnlineSoftmaxTest, MergeAtEverySplitEqualsTwoPass) {
  uint64_t seed = 100;
  for (const Spread& sp : kSpreads) {
    for (int n : {1, 5, 40, 130}) {
      const Input in = Random(n, sp.spread, sp.offset, sp.mask_permille, seed++);
      const Row want = TwoPass(in.scores, in.values);
      for (int split = 0; split <= n; ++split) {
        const Partial a = Online<8>(in.scores, in.values, 0, split);
        const Partial b = Online<8>(in.scores, in.values, split, n);
        const std::string where = "n " + std::to_string(n) + " split " + std::to_string(split);
        ExpectRowNear(Output(Merge(a, b)), want, where);
        ExpectRowNear(Output(Merge(b, a)), want, where + " swapped");
      }
    }
  }
}

TEST(OnlineSoftmaxTest, MergeOfManyPartsInOrderEqualsTwoPass) {
  // The split kernel's merge: parts of 16 scores, folded left to right.
  const Input in = Random(1000, 4.0f, 0.0f, 50, 7);
  Partial merged = Online<8>(in.scores, in.values, 0, 16);
  for (size_t begin = 16; begin < in.scores.size(); begin += 16) {
    merged = Merge(merged, Online<8>(in.scores, in.values, begin, std::min<size_t>(begin + 16, 1000)));
  }
  ExpectRowNear(Output(merged), TwoPass(in.scores, in.values), "1000 in parts of 16");
}

TEST(OnlineSoftmaxTest, FullyMaskedGivesZerosNotNan) {
  const Input in = Random(20, 1.0f, 0.0f, 1000, 3);
  const Partial p = Online<8>(in.scores, in.values, 0, 20);
  EXPECT_EQ(p.state.max, -INFINITY);
  EXPECT_EQ(p.state.sum, 0.0f);
  ExpectRowNear(Output(p), Row(kDims, 0.0f), "all masked");
  // Merged with an empty state on either side, and with a real one.
  ExpectRowNear(Output(Merge(p, Partial{})), Row(kDims, 0.0f), "masked + empty");
  const Input real = Random(9, 2.0f, 0.0f, 0, 4);
  const Partial r = Online<8>(real.scores, real.values, 0, 9);
  ExpectRowNear(Output(Merge(p, r)), TwoPass(real.scores, real.values), "masked + real");
  ExpectRowNear(Output(Merge(r, p)), TwoPass(real.scores, real.values), "real + masked");
}

TEST(OnlineSoftmaxTest, MaskedFirstBlockThenRealScores) {
  // A block wholly masked before any real score: its factor must be 0, not NaN.
  std::vector<float> scores(16, -INFINITY);
  std::vector<Row> values(16, Row(kDims, 0.5f));
  scores[12] = 3.0f;
  scores[15] = 2.0f;
  ExpectRowNear(Output(Online<8>(scores, values, 0, 16)), TwoPass(scores, values), "masked then real");
}

TEST(OnlineSoftmaxTest, WeightAndRescaleEdges) {
  EXPECT_EQ(SoftmaxWeight(-INFINITY, -INFINITY), 0.0f);
  EXPECT_EQ(SoftmaxWeight(-INFINITY, 3.0f), 0.0f);
  EXPECT_EQ(SoftmaxWeight(3.0f, 3.0f), 1.0f);
  EXPECT_EQ(SoftmaxRescale(-INFINITY, -INFINITY), 0.0f);
  EXPECT_EQ(SoftmaxRescale(-INFINITY, 1.0f), 0.0f);
  EXPECT_EQ(SoftmaxRescale(2.0f, 2.0f), 1.0f);
  EXPECT_EQ(SoftmaxInvSum(EmptySoftmaxState()), 0.0f);
}

}  // namespace
}  // namespace tandem::worker
