// Scheduling policy (scheduler/README.md §5; vLLM's Scheduler.schedule()):
// budgets, caps, chunked prefill, FCFS and priority, recompute preemption, the
// stop checks, and the synchronous scheduler behind a batch queue (vLLM's
// tests/v1/engine/test_engine_core.py::test_engine_core_concurrent_batches).
#include <deque>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/testing/invariant_checker.h"
#include "scheduler/testing/scheduler_test_util.h"

namespace tandem::scheduler {
namespace {

using ::testing::ElementsAre;
using testing::MakeRequest;
using testing::MakeScheduler;
using testing::ScheduledTokens;
using testing::Update;
using testing::VllmTestConfig;

void ExpectInvariants(const Scheduler& scheduler, const std::deque<SchedulerOutput>& in_flight = {}) {
  absl::Status status = InvariantChecker::Check(scheduler, in_flight);
  EXPECT_TRUE(status.ok()) << status;
}

std::vector<std::pair<RequestId, int32_t>> Rows(const SchedulerOutput& step) {
  std::vector<std::pair<RequestId, int32_t>> rows;
  for (const ScheduledRequest& s : step.scheduled) rows.emplace_back(s.id, s.num_tokens);
  return rows;
}

using Row = std::pair<RequestId, int32_t>;

TEST(SchedulerTest, TokenBudgetChunksPrefills) {
  EngineConfig config = VllmTestConfig(/*async_scheduling=*/false);
  config.max_num_batched_tokens = 8;
  auto scheduler = MakeScheduler(config);
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(0, 10)).ok());
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(1, 5)).ok());
  SchedulerOutput s1 = scheduler->Schedule();
  EXPECT_THAT(Rows(s1), ElementsAre(Row{0, 8}));
  EXPECT_FALSE(s1.scheduled[0].samples);  // a prefill chunk
  Update(*scheduler, s1);
  SchedulerOutput s2 = scheduler->Schedule();
  EXPECT_THAT(Rows(s2), ElementsAre(Row{0, 2}, Row{1, 5}));
  EXPECT_TRUE(s2.scheduled[0].samples);
  EXPECT_TRUE(s2.scheduled[1].samples);
  ExpectInvariants(*scheduler, {s2});
}

TEST(SchedulerTest, LongPrefillThresholdCapsEachRequest) {
  EngineConfig config = VllmTestConfig(false);
  config.long_prefill_token_threshold = 4;
  auto scheduler = MakeScheduler(config);
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(0, 10)).ok());
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(1, 3)).ok());
  std::vector<std::vector<Row>> steps;
  for (int i = 0; i < 3; ++i) {
    SchedulerOutput step = scheduler->Schedule();
    steps.push_back(Rows(step));
    Update(*scheduler, step);
  }
  EXPECT_THAT(steps[0], ElementsAre(Row{0, 4}, Row{1, 3}));
  EXPECT_THAT(steps[1], ElementsAre(Row{0, 4}, Row{1, 1}));
  EXPECT_THAT(steps[2], ElementsAre(Row{0, 2}, Row{1, 1}));
}

TEST(SchedulerTest, MaxNumSeqsCapsTheRunningSet) {
  EngineConfig config = VllmTestConfig(false);
  config.max_num_seqs = 2;
  auto scheduler = MakeScheduler(config);
  for (RequestId id = 0; id < 3; ++id) ASSERT_TRUE(scheduler->AddRequest(MakeRequest(id, 10, 2)).ok());
  SchedulerOutput s1 = scheduler->Schedule();
  EXPECT_THAT(Rows(s1), ElementsAre(Row{0, 10}, Row{1, 10}));
  EXPECT_EQ(scheduler->num_waiting(), 1u);
  Update(*scheduler, s1);
  SchedulerOutput s2 = scheduler->Schedule();
  Update(*scheduler, s2);  // both reach max_tokens = 2
  SchedulerOutput s3 = scheduler->Schedule();
  EXPECT_THAT(Rows(s3), ElementsAre(Row{2, 10}));
}

