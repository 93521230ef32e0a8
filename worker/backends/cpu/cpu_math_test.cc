// AttendRow against a double-precision softmax over a scattered block table,
// for the head sizes with a register-held output (64, 128) and others, and
// AttendSpan's unnormalized spans, merged, against the whole; each with the
// versions the CPU selects (AVX2 here) and with the portable ones.
#include "worker/backends/cpu/cpu_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "common/gguf/ggml_types.h"
#include "gtest/gtest.h"

namespace tandem::worker::cpu {
namespace {

constexpr int32_t kBlockSize = 16;

struct Cache {
  int64_t dim;
  int64_t stride;  // three heads per cache row; the rows are the second's
  std::vector<int32_t> table = {5, 0, 7, 2, 3, 6, 1, 4};  // blocks out of order
  std::vector<float> k, v, q;

  explicit Cache(int64_t head_dim, uint32_t seed) : dim(head_dim), stride(3 * head_dim) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    k.resize(8 * kBlockSize * stride);
    v.resize(k.size());
    q.resize(dim);
    for (float& f : k) f = normal(rng);
    for (float& f : v) f = normal(rng);
    for (float& f : q) f = normal(rng);
  }
  PagedRows Rows() const { return {k.data() + dim, v.data() + dim, table.data(), kBlockSize, stride}; }
  const float* Row(const std::vector<float>& cache, int32_t j) const {
    return cache.data() + (int64_t{table[j / kBlockSize]} * kBlockSize + j % kBlockSize) * stride + dim;
  }
  float Scale() const { return 1.0f / std::sqrt(static_cast<float>(dim)); }
  // softmax(q . k_j * scale) v_j over rows [0, n), in double.
  std::vector<double> Reference(int32_t n) const {
    std::vector<double> scores(n);
    double max = -INFINITY;
    for (int32_t j = 0; j < n; ++j) {
      double dot = 0;
      for (int64_t i = 0; i < dim; ++i) dot += double{q[i]} * Row(k, j)[i];
      scores[j] = dot * Scale();
      max = std::max(max, scores[j]);
    }
    double sum = 0;
    for (double& s : scores) sum += (s = std::exp(s - max));
    std::vector<double> out(dim, 0.0);
    for (int32_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < dim; ++i) out[i] += scores[j] / sum * Row(v, j)[i];
    }
    return out;
  }
};

// Float rounding over up to 128 rows of unit-variance values: well below
// 1e-5, while a row or block read from the wrong place, a lost row of the
// eight-row groups or a wrong merge weight moves outputs by 1e-2 or more.
constexpr double kTolerance = 1e-5;

// Param: whether to run the portable versions.
class CpuMathTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    UsePortableForTesting(GetParam());
    std::printf("AVX2 in use: %s\n", UsingAvx2() ? "yes" : "no");
  }
  void TearDown() override { UsePortableForTesting(false); }
};

TEST_P(CpuMathTest, AttendRowMatchesADoublePrecisionSoftmax) {
  for (int64_t dim : {64, 128, 48, 36}) {
    const Cache c(dim, static_cast<uint32_t>(dim));
    // Across the eight-row groups, blocks and their ends.
    for (int32_t n : {1, 7, 8, 9, 15, 16, 17, 24, 90, 128}) {
      const std::vector<double> want = c.Reference(n);
      std::vector<float> got(dim, -1.0f), scores(n);
      AttendRow(c.q.data(), c.Rows(), n, dim, c.Scale(), scores.data(), got.data());
      for (int64_t i = 0; i < dim; ++i) ASSERT_NEAR(got[i], want[i], kTolerance) << "dim=" << dim << " n=" << n;
    }
  }
}

