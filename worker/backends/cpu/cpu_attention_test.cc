// The CPU backend's PagedAttention gives a query the same bits whatever else
// is in its call: alone or in a mixed batch, as a decode row or as the last
// row of a prefill chunk, on one thread or two; with the AVX2 versions and
// the portable ones. (Its values against the GPU kernel's model, within 1e-5,
// are attention_model_test's.)
#include "worker/backends/cpu/cpu_attention.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/gguf/ggml_types.h"
#include "gtest/gtest.h"
#include "worker/backends/cpu/cpu_backend.h"
#include "worker/backends/portable/attention_testing.h"

namespace tandem::worker {
namespace {

using attention_testing::AttentionCase;
using attention_testing::AttentionInputs;
using attention_testing::MakeAttentionInputs;

AttentionCase MixedCase(const attention_testing::HeadConfig& config) {
  AttentionCase c;
  c.num_heads = config.heads;
  c.num_kv_heads = config.kv_heads;
  c.head_dim = config.head_dim;
  c.seqs = attention_testing::MixedSeqs();
  c.seed = 11;
  return c;
}

// Param: whether to run cpu_math.h's portable versions.
class CpuAttentionTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { cpu::UsePortableForTesting(GetParam()); }
  void TearDown() override { cpu::UsePortableForTesting(false); }
};

TEST_P(CpuAttentionTest, AQueryGetsTheSameBitsAloneAsInABatch) {
  for (const attention_testing::HeadConfig& config : {attention_testing::kHeadConfigs[1],
                                                      attention_testing::kHeadConfigs[2]}) {
    const AttentionInputs in = MakeAttentionInputs(MixedCase(config));
    const int32_t row = config.heads * config.head_dim;
    std::vector<float> batch(in.q.size(), -7.0f);
    CpuBackend two(2);
    ASSERT_TRUE(two.PagedAttention(in.HostParams(batch.data())).ok());
    CpuBackend one(1);
    for (size_t s = 0; s < in.seq_lens.size(); ++s) {
      // The sequence's last query as a decode row of a call of its own.
      const int32_t token = in.query_start[s + 1] - 1;
      const std::vector<int32_t> query_start = {0, 1};
      const std::vector<int32_t> seq_lens = {in.seq_lens[s]};
      const std::vector<int32_t> table_start = {0, in.block_table_start[s + 1] - in.block_table_start[s]};
      std::vector<float> alone(row, -7.0f);
      AttentionParams p = in.Params(in.k_cache.data(), in.v_cache.data(), in.q.data() + int64_t{token} * row,
                                    alone.data(), query_start.data(), seq_lens.data(), table_start.data(),
                                    in.block_tables.data() + in.block_table_start[s]);
      p.num_seqs = 1;
      p.max_seq_len = in.seq_lens[s];
      p.max_query_len = 1;
      ASSERT_TRUE(one.PagedAttention(p).ok());
      EXPECT_EQ(std::memcmp(alone.data(), batch.data() + int64_t{token} * row, row * sizeof(float)), 0)
          << "heads " << config.heads << ": sequence " << s << " (context " << in.seq_lens[s] << ", "
          << in.query_start[s + 1] - in.query_start[s] << " queries)";
    }
    std::vector<float> one_thread(in.q.size(), -7.0f);
    ASSERT_TRUE(one.PagedAttention(in.HostParams(one_thread.data())).ok());
    EXPECT_EQ(std::memcmp(one_thread.data(), batch.data(), batch.size() * sizeof(float)), 0)
        << "one thread and two differ";
  }
}

// A half-float cache (the one the model keeps on the CPU) gives every query
// the bits a float cache holding the halves' values gives: decode and
// prefill rows, one and several spans, two threads.
TEST_P(CpuAttentionTest, AHalfCacheGivesTheBitsOfAFloatCacheWithItsValues) {
  for (const attention_testing::HeadConfig& config : {attention_testing::kHeadConfigs[1],
                                                      attention_testing::kHeadConfigs[2]}) {
    AttentionInputs in = MakeAttentionInputs(MixedCase(config));
    std::vector<uint16_t> k(in.k_cache.size()), v(in.v_cache.size());
    cpu::FloatsToHalves(in.k_cache.data(), k.data(), static_cast<int64_t>(k.size()));
    cpu::FloatsToHalves(in.v_cache.data(), v.data(), static_cast<int64_t>(v.size()));
    for (size_t i = 0; i < k.size(); ++i) {
      in.k_cache[i] = gguf::HalfToFloat(k[i]);
      in.v_cache[i] = gguf::HalfToFloat(v[i]);
    }
    CpuBackend backend(2);
    std::vector<float> want(in.q.size(), -7.0f), got(in.q.size(), -7.0f);
    ASSERT_TRUE(backend.PagedAttention(in.HostParams(want.data())).ok());
    AttentionParams p = in.HostParams(got.data());
    p.cache = {k.data(), v.data(), KvType::kF16};
    ASSERT_TRUE(backend.PagedAttention(p).ok());
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0) << "heads " << config.heads;
  }
}

