// ModelRunner against hand-written step messages: logprobs and grammar masks
// reach the output, and a step that disagrees with the worker's state is
// refused rather than trusted.
#include "worker/runner/model_runner.h"

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
    auto image = gguf::MakeRandomLlama(options);
    ASSERT_TRUE(image.ok());
    auto file = gguf::GgufFile::FromBytes(std::move(image).value());
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
