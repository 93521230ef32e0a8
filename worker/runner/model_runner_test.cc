// ModelRunner against hand-written step messages: logprobs and grammar masks
// reach the output, and a step that disagrees with the worker's state is
// refused rather than trusted.
#include "worker/runner/model_runner.h"

#include <cmath>

#include "common/gguf/random_llama.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backends/cpu/cpu_backend.h"

namespace tandem::worker {
namespace {

using ::testing::HasSubstr;

class ModelRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gguf::RandomLlamaOptions options;
    options.weight_scale = 0.2;
    auto file = gguf::MakeRandomLlamaFile(options);
    ASSERT_TRUE(file.ok());
    file_ = std::move(file).value();
    auto config = gguf::ReadLlamaConfig(*file_);
    ASSERT_TRUE(config.ok());
    auto model = LlamaModel::Load(*file_, *config, &backend_, {});
    ASSERT_TRUE(model.ok());
    model_ = std::move(model).value();
    ASSERT_TRUE(model_->AllocateKvCache(16, 16).ok());
    runner_ = std::make_unique<ModelRunner>(&backend_, model_.get(), ModelRunnerOptions{16, 1});
  }

  // Step 1 of request 7: a 5-token prompt in block 3, sampling one token.
  static v1::SchedulerOutput NewRequestStep(int32_t logprobs) {
    v1::SchedulerOutput step;
    step.set_step_seq(1);
    v1::NewRequest* r = step.add_new_requests();
    r->set_request_id(7);
    for (int t : {10, 20, 30, 40, 50}) r->add_prompt_token_ids(t);
    r->mutable_sampling()->set_temperature(0.0f);
    r->mutable_sampling()->set_logprobs(logprobs);
    r->add_block_ids(3);
    step.add_scheduled_request_ids(7);
    step.add_num_scheduled_tokens(5);
    return step;
  }

  CpuBackend backend_{2};
  std::unique_ptr<gguf::GgufFile> file_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<ModelRunner> runner_;
};

TEST_F(ModelRunnerTest, LogprobsReachTheOutput) {
  ASSERT_TRUE(runner_->Execute(NewRequestStep(3)).ok());
  v1::SampleCommand sample;
  sample.set_step_seq(1);
  ASSERT_TRUE(runner_->Sample(sample).ok());
  auto out = runner_->CollectOutput(1);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->sampled_token_ids_size(), 1);
  ASSERT_EQ(out->logprobs_size(), 1);
  const v1::TokenLogprobs& lp = out->logprobs(0);
  ASSERT_EQ(lp.sampled_logprobs_size(), 1);
  ASSERT_EQ(lp.top_token_ids_size(), 3);
  // Greedy: the sampled token is the most likely one.
  EXPECT_EQ(lp.top_token_ids(0), out->sampled_token_ids(0));
  EXPECT_FLOAT_EQ(lp.top_logprobs(0), lp.sampled_logprobs(0));
  EXPECT_LE(lp.sampled_logprobs(0), 0.0f);
  EXPECT_GE(lp.top_logprobs(0), lp.top_logprobs(1));
  EXPECT_EQ(runner_->HostTokens(7).size(), 6u);
}

TEST_F(ModelRunnerTest, GrammarMaskIsApplied) {
  ASSERT_TRUE(runner_->Execute(NewRequestStep(-1)).ok());
  v1::SampleCommand sample;
  sample.set_step_seq(1);
  v1::GrammarBitmask* grammar = sample.mutable_grammar();
  grammar->add_request_ids(7);
  const int32_t words = (model_->config().vocab_size + 31) / 32;
  grammar->set_words_per_row(words);
  for (int32_t w = 0; w < words; ++w) grammar->add_bitmask(w == 1 ? (1u << 5) : 0u);  // only token 37
  ASSERT_TRUE(runner_->Sample(sample).ok());
  auto out = runner_->CollectOutput(1);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->sampled_token_ids(0), 37);
}

