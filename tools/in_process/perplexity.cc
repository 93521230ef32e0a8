#include "tools/in_process/perplexity.h"

#include <chrono>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/llama_config.h"
#include "common/gguf/model_file.h"
#include "common/status_macros.h"
#include "common/tokenizer/tokenizer.h"
#include "worker/model/llama_model.h"
#include "worker/server/backend_factory.h"

namespace tandem::tools {
namespace {

constexpr int32_t kBlockSize = 16;

// Log-softmax of `logits` at `target`.
double LogProb(const float* logits, int32_t vocab, TokenId target) {
  float max = logits[0];
  for (int32_t i = 1; i < vocab; ++i) max = std::max(max, logits[i]);
  double sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  return logits[target] - max - std::log(sum);
}

// Runs one chunk from an empty cache and returns the logits of every row.
absl::StatusOr<std::vector<float>> ChunkLogits(worker::Backend& backend, worker::LlamaModel& model,
                                               const std::vector<TokenId>& tokens) {
  const int32_t n = static_cast<int32_t>(tokens.size());
  const int32_t vocab = model.config().vocab_size;
  std::vector<int32_t> positions(n), rows(n), query_start{0, n}, seq_lens{n}, table_start{0};
  std::vector<int64_t> slots(n);
  std::vector<BlockId> table;
  for (int32_t p = 0; p < n; ++p) {
    positions[p] = p;
    rows[p] = p;
    slots[p] = int64_t{1 + p / kBlockSize} * kBlockSize + p % kBlockSize;  // block 0 is unused
  }
  for (int32_t b = 0; b * kBlockSize < n; ++b) table.push_back(1 + b);
  table_start.push_back(static_cast<int32_t>(table.size()));
  auto upload = [&](const auto& host) -> absl::StatusOr<std::unique_ptr<worker::DeviceBuffer>> {
    const size_t bytes = host.size() * sizeof(host[0]);
    TANDEM_ASSIGN_OR_RETURN(auto buffer, backend.Allocate(bytes));
    TANDEM_RETURN_IF_ERROR(backend.Upload(*buffer, 0, host.data(), bytes));
    return buffer;
  };
  TANDEM_ASSIGN_OR_RETURN(auto ids_d, upload(tokens));
  TANDEM_ASSIGN_OR_RETURN(auto positions_d, upload(positions));
  TANDEM_ASSIGN_OR_RETURN(auto slots_d, upload(slots));
  TANDEM_ASSIGN_OR_RETURN(auto query_d, upload(query_start));
  TANDEM_ASSIGN_OR_RETURN(auto lens_d, upload(seq_lens));
  TANDEM_ASSIGN_OR_RETURN(auto start_d, upload(table_start));
  TANDEM_ASSIGN_OR_RETURN(auto table_d, upload(table));
  TANDEM_ASSIGN_OR_RETURN(auto rows_d, upload(rows));
  TANDEM_ASSIGN_OR_RETURN(auto logits_d, backend.Allocate(static_cast<size_t>(n) * vocab * sizeof(float)));
  worker::ForwardInputs in;
  in.input_ids = ids_d->as<TokenId>();
  in.positions = positions_d->as<int32_t>();
  in.kv_slots = slots_d->as<int64_t>();
  in.num_tokens = n;
  in.query_start = query_d->as<int32_t>();
  in.seq_lens = lens_d->as<int32_t>();
  in.block_table_start = start_d->as<int32_t>();
  in.block_tables = table_d->as<BlockId>();
  in.num_seqs = 1;
  in.max_seq_len = n;
  in.max_query_len = n;
  in.logits_rows = rows_d->as<int32_t>();
  in.num_logits_rows = n;
  TANDEM_RETURN_IF_ERROR(model.Forward(in, nullptr, nullptr, logits_d->as<float>()));
  std::vector<float> logits(static_cast<size_t>(n) * vocab);
  TANDEM_ASSIGN_OR_RETURN(auto done, backend.DownloadAsync(logits_d->data(), logits.data(), logits.size() * sizeof(float)));
  TANDEM_RETURN_IF_ERROR(done->Wait());
  return logits;
}

}  // namespace

absl::StatusOr<PerplexityResult> ComputePerplexity(const std::string& model_path, const std::string& text,
                                                   int32_t context, int32_t threads,
                                                   const std::string& kv_cache_dtype) {
  const auto start = std::chrono::steady_clock::now();
  TANDEM_ASSIGN_OR_RETURN(auto file, gguf::OpenModelFile(model_path));
  TANDEM_ASSIGN_OR_RETURN(gguf::LlamaConfig config, gguf::ReadLlamaConfig(*file));
  TANDEM_ASSIGN_OR_RETURN(TokenizerData data, ReadTokenizerData(*file));
  TANDEM_ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::Create(std::move(data)));
  const std::vector<TokenId> tokens = tokenizer->Encode(text);
  if (tokens.size() < 2) return absl::InvalidArgumentError("the text has fewer than 2 tokens");
  if (context < 2 || context > config.context_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("--context must be in [2, ", config.context_length, "], got ", context));
  }
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<worker::Backend> backend,
                          worker::MakeBackend({"cpu", 0, threads, kv_cache_dtype}));
  TANDEM_ASSIGN_OR_RETURN(auto model, worker::LlamaModel::Load(*file, config, backend.get(), {}));
  TANDEM_RETURN_IF_ERROR(model->AllocateKvCache(1 + (context + kBlockSize - 1) / kBlockSize, kBlockSize));

  PerplexityResult result;
  double nll = 0;
  const int64_t total = static_cast<int64_t>(tokens.size());
  const bool single = total <= context;
  for (int64_t begin = 0; begin < total; begin += context) {
    const int64_t end = std::min(total, begin + context);
    if (!single && end - begin < context) break;  // as llama.cpp: whole chunks only
    const std::vector<TokenId> chunk(tokens.begin() + begin, tokens.begin() + end);
    TANDEM_ASSIGN_OR_RETURN(std::vector<float> logits, ChunkLogits(*backend, *model, chunk));
    const int64_t first = single ? 0 : static_cast<int64_t>(chunk.size()) / 2;
    for (int64_t j = first; j + 1 < static_cast<int64_t>(chunk.size()); ++j) {
      nll -= LogProb(logits.data() + j * config.vocab_size, config.vocab_size, chunk[j + 1]);
      ++result.tokens_scored;
    }
    ++result.chunks;
  }
  if (result.tokens_scored == 0) return absl::InvalidArgumentError("no whole chunk to score; lower --context");
  result.perplexity = std::exp(nll / result.tokens_scored);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace tandem::tools
