// The host model of the GPU paged attention (attention_model.h) against
// CpuBackend::PagedAttention on the same inputs: scattered block tables,
// GQA ratios 1, 3, 4, 6 and 16, decode and chunked-prefill rows in one call,
// contexts from 1 to ~2,000 tokens (across the split threshold and its
// multiples), block sizes 16 and 32 (and 1, 4, 64, 128), prefix-shared
// blocks. The cases are the GPU test's (cuda/paged_attention_test.cc),
// through attention_testing.h.
#include "worker/backends/portable/attention_model.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backends/cpu/cpu_backend.h"
#include "worker/backends/portable/attention_testing.h"

namespace tandem::worker {
namespace {

using attention_testing::AttentionCase;
using attention_testing::AttentionInputs;
using attention_testing::MakeAttentionInputs;
using attention_testing::SeqSpec;

void ExpectModelEqualsCpu(const AttentionCase& c) {
  const AttentionInputs in = MakeAttentionInputs(c);
  const size_t out_floats = in.q.size();
  std::vector<float> want(out_floats, -7.0f);
  std::vector<float> got(out_floats, -7.0f);
  CpuBackend cpu(2);
  ASSERT_TRUE(cpu.PagedAttention(in.HostParams(want.data())).ok());
  const absl::Status status = attention::ModelPagedAttention(in.HostParams(got.data()));
  ASSERT_TRUE(status.ok()) << status;
  const int32_t row = c.num_heads * c.head_dim;
  for (size_t i = 0; i < out_floats; ++i) {
    const int32_t token = static_cast<int32_t>(i / row);
    const int32_t head = static_cast<int32_t>(i % row) / c.head_dim;
    ASSERT_FALSE(std::isnan(want[i])) << "the CPU backend read a NaN slot: token " << token;
    ASSERT_NEAR(got[i], want[i], 1e-5f) << "token " << token << " head " << head << " dim " << i % c.head_dim;
  }
}

TEST(AttentionModelTest, MixedBatchEqualsCpuBackend) {
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
      SCOPED_TRACE("heads " + std::to_string(c.num_heads) + "/" + std::to_string(c.num_kv_heads) + " head_dim " +
                   std::to_string(c.head_dim) + " block_size " + std::to_string(block_size));
      ASSERT_GT(attention::NumSplits(2000), 1) << "the cases must cross the split threshold";
      ExpectModelEqualsCpu(c);
    }
  }
}

TEST(AttentionModelTest, OtherBlockSizes) {
  // Chunks of 8 keys span several blocks (1, 4) or lie inside one (64, 128).
  for (int32_t block_size : {1, 4, 64, 128}) {
    AttentionCase c;
    c.num_heads = 9;
    c.num_kv_heads = 3;
    c.block_size = block_size;
    c.seqs = attention_testing::MixedSeqs();
    c.seed = 40 + block_size;
    SCOPED_TRACE("block_size " + std::to_string(block_size));
    ExpectModelEqualsCpu(c);
  }
}

TEST(AttentionModelTest, SharedPrefixBlocks) {
  AttentionCase c;
  c.num_heads = 9;
  c.num_kv_heads = 3;
  c.head_dim = 64;
  c.block_size = 16;
  c.seqs = {{1, 700}, {40, 650}, {1, 33}};  // 1 reads 0's first 40 blocks
  c.share_prefix = true;
  c.seed = 11;
  const AttentionInputs in = MakeAttentionInputs(c);
  ASSERT_EQ(in.block_tables[in.block_table_start[1]], in.block_tables[0]);
  ExpectModelEqualsCpu(c);
}

TEST(AttentionModelTest, DecodeOnlyBelowAndAboveTheSplit) {
  AttentionCase c;
  c.num_heads = 9;
  c.num_kv_heads = 3;
  c.block_size = 16;
  c.seed = 21;
  for (int32_t context = 1; context <= 200; context += 7) c.seqs.push_back({1, context});
  ExpectModelEqualsCpu(c);  // partitions of 32 and 64 keys
  c.seqs.clear();
  for (int32_t context = 240; context <= 800; context += 1) c.seqs.push_back({1, context});
  ExpectModelEqualsCpu(c);  // every context from 240 to 800: 1 to 4 splits
}

