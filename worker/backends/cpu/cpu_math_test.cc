// AttendRow equals the row-at-a-time loop it replaces (Dot per key, then
// ExpShiftSum, then ScaleAdd per value) bit for bit, for the head sizes with a
// register-held output (64, 128) and others, over a scattered block table.
#include "worker/backends/cpu/cpu_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::worker::cpu {
namespace {

TEST(AttendRowTest, EqualsTheRowAtATimeLoopBitForBit) {
  std::printf("AVX2 in use: %s\n", UsingAvx2() ? "yes" : "no");
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  constexpr int32_t kBlockSize = 16;
  const std::vector<int32_t> table = {5, 0, 7, 2, 3, 6};  // blocks out of order
  for (int64_t dim : {64, 128, 48, 36}) {
    const int64_t stride = 3 * dim;  // three heads per cache row; this one is the second
    std::vector<float> k(8 * kBlockSize * stride), v(k.size()), q(dim);
    for (float& f : k) f = normal(rng);
    for (float& f : v) f = normal(rng);
    for (float& f : q) f = normal(rng);
    const PagedRows rows{k.data() + dim, v.data() + dim, table.data(), kBlockSize, stride};
    for (int32_t n : {1, 15, 16, 17, 90}) {
      auto row = [&](const std::vector<float>& cache, int32_t j) {
        return cache.data() + (int64_t{table[j / kBlockSize]} * kBlockSize + j % kBlockSize) * stride + dim;
      };
      const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
      std::vector<float> scores(n);
      float max = -INFINITY;
      for (int32_t j = 0; j < n; ++j) {
        scores[j] = Dot(q.data(), row(k, j), dim) * scale;
        max = std::max(max, scores[j]);
      }
      const float inv_sum = 1.0f / ExpShiftSum(scores.data(), max, n);
      std::vector<float> want(dim, 0.0f);
      for (int32_t j = 0; j < n; ++j) ScaleAdd(want.data(), 1.0f, scores[j] * inv_sum, row(v, j), dim);

      std::vector<float> got(dim, -1.0f), scratch(n);
      AttendRow(q.data(), rows, n, dim, scale, scratch.data(), got.data());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), dim * sizeof(float)), 0) << "dim=" << dim << " n=" << n;
    }
  }
}

}  // namespace
}  // namespace tandem::worker::cpu