TEST(SchedulerTest, WithoutChunkedPrefillARequestWaitsUntilItFitsWhole) {
  EngineConfig config = VllmTestConfig(false);
  config.enable_chunked_prefill = false;
  config.max_num_batched_tokens = 16;
  config.max_model_len = 16;
  auto scheduler = MakeScheduler(config);
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(0, 10)).ok());
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(1, 10)).ok());
  SchedulerOutput s1 = scheduler->Schedule();
  EXPECT_THAT(Rows(s1), ElementsAre(Row{0, 10}));  // request 1 would need 10 of the 6 left
  Update(*scheduler, s1);
  SchedulerOutput s2 = scheduler->Schedule();
  EXPECT_THAT(Rows(s2), ElementsAre(Row{0, 1}, Row{1, 10}));
}

TEST(SchedulerTest, PriorityPolicyAdmitsMostImportantFirst) {
  EngineConfig config = VllmTestConfig(false);
  config.policy = SchedulingPolicy::kPriority;
  config.max_num_seqs = 1;
  auto scheduler = MakeScheduler(config);
  RequestSpec low = MakeRequest(0);
  low.priority = 5;
  RequestSpec high = MakeRequest(1);
  high.priority = 1;
  RequestSpec high_later = MakeRequest(2);
  high_later.priority = 1;
  ASSERT_TRUE(scheduler->AddRequest(std::move(low)).ok());
  ASSERT_TRUE(scheduler->AddRequest(std::move(high)).ok());
  ASSERT_TRUE(scheduler->AddRequest(std::move(high_later)).ok());
  EXPECT_THAT(Rows(scheduler->Schedule()), ElementsAre(Row{1, 10}));
}

// vLLM's rule: under FCFS a priority would be silently meaningless, so a
// non-zero one is refused (the HTTP API answers 400); 0 is the default.
TEST(SchedulerTest, FcfsRefusesANonZeroPriority) {
  auto scheduler = MakeScheduler(VllmTestConfig(false));
  RequestSpec prioritized = MakeRequest(0);
  prioritized.priority = -1;
  const absl::Status status = scheduler->AddRequest(std::move(prioritized));
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("--scheduling-policy=priority"));
  EXPECT_EQ(scheduler->num_requests(), 0u);
  EXPECT_TRUE(scheduler->AddRequest(MakeRequest(1)).ok());
}

// FCFS preempts the most recently admitted request; it goes back to the front
// of the queue and, when resumed, recomputes its prompt and outputs.
TEST(SchedulerTest, FcfsPreemptsTheNewestAndResumesWithItsTokens) {
  EngineConfig config = VllmTestConfig(false);
  config.block_size = 4;
  config.num_kv_blocks = 6;  // 5 usable blocks of 4 tokens
  config.max_model_len = 20;
  auto scheduler = MakeScheduler(config);
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(0, 8, 10)).ok());
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(1, 8, 10)).ok());
  SchedulerOutput s1 = scheduler->Schedule();  // 2 + 2 blocks
  Update(*scheduler, s1);
  // Both decode at position 8: each needs a 3rd block; only one is free.
  SchedulerOutput s2 = scheduler->Schedule();
  EXPECT_THAT(Rows(s2), ElementsAre(Row{0, 1}));
  EXPECT_EQ(scheduler->FindRequest(1)->status, RequestStatus::kPreempted);
  EXPECT_EQ(scheduler->stats().num_preemptions, 1);
  EXPECT_THAT(s2.preempted_request_ids, ElementsAre(1));
  ExpectInvariants(*scheduler, {s2});
  for (int i = 0; i < 9; ++i) {  // request 0 runs to max_tokens
    Update(*scheduler, s2);
    s2 = scheduler->Schedule();
    if (scheduler->FindRequest(0) == nullptr) break;
  }
  // Resumed: a cached entry with every committed token, recomputed from 0.
  ASSERT_EQ(s2.cached.size(), 1u);
  EXPECT_EQ(s2.cached.request_ids[0], 1);
  EXPECT_EQ(s2.cached.resumed[0], 1);
  ASSERT_EQ(s2.cached.resumed_requests.size(), 1u);
  EXPECT_EQ(s2.cached.resumed_requests[0].token_ids.size(), 9u);  // 8 prompt + 1 output
  EXPECT_EQ(ScheduledTokens(s2, 1), 9);
}