// Past the widening budget a prefill reads the half cache itself: the same
// bits whichever of the mixed case's prefills fit (none, some, all).
TEST_P(CpuAttentionTest, PrefillsPastTheWideningBudgetGetTheSameBits) {
  const attention_testing::HeadConfig config = attention_testing::kHeadConfigs[1];
  const AttentionInputs in = MakeAttentionInputs(MixedCase(config));
  std::vector<uint16_t> k(in.k_cache.size()), v(in.v_cache.size());
  cpu::FloatsToHalves(in.k_cache.data(), k.data(), static_cast<int64_t>(k.size()));
  cpu::FloatsToHalves(in.v_cache.data(), v.data(), static_cast<int64_t>(v.size()));
  AttentionParams p = in.HostParams(nullptr);
  p.cache = {k.data(), v.data(), KvType::kF16};
  ThreadPool pool(2);
  std::vector<float> all(in.q.size(), -7.0f);
  cpu::AttentionScratch scratch;
  p.out = all.data();
  ASSERT_TRUE(cpu::PagedAttention(pool, p, &scratch).ok());
  const int64_t row_bytes = int64_t{2} * config.kv_heads * config.head_dim * sizeof(float);
  // The prefills' contexts, in order: 5, 300, 1100, 2 and 16 rows.
  const std::pair<int64_t, int> budgets[] = {{0, 0}, {310, 3}, {2000, 5}};
  for (const auto& [rows, widened] : budgets) {
    std::vector<float> got(in.q.size(), -7.0f);
    cpu::AttentionScratch budgeted;
    budgeted.widen_budget_bytes = rows * row_bytes;
    p.out = got.data();
    ASSERT_TRUE(cpu::PagedAttention(pool, p, &budgeted).ok());
    EXPECT_EQ(std::count_if(budgeted.widened_at.begin(), budgeted.widened_at.end(), [](int64_t at) { return at >= 0; }),
              widened) << rows << " rows";
    EXPECT_EQ(std::memcmp(all.data(), got.data(), all.size() * sizeof(float)), 0) << rows << " rows";
  }
}

INSTANTIATE_TEST_SUITE_P(Versions, CpuAttentionTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Portable" : "Selected";
                         });

TEST(CpuAttentionRejectTest, HeadsThatDoNotDivide) {
  AttentionCase c = MixedCase(attention_testing::kHeadConfigs[1]);
  const AttentionInputs in = MakeAttentionInputs(c);
  std::vector<float> out(in.q.size());
  AttentionParams p = in.HostParams(out.data());
  p.num_kv_heads = 2;  // 9 heads
  const absl::Status status = CpuBackend(2).PagedAttention(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(status.message()).find("kv heads"), std::string::npos) << status;
}

// WriteKv into a half-float cache: each token's keys and values, rounded as
// FloatsToHalves rounds, at its slot, and no other slot touched; a negative
// slot (a padded row) writes nothing, not even in front of the cache.
TEST(CpuWriteKvTest, AHalfCacheTakesTheRoundedRowsAtTheirSlots) {
  const int32_t width = 3 * 64, tokens = 4, slots_total = 8;
  std::vector<float> k(tokens * width), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) k[i] = 0.1f * static_cast<float>(i) - 7.0f, v[i] = 1.0f / (1.0f + i);
  const std::vector<int64_t> slots = {5, -1, 0, 6};
  // One slot's width of guard before the cache: slot -1 would land there.
  std::vector<uint16_t> k_guarded((slots_total + 1) * width, 0xFFFF), v_guarded(k_guarded.size(), 0xFFFF);
  uint16_t* ck = k_guarded.data() + width;
  uint16_t* cv = v_guarded.data() + width;
  CpuBackend backend(1);
  ASSERT_TRUE(backend.WriteKv({{ck, cv, KvType::kF16}, k.data(), v.data(), slots.data(), tokens, width}).ok());
  for (int32_t i = 0; i < width; ++i) {
    ASSERT_EQ(k_guarded[i], 0xFFFF) << "the negative slot wrote in front of the cache";
    ASSERT_EQ(v_guarded[i], 0xFFFF) << "the negative slot wrote in front of the cache";
  }
  for (int32_t slot = 0; slot < slots_total; ++slot) {
    const auto t = std::find(slots.begin(), slots.end(), slot) - slots.begin();
    for (int32_t i = 0; i < width; ++i) {
      const size_t at = static_cast<size_t>(slot) * width + i;
      if (t == tokens) {
        ASSERT_EQ(ck[at], 0xFFFF) << "slot " << slot << " was not written to";
        ASSERT_EQ(cv[at], 0xFFFF) << "slot " << slot << " was not written to";
        continue;
      }
      ASSERT_EQ(ck[at], gguf::FloatToHalf(k[t * width + i])) << "slot " << slot << ", element " << i;
      ASSERT_EQ(cv[at], gguf::FloatToHalf(v[t * width + i])) << "slot " << slot << ", element " << i;
    }
  }
  EXPECT_EQ(backend.kv_type(), KvType::kF16);
}

TEST(CpuAttentionRejectTest, AHalfCacheOfHeadsLongerThanItTakes) {
  AttentionCase c = MixedCase(attention_testing::kHeadConfigs[1]);
  const AttentionInputs in = MakeAttentionInputs(c);
  std::vector<float> out(in.q.size());
  AttentionParams p = in.HostParams(out.data());
  p.cache.type = KvType::kF16;
  p.head_dim = cpu::kMaxHalfRowDim + 8;
  const absl::Status status = CpuBackend(2).PagedAttention(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(status.message()).find("head_dim"), std::string::npos) << status;
}

}  // namespace
}  // namespace tandem::worker
