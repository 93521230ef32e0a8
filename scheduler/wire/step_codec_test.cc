// The step protocol codec (scheduler/README.md §3): round trips of real
// scheduler outputs, the "no token ids for running requests" rule as it
// appears on the wire, and rejection of malformed peer messages.
#include "scheduler/wire/step_codec.h"

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/core/engine_core.h"
#include "scheduler/testing/invariant_checker.h"
#include "scheduler/testing/scheduler_test_util.h"

namespace tandem::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using testing::MakeRequest;
using testing::MakeScheduler;
using testing::Update;
using testing::VllmTestConfig;

void ExpectSameSampling(const SamplingParams& a, const SamplingParams& b) {
  EXPECT_EQ(a.max_tokens, b.max_tokens);
  EXPECT_EQ(a.min_tokens, b.min_tokens);
  EXPECT_EQ(a.eos_token_id, b.eos_token_id);
  EXPECT_EQ(a.ignore_eos, b.ignore_eos);
  EXPECT_EQ(a.stop_token_ids, b.stop_token_ids);
  EXPECT_EQ(a.temperature, b.temperature);
  EXPECT_EQ(a.top_p, b.top_p);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.min_p, b.min_p);
  EXPECT_EQ(a.presence_penalty, b.presence_penalty);
  EXPECT_EQ(a.frequency_penalty, b.frequency_penalty);
  EXPECT_EQ(a.repetition_penalty, b.repetition_penalty);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.logprobs, b.logprobs);
}

// Everything that travels; `samples` and `step_index` do not (the worker
// derives the first, the second is the engine's own counter).
void ExpectSameStep(const SchedulerOutput& got, const SchedulerOutput& want) {
  EXPECT_EQ(got.step_seq, want.step_seq);
  ASSERT_EQ(got.new_requests.size(), want.new_requests.size());
  for (size_t i = 0; i < want.new_requests.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "new request " << i);
    const NewRequestData& g = got.new_requests[i];
    const NewRequestData& w = want.new_requests[i];
    EXPECT_EQ(g.id, w.id);
    EXPECT_EQ(g.prompt_token_ids, w.prompt_token_ids);
    ExpectSameSampling(g.sampling, w.sampling);
    EXPECT_EQ(g.structured_output, w.structured_output);
    EXPECT_EQ(g.block_ids, w.block_ids);
    EXPECT_EQ(g.num_computed_tokens, w.num_computed_tokens);
  }
  EXPECT_EQ(got.cached.request_ids, want.cached.request_ids);
  EXPECT_EQ(got.cached.resumed, want.cached.resumed);
  EXPECT_EQ(got.cached.num_computed_tokens, want.cached.num_computed_tokens);
  EXPECT_EQ(got.cached.new_block_offsets, want.cached.new_block_offsets);
  EXPECT_EQ(got.cached.new_block_ids, want.cached.new_block_ids);
  ASSERT_EQ(got.cached.resumed_requests.size(), want.cached.resumed_requests.size());
  for (size_t i = 0; i < want.cached.resumed_requests.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "resumed request " << i);
    const auto& g = got.cached.resumed_requests[i];
    const auto& w = want.cached.resumed_requests[i];
    EXPECT_EQ(g.token_ids, w.token_ids);
    EXPECT_EQ(g.num_prompt_tokens, w.num_prompt_tokens);
    ExpectSameSampling(g.sampling, w.sampling);
    EXPECT_EQ(g.structured_output, w.structured_output);
  }
  ASSERT_EQ(got.scheduled.size(), want.scheduled.size());
  for (size_t i = 0; i < want.scheduled.size(); ++i) {
    EXPECT_EQ(got.scheduled[i].id, want.scheduled[i].id);
    EXPECT_EQ(got.scheduled[i].num_tokens, want.scheduled[i].num_tokens);
  }
  EXPECT_EQ(got.total_num_scheduled_tokens, want.total_num_scheduled_tokens);
  EXPECT_EQ(got.finished_request_ids, want.finished_request_ids);
  EXPECT_EQ(got.preempted_request_ids, want.preempted_request_ids);
  EXPECT_EQ(got.has_structured_output_requests, want.has_structured_output_requests);
  EXPECT_EQ(got.pending_structured_output_tokens, want.pending_structured_output_tokens);
}

