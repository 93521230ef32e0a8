// The paged attention kernels (paged_attention.cu) against
// CpuBackend::PagedAttention on the inputs attention_model_test.cc gives the
// host model (attention_testing.h): decode-only, prefill-only and mixed
// batches, GQA 1/3/4/6/16, block sizes 1 to 128, prefix-shared blocks,
// contexts across the split and up to 8,000 tokens, within 1e-4. Also: a
// sequence's output is bit-identical alone and in a batch, every output row
// is written, and a context longer than max_seq_len promised comes out NaN.
//
// The launcher's checks run without a device; the rest skips, with the
// reason, where no device is usable.
#include "worker/backends/cuda/paged_attention.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backends/cpu/cpu_backend.h"
#include "worker/backends/portable/attention_model.h"
#include "worker/backends/portable/attention_testing.h"

namespace tandem::worker {
namespace {

using attention_testing::AttentionCase;
using attention_testing::AttentionInputs;
using attention_testing::MakeAttentionInputs;
using attention_testing::SeqSpec;

// Empty when a device is usable, else why not.
std::string NoDeviceReason() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) return std::string("no usable CUDA device: ") + cudaGetErrorString(error);
  if (count == 0) return "no CUDA device";
  return "";
}

#define SKIP_WITHOUT_DEVICE()                                   \
  do {                                                          \
    const std::string reason = NoDeviceReason();                \
    if (!reason.empty()) GTEST_SKIP() << reason;                \
  } while (0)

