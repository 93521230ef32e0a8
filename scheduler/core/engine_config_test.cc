// EngineConfig::Validate (scheduler/README.md §9, convention 6: validated
// once, with a message that names the field) and request validation in
// Scheduler::AddRequest (convention 2: a bad request never takes the process
// down, nor disturbs the requests that are already running).
#include "scheduler/core/engine_config.h"

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/testing/invariant_checker.h"
#include "scheduler/core/scheduler.h"
#include "scheduler/testing/scheduler_test_util.h"

namespace tandem::scheduler {
namespace {

using ::testing::HasSubstr;
using testing::MakeRequest;
using testing::MakeScheduler;
using testing::Update;
using testing::VllmTestConfig;

TEST(EngineConfigTest, DefaultsAreValid) {
  const EngineConfig config;
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
  EXPECT_TRUE(Scheduler::Create(config).ok());
  // Derived depth: async with one stage keeps two steps in flight.
  EXPECT_EQ(config.EffectiveQueueDepth(), 2);
  EXPECT_EQ(config.WatermarkBlocks(), 0);
}

struct BadConfig {
  std::string name;
  std::function<void(EngineConfig&)> mutate;
  std::string field;  // the message must name it
};

std::vector<BadConfig> BadConfigs() {
  return {
      {"zero budget", [](EngineConfig& c) { c.max_num_batched_tokens = 0; }, "max_num_batched_tokens"},
      {"block size not a power of two", [](EngineConfig& c) { c.block_size = 12; }, "block_size"},
      {"zero block size", [](EngineConfig& c) { c.block_size = 0; }, "block_size"},
      {"max_model_len below 2", [](EngineConfig& c) { c.max_model_len = 1; }, "max_model_len"},
      {"zero max_num_seqs", [](EngineConfig& c) { c.max_num_seqs = 0; }, "max_num_seqs"},
      // 2048 tokens need 128 blocks of 16; 128 blocks hold only 127 usable.
      {"pool smaller than one request", [](EngineConfig& c) { c.num_kv_blocks = 128; }, "num_kv_blocks"},
      {"negative watermark", [](EngineConfig& c) { c.watermark = -0.1; }, "watermark"},
      {"watermark of 1", [](EngineConfig& c) { c.watermark = 1.0; }, "watermark"},
      {"async at depth 1", [](EngineConfig& c) { c.batch_queue_depth = 1; }, "batch_queue_depth"},
      {"negative long prefill threshold", [](EngineConfig& c) { c.long_prefill_token_threshold = -1; },
       "long_prefill_token_threshold"},
      {"no chunked prefill with a budget below max_model_len",
       [](EngineConfig& c) {
         c.enable_chunked_prefill = false;
         c.max_num_batched_tokens = c.max_model_len - 1;
       },
       "max_num_batched_tokens"},
  };
}

TEST(EngineConfigTest, EachBadFieldIsNamed) {
  for (const BadConfig& bad : BadConfigs()) {
    SCOPED_TRACE(bad.name);
    EngineConfig config;
    bad.mutate(config);
    const absl::Status status = config.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(bad.field));
    // The scheduler refuses to exist with it, with the same error.
    auto scheduler = Scheduler::Create(config);
    ASSERT_FALSE(scheduler.ok());
    EXPECT_EQ(scheduler.status(), status);
  }
}

// The edges just inside each bound are accepted, so the checks above fail for
// the reason they name and not for a neighbouring one.
TEST(EngineConfigTest, BoundariesAreAccepted) {
  const std::vector<std::function<void(EngineConfig&)>> good = {
      [](EngineConfig& c) { c.num_kv_blocks = 129; },  // exactly one request of 2048 tokens
      [](EngineConfig& c) { c.block_size = 1; },
      [](EngineConfig& c) { c.block_size = 32; },
      [](EngineConfig& c) { c.max_model_len = 2; },
      [](EngineConfig& c) { c.watermark = 0.5; },
      [](EngineConfig& c) { c.batch_queue_depth = 2; },
      [](EngineConfig& c) {
        c.async_scheduling = false;
        c.batch_queue_depth = 1;
      },
      [](EngineConfig& c) { c.long_prefill_token_threshold = 0; },
      [](EngineConfig& c) {
        c.enable_chunked_prefill = false;
        c.max_num_batched_tokens = c.max_model_len;
      },
  };
  for (size_t i = 0; i < good.size(); ++i) {
    EngineConfig config;
    good[i](config);
    EXPECT_TRUE(config.Validate().ok()) << "case " << i << ": " << config.Validate();
  }
}

TEST(EngineConfigTest, SyncDepthIsOneAndPipelineAddsAStage) {
  EngineConfig config;
  config.async_scheduling = false;
  EXPECT_EQ(config.EffectiveQueueDepth(), 1);
  config.async_scheduling = true;
  config.pipeline_parallel_size = 3;
  EXPECT_EQ(config.EffectiveQueueDepth(), 4);
  EXPECT_EQ(config.DecodeCadence(), 3);
  config.batch_queue_depth = 5;  // explicit wins
  EXPECT_EQ(config.EffectiveQueueDepth(), 5);
}

class RequestValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineConfig config = VllmTestConfig();
    config.max_model_len = 64;
    config.vocab_size = 1000;
    scheduler_ = MakeScheduler(config);
    ASSERT_NE(scheduler_, nullptr);
  }

  void Check() {
    const absl::Status status = InvariantChecker::Check(*scheduler_, in_flight_);
    EXPECT_TRUE(status.ok()) << status;
  }

  // Expects `spec` to be rejected with `code` and a message containing `what`,
  // leaving the scheduler as it was.
  void ExpectRejected(RequestSpec spec, absl::StatusCode code, const std::string& what) {
    const size_t before = scheduler_->num_requests();
    const size_t waiting = scheduler_->num_waiting();
    const absl::Status status = scheduler_->AddRequest(std::move(spec));
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(what));
    EXPECT_EQ(scheduler_->num_requests(), before);
    EXPECT_EQ(scheduler_->num_waiting(), waiting);
    Check();
  }

  std::unique_ptr<Scheduler> scheduler_;
  std::deque<SchedulerOutput> in_flight_;
};