// Encodes, decodes, compares, and checks that re-encoding is byte-identical.
v1::SchedulerOutput RoundTrip(const SchedulerOutput& step) {
  v1::SchedulerOutput wire;
  EncodeSchedulerOutput(step, &wire);
  auto decoded = DecodeSchedulerOutput(wire);
  EXPECT_TRUE(decoded.ok()) << decoded.status();
  if (!decoded.ok()) return wire;
  ExpectSameStep(*decoded, step);
  v1::SchedulerOutput again;
  EncodeSchedulerOutput(*decoded, &again);
  EXPECT_EQ(again.SerializeAsString(), wire.SerializeAsString());
  return wire;
}

// Three real steps of a synchronous scheduler with 5 usable blocks:
//   s1: requests 0 (8 tokens), 1 (32, max 2), 2 (32) are new; the pool is full;
//   s2: 0 and 1 decode, 1 needs a block, 2 is preempted;
//   s3: 0 decodes, 2 is resumed with its 33 committed tokens, 3 is new.
class StepCodecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineConfig config = VllmTestConfig(/*async_scheduling=*/false);
    config.num_kv_blocks = 6;
    config.max_model_len = 64;
    scheduler_ = MakeScheduler(config);
    ASSERT_NE(scheduler_, nullptr);
    ASSERT_TRUE(scheduler_->AddRequest(MakeRequest(0, 8, 20)).ok());
    ASSERT_TRUE(scheduler_->AddRequest(MakeRequest(1, 32, 2)).ok());
    ASSERT_TRUE(scheduler_->AddRequest(MakeRequest(2, 32, 8)).ok());
    s1_ = ScheduleChecked();
    UpdateChecked(s1_);
    s2_ = ScheduleChecked();
    UpdateChecked(s2_);
    RequestSpec d = MakeRequest(3, 5, 3);
    d.sampling.temperature = 0.5f;
    d.sampling.top_p = 0.9f;
    d.sampling.top_k = 40;
    d.sampling.min_p = 0.05f;
    d.sampling.presence_penalty = 0.25f;
    d.sampling.frequency_penalty = -0.5f;
    d.sampling.repetition_penalty = 1.125f;
    d.sampling.seed = 1234;
    d.sampling.logprobs = 3;
    d.sampling.stop_token_ids = {42, 43};
    d.sampling.min_tokens = 1;
    d.sampling.ignore_eos = true;
    d_sampling_ = d.sampling;
    ASSERT_TRUE(scheduler_->AddRequest(std::move(d)).ok());
    s3_ = ScheduleChecked();
  }

  SchedulerOutput ScheduleChecked() {
    SchedulerOutput step = scheduler_->Schedule();
    std::deque<SchedulerOutput> in_flight;
    if (!step.empty()) in_flight.push_back(step);
    const absl::Status status = InvariantChecker::Check(*scheduler_, in_flight);
    EXPECT_TRUE(status.ok()) << status;
    return step;
  }
  void UpdateChecked(const SchedulerOutput& step) {
    Update(*scheduler_, step, [](RequestId id, size_t row) { return static_cast<TokenId>(100 + id); });
    const absl::Status status = InvariantChecker::Check(*scheduler_, {});
    EXPECT_TRUE(status.ok()) << status;
  }

  std::unique_ptr<Scheduler> scheduler_;
  SchedulerOutput s1_, s2_, s3_;
  SamplingParams d_sampling_;
};

TEST_F(StepCodecTest, TheScenarioIsWhatItClaims) {
  EXPECT_EQ(s1_.new_requests.size(), 3u);
  EXPECT_EQ(s2_.cached.request_ids, (std::vector<RequestId>{0, 1}));
  EXPECT_THAT(s2_.cached.resumed, ElementsAre(0, 0));
  EXPECT_EQ(s2_.preempted_request_ids, std::vector<RequestId>{2});
  EXPECT_EQ(s3_.cached.request_ids, (std::vector<RequestId>{0, 2}));
  EXPECT_THAT(s3_.cached.resumed, ElementsAre(0, 1));
  ASSERT_EQ(s3_.new_requests.size(), 1u);
  EXPECT_EQ(s3_.new_requests[0].id, 3);
  EXPECT_EQ(s3_.finished_request_ids, std::vector<RequestId>{1});
}

