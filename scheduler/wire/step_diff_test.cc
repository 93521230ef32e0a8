// The compact control stream (proto/diff/step_diff.h): real engine runs with
// joins, finishes, aborts and preemptions, PP 1 and 2, async on and off,
// every step compacted by one state and expanded by two receivers (two
// ranks) back to exactly the full form, every result the same; the bytes a
// decode row costs; malformed diffs refused.
#include "proto/diff/step_diff.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "scheduler/core/engine_core.h"
#include "scheduler/testing/fake_executor.h"
#include "scheduler/testing/scheduler_test_util.h"
#include "scheduler/wire/compact_step.h"
#include "scheduler/wire/step_codec.h"

namespace tandem::scheduler {
namespace {

using google::protobuf::util::MessageDifferencer;

// A FakeExecutor behind the compact stream: every step and result goes
// through Compact/Expand and CompactResult/ExpandResult and must come back
// equal to its full encoding.
class DiffCheckingExecutor : public Executor {
 public:
  explicit DiffCheckingExecutor(FakeExecutorOptions options) : inner_(std::move(options)) {}

  absl::Status Execute(const SchedulerOutput& step) override {
    v1::SchedulerOutput full;
    EncodeSchedulerOutput(step, &full);
    // What the WorkerGroup sends (rows diffed straight from the engine's
    // struct) must be byte for byte what diffing the full message gives.
    v1::SchedulerOutput sent;
    v1::BatchDiff diff;
    EncodeStepWithoutRows(step, &sent);
    const bool compact = encoder_.EncodeRows(step, &sent, &diff);
    compacted_ += compact ? 1 : 0;
    v1::SchedulerOutput by_message = full;
    v1::BatchDiff by_message_diff;
    EXPECT_EQ(by_message_sender_.Compact(&by_message, &by_message_diff), compact) << "step " << step.step_seq;
    EXPECT_EQ(sent.SerializeAsString(), by_message.SerializeAsString()) << "step " << step.step_seq;
    EXPECT_EQ(diff.SerializeAsString(), by_message_diff.SerializeAsString())
        << "step " << step.step_seq << "\nrows " << diff.ShortDebugString() << "\nmsg  " << by_message_diff.ShortDebugString();
    ++steps_;
    rows_ += static_cast<int64_t>(step.scheduled.size());
    if (step.new_requests.empty() && step.cached.resumed_requests.empty() && step.preempted_request_ids.empty() &&
        step.finished_request_ids.empty()) {
      steady_rows_ += static_cast<int64_t>(step.scheduled.size());
      steady_bytes_ += static_cast<int64_t>(sent.ByteSizeLong() + diff.ByteSizeLong());
    }
    for (wire::StepDiffState& receiver : receivers_) {
      v1::SchedulerOutput got = sent;
      const absl::Status s = compact ? receiver.Expand(diff, &got) : receiver.Record(got);
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_TRUE(MessageDifferencer::Equals(got, full))
          << "step " << step.step_seq << "\nwant " << full.ShortDebugString() << "\ngot  " << got.ShortDebugString();
    }
    return inner_.Execute(step);
  }
  absl::Status Sample(StepSeq step_seq, const GrammarOutput* grammar) override {
    return inner_.Sample(step_seq, grammar);
  }
  absl::StatusOr<ModelRunnerOutput> CollectOutput(StepSeq step_seq) override {
    absl::StatusOr<ModelRunnerOutput> output = inner_.CollectOutput(step_seq);
    if (!output.ok()) return output;
    v1::StepResult full;
    EncodeRunnerOutput(*output, full.mutable_output());
    v1::StepResult sent = full;
    wire::CompactResult(&sent);
    EXPECT_EQ(sent.output().request_ids_size(), 0);
    up_bytes_ += static_cast<int64_t>(sent.ByteSizeLong());
    const std::vector<int64_t>* rows = encoder_.state().Rows(step_seq);
    EXPECT_NE(rows, nullptr) << "step " << step_seq;
    if (rows == nullptr) return output;
    EXPECT_TRUE(wire::ExpandResult(*rows, &sent).ok());
    EXPECT_TRUE(MessageDifferencer::Equals(sent, full)) << "result of step " << step_seq;
    return output;
  }

  int64_t steps_ = 0, compacted_ = 0, rows_ = 0, steady_rows_ = 0, steady_bytes_ = 0, up_bytes_ = 0;

