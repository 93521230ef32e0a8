// Acceptance cases of vLLM's tests/v1/core/test_async_scheduler.py and the
// async cases of its test_swa_inflight_window_free.py and test_scheduler.py,
// with their numbers, plus our exact max_tokens guard
// (scheduler/README.md §4.4).
#include <deque>
#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/testing/invariant_checker.h"
#include "scheduler/testing/scheduler_test_util.h"

namespace tandem::scheduler {
namespace {

using testing::Arrival;
using testing::MakeRequest;
using testing::MakeScheduler;
using testing::ScheduledTokens;
using testing::Update;
using testing::VllmTestConfig;

// Drains `queue` the way vLLM's tests do: process the oldest step, schedule
// the next, queue it if it scheduled anything. Returns outputs per request.
std::map<RequestId, std::vector<RequestOutput>> Drain(Scheduler& scheduler, std::deque<SchedulerOutput>& queue,
                                                      int64_t* total_scheduled = nullptr) {
  std::map<RequestId, std::vector<RequestOutput>> outputs;
  while (!queue.empty()) {
    if (total_scheduled) *total_scheduled += queue.front().total_num_scheduled_tokens;
    for (RequestOutput& out : Update(scheduler, queue.front())) outputs[out.id].push_back(out);
    queue.pop_front();
    SchedulerOutput next = scheduler.Schedule();
    if (!next.empty()) queue.push_back(std::move(next));
  }
  return outputs;
}

int32_t CountTokens(const std::vector<RequestOutput>& outputs) {
  int32_t n = 0;
  for (const RequestOutput& out : outputs) n += static_cast<int32_t>(out.new_token_ids.size());
  return n;
}

class StopByMaxTokensTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(StopByMaxTokensTest, SchedulesExactlyWhatSyncWould) {
  const int32_t max_tokens = GetParam();
  auto scheduler = MakeScheduler(VllmTestConfig());
  std::deque<SchedulerOutput> queue;
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(0, 10, max_tokens)).ok());
  queue.push_back(scheduler->Schedule());
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(1, 10, max_tokens)).ok());
  queue.push_back(scheduler->Schedule());
  int64_t total = 0;
  auto outputs = Drain(*scheduler, queue, &total);
  EXPECT_FALSE(scheduler->HasRequests());
  EXPECT_EQ(CountTokens(outputs[0]), max_tokens);
  EXPECT_EQ(CountTokens(outputs[1]), max_tokens);
  EXPECT_EQ(outputs[0].back().finish_reason, FinishReason::kLength);
  EXPECT_EQ(total, 2 * (10 + max_tokens - 1));
  EXPECT_EQ(scheduler->stats().num_wasted_rows, 0);
}

// 20, 22, 24, 28 tokens in total (vLLM's test_stop_by_max_tokens).
INSTANTIATE_TEST_SUITE_P(MaxTokens, StopByMaxTokensTest, ::testing::Values(1, 2, 3, 5));

void RunAbortOrder() {
  auto scheduler = MakeScheduler(VllmTestConfig());
  for (RequestId id = 0; id < 10; ++id) ASSERT_TRUE(scheduler->AddRequest(MakeRequest(id, 10, 20)).ok());
  std::deque<SchedulerOutput> queue;
  queue.push_back(scheduler->Schedule());
  queue.push_back(scheduler->Schedule());
  const std::vector<RequestId> order = {0, 8, 3, 1, 6, 4, 2, 5, 7, 9};
  std::map<RequestId, int32_t> tokens;
  std::map<RequestId, FinishReason> finish;
  size_t next_abort = 0;
  while (!queue.empty()) {
    std::vector<RequestOutput> outputs;
    if (next_abort < order.size()) scheduler->AbortRequests({order[next_abort++]}, &outputs);
    scheduler->UpdateFromOutput(queue.front(), testing::FakeOutput(queue.front()), &outputs);
    queue.pop_front();
    for (const RequestOutput& out : outputs) {
      tokens[out.id] += static_cast<int32_t>(out.new_token_ids.size());
      if (out.finished()) finish[out.id] = out.finish_reason;
    }
    SchedulerOutput next = scheduler->Schedule();
    if (!next.empty()) queue.push_back(std::move(next));
  }
  EXPECT_FALSE(scheduler->HasRequests());
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(finish[order[i]], FinishReason::kAbort) << "request " << order[i];
    EXPECT_EQ(tokens[order[i]], static_cast<int32_t>(i)) << "request " << order[i];
  }
  EXPECT_EQ(scheduler->kv_cache().pool().num_free_blocks(), 10000 - 1);
}