TEST_F(StepCodecTest, NewRequestsRoundTripAndCarryOnlyTheirPrompt) {
  const v1::SchedulerOutput wire = RoundTrip(s1_);
  ASSERT_EQ(wire.new_requests_size(), 3);
  EXPECT_THAT(wire.new_requests(0).prompt_token_ids(), ElementsAreArray(std::vector<TokenId>(8, 0)));
  EXPECT_THAT(wire.new_requests(1).prompt_token_ids(), ElementsAreArray(std::vector<TokenId>(32, 1)));
  EXPECT_EQ(wire.cached_requests().request_ids_size(), 0);
  EXPECT_EQ(wire.cached_requests().resumed_token_ids_size(), 0);
}

TEST_F(StepCodecTest, RunningDecodesCarryNoTokenIds) {
  const v1::SchedulerOutput wire = RoundTrip(s2_);
  const v1::CachedRequests& c = wire.cached_requests();
  EXPECT_THAT(c.request_ids(), ElementsAre(0, 1));
  EXPECT_THAT(c.resumed(), ElementsAre(false, false));
  EXPECT_EQ(wire.new_requests_size(), 0);
  EXPECT_EQ(c.resumed_token_ids_size(), 0);  // the workers feed their own sampled tokens
  EXPECT_EQ(c.resumed_sampling_size(), 0);
  EXPECT_EQ(c.resumed_num_prompt_tokens_size(), 0);
  EXPECT_THAT(c.num_new_block_ids(), ElementsAre(0, 1));  // request 1 crossed into block 3
  EXPECT_THAT(wire.preempted_request_ids(), ElementsAre(2));
}

TEST_F(StepCodecTest, ResumedRequestCarriesItsCommittedTokensAndOthersDoNot) {
  const v1::SchedulerOutput wire = RoundTrip(s3_);
  const v1::CachedRequests& c = wire.cached_requests();
  ASSERT_THAT(c.resumed(), ElementsAre(false, true));
  // Exactly one token list per resumed flag: nothing for running request 0.
  ASSERT_EQ(c.resumed_token_ids_size(), 1);
  std::vector<TokenId> committed(32, 2);
  committed.push_back(102);  // its one output before the preemption
  EXPECT_THAT(c.resumed_token_ids(0).token_ids(), ElementsAreArray(committed));
  EXPECT_THAT(c.resumed_num_prompt_tokens(), ElementsAre(32));
  EXPECT_EQ(c.resumed_sampling_size(), 1);
  EXPECT_THAT(c.num_new_block_ids(), ElementsAre(0, 3));  // a resumed request gets a whole table
  // The new request carries its 5-token prompt and nothing else.
  ASSERT_EQ(wire.new_requests_size(), 1);
  EXPECT_THAT(wire.new_requests(0).prompt_token_ids(), ElementsAre(3, 3, 3, 3, 3));
  EXPECT_THAT(wire.scheduled_request_ids(), ElementsAre(0, 2, 3));
  EXPECT_THAT(wire.num_scheduled_tokens(), ElementsAre(1, 33, 5));
  EXPECT_THAT(wire.finished_request_ids(), ElementsAre(1));
  // Sampling parameters survive the trip field by field.
  auto decoded = DecodeSchedulerOutput(wire);
  ASSERT_TRUE(decoded.ok());
  ExpectSameSampling(decoded->new_requests[0].sampling, d_sampling_);
  EXPECT_FALSE(decoded->cached.resumed_requests[0].sampling.seed.has_value());
}

// Malformed messages from a peer are errors, not crashes.
class MalformedStepTest : public StepCodecTest {
 protected:
  void ExpectRejected(const std::function<void(v1::SchedulerOutput&)>& mutate, const std::string& name) {
    SCOPED_TRACE(name);
    v1::SchedulerOutput wire;
    EncodeSchedulerOutput(s3_, &wire);
    ASSERT_TRUE(DecodeSchedulerOutput(wire).ok());
    mutate(wire);
    auto decoded = DecodeSchedulerOutput(wire);
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument) << decoded.status();
  }
};

