// The whole in-process engine on a tiny random-weight model: the scheduler,
// the async engine loop, the wire encoding and the CPU model runner together.
#include <map>
#include <random>
#include <set>

#include "common/file_util.h"
#include "common/gguf/random_llama.h"
#include "gtest/gtest.h"
#include "tools/in_process/in_process_engine.h"

namespace tandem::tools {
namespace {

std::string TinyModelPath() {
  static const std::string path = [] {
    gguf::RandomLlamaOptions options;
    options.layers = 3;  // up to three pipeline stages
    options.hidden = 64;
    options.heads = 4;
    options.kv_heads = 2;
    options.intermediate = 128;
    options.context = 512;
    options.type = gguf::GgmlType::kQ8_0;
    options.seed = 11;
    options.weight_scale = 0.2;  // outputs depend on the context (see RandomLlamaOptions)
    auto image = gguf::MakeRandomLlama(options);
    EXPECT_TRUE(image.ok()) << image.status();
    static const TemporaryFile file = *TemporaryFile::Create("tandem_tiny", *image);
    return file.path();
  }();
  return path;
}

InProcessEngineOptions TestOptions() {
  InProcessEngineOptions options;
  options.model_path = TinyModelPath();
  options.threads = 2;
  options.kv_cache_bytes = int64_t{16} << 20;
  options.seed = 5;
  return options;
}

std::unique_ptr<InProcessEngine> MakeEngine(const InProcessEngineOptions& options = TestOptions()) {
  auto engine = InProcessEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(engine).value();
}

std::vector<TokenId> Prompt(int seed, int length) {
  std::mt19937 rng(seed);
  std::vector<TokenId> ids;
  for (int i = 0; i < length; ++i) ids.push_back(static_cast<TokenId>(rng() % 256));  // byte tokens
  return ids;
}

scheduler::RequestSpec Request(RequestId id, std::vector<TokenId> prompt, int32_t max_tokens,
                               float temperature = 0.0f, std::optional<uint64_t> seed = std::nullopt) {
  scheduler::RequestSpec spec;
  spec.id = id;
  spec.prompt_token_ids = std::move(prompt);
  spec.sampling.max_tokens = max_tokens;
  spec.sampling.ignore_eos = true;
  spec.sampling.temperature = temperature;
  spec.sampling.seed = seed;
  return spec;
}

// RequestSpec is move-only: an initializer list cannot hold it.
std::vector<scheduler::RequestSpec> One(scheduler::RequestSpec spec) {
  std::vector<scheduler::RequestSpec> v;
  v.push_back(std::move(spec));
  return v;
}

std::map<RequestId, std::vector<TokenId>> RunAll(InProcessEngine& engine, std::vector<scheduler::RequestSpec> requests) {
  auto results = engine.Run(std::move(requests));
  EXPECT_TRUE(results.ok()) << results.status();
  std::map<RequestId, std::vector<TokenId>> tokens;
  for (auto& [id, g] : *results) tokens[id] = g.tokens;
  return tokens;
}

TEST(InProcessEngineTest, OneRequestAloneAndInABatchOf16AgreeGreedily) {
  auto alone = MakeEngine();
  const auto expected = RunAll(*alone, One(Request(1, Prompt(1, 23), 24)))[1];
  ASSERT_EQ(expected.size(), 24u);
  // The comparison means something only if the model does not repeat itself.
  EXPECT_GE(std::set<TokenId>(expected.begin(), expected.end()).size(), 8u);
  auto batched = MakeEngine();
  std::vector<scheduler::RequestSpec> requests;
  for (int i = 0; i < 16; ++i) requests.push_back(Request(100 + i, Prompt(i == 7 ? 1 : 50 + i, i == 7 ? 23 : 5 + 3 * i), 24));
  EXPECT_EQ(RunAll(*batched, std::move(requests))[107], expected);
}

TEST(InProcessEngineTest, ChunkedPrefillEqualsWholePrefill) {
  InProcessEngineOptions chunked = TestOptions();
  chunked.max_num_batched_tokens = 8;
  auto small = MakeEngine(chunked);
  auto whole = MakeEngine();
  const std::vector<TokenId> prompt = Prompt(2, 61);
  EXPECT_EQ(RunAll(*small, One(Request(1, prompt, 12)))[1], RunAll(*whole, One(Request(1, prompt, 12)))[1]);
}

// The runner feeds a decode step the token it sampled itself (placeholder
// substitution); feeding the same token explicitly in the prompt must give
// the same next token.
TEST(InProcessEngineTest, SubstitutionEqualsFeedingTheTokenExplicitly) {
  auto engine = MakeEngine();
  const std::vector<TokenId> prompt = Prompt(3, 17);
  const auto generated = RunAll(*engine, One(Request(1, prompt, 6)))[1];
  ASSERT_EQ(generated.size(), 6u);
  for (int k = 1; k < 6; ++k) {
    std::vector<TokenId> explicit_prompt = prompt;
    explicit_prompt.insert(explicit_prompt.end(), generated.begin(), generated.begin() + k);
    EXPECT_EQ(RunAll(*engine, One(Request(10 + k, explicit_prompt, 1)))[10 + k][0], generated[k]) << "k = " << k;
  }
}

TEST(InProcessEngineTest, AsyncAndSyncEnginesGiveTheSameTokens) {
  auto make = [] {
    std::vector<scheduler::RequestSpec> r;
    for (int i = 0; i < 8; ++i) {
      const bool sampled = i % 2 == 1;
      r.push_back(Request(i, Prompt(20 + i, 4 + 7 * i), 10 + i, sampled ? 0.8f : 0.0f,
                          sampled ? std::optional<uint64_t>(1000 + i) : std::nullopt));
    }
    return r;
  };
  InProcessEngineOptions sync_options = TestOptions();
  sync_options.async_scheduling = false;
  auto sync = MakeEngine(sync_options);
  auto async = MakeEngine();
  const auto expected = RunAll(*sync, make());
  EXPECT_EQ(RunAll(*async, make()), expected);
  // And with a KV pool small enough to force preemption.
  InProcessEngineOptions tight = TestOptions();
  tight.kv_cache_bytes = MakeEngine()->kv_bytes_per_block() * 12;
  tight.max_model_len = 160;
  auto preempting = MakeEngine(tight);
  auto results = preempting->Run(make());
  ASSERT_TRUE(results.ok()) << results.status();
  for (auto& [id, g] : *results) EXPECT_EQ(g.tokens, expected.at(id)) << "request " << id;
  EXPECT_GT(preempting->engine().scheduler().stats().num_preemptions, 0);
}

// Pipeline stages as threads: every split of the layers, async or not, gives
// the same tokens as one stage, also when the pool forces preemption.
TEST(InProcessEngineTest, PipelineStagesGiveTheSameTokens) {
  auto make = [] {
    std::vector<scheduler::RequestSpec> r;
    for (int i = 0; i < 10; ++i) {
      const bool sampled = i % 3 == 2;
      r.push_back(Request(i, Prompt(60 + i, 3 + 9 * i), 8 + 2 * i, sampled ? 0.9f : 0.0f,
                          sampled ? std::optional<uint64_t>(500 + i) : std::nullopt));
    }
    return r;
  };
  InProcessEngineOptions reference_options = TestOptions();
  reference_options.async_scheduling = false;
  const auto expected = RunAll(*MakeEngine(reference_options), make());
  for (int32_t stages : {2, 3}) {
    for (bool async : {true, false}) {
      for (bool tight : {false, true}) {
        InProcessEngineOptions options = TestOptions();
        options.pipeline_parallel_size = stages;
        options.async_scheduling = async;
        if (tight) {
          options.kv_cache_bytes = MakeEngine(options)->kv_bytes_per_block() * 13;
          options.max_model_len = 176;
        }
        auto engine = MakeEngine(options);
        EXPECT_EQ(RunAll(*engine, make()), expected)
            << stages << " stages, async " << async << ", tight " << tight;
        if (tight) {
          EXPECT_GT(engine->engine().scheduler().stats().num_preemptions, 0);
        }
      }
    }
  }
}

TEST(InProcessEngineTest, TheSameSeedGivesTheSameTokensWhateverTheBatch) {
  auto engine = MakeEngine();
  const std::vector<TokenId> prompt = Prompt(4, 9);
  const auto alone = RunAll(*engine, One(Request(1, prompt, 16, 1.0f, 77)))[1];
  std::vector<scheduler::RequestSpec> crowd;
  crowd.push_back(Request(2, prompt, 16, 1.0f, 77));
  for (int i = 0; i < 6; ++i) crowd.push_back(Request(10 + i, Prompt(30 + i, 12), 16, 1.0f));
  EXPECT_EQ(RunAll(*engine, std::move(crowd))[2], alone);
  EXPECT_NE(RunAll(*engine, One(Request(3, prompt, 16, 1.0f, 78)))[3], alone);
}

struct WithLogprobs {
  std::vector<TokenId> tokens;
  std::vector<scheduler::TokenLogprob> logprobs;
};

// InProcessEngine::Run keeps only the tokens: drive the engine loop directly.
std::map<RequestId, WithLogprobs> RunWithLogprobs(InProcessEngine& engine, std::vector<scheduler::RequestSpec> requests) {
  std::map<RequestId, WithLogprobs> results;
  for (scheduler::RequestSpec& spec : requests) {
    results[spec.id];
    EXPECT_TRUE(engine.engine().AddRequest(std::move(spec)).ok());
  }
  while (engine.engine().HasWork()) {
    auto step = engine.engine().Step();
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) break;
    for (const scheduler::RequestOutput& out : step->outputs) {
      EXPECT_TRUE(out.logprobs.empty() || out.logprobs.size() == out.new_token_ids.size()) << "request " << out.id;
      WithLogprobs& r = results[out.id];
      r.tokens.insert(r.tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      r.logprobs.insert(r.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
    }
  }
  return results;
}

TEST(InProcessEngineTest, LogprobsDescribeTheGreedyTokens) {
  auto make = [] {
    std::vector<scheduler::RequestSpec> r;
    r.push_back(Request(1, Prompt(7, 19), 12));
    r.back().sampling.logprobs = 3;
    r.push_back(Request(2, Prompt(8, 11), 12));  // no logprobs
    r.push_back(Request(3, Prompt(9, 5), 6));
    r.back().sampling.logprobs = 0;
    return r;
  };
  InProcessEngineOptions sync_options = TestOptions();
  sync_options.async_scheduling = false;
  const auto sync = RunWithLogprobs(*MakeEngine(sync_options), make());
  const WithLogprobs& asked = sync.at(1);
  ASSERT_EQ(asked.tokens.size(), 12u);
  ASSERT_EQ(asked.logprobs.size(), 12u);
  for (size_t i = 0; i < asked.tokens.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "token " << i);
    const scheduler::TokenLogprob& lp = asked.logprobs[i];
    EXPECT_LE(lp.logprob, 0.0f);
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].first, asked.tokens[i]);
    EXPECT_FLOAT_EQ(lp.top[0].second, lp.logprob);
    EXPECT_GE(lp.top[0].second, lp.top[1].second);
    EXPECT_GE(lp.top[1].second, lp.top[2].second);
  }
  EXPECT_EQ(sync.at(2).tokens.size(), 12u);
  EXPECT_TRUE(sync.at(2).logprobs.empty());
  ASSERT_EQ(sync.at(3).logprobs.size(), 6u);
  for (const scheduler::TokenLogprob& lp : sync.at(3).logprobs) EXPECT_TRUE(lp.top.empty());

