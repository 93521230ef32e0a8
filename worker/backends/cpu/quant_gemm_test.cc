// The quantized-weight kernels: the AVX2 versions (when the CPU has them)
// equal the scalar reference bit for bit on odd shapes of all three types,
// their error against float32 stays within what 8-bit activations allow, and
// the float path equals the float GEMM on weights expanded at load.
#include "worker/backends/cpu/quant_gemm.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/gguf/ggml_types.h"
#include "gtest/gtest.h"
#include "worker/backends/cpu/cpu_gemm.h"

namespace tandem::worker::cpu {
namespace {

using gguf::GgmlType;

std::vector<float> RandomFloats(std::mt19937& rng, int64_t n, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = normal(rng);
  return v;
}

// n rows of k random weights, quantized to `type`; `dense` gets their values.
std::vector<uint8_t> RandomWeights(std::mt19937& rng, GgmlType type, int64_t n, int64_t k, std::vector<float>* dense) {
  const std::vector<float> f = RandomFloats(rng, n * k, 0.5f);
  const int64_t row_bytes = gguf::RowBytes(type, k);
  std::vector<uint8_t> w(n * row_bytes);
  dense->resize(n * k);
  for (int64_t r = 0; r < n; ++r) {
    EXPECT_TRUE(gguf::QuantizeRow(type, f.data() + r * k, w.data() + r * row_bytes, k).ok());
    EXPECT_TRUE(gguf::DequantizeRow(type, w.data() + r * row_bytes, dense->data() + r * k, k).ok());
  }
  return w;
}

std::vector<float> RandomActivations(std::mt19937& rng, int64_t m, int64_t k) {
  std::vector<float> x = RandomFloats(rng, m * k, 1.0f);
  // Outliers, as real activations have, and an all-zero block.
  for (int64_t i = 0; i < m * k; i += 37) x[i] *= 20.0f;
  if (k >= 64) std::fill(x.begin() + 32, x.begin() + 64, 0.0f);
  return x;
}

class QuantGemmTest : public ::testing::TestWithParam<GgmlType> {
 protected:
  int32_t type() const { return static_cast<int32_t>(GetParam()); }

  // n GGUF rows as the kernels read them.
  std::vector<uint8_t> Pack(const std::vector<uint8_t>& w, int64_t n, int64_t k) const {
    std::vector<uint8_t> packed(PackedWeightBytes(type(), n, k), 0xa5);
    PackWeightRows(type(), w.data(), n, k, packed.data());
    return packed;
  }

  void ExpectEveryShapeEqualsTheReference();
  void ExpectEveryBatchSizeEqualsTheReference();

  // QuantGemm of random m x k activations by n random weight rows equals
  // QuantDotReference bit for bit, with and without accumulation.
  void ExpectReferenceBits(ThreadPool& pool, std::mt19937& rng, int64_t m, int64_t n, int64_t k) {
    std::vector<float> dense;
    const std::vector<uint8_t> w = RandomWeights(rng, GetParam(), n, k, &dense);
    const std::vector<float> x = RandomActivations(rng, m, k);
    const std::vector<uint8_t> packed = Pack(w, n, k);
    QuantizedRows xq;
    QuantizeRows(pool, x.data(), m, k, &xq);
    for (bool accumulate : {false, true}) {
      std::vector<float> y(m * n, 0.25f);
      QuantGemm(pool, xq, packed.data(), type(), n, y.data(), accumulate);
      const int64_t row_bytes = QuantizedRowBytes(type(), k);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const float dot = QuantDotReference(xq, i, w.data() + j * row_bytes, type());
          const float want = accumulate ? 0.25f + dot : dot;
          ASSERT_EQ(std::memcmp(&y[i * n + j], &want, sizeof(float)), 0)
              << "m=" << m << " n=" << n << " k=" << k << " (" << i << ", " << j << "): " << y[i * n + j] << " vs "
              << want;
        }
      }
    }
  }
};

// The plain AVX2 kernels while it lives, on a CPU with VNNI too.
struct WithoutVnni {
  WithoutVnni() { AllowQuantVnniForTest(false); }
  ~WithoutVnni() { AllowQuantVnniForTest(true); }
};

