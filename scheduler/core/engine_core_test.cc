// EngineCore: the batch-queue loop (vLLM's EngineCore.step_with_batch_queue),
// deferred sampling for structured output (scheduler/README.md §4.7), aborts
// before update (scheduler/README.md §4.9), and how it treats a broken
// executor.
#include <algorithm>
#include <deque>
#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/testing/invariant_checker.h"
#include "scheduler/testing/scheduler_test_util.h"

namespace tandem::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::Arrival;
using testing::MakeRequest;
using testing::MakeScheduler;
using testing::RunWorkload;
using testing::VllmTestConfig;

// Records the tokens scheduled for each executed step.
class StepRecorder : public StepObserver {
 public:
  void OnScheduled(const EngineCore&, const SchedulerOutput& step) override {
    if (!step.empty()) tokens.push_back(step.total_num_scheduled_tokens);
  }
  std::vector<int32_t> tokens;
};

struct SeedRun {
  std::vector<int32_t> step_tokens;
  std::vector<TokenId> output;
  FinishReason finish = FinishReason::kNone;
  int64_t wasted = 0;
};

// The worked example of scheduler/README.md §2: one 6-token prompt, budget 4,
// depth 2.
SeedRun RunSeedCase(int32_t max_tokens, int32_t eos_at, int32_t depth) {
  EngineConfig config = VllmTestConfig(depth > 1);
  config.max_num_batched_tokens = 4;
  config.batch_queue_depth = depth;
  auto scheduler = MakeScheduler(config);
  FakeExecutorOptions options;
  options.force_token = [eos_at](RequestId, int32_t index) -> std::optional<TokenId> {
    return index == eos_at ? std::optional<TokenId>(testing::kEos) : std::nullopt;
  };
  FakeExecutor executor(options);
  EngineCore engine(scheduler.get(), &executor);
  StepRecorder recorder;
  InvariantChecker checker;
  engine.AddObserver(&recorder);
  engine.AddObserver(&checker);
  EXPECT_TRUE(engine.AddRequest(MakeRequest(0, 6, max_tokens)).ok());
  SeedRun run;
  while (engine.HasWork()) {
    auto result = engine.Step();
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) break;
    for (const RequestOutput& out : result->outputs) {
      run.output.insert(run.output.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      if (out.finished()) run.finish = out.finish_reason;
    }
  }
  run.step_tokens = recorder.tokens;
  run.wasted = scheduler->stats().num_wasted_rows;
  return run;
}

TEST(EngineCoreTest, SeedCase1StopsAtMaxTokensWithoutWaste) {
  SeedRun run = RunSeedCase(/*max_tokens=*/3, /*eos_at=*/0, /*depth=*/2);
  EXPECT_THAT(run.step_tokens, ElementsAre(4, 2, 1, 1));  // 8 tokens, no step 5
  EXPECT_EQ(run.output.size(), 3u);
  EXPECT_EQ(run.finish, FinishReason::kLength);
  EXPECT_EQ(run.wasted, 0);
}

TEST(EngineCoreTest, SeedCase2WastesOneStepOnEos) {
  SeedRun run = RunSeedCase(/*max_tokens=*/8, /*eos_at=*/2, /*depth=*/2);
  EXPECT_THAT(run.step_tokens, ElementsAre(4, 2, 1, 1));
  EXPECT_EQ(run.output.size(), 2u);
  EXPECT_EQ(run.finish, FinishReason::kStop);
  EXPECT_EQ(run.wasted, 1);
}

TEST(EngineCoreTest, SeedTryItQuestions) {
  // 1. EOS as the first token still wastes exactly one step at depth 2.
  EXPECT_EQ(RunSeedCase(8, 1, 2).wasted, 1);
  // 2. A queue of depth 3 wastes two.
  EXPECT_EQ(RunSeedCase(8, 2, 3).wasted, 2);
  // The synchronous loop wastes none.
  EXPECT_EQ(RunSeedCase(8, 2, 1).wasted, 0);
}