TEST(AttentionModelTest, PrefillOnly) {
  AttentionCase c;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 128;
  c.block_size = 32;
  c.seed = 31;
  c.seqs = {{64, 64}, {3, 130}, {17, 17}, {9, 1000}};  // fresh prompts and continued chunks
  ExpectModelEqualsCpu(c);
}

TEST(AttentionModelTest, EmptyBatchIsOk) {
  AttentionParams p{};
  p.num_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim = 64;
  p.block_size = 16;
  EXPECT_TRUE(attention::ModelPagedAttention(p).ok());
}

TEST(AttentionModelTest, UnderstatedMaxSeqLenIsLoudNotTruncated) {
  AttentionCase c;
  c.num_heads = 4;
  c.num_kv_heads = 4;
  c.seqs = {{1, 2000}};  // 8 partitions of 256
  AttentionInputs in = MakeAttentionInputs(c);
  in.max_seq_len = 300;  // the contract says >= 2000; the grid holds 4 partitions
  std::vector<float> out(in.q.size(), 0.0f);
  ASSERT_TRUE(attention::ModelPagedAttention(in.HostParams(out.data())).ok());
  for (float x : out) ASSERT_TRUE(std::isnan(x));
}

TEST(AttentionModelTest, RejectsBadShapes) {
  AttentionCase c;
  c.seqs = {{1, 10}};
  const AttentionInputs in = MakeAttentionInputs(c);
  std::vector<float> out(in.q.size());
  auto expect_invalid = [&](auto edit, const char* what) {
    AttentionParams p = in.HostParams(out.data());
    edit(p);
    EXPECT_EQ(attention::ModelPagedAttention(p).code(), absl::StatusCode::kInvalidArgument) << what;
  };
  expect_invalid([](AttentionParams& p) { p.num_kv_heads = 3; }, "heads not divisible");
  expect_invalid([](AttentionParams& p) { p.block_size = 24; }, "block size not a power of two");
  expect_invalid([](AttentionParams& p) { p.head_dim = 96; }, "head_dim 96");
  expect_invalid([](AttentionParams& p) { p.num_seqs = -1; }, "negative num_seqs");
  expect_invalid([](AttentionParams& p) { p.max_query_len = 0; }, "max_query_len 0");
  expect_invalid([](AttentionParams& p) { p.max_seq_len = 0; }, "max_seq_len below max_query_len");
  expect_invalid([](AttentionParams& p) { p.block_tables = nullptr; }, "null table");
}

// The partition rule: each context's own, at most 4 partitions up to 512
// tokens, and SplitsBound(L) exactly the most partitions of any context of
// at most L tokens (the decode grid's depth and the workspace's size).
TEST(AttentionModelTest, SplitsBoundIsTheMostPartitionsUpToTheBound) {
  int most = 0;
  for (int context = 1; context <= 5000; ++context) {
    const int splits = attention::NumSplits(context);
    const int partition = attention::PartitionTokens(context);
    ASSERT_GE(splits, 1);
    ASSERT_LT((splits - 1) * partition, context) << "no empty partition, context " << context;
    ASSERT_GE(splits * partition, context) << "every key in a partition, context " << context;
    if (context <= 512) {
      ASSERT_LE(splits, 4) << context;
    }
    most = std::max(most, splits);
    ASSERT_EQ(attention::SplitsBound(context), most) << "context " << context;
  }
  EXPECT_EQ(attention::NumSplits(128), 4);  // batch 1 at 128 tokens: 4 CTAs per KV head
  EXPECT_EQ(attention::NumSplits(32), 1);
  EXPECT_EQ(attention::MaxSplits(32), 0);   // no workspace
  EXPECT_EQ(attention::NumSplits(2000), 8);
}

}  // namespace
}  // namespace tandem::worker
