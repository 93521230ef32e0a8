// FakeStageRunner (tandem-worker --fake-model): decode rows take the token
// the group sampled (never sent by the scheduler), through the worker-to-
// worker channel with two stages, and the tokens do not depend on the
// number of stages; a token sampled after its request ended reaches no other
// request; a step that disagrees with the runner's state is refused.
#include "worker/server/fake_stage_runner.h"

#include <algorithm>
#include <map>
#include <random>
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
    if (k < decodes) {
      EXPECT_TRUE(runner.Execute(Decode(2 + k, 7, 3 + k)).ok());
    }
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

// Runs one stage through `schedule` (the ids scheduled at each step, in
// order): a request's first step is its prefill (prompt {id, id + 1, id + 2}),
// later ones decode, and a request is finished at the first step after its
// last. Returns each request's sampled tokens.
std::map<int64_t, std::vector<int32_t>> RunSchedule(const std::vector<std::vector<int64_t>>& schedule) {
  std::map<int64_t, int> last_step;
  for (size_t k = 0; k < schedule.size(); ++k) {
    for (int64_t id : schedule[k]) last_step[id] = static_cast<int>(k);
  }
  FakeStageRunner runner({});
  std::map<int64_t, int32_t> computed;
  std::map<int64_t, std::vector<int32_t>> sampled;
  for (size_t k = 0; k < schedule.size(); ++k) {
    v1::SchedulerOutput step;
    step.set_step_seq(k + 1);
    for (const auto& [id, last] : last_step) {
      if (last + 1 == static_cast<int>(k)) step.add_finished_request_ids(id);
    }
    v1::CachedRequests* cached = step.mutable_cached_requests();
    for (int64_t id : schedule[k]) {
      const auto it = computed.find(id);
      if (it == computed.end()) {
        const std::vector<int32_t> prompt = {static_cast<int32_t>(id), static_cast<int32_t>(id + 1),
                                             static_cast<int32_t>(id + 2)};
        *step.add_new_requests() = Prefill(k + 1, id, prompt).new_requests(0);
        step.add_num_scheduled_tokens(3);
        computed[id] = 3;
      } else {
        cached->add_request_ids(id);
        cached->add_resumed(false);
        cached->add_num_computed_tokens(it->second);
        cached->add_num_new_block_ids(0);
        step.add_num_scheduled_tokens(1);
        ++it->second;
      }
      step.add_scheduled_request_ids(id);
    }
    const absl::Status executed = runner.Execute(step);
    EXPECT_TRUE(executed.ok()) << "step " << k + 1 << ": " << executed;
    auto out = runner.Sample(SampleOf(k + 1));
    EXPECT_TRUE(out.ok()) << out.status();
    if (!out.ok()) break;
    for (int i = 0; i < out->request_ids_size(); ++i) {
      sampled[out->request_ids(i)].push_back(out->sampled_token_ids(i));
    }
  }
  return sampled;
}

// A step's slots are guessed from the last step's order and checked by id:
// with the rows shuffled every step, one request leaving (its slot taken by
// a newcomer) and one joining, every request samples exactly what it samples
// alone.
TEST(FakeStageRunnerTest, ShuffledRowsSampleWhatEachRequestSamplesAlone) {
  std::mt19937 rng(13);
  std::vector<int64_t> ids = {10, 20, 30, 40, 50, 60};
  std::vector<std::vector<int64_t>> schedule;
  for (int k = 0; k < 12; ++k) {
    if (k == 5) ids.erase(std::find(ids.begin(), ids.end(), 30));
    if (k == 6) ids.push_back(70);
    if (k % 3 != 2) std::shuffle(ids.begin(), ids.end(), rng);  // else the same order as the step before
    schedule.push_back(ids);
  }
  const std::map<int64_t, std::vector<int32_t>> together = RunSchedule(schedule);
  ASSERT_EQ(together.size(), 7u);
  for (const auto& [id, tokens] : together) {
    const std::vector<std::vector<int64_t>> alone(tokens.size(), std::vector<int64_t>{id});
    EXPECT_EQ(RunSchedule(alone).at(id), tokens) << "request " << id;
  }
  EXPECT_EQ(together.at(30).size(), 5u);
  EXPECT_EQ(together.at(70).size(), 6u);
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
