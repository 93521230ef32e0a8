// Deferred block freeing (scheduler/README.md §4.6): the cases of vLLM's
// tests/v1/core/test_deferred_block_free.py that apply to tandem, where the
// gate is not a KV-connector role but the queue depth: frees are fenced
// whenever more than one step can be in flight, and immediate at depth 1.
// Prompt 33 tokens (3 blocks of 16), stop token 42, as in vLLM's tests.
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/testing/invariant_checker.h"
#include "scheduler/testing/scheduler_test_util.h"

namespace tandem::scheduler {
namespace {

using testing::MakeRequest;
using testing::ScheduledTokens;
using testing::VllmTestConfig;

constexpr TokenId kStop = 42;
constexpr int32_t kPrompt = 33;

// Drives a Scheduler directly, keeping the steps in flight in a queue and
// checking the invariants of scheduler/README.md §4 after every Schedule,
// Update and abort.
class DeferredFreeTest : public ::testing::Test {
 protected:
  void Start(const EngineConfig& config) {
    scheduler_ = testing::MakeScheduler(config);
    ASSERT_NE(scheduler_, nullptr);
    initial_free_ = FreeBlocks();
  }

  void Add(RequestId id, int32_t max_tokens = 16, int32_t prompt = kPrompt) {
    RequestSpec spec = MakeRequest(id, prompt, max_tokens);
    spec.sampling.stop_token_ids = {kStop};
    ASSERT_TRUE(scheduler_->AddRequest(std::move(spec)).ok());
  }

  // Schedules a step; a non-empty one goes in flight.
  SchedulerOutput Schedule() {
    SchedulerOutput step = scheduler_->Schedule();
    if (!step.empty()) in_flight_.push_back(step);
    Check();
    return step;
  }

  // Processes the oldest step in flight; the requests in `stop` sample 42.
  std::vector<RequestOutput> UpdateOldest(std::set<RequestId> stop = {}) {
    EXPECT_FALSE(in_flight_.empty());
    if (in_flight_.empty()) return {};
    const SchedulerOutput step = std::move(in_flight_.front());
    in_flight_.pop_front();
    auto outputs = testing::Update(*scheduler_, step, [&stop](RequestId id, size_t row) {
      return stop.count(id) ? kStop : static_cast<TokenId>(row);
    });
    Check();
    return outputs;
  }

  std::vector<RequestOutput> Abort(RequestId id) {
    std::vector<RequestOutput> outputs;
    scheduler_->AbortRequests({id}, &outputs);
    Check();
    EXPECT_EQ(outputs.size(), 1u);
    if (!outputs.empty()) {
      EXPECT_EQ(outputs[0].finish_reason, FinishReason::kAbort);
    }
    return outputs;
  }

  void Check() {
    const absl::Status status = InvariantChecker::Check(*scheduler_, in_flight_);
    EXPECT_TRUE(status.ok()) << status;
  }

  int32_t FreeBlocks() const { return scheduler_->kv_cache().pool().num_free_blocks(); }
  const std::deque<DeferredFree>& Deferred() const { return scheduler_->deferred_frees(); }

  std::unique_ptr<Scheduler> scheduler_;
  std::deque<SchedulerOutput> in_flight_;
  int32_t initial_free_ = 0;
};

// vLLM's test_gate_disabled_without_connector, our form: at depth 1 the gate
// is off and a stop frees at once.
TEST_F(DeferredFreeTest, SyncFreesImmediately) {
  const EngineConfig config = VllmTestConfig(/*async_scheduling=*/false);
  ASSERT_EQ(config.EffectiveQueueDepth(), 1);
  Start(config);
  EXPECT_FALSE(scheduler_->defers_block_free());
  Add(0);
  Schedule();
  EXPECT_EQ(FreeBlocks(), initial_free_ - 3);
  auto outputs = UpdateOldest({0});
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].finish_reason, FinishReason::kStop);
  EXPECT_EQ(outputs[0].stop_reason, kStop);
  EXPECT_TRUE(Deferred().empty());
  EXPECT_EQ(FreeBlocks(), initial_free_);
}

