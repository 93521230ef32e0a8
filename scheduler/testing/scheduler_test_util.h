// Helpers shared by the scheduler tests: configs and requests shaped like
// vLLM's acceptance tests (its tests/v1/core/utils.py), a stand-in model
// output for driving the Scheduler directly, and RunWorkload, which drives a
// whole EngineCore with a FakeExecutor and the InvariantChecker attached.
#ifndef TANDEM_SCHEDULER_TESTING_SCHEDULER_TEST_UTIL_H_
#define TANDEM_SCHEDULER_TESTING_SCHEDULER_TEST_UTIL_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "scheduler/core/engine_core.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/testing/fake_executor.h"
#include "scheduler/testing/workload_runner.h"

namespace tandem::scheduler::testing {

inline constexpr TokenId kEos = 50256;

// vLLM's create_scheduler defaults: 16 seqs, 8192-token budget and model
// length, 10000 blocks of 16, chunked prefill on, prefix caching off, FCFS.
EngineConfig VllmTestConfig(bool async_scheduling = true);

// vLLM's create_requests: `num_tokens` prompt tokens all equal to `id` (or 0
// with `same_prompt`), max_tokens 16, EOS 50256.
RequestSpec MakeRequest(RequestId id, int32_t num_tokens = 10, int32_t max_tokens = 16,
                        bool same_prompt = false);

std::unique_ptr<Scheduler> MakeScheduler(const EngineConfig& config);

// A model output for `step`: every sampling row gets token id = its batch
// position (vLLM's fake output: 0, 1, 2, ..., never EOS), unless `token`
// says otherwise.
ModelRunnerOutput FakeOutput(const SchedulerOutput& step,
                             const std::function<TokenId(RequestId, size_t row)>& token = nullptr);

// Updates `scheduler` with FakeOutput(step) and returns the outputs.
std::vector<RequestOutput> Update(Scheduler& scheduler, const SchedulerOutput& step,
                                  const std::function<TokenId(RequestId, size_t row)>& token = nullptr);

int32_t ScheduledTokens(const SchedulerOutput& step, RequestId id);

// Runs `arrivals` to completion on an EngineCore over a FakeExecutor, with
// the InvariantChecker checking every step boundary (RunEngineWorkload).
// `aborts` maps an engine iteration to the ids aborted before it. Fails the
// test (and returns what it has) on an engine error, a rejected request, an
// invariant violation, or a stall.
WorkloadRun RunWorkload(const EngineConfig& config, std::vector<Arrival> arrivals,
                        FakeExecutorOptions executor_options,
                        const std::map<int64_t, std::vector<RequestId>>& aborts = {});

}  // namespace tandem::scheduler::testing

#endif  // TANDEM_SCHEDULER_TESTING_SCHEDULER_TEST_UTIL_H_
