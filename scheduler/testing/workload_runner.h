// RunEngineWorkload: drives a whole EngineCore over a FakeExecutor through a
// list of arrivals, aborts and stop strings, with the InvariantChecker at
// every step boundary, and reports what every request received. No gtest:
// the scheduler tests (scheduler_test_util.h's RunWorkload) and the
// differential campaign tool (tools/bench/scheduler_fuzz.cc) share it.
//
// Thread-compatible: one call runs one engine on the caller's thread.
#ifndef TANDEM_SCHEDULER_TESTING_WORKLOAD_RUNNER_H_
#define TANDEM_SCHEDULER_TESTING_WORKLOAD_RUNNER_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/core/fault_injection.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/testing/fake_executor.h"

namespace tandem::scheduler::testing {

// Everything one request received from the engine.
struct RequestResult {
  std::vector<TokenId> tokens;
  FinishReason finish = FinishReason::kNone;
  int32_t num_outputs = 0;  // output messages carrying tokens
};

struct Arrival {
  int64_t at_iteration = 0;  // engine iteration at which AddRequest happens
  RequestSpec spec;
};

struct WorkloadOptions {
  // Engine iteration -> ids aborted before it (a client going away).
  std::map<int64_t, std::vector<RequestId>> aborts;
  // A stop string as the frontend matches it: once request `id` receives
  // token `stop_tokens[id]`, it is aborted before the next iteration.
  std::map<RequestId, TokenId> stop_tokens;
  // Attach the InvariantChecker; its first violation ends the run.
  bool check_invariants = true;
  // Test builds only (scheduler/core/fault_injection.h).
  SchedulerFault fault = SchedulerFault::kNone;
};

struct WorkloadRun {
  std::map<RequestId, RequestResult> results;
  SchedulerStats stats;
  int64_t iterations = 0;
  int64_t steps_checked = 0;  // step boundaries the checker passed
  int32_t free_blocks_at_end = 0;
  int32_t usable_blocks = 0;
  // The first engine error, rejected request, stall or invariant violation;
  // the run stops there.
  absl::Status status;
};

WorkloadRun RunEngineWorkload(const EngineConfig& config, std::vector<Arrival> arrivals,
                              FakeExecutorOptions executor_options, const WorkloadOptions& options);

// A deep copy (RequestSpec holds a grammar by unique_ptr; these have none).
std::vector<Arrival> CopyArrivals(const std::vector<Arrival>& arrivals);

}  // namespace tandem::scheduler::testing

#endif  // TANDEM_SCHEDULER_TESTING_WORKLOAD_RUNNER_H_