 private:
  FakeExecutor inner_;
  CompactStepEncoder encoder_;
  wire::StepDiffState by_message_sender_;
  wire::StepDiffState receivers_[2];
};

struct EngineRun {
  int64_t preemptions = 0;
  int64_t finished = 0;
};

// `num_requests` requests, 80 in the engine at a time, into a pool small
// enough to preempt, EOS forced now and then, an abort every 23 iterations.
EngineRun RunEngine(DiffCheckingExecutor* executor, const EngineConfig& config, int num_requests, uint32_t seed) {
  auto scheduler = testing::MakeScheduler(config);
  EngineCore engine(scheduler.get(), executor);
  std::mt19937 rng(seed);
  EngineRun run;
  RequestId next = 0;
  for (int64_t it = 0; (next < num_requests || engine.HasWork()) && it < 20000; ++it) {
    // Keep the engine full: more requests than the pool holds at their longest.
    while (next < num_requests && scheduler->num_requests() < 80) {
      RequestSpec spec = testing::MakeRequest(next, 4 + static_cast<int32_t>(rng() % 40),
                                              32 + static_cast<int32_t>(rng() % 64));
      EXPECT_TRUE(engine.AddRequest(std::move(spec)).ok());
      ++next;
    }
    if (it % 23 == 22 && next > 0) engine.Abort(static_cast<RequestId>(rng() % next));
    auto result = engine.Step();
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) break;
    for (const RequestOutput& out : result->outputs) run.finished += out.finished() ? 1 : 0;
  }
  EXPECT_FALSE(engine.HasWork());
  run.preemptions = scheduler->stats().num_preemptions;
  return run;
}

class StepDiffEngineTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(StepDiffEngineTest, EveryStepAndResultSurvivesTheCompactForm) {
  const auto [stages, async] = GetParam();
  EngineConfig config = testing::VllmTestConfig(async);
  config.pipeline_parallel_size = stages;
  config.max_num_seqs = 64;
  config.num_kv_blocks = 160;  // 159 blocks of 16 for up to 64 requests of up to ~140 tokens: preemptions
  config.reserve_full_sequence = false;
  config.max_num_batched_tokens = 256;
  config.max_model_len = 160;
  FakeExecutorOptions options;
  options.num_blocks = config.num_kv_blocks;
  options.block_size = config.block_size;
  options.force_token = [](RequestId id, int32_t index) -> std::optional<TokenId> {
    if ((id * 7 + index) % 61 == 0) return testing::kEos;
    return std::nullopt;
  };
  DiffCheckingExecutor executor(std::move(options));
  const EngineRun run = RunEngine(&executor, config, 300, 17u + stages);
  EXPECT_GT(run.preemptions, 0) << "the pool was meant to preempt";
  EXPECT_GT(run.finished, 250);
  // The scheduler's shape always fits the diff: nothing fell back.
  EXPECT_EQ(executor.compacted_, executor.steps_);
  // Steps where nobody joins or leaves cost about nothing per row: the step's
  // header over its rows (at most 64 here, 32 a step with PP 2 async) and a
  // block now and then (a row gets a new one every 16 tokens). The full form
  // costs about 8.
  ASSERT_GT(executor.steady_rows_, 0);
  EXPECT_LT(double(executor.steady_bytes_) / executor.steady_rows_, 1.5);
}

INSTANTIATE_TEST_SUITE_P(StagesAndAsync, StepDiffEngineTest,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Bool()));

// Three running requests; the next step drops the middle one, adds one, and
// schedules a chunk.
v1::SchedulerOutput Step(uint64_t seq, std::vector<int64_t> ids, std::vector<int32_t> tokens,
                         std::vector<int32_t> computed) {
  v1::SchedulerOutput s;
  s.set_step_seq(seq);
  v1::CachedRequests* c = s.mutable_cached_requests();
  for (size_t i = 0; i < ids.size(); ++i) {
    s.add_scheduled_request_ids(ids[i]);
    s.add_num_scheduled_tokens(tokens[i]);
    c->add_request_ids(ids[i]);
    c->add_resumed(false);
    c->add_num_computed_tokens(computed[i]);
    c->add_num_new_block_ids(0);
  }
  return s;
}

TEST(StepDiffTest, DiffAgainstThePreviousStep) {
  wire::StepDiffState sender, receiver;
  v1::SchedulerOutput first = Step(1, {10, 11, 12}, {1, 1, 1}, {20, 30, 40});
  ASSERT_TRUE(receiver.Record(first).ok());
  v1::BatchDiff diff;
  ASSERT_FALSE(sender.Compact(&first, &diff) && diff.base() != 0);  // nothing to diff against yet
  v1::SchedulerOutput second = Step(2, {10, 12, 13}, {1, 1, 5}, {21, 41, 0});
  const v1::SchedulerOutput want = second;
  ASSERT_TRUE(sender.Compact(&second, &diff));
  EXPECT_EQ(diff.base(), 1u);
  EXPECT_EQ(std::vector<uint32_t>(diff.removed().begin(), diff.removed().end()), std::vector<uint32_t>{1});
  EXPECT_EQ(std::vector<int64_t>(diff.appended().begin(), diff.appended().end()), std::vector<int64_t>{13});
  EXPECT_EQ(diff.token_rows_size(), 1);
  EXPECT_EQ(diff.computed_entries_size(), 1);  // only the newcomer's count: the others are predicted
  EXPECT_EQ(second.scheduled_request_ids_size(), 0);
  v1::SchedulerOutput got = second;
  ASSERT_TRUE(receiver.Expand(diff, &got).ok());
  EXPECT_TRUE(MessageDifferencer::Equals(got, want)) << got.ShortDebugString();
}