// Priority preempts the least important request even if it was admitted
// first and already planned in this step; its budget is given back.
TEST(SchedulerTest, PriorityPreemptionRollsBackAPlannedVictim) {
  EngineConfig config = VllmTestConfig(false);
  config.policy = SchedulingPolicy::kPriority;
  config.block_size = 4;
  config.num_kv_blocks = 5;  // 4 usable blocks
  config.max_model_len = 16;
  auto scheduler = MakeScheduler(config);
  RequestSpec low = MakeRequest(0, 2, 10);  // 1 block, enough up to position 3
  low.priority = 9;
  ASSERT_TRUE(scheduler->AddRequest(std::move(low)).ok());
  SchedulerOutput s1 = scheduler->Schedule();
  Update(*scheduler, s1);
  RequestSpec high = MakeRequest(1, 12, 10);  // 3 blocks; position 12 needs a 4th
  high.priority = 0;
  ASSERT_TRUE(scheduler->AddRequest(std::move(high)).ok());
  SchedulerOutput s2 = scheduler->Schedule();  // low decodes (pos 2), high prefills 12
  EXPECT_THAT(Rows(s2), ElementsAre(Row{0, 1}, Row{1, 12}));
  EXPECT_EQ(scheduler->kv_cache().pool().num_free_blocks(), 0);
  Update(*scheduler, s2);
  // low (pos 3) fits its block and is planned; high (pos 12) then needs a
  // block: the victim is low, planned before it in this step.
  SchedulerOutput s3 = scheduler->Schedule();
  EXPECT_THAT(Rows(s3), ElementsAre(Row{1, 1}));
  EXPECT_EQ(s3.total_num_scheduled_tokens, 1);
  EXPECT_EQ(scheduler->FindRequest(0)->status, RequestStatus::kPreempted);
  ExpectInvariants(*scheduler, {s3});
}

TEST(SchedulerTest, MinTokensSuppressesEosAndStopIds) {
  auto scheduler = MakeScheduler(VllmTestConfig(false));
  RequestSpec spec = MakeRequest(0, 4, 10);
  spec.sampling.min_tokens = 2;
  spec.sampling.stop_token_ids = {7};
  ASSERT_TRUE(scheduler->AddRequest(std::move(spec)).ok());
  const std::vector<TokenId> sampled = {testing::kEos, 7, 7};
  std::vector<RequestOutput> all;
  for (TokenId token : sampled) {
    if (!scheduler->HasRequests()) break;
    SchedulerOutput step = scheduler->Schedule();
    for (RequestOutput& out : Update(*scheduler, step, [token](RequestId, size_t) { return token; })) {
      all.push_back(out);
    }
  }
  ASSERT_EQ(all.size(), 2u);  // EOS and the first 7 come before min_tokens
  EXPECT_EQ(all[1].finish_reason, FinishReason::kStop);
  EXPECT_EQ(all[1].stop_reason, 7);
  EXPECT_EQ(all[1].num_output_tokens, 2);
}

// Several tokens in one row (speculative decoding): those after the stop
// token are discarded, and so are their logprobs.
TEST(SchedulerTest, LogprobsOfTokensAfterAStopAreNotReported) {
  auto scheduler = MakeScheduler(VllmTestConfig(false));
  RequestSpec spec = MakeRequest(0, 4, 10);
  spec.sampling.stop_token_ids = {7};
  spec.sampling.logprobs = 1;
  ASSERT_TRUE(scheduler->AddRequest(std::move(spec)).ok());
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(1, 4, 10)).ok());  // no logprobs
  const SchedulerOutput step = scheduler->Schedule();
  ASSERT_EQ(step.scheduled.size(), 2u);
  ModelRunnerOutput result;
  result.step_seq = step.step_seq;
  result.AddRow(0, {5, 7, 9});
  for (auto [t, logprob] : {std::make_pair(5, -0.5f), std::make_pair(7, -0.7f), std::make_pair(9, -0.9f)}) {
    const std::vector<TokenId> top_ids = {t};
    const std::vector<float> top = {logprob};
    result.AddLogprob(logprob, top_ids, top);
  }
  result.AddRow(1, {3});
  std::vector<RequestOutput> outputs;
  scheduler->UpdateFromOutput(step, result, &outputs);
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_THAT(outputs[0].new_token_ids, ElementsAre(5, 7));
  EXPECT_EQ(outputs[0].finish_reason, FinishReason::kStop);
  ASSERT_EQ(outputs[0].logprobs.size(), 2u);
  EXPECT_EQ(outputs[0].logprobs[1].logprob, -0.7f);
  EXPECT_THAT(outputs[0].logprobs[1].top, ElementsAre(std::make_pair(TokenId{7}, -0.7f)));
  EXPECT_THAT(outputs[1].new_token_ids, ElementsAre(3));
  EXPECT_TRUE(outputs[1].logprobs.empty());
}

