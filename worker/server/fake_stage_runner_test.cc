// FakeStageRunner (tandem-worker --fake-model): decode rows take the token
// the group sampled (never sent by the scheduler), through the worker-to-
// worker channel with two stages, and the tokens do not depend on the
// number of stages; a token sampled after its request ended reaches no other
// request; a step that disagrees with the runner's state is refused.
#include "worker/server/fake_stage_runner.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/loopback_communicator.h"

namespace tandem::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::SchedulerOutput Prefill(uint64_t seq, int64_t id, std::vector<int32_t> prompt) {
  v1::SchedulerOutput step;
  step.set_step_seq(seq);
  v1::NewRequest* r = step.add_new_requests();
  r->set_request_id(id);
  for (int32_t t : prompt) r->add_prompt_token_ids(t);
  r->mutable_sampling()->set_logprobs(-1);
  step.add_scheduled_request_ids(id);
  step.add_num_scheduled_tokens(static_cast<int32_t>(prompt.size()));
  return step;
}

// A decode step of a running request: no token ids, as on the wire.
v1::SchedulerOutput Decode(uint64_t seq, int64_t id, int32_t computed) {
  v1::SchedulerOutput step;
  step.set_step_seq(seq);
  v1::CachedRequests* c = step.mutable_cached_requests();
  c->add_request_ids(id);
  c->add_resumed(false);
  c->add_num_computed_tokens(computed);
  c->add_num_new_block_ids(0);
  step.add_scheduled_request_ids(id);
  step.add_num_scheduled_tokens(1);
  return step;
}

v1::SampleCommand SampleOf(uint64_t seq) {
  v1::SampleCommand command;
  command.set_step_seq(seq);
  return command;
}

// Runs a prompt of 3 tokens and `decodes` decode steps with one stage
// (Sample(k) before Execute(k + 1), as the protocol requires); returns the
// sampled tokens.
std::vector<int32_t> RunOneStage(int decodes) {
  FakeStageRunner runner({});
  std::vector<int32_t> sampled;
  EXPECT_TRUE(runner.Execute(Prefill(1, 7, {1, 2, 3})).ok());
  for (int k = 0; k <= decodes; ++k) {
    auto out = runner.Sample(SampleOf(1 + k));
    EXPECT_TRUE(out.ok()) << out.status();
    sampled.push_back(out->sampled_token_ids(0));
    if (k < decodes) EXPECT_TRUE(runner.Execute(Decode(2 + k, 7, 3 + k)).ok());
  }
  return sampled;
}

TEST(FakeStageRunnerTest, DecodeRowsTakeTheSampledTokenItself) {
  const std::vector<int32_t> sampled = RunOneStage(3);
  ASSERT_EQ(sampled.size(), 4u);
  FakeStageRunner runner({});
  ASSERT_TRUE(runner.Execute(Prefill(1, 7, {1, 2, 3})).ok());
  ASSERT_TRUE(runner.Sample(SampleOf(1)).ok());
  ASSERT_TRUE(runner.Execute(Decode(2, 7, 3)).ok());
  EXPECT_THAT(runner.Tokens(7), ElementsAre(1, 2, 3, sampled[0]));
  // Each token depends on the context: the same prompt, another request,
  // samples the same; another prompt does not.
  FakeStageRunner other({});
  ASSERT_TRUE(other.Execute(Prefill(1, 9, {1, 2, 4})).ok());
  EXPECT_NE(other.Sample(SampleOf(1))->sampled_token_ids(0), sampled[0]);
}

TEST(FakeStageRunnerTest, TwoStagesPassTokensOverTheChannelAndSampleTheSame) {
  const std::vector<int32_t> one_stage = RunOneStage(3);
  LoopbackHub hub(2);
  LoopbackCommunicator c0(&hub, 0), c1(&hub, 1);
  FakeStageRunner first({0, 2, 32000, &c0, absl::Seconds(5)});
  FakeStageRunner last({1, 2, 32000, &c1, absl::Seconds(5)});
  std::vector<int32_t> sampled;
  v1::SchedulerOutput step = Prefill(1, 7, {1, 2, 3});
  for (int k = 0; k <= 3; ++k) {
    ASSERT_TRUE(first.Execute(step).ok());  // stage 0 receives the ids it needs
    ASSERT_TRUE(last.Execute(step).ok());
    auto out = last.Sample(SampleOf(1 + k));
    ASSERT_TRUE(out.ok()) << out.status();
    sampled.push_back(out->sampled_token_ids(0));
    step = Decode(2 + k, 7, 3 + k);
  }
  EXPECT_EQ(sampled, one_stage);
  EXPECT_THAT(first.Tokens(7), ElementsAre(1, 2, 3, sampled[0], sampled[1], sampled[2]));
}

