// The CPU backend's PagedAttention gives a query the same bits whatever else
// is in its call: alone or in a mixed batch, as a decode row or as the last
// row of a prefill chunk, on one thread or two; with the AVX2 versions and
// the portable ones. (Its values against the GPU kernel's model, within 1e-5,
// are attention_model_test's.)
#include "worker/backends/cpu/cpu_attention.h"

#include <cstring>
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

}  // namespace
}  // namespace tandem::worker
