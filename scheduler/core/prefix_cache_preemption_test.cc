// Prefix-cache entries must name KV that a step really computed (issue 11,
// defect 1). Under the priority policy a request planned earlier in a step
// can become the victim of a request planned later in the same step; its
// plan is undone and its blocks go back to the pool. Hashes registered for
// that plan would describe KV that no step ever wrote, and a later prefix hit
// on them (here: the victim itself when it resumes) would read garbage.
//
// The FakeExecutor's tokens are a hash of the KV each step reads through the
// block table, so a stale hit changes the victim's tokens: every test
// compares against a run whose pool is large enough that nobody is preempted.
#include <map>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/testing/scheduler_test_util.h"

namespace tandem::scheduler {
namespace {

using testing::Arrival;
using testing::RunWorkload;
using testing::WorkloadRun;

constexpr int32_t kVocab = 64;

// Block size 4, chunks of at most 5 tokens, 5 usable blocks. The victim V
// (priority 1, 13 prompt tokens) is admitted first and prefills [0, 5) and
// [5, 10); R (priority 0, 4 tokens) is admitted in step 2 and samples. In
// step 3, V's last chunk [10, 13) takes the last free block and completes its
// third block (positions 8-11); R's first decode (position 4) then needs a
// block, and its victim is V, already planned. The plan is undone, but
// without the fix V's third block keeps the hash registered for it though
// positions 10 and 11 were never computed. V's new, unhashed block goes to the
// head of the free queue and R takes it, so the stale entry survives until V
// resumes (after R finishes) and hits all three blocks.
EngineConfig VictimConfig(bool async_scheduling, int32_t num_kv_blocks) {
  EngineConfig c;
  c.block_size = 4;
  c.num_kv_blocks = num_kv_blocks;
  c.max_model_len = 16;
  c.max_num_batched_tokens = 16;
  c.long_prefill_token_threshold = 5;
  c.max_num_seqs = 4;
  c.enable_prefix_caching = true;
  c.policy = SchedulingPolicy::kPriority;
  c.async_scheduling = async_scheduling;
  c.vocab_size = kVocab;
  return c;
}

std::vector<Arrival> VictimArrivals(int64_t r_arrives_at) {
  std::vector<Arrival> arrivals(2);
  arrivals[0].at_iteration = 0;
  arrivals[0].spec.id = 1;  // V
  arrivals[0].spec.priority = 1;
  for (int i = 0; i < 13; ++i) arrivals[0].spec.prompt_token_ids.push_back(1 + i);
  arrivals[0].spec.sampling.max_tokens = 2;
  arrivals[0].spec.sampling.ignore_eos = true;
  arrivals[1].at_iteration = r_arrives_at;
  arrivals[1].spec.id = 2;  // R
  arrivals[1].spec.priority = 0;
  arrivals[1].spec.prompt_token_ids = {40, 41, 42, 43};
  arrivals[1].spec.sampling.max_tokens = 3;
  arrivals[1].spec.sampling.ignore_eos = true;
  return arrivals;
}

void ExpectSameTokens(const WorkloadRun& reference, const WorkloadRun& run) {
  for (const auto& [id, expected] : reference.results) {
    EXPECT_EQ(run.results.at(id).tokens, expected.tokens) << "request " << id;
    EXPECT_EQ(run.results.at(id).finish, expected.finish) << "request " << id;
  }
  EXPECT_EQ(run.free_blocks_at_end, run.usable_blocks) << "blocks leaked";
}

TEST(PrefixCachePreemptionTest, RolledBackPlanLeavesNoPrefixCacheEntry) {
  FakeExecutorOptions options;
  options.vocab_size = kVocab;
  const WorkloadRun reference = RunWorkload(VictimConfig(false, 64), VictimArrivals(1), options);
  ASSERT_EQ(reference.stats.num_preemptions, 0);
  const WorkloadRun run = RunWorkload(VictimConfig(false, 6), VictimArrivals(1), options);
  ASSERT_EQ(run.stats.num_preemptions, 1) << "the scenario must preempt V after planning it";
  ExpectSameTokens(reference, run);
}

// The same with async scheduling: frees are fenced and V's victimhood must
// still leave nothing registered.
TEST(PrefixCachePreemptionTest, RolledBackPlanLeavesNoPrefixCacheEntryAsync) {
  FakeExecutorOptions options;
  options.vocab_size = kVocab;
  for (int64_t r_arrives_at = 0; r_arrives_at < 6; ++r_arrives_at) {
    SCOPED_TRACE(r_arrives_at);
    const WorkloadRun reference = RunWorkload(VictimConfig(true, 64), VictimArrivals(r_arrives_at), options);
    const WorkloadRun run = RunWorkload(VictimConfig(true, 6), VictimArrivals(r_arrives_at), options);
    ExpectSameTokens(reference, run);
  }
}

}  // namespace
}  // namespace tandem::scheduler
