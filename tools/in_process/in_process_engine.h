// InProcessEngine: the whole engine in one process: a GGUF model on the CPU
// or CUDA backend (one backend per stage, all on the same device), its
// tokenizer, one ModelRunner per pipeline stage (stages run as threads,
// connected by loopback communicators, through staging copies on a GPU), the
// Scheduler and the EngineCore loop, sized from one options struct. `tandem generate`, the benchmarks and
// the cross-component tests use it.
//
//   TANDEM_ASSIGN_OR_RETURN(auto engine, InProcessEngine::Create(options));
//   TANDEM_ASSIGN_OR_RETURN(auto result, engine->Generate(ids, sampling));
//
// Thread-compatible: one thread drives it.
#ifndef TANDEM_TOOLS_IN_PROCESS_IN_PROCESS_ENGINE_H_
#define TANDEM_TOOLS_IN_PROCESS_IN_PROCESS_ENGINE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/default_model.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/llama_config.h"
#include "common/tokenizer/tokenizer.h"
#include "scheduler/core/engine_core.h"
#include "scheduler/core/scheduler.h"
#include "tools/in_process/in_process_executor.h"
#include "tools/in_process/pipeline_executor.h"
#include "worker/backends/backend.h"
#include "worker/comm/loopback_communicator.h"
#include "worker/model/llama_model.h"
#include "worker/runner/model_runner.h"
#include "worker/server/backend_factory.h"

namespace tandem::tools {

struct InProcessEngineOptions {
  std::string model_path;
  int64_t kv_cache_bytes = int64_t{1} << 30;  // KV cache budget of each stage
  int32_t pipeline_parallel_size = 1;
  int32_t threads = 0;                        // 0: every hardware thread (cpu)
  std::string backend = "cpu";                // cpu | cuda
  int32_t device = 0;                         // the CUDA device of every stage
  std::string kv_cache_dtype = "auto";        // worker::BackendChoice::kv_cache_dtype
  bool enforce_eager = false;                 // worker::BackendChoice::enforce_eager
  bool async_scheduling = true;
  int32_t block_size = 16;
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;
  int32_t max_model_len = 0;  // 0: the model's context length, capped by the KV cache
  bool enable_prefix_caching = true;
  uint64_t seed = 0;          // key of unseeded requests' draws; 0: random
};

// What one request got.
struct Generation {
  std::vector<TokenId> tokens;
  scheduler::FinishReason finish = scheduler::FinishReason::kNone;
};

class InProcessEngine {
 public:
  static absl::StatusOr<std::unique_ptr<InProcessEngine>> Create(const InProcessEngineOptions& options);

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const gguf::LlamaConfig& model_config() const { return config_; }
  const scheduler::EngineConfig& engine_config() const { return scheduler_->config(); }
  scheduler::EngineCore& engine() { return *engine_; }
  // How many KV blocks fit in the budget (the pool holds these, block 0 unused).
  int32_t num_kv_blocks() const { return num_kv_blocks_; }
  // KV bytes per block of the largest stage.
  int64_t kv_bytes_per_block() const;

  // Runs every request to completion and returns what each got.
  absl::StatusOr<std::map<RequestId, Generation>> Run(std::vector<scheduler::RequestSpec> requests);
  // One request: `prompt` ids with `sampling`; EOS comes from the tokenizer.
  absl::StatusOr<Generation> Generate(std::vector<TokenId> prompt, scheduler::SamplingParams sampling);

 private:
  InProcessEngine() = default;

  std::unique_ptr<gguf::GgufFile> file_;
  gguf::LlamaConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::unique_ptr<worker::Backend>> backends_;  // one per stage
  std::vector<std::unique_ptr<worker::LlamaModel>> models_;
  std::unique_ptr<worker::LoopbackHub> hub_;
  std::vector<std::unique_ptr<worker::PipelineTransport>> transports_;  // one per stage
  std::vector<std::unique_ptr<worker::ModelRunner>> runners_;
  std::unique_ptr<scheduler::Executor> executor_;
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  std::unique_ptr<scheduler::EngineCore> engine_;
  int32_t num_kv_blocks_ = 0;
  RequestId next_id_ = 1;
};


}  // namespace tandem::tools

#endif  // TANDEM_TOOLS_IN_PROCESS_IN_PROCESS_ENGINE_H_