// Runs `body` with the kernels this CPU picks and, where that means VNNI,
// again with the plain AVX2 ones.
template <typename Body>
void WithAndWithoutVnni(Body body) {
  std::printf("AVX2 kernels in use: %s; VNNI: %s\n", UsingQuantAvx2() ? "yes" : "no (the reference runs)",
              UsingQuantVnni() ? "yes (then without)" : "no");
  const bool vnni = UsingQuantVnni();
  body();
  if (!vnni) return;
  WithoutVnni off;
  EXPECT_FALSE(UsingQuantVnni());
  body();
}

TEST_P(QuantGemmTest, EqualsTheScalarReferenceBitForBit) {
  WithAndWithoutVnni([&] { ExpectEveryShapeEqualsTheReference(); });
}

TEST_P(QuantGemmTest, EveryBatchSizeEqualsTheReference) {
  WithAndWithoutVnni([&] { ExpectEveryBatchSizeEqualsTheReference(); });
}

TEST_P(QuantGemmTest, PrefetchingChangesNoBits) {
  // The kernels' software prefetches (on by default on Intel only) run
  // whatever this CPU's default, and their absence too.
  const int64_t default_bytes = QuantPrefetchBytes();
  for (int64_t bytes : {int64_t{0}, int64_t{8192}, int64_t{64}}) {
    SetQuantPrefetchBytes(bytes);
    ExpectEveryShapeEqualsTheReference();
    ExpectEveryBatchSizeEqualsTheReference();
  }
  SetQuantPrefetchBytes(default_bytes);
}