// Runs request 7 greedily for two tokens (prompt step, then one decode
// step with the placeholder) with `sampling` added; the tokens.
std::vector<TokenId> TwoGreedyTokens(ModelRunner& runner, const v1::SamplingParams& sampling,
                                     v1::SchedulerOutput first) {
  first.mutable_new_requests(0)->mutable_sampling()->MergeFrom(sampling);
  std::vector<TokenId> tokens;
  v1::SchedulerOutput second;
  second.set_step_seq(2);
  v1::CachedRequests* cached = second.mutable_cached_requests();
  cached->add_request_ids(7);
  cached->add_resumed(false);
  cached->add_num_computed_tokens(5);
  cached->add_num_new_block_ids(0);
  second.add_scheduled_request_ids(7);
  second.add_num_scheduled_tokens(1);
  for (const v1::SchedulerOutput* step : {&first, &second}) {
    EXPECT_TRUE(runner.Execute(*step).ok());
    v1::SampleCommand sample;
    sample.set_step_seq(step->step_seq());
    EXPECT_TRUE(runner.Sample(sample).ok());
    auto out = runner.CollectOutput(step->step_seq());
    EXPECT_TRUE(out.ok()) << out.status();
    if (out.ok() && out->sampled_token_ids_size() == 1) tokens.push_back(out->sampled_token_ids(0));
  }
  return tokens;
}

TEST_F(ModelRunnerTest, LogitBiasAndBadWordsChangeTheGreedyTokens) {
  const std::vector<TokenId> free = TwoGreedyTokens(*runner_, {}, NewRequestStep(-1));
  ASSERT_EQ(free.size(), 2u);

  // -100 on the first token: another one wins, and logprobs stay raw.
  v1::SamplingParams biased;
  biased.add_logit_bias_token_ids(free[0]);
  biased.add_logit_bias_values(-100.0f);
  ModelRunner with_bias(&backend_, model_.get(), ModelRunnerOptions{16, 1});
  EXPECT_NE(TwoGreedyTokens(with_bias, biased, NewRequestStep(-1))[0], free[0]);

  // The two tokens as one bad word: the first is allowed (nothing before
  // it), the second is banned once the first was generated.
  v1::SamplingParams bad;
  bad.add_bad_words_token_ids()->add_token_ids(free[0]);
  bad.mutable_bad_words_token_ids(0)->add_token_ids(free[1]);
  ModelRunner with_bad(&backend_, model_.get(), ModelRunnerOptions{16, 1});
  const std::vector<TokenId> banned = TwoGreedyTokens(with_bad, bad, NewRequestStep(-1));
  ASSERT_EQ(banned.size(), 2u);
  EXPECT_EQ(banned[0], free[0]);
  EXPECT_NE(banned[1], free[1]);

  // A token outside the vocabulary is the scheduler's bug: refused.
  v1::SchedulerOutput outside = NewRequestStep(-1);
  outside.mutable_new_requests(0)->mutable_sampling()->add_logit_bias_token_ids(model_->config().vocab_size);
  outside.mutable_new_requests(0)->mutable_sampling()->add_logit_bias_values(1.0f);
  ModelRunner fresh(&backend_, model_.get(), ModelRunnerOptions{16, 1});
  EXPECT_THAT(fresh.Execute(outside).message(), HasSubstr("outside the vocabulary"));
}