TEST_F(DeferredFreeTest, GateIsOnAtEveryDepthAboveOne) {
  for (int32_t depth : {2, 3, 4}) {
    EngineConfig config = VllmTestConfig();
    config.batch_queue_depth = depth;
    Start(config);
    EXPECT_TRUE(scheduler_->defers_block_free()) << "depth " << depth;
  }
  EngineConfig pipelined = VllmTestConfig();
  pipelined.pipeline_parallel_size = 2;  // derived depth 3
  Start(pipelined);
  EXPECT_TRUE(scheduler_->defers_block_free());
}

TEST_F(DeferredFreeTest, FinishDefersFreeUntilInFlightStepDone) {
  Start(VllmTestConfig());
  Add(0);
  EXPECT_EQ(ScheduledTokens(Schedule(), 0), kPrompt);
  EXPECT_EQ(ScheduledTokens(Schedule(), 0), 1);
  ASSERT_EQ(FreeBlocks(), initial_free_ - 3);

  auto outputs = UpdateOldest({0});  // stops at step 1 while step 2 is in flight
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].finish_reason, FinishReason::kStop);
  EXPECT_EQ(scheduler_->FindRequest(0), nullptr);
  ASSERT_EQ(Deferred().size(), 1u);
  EXPECT_EQ(Deferred().front().fence, 2u);
  EXPECT_EQ(Deferred().front().blocks.size(), 3u);
  EXPECT_EQ(FreeBlocks(), initial_free_ - 3);

  EXPECT_TRUE(UpdateOldest().empty());  // step 2's work for it is wasted
  EXPECT_TRUE(Deferred().empty());
  EXPECT_EQ(FreeBlocks(), initial_free_);
  EXPECT_EQ(scheduler_->stats().num_wasted_rows, 1);
}

TEST_F(DeferredFreeTest, FinishFreesImmediatelyWhenNoInFlightStep) {
  Start(VllmTestConfig());
  Add(0);
  Schedule();
  auto outputs = UpdateOldest({0});
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].finish_reason, FinishReason::kStop);
  EXPECT_TRUE(Deferred().empty());
  EXPECT_EQ(FreeBlocks(), initial_free_);
}

TEST_F(DeferredFreeTest, AbortDefersFree) {
  Start(VllmTestConfig());
  Add(0);
  Schedule();
  Schedule();
  Abort(0);
  ASSERT_EQ(Deferred().size(), 1u);
  EXPECT_EQ(Deferred().front().fence, 2u);
  EXPECT_EQ(FreeBlocks(), initial_free_ - 3);
  UpdateOldest();
  EXPECT_EQ(Deferred().size(), 1u);  // step 2 may still write them
  EXPECT_EQ(FreeBlocks(), initial_free_ - 3);
  UpdateOldest();
  EXPECT_TRUE(Deferred().empty());
  EXPECT_EQ(FreeBlocks(), initial_free_);
}

// Request 0 (47 tokens) crosses into a 4th block at its second decode; the
// pool (6 usable blocks) is full, so request 1 is preempted while steps 1
// and 2 are in flight. Depth 3 lets the third step be planned.
TEST_F(DeferredFreeTest, PreemptDefersFreeAndClearsBookkeeping) {
  EngineConfig config = VllmTestConfig();
  config.num_kv_blocks = 7;
  config.max_model_len = 96;
  config.batch_queue_depth = 3;
  Start(config);
  Add(0, 16, 47);
  Add(1);
  Schedule();
  const SchedulerOutput s2 = Schedule();
  ASSERT_EQ(s2.scheduled.size(), 2u);
  ASSERT_EQ(FreeBlocks(), 0);
  const std::vector<BlockId> victim_blocks = scheduler_->FindRequest(1)->blocks;

  const SchedulerOutput s3 = Schedule();
  EXPECT_TRUE(s3.empty());  // the victim's blocks are fenced: nobody can run
  const Request* victim = scheduler_->FindRequest(1);
  ASSERT_NE(victim, nullptr);
  EXPECT_EQ(victim->status, RequestStatus::kPreempted);
  EXPECT_TRUE(victim->blocks.empty());
  EXPECT_EQ(victim->num_stale_output_tokens, kPrompt + 1);
  EXPECT_EQ(scheduler_->stats().num_preemptions, 1);
  ASSERT_EQ(Deferred().size(), 1u);
  EXPECT_EQ(Deferred().front().fence, 2u);
  EXPECT_EQ(Deferred().front().blocks, victim_blocks);
  EXPECT_EQ(FreeBlocks(), 0);

  auto outputs = UpdateOldest();
  EXPECT_EQ(Deferred().size(), 1u);
  EXPECT_EQ(FreeBlocks(), 0);
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_TRUE(outputs[1].stale);  // sampled from a correct context: delivered

  UpdateOldest();
  EXPECT_TRUE(Deferred().empty());
  EXPECT_EQ(FreeBlocks(), 3);
  // Now request 0 gets its block; the preemption is reported with it.
  const SchedulerOutput s4 = Schedule();
  EXPECT_EQ(ScheduledTokens(s4, 0), 1);
  EXPECT_EQ(s4.preempted_request_ids, std::vector<RequestId>{1});
}

