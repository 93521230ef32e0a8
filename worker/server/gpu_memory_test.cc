// The KV cache's share of a GPU under --gpu-memory-utilization (pure
// arithmetic), and the profiling step, which runs on any backend.
#include "worker/server/gpu_memory.h"

#include "common/gguf/random_llama.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backends/cpu/cpu_backend.h"

namespace tandem::worker {
namespace {

using ::testing::HasSubstr;

constexpr size_t kGiB = size_t{1} << 30;

GpuMemoryPlan Plan() {
  GpuMemoryPlan plan;
  plan.utilization = 0.9;
  plan.total_bytes = 100 * kGiB;
  plan.free_at_start = 99 * kGiB;       // 1 GiB: the CUDA context, another process
  plan.free_after_weights = 97 * kGiB;  // 2 GiB of weights
  plan.free_after_profile = 96 * kGiB;  // 1 GiB of activations
  plan.step_io_bytes = 0;
  plan.reserve_bytes = kGiB / 2;
  return plan;
}

TEST(GpuMemoryTest, TheKvCacheGetsWhatIsLeftOfTheWorkersShare) {
  const GpuMemoryPlan plan = Plan();
  EXPECT_EQ(plan.weight_bytes(), 2 * kGiB);
  EXPECT_EQ(plan.activation_bytes(), 1 * kGiB);
  auto kv = KvCacheBytesFor(plan);
  ASSERT_TRUE(kv.ok()) << kv.status();
  // 90 GiB allowed - 2 weights - 1 activations - 0.5 reserve.
  EXPECT_NEAR(static_cast<double>(*kv), 86.5 * kGiB, 1.0);
}

TEST(GpuMemoryTest, NeverMoreThanIsFree) {
  GpuMemoryPlan plan = Plan();
  plan.free_at_start = 40 * kGiB;  // another process holds 60 GiB
  plan.free_after_weights = 38 * kGiB;
  plan.free_after_profile = 37 * kGiB;
  plan.step_io_bytes = kGiB / 2;
  auto kv = KvCacheBytesFor(plan);
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_NEAR(static_cast<double>(*kv), 36.0 * kGiB, 1.0);  // 37 free - 0.5 reserve - 0.5 the runner's buffers
}

TEST(GpuMemoryTest, NoRoomIsACleanErrorWithTheFigures) {
  GpuMemoryPlan plan = Plan();
  plan.utilization = 0.02;  // 2 GiB: the weights alone
  auto kv = KvCacheBytesFor(plan);
  ASSERT_FALSE(kv.ok());
  EXPECT_EQ(kv.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(kv.status().message()), HasSubstr("no GPU memory is left for the KV cache"));
  EXPECT_THAT(std::string(kv.status().message()), HasSubstr("--gpu-memory-utilization 0.02 of 100.00 GiB"));
  EXPECT_THAT(std::string(kv.status().message()), HasSubstr("weights 2.00 GiB"));
}

TEST(GpuMemoryTest, TheProfileStepRunsOnEveryStage) {
  gguf::RandomLlamaOptions options;
  options.layers = 2;
  auto file = gguf::GgufFile::FromBytes(*gguf::MakeRandomLlama(options));
  ASSERT_TRUE(file.ok());
  auto config = gguf::ReadLlamaConfig(**file);
  ASSERT_TRUE(config.ok());
  for (const LlamaModelStage stage : {LlamaModelStage{0, -1}, LlamaModelStage{0, 1}, LlamaModelStage{1, 2}}) {
    CpuBackend backend(1);
    auto model = LlamaModel::Load(**file, *config, &backend, stage);
    ASSERT_TRUE(model.ok());
    auto io = ProfileLargestStep(backend, **model, 100, 7, 16);
    ASSERT_TRUE(io.ok()) << io.status();
    // At least the logits (last stage) or the hidden states it passes on.
    const size_t outputs = (*model)->is_last_stage() ? size_t{7} * config->vocab_size * sizeof(float)
                                                     : size_t{100} * config->hidden_size * sizeof(float);
    EXPECT_GT(*io, outputs);
    // The model's KV cache is allocated again afterwards, as Configure does.
    EXPECT_TRUE((*model)->AllocateKvCache(4, 16).ok());
  }
}

}  // namespace
}  // namespace tandem::worker