// vLLM's test_abort (test_preempt has the same body).
TEST(AsyncSchedulerTest, AbortOrder) { RunAbortOrder(); }

TEST(AsyncSchedulerTest, PrefixCachingDeduplicatesPrefillsInTheSameStep) {
  EngineConfig config = VllmTestConfig();
  config.max_num_batched_tokens = 1000;
  config.max_model_len = 1000;
  config.enable_prefix_caching = true;
  auto scheduler = MakeScheduler(config);
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(0, 100, 3, /*same_prompt=*/true)).ok());
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(1, 100, 3, true)).ok());
  std::deque<SchedulerOutput> queue;
  queue.push_back(scheduler->Schedule());
  ASSERT_EQ(queue.front().scheduled.size(), 2u);
  EXPECT_EQ(ScheduledTokens(queue.front(), 0), 100);
  EXPECT_EQ(ScheduledTokens(queue.front(), 1), 100 % 16);  // 96 tokens hit blocks registered this step
  ASSERT_EQ(queue.front().new_requests.size(), 2u);
  EXPECT_EQ(queue.front().new_requests[1].num_computed_tokens, 96);
  queue.push_back(scheduler->Schedule());
  RequestId next_id = 2;
  while (!queue.empty()) {
    if (next_id < 5) {
      ASSERT_TRUE(scheduler->AddRequest(MakeRequest(next_id++, 100, 3, true)).ok());
    }
    Update(*scheduler, queue.front());
    queue.pop_front();
    SchedulerOutput next = scheduler->Schedule();
    for (const NewRequestData& data : next.new_requests) {
      EXPECT_EQ(data.num_computed_tokens, 96) << "request " << data.id;
      EXPECT_EQ(ScheduledTokens(next, data.id), 4) << "request " << data.id;
    }
    if (!next.empty()) queue.push_back(std::move(next));
  }
  EXPECT_EQ(next_id, 5);
  EXPECT_FALSE(scheduler->HasRequests());
  EXPECT_EQ(scheduler->kv_cache().prefix_cache_stats().hits, 4 * 96);
}

TEST(AsyncSchedulerTest, PrefixCachingForMultiTurnCachesOutputBlocks) {
  EngineConfig config = VllmTestConfig();
  config.max_num_batched_tokens = 1000;
  config.max_model_len = 1000;
  config.enable_prefix_caching = true;
  auto scheduler = MakeScheduler(config);
  for (RequestId id = 0; id < 5; ++id) ASSERT_TRUE(scheduler->AddRequest(MakeRequest(id, 100, 200)).ok());
  std::deque<SchedulerOutput> queue;
  queue.push_back(scheduler->Schedule());
  queue.push_back(scheduler->Schedule());
  auto outputs = Drain(*scheduler, queue);
  ASSERT_FALSE(scheduler->HasRequests());
  for (RequestId id = 0; id < 5; ++id) {
    RequestSpec next = MakeRequest(id, 100, 200);  // the first turn's prompt...
    next.id = 100 + id;
    for (const RequestOutput& out : outputs[id]) {
      // ...plus its answer
      next.prompt_token_ids.insert(next.prompt_token_ids.end(), out.new_token_ids.begin(), out.new_token_ids.end());
    }
    ASSERT_EQ(next.prompt_token_ids.size(), 300u);
    ASSERT_TRUE(scheduler->AddRequest(std::move(next)).ok());
  }
  SchedulerOutput step = scheduler->Schedule();
  ASSERT_EQ(step.new_requests.size(), 5u);
  for (const NewRequestData& data : step.new_requests) {
    EXPECT_EQ(data.num_computed_tokens, 288) << "request " << data.id;
    EXPECT_EQ(ScheduledTokens(step, data.id), 300 % 16) << "request " << data.id;
  }
}