TEST(SchedulerTest, EosStopsUnlessIgnored) {
  for (bool ignore_eos : {false, true}) {
    auto scheduler = MakeScheduler(VllmTestConfig(false));
    RequestSpec spec = MakeRequest(0, 4, 3);
    spec.sampling.ignore_eos = ignore_eos;
    ASSERT_TRUE(scheduler->AddRequest(std::move(spec)).ok());
    RequestOutput last;
    while (scheduler->HasRequests()) {
      SchedulerOutput step = scheduler->Schedule();
      last = Update(*scheduler, step, [](RequestId, size_t) { return testing::kEos; }).back();
    }
    EXPECT_EQ(last.finish_reason, ignore_eos ? FinishReason::kLength : FinishReason::kStop);
    EXPECT_EQ(last.num_output_tokens, ignore_eos ? 3 : 1);
  }
}

TEST(SchedulerTest, MaxModelLenCapsGeneration) {
  EngineConfig config = VllmTestConfig();
  config.max_model_len = 12;
  auto scheduler = MakeScheduler(config);
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(0, 10, 100)).ok());
  std::deque<SchedulerOutput> queue;
  int32_t tokens = 0;
  FinishReason finish = FinishReason::kNone;
  queue.push_back(scheduler->Schedule());
  while (!queue.empty()) {
    for (const RequestOutput& out : Update(*scheduler, queue.front())) {
      tokens += static_cast<int32_t>(out.new_token_ids.size());
      if (out.finished()) finish = out.finish_reason;
    }
    queue.pop_front();
    SchedulerOutput next = scheduler->Schedule();
    if (!next.empty()) queue.push_back(std::move(next));
    ExpectInvariants(*scheduler, queue);
  }
  EXPECT_EQ(tokens, 2);  // positions 10 and 11
  EXPECT_EQ(finish, FinishReason::kLength);
  EXPECT_EQ(scheduler->stats().num_wasted_rows, 0);  // the length cap is known ahead, too
}

// vLLM's test_engine_core_concurrent_batches: the synchronous scheduler
// behind a batch queue of 2 (pipeline parallelism without async scheduling).
TEST(SchedulerTest, SyncSchedulerBehindABatchQueue) {
  EngineConfig config = VllmTestConfig(false);
  config.batch_queue_depth = 2;
  config.max_num_seqs = 2;
  config.max_num_batched_tokens = 10;
  auto scheduler = MakeScheduler(config);
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(0, 12, 5)).ok());
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(1, 12, 5)).ok());
  SchedulerOutput s1 = scheduler->Schedule();
  EXPECT_THAT(Rows(s1), ElementsAre(Row{0, 10}));
  SchedulerOutput s2 = scheduler->Schedule();
  EXPECT_THAT(Rows(s2), ElementsAre(Row{0, 2}, Row{1, 8}));
  EXPECT_EQ(scheduler->FindRequest(0)->num_computed_tokens, 12);
  EXPECT_EQ(scheduler->FindRequest(1)->num_computed_tokens, 8);
  Update(*scheduler, s1);
  SchedulerOutput s3 = scheduler->Schedule();
  EXPECT_THAT(Rows(s3), ElementsAre(Row{1, 4}));  // request 0 waits for its token
  Update(*scheduler, s2);
  EXPECT_EQ(scheduler->FindRequest(0)->num_tokens(), 13);
  SchedulerOutput s4 = scheduler->Schedule();
  EXPECT_THAT(Rows(s4), ElementsAre(Row{0, 1}));
  Update(*scheduler, s3);
  SchedulerOutput s5 = scheduler->Schedule();
  EXPECT_THAT(Rows(s5), ElementsAre(Row{1, 1}));
  ExpectInvariants(*scheduler, {s4, s5});
  // From here each step carries one request, alternating, one token each.
  Update(*scheduler, s4);
  SchedulerOutput s6 = scheduler->Schedule();
  EXPECT_THAT(Rows(s6), ElementsAre(Row{0, 1}));
  EXPECT_EQ(scheduler->FindRequest(0)->num_tokens(), 14);
}

