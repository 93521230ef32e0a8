// Randomized differential test of the scheduler and engine loop
// (scheduler/README.md §10), the CI sample of the campaign that
// tools/bench/scheduler_fuzz runs at scale: for each random workload
// (scheduler/testing/differential.h), the synchronous engine at queue depth 1
// and every other mode (sync behind batch queues of 2-4, async at depths 2-4,
// async with pipeline cadences 2 and 3) must give every request the same
// tokens and finish reason; aborted requests a prefix of them. The invariant
// checker runs at every step boundary and the pool must be full at the end.
//
// The fake executor's tokens depend on the KV it reads through the block
// table, and its writes land again when a step is collected, so a fence, hash
// or freeing error that matters shows up as a token difference
// (scheduler_fault_injection_test proves it for one of each).
#include <cstdint>
#include <cstdio>

#include "gtest/gtest.h"
#include "scheduler/testing/differential.h"

namespace tandem::scheduler::testing {
namespace {

// About 6 s on one core of the CI machine (and a few times that under ASan).
constexpr uint32_t kWorkloads = 1500;

TEST(SchedulerDifferentialTest, EveryModeGivesTheSameTokens) {
  DifferentialTally tally;
  for (uint32_t seed = 0; seed < kWorkloads; ++seed) {
    const RandomWorkload w = MakeRandomWorkload(seed);
    absl::Status s = RunDifferential(w, DifferentialOptions{}, &tally);
    ASSERT_TRUE(s.ok()) << s << "\n  reproduce: scheduler_fuzz --seed " << seed << " --workloads 1";
  }
  EXPECT_EQ(tally.mismatches, 0);
  // The workloads must exercise what they claim to.
  EXPECT_GT(tally.preemptions, 1000);
  EXPECT_GT(tally.stale_tokens, 100);
  EXPECT_GT(tally.aborted, 100);
  EXPECT_GT(tally.stop_strings, 50);
  EXPECT_GT(tally.stopped, 100);
  EXPECT_GT(tally.wasted_rows, 100);
  EXPECT_GT(tally.steps_checked, 100000);
  std::printf("%lld workloads, %lld runs, %lld steps checked, %lld mismatches: %lld preemptions, %lld stale tokens "
              "delivered, %lld aborts, %lld stop strings and %lld stop tokens (sync), %lld wasted rows\n",
              static_cast<long long>(tally.workloads), static_cast<long long>(tally.runs),
              static_cast<long long>(tally.steps_checked), static_cast<long long>(tally.mismatches),
              static_cast<long long>(tally.preemptions), static_cast<long long>(tally.stale_tokens),
              static_cast<long long>(tally.aborted), static_cast<long long>(tally.stop_strings),
              static_cast<long long>(tally.stopped), static_cast<long long>(tally.wasted_rows));
}

}  // namespace
}  // namespace tandem::scheduler::testing