// A grammar that rejects one token id.
class RejectingGrammar : public Grammar {
 public:
  explicit RejectingGrammar(TokenId rejected) : rejected_(rejected) {}
  bool AcceptTokens(absl::Span<const TokenId> tokens) override {
    for (TokenId t : tokens) {
      if (t == rejected_) return false;
    }
    return true;
  }
  void FillBitmask(absl::Span<uint32_t> row, int32_t vocab_size) const override {
    for (auto& word : row) word = ~0u;
  }

 private:
  TokenId rejected_;
};

TEST(AsyncSchedulerTest, GrammarRejectionFinishesWithError) {
  EngineConfig config = VllmTestConfig();
  config.vocab_size = 1000;
  auto scheduler = MakeScheduler(config);
  RequestSpec spec = MakeRequest(0);
  spec.grammar = std::make_unique<RejectingGrammar>(123);
  ASSERT_TRUE(scheduler->AddRequest(std::move(spec)).ok());
  SchedulerOutput step = scheduler->Schedule();
  EXPECT_TRUE(step.has_structured_output_requests);
  EXPECT_EQ(scheduler->FindRequest(0)->num_output_placeholders, 1);
  auto outputs = Update(*scheduler, step, [](RequestId, size_t) { return 123; });
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].finish_reason, FinishReason::kError);
  EXPECT_THAT(outputs[0].error.message(), ::testing::HasSubstr("not allowed by the request's grammar"));
  EXPECT_EQ(scheduler->FindRequest(0), nullptr);
  EXPECT_TRUE(scheduler->running().empty());
}

TEST(AsyncSchedulerTest, InFlightTokenAccounting) {
  auto scheduler = MakeScheduler(VllmTestConfig());
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(0, 100, 16)).ok());
  SchedulerOutput s1 = scheduler->Schedule();
  EXPECT_EQ(scheduler->FindRequest(0)->num_in_flight_tokens, 100);
  SchedulerOutput s2 = scheduler->Schedule();
  EXPECT_EQ(scheduler->FindRequest(0)->num_in_flight_tokens, 101);
  EXPECT_EQ(scheduler->FindRequest(0)->num_output_placeholders, 2);
  Update(*scheduler, s1);
  EXPECT_EQ(scheduler->FindRequest(0)->num_in_flight_tokens, 1);
  Update(*scheduler, s2);
  EXPECT_EQ(scheduler->FindRequest(0)->num_in_flight_tokens, 0);
  EXPECT_EQ(scheduler->FindRequest(0)->num_output_placeholders, 0);
  EXPECT_EQ(scheduler->FindRequest(0)->num_output_tokens(), 2);
}

TEST(AsyncSchedulerTest, OutputPlaceholdersAllowReschedulingBeforeAnyOutput) {
  EngineConfig config = VllmTestConfig();
  config.batch_queue_depth = 3;  // two steps may be planned ahead
  auto scheduler = MakeScheduler(config);
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(0)).ok());
  SchedulerOutput s1 = scheduler->Schedule();
  EXPECT_GT(scheduler->FindRequest(0)->num_output_placeholders, 0);
  SchedulerOutput s2 = scheduler->Schedule();
  EXPECT_EQ(ScheduledTokens(s2, 0), 1);
  EXPECT_EQ(scheduler->FindRequest(0)->num_output_placeholders, 2);
}

TEST(AsyncSchedulerTest, PipelineCadenceDelaysTheNextDecode) {
  EngineConfig config = VllmTestConfig();
  config.pipeline_parallel_size = 2;  // queue depth 3, cadence 2
  auto scheduler = MakeScheduler(config);
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(0)).ok());
  SchedulerOutput s1 = scheduler->Schedule();
  EXPECT_EQ(ScheduledTokens(s1, 0), 10);
  EXPECT_TRUE(scheduler->Schedule().empty());  // its token is still travelling the ring
  SchedulerOutput s3 = scheduler->Schedule();
  EXPECT_EQ(ScheduledTokens(s3, 0), 1);
  EXPECT_EQ(scheduler->FindRequest(0)->num_output_placeholders, 2);
}

