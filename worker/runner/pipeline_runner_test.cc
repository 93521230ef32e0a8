// Two pipeline stages of ModelRunner, each on its own thread, against one
// stage on the whole model: the same greedy tokens whether the stages pass
// hidden states and sampled ids over one channel or two (NCCL's layout: a
// channel for each direction), over loopback or TCP, and through the staging
// copies a GPU uses when it has no NCCL peer.
#include <functional>
#include <thread>

#include "common/gguf/random_llama.h"
#include "gtest/gtest.h"
#include "worker/backends/cpu/cpu_backend.h"
#include "worker/comm/loopback_communicator.h"
#include "worker/comm/staged_communicator.h"
#include "worker/comm/tcp_communicator.h"
#include "worker/runner/model_runner.h"

namespace tandem::worker {
namespace {

constexpr int kSteps = 6;
constexpr RequestId kRequests[] = {7, 8};

// Step 1: both requests' prompts; step k > 1: one decode token each, a
// placeholder the runner fills in from the previous step's sample.
v1::SchedulerOutput Step(int k) {
  v1::SchedulerOutput step;
  step.set_step_seq(k);
  for (RequestId id : kRequests) {
    step.add_scheduled_request_ids(id);
    if (k == 1) {
      v1::NewRequest* r = step.add_new_requests();
      r->set_request_id(id);
      for (int t = 0; t < 9; ++t) r->add_prompt_token_ids(static_cast<int32_t>(id * 13 + t * 5) % 250);
      r->mutable_sampling()->set_temperature(0.0f);
      r->add_block_ids(static_cast<int32_t>(id - 6));  // blocks 1 and 2
      step.add_num_scheduled_tokens(9);
    } else {
      v1::CachedRequests* c = step.mutable_cached_requests();
      c->add_request_ids(id);
      c->add_resumed(false);
      c->add_num_computed_tokens(9 + k - 2);
      c->add_num_new_block_ids(0);
      step.add_num_scheduled_tokens(1);
    }
  }
  return step;
}

v1::SampleCommand SampleOf(int k) {
  v1::SampleCommand s;
  s.set_step_seq(k);
  return s;
}

class PipelineRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gguf::RandomLlamaOptions options;
    options.layers = 2;
    options.weight_scale = 0.2;
    auto file = gguf::GgufFile::FromBytes(*gguf::MakeRandomLlama(options));
    ASSERT_TRUE(file.ok());
    file_ = std::move(file).value();
    config_ = *gguf::ReadLlamaConfig(*file_);
  }

  // Tokens of request 7 then 8, per step, from runners on `stages` backends.
  std::vector<TokenId> Run(int32_t stages, const std::vector<Communicator*>& hidden,
                           const std::vector<Communicator*>& tokens) {
    std::vector<std::unique_ptr<CpuBackend>> backends;
    std::vector<std::unique_ptr<LlamaModel>> models;
    std::vector<std::unique_ptr<ModelRunner>> runners;
    for (int32_t s = 0; s < stages; ++s) {
      backends.push_back(std::make_unique<CpuBackend>(1));
      auto model = LlamaModel::Load(*file_, config_, backends.back().get(), PipelineStage(2, stages, s));
      EXPECT_TRUE(model.ok());
      EXPECT_TRUE((*model)->AllocateKvCache(4, 16).ok());
      models.push_back(std::move(model).value());
      ModelRunnerOptions options{16, 1};
      if (stages > 1) {
        options.communicator = hidden[s];
        options.token_communicator = tokens[s];
        options.peer_timeout = absl::Seconds(10);
      }
      runners.push_back(std::make_unique<ModelRunner>(backends[s].get(), models[s].get(), options));
    }
    std::vector<TokenId> out;
    std::vector<std::thread> threads;
    for (int32_t s = 0; s < stages; ++s) {
      threads.emplace_back([&, s] {
        for (int k = 1; k <= kSteps; ++k) {
          ASSERT_TRUE(runners[s]->Execute(Step(k)).ok()) << "stage " << s << " step " << k;
          if (s + 1 < stages) continue;
          ASSERT_TRUE(runners[s]->Sample(SampleOf(k)).ok());
          auto result = runners[s]->CollectOutput(k);
          ASSERT_TRUE(result.ok()) << result.status();
          for (TokenId t : result->sampled_token_ids()) out.push_back(t);
        }
      });
    }
    for (std::thread& t : threads) t.join();
    return out;
  }

  std::unique_ptr<gguf::GgufFile> file_;
  gguf::LlamaConfig config_;
};

TEST_F(PipelineRunnerTest, OneChannelOverLoopback) {
  const std::vector<TokenId> expected = Run(1, {}, {});
  ASSERT_EQ(expected.size(), 2u * kSteps);
  LoopbackHub hub(2);
  LoopbackCommunicator c0(&hub, 0), c1(&hub, 1);
  EXPECT_EQ(Run(2, {&c0, &c1}, {&c0, &c1}), expected);
}

TEST_F(PipelineRunnerTest, ASeparateTokenChannelOverLoopback) {
  const std::vector<TokenId> expected = Run(1, {}, {});
  LoopbackHub hidden_hub(2), token_hub(2);
  LoopbackCommunicator h0(&hidden_hub, 0), h1(&hidden_hub, 1), t0(&token_hub, 0), t1(&token_hub, 1);
  EXPECT_EQ(Run(2, {&h0, &h1}, {&t0, &t1}), expected);
}

TEST_F(PipelineRunnerTest, ASeparateTokenChannelOverTcp) {
  const std::vector<TokenId> expected = Run(1, {}, {});
  // Two groups of two ranks: one for hidden states, one for sampled ids.
  std::vector<std::unique_ptr<TcpCommunicator>> hidden, tokens;
  for (auto* group : {&hidden, &tokens}) {
    for (int32_t r = 0; r < 2; ++r) {
      auto comm = TcpCommunicator::Listen(r, 2);
      ASSERT_TRUE(comm.ok());
      group->push_back(std::move(comm).value());
    }
    const std::vector<std::string> addresses = {(*group)[0]->address(), (*group)[1]->address()};
    std::thread other([&] { ASSERT_TRUE((*group)[1]->Connect(addresses, 1, absl::Seconds(10)).ok()); });
    ASSERT_TRUE((*group)[0]->Connect(addresses, 1, absl::Seconds(10)).ok());
    other.join();
  }
  EXPECT_EQ(Run(2, {hidden[0].get(), hidden[1].get()}, {tokens[0].get(), tokens[1].get()}), expected);
}

TEST_F(PipelineRunnerTest, ThroughStagingCopies) {
  const std::vector<TokenId> expected = Run(1, {}, {});
  // The GPU fallback's path: device memory staged through host buffers. On
  // the CPU backend the staging copies are plain copies, but every message
  // takes the same route (download, send, receive, upload, copy on device).
  LoopbackHub hub(2);
  CpuBackend staging_backends[2] = {CpuBackend(1), CpuBackend(1)};
  StagedCommunicator c0(std::make_unique<LoopbackCommunicator>(&hub, 0), &staging_backends[0]);
  StagedCommunicator c1(std::make_unique<LoopbackCommunicator>(&hub, 1), &staging_backends[1]);
  EXPECT_EQ(Run(2, {&c0, &c1}, {&c0, &c1}), expected);
}

}  // namespace
}  // namespace tandem::worker