TEST(StepDiffTest, MalformedDiffsAreRefused) {
  auto expect_refused = [](const std::function<void(v1::BatchDiff&)>& mutate, const std::string& name) {
    SCOPED_TRACE(name);
    wire::StepDiffState sender, receiver;
    v1::SchedulerOutput first = Step(1, {10, 11, 12}, {1, 1, 1}, {20, 30, 40});
    ASSERT_TRUE(receiver.Record(first).ok());
    v1::BatchDiff diff;
    sender.Compact(&first, &diff);
    v1::SchedulerOutput second = Step(2, {10, 12}, {1, 1}, {21, 41});
    ASSERT_TRUE(sender.Compact(&second, &diff));
    mutate(diff);
    EXPECT_EQ(receiver.Expand(diff, &second).code(), absl::StatusCode::kInvalidArgument);
  };
  expect_refused([](v1::BatchDiff& d) { d.set_base(2); }, "a base the receiver does not hold");
  expect_refused([](v1::BatchDiff& d) { d.set_base(99); }, "a base beyond the history");
  expect_refused([](v1::BatchDiff& d) { d.set_removed(0, 3); }, "a removed position outside the base");
  expect_refused([](v1::BatchDiff& d) { d.add_removed(0); }, "removed positions not ascending");
  expect_refused([](v1::BatchDiff& d) { d.add_token_rows(7); d.add_token_counts(2); }, "a token row outside");
  expect_refused([](v1::BatchDiff& d) { d.add_token_rows(0); d.add_token_counts(0); }, "a zero token count");
  expect_refused([](v1::BatchDiff& d) { d.add_computed_entries(5); d.add_computed_values(1); }, "an entry outside");
  expect_refused([](v1::BatchDiff& d) { d.add_appended(77); }, "a newcomer without its computed count");
  expect_refused([](v1::BatchDiff& d) { d.add_resumed_entries(2); }, "a resumed entry outside");
  expect_refused([](v1::BatchDiff& d) { d.add_block_entries(0); }, "block lists of different lengths");
}

TEST(StepDiffTest, CompactResultKeepsTokensAndCounts) {
  v1::StepResult full;
  v1::ModelRunnerOutput* out = full.mutable_output();
  for (int r = 0; r < 11; ++r) {
    out->add_request_ids(100 + r);
    out->add_num_sampled(r == 4 ? 0 : 1);
    if (r != 4) out->add_sampled_token_ids(1000 + r);
  }
  v1::StepResult sent = full;
  wire::CompactResult(&sent);
  EXPECT_EQ(sent.output().request_ids_size(), 0);
  EXPECT_EQ(sent.output().num_sampled_size(), 0);
  EXPECT_EQ(sent.sampled_rows().size(), 2u);
  std::vector<int64_t> rows;
  for (int r = 0; r < 11; ++r) rows.push_back(100 + r);
  ASSERT_TRUE(wire::ExpandResult(rows, &sent).ok());
  EXPECT_TRUE(MessageDifferencer::Equals(sent, full)) << sent.ShortDebugString();
  // More bits than rows: refused.
  v1::StepResult bad = full;
  wire::CompactResult(&bad);
  rows.resize(3);
  EXPECT_EQ(wire::ExpandResult(rows, &bad).code(), absl::StatusCode::kInvalidArgument);
  // A row that sampled two tokens: the counts travel as they are.
  v1::StepResult two = full;
  two.mutable_output()->set_num_sampled(9, 2);
  two.mutable_output()->add_sampled_token_ids(2000);
  v1::StepResult two_sent = two;
  wire::CompactResult(&two_sent);
  EXPECT_EQ(two_sent.output().request_ids_size(), 0);
  EXPECT_EQ(two_sent.output().num_sampled_size(), 11);
  EXPECT_TRUE(two_sent.sampled_rows().empty());
  rows.clear();
  for (int r = 0; r < 11; ++r) rows.push_back(100 + r);
  ASSERT_TRUE(wire::ExpandResult(rows, &two_sent).ok());
  EXPECT_TRUE(MessageDifferencer::Equals(two_sent, two)) << two_sent.ShortDebugString();
  // Fewer bits than rows: the rows past them sampled nothing.
  v1::StepResult short_bits;
  short_bits.set_rows_implied(true);
  short_bits.set_sampled_rows(std::string(1, '\x05'));
  ASSERT_TRUE(wire::ExpandResult(rows, &short_bits).ok());
  EXPECT_EQ(std::vector<int32_t>(short_bits.output().num_sampled().begin(), short_bits.output().num_sampled().end()),
            std::vector<int32_t>({1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}));
}

}  // namespace
}  // namespace tandem::scheduler
