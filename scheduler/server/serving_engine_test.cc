// ServingEngine on its own thread over an in-memory worker group (a
// FakeExecutor that a failure replaces with a fresh one, as workers
// re-allocate their KV cache when the group re-forms). Tests wait for
// states the engine publishes, never for time; the queue timeout runs on a
// fake clock.
#include "scheduler/server/serving_engine.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/testing/fake_executor.h"

namespace tandem::scheduler {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kBlocks = 64;
constexpr int32_t kBlockSize = 16;
constexpr int32_t kVocab = 1000;

// An ExecutorGroup in memory. ready() and failure() are set by the test;
// the rest runs on the engine thread. Reset forms the group again at once
// with a fresh executor: the old "KV" is gone, as on real workers.
class FakeGroup : public ExecutorGroup {
 public:
  explicit FakeGroup(bool ready = true) : ready_(ready) { executor_ = NewExecutor(); }

  void SetReady(bool ready) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ready_ = ready;
  }
  // A worker lost between steps: reported until the engine resets.
  void Break(absl::Status why) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    failure_ = std::move(why);
  }
  int formations() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return formations_;
  }

  bool ready() const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return ready_ && failure_.ok();
  }
  absl::Status failure() const override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return failure_;
  }
  int32_t pool_blocks() const override { return kBlocks; }
  void Reset() override ABSL_LOCKS_EXCLUDED(mu_) {
    executor_ = NewExecutor();
    absl::MutexLock lock(&mu_);
    failure_ = absl::OkStatus();
    ++formations_;
  }
  absl::Status Execute(const SchedulerOutput& step) override { return executor_->Execute(step); }
  absl::Status Sample(StepSeq step_seq, const GrammarOutput* grammar) override {
    return executor_->Sample(step_seq, grammar);
  }
  absl::StatusOr<ModelRunnerOutput> CollectOutput(StepSeq step_seq) override {
    return executor_->CollectOutput(step_seq);
  }

 private:
  static std::unique_ptr<FakeExecutor> NewExecutor() {
    FakeExecutorOptions options;
    options.num_blocks = kBlocks;
    options.block_size = kBlockSize;
    options.vocab_size = kVocab;
    return std::make_unique<FakeExecutor>(options);
  }

  mutable absl::Mutex mu_;
  bool ready_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  int formations_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<FakeExecutor> executor_;  // engine thread
};

// What one request received. `on_output` runs on the engine thread, before
// the output is recorded.
class RecordingSink : public RequestSink {
 public:
  std::function<void(const RequestOutput&)> on_output;

  void OnOutput(const RequestOutput& output) override ABSL_LOCKS_EXCLUDED(mu_) {
    if (on_output) on_output(output);
    absl::MutexLock lock(&mu_);
    tokens_.insert(tokens_.end(), output.new_token_ids.begin(), output.new_token_ids.end());
    if (output.finished()) {
      finish_ = output.finish_reason;
      error_ = output.error;
    }
  }
  // Waits (10 s at most) for the request's end.
  std::optional<FinishReason> WaitFinish() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finish_.has_value(); };
    mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10));
    return finish_;
  }
  bool finished() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return finish_.has_value();
  }
  std::vector<TokenId> tokens() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return tokens_;
  }
  absl::Status error() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  absl::Mutex mu_;
  std::vector<TokenId> tokens_ ABSL_GUARDED_BY(mu_);
  std::optional<FinishReason> finish_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

EngineConfig TestConfig() {
  EngineConfig config;
  config.block_size = kBlockSize;
  config.max_model_len = 0;  // what the pool holds
  config.vocab_size = kVocab;
  config.enable_prefix_caching = true;
  return config;
}

RequestSpec Greedy(std::vector<TokenId> prompt, int32_t max_tokens) {
  RequestSpec spec;
  spec.prompt_token_ids = std::move(prompt);
  spec.sampling.temperature = 0;
  spec.sampling.ignore_eos = true;
  spec.sampling.max_tokens = max_tokens;
  return spec;
}

std::vector<TokenId> Prompt(int32_t length, TokenId first) {
  std::vector<TokenId> prompt;
  for (int32_t i = 0; i < length; ++i) prompt.push_back((first + i * 7) % kVocab);
  return prompt;
}

