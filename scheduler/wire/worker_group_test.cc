// WorkerGroup's membership protocol and its Executor face, over in-memory
// links: formation, the pool size, refusals, failure and re-formation.
#include "scheduler/wire/worker_group.h"

#include <functional>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/wire/step_codec.h"

namespace tandem::scheduler {
namespace {

using ::testing::HasSubstr;

class FakeLink : public WorkerLink {
 public:
  explicit FakeLink(std::string name) : name_(std::move(name)) {}
  void Send(const v1::SchedulerMessage& message) override { sent.push_back(message); }
  void Close(const std::string& reason) override { closed = reason; }
  std::string peer() const override { return name_; }

  std::vector<v1::SchedulerMessage> sent;
  std::string closed;

 private:
  std::string name_;
};

v1::WorkerMessage Register(int32_t rank, int32_t world, int32_t blocks, const std::string& model = "m") {
  v1::WorkerMessage m;
  v1::RegisterWorker* r = m.mutable_register_();
  r->set_rank(rank);
  r->set_world_size(world);
  r->set_model_name(model);
  r->set_num_layers(4);
  r->set_block_size(16);
  r->set_max_kv_blocks(blocks);
  r->set_vocab_size(100);
  return m;
}

// Drives every link through configure, connect and ready for `epoch`.
void Form(WorkerGroup& group, std::vector<FakeLink*> links, int64_t epoch) {
  for (size_t r = 0; r < links.size(); ++r) {
    ASSERT_TRUE(links[r]->sent.back().has_configure());
    EXPECT_EQ(links[r]->sent.back().configure().epoch(), epoch);
    v1::WorkerMessage configured;
    configured.mutable_configured()->set_epoch(epoch);
    configured.mutable_configured()->set_comm_address("127.0.0.1:" + std::to_string(1000 + r));
    group.OnMessage(links[r], configured);
  }
  for (size_t r = 0; r < links.size(); ++r) {
    ASSERT_TRUE(links[r]->sent.back().has_connect());
    EXPECT_EQ(links[r]->sent.back().connect().comm_addresses_size(), static_cast<int>(links.size()));
    v1::WorkerMessage ready;
    ready.mutable_ready()->set_epoch(epoch);
    group.OnMessage(links[r], ready);
  }
}

WorkerGroupOptions Options(int32_t world, absl::Duration timeout = absl::Seconds(5)) {
  WorkerGroupOptions o;
  o.world_size = world;
  o.block_size = 16;
  o.step_timeout = timeout;
  return o;
}

// A step of one sampling row (request 7) and the full-form result that
// answers it with `token`.
SchedulerOutput OneRowStep(StepSeq step_seq, int32_t num_tokens = 1) {
  SchedulerOutput step;
  step.step_seq = step_seq;
  ScheduledRequest row;
  row.id = 7;
  row.num_tokens = num_tokens;
  row.samples = true;
  step.scheduled.push_back(row);
  step.total_num_scheduled_tokens = num_tokens;
  return step;
}

v1::WorkerMessage Result(int64_t epoch, StepSeq step_seq, TokenId token) {
  v1::WorkerMessage result;
  result.mutable_result()->set_epoch(epoch);
  v1::ModelRunnerOutput* out = result.mutable_result()->mutable_output();
  out->set_step_seq(step_seq);
  out->add_request_ids(7);
  out->add_num_sampled(1);
  out->add_sampled_token_ids(token);
  return result;
}

TEST(WorkerGroupTest, FormsWithTheSmallestPool) {
  WorkerGroup group(Options(2));
  FakeLink a("a"), b("b");
  group.OnMessage(&b, Register(1, 2, 300));
  EXPECT_FALSE(group.ready());
  EXPECT_THAT(group.Status().description, HasSubstr("rank(s) 0"));
  group.OnMessage(&a, Register(0, 2, 500));
  EXPECT_EQ(a.sent.back().configure().num_kv_blocks(), 300);
  Form(group, {&a, &b}, 1);
  EXPECT_TRUE(group.ready());
  EXPECT_EQ(group.pool_blocks(), 300);
  EXPECT_EQ(a.sent.back().connect().comm_addresses(1), "127.0.0.1:1001");
}

TEST(WorkerGroupTest, RefusesWhatDoesNotFit) {
  WorkerGroup group(Options(2));
  FakeLink a("a"), b("b"), c("c"), d("d");
  group.OnMessage(&a, Register(0, 2, 100));
  group.OnMessage(&b, Register(0, 2, 100));
  EXPECT_THAT(b.closed, HasSubstr("rank 0 is already served by a"));
  group.OnMessage(&c, Register(1, 3, 100));
  EXPECT_THAT(c.closed, HasSubstr("the scheduler runs 2 pipeline stages"));
  group.OnMessage(&d, Register(1, 2, 100, "other"));
  EXPECT_THAT(d.closed, HasSubstr("loaded model 'other'"));
  EXPECT_FALSE(group.ready());
}

TEST(WorkerGroupTest, StepsGoToEveryRankAndResultsComeFromTheLast) {
  WorkerGroup group(Options(2));
  FakeLink a("a"), b("b");
  group.OnMessage(&a, Register(0, 2, 100));
  group.OnMessage(&b, Register(1, 2, 100));
  Form(group, {&a, &b}, 1);
  const size_t b_before = b.sent.size();
  ASSERT_TRUE(group.Execute(OneRowStep(1, 3)).ok());
  EXPECT_TRUE(a.sent.back().has_execute());
  EXPECT_EQ(b.sent.size(), b_before);  // held for the sample
  ASSERT_TRUE(group.Sample(1, nullptr).ok());
  ASSERT_EQ(b.sent.size(), b_before + 1);  // one message: execute, then sample
  ASSERT_TRUE(b.sent.back().has_execute_and_sample());
  EXPECT_EQ(b.sent.back().execute_and_sample().execute().step_seq(), 1u);
  EXPECT_EQ(b.sent.back().execute_and_sample().sample().step_seq(), 1u);
  group.OnMessage(&b, Result(1, 1, 42));
  auto collected = group.CollectOutput(1);
  ASSERT_TRUE(collected.ok()) << collected.status();
  EXPECT_EQ(collected->sampled_token_ids, std::vector<TokenId>{42});
}

// Compact results (rows implied, proto/diff/step_diff.h) get their rows from
// the steps sent, however deep the queue (deeper than the diff's history
// here); a compact result for a step other than the oldest is refused.
// A compact result decoded from its bits equals the one its message
// expands to, for row counts around byte edges and bit strings shorter than
// the rows; one whose bits and tokens disagree is refused as the long way
// refuses it.
TEST(WorkerGroupTest, CompactResultsDecodeAsTheirExpandedForm) {
  WorkerGroup group(Options(1));
  FakeLink a("a");
  group.OnMessage(&a, Register(0, 1, 100));
  Form(group, {&a}, 1);
  const std::vector<int> row_counts = {1, 7, 8, 9, 17, 17};
  std::vector<std::vector<RequestId>> rows;
  for (size_t k = 0; k < row_counts.size(); ++k) {
    SchedulerOutput step;
    step.step_seq = k + 1;
    rows.emplace_back();
    for (int r = 0; r < row_counts[k]; ++r) {
      ScheduledRequest row;
      row.id = 1000 * (k + 1) + r;
      row.num_tokens = 1;
      row.samples = true;
      step.scheduled.push_back(row);
      rows.back().push_back(row.id);
    }
    step.total_num_scheduled_tokens = row_counts[k];
    ASSERT_TRUE(group.Execute(step).ok());
    ASSERT_TRUE(group.Sample(k + 1, nullptr).ok());
  }
  std::vector<v1::StepResult> sent;
  for (size_t k = 0; k < row_counts.size(); ++k) {
    v1::WorkerMessage message;
    v1::StepResult* result = message.mutable_result();
    result->set_epoch(1);
    result->set_rows_implied(true);
    result->mutable_output()->set_step_seq(k + 1);
    // Every third row samples; the bits stop one byte short for 17 rows.
    const int n = row_counts[k];
    const int bytes = n > 8 ? (n + 7) / 8 - 1 : (n + 7) / 8;
    std::string bits(bytes, '\0');
    for (int r = 0; r < bytes * 8 && r < n; ++r) {
      if (r % 3 == 0) {
        bits[r / 8] = static_cast<char>(bits[r / 8] | (1 << (r % 8)));
        result->mutable_output()->add_sampled_token_ids(r);
      }
    }
    result->set_sampled_rows(bits);
    if (k + 1 == row_counts.size()) result->mutable_output()->add_sampled_token_ids(99);  // one token too many
    sent.push_back(*result);
    group.OnMessage(&a, message);
  }
  for (size_t k = 0; k < row_counts.size(); ++k) {
    v1::StepResult expanded = sent[k];
    const absl::Status expand = wire::ExpandResult(rows[k], &expanded);
    const absl::StatusOr<ModelRunnerOutput> want =
        expand.ok() ? DecodeRunnerOutput(expanded.output()) : absl::StatusOr<ModelRunnerOutput>(expand);
    absl::StatusOr<ModelRunnerOutput> got = group.CollectOutput(k + 1);
    if (k + 1 == row_counts.size()) {
      EXPECT_FALSE(got.ok());
      EXPECT_EQ(got.status(), want.status());
      break;
    }
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->step_seq, want->step_seq);
    EXPECT_EQ(got->request_ids, want->request_ids);
    EXPECT_EQ(got->sampled_offsets, want->sampled_offsets) << k;
    EXPECT_EQ(got->sampled_token_ids, want->sampled_token_ids);
  }
}

TEST(WorkerGroupTest, CompactResultsTakeTheRowsOfTheOldestStepSent) {
  WorkerGroup group(Options(1));
  FakeLink a("a");
  group.OnMessage(&a, Register(0, 1, 100));
  Form(group, {&a}, 1);
  const int depth = wire::StepDiffState::kHistory + 4;
  for (int k = 1; k <= depth; ++k) {
    SchedulerOutput step;
    step.step_seq = k;
    for (RequestId id : {RequestId{7}, RequestId{100 + k}}) {
      ScheduledRequest row;
      row.id = id;
      row.num_tokens = 1;
      row.samples = true;
      step.scheduled.push_back(row);
    }
    step.total_num_scheduled_tokens = 2;
    ASSERT_TRUE(group.Execute(step).ok());
    ASSERT_TRUE(group.Sample(k, nullptr).ok());
  }
  auto compact_result = [](uint64_t seq) {
    v1::WorkerMessage result;
    result.mutable_result()->set_epoch(1);
    result.mutable_result()->set_rows_implied(true);
    result.mutable_result()->set_sampled_rows(std::string(1, '\x02'));  // only row 1 sampled
    result.mutable_result()->mutable_output()->set_step_seq(seq);
    result.mutable_result()->mutable_output()->add_sampled_token_ids(static_cast<int32_t>(seq));
    return result;
  };
  for (int k = 1; k < depth; ++k) group.OnMessage(&a, compact_result(k));
  for (int k = 1; k < depth; ++k) {
    auto collected = group.CollectOutput(k);
    ASSERT_TRUE(collected.ok()) << collected.status();
    EXPECT_EQ(collected->request_ids, (std::vector<RequestId>{7, 100 + k}));
    EXPECT_EQ(collected->sampled_offsets, (std::vector<int32_t>{0, 0, 1}));
    EXPECT_EQ(collected->sampled_token_ids, std::vector<TokenId>{k});
  }
  group.OnMessage(&a, compact_result(depth + 1));  // step `depth` is the one in flight
  auto wrong = group.CollectOutput(depth);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument) << wrong.status();
}

