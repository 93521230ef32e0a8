// CudaBackend against CpuBackend on the same inputs, kernel by kernel (whole
// forward passes: cuda_forward_test.cc). Two kinds of tests:
//  * everywhere (CI has no GPU): CudaDeviceUsable's message, the launchers'
//    host-side checks, the GEMM's row-major/column-major shape against a
//    column-major reference, the bf16 GEMM tolerance against a host model of
//    bf16 rounding;
//  * on a device (label gpu; each skips with the reason where no device is
//    usable): copies and the staging ring, weight decoding bit for bit, each
//    kernel and Matmul against CpuBackend.
//
// Tolerances. bf16 keeps 8 significant bits (7 stored), so rounding to
// nearest changes x and W by at most u = 2^-8 relative each, and each
// product by at most (2u + u^2)|x w| = (2^-7 + 2^-16)|x w|; fp32 sums of K
// terms, in any order, are within K 2^-24 sum|x w| of the exact sum, once for
// the GPU and once for the CPU. So
// |gpu - cpu| <= (2^-7 + 2^-16 + 2 K 2^-24) * sum_k |x_k w_k| for bf16
// weights: a bound, not a guess (BF16BoundHoldsOnTheHost checks it on the
// host). fp32 weights: within 1e-4 of sum_k |x_k w_k|.
#include "worker/backends/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common/gguf/ggml_types.h"
#include "common/gguf/gguf_file.h"
#include "gtest/gtest.h"
#include "worker/backends/cpu/cpu_backend.h"
#include "worker/backends/cuda/cuda_test_util.h"
#include "worker/backends/cuda/elementwise.h"
#include "worker/backends/cuda/gemm_shape.h"
#include "worker/backends/cuda/gemv.h"
#include "worker/backends/portable/quant.h"

namespace tandem::worker {
namespace {

using cuda_test::Both;
using cuda_test::CudaBackendTest;
using cuda_test::Get;
using cuda_test::Put;
using cuda_test::RandomFloats;
using cuda_test::WorstRatio;

// --- helpers ---

// A GGUF tensor of `rows` x `cols` (ggml shape [cols, rows]) of `type`, over
// bytes it owns.
struct HostTensor {
  std::vector<uint8_t> bytes;
  gguf::GgufTensor tensor;
};

HostTensor MakeTensor(gguf::GgmlType type, int64_t rows, int64_t cols, const std::vector<float>& values) {
  HostTensor h;
  const int64_t row_bytes = gguf::RowBytes(type, cols);
  h.bytes.resize(static_cast<size_t>(rows * row_bytes));
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(gguf::QuantizeRow(type, values.data() + r * cols, h.bytes.data() + r * row_bytes, cols).ok());
  }
  h.tensor.name = "test";
  h.tensor.shape = rows == 1 ? std::vector<int64_t>{cols} : std::vector<int64_t>{cols, rows};
  h.tensor.type = type;
  h.tensor.num_elements = rows * cols;
  h.tensor.num_bytes = static_cast<int64_t>(h.bytes.size());
  h.tensor.data = h.bytes.data();
  return h;
}

// sum_k |x[i, k]| |w[j, k]| for every (i, j): the scale of y[i, j]'s error.
std::vector<double> AbsProducts(const std::vector<float>& x, const std::vector<float>& w, int64_t m, int64_t rows,
                                int64_t cols) {
  std::vector<double> s(static_cast<size_t>(m * rows));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < rows; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < cols; ++k) sum += std::abs(double{x[i * cols + k]} * w[j * cols + k]);
      s[i * rows + j] = sum;
    }
  }
  return s;
}

double Bf16GemmBound(int64_t k) { return std::ldexp(1.0, -7) + std::ldexp(1.0, -16) + 2.0 * k * std::ldexp(1.0, -24); }

// --- everywhere ---