TEST_F(DeferredFreeTest, MultipleDeferredFreesDrainInOrder) {
  Start(VllmTestConfig());
  Add(0);
  Add(1);
  Schedule();
  Schedule();
  const std::vector<BlockId> blocks0 = scheduler_->FindRequest(0)->blocks;
  const std::vector<BlockId> blocks1 = scheduler_->FindRequest(1)->blocks;
  auto outputs = UpdateOldest({0, 1});
  ASSERT_EQ(outputs.size(), 2u);
  ASSERT_EQ(Deferred().size(), 2u);
  EXPECT_EQ(Deferred()[0].fence, 2u);
  EXPECT_EQ(Deferred()[0].blocks, blocks0);
  EXPECT_EQ(Deferred()[1].fence, 2u);
  EXPECT_EQ(Deferred()[1].blocks, blocks1);
  EXPECT_EQ(FreeBlocks(), initial_free_ - 6);
  UpdateOldest();
  EXPECT_TRUE(Deferred().empty());
  EXPECT_EQ(FreeBlocks(), initial_free_);
}

TEST_F(DeferredFreeTest, FenceHeldAcrossMultipleInFlightSteps) {
  EngineConfig config = VllmTestConfig();
  config.batch_queue_depth = 4;
  Start(config);
  Add(0);
  EXPECT_EQ(ScheduledTokens(Schedule(), 0), 33);
  EXPECT_EQ(ScheduledTokens(Schedule(), 0), 1);
  EXPECT_EQ(ScheduledTokens(Schedule(), 0), 1);
  EXPECT_EQ(scheduler_->sched_step_seq(), 3u);
  Abort(0);
  ASSERT_EQ(Deferred().size(), 1u);
  EXPECT_EQ(Deferred().front().fence, 3u);
  for (StepSeq processed = 1; processed <= 2; ++processed) {
    UpdateOldest();
    EXPECT_EQ(scheduler_->processed_step_seq(), processed);
    EXPECT_EQ(Deferred().size(), 1u) << "after output " << processed;
    EXPECT_EQ(FreeBlocks(), initial_free_ - 3) << "after output " << processed;
  }
  UpdateOldest();
  EXPECT_TRUE(Deferred().empty());
  EXPECT_EQ(FreeBlocks(), initial_free_);
}

// As in vLLM's Scheduler._free_request_blocks: a deferred free is fenced by
// the NEWEST scheduled step (which keeps the deque sorted), even when the
// request's own last step is older.
TEST_F(DeferredFreeTest, FenceIsTheNewestScheduledStep) {
  EngineConfig config = VllmTestConfig();
  config.batch_queue_depth = 3;
  Start(config);
  Add(0, /*max_tokens=*/2);
  Add(1);
  Schedule();
  Schedule();
  const SchedulerOutput s3 = Schedule();
  EXPECT_EQ(ScheduledTokens(s3, 0), 0);  // both of its tokens are in flight
  EXPECT_EQ(ScheduledTokens(s3, 1), 1);
  EXPECT_EQ(scheduler_->FindRequest(0)->last_sched_seq, 2u);
  Abort(0);
  ASSERT_EQ(Deferred().size(), 1u);
  EXPECT_EQ(Deferred().front().fence, 3u);
  UpdateOldest();
  UpdateOldest();
  EXPECT_EQ(Deferred().size(), 1u);
  EXPECT_EQ(FreeBlocks(), initial_free_ - 6);
  UpdateOldest();
  EXPECT_TRUE(Deferred().empty());
  EXPECT_EQ(FreeBlocks(), initial_free_ - 3);
}

