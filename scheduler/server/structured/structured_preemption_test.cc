// Structured requests through the whole engine loop (EngineCore over the
// FakeExecutor, which samples within the grammar's mask), with real xgrammar
// matchers on a byte vocabulary: under KV pressure that preempts them, with
// async scheduling on and off and at several queue depths, mixed with free
// requests. Preemption keeps committed tokens, so the matcher needs no
// rollback: every output must still be accepted by a fresh matcher, no
// request may end in a grammar error, and tokens must equal those of a run
// without preemption (the fake model's tokens depend only on the context).
#include <map>
#include <memory>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/tokenizer_test_util.h"
#include "gtest/gtest.h"
#include "scheduler/server/structured/grammar_factory.h"
#include "scheduler/testing/scheduler_test_util.h"

namespace tandem::structured {
namespace {

using scheduler::EngineConfig;
using scheduler::FinishReason;
using scheduler::testing::Arrival;
using scheduler::testing::WorkloadRun;

constexpr TokenId kEos = tokenizer_test::kByteVocabImEnd;
constexpr int32_t kVocab = 260;
constexpr char kSchema[] =
    R"({"type":"object","properties":{"k":{"type":"string","maxLength":6},"n":{"type":"integer"},)"
    R"("b":{"type":"boolean"}},"required":["k","n","b"]})";

class StructuredPreemptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tokenizer = Tokenizer::Create(tokenizer_test::ByteVocabularyData());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(*tokenizer);
    factory_ = std::make_unique<GrammarFactory>(tokenizer_.get());
    auto compiled = factory_->Compile({StructuredKind::kJsonSchema, kSchema, {}, "response_format"});
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    compiled_ = *compiled;
  }

  // Even ids are structured, odd ids free; all decode up to 48 tokens.
  std::vector<Arrival> Arrivals(int count) const {
    std::vector<Arrival> arrivals;
    for (int i = 0; i < count; ++i) {
      scheduler::RequestSpec spec = scheduler::testing::MakeRequest(i, 24 + i, 48);
      spec.sampling.eos_token_id = kEos;
      if (i % 2 == 0) spec.grammar = GrammarFactory::NewGrammar(compiled_, {kEos});
      arrivals.push_back({i / 3, std::move(spec)});
    }
    return arrivals;
  }

  static EngineConfig Config(bool async, int32_t depth, int32_t blocks) {
    EngineConfig config = scheduler::testing::VllmTestConfig(async);
    config.vocab_size = kVocab;
    config.batch_queue_depth = depth;
    config.num_kv_blocks = blocks;
    config.block_size = 4;
    config.max_model_len = 96;
    return config;
  }

  WorkloadRun Run(const EngineConfig& config, int count) const {
    scheduler::FakeExecutorOptions options;
    options.vocab_size = kVocab;
    options.block_size = config.block_size;
    return scheduler::testing::RunWorkload(config, Arrivals(count), options);
  }

  // Whether a fresh matcher accepts all of `tokens`.
  bool Valid(const std::vector<TokenId>& tokens) const {
    auto g = GrammarFactory::NewGrammar(compiled_, {kEos});
    return g->AcceptTokens(tokens);
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<GrammarFactory> factory_;
  std::shared_ptr<const CompiledStructure> compiled_;
};

TEST_F(StructuredPreemptionTest, PreemptedStructuredRequestsKeepTheirGrammarInStep) {
  constexpr int kRequests = 12;
  const WorkloadRun reference = Run(Config(/*async=*/false, 0, /*blocks=*/4096), kRequests);
  ASSERT_TRUE(reference.status.ok()) << reference.status;
  ASSERT_EQ(reference.stats.num_preemptions, 0);
  int completed = 0;
  for (int i = 0; i < kRequests; i += 2) {
    const auto& r = reference.results.at(i);
    ASSERT_NE(r.finish, FinishReason::kError) << "request " << i;
    EXPECT_TRUE(Valid(r.tokens)) << "request " << i;
    completed += r.finish == FinishReason::kStop;
  }
  EXPECT_GT(completed, 0) << "no structured output reached its end (EOS); the test would check little";

  struct Mode {
    bool async;
    int32_t depth;
    int32_t pp;
  };
  // Queue depth 1 is synchronous; async needs 2 or more; PP 2 decodes every other step.
  for (const Mode& m : {Mode{false, 1, 1}, Mode{true, 2, 1}, Mode{true, 3, 1}, Mode{true, 3, 2}}) {
    SCOPED_TRACE(::testing::Message() << "async " << m.async << " depth " << m.depth << " pp " << m.pp);
    // 36 blocks of 4: a fraction of what 12 requests of ~75 tokens need.
    EngineConfig config = Config(m.async, m.depth, /*blocks=*/36);
    config.pipeline_parallel_size = m.pp;
    const WorkloadRun run = Run(config, kRequests);
    ASSERT_TRUE(run.status.ok()) << run.status;
    EXPECT_GT(run.stats.num_preemptions, 0);
    for (int i = 0; i < kRequests; ++i) {
      const auto& r = run.results.at(i);
      EXPECT_NE(r.finish, FinishReason::kError) << "request " << i;
      EXPECT_EQ(r.tokens, reference.results.at(i).tokens) << "request " << i;
      if (i % 2 == 0) {
        EXPECT_TRUE(Valid(r.tokens)) << "request " << i;
      }
    }
  }
}

}  // namespace
}  // namespace tandem::structured