TEST(EngineCoreTest, AsyncLoopExecutesTheNextStepBeforeCollecting) {
  std::vector<std::string> log;
  auto scheduler = MakeScheduler(VllmTestConfig());
  FakeExecutorOptions options;
  options.call_log = &log;
  FakeExecutor executor(options);
  EngineCore engine(scheduler.get(), &executor);
  ASSERT_TRUE(engine.AddRequest(MakeRequest(0, 4, 3)).ok());
  while (engine.HasWork()) ASSERT_TRUE(engine.Step().ok());
  EXPECT_THAT(log, ElementsAre("execute 1", "sample 1", "execute 2", "sample 2", "collect 1", "execute 3",
                               "sample 3", "collect 2", "collect 3"));
}

TEST(EngineCoreTest, SyncLoopWaitsForEachStep) {
  std::vector<std::string> log;
  auto scheduler = MakeScheduler(VllmTestConfig(false));
  FakeExecutorOptions options;
  options.call_log = &log;
  FakeExecutor executor(options);
  EngineCore engine(scheduler.get(), &executor);
  ASSERT_TRUE(engine.AddRequest(MakeRequest(0, 4, 2)).ok());
  while (engine.HasWork()) ASSERT_TRUE(engine.Step().ok());
  EXPECT_THAT(log, ElementsAre("execute 1", "sample 1", "collect 1", "execute 2", "sample 2", "collect 2"));
}

// Allows tokens of alternating parity: the mask for token k depends on how
// many tokens the grammar has seen, so a mask built too early is wrong.
class ParityGrammar : public Grammar {
 public:
  bool AcceptTokens(absl::Span<const TokenId> tokens) override {
    for (TokenId t : tokens) {
      if (t % 2 != accepted_ % 2) return false;
      ++accepted_;
    }
    return true;
  }
  void FillBitmask(absl::Span<uint32_t> row, int32_t vocab_size) const override {
    for (TokenId t = accepted_ % 2; t < vocab_size; t += 2) row[t / 32] |= 1u << (t % 32);
  }

 private:
  int accepted_ = 0;
};

Arrival StructuredArrival(RequestId id, int32_t max_tokens) {
  RequestSpec spec = MakeRequest(id, 5, max_tokens);
  spec.sampling.ignore_eos = true;
  spec.grammar = std::make_unique<ParityGrammar>();
  return {0, std::move(spec)};
}

TEST(EngineCoreTest, StructuredOutputDefersSamplingNotTheForward) {
  std::vector<std::string> log;
  EngineConfig config = VllmTestConfig();
  config.vocab_size = 64;
  FakeExecutorOptions options;
  options.vocab_size = 64;
  options.call_log = &log;
  std::vector<Arrival> arrivals;
  arrivals.push_back(StructuredArrival(0, 6));
  testing::WorkloadRun run = RunWorkload(config, std::move(arrivals), options);
  ASSERT_EQ(run.results[0].finish, FinishReason::kLength);  // no grammar rejection
  ASSERT_EQ(run.results[0].tokens.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(run.results[0].tokens[i] % 2, static_cast<int>(i % 2));
  // Step 3 is the first with a placeholder in flight: its forward starts
  // before step 2 is collected, its sampling only after.
  auto at = [&log](const std::string& entry) { return std::find(log.begin(), log.end(), entry) - log.begin(); };
  EXPECT_LT(at("execute 3"), at("collect 2"));
  EXPECT_GT(at("sample 3"), at("collect 2"));
  EXPECT_LT(at("sample 2"), at("execute 3"));  // the forward needs step 2's sample

  // Same tokens as the synchronous engine, and at depth 3.
  for (int32_t depth : {1, 3}) {
    EngineConfig other = config;
    other.async_scheduling = depth > 1;
    other.batch_queue_depth = depth;
    std::vector<Arrival> again;
    again.push_back(StructuredArrival(0, 6));
    FakeExecutorOptions plain;
    plain.vocab_size = 64;
    EXPECT_EQ(RunWorkload(other, std::move(again), plain).results[0].tokens, run.results[0].tokens)
        << "depth " << depth;
  }
}

TEST(EngineCoreTest, AbortDuringTheFinalStepWins) {
  auto scheduler = MakeScheduler(VllmTestConfig());
  FakeExecutor executor({});
  EngineCore engine(scheduler.get(), &executor);
  ASSERT_TRUE(engine.AddRequest(MakeRequest(0, 4, 1)).ok());
  auto first = engine.Step();  // launches the request's only step
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(engine.in_flight().size(), 1u);
  engine.Abort(0);
  std::vector<RequestOutput> outputs;
  while (engine.HasWork()) {
    auto result = engine.Step();
    ASSERT_TRUE(result.ok());
    outputs.insert(outputs.end(), result->outputs.begin(), result->outputs.end());
  }
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].finish_reason, FinishReason::kAbort);
  EXPECT_TRUE(outputs[0].new_token_ids.empty());
  EXPECT_EQ(scheduler->kv_cache().pool().num_free_blocks(), 10000 - 1);
}