// A step whose sampling is deferred (scheduler/README.md §4.7) reaches the
// last rank at the group's next call, at the latest CollectOutput before it
// waits; its sample then goes alone.
TEST(WorkerGroupTest, TheLastRankGetsAStepWithoutItsSampleBeforeTheGroupWaits) {
  WorkerGroup group(Options(1));
  FakeLink a("a");
  group.OnMessage(&a, Register(0, 1, 100));
  Form(group, {&a}, 1);
  SchedulerOutput step;
  step.step_seq = 1;
  ScheduledRequest row;
  row.id = 7;
  row.num_tokens = 1;
  row.samples = true;
  step.scheduled.push_back(row);
  step.total_num_scheduled_tokens = 1;
  const size_t before = a.sent.size();
  ASSERT_TRUE(group.Execute(step).ok());
  EXPECT_EQ(a.sent.size(), before);
  v1::WorkerMessage result;
  result.mutable_result()->set_epoch(1);
  result.mutable_result()->mutable_output()->set_step_seq(1);
  result.mutable_result()->mutable_output()->add_request_ids(7);
  result.mutable_result()->mutable_output()->add_num_sampled(1);
  result.mutable_result()->mutable_output()->add_sampled_token_ids(5);
  group.OnMessage(&a, result);
  ASSERT_TRUE(group.CollectOutput(1).ok());
  ASSERT_EQ(a.sent.size(), before + 1);
  EXPECT_EQ(a.sent.back().execute().step_seq(), 1u);
  ASSERT_TRUE(group.Sample(1, nullptr).ok());
  ASSERT_EQ(a.sent.size(), before + 2);
  EXPECT_EQ(a.sent.back().sample().step_seq(), 1u);
}

