// Proves that the differential comparison can fail: each deliberate defect of
// scheduler/core/fault_injection.h (compiled into this test's core only) must
// make some random workload give different tokens than the correct
// synchronous reference, with the invariant checker off, so that the tokens
// alone catch it: the fake executor's tokens depend on the KV it reads
// (scheduler/testing/fake_executor.h). The invariant checker must catch each
// too, on its own (before any token differs).
#include <cstdint>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "scheduler/testing/differential.h"

namespace tandem::scheduler::testing {
namespace {

// Seeds tried before giving up; each fault is caught far sooner.
constexpr uint32_t kMaxSeeds = 2000;

struct Caught {
  uint32_t seeds_tried = 0;
  absl::Status first;  // the first failure
};

Caught Hunt(SchedulerFault fault, bool check_invariants) {
  Caught caught;
  DifferentialOptions options;
  options.fault = fault;
  options.check_invariants = check_invariants;
  DifferentialTally tally;
  for (uint32_t seed = 0; seed < kMaxSeeds; ++seed) {
    ++caught.seeds_tried;
    caught.first = RunDifferential(MakeRandomWorkload(seed), options, &tally);
    if (!caught.first.ok()) break;
  }
  return caught;
}

class FaultInjectionTest : public ::testing::TestWithParam<SchedulerFault> {};

TEST_P(FaultInjectionTest, TokensAloneCatchIt) {
  const Caught caught = Hunt(GetParam(), /*check_invariants=*/false);
  ASSERT_TRUE(absl::IsDataLoss(caught.first)) << SchedulerFaultName(GetParam()) << ": no token difference in "
                                              << caught.seeds_tried << " workloads: " << caught.first;
  std::printf("%s: tokens differ after %u workloads: %s\n", SchedulerFaultName(GetParam()), caught.seeds_tried,
              std::string(caught.first.message()).c_str());
}

TEST_P(FaultInjectionTest, TheCheckerCatchesIt) {
  const Caught caught = Hunt(GetParam(), /*check_invariants=*/true);
  ASSERT_TRUE(absl::IsInternal(caught.first)) << SchedulerFaultName(GetParam()) << ": no violation in "
                                              << caught.seeds_tried << " workloads: " << caught.first;
  std::printf("%s: the checker caught it after %u workloads: %s\n", SchedulerFaultName(GetParam()),
              caught.seeds_tried, std::string(caught.first.message()).c_str());
}

INSTANTIATE_TEST_SUITE_P(Faults, FaultInjectionTest,
                         ::testing::Values(SchedulerFault::kNoFence, SchedulerFault::kEarlyHashes,
                                           SchedulerFault::kFreeSharedBlocks),
                         [](const ::testing::TestParamInfo<SchedulerFault>& info) {
                           std::string name = SchedulerFaultName(info.param);
                           for (char& c : name) c = c == ' ' ? '_' : c;
                           return name;
                         });

}  // namespace
}  // namespace tandem::scheduler::testing