TEST(FakeStageRunnerTest, ATokenSampledAfterItsRequestEndedGoesNowhere) {
  FakeStageRunner runner({});
  ASSERT_TRUE(runner.Execute(Prefill(1, 7, {1, 2, 3})).ok());
  // Step 2, executed before step 1 is sampled, ends 7 and admits 9, which
  // takes the slot 7 had.
  v1::SchedulerOutput next = Prefill(2, 9, {4, 5});
  next.add_finished_request_ids(7);
  ASSERT_TRUE(runner.Execute(next).ok());
  auto first = runner.Sample(SampleOf(1));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(first->request_ids(), ElementsAre(7));
  EXPECT_EQ(runner.num_live_requests(), 1u);
  EXPECT_THAT(runner.Tokens(9), ElementsAre(4, 5));  // 7's token is not 9's
  auto second = runner.Sample(SampleOf(2));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_THAT(runner.Tokens(9), ElementsAre(4, 5, second->sampled_token_ids(0)));
}

// Rows found by their position in the last step are checked by id: a row
// that left gives its slot to a newcomer, and the next step lists its rows
// in another order.
TEST(FakeStageRunnerTest, RowsInAnotherOrderFindTheirOwnState) {
  FakeStageRunner runner({});
  v1::SchedulerOutput first = Prefill(1, 7, {1, 2, 3});
  v1::SchedulerOutput eight = Prefill(1, 8, {4, 5, 6});
  *first.add_new_requests() = eight.new_requests(0);
  first.add_scheduled_request_ids(8);
  first.add_num_scheduled_tokens(3);
  ASSERT_TRUE(runner.Execute(first).ok());
  ASSERT_TRUE(runner.Sample(SampleOf(1)).ok());
  v1::SchedulerOutput second = Decode(2, 8, 3);  // 7 ends; 9 takes its slot
  second.add_finished_request_ids(7);
  v1::SchedulerOutput nine = Prefill(2, 9, {7, 8});
  *second.add_new_requests() = nine.new_requests(0);
  second.add_scheduled_request_ids(9);
  second.add_num_scheduled_tokens(2);
  ASSERT_TRUE(runner.Execute(second).ok());
  ASSERT_TRUE(runner.Sample(SampleOf(2)).ok());
  v1::SchedulerOutput third = Decode(3, 9, 2);  // 9 first now
  v1::SchedulerOutput then_eight = Decode(3, 8, 4);
  *third.mutable_cached_requests() = then_eight.cached_requests();
  third.mutable_cached_requests()->set_request_ids(0, 9);
  third.mutable_cached_requests()->set_num_computed_tokens(0, 2);
  third.mutable_cached_requests()->add_request_ids(8);
  third.mutable_cached_requests()->add_resumed(false);
  third.mutable_cached_requests()->add_num_computed_tokens(4);
  third.mutable_cached_requests()->add_num_new_block_ids(0);
  third.add_scheduled_request_ids(8);
  third.add_num_scheduled_tokens(1);
  const absl::Status executed = runner.Execute(third);
  ASSERT_TRUE(executed.ok()) << executed;
  auto out = runner.Sample(SampleOf(3));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(out->request_ids(), ElementsAre(9, 8));
  EXPECT_EQ(runner.Tokens(8).size(), 6u);
  EXPECT_EQ(runner.Tokens(9).size(), 4u);
}

TEST(FakeStageRunnerTest, RefusesStepsThatDisagree) {
  FakeStageRunner runner({});
  ASSERT_TRUE(runner.Execute(Prefill(1, 7, {1, 2, 3})).ok());
  // Decoding before the token exists: nothing sampled it yet.
  absl::Status early = runner.Execute(Decode(2, 7, 3));
  EXPECT_THAT(early.message(), HasSubstr("needs a token"));
  FakeStageRunner other({});
  ASSERT_TRUE(other.Execute(Prefill(1, 7, {1, 2, 3})).ok());
  ASSERT_TRUE(other.Sample(SampleOf(1)).ok());
  absl::Status wrong = other.Execute(Decode(2, 7, 2));
  EXPECT_THAT(wrong.message(), HasSubstr("the worker computed 3"));
  EXPECT_FALSE(other.Execute(Decode(3, 8, 3)).ok());  // unknown request
}

}  // namespace
}  // namespace tandem::worker