TEST_F(MalformedStepTest, ParallelListsOfDifferentLengths) {
  using W = v1::SchedulerOutput;
  ExpectRejected([](W& w) { w.mutable_cached_requests()->mutable_resumed()->RemoveLast(); }, "resumed short");
  ExpectRejected([](W& w) { w.mutable_cached_requests()->add_num_computed_tokens(0); }, "computed long");
  ExpectRejected([](W& w) { w.mutable_cached_requests()->add_num_new_block_ids(0); }, "block counts long");
  ExpectRejected([](W& w) { w.mutable_cached_requests()->add_request_ids(9); }, "ids long");
  ExpectRejected([](W& w) { w.mutable_cached_requests()->clear_resumed_token_ids(); }, "no resumed tokens");
  ExpectRejected([](W& w) { w.mutable_cached_requests()->add_resumed_token_ids(); }, "extra resumed tokens");
  ExpectRejected([](W& w) { w.mutable_cached_requests()->clear_resumed_sampling(); }, "no resumed sampling");
  ExpectRejected([](W& w) { w.mutable_cached_requests()->clear_resumed_num_prompt_tokens(); },
                 "no resumed prompt length");
  ExpectRejected([](W& w) { w.add_num_scheduled_tokens(1); }, "scheduled counts long");
  ExpectRejected([](W& w) { w.mutable_scheduled_request_ids()->RemoveLast(); }, "scheduled ids short");
}

TEST_F(MalformedStepTest, BlockCountsThatDoNotAddUp) {
  using W = v1::SchedulerOutput;
  ExpectRejected([](W& w) { w.mutable_cached_requests()->set_num_new_block_ids(1, 4); }, "count too high");
  ExpectRejected([](W& w) { w.mutable_cached_requests()->set_num_new_block_ids(1, 2); }, "count too low");
  ExpectRejected([](W& w) { w.mutable_cached_requests()->add_new_block_ids(5); }, "extra block id");
}

TEST_F(MalformedStepTest, NegativeOrZeroCounts) {
  using W = v1::SchedulerOutput;
  // -1 + 4 still adds up to the 3 block ids: only the sign is wrong.
  ExpectRejected(
      [](W& w) {
        w.mutable_cached_requests()->set_num_new_block_ids(0, -1);
        w.mutable_cached_requests()->set_num_new_block_ids(1, 4);
      },
      "negative block count");
  ExpectRejected([](W& w) { w.set_num_scheduled_tokens(0, 0); }, "zero scheduled tokens");
  ExpectRejected([](W& w) { w.set_num_scheduled_tokens(2, -5); }, "negative scheduled tokens");
}

// Token counts a worker would index with: a negative one from a peer must be
// refused like the other counts (step_codec.h: "validates ... counts").
TEST_F(MalformedStepTest, NegativeTokenCounts) {
  using W = v1::SchedulerOutput;
  ExpectRejected([](W& w) { w.mutable_cached_requests()->set_num_computed_tokens(0, -1); },
                 "negative num_computed_tokens of a cached request");
  ExpectRejected([](W& w) { w.mutable_new_requests(0)->set_num_computed_tokens(-16); },
                 "negative num_computed_tokens of a new request");
  ExpectRejected([](W& w) { w.mutable_cached_requests()->set_resumed_num_prompt_tokens(0, -1); },
                 "negative resumed prompt length");
}