  // Async scheduling and pipeline stages report the same logprobs.
  InProcessEngineOptions staged = TestOptions();
  staged.pipeline_parallel_size = 2;
  for (const InProcessEngineOptions& options : {TestOptions(), staged}) {
    const auto other = RunWithLogprobs(*MakeEngine(options), make());
    for (const auto& [id, want] : sync) {
      SCOPED_TRACE(::testing::Message() << "request " << id << ", " << options.pipeline_parallel_size << " stages");
      const WithLogprobs& got = other.at(id);
      ASSERT_EQ(got.tokens, want.tokens);
      ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
      for (size_t i = 0; i < want.logprobs.size(); ++i) {
        EXPECT_NEAR(got.logprobs[i].logprob, want.logprobs[i].logprob, 1e-5);
        ASSERT_EQ(got.logprobs[i].top.size(), want.logprobs[i].top.size());
        for (size_t t = 0; t < want.logprobs[i].top.size(); ++t) {
          EXPECT_EQ(got.logprobs[i].top[t].first, want.logprobs[i].top[t].first);
          EXPECT_NEAR(got.logprobs[i].top[t].second, want.logprobs[i].top[t].second, 1e-5);
        }
      }
    }
  }
}

TEST(InProcessEngineTest, KvBlocksFitTheBudget) {
  InProcessEngineOptions options = TestOptions();
  options.kv_cache_bytes = int64_t{8} << 20;
  auto engine = MakeEngine(options);
  EXPECT_EQ(engine->num_kv_blocks(), (int64_t{8} << 20) / engine->kv_bytes_per_block());
  EXPECT_EQ(engine->engine_config().num_kv_blocks, engine->num_kv_blocks());
  InProcessEngineOptions tiny = TestOptions();
  tiny.kv_cache_bytes = 1000;
  auto refused = InProcessEngine::Create(tiny);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("at least 2 are needed"), std::string::npos);
}

}  // namespace
}  // namespace tandem::tools