TEST_P(CpuMathTest, SpansMergeToTheWhole) {
  for (int64_t dim : {64, 48}) {
    const Cache c(dim, 7);
    for (int32_t n : {20, 64, 90, 128}) {
      // Spans that start mid-block and mid-group, and the 64-row spans
      // cpu_attention.h uses.
      for (int32_t width : {13, 16, 64}) {
        const int32_t spans = (n + width - 1) / width;
        std::vector<SpanSums> sums(spans);
        std::vector<float> outs(spans * dim), scores(width), got(dim, -1.0f);
        for (int32_t s = 0; s < spans; ++s) {
          AttendSpan(c.q.data(), c.Rows(), s * width, std::min(n, (s + 1) * width), dim, c.Scale(), scores.data(),
                     outs.data() + s * dim, &sums[s]);
        }
        MergeSpans(spans, sums.data(), outs.data(), dim, got.data());
        const std::vector<double> want = c.Reference(n);
        for (int64_t i = 0; i < dim; ++i) {
          ASSERT_NEAR(got[i], want[i], kTolerance) << "dim=" << dim << " n=" << n << " width=" << width;
        }
      }
    }
  }
}

TEST_P(CpuMathTest, NormalizedSpanFromZeroIsAttendRow) {
  const Cache c(64, 3);
  std::vector<float> row(64), span(64), scores(90);
  AttendRow(c.q.data(), c.Rows(), 90, 64, c.Scale(), scores.data(), row.data());
  AttendSpan(c.q.data(), c.Rows(), 0, 90, 64, c.Scale(), scores.data(), span.data(), nullptr);
  EXPECT_EQ(std::memcmp(row.data(), span.data(), sizeof(float) * 64), 0);
}

// A cache of half floats gives the bits a float cache holding the same values
// gives (the halves widen exactly; the arithmetic is the float one), with
// normalized and unnormalized spans, spans that start mid-block, the head
// sizes with a register-held output (64, 128) and others (36: rows outside
// the eight-row groups; 72: the general output loop), and while prefetching.
TEST_P(CpuMathTest, HalfRowsGiveTheBitsOfFloatRowsWithTheirValues) {
  for (int64_t dim : {64, 128, 36, 72}) {
    Cache c(dim, 7);
    std::vector<uint16_t> k(c.k.size()), v(c.v.size());
    FloatsToHalves(c.k.data(), k.data(), static_cast<int64_t>(k.size()));
    FloatsToHalves(c.v.data(), v.data(), static_cast<int64_t>(v.size()));
    for (size_t i = 0; i < k.size(); ++i) c.k[i] = gguf::HalfToFloat(k[i]), c.v[i] = gguf::HalfToFloat(v[i]);
    const PagedHalfRows half{k.data() + dim, v.data() + dim, c.table.data(), kBlockSize, c.stride};
    std::vector<float> want(dim), got(dim), scores(128);
    AttendRow(c.q.data(), c.Rows(), 101, dim, c.Scale(), scores.data(), want.data());
    AttendRow(c.q.data(), half, 101, dim, c.Scale(), scores.data(), got.data());
    EXPECT_EQ(std::memcmp(want.data(), got.data(), sizeof(float) * dim), 0) << "dim " << dim;
    SpanSums want_sums, got_sums;
    AttendSpan(c.q.data(), c.Rows(), 13, 77, dim, c.Scale(), scores.data(), want.data(), &want_sums);
    RowPrefetcher ahead;
    ahead.Reset(k.data(), v.data(), c.table.data(), kBlockSize, c.stride * int64_t{sizeof(uint16_t)}, 77, 128, 64);
    AttendSpan(c.q.data(), half, 13, 77, dim, c.Scale(), scores.data(), got.data(), &got_sums, &ahead);
    EXPECT_EQ(std::memcmp(want.data(), got.data(), sizeof(float) * dim), 0) << "dim " << dim;
    EXPECT_EQ(want_sums.max, got_sums.max);
    EXPECT_EQ(want_sums.sum, got_sums.sum);
  }
}

