// The paged, batched, chunked forward of LlamaModel on the CPU backend equals
// a plain contiguous reference (worker/testing/reference_llama.h).
#include "worker/model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "common/gguf/random_llama.h"
#include "gtest/gtest.h"
#include "worker/backends/cpu/cpu_backend.h"
#include "worker/testing/reference_llama.h"

namespace tandem::worker {
namespace {

constexpr int32_t kBlockSize = 4;

// One sequence's part of a step: tokens [begin, end).
struct Chunk {
  int32_t seq;
  int32_t begin;
  int32_t end;
};

// Builds a step's inputs on the host, uploads them, runs the model, and
// returns the logits of every token.
class StepRunner {
 public:
  StepRunner(Backend* backend, LlamaModel* model) : backend_(backend), model_(model) {}

  std::vector<float> Run(const std::vector<std::vector<TokenId>>& tokens,
                         const std::vector<std::vector<BlockId>>& tables, const std::vector<Chunk>& chunks) {
    std::vector<TokenId> ids;
    std::vector<int32_t> positions, query_start{0}, seq_lens, table_start{0}, rows;
    std::vector<int64_t> slots;
    std::vector<BlockId> flat_tables;
    for (const Chunk& c : chunks) {
      for (int32_t p = c.begin; p < c.end; ++p) {
        rows.push_back(static_cast<int32_t>(ids.size()));
        ids.push_back(tokens[c.seq][p]);
        positions.push_back(p);
        slots.push_back(int64_t{tables[c.seq][p / kBlockSize]} * kBlockSize + p % kBlockSize);
      }
      query_start.push_back(static_cast<int32_t>(ids.size()));
      seq_lens.push_back(c.end);
      flat_tables.insert(flat_tables.end(), tables[c.seq].begin(), tables[c.seq].end());
      table_start.push_back(static_cast<int32_t>(flat_tables.size()));
    }
    ForwardInputs in;
    in.input_ids = Upload(ids)->as<TokenId>();
    in.positions = Upload(positions)->as<int32_t>();
    in.kv_slots = Upload(slots)->as<int64_t>();
    in.num_tokens = static_cast<int32_t>(ids.size());
    in.query_start = Upload(query_start)->as<int32_t>();
    in.seq_lens = Upload(seq_lens)->as<int32_t>();
    in.block_table_start = Upload(table_start)->as<int32_t>();
    in.block_tables = Upload(flat_tables)->as<BlockId>();
    in.num_seqs = static_cast<int32_t>(chunks.size());
    for (const Chunk& c : chunks) {
      in.max_seq_len = std::max(in.max_seq_len, c.end);
      in.max_query_len = std::max(in.max_query_len, c.end - c.begin);
    }
    in.logits_rows = Upload(rows)->as<int32_t>();
    in.num_logits_rows = static_cast<int32_t>(rows.size());
    const size_t n = rows.size() * model_->config().vocab_size;
    auto logits = backend_->Allocate(n * sizeof(float));
    EXPECT_TRUE(logits.ok());
    EXPECT_TRUE(model_->Forward(in, nullptr, nullptr, (*logits)->as<float>()).ok());
    std::vector<float> host(n);
    auto done = backend_->DownloadAsync((*logits)->data(), host.data(), n * sizeof(float));
    EXPECT_TRUE(done.ok() && (*done)->Wait().ok());
    return host;
  }

 private:
  template <typename T>
  DeviceBuffer* Upload(const std::vector<T>& host) {
    auto buffer = backend_->Allocate(std::max<size_t>(1, host.size() * sizeof(T)));
    EXPECT_TRUE(buffer.ok());
    EXPECT_TRUE(backend_->Upload(**buffer, 0, host.data(), host.size() * sizeof(T)).ok());
    keep_.push_back(std::move(buffer).value());
    return keep_.back().get();
  }