// A free is deferred only while the request's own last step is in flight: a
// request the guard kept out of step 2 frees at step 1's output.
TEST_F(DeferredFreeTest, MaxTokensFinishFreesImmediatelyWithOtherInFlight) {
  Start(VllmTestConfig());
  Add(0, /*max_tokens=*/1);
  Add(1);
  Schedule();
  const SchedulerOutput s2 = Schedule();
  EXPECT_EQ(ScheduledTokens(s2, 0), 0);  // its only token is in flight
  EXPECT_EQ(ScheduledTokens(s2, 1), 1);
  auto outputs = UpdateOldest();
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_EQ(outputs[0].finish_reason, FinishReason::kLength);
  EXPECT_GT(scheduler_->sched_step_seq(), scheduler_->processed_step_seq());
  EXPECT_TRUE(Deferred().empty());
  EXPECT_EQ(FreeBlocks(), initial_free_ - 3);  // only request 1's blocks are held
}

TEST_F(DeferredFreeTest, AbortMidPrefillDefersFree) {
  EngineConfig config = VllmTestConfig();
  config.long_prefill_token_threshold = 16;
  Start(config);
  Add(0);
  EXPECT_EQ(ScheduledTokens(Schedule(), 0), 16);
  const Request* r = scheduler_->FindRequest(0);
  EXPECT_EQ(r->num_output_placeholders, 0);
  EXPECT_TRUE(r->is_prefill_chunk);
  Abort(0);
  ASSERT_EQ(Deferred().size(), 1u);
  EXPECT_EQ(Deferred().front().fence, 1u);
  EXPECT_EQ(FreeBlocks(), initial_free_ - 1);
  UpdateOldest();
  EXPECT_TRUE(Deferred().empty());
  EXPECT_EQ(FreeBlocks(), initial_free_);
}

// Synchronous scheduling with two steps allowed in flight: no placeholder
// marks the request as busy; only last_sched_seq does.
TEST_F(DeferredFreeTest, NonAsyncAbortDefersViaLastSchedSeq) {
  EngineConfig config = VllmTestConfig(/*async_scheduling=*/false);
  config.batch_queue_depth = 2;
  Start(config);
  EXPECT_TRUE(scheduler_->defers_block_free());
  Add(0);
  Schedule();
  const Request* r = scheduler_->FindRequest(0);
  EXPECT_EQ(r->num_output_placeholders, 0);
  EXPECT_EQ(r->num_in_flight_tokens, kPrompt);
  EXPECT_EQ(r->last_sched_seq, 1u);
  Abort(0);
  ASSERT_EQ(Deferred().size(), 1u);
  EXPECT_EQ(FreeBlocks(), initial_free_ - 3);
  UpdateOldest();
  EXPECT_TRUE(Deferred().empty());
  EXPECT_EQ(FreeBlocks(), initial_free_);
}

// scheduler/README.md §4.6 / vLLM issue 49674: a victim whose free is
// deferred frees nothing now, so preempting again would only empty the
// batch. 6 usable
// blocks: request 0 (80 tokens, chunks of 32) holds 2, requests 1-3 (10
// tokens) one each, 1 block is free; request 0's next chunk needs 2.
TEST_F(DeferredFreeTest, NoPreemptionCascadeOnDeferredVictim) {
  EngineConfig config = VllmTestConfig();
  config.num_kv_blocks = 7;
  config.max_model_len = 96;
  config.long_prefill_token_threshold = 32;
  Start(config);
  Add(0, 16, 80);
  for (RequestId id = 1; id <= 3; ++id) Add(id, 16, 10);
  const SchedulerOutput s1 = Schedule();
  ASSERT_EQ(s1.scheduled.size(), 4u);
  ASSERT_EQ(FreeBlocks(), 1);
  // Fits in the one free block: only the no-admission rule keeps it out.
  Add(4, 16, 10);

  const SchedulerOutput s2 = Schedule();
  EXPECT_EQ(scheduler_->stats().num_preemptions, 1);
  EXPECT_EQ(scheduler_->FindRequest(3)->status, RequestStatus::kPreempted);
  for (RequestId id : {0, 1, 2}) {
    EXPECT_EQ(scheduler_->FindRequest(id)->status, RequestStatus::kRunning) << "request " << id;
  }
  EXPECT_TRUE(s2.new_requests.empty());
  EXPECT_EQ(ScheduledTokens(s2, 4), 0);
  EXPECT_EQ(scheduler_->FindRequest(4)->status, RequestStatus::kWaiting);
  ASSERT_EQ(Deferred().size(), 1u);
  EXPECT_EQ(FreeBlocks(), 1);

  // And the run still completes, every request with its 16 tokens.
  std::vector<int32_t> tokens(5, 0);
  std::vector<FinishReason> finish(5, FinishReason::kNone);
  int iterations = 0;
  for (; iterations < 500 && (scheduler_->HasRequests() || !in_flight_.empty()); ++iterations) {
    if (in_flight_.size() < 2 && !Schedule().empty()) continue;
    if (in_flight_.empty()) {
      ADD_FAILURE() << "stalled with " << scheduler_->num_requests() << " requests";
      break;
    }
    for (const RequestOutput& out : UpdateOldest()) {
      tokens[out.id] += static_cast<int32_t>(out.new_token_ids.size());
      if (out.finished()) finish[out.id] = out.finish_reason;
    }
  }
  EXPECT_LT(iterations, 500);
  for (RequestId id = 0; id < 5; ++id) {
    EXPECT_EQ(tokens[id], 16) << "request " << id;
    EXPECT_EQ(finish[id], FinishReason::kLength) << "request " << id;
  }
  EXPECT_TRUE(Deferred().empty());
  EXPECT_EQ(FreeBlocks(), initial_free_);
}