// FloatsToHalves rounds every finite float as gguf::FloatToHalf does (to
// nearest, ties to even; too large to infinity; subnormal halves), over a
// sweep of bit patterns and the boundaries, at lengths with and without a
// tail past the eight-wide loop.
TEST_P(CpuMathTest, FloatsToHalvesRoundsAsGgufDoes) {
  std::vector<float> src = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.9f, 65520.0f, 1e9f, -1e9f, INFINITY,
                            -INFINITY, 0x1.0p-14f, 0x1.0p-24f, 0x1.0p-25f, 0x1.8p-25f, 0x1.0p-26f, 1.00048828125f,
                            1.000732421875f, 1.001220703125f};
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 65521) {
    const auto b = static_cast<uint32_t>(bits);
    float f;
    std::memcpy(&f, &b, sizeof(f));
    if (!std::isnan(f)) src.push_back(f);
  }
  for (int64_t n : {static_cast<int64_t>(src.size()), int64_t{8}, int64_t{7}}) {
    std::vector<uint16_t> got(n);
    FloatsToHalves(src.data(), got.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[i], gguf::FloatToHalf(src[i])) << "src " << src[i] << " (" << i << " of " << n << ")";
    }
  }
}

// HalvesToFloats gives every half's value, as gguf::HalfToFloat: all 63,490
// non-NaN bit patterns (subnormals, zeros, infinities), at lengths with and
// without a tail past the eight-wide loop.
TEST_P(CpuMathTest, HalvesToFloatsWidensAsGgufDoes) {
  std::vector<uint16_t> src;
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    if ((bits & 0x7c00) != 0x7c00 || (bits & 0x3ff) == 0) src.push_back(static_cast<uint16_t>(bits));
  }
  ASSERT_EQ(src.size(), 63490u);  // all but the 2 x 1,023 NaNs
  for (int64_t n : {static_cast<int64_t>(src.size()), int64_t{8}, int64_t{7}}) {
    std::vector<float> got(n);
    HalvesToFloats(src.data(), got.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const float want = gguf::HalfToFloat(src[i]);
      ASSERT_EQ(std::memcmp(&got[i], &want, sizeof(float)), 0) << "half 0x" << std::hex << src[i];
    }
  }
}

// Keys and values read while a prefetcher walks other rows: the same bits.
TEST_P(CpuMathTest, ASpanGetsTheSameBitsWhilePrefetching) {
  const Cache c(64, 5);
  std::vector<float> plain(64), fetching(64), scores(64);
  SpanSums plain_sums, fetching_sums;
  AttendSpan(c.q.data(), c.Rows(), 13, 77, 64, c.Scale(), scores.data(), plain.data(), &plain_sums);
  RowPrefetcher ahead;
  ahead.Reset(c.k.data(), c.v.data(), c.table.data(), kBlockSize, c.stride * int64_t{sizeof(float)}, 77, 128, 2 * 64);
  ASSERT_TRUE(ahead.active());
  AttendSpan(c.q.data(), c.Rows(), 13, 77, 64, c.Scale(), scores.data(), fetching.data(), &fetching_sums, &ahead);
  // (The portable version asks for nothing.)
  if (UsingAvx2()) {
    EXPECT_FALSE(ahead.active()) << "a span's visits ask for every line";
  }
  EXPECT_EQ(std::memcmp(plain.data(), fetching.data(), sizeof(float) * 64), 0);
  EXPECT_EQ(plain_sums.max, fetching_sums.max);
  EXPECT_EQ(plain_sums.sum, fetching_sums.sum);
}

INSTANTIATE_TEST_SUITE_P(Versions, CpuMathTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Portable" : "Selected";
                         });