TEST(GrammarCodecTest, SampleCommandRoundTrip) {
  class AllowSome : public Grammar {
   public:
    bool AcceptTokens(absl::Span<const TokenId>) override { return true; }
    void FillBitmask(absl::Span<uint32_t> row, int32_t) const override {
      for (TokenId t : {3, 7, 64, 99}) row[t / 32] |= 1u << (t % 32);
    }
  };
  EngineConfig config = VllmTestConfig();
  config.vocab_size = 100;
  auto scheduler = MakeScheduler(config);
  ASSERT_TRUE(scheduler->AddRequest(MakeRequest(0)).ok());
  RequestSpec structured = MakeRequest(1);
  structured.grammar = std::make_unique<AllowSome>();
  ASSERT_TRUE(scheduler->AddRequest(std::move(structured)).ok());
  const SchedulerOutput step = scheduler->Schedule();
  const GrammarOutput grammar = scheduler->GetGrammarBitmask(step);
  ASSERT_THAT(grammar.request_ids, ElementsAre(1));
  ASSERT_EQ(grammar.words_per_row, 4);
  EXPECT_THAT(grammar.bitmask, ElementsAre((1u << 3) | (1u << 7), 0u, 1u, 1u << 3));

  v1::SampleCommand command;
  EncodeSampleCommand(step.step_seq, &grammar, &command);
  EXPECT_EQ(command.step_seq(), step.step_seq);
  auto decoded = DecodeGrammar(command.grammar());
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->request_ids, grammar.request_ids);
  EXPECT_EQ(decoded->words_per_row, grammar.words_per_row);
  EXPECT_EQ(decoded->bitmask, grammar.bitmask);

  // The structured-output flag travels with the request's sampling params.
  auto decoded_step = DecodeSchedulerOutput([&] {
    v1::SchedulerOutput wire;
    EncodeSchedulerOutput(step, &wire);
    return wire;
  }());
  ASSERT_TRUE(decoded_step.ok());
  ASSERT_EQ(decoded_step->new_requests.size(), 2u);
  EXPECT_FALSE(decoded_step->new_requests[0].structured_output);
  EXPECT_TRUE(decoded_step->new_requests[1].structured_output);
  EXPECT_TRUE(decoded_step->has_structured_output_requests);

  v1::SampleCommand plain;
  EncodeSampleCommand(7, nullptr, &plain);
  EXPECT_EQ(plain.step_seq(), 7u);
  EXPECT_FALSE(plain.has_grammar());
}

TEST(GrammarCodecTest, MalformedBitmaskIsRejected) {
  v1::GrammarBitmask wire;
  wire.add_request_ids(1);
  wire.set_words_per_row(2);
  wire.add_bitmask(1);
  wire.add_bitmask(2);
  ASSERT_TRUE(DecodeGrammar(wire).ok());
  wire.add_bitmask(3);
  EXPECT_EQ(DecodeGrammar(wire).status().code(), absl::StatusCode::kInvalidArgument);

  v1::GrammarBitmask negative;
  negative.set_words_per_row(-1);  // 0 rows * -1 words "adds up": only the sign is wrong
  EXPECT_EQ(DecodeGrammar(negative).status().code(), absl::StatusCode::kInvalidArgument);
}

// A prefill-chunk row (no token) next to a sampling row, from a real step.
SchedulerOutput ChunkedStep(Scheduler& scheduler) {
  EXPECT_TRUE(scheduler.AddRequest(MakeRequest(0, 40, 4)).ok());
  EXPECT_TRUE(scheduler.AddRequest(MakeRequest(1, 10, 4)).ok());
  return scheduler.Schedule();
}

EngineConfig ChunkingConfig() {
  EngineConfig config = VllmTestConfig();
  config.long_prefill_token_threshold = 16;
  return config;
}