// Issue 11, defect 3: a request that cannot get a block while fenced blocks
// are on their way back is skipped alone; the requests after it that need no
// new block still run. Blocks of 4, 3 usable: requests 0 (4 tokens), 1 (2)
// and 2 (4) take one each; 2 is aborted, so its block is fenced by step 1.
// Step 2: request 0's first decode needs a second block, request 1's fits.
TEST_F(DeferredFreeTest, ARequestWaitingForFencedBlocksSkipsOnlyItself) {
  EngineConfig config = VllmTestConfig();
  config.block_size = 4;
  config.num_kv_blocks = 4;
  config.max_model_len = 12;
  Start(config);
  Add(0, 8, 4);
  Add(1, 8, 2);
  Add(2, 8, 4);
  Schedule();
  ASSERT_EQ(FreeBlocks(), 0);
  Abort(2);
  ASSERT_EQ(Deferred().size(), 1u);

  const SchedulerOutput s2 = Schedule();
  EXPECT_EQ(ScheduledTokens(s2, 0), 0);  // waits for the fenced block
  EXPECT_EQ(ScheduledTokens(s2, 1), 1);  // needs none: not held up
  EXPECT_EQ(scheduler_->stats().num_preemptions, 0);

  UpdateOldest();  // step 1 done: the fenced block comes back
  EXPECT_EQ(FreeBlocks(), 1);
  const SchedulerOutput s3 = Schedule();
  EXPECT_EQ(ScheduledTokens(s3, 0), 1);
  EXPECT_EQ(FreeBlocks(), 0);
}

// ...but a request later in admission order must not take a block that the
// skipped one needed: FCFS preempts the newest admission, so the running
// order is the order of claims on the pool. Blocks of 4, 6 usable: request 0
// (16 tokens, chunks of 8) holds 2, requests 1 (4 tokens), 2 (2) and 3 (4)
// one each; 3 is aborted (fenced). Step 2: request 0's next chunk needs 2
// blocks and 1 is free; request 1's first decode needs 1, request 2's none.
TEST_F(DeferredFreeTest, LaterRequestsTakeNoBlockThatASkippedOneNeeded) {
  EngineConfig config = VllmTestConfig();
  config.block_size = 4;
  config.num_kv_blocks = 7;
  config.max_model_len = 24;
  config.long_prefill_token_threshold = 8;
  Start(config);
  Add(0, 8, 16);
  Add(1, 8, 4);
  Add(2, 8, 2);
  Add(3, 8, 4);
  Schedule();
  ASSERT_EQ(FreeBlocks(), 1);
  Abort(3);

  const SchedulerOutput s2 = Schedule();
  EXPECT_EQ(ScheduledTokens(s2, 0), 0);
  EXPECT_EQ(ScheduledTokens(s2, 1), 0);  // the free block is request 0's claim
  EXPECT_EQ(ScheduledTokens(s2, 2), 1);
  EXPECT_EQ(FreeBlocks(), 1);

  UpdateOldest();
  const SchedulerOutput s3 = Schedule();
  EXPECT_EQ(ScheduledTokens(s3, 0), 8);  // both blocks, first in line
}

}  // namespace
}  // namespace tandem::scheduler