// The lines a RowPrefetcher asks for: every byte of rows [first, last) of
// the keys, then of the values, through the block table; each line once and
// no line outside those rows. Rows of 768 bytes (whole lines) and of 432
// (rows that start mid-line).
TEST(RowPrefetcherTest, AsksForEveryLineOfTheRowsKeysThenValues) {
  for (int64_t dim : {64, 36}) {
    const Cache c(dim, 1);
    const int64_t row_bytes = c.stride * int64_t{sizeof(float)};
    for (auto [first, last] : {std::pair{0, 128}, std::pair{13, 77}, std::pair{16, 32}, std::pair{40, 41}}) {
      RowPrefetcher ahead;
      ahead.Reset(c.k.data(), c.v.data(), c.table.data(), kBlockSize, c.stride * int64_t{sizeof(float)}, first, last, 1);
      std::vector<const char*> lines;
      for (const char* line; (line = ahead.NextLine()) != nullptr;) lines.push_back(line);
      EXPECT_FALSE(ahead.active());
      // Which cache a line is in and whether it starts inside one of the rows.
      auto row_of = [&](const std::vector<float>& cache, const char* line) {
        const int64_t offset = line - reinterpret_cast<const char*>(cache.data());
        if (offset < 0 || offset >= static_cast<int64_t>(cache.size() * sizeof(float))) return -1;
        const int64_t slot = offset / row_bytes;  // block * kBlockSize + row in block
        const auto block = std::find(c.table.begin(), c.table.end(), slot / kBlockSize) - c.table.begin();
        const int64_t j = block * kBlockSize + slot % kBlockSize;
        return j >= first && j < last ? static_cast<int>(j) : -1;
      };
      std::vector<int64_t> covered_k(last - first), covered_v(last - first);  // bytes of each row covered
      bool in_values = false;
      std::vector<const char*> sorted = lines;
      std::sort(sorted.begin(), sorted.end());
      ASSERT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "a line asked for twice";
      for (const char* line : lines) {
        const int jk = row_of(c.k, line);
        const int jv = row_of(c.v, line);
        ASSERT_TRUE(jk >= 0 || jv >= 0) << "a line outside rows [" << first << ", " << last << ")";
        if (jv >= 0) in_values = true;
        ASSERT_FALSE(in_values && jk >= 0) << "a key line after the values began";
        // The bytes of this line within its row and the rows after it.
        const std::vector<float>& cache = jk >= 0 ? c.k : c.v;
        std::vector<int64_t>& covered = jk >= 0 ? covered_k : covered_v;
        for (int64_t b = 0; b < 64; ++b) {
          if (const int j = row_of(cache, line + b); j >= 0) ++covered[j - first];
        }
      }
      for (int32_t j = first; j < last; ++j) {
        EXPECT_GE(covered_k[j - first], row_bytes) << "key row " << j << " dim " << dim;
        EXPECT_GE(covered_v[j - first], row_bytes) << "value row " << j << " dim " << dim;
      }
      // Whole lines per run of rows contiguous in a block (at most 9 runs
      // per cache here), and no more.
      EXPECT_LE(static_cast<int64_t>(lines.size()), 2 * ((last - first) * row_bytes / 64 + 9));
    }
  }
}

// Spread over `visits` visits, the lines are all asked for by the last.
TEST(RowPrefetcherTest, VisitsAskForEveryLineByTheLastVisit) {
  const Cache c(64, 2);
  RowPrefetcher ahead;
  EXPECT_FALSE(ahead.active());
  ahead.Reset(c.k.data(), c.v.data(), c.table.data(), kBlockSize, c.stride * int64_t{sizeof(float)}, 5, 70, 9 * 2 * 65);
  for (int i = 0; i + 1 < 9 * 2 * 65; ++i) ahead.Visit(1);
  ahead.Visit(1);
  EXPECT_FALSE(ahead.active());
  EXPECT_EQ(ahead.NextLine(), nullptr);
  ahead.Reset(c.k.data(), c.v.data(), c.table.data(), kBlockSize, c.stride * int64_t{sizeof(float)}, 5, 70, 10);
  ahead.Clear();
  EXPECT_FALSE(ahead.active());
  EXPECT_EQ(ahead.NextLine(), nullptr);
}

}  // namespace
}  // namespace tandem::worker::cpu