// Runs `specs` to completion and returns every output, checking the
// invariants at each step boundary.
std::vector<RequestOutput> RunOutputs(const EngineConfig& config, std::vector<RequestSpec> specs,
                                      FakeExecutorOptions options) {
  auto scheduler = MakeScheduler(config);
  options.num_blocks = config.num_kv_blocks;
  options.block_size = config.block_size;
  FakeExecutor executor(options);
  EngineCore engine(scheduler.get(), &executor);
  InvariantChecker checker;
  engine.AddObserver(&checker);
  for (RequestSpec& spec : specs) EXPECT_TRUE(engine.AddRequest(std::move(spec)).ok());
  std::vector<RequestOutput> outputs;
  while (engine.HasWork()) {
    auto result = engine.Step();
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) break;
    outputs.insert(outputs.end(), result->outputs.begin(), result->outputs.end());
  }
  return outputs;
}

// Every reported logprob belongs to a token reported with it (the fake puts
// the sampled token first in its top list).
void ExpectAlignedLogprobs(const RequestOutput& out, int32_t top_n) {
  ASSERT_EQ(out.logprobs.size(), out.new_token_ids.size()) << "request " << out.id;
  for (size_t j = 0; j < out.logprobs.size(); ++j) {
    ASSERT_EQ(out.logprobs[j].top.size(), static_cast<size_t>(top_n));
    EXPECT_LE(out.logprobs[j].logprob, 0.0f);
    if (top_n > 0) {
      EXPECT_EQ(out.logprobs[j].top[0].first, out.new_token_ids[j]);
      EXPECT_EQ(out.logprobs[j].top[0].second, out.logprobs[j].logprob);
    }
  }
}

// A stop token ends a request with steps still in flight: their tokens, and
// their logprobs, are sampled but never reported.
TEST(EngineCoreTest, DiscardedTokensReportNoLogprobs) {
  std::vector<SampleRecord> samples;
  FakeExecutorOptions options;
  options.sample_log = &samples;
  options.force_token = [](RequestId id, int32_t index) -> std::optional<TokenId> {
    return id == 0 && index == 3 ? std::optional<TokenId>(testing::kEos) : std::nullopt;
  };
  std::vector<RequestSpec> specs;
  specs.push_back(MakeRequest(0, 6, 8));
  specs.back().sampling.logprobs = 2;
  specs.push_back(MakeRequest(1, 5, 5));  // no logprobs
  specs.push_back(MakeRequest(2, 7, 4));
  specs.back().sampling.logprobs = 0;
  const std::vector<RequestOutput> outputs = RunOutputs(VllmTestConfig(), std::move(specs), options);
  std::map<RequestId, int32_t> reported;
  for (const RequestOutput& out : outputs) {
    reported[out.id] += static_cast<int32_t>(out.new_token_ids.size());
    if (out.id == 1) {
      EXPECT_TRUE(out.logprobs.empty());
    } else {
      ExpectAlignedLogprobs(out, out.id == 0 ? 2 : 0);
    }
  }
  EXPECT_EQ(reported[0], 3);
  EXPECT_EQ(reported[1], 5);
  EXPECT_EQ(reported[2], 4);
  const auto sampled_for_0 =
      std::count_if(samples.begin(), samples.end(), [](const SampleRecord& s) { return s.id == 0; });
  EXPECT_EQ(sampled_for_0, 4);  // one step past the EOS was wasted
}