// Ours, not vLLM's (scheduler/README.md §7): eight requests admitted in one
// step all become eligible in the same phase; a step takes at most half of
// the running requests (cadence 2), so the next step gets the rest and both
// stages stay busy, instead of a step of eight and an empty one forever.
TEST(AsyncSchedulerTest, PipelinePhasesSplitABurstAdmittedTogether) {
  EngineConfig config = VllmTestConfig();
  config.pipeline_parallel_size = 2;
  auto scheduler = MakeScheduler(config);
  for (RequestId id = 0; id < 8; ++id) ASSERT_TRUE(scheduler->AddRequest(MakeRequest(id)).ok());
  SchedulerOutput s1 = scheduler->Schedule();
  ASSERT_EQ(s1.scheduled.size(), 8u);
  EXPECT_TRUE(scheduler->Schedule().empty());  // every token still travels the ring
  Update(*scheduler, s1);
  std::deque<SchedulerOutput> queue;
  std::map<RequestId, int> decodes;
  for (int k = 0; k < 6; ++k) {
    SchedulerOutput step = scheduler->Schedule();
    EXPECT_EQ(step.scheduled.size(), 4u) << "step " << k;
    for (const auto& row : step.scheduled) {
      EXPECT_EQ(row.num_tokens, 1);
      ++decodes[row.id];
    }
    queue.push_back(std::move(step));
    if (queue.size() == 2) {  // the oldest comes back once two are in flight
      Update(*scheduler, queue.front());
      queue.pop_front();
    }
  }
  ASSERT_EQ(decodes.size(), 8u);
  for (const auto& [id, n] : decodes) EXPECT_EQ(n, 3) << "request " << id;
}

// The handoff case of test_kv_pressure_preempt_mid_handoff, in deliver mode
// (no KV connector). Ours differs in one deliberate way: the victim's blocks
// are fenced (a step in flight still writes them), so the decoder is not
// scheduled in the step that preempted; it gets its block one step later.
TEST(AsyncSchedulerTest, KvPressurePreemptionDeliversStaleOutput) {
  EngineConfig config = VllmTestConfig();
  config.num_kv_blocks = 5;
  config.max_model_len = 64;
  auto scheduler = MakeScheduler(config);
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(0, 32, 8)).ok());  // decoder
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(1, 32, 1)).ok());  // handoff
  SchedulerOutput s1 = scheduler->Schedule();
  ASSERT_EQ(s1.scheduled.size(), 2u);
  EXPECT_EQ(scheduler->kv_cache().pool().num_free_blocks(), 0);
  EXPECT_EQ(scheduler->FindRequest(1)->status, RequestStatus::kRunning);
  EXPECT_EQ(scheduler->FindRequest(1)->num_output_placeholders, 1);

  SchedulerOutput s2 = scheduler->Schedule();
  const Request* handoff = scheduler->FindRequest(1);
  EXPECT_EQ(handoff->status, RequestStatus::kPreempted);
  EXPECT_EQ(handoff->num_stale_output_tokens, 32);
  EXPECT_EQ(handoff->num_output_placeholders, 0);
  EXPECT_TRUE(handoff->blocks.empty());
  EXPECT_EQ(scheduler->deferred_frees().size(), 1u);
  EXPECT_TRUE(s2.empty());  // nothing could run: the freed blocks are fenced

  auto outputs = Update(*scheduler, s1);
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_TRUE(outputs[1].stale);
  EXPECT_EQ(outputs[1].finish_reason, FinishReason::kLength);  // finished while preempted
  EXPECT_EQ(scheduler->FindRequest(1), nullptr);
  EXPECT_EQ(scheduler->num_waiting(), 0u);
  EXPECT_EQ(scheduler->kv_cache().pool().num_free_blocks(), 2);  // the fence has passed

  SchedulerOutput s3 = scheduler->Schedule();
  EXPECT_EQ(ScheduledTokens(s3, 0), 1);
  EXPECT_EQ(s3.preempted_request_ids, std::vector<RequestId>{1});
}

