#include "tools/in_process/in_process_engine.h"


#include <algorithm>
#include <filesystem>
#include <limits>
#include <thread>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/gguf/model_file.h"
#include "common/status_macros.h"

namespace tandem::tools {

absl::StatusOr<std::unique_ptr<InProcessEngine>> InProcessEngine::Create(const InProcessEngineOptions& options) {
  std::unique_ptr<InProcessEngine> e(new InProcessEngine());
  TANDEM_ASSIGN_OR_RETURN(e->file_, gguf::OpenModelFile(options.model_path));
  TANDEM_ASSIGN_OR_RETURN(e->config_, gguf::ReadLlamaConfig(*e->file_));
  TANDEM_ASSIGN_OR_RETURN(TokenizerData tokenizer_data, ReadTokenizerData(*e->file_));
  TANDEM_ASSIGN_OR_RETURN(e->tokenizer_, Tokenizer::Create(std::move(tokenizer_data)));

  const int32_t stages = options.pipeline_parallel_size;
  if (stages < 1 || stages > e->config_.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline_parallel_size must be in [1, ", e->config_.num_layers,
                                                   "] (the model's layers), got ", stages));
  }
  // Each stage gets its share of the threads, and the KV budget for itself,
  // as a worker process would; the pool is what the smallest stage holds.
  const int32_t hardware = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  const int32_t threads = std::max(1, (options.threads > 0 ? options.threads : hardware) / stages);
  int64_t blocks = std::numeric_limits<int64_t>::max();
  for (int32_t s = 0; s < stages; ++s) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<worker::Backend> backend,
                            worker::MakeBackend({options.backend, options.device, threads, options.kv_cache_dtype,
                                                                 options.enforce_eager}));
    e->backends_.push_back(std::move(backend));
    TANDEM_ASSIGN_OR_RETURN(auto model, worker::LlamaModel::Load(*e->file_, e->config_, e->backends_.back().get(),
                                                                 worker::PipelineStage(e->config_.num_layers, stages, s)));
    blocks = std::min(blocks, options.kv_cache_bytes / model->KvBytesPerBlock(options.block_size));
    e->models_.push_back(std::move(model));
  }
  if (blocks < 2) {
    return absl::InvalidArgumentError(absl::StrCat("a KV cache of ", options.kv_cache_bytes, " bytes holds ", blocks,
                                                   " blocks of ", e->kv_bytes_per_block(), " bytes; at least 2 are needed"));
  }
  e->num_kv_blocks_ = static_cast<int32_t>(std::min<int64_t>(blocks, 1 << 24));
  if (stages > 1) e->hub_ = std::make_unique<worker::LoopbackHub>(stages);
  worker::ModelRunnerOptions runner_options;
  runner_options.block_size = options.block_size;
  runner_options.unseeded_rng_key = options.seed != 0 ? options.seed : std::random_device{}();
  std::vector<worker::ModelRunner*> runners;
  for (int32_t s = 0; s < stages; ++s) {
    TANDEM_RETURN_IF_ERROR(e->models_[s]->AllocateKvCache(e->num_kv_blocks_, options.block_size));
    if (stages > 1) {
      // Loopback moves host memory: a GPU's stages pass through staging copies.
      e->transports_.push_back(worker::OverHostCommunicator(
          *e->backends_[s], std::make_unique<worker::LoopbackCommunicator>(e->hub_.get(), s)));
      runner_options.communicator = e->transports_.back()->hidden();
      runner_options.token_communicator = e->transports_.back()->tokens();
    }
    e->runners_.push_back(
        std::make_unique<worker::ModelRunner>(e->backends_[s].get(), e->models_[s].get(), runner_options));
    runners.push_back(e->runners_.back().get());
  }
  if (stages == 1) {
    e->executor_ = std::make_unique<InProcessExecutor>(runners[0]);
  } else {
    e->executor_ = std::make_unique<PipelineExecutor>(runners, e->hub_.get(), absl::Seconds(60));
  }

  scheduler::EngineConfig config;
  config.block_size = options.block_size;
  config.num_kv_blocks = e->num_kv_blocks_;
  config.max_num_batched_tokens = options.max_num_batched_tokens;
  config.max_num_seqs = options.max_num_seqs;
  const int32_t cache_tokens = (e->num_kv_blocks_ - 1) * options.block_size;
  config.max_model_len = options.max_model_len > 0 ? options.max_model_len
                                                   : std::min(e->config_.context_length, cache_tokens);
  config.enable_prefix_caching = options.enable_prefix_caching;
  config.async_scheduling = options.async_scheduling;
  config.vocab_size = e->config_.vocab_size;
  config.pipeline_parallel_size = stages;
  // Per process, so prefix-cache keys cannot be predicted from outside.
  config.prefix_cache_hash_seed = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  TANDEM_ASSIGN_OR_RETURN(e->scheduler_, scheduler::Scheduler::Create(config));
  e->engine_ = std::make_unique<scheduler::EngineCore>(e->scheduler_.get(), e->executor_.get());
  return e;
}

int64_t InProcessEngine::kv_bytes_per_block() const {
  int64_t bytes = 0;
  for (const auto& model : models_) bytes = std::max(bytes, model->KvBytesPerBlock(scheduler_ ? scheduler_->config().block_size : 16));
  return bytes;
}

absl::StatusOr<std::map<RequestId, Generation>> InProcessEngine::Run(std::vector<scheduler::RequestSpec> requests) {
  std::map<RequestId, Generation> results;
  for (scheduler::RequestSpec& spec : requests) {
    results[spec.id];
    TANDEM_RETURN_IF_ERROR(engine_->AddRequest(std::move(spec)));
  }
  while (engine_->HasWork()) {
    TANDEM_ASSIGN_OR_RETURN(scheduler::EngineStepResult step, engine_->Step());
    for (const scheduler::RequestOutput& out : step.outputs) {
      Generation& g = results[out.id];
      g.tokens.insert(g.tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      if (out.finished()) g.finish = out.finish_reason;
    }
  }
  return results;
}

absl::StatusOr<Generation> InProcessEngine::Generate(std::vector<TokenId> prompt, scheduler::SamplingParams sampling) {
  if (!sampling.eos_token_id && tokenizer_->eos_token_id() >= 0) sampling.eos_token_id = tokenizer_->eos_token_id();
  scheduler::RequestSpec spec;
  spec.id = next_id_++;
  spec.prompt_token_ids = std::move(prompt);
  spec.sampling = std::move(sampling);
  const RequestId id = spec.id;
  std::vector<scheduler::RequestSpec> one;
  one.push_back(std::move(spec));
  TANDEM_ASSIGN_OR_RETURN(auto results, Run(std::move(one)));
  return results[id];
}

}  // namespace tandem::tools