TEST(StepBiasesTest, BadWordsBanTheirLastTokenAfterTheirPrefix) {
  using Biases = std::vector<std::pair<TokenId, float>>;
  const float kBan = -INFINITY;
  const std::vector<std::vector<TokenId>> words = {{5}, {1, 2, 3}, {2, 9}};
  const std::vector<TokenId> output = {7, 1, 2};
  // {5} always; {1, 2, 3}: the output ends with 1, 2; {2, 9}: ends with 2.
  EXPECT_EQ(StepBiases({}, words, output.data(), 3), (Biases{{3, kBan}, {5, kBan}, {9, kBan}}));
  // Output 7, 1: only the one-token word ({2, 9} needs a 2 last).
  EXPECT_EQ(StepBiases({}, words, output.data(), 2), (Biases{{5, kBan}}));
  EXPECT_EQ(StepBiases({}, words, output.data(), 0), (Biases{{5, kBan}}));
  // A ban wins over a logit_bias of the same token; other biases stay.
  EXPECT_EQ(StepBiases({{3, 4.0f}, {8, -1.0f}}, words, output.data(), 3),
            (Biases{{3, kBan}, {5, kBan}, {8, -1.0f}, {9, kBan}}));
  EXPECT_EQ(StepBiases({{3, 4.0f}}, {}, output.data(), 3), (Biases{{3, 4.0f}}));
}

// Step `seq` of request `id` computing prompt positions [from, from + n)
// of `prompt` (new at from 0, cached after), with prompt_logprobs `k`.
v1::SchedulerOutput PromptChunk(uint64_t seq, int64_t id, const std::vector<TokenId>& prompt, int32_t from, int32_t n,
                                int32_t k) {
  v1::SchedulerOutput step;
  step.set_step_seq(seq);
  if (from == 0) {
    v1::NewRequest* r = step.add_new_requests();
    r->set_request_id(id);
    r->mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
    r->mutable_sampling()->set_temperature(0.0f);
    if (k >= 0) r->mutable_sampling()->set_prompt_logprobs(k);
    r->mutable_sampling()->set_logprobs(k < 0 ? 4096 : -1);
    r->add_block_ids(static_cast<int32_t>(2 + id));
  } else {
    v1::CachedRequests* cached = step.mutable_cached_requests();
    cached->add_request_ids(id);
    cached->add_resumed(false);
    cached->add_num_computed_tokens(from);
    cached->add_num_new_block_ids(0);
  }
  step.add_scheduled_request_ids(id);
  step.add_num_scheduled_tokens(n);
  return step;
}

v1::ModelRunnerOutput RunStep(ModelRunner& runner, const v1::SchedulerOutput& step) {
  EXPECT_TRUE(runner.Execute(step).ok());
  v1::SampleCommand sample;
  sample.set_step_seq(step.step_seq());
  EXPECT_TRUE(runner.Sample(sample).ok());
  auto out = runner.CollectOutput(step.step_seq());
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : v1::ModelRunnerOutput();
}