// Polls the engine's published state (20 s at most).
bool WaitFor(const ServingEngine& engine, const std::function<bool(const ServingSnapshot&)>& state) {
  for (int i = 0; i < 20000; ++i) {
    if (state(engine.Snapshot())) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return false;
}

bool Idle(const ServingSnapshot& s) {
  return s.executor_ready && s.num_running == 0 && s.num_waiting == 0 && s.num_steps_in_flight == 0;
}

// Defect 2 of issue 11. An abort by a client's name is resolved when it is
// made. W, X and Y run in lockstep (same prompt length, one token a step);
// in the step where X finishes, W's sink aborts "X" (still X's name), and
// Y's sink, after X's end, reuses the name for a new request. Resolved
// later, on the engine thread, the abort would kill the new request.
TEST(ServingEngineTest, AnAbortByNameNeverReachesALaterRequestReusingTheName) {
  FakeGroup group;
  ServingEngine engine(TestConfig(), &group);
  constexpr int32_t kXTokens = 3;
  auto w = std::make_shared<RecordingSink>();
  auto x = std::make_shared<RecordingSink>();
  auto y = std::make_shared<RecordingSink>();
  auto reused = std::make_shared<RecordingSink>();
  std::atomic<int> w_outputs{0}, y_outputs{0};
  std::atomic<bool> abort_made{false}, reuse_submitted{false}, x_done_before_y{false};
  w->on_output = [&](const RequestOutput& out) {
    if (!out.new_token_ids.empty() && ++w_outputs == kXTokens) abort_made = engine.AbortByName("X");
  };
  y->on_output = [&](const RequestOutput& out) {
    if (out.new_token_ids.empty() || ++y_outputs != kXTokens) return;
    x_done_before_y = x->finished();
    engine.Submit("X", Greedy(Prompt(5, 500), 6), reused);
    reuse_submitted = true;
  };
  // Submitted before Start: admitted together, scheduled in this order.
  engine.Submit("W", Greedy(Prompt(5, 100), 8), w);
  engine.Submit("X", Greedy(Prompt(5, 200), kXTokens), x);
  engine.Submit("Y", Greedy(Prompt(5, 300), 8), y);
  engine.Start();

  ASSERT_EQ(x->WaitFinish(), FinishReason::kLength);
  ASSERT_EQ(y->WaitFinish(), FinishReason::kLength);
  ASSERT_TRUE(abort_made) << "W's sink must abort X while X is live";
  ASSERT_TRUE(x_done_before_y) << "X must end between W's and Y's outputs of that step";
  ASSERT_TRUE(reuse_submitted);
  EXPECT_EQ(reused->WaitFinish(), FinishReason::kLength) << reused->error();
  EXPECT_EQ(reused->tokens().size(), 6u);
  EXPECT_EQ(x->tokens().size(), static_cast<size_t>(kXTokens));
}

// Every output reaches its own request's sink while the rows shift under
// the engine's memory of the last step's sinks by position: requests end at
// different steps (each end moves the rows after it up) and one joins.
TEST(ServingEngineTest, EachOutputReachesItsRequestsSinkAsRowsShift) {
  FakeGroup group;
  ServingEngine engine(TestConfig(), &group);
  const std::vector<size_t> lengths = {2, 7, 4, 9, 3};
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (size_t i = 0; i < lengths.size(); ++i) {
    sinks.push_back(std::make_shared<RecordingSink>());
    engine.Submit("", Greedy(Prompt(5, 100 * static_cast<TokenId>(i + 1)), static_cast<int32_t>(lengths[i])),
                  sinks.back());
  }
  auto late = std::make_shared<RecordingSink>();
  sinks[0]->on_output = [&](const RequestOutput& out) {
    if (out.finished()) engine.Submit("", Greedy(Prompt(5, 900), 5), late);
  };
  engine.Start();
  for (size_t i = 0; i < lengths.size(); ++i) {
    ASSERT_EQ(sinks[i]->WaitFinish(), FinishReason::kLength) << i;
    EXPECT_EQ(sinks[i]->tokens().size(), lengths[i]) << i;
  }
  ASSERT_EQ(late->WaitFinish(), FinishReason::kLength);
  EXPECT_EQ(late->tokens().size(), 5u);
}

// A stream's late cancel names its own request by the id Submit returned:
// it finds nothing once that request ended, and the name's new owner runs.
TEST(ServingEngineTest, ALateCancelByIdLeavesTheNewOwnerOfTheNameAlone) {
  FakeGroup group;
  ServingEngine engine(TestConfig(), &group);
  engine.Start();
  auto first = std::make_shared<RecordingSink>();
  const RequestId first_id = engine.Submit("X", Greedy(Prompt(5, 100), 2), first);
  ASSERT_EQ(first->WaitFinish(), FinishReason::kLength);
  auto second = std::make_shared<RecordingSink>();
  second->on_output = [&](const RequestOutput& out) {
    // The late cancel of the first stream, while the second one runs.
    if (!out.new_token_ids.empty()) {
      EXPECT_FALSE(engine.Abort(first_id));
    }
  };
  const RequestId second_id = engine.Submit("X", Greedy(Prompt(5, 200), 5), second);
  EXPECT_NE(second_id, first_id);
  EXPECT_EQ(second->WaitFinish(), FinishReason::kLength);
  EXPECT_EQ(second->tokens().size(), 5u);
  // An abort of a live request by its id still works.
  auto third = std::make_shared<RecordingSink>();
  third->on_output = [&](const RequestOutput& out) {
    if (!out.new_token_ids.empty() && !out.finished()) engine.Abort(out.id);
  };
  engine.Submit("X", Greedy(Prompt(5, 300), 200), third);
  EXPECT_EQ(third->WaitFinish(), FinishReason::kAbort);
  EXPECT_LT(third->tokens().size(), 200u);
}

// The lead's finding to check: after a group failure the engine keeps its
// Scheduler when the re-formed group has the same pool size, so a prefix
// cache that survived would map hashes to blocks whose KV the workers no
// longer hold. A request sharing a prefix with one that ran before the
// failure must get the tokens of a fault-free run.
TEST(ServingEngineTest, APrefixCachedBeforeAGroupFailureIsNotReusedAfterIt) {
  const std::vector<TokenId> shared = Prompt(3 * kBlockSize, 11);  // three full blocks
  std::vector<TokenId> first_prompt = shared, second_prompt = shared;
  first_prompt.push_back(1);
  second_prompt.push_back(2);
  auto run = [&](bool fail_between) {
    FakeGroup group;
    ServingEngine engine(TestConfig(), &group);
    engine.Start();
    auto first = std::make_shared<RecordingSink>();
    engine.Submit("", Greedy(first_prompt, 4), first);
    EXPECT_EQ(first->WaitFinish(), FinishReason::kLength);
    EXPECT_TRUE(WaitFor(engine, Idle));
    if (fail_between) {
      group.Break(absl::UnavailableError("worker rank 0 disconnected"));
      EXPECT_TRUE(WaitFor(engine, [&](const ServingSnapshot& s) { return group.formations() == 1 && Idle(s); }));
    }
    auto second = std::make_shared<RecordingSink>();
    engine.Submit("", Greedy(second_prompt, 8), second);
    EXPECT_EQ(second->WaitFinish(), FinishReason::kLength);
    EXPECT_TRUE(WaitFor(engine, Idle));
    const ServingSnapshot s = engine.Snapshot();
    // The fault-free run reuses the shared blocks; after the failure there is nothing to reuse.
    EXPECT_EQ(s.prefix_cache_hits, fail_between ? 0 : 3 * kBlockSize);
    EXPECT_EQ(s.kv_cache_usage, 0);
    return second->tokens();
  };
  const std::vector<TokenId> fault_free = run(false);
  ASSERT_EQ(fault_free.size(), 8u);
  EXPECT_EQ(run(true), fault_free);
}

// A fake steady clock that the test moves.
class FakeClock {
 public:
  std::chrono::steady_clock::time_point Now() const {
    return std::chrono::steady_clock::time_point(std::chrono::milliseconds(ms_.load()));
  }
  void Advance(double seconds) { ms_ += static_cast<int64_t>(seconds * 1000); }

 private:
  std::atomic<int64_t> ms_{1000000};
};

ServingOptions Bounded(FakeClock* clock, double timeout, int64_t max_queued) {
  ServingOptions options;
  options.queue_timeout_seconds = timeout;
  options.max_queued_requests = max_queued;
  options.clock = [clock] { return clock->Now(); };
  return options;
}

// Item 8 of issue 11: a request waits for a group that is not ready at
// most --queue-timeout, then fails with UNAVAILABLE; one past
// --max-queued-requests fails at once with RESOURCE_EXHAUSTED.
TEST(ServingEngineTest, RequestsWaitingForTheGroupTimeOutAndTheQueueIsBounded) {
  FakeClock clock;
  FakeGroup group(/*ready=*/false);
  EngineConfig config = TestConfig();
  config.max_num_seqs = 1;  // one request runs at a time: the others queue
  ServingEngine engine(config, &group, {}, 0, Bounded(&clock, 10, 2));
  engine.Start();
  auto a = std::make_shared<RecordingSink>();
  auto b = std::make_shared<RecordingSink>();
  auto c = std::make_shared<RecordingSink>();
  engine.Submit("", Greedy(Prompt(5, 1), 4), a);
  clock.Advance(4);
  engine.Submit("", Greedy(Prompt(5, 2), 4), b);
  engine.Submit("", Greedy(Prompt(5, 3), 4), c);  // the third: over the limit
  EXPECT_TRUE(c->finished());
  EXPECT_TRUE(absl::IsResourceExhausted(c->error())) << c->error();
  EXPECT_THAT(std::string(c->error().message()), HasSubstr("--max-queued-requests"));
  ASSERT_TRUE(WaitFor(engine, [](const ServingSnapshot& s) { return s.num_waiting == 2; }));

  clock.Advance(6.5);  // a has waited 10.5 s, b 6.5 s
  engine.Wake();
  EXPECT_EQ(a->WaitFinish(), FinishReason::kError);
  EXPECT_TRUE(absl::IsUnavailable(a->error())) << a->error();
  EXPECT_THAT(std::string(a->error().message()), HasSubstr("--queue-timeout"));
  ASSERT_TRUE(WaitFor(engine, [](const ServingSnapshot& s) { return s.num_waiting == 1; }));
  EXPECT_FALSE(b->finished());

  // a's place is free again; once the group is ready the waiting ones run.
  auto d = std::make_shared<RecordingSink>();
  engine.Submit("", Greedy(Prompt(5, 4), 4), d);
  EXPECT_FALSE(d->finished());
  group.SetReady(true);
  engine.Wake();
  EXPECT_EQ(b->WaitFinish(), FinishReason::kLength);
  EXPECT_EQ(d->WaitFinish(), FinishReason::kLength);

  // Behind a request that runs on a ready group, a request may queue for
  // longer than the timeout: it is served, not failed.
  auto e = std::make_shared<RecordingSink>();
  auto f = std::make_shared<RecordingSink>();
  std::atomic<bool> advanced{false};
  e->on_output = [&](const RequestOutput& out) {
    if (!out.new_token_ids.empty() && !advanced.exchange(true)) clock.Advance(60);
  };
  engine.Submit("", Greedy(Prompt(5, 5), 20), e);
  engine.Submit("", Greedy(Prompt(5, 6), 4), f);
  EXPECT_EQ(e->WaitFinish(), FinishReason::kLength);
  EXPECT_EQ(f->WaitFinish(), FinishReason::kLength) << f->error();
  EXPECT_TRUE(advanced);
}

// Requests admitted into the scheduler before the group broke, and never
// scheduled, time out too; a request aborted while the group is down ends
// at once.
TEST(ServingEngineTest, RequestsQueuedInTheSchedulerTimeOutWhileTheGroupIsDown) {
  FakeClock clock;
  FakeGroup group;
  ServingOptions options = Bounded(&clock, 10, 0);
  EngineConfig config = TestConfig();
  config.max_num_seqs = 1;  // the second request stays queued behind the first
  ServingEngine engine(config, &group, {}, 0, options);
  engine.Start();
  auto running = std::make_shared<RecordingSink>();
  auto queued = std::make_shared<RecordingSink>();
  auto aborted = std::make_shared<RecordingSink>();
  std::atomic<bool> broke{false};
  running->on_output = [&](const RequestOutput& out) {
    // While the first request runs, the others are admitted and queued; the
    // group then breaks and stays down.
    if (!out.new_token_ids.empty() && !broke.exchange(true)) {
      group.SetReady(false);
      group.Break(absl::UnavailableError("worker rank 0 disconnected"));
    }
  };
  engine.Submit("", Greedy(Prompt(5, 1), 100), running);
  engine.Submit("", Greedy(Prompt(5, 2), 4), queued);
  const RequestId aborted_id = engine.Submit("", Greedy(Prompt(5, 3), 4), aborted);
  EXPECT_EQ(running->WaitFinish(), FinishReason::kError);
  ASSERT_TRUE(WaitFor(engine, [](const ServingSnapshot& s) { return s.num_waiting == 2 && !s.executor_ready; }));
  EXPECT_TRUE(engine.Abort(aborted_id));
  EXPECT_EQ(aborted->WaitFinish(), FinishReason::kAbort);
  EXPECT_FALSE(queued->finished());
  clock.Advance(11);
  engine.Wake();
  EXPECT_EQ(queued->WaitFinish(), FinishReason::kError);
  EXPECT_TRUE(absl::IsUnavailable(queued->error())) << queued->error();
  ASSERT_TRUE(WaitFor(engine, [](const ServingSnapshot& s) { return s.num_waiting == 0; }));
}

}  // namespace
}  // namespace tandem::scheduler