// A preempted request finds its own freed blocks in the prefix cache.
TEST(SchedulerTest, ResumedRequestHitsItsOwnCachedBlocks) {
  EngineConfig config = VllmTestConfig(false);
  config.enable_prefix_caching = true;
  config.block_size = 4;
  config.num_kv_blocks = 6;
  config.max_model_len = 20;
  auto scheduler = MakeScheduler(config);
  // Request 0 needs one more block to finish: the last free one, so request
  // 1's freed blocks stay cached while it waits.
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(0, 8, 2)).ok());
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(1, 8, 10)).ok());
  SchedulerOutput step = scheduler->Schedule();
  Update(*scheduler, step);
  step = scheduler->Schedule();  // request 1 is preempted
  ASSERT_EQ(scheduler->FindRequest(1)->status, RequestStatus::kPreempted);
  while (scheduler->FindRequest(1)->status == RequestStatus::kPreempted) {
    Update(*scheduler, step);
    step = scheduler->Schedule();
  }
  // 9 tokens: the two full prompt blocks hit (8 tokens), 1 recomputed.
  for (size_t i = 0; i < step.cached.size(); ++i) {
    if (step.cached.request_ids[i] != 1) continue;
    EXPECT_EQ(step.cached.resumed[i], 1);
    EXPECT_EQ(step.cached.num_computed_tokens[i], 8);
  }
  EXPECT_EQ(ScheduledTokens(step, 1), 1);
}

}  // namespace
}  // namespace tandem::scheduler

namespace tandem::scheduler {
namespace {

TEST(SchedulerFailureTest, FailStartedRequestsKeepsOnlyThoseThatNeverRan) {
  EngineConfig config = testing::VllmTestConfig();
  config.enable_prefix_caching = true;
  config.block_size = 4;
  config.num_kv_blocks = 12;
  config.max_model_len = 40;
  config.max_num_seqs = 2;
  auto scheduler = testing::MakeScheduler(config);
  for (RequestId id = 0; id < 3; ++id) ASSERT_TRUE(scheduler->AddRequest(testing::MakeRequest(id, 8, 10)).ok());
  std::deque<SchedulerOutput> in_flight;
  in_flight.push_back(scheduler->Schedule());
  in_flight.push_back(scheduler->Schedule());  // two steps in flight, request 2 waiting (max_num_seqs)
  std::vector<RequestOutput> outputs;
  scheduler->FailStartedRequests(absl::UnavailableError("worker rank 1 disconnected"), &outputs);
  ASSERT_EQ(outputs.size(), 2u);
  for (const RequestOutput& out : outputs) {
    EXPECT_EQ(out.finish_reason, FinishReason::kError);
    EXPECT_EQ(out.error.message(), "worker rank 1 disconnected");
  }
  EXPECT_EQ(scheduler->num_requests(), 1u);
  EXPECT_EQ(scheduler->FindRequest(2)->status, RequestStatus::kWaiting);
  EXPECT_EQ(scheduler->kv_cache().pool().num_free_blocks(), 11);
  EXPECT_EQ(scheduler->kv_cache().pool().num_cached_entries(), 0u);
  EXPECT_TRUE(InvariantChecker::Check(*scheduler, {}).ok());
  // The next group serves the request that was waiting.
  SchedulerOutput next = scheduler->Schedule();
  ASSERT_EQ(next.new_requests.size(), 1u);
  EXPECT_EQ(next.new_requests[0].id, 2);
  EXPECT_TRUE(next.finished_request_ids.empty());
}

}  // namespace
}  // namespace tandem::scheduler