TEST(RunnerOutputCodecTest, RoundTrip) {
  auto scheduler = MakeScheduler(ChunkingConfig());
  const SchedulerOutput step = ChunkedStep(*scheduler);
  ASSERT_EQ(step.scheduled.size(), 2u);
  ASSERT_FALSE(step.scheduled[0].samples);  // 16 of 40 tokens
  ASSERT_TRUE(step.scheduled[1].samples);
  const ModelRunnerOutput output = testing::FakeOutput(step);

  v1::ModelRunnerOutput wire;
  EncodeRunnerOutput(output, &wire);
  EXPECT_THAT(wire.num_sampled(), ElementsAre(0, 1));
  auto decoded = DecodeRunnerOutput(wire);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->step_seq, output.step_seq);
  EXPECT_EQ(decoded->request_ids, output.request_ids);
  EXPECT_EQ(decoded->sampled_offsets, output.sampled_offsets);
  EXPECT_EQ(decoded->sampled_token_ids, output.sampled_token_ids);
  EXPECT_TRUE(ValidateRunnerOutput(step, *decoded).ok());

  // Several tokens in one row (speculative decoding) keep their boundaries.
  ModelRunnerOutput multi;
  multi.step_seq = 9;
  multi.AddRow(4, {1, 2, 3});
  multi.AddRow(5, {});
  multi.AddRow(6, {7});
  v1::ModelRunnerOutput multi_wire;
  EncodeRunnerOutput(multi, &multi_wire);
  auto multi_decoded = DecodeRunnerOutput(multi_wire);
  ASSERT_TRUE(multi_decoded.ok());
  EXPECT_THAT(multi_decoded->Sampled(0), ElementsAre(1, 2, 3));
  EXPECT_THAT(multi_decoded->Sampled(1), ElementsAre());
  EXPECT_THAT(multi_decoded->Sampled(2), ElementsAre(7));
}

TEST(RunnerOutputCodecTest, MalformedIsRejected) {
  auto scheduler = MakeScheduler(ChunkingConfig());
  const SchedulerOutput step = ChunkedStep(*scheduler);
  v1::ModelRunnerOutput base;
  EncodeRunnerOutput(testing::FakeOutput(step), &base);
  ASSERT_TRUE(DecodeRunnerOutput(base).ok());

  auto expect_rejected = [&](const std::function<void(v1::ModelRunnerOutput&)>& mutate, const char* name) {
    v1::ModelRunnerOutput wire = base;
    mutate(wire);
    EXPECT_EQ(DecodeRunnerOutput(wire).status().code(), absl::StatusCode::kInvalidArgument) << name;
  };
  expect_rejected([](v1::ModelRunnerOutput& w) { w.add_num_sampled(0); }, "counts longer than ids");
  expect_rejected([](v1::ModelRunnerOutput& w) { w.mutable_request_ids()->RemoveLast(); }, "ids shorter");
  expect_rejected([](v1::ModelRunnerOutput& w) { w.add_sampled_token_ids(5); }, "counts do not add up");
  expect_rejected([](v1::ModelRunnerOutput& w) { w.set_num_sampled(1, 2); }, "counts exceed the tokens");
  expect_rejected(
      [](v1::ModelRunnerOutput& w) {
        w.set_num_sampled(0, -1);  // -1 + 2 = 1 token: adds up, but negative
        w.set_num_sampled(1, 2);
      },
      "negative count");
}