TEST_F(RequestValidationTest, BadRequestsAreRejectedAndTheRunningOneFinishes) {
  ASSERT_TRUE(scheduler_->AddRequest(MakeRequest(0, 10, 3)).ok());
  in_flight_.push_back(scheduler_->Schedule());
  Check();
  ASSERT_EQ(scheduler_->FindRequest(0)->status, RequestStatus::kRunning);

  RequestSpec empty = MakeRequest(1);
  empty.prompt_token_ids.clear();
  ExpectRejected(std::move(empty), absl::StatusCode::kInvalidArgument, "prompt is empty");

  ExpectRejected(MakeRequest(2, 10, 0), absl::StatusCode::kInvalidArgument, "max_tokens must be >= 1");

  RequestSpec min_over_max = MakeRequest(3, 10, 4);
  min_over_max.sampling.min_tokens = 5;
  ExpectRejected(std::move(min_over_max), absl::StatusCode::kInvalidArgument, "min_tokens");

  // 64 prompt tokens leave no room for an output at max_model_len 64.
  ExpectRejected(MakeRequest(4, 64), absl::StatusCode::kInvalidArgument, "max_model_len is 64");

  RequestSpec too_high = MakeRequest(5);
  too_high.prompt_token_ids[3] = 1000;
  ExpectRejected(std::move(too_high), absl::StatusCode::kInvalidArgument, "token id 1000 is outside the vocabulary");
  RequestSpec negative = MakeRequest(6);
  negative.prompt_token_ids[0] = -1;
  ExpectRejected(std::move(negative), absl::StatusCode::kInvalidArgument, "token id -1 is outside the vocabulary");

  // A duplicate of the running request's id must not replace or touch it.
  ExpectRejected(MakeRequest(0, 20, 9), absl::StatusCode::kAlreadyExists, "request id 0 is already in use");
  const Request* running = scheduler_->FindRequest(0);
  ASSERT_NE(running, nullptr);
  EXPECT_EQ(running->num_prompt_tokens(), 10);
  EXPECT_EQ(running->sampling().max_tokens, 3);
  EXPECT_EQ(running->status, RequestStatus::kRunning);

  // The edge of max_model_len is accepted: 63 prompt tokens + 1 output.
  ASSERT_TRUE(scheduler_->AddRequest(MakeRequest(7, 63, 1)).ok());

  // Both finish normally.
  std::vector<TokenId> tokens0;
  FinishReason finish0 = FinishReason::kNone;
  FinishReason finish7 = FinishReason::kNone;
  for (int guard = 0; guard < 20 && (!in_flight_.empty() || scheduler_->HasRequests()); ++guard) {
    SchedulerOutput next = scheduler_->Schedule();
    if (!next.empty()) in_flight_.push_back(std::move(next));
    Check();
    if (in_flight_.empty()) continue;
    const SchedulerOutput step = std::move(in_flight_.front());
    in_flight_.pop_front();
    for (const RequestOutput& out : Update(*scheduler_, step)) {
      if (out.id == 0) {
        tokens0.insert(tokens0.end(), out.new_token_ids.begin(), out.new_token_ids.end());
        if (out.finished()) finish0 = out.finish_reason;
      } else if (out.id == 7 && out.finished()) {
        finish7 = out.finish_reason;
      }
    }
    Check();
  }
  EXPECT_EQ(tokens0.size(), 3u);
  EXPECT_EQ(finish0, FinishReason::kLength);
  EXPECT_EQ(finish7, FinishReason::kLength);
  EXPECT_FALSE(scheduler_->HasRequests());
  EXPECT_EQ(scheduler_->kv_cache().pool().num_free_blocks(), 10000 - 1);
}

TEST(StructuredOutputValidationTest, NeedsAVocabulary) {
  EngineConfig config = VllmTestConfig();
  ASSERT_EQ(config.vocab_size, 0);
  auto scheduler = MakeScheduler(config);
  class AllowAll : public Grammar {
   public:
    bool AcceptTokens(absl::Span<const TokenId>) override { return true; }
    void FillBitmask(absl::Span<uint32_t> row, int32_t) const override {
      for (auto& word : row) word = ~0u;
    }
  };
  RequestSpec spec = MakeRequest(0);
  spec.grammar = std::make_unique<AllowAll>();
  const absl::Status status = scheduler->AddRequest(std::move(spec));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("vocab_size"));
  EXPECT_FALSE(scheduler->HasRequests());
}

}  // namespace
}  // namespace tandem::scheduler