// A device copy of a host vector (or `bytes` uninitialized bytes).
class DeviceArray {
 public:
  explicit DeviceArray(size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0) {
      EXPECT_EQ(cudaMalloc(&data_, bytes_), cudaSuccess);
    }
  }
  template <typename T>
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size() * sizeof(T)) {
    if (bytes_ > 0) {
      EXPECT_EQ(cudaMemcpy(data_, host.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceArray() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_;
  void* data_ = nullptr;
};

// Runs the kernels on `in` and returns the output; the output buffer starts
// as NaN (bytes 0xff; `fill` otherwise) so that a row no kernel writes
// fails the comparison. `edit`, if set, changes the parameters first.
std::vector<float> RunOnDevice(const AttentionInputs& in,
                               const std::function<void(AttentionParams&)>& edit = nullptr, int fill = 0xff) {
  DeviceArray k(in.k_cache), v(in.v_cache), q(in.q);
  DeviceArray query_start(in.query_start), seq_lens(in.seq_lens), table_start(in.block_table_start);
  DeviceArray tables(in.block_tables);
  DeviceArray out(in.q.size() * sizeof(float));
  EXPECT_EQ(cudaMemset(out.as<void>(), fill, out.bytes()), cudaSuccess);
  AttentionParams p = in.Params(k.as<float>(), v.as<float>(), q.as<float>(), out.as<float>(),
                                query_start.as<int32_t>(), seq_lens.as<int32_t>(), table_start.as<int32_t>(),
                                tables.as<BlockId>());
  if (edit) edit(p);
  DeviceArray workspace(PagedAttentionWorkspaceBytes(p));
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const absl::Status status = LaunchPagedAttention(p, workspace.as<void>(), workspace.bytes(), stream);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  cudaStreamDestroy(stream);
  std::vector<float> host(in.q.size());
  EXPECT_EQ(cudaMemcpy(host.data(), out.as<void>(), out.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

std::vector<float> RunOnCpu(const AttentionInputs& in) {
  std::vector<float> out(in.q.size(), 0.0f);
  CpuBackend cpu(0);
  EXPECT_TRUE(cpu.PagedAttention(in.HostParams(out.data())).ok());
  return out;
}

void ExpectDeviceEqualsCpu(const AttentionCase& c) {
  const AttentionInputs in = MakeAttentionInputs(c);
  const std::vector<float> want = RunOnCpu(in);
  const std::vector<float> got = RunOnDevice(in);
  const int32_t row = c.num_heads * c.head_dim;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-4f) << "token " << i / row << " head " << (i % row) / c.head_dim << " dim "
                                        << i % c.head_dim;
  }
}

std::string Describe(const AttentionCase& c) {
  return "heads " + std::to_string(c.num_heads) + "/" + std::to_string(c.num_kv_heads) + " head_dim " +
         std::to_string(c.head_dim) + " block_size " + std::to_string(c.block_size);
}

TEST(PagedAttentionGpuTest, MixedBatchEqualsCpuBackend) {
  SKIP_WITHOUT_DEVICE();
  uint64_t seed = 1;
  for (const attention_testing::HeadConfig& config : attention_testing::kHeadConfigs) {
    for (int32_t block_size : {16, 32}) {
      AttentionCase c;
      c.num_heads = config.heads;
      c.num_kv_heads = config.kv_heads;
      c.head_dim = config.head_dim;
      c.block_size = block_size;
      c.seqs = attention_testing::MixedSeqs();
      c.seed = seed++;
      SCOPED_TRACE(Describe(c));
      ExpectDeviceEqualsCpu(c);
    }
  }
}

TEST(PagedAttentionGpuTest, DecodeOnly) {
  SKIP_WITHOUT_DEVICE();
  AttentionCase c;
  c.num_heads = 9;
  c.num_kv_heads = 3;
  c.block_size = 16;
  c.seed = 21;
  for (int32_t context = 1; context <= 200; context += 7) c.seqs.push_back({1, context});
  ExpectDeviceEqualsCpu(c);  // no split
  c.seqs.clear();
  for (int32_t context = 240; context <= 800; ++context) c.seqs.push_back({1, context});
  ExpectDeviceEqualsCpu(c);  // 1 to 4 splits
  c.seqs.assign(256, SeqSpec{1, 128});  // the benchmark's decode batch
  ExpectDeviceEqualsCpu(c);
  c.head_dim = 128;
  c.block_size = 32;
  c.seqs = {{1, 8000}, {1, 4097}, {1, 3}};  // 32 splits
  ExpectDeviceEqualsCpu(c);
}

TEST(PagedAttentionGpuTest, PrefillOnly) {
  SKIP_WITHOUT_DEVICE();
  AttentionCase c;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 128;
  c.block_size = 32;
  c.seed = 31;
  c.seqs = {{64, 64}, {3, 130}, {17, 17}, {9, 1000}};
  ExpectDeviceEqualsCpu(c);
  c.num_heads = 9;
  c.num_kv_heads = 3;
  c.head_dim = 64;
  c.block_size = 16;
  c.seqs = {{512, 512}, {300, 2000}};  // a 512-token prompt; a late chunk
  ExpectDeviceEqualsCpu(c);
}

TEST(PagedAttentionGpuTest, OtherBlockSizes) {
  SKIP_WITHOUT_DEVICE();
  // Chunks of 8 keys span several blocks (1, 4) or lie inside one (64, 128).
  for (int32_t block_size : {1, 4, 64, 128}) {
    AttentionCase c;
    c.num_heads = 9;
    c.num_kv_heads = 3;
    c.block_size = block_size;
    c.seqs = attention_testing::MixedSeqs();
    c.seed = 40 + block_size;
    SCOPED_TRACE("block_size " + std::to_string(block_size));
    ExpectDeviceEqualsCpu(c);
  }
}

TEST(PagedAttentionGpuTest, SharedPrefixBlocks) {
  SKIP_WITHOUT_DEVICE();
  AttentionCase c;
  c.num_heads = 9;
  c.num_kv_heads = 3;
  c.block_size = 16;
  c.seqs = {{1, 700}, {40, 650}, {1, 33}};
  c.share_prefix = true;
  c.seed = 11;
  ExpectDeviceEqualsCpu(c);
}

TEST(PagedAttentionGpuTest, ASequenceComputesTheSameAloneAndInABatch) {
  SKIP_WITHOUT_DEVICE();
  // Sequence 0 in a batch whose longer contexts and prefill rows change the
  // grid, then alone (the same inputs, num_seqs 1): its row must be
  // bit-identical.
  AttentionCase c;
  c.num_heads = 9;
  c.num_kv_heads = 3;
  c.seqs = {{1, 600}, {1, 3000}, {50, 400}};
  c.seed = 5;
  const AttentionInputs in = MakeAttentionInputs(c);
  const std::vector<float> batch = RunOnDevice(in);
  const std::vector<float> alone = RunOnDevice(in, [](AttentionParams& p) {
    p.num_seqs = 1;
    p.max_seq_len = 600;
    p.max_query_len = 1;
  });
  const size_t row = size_t{9} * 64;
  ASSERT_FALSE(std::isnan(alone[0]));
  ASSERT_EQ(std::memcmp(alone.data(), batch.data(), row * sizeof(float)), 0);
}

TEST(PagedAttentionGpuTest, UnderstatedMaxSeqLenGivesNan) {
  SKIP_WITHOUT_DEVICE();
  AttentionCase c;
  c.seqs = {{1, 2000}};  // 8 partitions; max_seq_len 300 gives the grid 4
  const std::vector<float> out =
      RunOnDevice(MakeAttentionInputs(c), [](AttentionParams& p) { p.max_seq_len = 300; }, /*fill=*/0);
  for (float x : out) ASSERT_TRUE(std::isnan(x));
}

// The launcher's checks: before any CUDA call, so they run without a device.
TEST(PagedAttentionTest, RejectsBadParametersWithoutLaunching) {
  AttentionCase c;
  c.seqs = {{1, 600}};
  const AttentionInputs in = MakeAttentionInputs(c);
  std::vector<float> out(in.q.size());
  const AttentionParams good = in.HostParams(out.data());
  const size_t workspace_bytes = PagedAttentionWorkspaceBytes(good);
  ASSERT_GT(workspace_bytes, 0u) << "600 tokens split";
  std::vector<char> workspace(workspace_bytes);
  auto expect_invalid = [&](auto edit, size_t bytes, const char* what) {
    AttentionParams p = good;
    edit(p);
    EXPECT_EQ(LaunchPagedAttention(p, workspace.data(), bytes, nullptr).code(),
              absl::StatusCode::kInvalidArgument)
        << what;
  };
  auto keep = [](AttentionParams&) {};
  expect_invalid([](AttentionParams& p) { p.head_dim = 96; }, workspace_bytes, "head_dim 96");
  expect_invalid([](AttentionParams& p) { p.head_dim = 256; }, workspace_bytes * 4, "head_dim 256");
  expect_invalid([](AttentionParams& p) { p.num_kv_heads = 3; }, workspace_bytes, "heads not divisible");
  expect_invalid([](AttentionParams& p) { p.block_size = 48; }, workspace_bytes, "block size 48");
  expect_invalid([](AttentionParams& p) { p.num_seqs = -1; }, workspace_bytes, "negative num_seqs");
  expect_invalid([](AttentionParams& p) { p.max_query_len = 0; }, workspace_bytes, "max_query_len 0");
  expect_invalid([](AttentionParams& p) { p.max_seq_len = 0; }, workspace_bytes, "max_seq_len < max_query_len");
  expect_invalid([](AttentionParams& p) { p.q = nullptr; }, workspace_bytes, "null q");
  expect_invalid([](AttentionParams& p) { p.cache.k = static_cast<char*>(p.cache.k) + 4; },
                 workspace_bytes, "misaligned cache");
  expect_invalid(keep, workspace_bytes - 1, "workspace one byte short");
  expect_invalid([](AttentionParams& p) { p.max_seq_len = 70000 * attention::kPartitionTokens; }, workspace_bytes,
                 "too many splits");
  AttentionParams empty = good;
  empty.num_seqs = 0;
  EXPECT_TRUE(LaunchPagedAttention(empty, nullptr, 0, nullptr).ok()) << "an empty batch launches nothing";
}

TEST(PagedAttentionTest, WorkspaceOnlyWhenAContextSplits) {
  AttentionParams p{};
  p.num_seqs = 10;
  p.num_heads = 9;
  p.num_kv_heads = 3;
  p.head_dim = 64;
  p.max_query_len = 1;
  p.max_seq_len = attention::kMinPartitionTokens;
  EXPECT_EQ(PagedAttentionWorkspaceBytes(p), 0u);
  p.max_seq_len = attention::kMinPartitionTokens + 1;
  EXPECT_EQ(PagedAttentionWorkspaceBytes(p), size_t{10} * 9 * 2 * (64 + 2) * sizeof(float));
  p.max_seq_len = 256;  // contexts up to 256 make at most 4 partitions
  EXPECT_EQ(PagedAttentionWorkspaceBytes(p), size_t{10} * 9 * 4 * (64 + 2) * sizeof(float));
}

}  // namespace
}  // namespace tandem::worker
