// What a step's output needs from the backend's copies, with copies that
// land in the caller's buffer only when their own event is waited on or
// found done (as CudaBackend's do: device to a pinned bounce buffer, then to
// the caller's memory): every copy of a step (ids, logprobs, top ids) is
// waited for, and the output is the same as with copies that complete at
// once.
#include <cstring>

#include "common/gguf/random_llama.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backends/cpu/cpu_backend.h"
#include "worker/runner/model_runner.h"
#include "worker/testing/forwarding_backend.h"

namespace tandem::worker {
namespace {

// Copies `bytes` from its own snapshot of the source into `dst` on the first
// Wait or Done.
class DeferredCopy : public Event {
 public:
  DeferredCopy(const void* src, void* dst, size_t bytes)
      : snapshot_(static_cast<const char*>(src), static_cast<const char*>(src) + bytes), dst_(dst) {}
  absl::Status Wait() override {
    Land();
    return absl::OkStatus();
  }
  bool Done() override {
    Land();
    return true;
  }

 private:
  void Land() {
    if (landed_) return;
    std::memcpy(dst_, snapshot_.data(), snapshot_.size());
    landed_ = true;
  }
  std::vector<char> snapshot_;
  void* dst_;
  bool landed_ = false;
};

class DeferredCopyBackend : public testing::ForwardingBackend {
 public:
  DeferredCopyBackend() : ForwardingBackend(std::make_unique<CpuBackend>(1)) {}
  absl::StatusOr<std::unique_ptr<Event>> DownloadAsync(const void* src, void* dst, size_t bytes) override {
    return std::unique_ptr<Event>(new DeferredCopy(src, dst, bytes));  // CPU "device" memory is host memory
  }
};

v1::SchedulerOutput Step(int k) {
  v1::SchedulerOutput step;
  step.set_step_seq(k);
  step.add_scheduled_request_ids(7);
  if (k == 1) {
    v1::NewRequest* r = step.add_new_requests();
    r->set_request_id(7);
    for (int t : {10, 20, 30, 40, 50}) r->add_prompt_token_ids(t);
    r->mutable_sampling()->set_temperature(0.0f);
    r->mutable_sampling()->set_logprobs(3);
    r->add_block_ids(3);
    step.add_num_scheduled_tokens(5);
  } else {
    v1::CachedRequests* c = step.mutable_cached_requests();
    c->add_request_ids(7);
    c->add_resumed(false);
    c->add_num_computed_tokens(5 + k - 2);
    c->add_num_new_block_ids(0);
    step.add_num_scheduled_tokens(1);
  }
  return step;
}

std::vector<v1::ModelRunnerOutput> RunSteps(Backend* backend, const gguf::GgufFile& file) {
  auto config = gguf::ReadLlamaConfig(file);
  auto model = LlamaModel::Load(file, *config, backend, {});
  EXPECT_TRUE(model.ok());
  EXPECT_TRUE((*model)->AllocateKvCache(8, 16).ok());
  ModelRunner runner(backend, model->get(), ModelRunnerOptions{16, 1});
  std::vector<v1::ModelRunnerOutput> outputs;
  for (int k = 1; k <= 4; ++k) {
    EXPECT_TRUE(runner.Execute(Step(k)).ok());
    v1::SampleCommand sample;
    sample.set_step_seq(k);
    EXPECT_TRUE(runner.Sample(sample).ok());
    auto out = runner.CollectOutput(k);
    EXPECT_TRUE(out.ok()) << out.status();
    outputs.push_back(*out);
  }
  return outputs;
}

TEST(StepOutputTest, EveryCopyOfAStepIsWaitedFor) {
  gguf::RandomLlamaOptions options;
  options.weight_scale = 0.2;
  auto file = gguf::GgufFile::FromBytes(*gguf::MakeRandomLlama(options));
  ASSERT_TRUE(file.ok());
  CpuBackend cpu(1);
  DeferredCopyBackend deferred;
  const auto expected = RunSteps(&cpu, **file);
  const auto got = RunSteps(&deferred, **file);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_EQ(got[k].SerializeAsString(), expected[k].SerializeAsString()) << "step " << k + 1 << ":\n"
                                                                           << got[k].DebugString() << "expected\n"
                                                                           << expected[k].DebugString();
  }
  ASSERT_EQ(expected[0].logprobs_size(), 1);
  EXPECT_EQ(expected[0].logprobs(0).top_token_ids_size(), 3);
}

}  // namespace
}  // namespace tandem::worker