  Backend* backend_;
  LlamaModel* model_;
  std::vector<std::unique_ptr<DeviceBuffer>> keep_;
};

class LlamaModelTest : public ::testing::TestWithParam<gguf::GgmlType> {};

TEST_P(LlamaModelTest, PagedBatchedChunkedForwardMatchesReference) {
  gguf::RandomLlamaOptions options;
  options.type = GetParam();
  options.layers = 2;
  options.hidden = 64;
  options.heads = 4;
  options.kv_heads = 2;
  options.intermediate = 128;
  options.tied_embeddings = options.type != gguf::GgmlType::kQ8_0;  // both layouts
  options.seed = 7;
  options.weight_scale = 0.2;
  auto image = gguf::MakeRandomLlama(options);
  ASSERT_TRUE(image.ok()) << image.status();
  auto file = gguf::GgufFile::FromBytes(std::move(image).value());
  ASSERT_TRUE(file.ok()) << file.status();
  auto reference = testing::ReferenceLlama::Load(**file);
  ASSERT_TRUE(reference.ok()) << reference.status();
  const gguf::LlamaConfig& config = reference->config();
  CpuBackend backend(2);
  auto model = LlamaModel::Load(**file, config, &backend, {});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*model)->AllocateKvCache(32, kBlockSize).ok());

  // Three sequences, their blocks scattered over the cache.
  std::mt19937 rng(3);
  const std::vector<int32_t> lengths = {37, 20, 5};
  std::vector<std::vector<TokenId>> tokens(3);
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < lengths[s]; ++i) tokens[s].push_back(rng() % config.vocab_size);
  }
  std::vector<BlockId> free(31);
  std::iota(free.begin(), free.end(), 1);
  std::shuffle(free.begin(), free.end(), rng);
  std::vector<std::vector<BlockId>> tables(3);
  for (int s = 0; s < 3; ++s) {
    for (int b = 0; b * kBlockSize < lengths[s]; ++b) {
      tables[s].push_back(free.back());
      free.pop_back();
    }
  }
  StepRunner runner(&backend, model->get());
  // Step 1: a prefill chunk, a whole prompt and a short one; step 2 finishes
  // the first and continues the third (chunked prefill and decode-like rows).
  const std::vector<std::vector<Chunk>> steps = {{{0, 0, 16}, {1, 0, 20}, {2, 0, 3}}, {{0, 16, 37}, {2, 3, 5}}};
  double max_diff = 0;
  for (const auto& chunks : steps) {
    const std::vector<float> logits = runner.Run(tokens, tables, chunks);
    size_t row = 0;
    for (const Chunk& c : chunks) {
      const auto expected = reference->Logits(absl::MakeConstSpan(tokens[c.seq]).subspan(0, c.end));
      for (int32_t p = c.begin; p < c.end; ++p, ++row) {
        for (int32_t v = 0; v < config.vocab_size; ++v) {
          max_diff = std::max(max_diff, std::abs(double{logits[row * config.vocab_size + v]} - expected[p][v]));
        }
      }
    }
  }
  std::printf("largest logit difference from the reference (%s): %.3g\n",
              std::string(gguf::GgmlTypeName(static_cast<uint32_t>(GetParam()))).c_str(), max_diff);
  RecordProperty("max_logit_diff", std::to_string(max_diff));
  EXPECT_LT(max_diff, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Types, LlamaModelTest,
                         ::testing::Values(gguf::GgmlType::kF32, gguf::GgmlType::kQ8_0, gguf::GgmlType::kQ4_1));

TEST(LlamaModelStagesTest, StagesSplitTheLayers) {
  gguf::RandomLlamaOptions options;
  options.layers = 3;
  auto image = gguf::MakeRandomLlama(options);
  ASSERT_TRUE(image.ok());
  auto file = gguf::GgufFile::FromBytes(std::move(image).value());
  ASSERT_TRUE(file.ok());
  auto config = gguf::ReadLlamaConfig(**file);
  ASSERT_TRUE(config.ok());
  CpuBackend backend(2);
  auto whole = LlamaModel::Load(**file, *config, &backend, {});
  auto first = LlamaModel::Load(**file, *config, &backend, {0, 1});
  auto last = LlamaModel::Load(**file, *config, &backend, {1, -1});
  ASSERT_TRUE(whole.ok() && first.ok() && last.ok());
  EXPECT_TRUE((*first)->is_first_stage() && !(*first)->is_last_stage());
  EXPECT_TRUE(!(*last)->is_first_stage() && (*last)->is_last_stage());
  EXPECT_EQ((*first)->KvBytesPerBlock(16) + (*last)->KvBytesPerBlock(16), (*whole)->KvBytesPerBlock(16));
  EXPECT_FALSE(LlamaModel::Load(**file, *config, &backend, {2, 5}).ok());
}

}  // namespace
}  // namespace tandem::worker