void QuantGemmTest::ExpectEveryShapeEqualsTheReference() {
  std::mt19937 rng(1);
  for (int32_t threads : {1, 2}) {
    ThreadPool pool(threads);
    // k = 1280: more blocks than the kernels' run of precomputed scales;
    // m = 40: more rows than one chunk of x at k = 576 and 1280.
    for (int64_t k : {32, 96, 576, 1280}) {
      for (int64_t m : {1, 2, 3, 4, 5, 7, 40}) {
        for (int64_t n : {1, 3, 4, 5, 17, 29, 67}) {
          ExpectReferenceBits(pool, rng, m, n, k);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

void QuantGemmTest::ExpectEveryBatchSizeEqualsTheReference() {
  // A row's result may not depend on how many rows share its matmul (batch
  // invariance): the kernels change tile shapes with the rows (1-row GEMV
  // tiles, 3-row tiles, weight groups unpacked once per chunk from 6 rows)
  // and split rows into chunks (about 15 rows at k = 4096, 51 at 1280), so
  // every count from 1 to 70 meets a different mix of full and ragged tiles.
  std::mt19937 rng(5);
  ThreadPool pool(2);
  for (int64_t m = 1; m <= 70; ++m) {
    ExpectReferenceBits(pool, rng, m, 67, 32);
    ExpectReferenceBits(pool, rng, m, 5, 1280);
    ExpectReferenceBits(pool, rng, m, 5, 4096);
    if (HasFatalFailure()) return;
  }
}

TEST_P(QuantGemmTest, ErrorWithinWhatEightBitActivationsAllow) {
  // Rounding x to d * q moves each element by at most d / 2 (d = max|x| / 127
  // of its block), so |y - y_float| <= sum |w| d / 2, plus float rounding.
  std::mt19937 rng(2);
  ThreadPool pool(2);
  const int64_t m = 3, n = 40, k = 576;
  std::vector<float> dense;
  const std::vector<uint8_t> w = RandomWeights(rng, GetParam(), n, k, &dense);
  const std::vector<float> x = RandomActivations(rng, m, k);
  QuantizedRows xq;
  QuantizeRows(pool, x.data(), m, k, &xq);
  std::vector<float> y(m * n);
  QuantGemm(pool, xq, Pack(w, n, k).data(), type(), n, y.data(), false);
  double worst_share = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double exact = 0, bound = 0, magnitude = 0;
      for (int64_t e = 0; e < k; ++e) {
        exact += double{x[i * k + e]} * dense[j * k + e];
        bound += std::fabs(dense[j * k + e]) * xq.d[i * (k / 32) + e / 32] / 2;
        magnitude += std::fabs(double{x[i * k + e]} * dense[j * k + e]);
      }
      const double err = std::fabs(y[i * n + j] - exact);
      EXPECT_LE(err, bound + 1e-5 * magnitude) << i << ", " << j;
      worst_share = std::max(worst_share, err / bound);
    }
  }
  std::printf("largest error: %.2f of the bound\n", worst_share);
}

TEST_P(QuantGemmTest, FloatPathEqualsTheFloatGemmOfExpandedWeights) {
  std::mt19937 rng(3);
  ThreadPool pool(2);
  const int64_t m = 7, n = 131, k = 96;
  std::vector<float> dense;
  const std::vector<uint8_t> w = RandomWeights(rng, GetParam(), n, k, &dense);
  const std::vector<float> x = RandomActivations(rng, m, k);
  std::vector<float> want(m * n), got(m * n);
  Gemm(pool, x.data(), m, dense.data(), n, k, want.data(), false);
  std::vector<std::vector<float>> scratch;
  DequantGemm(pool, x.data(), m, Pack(w, n, k).data(), type(), n, k, got.data(), false, &scratch);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
}

TEST_P(QuantGemmTest, PackingKeepsEveryRowsBlocks) {
  // Every row unpacks to its GGUF bytes, a partial last pair of groups
  // included, the packed size is the rows' own rounded up to whole pairs,
  // and packing runs of whole pairs one after the other (as the backend does
  // in parallel) gives the same bytes as packing all rows at once.
  std::mt19937 rng(6);
  const int64_t k = 96;
  const int64_t row_bytes = QuantizedRowBytes(type(), k);
  for (int64_t n : {1, 3, 4, 5, 8, 11, 16, 19, 27, 32, 45}) {
    std::vector<float> dense;
    const std::vector<uint8_t> w = RandomWeights(rng, GetParam(), n, k, &dense);
    const std::vector<uint8_t> packed = Pack(w, n, k);
    EXPECT_EQ(static_cast<int64_t>(packed.size()), (n + kPackRows - 1) / kPackRows * kPackRows * row_bytes);
    std::vector<uint8_t> row(row_bytes);
    for (int64_t j = 0; j < n; ++j) {
      UnpackWeightRow(type(), packed.data(), k, j, row.data());
      EXPECT_EQ(std::memcmp(row.data(), w.data() + j * row_bytes, row_bytes), 0) << "n=" << n << " row " << j;
    }
    if (n > kPackRows) {
      std::vector<uint8_t> runs(packed.size(), 0x5a);
      PackWeightRows(type(), w.data(), kPackRows, k, runs.data());
      PackWeightRows(type(), w.data() + kPackRows * row_bytes, n - kPackRows, k, runs.data() + kPackRows * row_bytes);
      EXPECT_EQ(runs, packed) << "n=" << n;
    }
  }
}

TEST_P(QuantGemmTest, FloatXEqualsXQuantizedOnce) {
  // QuantGemmFloat (each thread quantizing x for itself, up to
  // kOwnQuantizeMaxRows rows) equals QuantizeRows then QuantGemmGroup bit for
  // bit: on pools of 1 to 3 threads, on either side of the cutover, and for
  // calls one after the other on one scratch whose x, rows and width change
  // (a thread must never run a task on a previous call's x: the first two
  // calls have the same shape).
  struct Shape {
    int64_t m, k;
  };
  const Shape shapes[] = {{1, 576}, {1, 576}, {5, 96}, {40, 1280}, {kOwnQuantizeMaxRows, 64},
                          {kOwnQuantizeMaxRows + 1, 64}, {2, 576}};
  std::mt19937 rng(7);
  for (int32_t threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    QuantGemmScratch scratch;
    for (const Shape& shape : shapes) {
      const int64_t m = shape.m, k = shape.k, n[2] = {29, 67};
      std::vector<uint8_t> packed[2];
      for (int o = 0; o < 2; ++o) {
        std::vector<float> dense;
        packed[o] = Pack(RandomWeights(rng, GetParam(), n[o], k, &dense), n[o], k);
      }
      const std::vector<float> x = RandomActivations(rng, m, k);
      std::vector<float> want[2], got[2];
      QuantGemmOutput want_out[2], got_out[2];
      for (int o = 0; o < 2; ++o) {
        want[o].assign(m * n[o], 0.25f);
        got[o].assign(m * n[o], 0.25f);
        want_out[o] = {packed[o].data(), type(), n[o], want[o].data(), /*accumulate=*/o == 1};
        got_out[o] = {packed[o].data(), type(), n[o], got[o].data(), /*accumulate=*/o == 1};
      }
      QuantizedRows xq;
      QuantizeRows(pool, x.data(), m, k, &xq);
      QuantGemmGroup(pool, xq, want_out, 2);
      QuantGemmFloat(pool, x.data(), m, k, got_out, 2, &scratch);
      for (int o = 0; o < 2; ++o) {
        ASSERT_EQ(std::memcmp(want[o].data(), got[o].data(), want[o].size() * sizeof(float)), 0)
            << threads << " threads, m=" << m << " k=" << k << " output " << o;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, QuantGemmTest, ::testing::Values(GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0),
                         [](const auto& info) { return std::string(gguf::GgmlTypeName(static_cast<uint32_t>(info.param))); });

TEST(QuantizeRowsTest, EqualsTheScalarReferenceBitForBit) {
  std::mt19937 rng(4);
  ThreadPool pool(2);
  const int64_t m = 9, k = 576;
  std::vector<float> x = RandomActivations(rng, m, k);
  x[100] = 0.5f / 127 * 3;  // halfway cases round to even
  QuantizedRows xq;
  QuantizeRows(pool, x.data(), m, k, &xq);
  std::vector<int8_t> q(k);
  std::vector<float> d(k / 32), s(k / 32);
  for (int64_t i = 0; i < m; ++i) {
    QuantizeRowReference(x.data() + i * k, k, q.data(), d.data(), s.data());
    EXPECT_EQ(std::memcmp(q.data(), xq.q.data() + i * k, k), 0) << i;
    EXPECT_EQ(std::memcmp(d.data(), xq.d.data() + i * (k / 32), d.size() * sizeof(float)), 0) << i;
    EXPECT_EQ(std::memcmp(s.data(), xq.s.data() + i * (k / 32), s.size() * sizeof(float)), 0) << i;
  }
  EXPECT_EQ(xq.q[32], 0);  // the zero block
  EXPECT_EQ(xq.d[1], 0.0f);
}

void ExpectMinus128MultipliesExactly();

TEST(QuantGemmEdgeTest, Q8_0WeightOfMinus128) {
  // GGUF writers emit -127..127, but -128 fits the format: |w| = 128 must
  // still multiply exactly (the kernel moves signs onto x).
  WithAndWithoutVnni([] { ExpectMinus128MultipliesExactly(); });
}

void ExpectMinus128MultipliesExactly() {
  ThreadPool pool(1);
  std::vector<uint8_t> w(34, 0);
  const uint16_t one = gguf::FloatToHalf(1.0f);
  std::memcpy(w.data(), &one, 2);
  for (int e = 0; e < 32; ++e) w[2 + e] = static_cast<uint8_t>(e % 2 ? -128 : 127);
  std::vector<float> x(32, 1.0f);
  QuantizedRows xq;
  QuantizeRows(pool, x.data(), 1, 32, &xq);
  const auto type = static_cast<int32_t>(GgmlType::kQ8_0);
  std::vector<uint8_t> packed(PackedWeightBytes(type, 1, 32));
  PackWeightRows(type, w.data(), 1, 32, packed.data());
  float y = 0;
  QuantGemm(pool, xq, packed.data(), type, 1, &y, false);
  EXPECT_FLOAT_EQ(y, 16 * (127.0f - 128.0f));
}

}  // namespace
}  // namespace tandem::worker::cpu