// test_kv_pressure_preemption_with_inflight_output, num_spec 0: PP 3 with
// queue depth 4, 4 usable blocks of 16, 8 requests of 8 tokens, 24 outputs
// each, one arrival per engine iteration.
TEST(AsyncSchedulerTest, KvPressurePreemptionWithInFlightOutputIsLossless) {
  EngineConfig config = VllmTestConfig();
  config.pipeline_parallel_size = 3;
  config.num_kv_blocks = 5;
  config.max_num_batched_tokens = 512;
  config.max_model_len = 64;
  std::vector<Arrival> arrivals;
  for (RequestId id = 0; id < 8; ++id) {
    RequestSpec spec = MakeRequest(id, 8, 24);
    spec.sampling.ignore_eos = true;
    arrivals.push_back({id, std::move(spec)});
  }
  std::vector<SampleRecord> samples;
  FakeExecutorOptions options;
  options.sample_log = &samples;
  testing::WorkloadRun run = testing::RunWorkload(config, std::move(arrivals), options);
  EXPECT_GT(run.stats.num_preemptions, 0);
  EXPECT_GT(run.stats.num_stale_tokens_delivered, 0);  // a victim had output in flight
  std::map<std::pair<RequestId, int32_t>, std::vector<TokenId>> sampled;  // (id, position) -> tokens
  for (const SampleRecord& s : samples) sampled[{s.id, s.position}].push_back(s.token);
  for (RequestId id = 0; id < 8; ++id) {
    const testing::RequestResult& result = run.results[id];
    ASSERT_EQ(result.tokens.size(), 24u) << "request " << id;
    EXPECT_EQ(result.finish, FinishReason::kLength);
    for (int32_t i = 0; i < 24; ++i) {
      // The i-th delivered token was sampled once, for position P + i.
      const auto& at = sampled[{id, 8 + i}];
      ASSERT_EQ(at.size(), 1u) << "request " << id << " position " << 8 + i;
      EXPECT_EQ(at[0], result.tokens[i]);
    }
  }
  EXPECT_EQ(run.free_blocks_at_end, run.usable_blocks);
}

// scheduler/README.md §4.4: no wasted step for a length-capped request at any
// depth.
class QueueDepthTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(QueueDepthTest, LengthCappedRequestWastesNothing) {
  EngineConfig config = VllmTestConfig();
  config.batch_queue_depth = GetParam();
  for (int32_t max_tokens : {1, 2, 3, 7}) {
    std::vector<Arrival> arrivals;
    arrivals.push_back({0, MakeRequest(0, 6, max_tokens)});
    testing::WorkloadRun run = testing::RunWorkload(config, std::move(arrivals), {});
    EXPECT_EQ(run.results[0].tokens.size(), static_cast<size_t>(max_tokens));
    EXPECT_EQ(run.results[0].finish, FinishReason::kLength);
    EXPECT_EQ(run.stats.num_wasted_rows, 0) << "depth " << GetParam() << " max_tokens " << max_tokens;
    EXPECT_EQ(run.stats.num_scheduled_tokens, 6 + max_tokens - 1);
  }
}

TEST_P(QueueDepthTest, StopTokenWastesDepthMinusOneSteps) {
  const int32_t depth = GetParam();
  EngineConfig config = VllmTestConfig();
  config.batch_queue_depth = depth;
  std::vector<Arrival> arrivals;
  arrivals.push_back({0, MakeRequest(0, 6, 20)});
  FakeExecutorOptions options;
  options.force_token = [](RequestId, int32_t index) -> std::optional<TokenId> {
    if (index == 3) return testing::kEos;
    return std::nullopt;
  };
  testing::WorkloadRun run = testing::RunWorkload(config, std::move(arrivals), options);
  EXPECT_EQ(run.results[0].tokens.size(), 3u);
  EXPECT_EQ(run.results[0].finish, FinishReason::kStop);
  EXPECT_EQ(run.stats.num_wasted_rows, depth - 1);
}

INSTANTIATE_TEST_SUITE_P(Depths, QueueDepthTest, ::testing::Values(2, 3, 4));

}  // namespace
}  // namespace tandem::scheduler