TEST(CudaDeviceUsableTest, SaysWhyWhenThereIsNoUsableDevice) {
  const absl::Status status = CudaDeviceUsable(0);
  std::printf("CudaDeviceUsable(0): %s\n", status.ToString().c_str());
  if (status.ok()) {
    // A device is here: an index past the last one is refused instead.
    const absl::Status out_of_range = CudaDeviceUsable(1 << 20);
    EXPECT_EQ(out_of_range.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(out_of_range.message().find("out of range"), std::string::npos) << out_of_range;
    return;
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("CUDA device 0 is not usable: "), std::string::npos) << status;
  const bool names_cause = status.message().find("driver") != std::string::npos ||
                           status.message().find("no CUDA device") != std::string::npos;
  EXPECT_TRUE(names_cause) << status;
  EXPECT_EQ(CudaDeviceUsable(-1).code(), absl::StatusCode::kFailedPrecondition);
  auto backend = CudaBackend::Create({});
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
}

// The launchers check sizes before they touch the device, and launch nothing
// for empty work: all of this runs without one.
TEST(CudaLaunchersTest, RefuseBadSizesAndSkipEmptyWork) {
  float f = 0;
  int32_t i = 0;
  RopeParams rope{&f, &f, &i, 1, 1, 1, 8, 3, 10000.0f, 1.0f};
  EXPECT_EQ(LaunchRope(rope, nullptr).code(), absl::StatusCode::kInvalidArgument);
  rope.rope_dim = 10;
  EXPECT_EQ(LaunchRope(rope, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LaunchRmsNorm({&f, &f, &f, 1, 0, 1e-5f}, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LaunchRmsNorm({&f, &f, &f, -1, 8, 1e-5f}, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LaunchDequantize(14, &f, 32, &f, true, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LaunchDequantize(portable::kGgmlQ8_0, &f, 33, &f, true, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LaunchWriteKv({{&f, &f}, &f, &f, nullptr, 1, 0}, nullptr).code(), absl::StatusCode::kInvalidArgument);
  int64_t first_slot = 0;  // float32 caches only
  EXPECT_EQ(LaunchWriteKv({{&f, &f, KvType::kF16}, &f, &f, &first_slot, 1, 8}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  // The fused rotation and write: each half's checks, and the cache must take
  // the rotation's keys.
  float other = 0;
  int64_t slot = 0;
  RopeParams fused_rope{&f, &f, &i, 1, 1, 1, 8, 8, 10000.0f, 1.0f};
  WriteKvParams fused_kv{{&f, &f}, &f, &f, &slot, 1, 8};
  fused_rope.rope_dim = 3;
  EXPECT_EQ(LaunchRopeWriteKv(fused_rope, fused_kv, nullptr).code(), absl::StatusCode::kInvalidArgument);
  fused_rope.rope_dim = 8;
  fused_kv.kv_width = 0;
  EXPECT_EQ(LaunchRopeWriteKv(fused_rope, fused_kv, nullptr).code(), absl::StatusCode::kInvalidArgument);
  fused_kv.kv_width = 16;  // not 1 kv head x 8
  EXPECT_EQ(LaunchRopeWriteKv(fused_rope, fused_kv, nullptr).code(), absl::StatusCode::kInvalidArgument);
  fused_kv.kv_width = 8;
  fused_kv.k = &other;  // not the keys the rotation rotates
  EXPECT_EQ(LaunchRopeWriteKv(fused_rope, fused_kv, nullptr).code(), absl::StatusCode::kInvalidArgument);
  fused_kv.k = &f;
  fused_kv.num_tokens = 2;
  EXPECT_EQ(LaunchRopeWriteKv(fused_rope, fused_kv, nullptr).code(), absl::StatusCode::kInvalidArgument);
  fused_rope.num_tokens = fused_kv.num_tokens = 0;
  EXPECT_TRUE(LaunchRopeWriteKv(fused_rope, fused_kv, nullptr).ok());
  EXPECT_EQ(LaunchCopyTokens({&i, nullptr, &i, nullptr, -1}, nullptr).code(), absl::StatusCode::kInvalidArgument);
  Weight table;
  table.format = 99;
  EXPECT_EQ(LaunchEmbedding({&table, &i, 0, &f}, nullptr).code(), absl::StatusCode::kOk);

  EXPECT_TRUE(LaunchRmsNorm({nullptr, nullptr, nullptr, 0, 8, 1e-5f}, nullptr).ok());
  EXPECT_TRUE(LaunchSiluMul({nullptr, nullptr, nullptr, 0, 8}, nullptr).ok());
  EXPECT_TRUE(LaunchGatherRows({nullptr, nullptr, 0, 8, nullptr}, nullptr).ok());
  EXPECT_TRUE(LaunchCopyTokens({nullptr, nullptr, nullptr, nullptr, 0}, nullptr).ok());
  EXPECT_TRUE(LaunchDequantize(portable::kGgmlF16, nullptr, 0, nullptr, false, nullptr).ok());
  EXPECT_TRUE(LaunchCastToBf16(nullptr, 0, nullptr, nullptr).ok());
}

// BLAS semantics, column-major: C = alpha op(A) op(B) + beta C.
void ColumnMajorGemm(const GemmShape& g, float alpha, const float* a, const float* b, float beta, float* c) {
  for (int64_t j = 0; j < g.n; ++j) {
    for (int64_t i = 0; i < g.m; ++i) {
      double sum = 0;
      for (int64_t l = 0; l < g.k; ++l) {
        const float op_a = g.transa ? a[l + i * g.lda] : a[i + l * g.lda];
        const float op_b = g.transb ? b[j + l * g.ldb] : b[l + j * g.ldb];
        sum += double{op_a} * op_b;
      }
      c[i + j * g.ldc] = static_cast<float>(alpha * sum + beta * double{c[i + j * g.ldc]});
    }
  }
}

TEST(GemmShapeTest, ColumnMajorGemmComputesRowMajorXTimesWTransposed) {
  const int64_t m = 5, rows = 7, cols = 9;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> small(-4, 4);  // exact in float
  std::vector<float> x(m * cols), w(rows * cols), y(m * rows), y0(m * rows);
  for (float& v : x) v = static_cast<float>(small(rng));
  for (float& v : w) v = static_cast<float>(small(rng));
  for (float& v : y0) v = static_cast<float>(small(rng));
  const GemmShape g = RowMajorXWtShape(m, rows, cols);
  for (const bool accumulate : {false, true}) {
    y = y0;
    ColumnMajorGemm(g, 1.0f, w.data(), x.data(), accumulate ? 1.0f : 0.0f, y.data());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < rows; ++j) {
        float want = accumulate ? y0[i * rows + j] : 0.0f;
        for (int64_t k = 0; k < cols; ++k) want += x[i * cols + k] * w[j * cols + k];
        ASSERT_EQ(y[i * rows + j], want) << "y[" << i << ", " << j << "], accumulate " << accumulate;
      }
    }
  }
}

// The bf16 bound of the header holds for a host model of the bf16 GEMM
// (operands rounded as the device rounds them, products summed in double)
// against CpuBackend's fp32 Matmul.
TEST(GemmShapeTest, Bf16BoundHoldsOnTheHost) {
  const int64_t m = 3, rows = 64, cols = 1536;
  const std::vector<float> x = RandomFloats(m * cols, 1), w = RandomFloats(rows * cols, 2, 0.05f);
  auto round = [](float v) { return portable::Bf16ToFloat(portable::FloatToBf16(v)); };
  CpuBackend cpu(2);
  HostTensor t = MakeTensor(gguf::GgmlType::kF32, rows, cols, w);
  auto weight = cpu.LoadWeight(t.tensor);
  ASSERT_TRUE(weight.ok());
  std::vector<float> y(m * rows);
  ASSERT_TRUE(cpu.Matmul({x.data(), &*weight, m, y.data()}).ok());
  const std::vector<double> scale = AbsProducts(x, w, m, rows, cols);
  double worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < rows; ++j) {
      double model = 0;
      for (int64_t k = 0; k < cols; ++k) model += double{round(x[i * cols + k])} * round(w[j * cols + k]);
      worst = std::max(worst, std::abs(model - y[i * rows + j]) / (Bf16GemmBound(cols) * scale[i * rows + j]));
    }
  }
  std::printf("bf16 model error / bound: %.3f\n", worst);
  EXPECT_LE(worst, 1.0);
}

// Which shapes the decode GEMV takes (the rest go to cuBLAS).
TEST(GemvTest, AppliesToFewAlignedRows) {
  alignas(16) static float x[16];
  alignas(16) static uint16_t w[16];
  EXPECT_TRUE(GemvApplies(x, 1, 576, w));
  EXPECT_TRUE(GemvApplies(x, kGemvMaxRows, 1536, w));
  EXPECT_FALSE(GemvApplies(x, 0, 576, w));
  EXPECT_FALSE(GemvApplies(x, kGemvMaxRows + 1, 576, w));
  EXPECT_FALSE(GemvApplies(x, 1, 33, w));        // not a multiple of 8
  EXPECT_FALSE(GemvApplies(x + 1, 1, 576, w));   // x not 16-byte aligned
  EXPECT_FALSE(GemvApplies(x, 1, 576, w + 1));   // w not 16-byte aligned
  GemvParams none{x, 1, 576, 0, {}, false};
  EXPECT_EQ(LaunchGemvBf16(none, nullptr).code(), absl::StatusCode::kInvalidArgument);
  GemvParams misaligned{x + 1, 1, 576, 1, {{w, 4, x}}, false};
  EXPECT_EQ(LaunchGemvBf16(misaligned, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// --- on a device ---

TEST_F(CudaBackendTest, UploadDownloadRoundTrips) {
  for (const size_t bytes : {size_t{1}, size_t{4095}, size_t{4097}, size_t{3} << 20, (size_t{20} << 20) + 7}) {
    std::vector<uint8_t> data(bytes);
    std::mt19937 rng(static_cast<uint32_t>(bytes));
    for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
    auto buffer = gpu_->Allocate(bytes + 64);
    ASSERT_TRUE(buffer.ok());
    ASSERT_TRUE(gpu_->Upload(**buffer, 64, data.data(), bytes).ok());
    std::vector<uint8_t> back(bytes);
    auto event = gpu_->DownloadAsync(static_cast<char*>((*buffer)->data()) + 64, back.data(), bytes);
    ASSERT_TRUE(event.ok());
    while (!(*event)->Done()) std::this_thread::yield();
    ASSERT_TRUE((*event)->Wait().ok());
    EXPECT_EQ(back, data) << bytes << " bytes";
  }
  auto small = gpu_->Allocate(16);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(gpu_->Upload(**small, 8, "0123456789", 10).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaBackendTest, DownloadEventWaitsOnAnotherThread) {
  const std::vector<int32_t> ids = {5, 4, 3, 2, 1};
  auto buffer = Put(*gpu_, ids);
  std::vector<int32_t> back(ids.size());
  auto event = gpu_->DownloadAsync(buffer->data(), back.data(), ids.size() * sizeof(int32_t));
  ASSERT_TRUE(event.ok());
  absl::Status waited;
  std::thread output([&] { waited = (*event)->Wait(); });
  output.join();
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_EQ(back, ids);
  EXPECT_TRUE((*event)->Done());
}

// Many downloads in flight, waited in reverse order, then again with their
// bounce buffers and events reused from the pool.
TEST_F(CudaBackendTest, ManyDownloadsInFlight) {
  const std::vector<float> data = RandomFloats(1 << 16, 20);
  auto buffer = Put(*gpu_, data);
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<float>> backs(24);
    std::vector<std::unique_ptr<Event>> events;
    for (size_t i = 0; i < backs.size(); ++i) {
      const size_t n = (i * 2731) % data.size() + 1;
      backs[i].assign(n, -1.0f);
      auto event = gpu_->DownloadAsync(buffer->as<float>() + (data.size() - n), backs[i].data(), n * sizeof(float));
      ASSERT_TRUE(event.ok()) << event.status();
      events.push_back(std::move(event).value());
    }
    for (size_t i = backs.size(); i-- > 0;) {
      ASSERT_TRUE(events[i]->Wait().ok());
      EXPECT_TRUE(std::equal(backs[i].begin(), backs[i].end(), data.end() - backs[i].size())) << i;
    }
  }
}

// Uploads far more than the ring holds (8 x 8 MiB), small and large, each
// from a host buffer overwritten right after the call: the device sees every
// upload's bytes, in order.
TEST_F(CudaBackendTest, StagingRingKeepsEveryUploadUnderLoad) {
  constexpr size_t kBytes = size_t{4} << 20;
  auto buffer = gpu_->Allocate(kBytes);
  ASSERT_TRUE(buffer.ok());
  std::vector<uint8_t> mirror(kBytes, 0);
  ASSERT_TRUE(gpu_->Upload(**buffer, 0, mirror.data(), kBytes).ok());
  std::mt19937 rng(9);
  std::vector<uint8_t> source;
  size_t total = 0;
  for (int i = 0; i < 3000; ++i) {
    const size_t size = i % 10 == 0 ? 1 + rng() % (kBytes / 2) : 1 + rng() % 512;
    const size_t offset = rng() % (kBytes - size + 1);
    source.assign(size, 0);
    for (uint8_t& b : source) b = static_cast<uint8_t>(rng());
    ASSERT_TRUE(gpu_->Upload(**buffer, offset, source.data(), size).ok());
    std::memcpy(mirror.data() + offset, source.data(), size);
    std::fill(source.begin(), source.end(), 0xEE);  // the caller reuses its buffer at once
    total += size;
  }
  EXPECT_GT(total, size_t{64} << 20);
  EXPECT_TRUE(Get<uint8_t>(*gpu_, (*buffer)->data(), kBytes) == mirror);
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

// LoadWeight stores exactly portable::DecodeElement's values (fp32) and
// their bf16 rounding, for every type; LoadVector the fp32 values.
TEST_F(CudaBackendTest, WeightsDecodeBitForBit) {
  const int64_t rows = 48, cols = 96;
  const std::vector<float> values = RandomFloats(rows * cols, 3);
  for (gguf::GgmlType type : {gguf::GgmlType::kF32, gguf::GgmlType::kF16, gguf::GgmlType::kBF16,
                              gguf::GgmlType::kQ8_0, gguf::GgmlType::kQ4_0, gguf::GgmlType::kQ4_1}) {
    HostTensor t = MakeTensor(type, rows, cols, values);
    std::vector<float> want(rows * cols);
    std::vector<uint16_t> want16(rows * cols);
    for (int64_t i = 0; i < rows * cols; ++i) {
      want[i] = portable::DecodeElement(static_cast<uint32_t>(type), t.bytes.data(), i);
      want16[i] = portable::FloatToBf16(want[i]);
    }
    auto w32 = gpu_->LoadWeight(t.tensor);
    auto w16 = gpu_bf16_->LoadWeight(t.tensor);
    ASSERT_TRUE(w32.ok() && w16.ok());
    EXPECT_EQ(w32->rows, rows);
    EXPECT_EQ(w32->cols, cols);
    EXPECT_EQ(w32->buffer->size(), rows * cols * sizeof(float));
    EXPECT_EQ(w16->buffer->size(), rows * cols * sizeof(uint16_t));
    const auto got = Get<float>(*gpu_, w32->buffer->data(), rows * cols);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << static_cast<int>(type);
    EXPECT_TRUE(Get<uint16_t>(*gpu_bf16_, w16->buffer->data(), rows * cols) == want16) << static_cast<int>(type);
    HostTensor v = MakeTensor(type, 1, cols, values);
    auto vector = gpu_bf16_->LoadVector(v.tensor);
    ASSERT_TRUE(vector.ok());
    const auto got_vector = Get<float>(*gpu_bf16_, (*vector)->data(), cols);
    EXPECT_EQ(std::memcmp(got_vector.data(), want.data(), cols * sizeof(float)), 0);
  }
  EXPECT_GT(gpu_->weight_bytes(), 0);
}

TEST_F(CudaBackendTest, EmbeddingGathersRows) {
  const int64_t vocab = 300, hidden = 576;
  const std::vector<float> table = RandomFloats(vocab * hidden, 4);
  HostTensor t = MakeTensor(gguf::GgmlType::kF32, vocab, hidden, table);
  auto cpu_w = cpu_.LoadWeight(t.tensor);
  auto w32 = gpu_->LoadWeight(t.tensor);
  auto w16 = gpu_bf16_->LoadWeight(t.tensor);
  ASSERT_TRUE(cpu_w.ok() && w32.ok() && w16.ok());
  const std::vector<TokenId> ids = {0, 299, 17, 17, 150, 3};
  const int32_t n = static_cast<int32_t>(ids.size());
  Both<TokenId> id = Mirror(ids);
  Both<float> out = Mirror(std::vector<float>(n * hidden));
  ASSERT_TRUE(cpu_.Embedding({&*cpu_w, id.c(), n, out.c()}).ok());
  ASSERT_TRUE(gpu_->Embedding({&*w32, id.g(), n, out.g()}).ok());
  const auto want = CpuResult(out, n * hidden);
  EXPECT_EQ(GpuResult(out, n * hidden), want);
  auto ids16 = Put(*gpu_bf16_, ids);
  auto out16 = gpu_bf16_->Allocate(n * hidden * sizeof(float));
  ASSERT_TRUE(out16.ok());
  ASSERT_TRUE(gpu_bf16_->Embedding({&*w16, ids16->as<TokenId>(), n, (*out16)->as<float>()}).ok());
  // bf16 rounding to nearest: within 2^-8 relative.
  EXPECT_LE(WorstRatio(Get<float>(*gpu_bf16_, (*out16)->data(), n * hidden), want, 0, std::ldexp(1.0, -8)), 1.0);
}

TEST_F(CudaBackendTest, RmsNormMatchesCpu) {
  for (const int64_t dim : {int64_t{576}, int64_t{64}, int64_t{4099}}) {
    const int64_t rows = 37;
    Both<float> x = Mirror(RandomFloats(rows * dim, 5, 3.0f));
    Both<float> w = Mirror(RandomFloats(dim, 6));
    Both<float> out = Mirror(std::vector<float>(rows * dim));
    ASSERT_TRUE(cpu_.RmsNorm({x.c(), w.c(), out.c(), rows, dim, 1e-5f}).ok());
    ASSERT_TRUE(gpu_->RmsNorm({x.g(), w.g(), out.g(), rows, dim, 1e-5f}).ok());
    EXPECT_LE(WorstRatio(GpuResult(out, rows * dim), CpuResult(out, rows * dim), 1e-6, 1e-5), 1.0) << dim;
    // In place.
    ASSERT_TRUE(cpu_.RmsNorm({x.c(), w.c(), x.c(), rows, dim, 1e-5f}).ok());
    ASSERT_TRUE(gpu_->RmsNorm({x.g(), w.g(), x.g(), rows, dim, 1e-5f}).ok());
    EXPECT_LE(WorstRatio(GpuResult(x, rows * dim), CpuResult(x, rows * dim), 1e-6, 1e-5), 1.0) << dim;
  }
}

TEST_F(CudaBackendTest, RopeMatchesCpu) {
  struct Case {
    int32_t heads, kv_heads, head_dim, rope_dim;
    float base, scale;
  };
  for (const Case& c : {Case{9, 3, 64, 64, 10000.0f, 1.0f}, Case{4, 2, 80, 48, 10000.0f, 0.5f},
                        Case{8, 8, 128, 128, 500000.0f, 0.25f}}) {
    const int32_t n = 41;
    std::vector<int32_t> positions(n);
    std::mt19937 rng(7);
    for (int32_t& p : positions) p = static_cast<int32_t>(rng() % 32768);
    Both<int32_t> pos = Mirror(positions);
    Both<float> q = Mirror(RandomFloats(size_t{n} * c.heads * c.head_dim, 8));
    Both<float> k = Mirror(RandomFloats(size_t{n} * c.kv_heads * c.head_dim, 9));
    ASSERT_TRUE(
        cpu_.Rope({q.c(), k.c(), pos.c(), n, c.heads, c.kv_heads, c.head_dim, c.rope_dim, c.base, c.scale}).ok());
    ASSERT_TRUE(
        gpu_->Rope({q.g(), k.g(), pos.g(), n, c.heads, c.kv_heads, c.head_dim, c.rope_dim, c.base, c.scale}).ok());
    // The angles are the same floats (inv_freq comes from the host); device
    // cosf/sinf are within 2 ulp (1.2e-7 below 1), so an output moves by at
    // most (|a| + |b|) 1.2e-7 plus its own rounding: under 2e-6 for these
    // normal samples (|a| < 6).
    EXPECT_LE(WorstRatio(GpuResult(q, q.cpu->size() / 4), CpuResult(q, q.cpu->size() / 4), 2e-6, 1e-6), 1.0);
    EXPECT_LE(WorstRatio(GpuResult(k, k.cpu->size() / 4), CpuResult(k, k.cpu->size() / 4), 2e-6, 1e-6), 1.0);
  }
}

TEST_F(CudaBackendTest, WriteKvScattersRows) {
  const int32_t n = 10, width = 3 * 64, slots_total = 64;
  std::vector<int64_t> slots = {5, 63, 0, 17, 18, 40, 41, 2, 9, 33};
  Both<int64_t> s = Mirror(slots);
  Both<float> k = Mirror(RandomFloats(n * width, 10));
  Both<float> v = Mirror(RandomFloats(n * width, 11));
  Both<float> ck = Mirror(RandomFloats(slots_total * width, 12));
  Both<float> cv = Mirror(RandomFloats(slots_total * width, 13));
  ASSERT_TRUE(cpu_.WriteKv({{ck.c(), cv.c()}, k.c(), v.c(), s.c(), n, width}).ok());
  ASSERT_TRUE(gpu_->WriteKv({{ck.g(), cv.g()}, k.g(), v.g(), s.g(), n, width}).ok());
  EXPECT_EQ(GpuResult(ck, slots_total * width), CpuResult(ck, slots_total * width));
  EXPECT_EQ(GpuResult(cv, slots_total * width), CpuResult(cv, slots_total * width));
}

// The fused kernel against the CPU backend's two calls: q and k rotated as
// Rope rotates them (the bound of RopeMatchesCpu), and the cache holding the
// rotated keys and the values at the slots (bit for bit: the keys copied are
// the device's own rotated ones, compared with the device's k).
TEST_F(CudaBackendTest, RopeWriteKvMatchesRopeThenWriteKv) {
  const int32_t n = 10, heads = 9, kv_heads = 3, head_dim = 64, slots_total = 64;
  const int32_t width = kv_heads * head_dim;
  std::vector<int32_t> positions = {0, 1, 2, 3, 4, 130, 131, 5000, 17, 9};
  std::vector<int64_t> slots = {5, 63, 0, -1, 18, 40, 41, 2, 9, 33};
  Both<int32_t> pos = Mirror(positions);
  Both<int64_t> s = Mirror(slots);
  Both<float> q = Mirror(RandomFloats(size_t{n} * heads * head_dim, 21));
  Both<float> k = Mirror(RandomFloats(size_t{n} * width, 22));
  Both<float> v = Mirror(RandomFloats(size_t{n} * width, 23));
  Both<float> ck = Mirror(RandomFloats(size_t{slots_total} * width, 24));
  Both<float> cv = Mirror(RandomFloats(size_t{slots_total} * width, 25));
  const RopeParams cpu_rope{q.c(), k.c(), pos.c(), n, heads, kv_heads, head_dim, 48, 10000.0f, 1.0f};
  ASSERT_TRUE(cpu_.RopeWriteKv(cpu_rope, {{ck.c(), cv.c()}, k.c(), v.c(), s.c(), n, width}).ok());
  const RopeParams gpu_rope{q.g(), k.g(), pos.g(), n, heads, kv_heads, head_dim, 48, 10000.0f, 1.0f};
  ASSERT_TRUE(gpu_->RopeWriteKv(gpu_rope, {{ck.g(), cv.g()}, k.g(), v.g(), s.g(), n, width}).ok());
  const size_t q_size = size_t{n} * heads * head_dim, k_size = size_t{n} * width;
  EXPECT_LE(WorstRatio(GpuResult(q, q_size), CpuResult(q, q_size), 2e-6, 1e-6), 1.0);
  const std::vector<float> gpu_k = GpuResult(k, k_size);
  EXPECT_LE(WorstRatio(gpu_k, CpuResult(k, k_size), 2e-6, 1e-6), 1.0);
  const std::vector<float> gpu_ck = GpuResult(ck, size_t{slots_total} * width);
  const std::vector<float> cpu_ck = CpuResult(ck, size_t{slots_total} * width);
  for (int32_t t = 0; t < n; ++t) {
    if (slots[t] < 0) continue;
    for (int32_t c = 0; c < width; ++c) {
      ASSERT_EQ(gpu_ck[slots[t] * width + c], gpu_k[static_cast<size_t>(t) * width + c]) << "token " << t << " column " << c;
    }
  }
  EXPECT_LE(WorstRatio(gpu_ck, cpu_ck, 2e-6, 1e-6), 1.0);
  EXPECT_EQ(GpuResult(cv, size_t{slots_total} * width), CpuResult(cv, size_t{slots_total} * width));
}

TEST_F(CudaBackendTest, SiluMulMatchesCpu) {
  const int64_t rows = 7, dim = 1536;
  Both<float> gate = Mirror(RandomFloats(rows * dim, 14, 4.0f));
  Both<float> up = Mirror(RandomFloats(rows * dim, 15));
  ASSERT_TRUE(cpu_.SiluMul({gate.c(), up.c(), gate.c(), rows, dim}).ok());
  ASSERT_TRUE(gpu_->SiluMul({gate.g(), up.g(), gate.g(), rows, dim}).ok());
  // The CPU's vectorized exp is within 2e-7 relative, the device's expf 2 ulp.
  EXPECT_LE(WorstRatio(GpuResult(gate, rows * dim), CpuResult(gate, rows * dim), 1e-7, 2e-6), 1.0);
}

TEST_F(CudaBackendTest, GatherRowsCopyTokensAndCopyOnDevice) {
  const int64_t dim = 576;
  Both<float> x = Mirror(RandomFloats(20 * dim, 16));
  const std::vector<int32_t> rows = {19, 0, 7, 7};
  Both<int32_t> r = Mirror(rows);
  Both<float> out = Mirror(std::vector<float>(rows.size() * dim));
  ASSERT_TRUE(cpu_.GatherRows({x.c(), r.c(), 4, dim, out.c()}).ok());
  ASSERT_TRUE(gpu_->GatherRows({x.g(), r.g(), 4, dim, out.g()}).ok());
  EXPECT_EQ(GpuResult(out, 4 * dim), CpuResult(out, 4 * dim));

  Both<TokenId> dst = Mirror(std::vector<TokenId>{-1, -1, -1, -1, -1, -1});
  Both<TokenId> src = Mirror(std::vector<TokenId>{10, 11, 12, 13});
  Both<int32_t> dst_index = Mirror(std::vector<int32_t>{5, 0, 2});
  Both<int32_t> src_index = Mirror(std::vector<int32_t>{3, 3, 1});
  ASSERT_TRUE(cpu_.CopyTokens({dst.c(), dst_index.c(), src.c(), src_index.c(), 3}).ok());
  ASSERT_TRUE(gpu_->CopyTokens({dst.g(), dst_index.g(), src.g(), src_index.g(), 3}).ok());
  EXPECT_EQ(GpuResult(dst, 6), CpuResult(dst, 6));
  ASSERT_TRUE(cpu_.CopyTokens({dst.c(), nullptr, src.c(), nullptr, 4}).ok());  // identity
  ASSERT_TRUE(gpu_->CopyTokens({dst.g(), nullptr, src.g(), nullptr, 4}).ok());
  EXPECT_EQ(GpuResult(dst, 6), CpuResult(dst, 6));

  ASSERT_TRUE(gpu_->CopyOnDevice(out.g(), x.g() + dim, 2 * dim * sizeof(float)).ok());
  const auto copied = GpuResult(out, 2 * dim);
  const auto source = GpuResult(x, 3 * dim);
  EXPECT_TRUE(std::equal(copied.begin(), copied.end(), source.begin() + dim));
}

// y = x W^T (+ y) on both weight types, decode (m = 1) and prefill shapes.
TEST_F(CudaBackendTest, MatmulMatchesCpuWithinTheBounds) {
  struct Case {
    int64_t m, rows, cols;
  };
  for (const Case& c : {Case{1, 576, 576}, Case{37, 1536, 576}, Case{5, 576, 1536}, Case{3, 259, 64},
                        Case{129, 100, 33}}) {
    const std::vector<float> xs = RandomFloats(c.m * c.cols, 17);
    const std::vector<float> ws = RandomFloats(c.rows * c.cols, 18, 0.05f);
    const std::vector<float> y0 = RandomFloats(c.m * c.rows, 19);
    HostTensor t = MakeTensor(gguf::GgmlType::kF32, c.rows, c.cols, ws);
    auto cpu_w = cpu_.LoadWeight(t.tensor);
    auto w32 = gpu_->LoadWeight(t.tensor);
    auto w16 = gpu_bf16_->LoadWeight(t.tensor);
    ASSERT_TRUE(cpu_w.ok() && w32.ok() && w16.ok());
    const std::vector<double> scale = AbsProducts(xs, ws, c.m, c.rows, c.cols);
    for (const bool accumulate : {false, true}) {
      Both<float> x = Mirror(xs);
      Both<float> y = Mirror(y0);
      ASSERT_TRUE(cpu_.Matmul({x.c(), &*cpu_w, c.m, y.c(), accumulate}).ok());
      ASSERT_TRUE(gpu_->Matmul({x.g(), &*w32, c.m, y.g(), accumulate}).ok());
      const auto want = CpuResult(y, c.m * c.rows);
      const auto got32 = GpuResult(y, c.m * c.rows);
      auto x16 = Put(*gpu_bf16_, xs);
      auto y16 = Put(*gpu_bf16_, y0);
      ASSERT_TRUE(gpu_bf16_->Matmul({x16->as<float>(), &*w16, c.m, y16->as<float>(), accumulate}).ok());
      const auto got16 = Get<float>(*gpu_bf16_, y16->data(), c.m * c.rows);
      double worst32 = 0, worst16 = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        const double s = scale[i] + (accumulate ? std::abs(double{y0[i]}) : 0.0);
        worst32 = std::max(worst32, std::abs(double{got32[i]} - want[i]) / (1e-4 * s + 1e-30));
        worst16 = std::max(worst16, std::abs(double{got16[i]} - want[i]) / (Bf16GemmBound(c.cols) * s + 1e-30));
      }
      std::printf("matmul m %lld, %lld x %lld, accumulate %d: error / bound fp32 %.3g, bf16 %.3g\n",
                  static_cast<long long>(c.m), static_cast<long long>(c.rows), static_cast<long long>(c.cols),
                  accumulate, worst32, worst16);
      EXPECT_LE(worst32, 1.0);
      EXPECT_LE(worst16, 1.0);
    }
  }
}

// A group (Q, K, V shapes) in one launch gives each weight the bits of its
// own Matmul: through the decode GEMV (m <= kGemvMaxRows) and through cuBLAS
// (m above it), with bf16 and fp32 weights.
TEST_F(CudaBackendTest, MatmulGroupEqualsEachMatmul) {
  const int64_t cols = 576;
  const std::vector<int64_t> rows = {576, 192, 192};
  for (CudaBackend* gpu : {gpu_bf16_.get(), gpu_.get()}) {
    std::vector<Weight> weights;
    for (size_t i = 0; i < rows.size(); ++i) {
      HostTensor t = MakeTensor(gguf::GgmlType::kF32, rows[i], cols, RandomFloats(rows[i] * cols, 30 + i, 0.05f));
      auto w = gpu->LoadWeight(t.tensor);
      ASSERT_TRUE(w.ok()) << w.status();
      weights.push_back(std::move(w).value());
    }
    for (const int64_t m : {int64_t{1}, int64_t{5}, kGemvMaxRows, kGemvMaxRows + 1, int64_t{64}}) {
      auto x = Put(*gpu, RandomFloats(m * cols, 33));
      MatmulGroupParams group{x->as<float>(), m, 3, {}, {}};
      std::vector<std::unique_ptr<DeviceBuffer>> got, want;
      for (size_t i = 0; i < rows.size(); ++i) {
        got.push_back(Put(*gpu, std::vector<float>(m * rows[i], -1.0f)));
        want.push_back(Put(*gpu, std::vector<float>(m * rows[i], -2.0f)));
        group.w[i] = &weights[i];
        group.y[i] = got.back()->as<float>();
        ASSERT_TRUE(gpu->Matmul({x->as<float>(), &weights[i], m, want.back()->as<float>()}).ok());
      }
      ASSERT_TRUE(gpu->MatmulGroup(group).ok());
      for (size_t i = 0; i < rows.size(); ++i) {
        EXPECT_EQ(Get<float>(*gpu, got[i]->data(), m * rows[i]), Get<float>(*gpu, want[i]->data(), m * rows[i]))
            << "weight " << i << ", m " << m << (gpu == gpu_.get() ? ", fp32" : ", bf16");
      }
    }
  }
}

}  // namespace
}  // namespace tandem::worker