// Prompt logprobs against a reference: the log-softmax of the model's logits
// at the last position of each prefix, run as its own request (the sampler's
// raw logprobs over the whole vocabulary). The same float32 logits per row;
// only the log-sum-exp's summation order differs, so 1e-4 is generous.
TEST_F(ModelRunnerTest, PromptLogprobsMatchEachPrefixsLogSoftmax) {
  const std::vector<TokenId> prompt = {10, 20, 30, 40, 50, 60};
  const v1::ModelRunnerOutput whole = RunStep(*runner_, PromptChunk(1, 7, prompt, 0, 6, 3));
  ASSERT_EQ(whole.prompt_logprobs_size(), 1);
  const v1::PromptLogprobs& p = whole.prompt_logprobs(0);
  EXPECT_EQ(p.row(), 0);
  EXPECT_EQ(p.first_position(), 0);
  ASSERT_EQ(p.token_ids_size(), 5);
  EXPECT_EQ(p.num_top(), 3);
  ASSERT_EQ(p.top_token_ids_size(), 15);
  for (int32_t pos = 0; pos < 5; ++pos) {
    EXPECT_EQ(p.token_ids(pos), prompt[pos + 1]);
    ModelRunner alone(&backend_, model_.get(), ModelRunnerOptions{16, 1});
    const std::vector<TokenId> prefix(prompt.begin(), prompt.begin() + pos + 1);
    const v1::ModelRunnerOutput ref = RunStep(alone, PromptChunk(1, 9, prefix, 0, pos + 1, -1));
    ASSERT_EQ(ref.logprobs_size(), 1);
    const v1::TokenLogprobs& all = ref.logprobs(0);  // every token, most likely first
    int32_t rank = 0;
    for (int i = 0; i < all.top_token_ids_size(); ++i) {
      if (all.top_token_ids(i) != prompt[pos + 1]) continue;
      EXPECT_NEAR(p.logprobs(pos), all.top_logprobs(i), 1e-4) << "position " << pos;
      while (rank < all.top_token_ids_size() && all.top_logprobs(rank) > all.top_logprobs(i)) ++rank;
      EXPECT_EQ(p.ranks(pos), rank + 1) << "position " << pos;
    }
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(p.top_token_ids(pos * 3 + j), all.top_token_ids(j)) << "position " << pos;
      EXPECT_NEAR(p.top_logprobs(pos * 3 + j), all.top_logprobs(j), 1e-4) << "position " << pos;
    }
  }
  // Chunked prefill (4 + 2 positions): each chunk carries its own positions,
  // and together they equal the one-step scores.
  ModelRunner chunked(&backend_, model_.get(), ModelRunnerOptions{16, 1});
  const v1::ModelRunnerOutput first = RunStep(chunked, PromptChunk(1, 7, prompt, 0, 4, 3));
  const v1::ModelRunnerOutput second = RunStep(chunked, PromptChunk(2, 7, prompt, 4, 2, 3));
  ASSERT_EQ(first.prompt_logprobs_size(), 1);
  ASSERT_EQ(second.prompt_logprobs_size(), 1);
  EXPECT_EQ(first.sampled_token_ids_size(), 0);
  EXPECT_EQ(second.sampled_token_ids_size(), 1);
  EXPECT_EQ(first.prompt_logprobs(0).first_position(), 0);
  EXPECT_EQ(second.prompt_logprobs(0).first_position(), 4);
  ASSERT_EQ(first.prompt_logprobs(0).logprobs_size(), 4);
  ASSERT_EQ(second.prompt_logprobs(0).logprobs_size(), 1);
  for (int32_t pos = 0; pos < 5; ++pos) {
    const float got = pos < 4 ? first.prompt_logprobs(0).logprobs(pos) : second.prompt_logprobs(0).logprobs(0);
    EXPECT_NEAR(got, p.logprobs(pos), 1e-4) << "position " << pos;
  }
  // A request without prompt_logprobs scores nothing.
  ModelRunner plain(&backend_, model_.get(), ModelRunnerOptions{16, 1});
  EXPECT_EQ(RunStep(plain, PromptChunk(1, 7, prompt, 0, 6, -2)).prompt_logprobs_size(), 0);
}

TEST_F(ModelRunnerTest, DisagreementsAreRefused) {
  v1::SchedulerOutput bad_block = NewRequestStep(-1);
  bad_block.mutable_new_requests(0)->set_block_ids(0, 99);
  EXPECT_THAT(runner_->Execute(bad_block).message(), HasSubstr("was given block 99"));

  ModelRunner fresh(&backend_, model_.get(), ModelRunnerOptions{16, 1});
  ASSERT_TRUE(fresh.Execute(NewRequestStep(-1)).ok());
  v1::SchedulerOutput next;
  next.set_step_seq(2);
  EXPECT_THAT(fresh.Execute(next).message(), HasSubstr("before step 1 was sampled"));
  v1::SampleCommand sample;
  sample.set_step_seq(1);
  ASSERT_TRUE(fresh.Sample(sample).ok());
  // The scheduler claims 4 computed tokens; the worker computed 5.
  v1::CachedRequests* cached = next.mutable_cached_requests();
  cached->add_request_ids(7);
  cached->add_resumed(false);
  cached->add_num_computed_tokens(4);
  cached->add_num_new_block_ids(0);
  next.add_scheduled_request_ids(7);
  next.add_num_scheduled_tokens(1);
  EXPECT_THAT(fresh.Execute(next).message(), HasSubstr("the worker computed 5 tokens, the scheduler says 4"));
}

}  // namespace
}  // namespace tandem::worker
