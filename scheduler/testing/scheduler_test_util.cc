#include "scheduler/testing/scheduler_test_util.h"

#include "gtest/gtest.h"

namespace tandem::scheduler::testing {

EngineConfig VllmTestConfig(bool async_scheduling) {
  EngineConfig config;
  config.max_num_seqs = 16;
  config.max_num_batched_tokens = 8192;
  config.max_model_len = 8192;
  config.num_kv_blocks = 10000;
  config.block_size = 16;
  config.enable_prefix_caching = false;
  config.async_scheduling = async_scheduling;
  return config;
}

RequestSpec MakeRequest(RequestId id, int32_t num_tokens, int32_t max_tokens, bool same_prompt) {
  RequestSpec spec;
  spec.id = id;
  spec.prompt_token_ids.assign(num_tokens, same_prompt ? 0 : static_cast<TokenId>(id));
  spec.sampling.max_tokens = max_tokens;
  spec.sampling.eos_token_id = kEos;
  return spec;
}

std::unique_ptr<Scheduler> MakeScheduler(const EngineConfig& config) {
  auto scheduler = Scheduler::Create(config);
  EXPECT_TRUE(scheduler.ok()) << scheduler.status();
  return std::move(scheduler).value();
}

ModelRunnerOutput FakeOutput(const SchedulerOutput& step,
                             const std::function<TokenId(RequestId, size_t row)>& token) {
  ModelRunnerOutput output;
  output.step_seq = step.step_seq;
  for (size_t row = 0; row < step.scheduled.size(); ++row) {
    const ScheduledRequest& s = step.scheduled[row];
    if (!s.samples) {
      output.AddRow(s.id, {});
      continue;
    }
    const TokenId t = token ? token(s.id, row) : static_cast<TokenId>(row);
    output.AddRow(s.id, {t});
  }
  return output;
}

std::vector<RequestOutput> Update(Scheduler& scheduler, const SchedulerOutput& step,
                                  const std::function<TokenId(RequestId, size_t row)>& token) {
  std::vector<RequestOutput> outputs;
  scheduler.UpdateFromOutput(step, FakeOutput(step, token), &outputs);
  return outputs;
}

int32_t ScheduledTokens(const SchedulerOutput& step, RequestId id) {
  for (const ScheduledRequest& s : step.scheduled) {
    if (s.id == id) return s.num_tokens;
  }
  return 0;
}

WorkloadRun RunWorkload(const EngineConfig& config, std::vector<Arrival> arrivals,
                        FakeExecutorOptions executor_options,
                        const std::map<int64_t, std::vector<RequestId>>& aborts) {
  WorkloadOptions options;
  options.aborts = aborts;
  WorkloadRun run = RunEngineWorkload(config, std::move(arrivals), std::move(executor_options), options);
  EXPECT_TRUE(run.status.ok()) << run.status;
  return run;
}

}  // namespace tandem::scheduler::testing