TEST(RunnerOutputCodecTest, LogprobsRoundTrip) {
  ModelRunnerOutput output;
  output.step_seq = 3;
  output.AddRow(4, {});  // a prefill chunk
  output.AddRow(5, {9});  // did not ask
  EXPECT_FALSE(output.has_logprobs());
  output.AddRow(6, {7, 8});
  const std::vector<TokenId> top_ids_a = {7, 1, 2};
  const std::vector<float> top_a = {-0.5f, -1.5f, -2.5f};
  output.AddLogprob(-0.5f, top_ids_a, top_a);
  const std::vector<TokenId> top_ids_b = {3, 8, 4};
  const std::vector<float> top_b = {-0.25f, -0.75f, -3.0f};
  output.AddLogprob(-0.75f, top_ids_b, top_b);
  output.AddRow(7, {11});
  output.AddLogprob(-2.0f, {}, {});  // logprobs = 0: the sampled token's only
  output.AddRow(8, {12});            // did not ask
  ASSERT_TRUE(output.has_logprobs());
  EXPECT_THAT(output.logprob_offsets, ElementsAre(0, 0, 0, 2, 3, 3));

  v1::ModelRunnerOutput wire;
  EncodeRunnerOutput(output, &wire);
  ASSERT_EQ(wire.logprobs_size(), 5);
  EXPECT_EQ(wire.logprobs(1).sampled_logprobs_size(), 0);
  EXPECT_THAT(wire.logprobs(2).sampled_logprobs(), ElementsAre(-0.5f, -0.75f));
  EXPECT_THAT(wire.logprobs(2).top_token_ids(), ElementsAre(7, 1, 2, 3, 8, 4));
  auto decoded = DecodeRunnerOutput(wire);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->logprob_offsets, output.logprob_offsets);
  EXPECT_EQ(decoded->sampled_logprobs, output.sampled_logprobs);
  EXPECT_EQ(decoded->top_offsets, output.top_offsets);
  EXPECT_EQ(decoded->top_token_ids, output.top_token_ids);
  EXPECT_EQ(decoded->top_logprobs, output.top_logprobs);
  EXPECT_EQ(decoded->NumLogprobs(2), 2u);
  EXPECT_THAT(decoded->TopIds(1), ElementsAre(3, 8, 4));
  EXPECT_THAT(decoded->TopLogprobs(1), ElementsAre(-0.25f, -0.75f, -3.0f));
  EXPECT_THAT(decoded->TopIds(2), ElementsAre());
  EXPECT_EQ(decoded->NumLogprobs(4), 0u);

  // Without logprobs nothing travels and nothing is allocated.
  ModelRunnerOutput plain;
  plain.AddRow(1, {2});
  v1::ModelRunnerOutput plain_wire;
  EncodeRunnerOutput(plain, &plain_wire);
  EXPECT_EQ(plain_wire.logprobs_size(), 0);
  auto plain_decoded = DecodeRunnerOutput(plain_wire);
  ASSERT_TRUE(plain_decoded.ok());
  EXPECT_FALSE(plain_decoded->has_logprobs());
  EXPECT_EQ(plain_decoded->top_offsets.capacity(), 0u);
  // Entries for rows that sampled nothing with logprobs decode to the lean form.
  plain_wire.add_logprobs();
  plain_decoded = DecodeRunnerOutput(plain_wire);
  ASSERT_TRUE(plain_decoded.ok());
  EXPECT_FALSE(plain_decoded->has_logprobs());
}

TEST(RunnerOutputCodecTest, MalformedLogprobsAreRejected) {
  ModelRunnerOutput output;
  output.AddRow(5, {9});
  output.AddRow(6, {7});
  const std::vector<TokenId> top_ids = {7, 1};
  const std::vector<float> top = {-0.5f, -1.5f};
  output.AddLogprob(-0.5f, top_ids, top);
  v1::ModelRunnerOutput base;
  EncodeRunnerOutput(output, &base);
  ASSERT_TRUE(DecodeRunnerOutput(base).ok());

  auto expect_rejected = [&](const std::function<void(v1::ModelRunnerOutput&)>& mutate, const char* name) {
    v1::ModelRunnerOutput wire = base;
    mutate(wire);
    EXPECT_EQ(DecodeRunnerOutput(wire).status().code(), absl::StatusCode::kInvalidArgument) << name;
  };
  expect_rejected([](v1::ModelRunnerOutput& w) { w.add_logprobs(); }, "more logprob rows than rows");
  expect_rejected([](v1::ModelRunnerOutput& w) { w.mutable_logprobs()->RemoveLast(); }, "fewer logprob rows");
  expect_rejected([](v1::ModelRunnerOutput& w) { w.mutable_logprobs(1)->add_sampled_logprobs(-1.0f); },
                  "more logprobs than sampled tokens");
  expect_rejected([](v1::ModelRunnerOutput& w) { w.mutable_logprobs(1)->add_top_token_ids(3); },
                  "top ids and logprobs differ");
  expect_rejected(
      [](v1::ModelRunnerOutput& w) {
        w.mutable_logprobs(0)->add_top_token_ids(3);
        w.mutable_logprobs(0)->add_top_logprobs(-1.0f);
      },
      "top entries without a sampled logprob");
  expect_rejected(
      [](v1::ModelRunnerOutput& w) {
        w.set_num_sampled(1, 2);
        w.add_sampled_token_ids(4);
        w.mutable_logprobs(1)->add_sampled_logprobs(-1.0f);
        w.mutable_logprobs(1)->add_top_token_ids(3);
        w.mutable_logprobs(1)->add_top_logprobs(-1.0f);  // 3 top entries for 2 tokens
      },
      "top entries that do not divide among the tokens");
}

}  // namespace
}  // namespace tandem::scheduler