// Preemption with steps in flight: late (stale) tokens are delivered and keep
// their logprobs.
TEST(EngineCoreTest, StaleTokensKeepTheirLogprobs) {
  EngineConfig config = VllmTestConfig();
  config.num_kv_blocks = 14;  // 13 usable: four requests of 5 blocks preempt
  config.max_model_len = 80;
  std::vector<RequestSpec> specs;
  for (RequestId id = 0; id < 4; ++id) {
    specs.push_back(MakeRequest(id, 30, 40));
    specs.back().sampling.logprobs = 3;
    specs.back().sampling.ignore_eos = true;
  }
  auto scheduler = MakeScheduler(config);
  FakeExecutorOptions options;
  options.num_blocks = config.num_kv_blocks;
  FakeExecutor executor(options);
  EngineCore engine(scheduler.get(), &executor);
  InvariantChecker checker;
  engine.AddObserver(&checker);
  for (RequestSpec& spec : specs) ASSERT_TRUE(engine.AddRequest(std::move(spec)).ok());
  std::map<RequestId, int32_t> reported;
  int32_t stale_reported = 0;
  while (engine.HasWork()) {
    auto result = engine.Step();
    ASSERT_TRUE(result.ok()) << result.status();
    for (const RequestOutput& out : result->outputs) {
      ExpectAlignedLogprobs(out, 3);
      reported[out.id] += static_cast<int32_t>(out.new_token_ids.size());
      if (out.stale) stale_reported += static_cast<int32_t>(out.logprobs.size());
    }
  }
  for (RequestId id = 0; id < 4; ++id) EXPECT_EQ(reported[id], 40) << "request " << id;
  EXPECT_GT(scheduler->stats().num_preemptions, 0);
  EXPECT_EQ(stale_reported, scheduler->stats().num_stale_tokens_delivered);
  EXPECT_GT(stale_reported, 0);
}

// Wraps an executor and damages its answers.
class CorruptingExecutor : public Executor {
 public:
  explicit CorruptingExecutor(Executor* inner) : inner_(inner) {}
  absl::Status Execute(const SchedulerOutput& step) override { return inner_->Execute(step); }
  absl::Status Sample(StepSeq seq, const GrammarOutput* grammar) override { return inner_->Sample(seq, grammar); }
  absl::StatusOr<ModelRunnerOutput> CollectOutput(StepSeq seq) override {
    auto output = inner_->CollectOutput(seq);
    if (output.ok() && seq == 2) {
      output->sampled_token_ids.clear();
      output->sampled_offsets.assign(output->request_ids.size() + 1, 0);
    }
    return output;
  }

 private:
  Executor* inner_;
};

TEST(EngineCoreTest, AMissingTokenIsAnErrorNotACrash) {
  auto scheduler = MakeScheduler(VllmTestConfig());
  FakeExecutor fake({});
  CorruptingExecutor executor(&fake);
  EngineCore engine(scheduler.get(), &executor);
  ASSERT_TRUE(engine.AddRequest(MakeRequest(0, 4, 5)).ok());
  absl::Status status;
  while (status.ok() && engine.HasWork()) status = engine.Step().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("step 2 request 0: 0 sampled tokens, expected 1"));
}

TEST(RunnerOutputValidationTest, RejectsMismatches) {
  auto scheduler = MakeScheduler(VllmTestConfig());
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(0)).ok());
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(1)).ok());
  const SchedulerOutput step = scheduler->Schedule();
  ModelRunnerOutput good = testing::FakeOutput(step);
  EXPECT_TRUE(ValidateRunnerOutput(step, good).ok());
  ModelRunnerOutput wrong_step = good;
  wrong_step.step_seq = 7;
  EXPECT_THAT(ValidateRunnerOutput(step, wrong_step).message(), HasSubstr("answered step 7"));
  ModelRunnerOutput swapped = good;
  std::swap(swapped.request_ids[0], swapped.request_ids[1]);
  EXPECT_THAT(ValidateRunnerOutput(step, swapped).message(), HasSubstr("where 0 was scheduled"));
  ModelRunnerOutput short_rows;
  short_rows.step_seq = step.step_seq;
  short_rows.AddRow(0, {TokenId{1}});
  EXPECT_THAT(ValidateRunnerOutput(step, short_rows).message(), HasSubstr("1 rows for 2"));
}

}  // namespace
}  // namespace tandem::scheduler