TEST(WorkerGroupTest, ADisconnectFailsTheStepAndTheGroupReforms) {
  WorkerGroup group(Options(2));
  FakeLink a("a"), b("b");
  group.OnMessage(&a, Register(0, 2, 100));
  group.OnMessage(&b, Register(1, 2, 100));
  Form(group, {&a, &b}, 1);
  std::thread lose([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    group.OnDisconnect(&b, "socket closed");
  });
  auto collected = group.CollectOutput(1);
  lose.join();
  EXPECT_EQ(collected.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(collected.status().message(), HasSubstr("worker rank 1 (b) disconnected: socket closed"));
  group.Reset();
  EXPECT_FALSE(group.ready());
  // The worker comes back: a new epoch forms, stale results are ignored.
  FakeLink b2("b2");
  group.OnMessage(&b2, Register(1, 2, 100));
  Form(group, {&a, &b2}, 2);
  EXPECT_TRUE(group.ready());
  v1::WorkerMessage stale;
  stale.mutable_result()->set_epoch(1);
  group.OnMessage(&b2, stale);
  EXPECT_TRUE(group.Status().ready);
}

// Nothing was waiting on the group when the worker went: the failure stays
// visible until the engine resets the group.
TEST(WorkerGroupTest, ALossBetweenStepsIsReportedUntilReset) {
  WorkerGroup group(Options(2));
  FakeLink a("a"), b("b");
  group.OnMessage(&a, Register(0, 2, 100));
  group.OnMessage(&b, Register(1, 2, 100));
  Form(group, {&a, &b}, 1);
  EXPECT_TRUE(group.failure().ok());
  group.OnDisconnect(&b, "socket closed");
  EXPECT_FALSE(group.ready());
  EXPECT_THAT(group.failure().message(), HasSubstr("worker rank 1 (b) disconnected"));
  EXPECT_THAT(group.Status().description, HasSubstr("failed"));
  group.Reset();
  EXPECT_TRUE(group.failure().ok());
  EXPECT_FALSE(group.ready());
}

TEST(WorkerGroupTest, AMissingAnswerTimesOut) {
  WorkerGroup group(Options(1, absl::Milliseconds(100)));
  FakeLink a("a");
  group.OnMessage(&a, Register(0, 1, 100));
  Form(group, {&a}, 1);
  auto collected = group.CollectOutput(9);
  EXPECT_EQ(collected.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(collected.status().message(), HasSubstr("did not answer step 9"));
  EXPECT_FALSE(group.ready());
  group.Reset();  // every rank is still connected: a new epoch starts at once
  EXPECT_EQ(a.sent.back().configure().epoch(), 2);
}

// A transport the engine thread drives (WorkerSessions over gRPC): each
// Poll delivers the next queued event on the calling thread, as a completion
// queue would; once shut down it returns false and delivers nothing.
class FakePoller : public LinkPoller {
 public:
  bool Poll(absl::Time deadline) override {
    ++polls;
    if (shut_down) return false;
    if (events.empty()) return absl::Now() < deadline;
    std::function<void()> next = std::move(events.front());
    events.erase(events.begin());
    next();
    return true;
  }
  std::vector<std::function<void()>> events;
  bool shut_down = false;
  int polls = 0;
};

// A world of one formed over `link`, whose CollectOutput polls `poller`.
void FormPolled(WorkerGroup& group, FakePoller* poller, FakeLink* link) {
  group.set_poller(poller);
  group.OnMessage(link, Register(0, 1, 100));
  Form(group, {link}, 1);
}

// Sends step `step_seq` and its sample, as the engine does.
void Launch(WorkerGroup& group, StepSeq step_seq) {
  ASSERT_TRUE(group.Execute(OneRowStep(step_seq)).ok());
  ASSERT_TRUE(group.Sample(step_seq, nullptr).ok());
}

// CollectOutput polls until the result arrives: events before it (a write's
// completion, a stats report) are delivered on the way, each by one Poll.
TEST(WorkerGroupPollerTest, CollectOutputPollsTheTransportUntilTheResultArrives) {
  WorkerGroup group(Options(1));
  FakePoller poller;
  FakeLink a("a");
  FormPolled(group, &poller, &a);
  Launch(group, 1);
  poller.events.push_back([] {});  // the write's completion
  poller.events.push_back([&] {
    v1::WorkerMessage stats;
    stats.mutable_stats()->set_steps(1);
    group.OnMessage(&a, stats);
  });
  poller.events.push_back([&] { group.OnMessage(&a, Result(1, 1, 42)); });
  poller.events.push_back([] { ADD_FAILURE() << "polled past the result"; });
  auto collected = group.CollectOutput(1);
  ASSERT_TRUE(collected.ok()) << collected.status();
  EXPECT_EQ(collected->sampled_token_ids, std::vector<TokenId>{42});
  EXPECT_EQ(poller.polls, 3);
  // A result already delivered (by the transport's own thread) is taken
  // without polling.
  Launch(group, 2);
  group.OnMessage(&a, Result(1, 2, 43));
  poller.events.clear();
  const int before = poller.polls;
  collected = group.CollectOutput(2);
  ASSERT_TRUE(collected.ok()) << collected.status();
  EXPECT_EQ(collected->sampled_token_ids, std::vector<TokenId>{43});
  EXPECT_EQ(poller.polls, before);
}

// A transport shut down (its queue drained by another thread) hands the wait
// back to the group's lock: a result delivered from another thread still
// ends it, and with none the step times out instead of spinning.
TEST(WorkerGroupPollerTest, AShutDownTransportFallsBackToWaiting) {
  WorkerGroup group(Options(1, absl::Milliseconds(200)));
  FakePoller poller;
  poller.shut_down = true;
  FakeLink a("a");
  FormPolled(group, &poller, &a);
  Launch(group, 1);
  std::thread transport([&] { group.OnMessage(&a, Result(1, 1, 42)); });
  auto collected = group.CollectOutput(1);
  transport.join();
  ASSERT_TRUE(collected.ok()) << collected.status();
  EXPECT_EQ(collected->sampled_token_ids, std::vector<TokenId>{42});
  EXPECT_EQ(poller.polls, 1);
  Launch(group, 2);
  collected = group.CollectOutput(2);
  EXPECT_EQ(collected.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(poller.polls, 2);
}

}  // namespace
}  // namespace tandem::scheduler

namespace tandem::scheduler {
namespace {

// After a failure, another rank reporting the lost peer must not poison the
// next formation.
TEST(WorkerGroupLateErrorTest, AnErrorAfterTheFailureIsNotKept) {
  WorkerGroup group(Options(2));
  FakeLink a("a"), b("b");
  group.OnMessage(&a, Register(0, 2, 100));
  group.OnMessage(&b, Register(1, 2, 100));
  Form(group, {&a, &b}, 1);
  group.OnDisconnect(&b, "killed");
  EXPECT_FALSE(group.CollectOutput(1).ok());
  group.Reset();
  v1::WorkerMessage late;
  late.mutable_error()->set_epoch(1);
  late.mutable_error()->set_message("receiving from rank 1: peer closed the connection");
  group.OnMessage(&a, late);
  FakeLink b2("b2");
  group.OnMessage(&b2, Register(1, 2, 100));
  Form(group, {&a, &b2}, 2);
  SchedulerOutput step;
  step.step_seq = 5;
  ASSERT_TRUE(group.Execute(step).ok());
  v1::WorkerMessage result;
  result.mutable_result()->set_epoch(2);
  result.mutable_result()->mutable_output()->set_step_seq(5);
  group.OnMessage(&b2, result);
  auto collected = group.CollectOutput(5);
  EXPECT_TRUE(collected.ok()) << collected.status();
}

}  // namespace
}  // namespace tandem::scheduler
