#include "scheduler/testing/scheduler_test_util.h"

#include "gtest/gtest.h"
#include "scheduler/testing/invariant_checker.h"

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

// Far more than any test workload needs: beyond it the engine is livelocked.
constexpr int64_t kMaxIterations = 100000;

WorkloadRun RunWorkload(const EngineConfig& config, std::vector<Arrival> arrivals,
                        FakeExecutorOptions executor_options,
                        const std::map<int64_t, std::vector<RequestId>>& aborts) {
  WorkloadRun run;
  std::unique_ptr<Scheduler> scheduler = MakeScheduler(config);
  if (scheduler == nullptr) return run;
  executor_options.num_blocks = config.num_kv_blocks;
  executor_options.block_size = config.block_size;
  FakeExecutor executor(std::move(executor_options));
  EngineCore engine(scheduler.get(), &executor);
  InvariantChecker checker;
  engine.AddObserver(&checker);

  std::stable_sort(arrivals.begin(), arrivals.end(),
                   [](const Arrival& a, const Arrival& b) { return a.at_iteration < b.at_iteration; });
  size_t next = 0;
  int64_t idle = 0;
  for (int64_t it = 0; next < arrivals.size() || engine.HasWork(); ++it) {
    while (next < arrivals.size() && arrivals[next].at_iteration <= it) {
      RequestSpec& spec = arrivals[next].spec;
      run.results[spec.id];
      absl::Status added = engine.AddRequest(std::move(spec));
      EXPECT_TRUE(added.ok()) << added;
      ++next;
    }
    if (auto a = aborts.find(it); a != aborts.end()) {
      for (RequestId id : a->second) engine.Abort(id);
    }
    auto result = engine.Step();
    if (!result.ok()) {
      ADD_FAILURE() << "engine step failed: " << result.status();
      return run;
    }
    for (const RequestOutput& out : result->outputs) {
      RequestResult& r = run.results[out.id];
      r.tokens.insert(r.tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      if (!out.new_token_ids.empty()) ++r.num_outputs;
      if (out.finished()) {
        EXPECT_EQ(r.finish, FinishReason::kNone) << "request " << out.id << " finished twice";
        r.finish = out.finish_reason;
      }
    }
    // An iteration that neither launches nor completes a step makes no
    // progress; a few in a row (waiting for arrivals aside) is a stall.
    idle = (result->executed || result->updated || next < arrivals.size()) ? 0 : idle + 1;
    if (idle > 3 || it > kMaxIterations) {
      ADD_FAILURE() << "engine stalled with " << scheduler->num_requests() << " requests after " << it
                    << " iterations (" << scheduler->stats().num_preemptions << " preemptions)";
      return run;
    }
    run.iterations = it + 1;
  }
  run.stats = scheduler->stats();
  run.free_blocks_at_end = scheduler->kv_cache().pool().num_free_blocks();
  run.usable_blocks = config.num_kv_blocks - 1;
  return run;
}

}  // namespace tandem::scheduler::testing
