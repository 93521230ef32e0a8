// LlamaModel: a Llama-family decoder (GQA, RoPE, RMSNorm, SwiGLU, optionally
// tied embeddings) over a Backend, for one pipeline stage: layers
// [first_layer, end_layer). The first stage embeds token ids; the last
// normalizes and projects the requested rows to logits; a middle stage takes
// and returns hidden states (for Llama the residual stream is the hidden
// state itself).
//
// Paged attention: K and V of every layer live in the backend's memory as
// [num_blocks, block_size, kv_heads, head_dim]; each token's K/V goes to the
// slot the scheduler's block table gives it. Within a layer, every token's
// K/V is written before any attention reads, so a request may read blocks
// another request of the same step writes (prefix-cache dedup).
//
// Thread-compatible: driven by the worker's compute thread.
#ifndef TANDEM_WORKER_MODEL_LLAMA_MODEL_H_
#define TANDEM_WORKER_MODEL_LLAMA_MODEL_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/llama_config.h"
#include "worker/backends/backend.h"

namespace tandem::worker {

struct LlamaModelStage {
  int32_t first_layer = 0;
  int32_t end_layer = -1;  // -1: the last layer
};

// One step's flattened batch, in device memory.
struct ForwardInputs {
  const TokenId* input_ids = nullptr;     // [num_tokens], first stage
  const int32_t* positions = nullptr;     // [num_tokens]
  const int64_t* kv_slots = nullptr;      // [num_tokens]
  int32_t num_tokens = 0;
  const int32_t* query_start = nullptr;   // [num_seqs + 1]
  const int32_t* seq_lens = nullptr;      // [num_seqs]
  const int32_t* block_table_start = nullptr;  // [num_seqs + 1]
  const BlockId* block_tables = nullptr;
  int32_t num_seqs = 0;
  int32_t max_seq_len = 0;    // host: the longest context of a sequence
  int32_t max_query_len = 0;  // host: the most tokens of one sequence
  const int32_t* logits_rows = nullptr;   // [num_logits_rows], last stage
  int32_t num_logits_rows = 0;
};

// Layers [first, end) of pipeline stage `stage` of `num_stages`: contiguous
// ranges, the earlier stages taking one more layer when they do not divide.
LlamaModelStage PipelineStage(int32_t num_layers, int32_t num_stages, int32_t stage);

class LlamaModel {
 public:
  using Stage = LlamaModelStage;

  // Loads the stage's weights into `backend` (which must outlive the model).
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const gguf::GgufFile& file,
                                                          const gguf::LlamaConfig& config, Backend* backend,
                                                          Stage stage);

  const gguf::LlamaConfig& config() const { return config_; }
  bool is_first_stage() const { return first_layer_ == 0; }
  bool is_last_stage() const { return end_layer_ == config_.num_layers; }
  int32_t num_stage_layers() const { return end_layer_ - first_layer_; }
  // Bytes of weights this stage holds in the backend.
  int64_t weight_bytes() const { return weight_bytes_; }

  // KV cache bytes one block of `block_size` tokens takes on this stage.
  int64_t KvBytesPerBlock(int32_t block_size) const;
  absl::Status AllocateKvCache(int32_t num_blocks, int32_t block_size);
  int32_t num_kv_blocks() const { return num_kv_blocks_; }

  // Runs the stage. `hidden_in` (middle/last stages) and `hidden_out`
  // (first/middle stages) are [num_tokens, hidden]; `logits` (last stage) is
  // [num_logits_rows, vocab]. All are device pointers.
  // The pass goes through Backend::RunRecorded, keyed by the step's shape
  // and buffers, so a device backend replays one recording for every step
  // of the same shape (decode steps whose contexts grow by a token are).
  absl::Status Forward(const ForwardInputs& in, const float* hidden_in, float* hidden_out, float* logits);

  // Steps' max_seq_len is passed on rounded up to a multiple of this (still
  // a bound), so that it changes once in this many tokens, not every step.
  static constexpr int32_t kSeqLenBucket = 256;
  // The key Forward gives RunRecorded for `in` (with max_seq_len as passed
  // on): every host value and address the pass's launches depend on.
  std::vector<int64_t> RecordingKey(const ForwardInputs& in, const float* hidden_in, const float* hidden_out,
                                    const float* logits) const;

 private:
  // Bytes of K (or V) one layer's block of `block_size` tokens takes.
  int64_t KvBytesPerLayerBlock(int32_t block_size) const;

  struct Layer {
    std::unique_ptr<DeviceBuffer> attn_norm;
    std::unique_ptr<DeviceBuffer> ffn_norm;
    Weight wq, wk, wv, wo, gate, up, down;
    std::unique_ptr<DeviceBuffer> k_cache;
    std::unique_ptr<DeviceBuffer> v_cache;
  };

  LlamaModel(const gguf::LlamaConfig& config, Backend* backend, Stage stage);
  absl::Status LoadWeights(const gguf::GgufFile& file);
  absl::Status EnsureScratch(int32_t num_tokens);
  absl::Status RunLayer(Layer& layer, const ForwardInputs& in);
  absl::Status ForwardPass(const ForwardInputs& in, const float* hidden_in, float* hidden_out, float* logits);

  const gguf::LlamaConfig config_;
  Backend* const backend_;
  const int32_t first_layer_;
  const int32_t end_layer_;
  int32_t block_size_ = 0;
  int32_t num_kv_blocks_ = 0;
  int64_t weight_bytes_ = 0;

  Weight embedding_;  // first stage, and the tied output projection
  Weight output_;     // last stage, untied
  std::unique_ptr<DeviceBuffer> output_norm_;
  std::vector<Layer> layers_;

  // Activations, grown to the largest step seen.
  int32_t scratch_tokens_ = 0;
  // A new process-wide value whenever the activations or the KV cache are
  // (re)allocated: their addresses are in every recording.
  int64_t buffers_generation_ = 0;
  std::unique_ptr<DeviceBuffer> x_, h_, q_, k_, v_, attn_, gate_, up_, rows_;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_MODEL_LLAMA_MODEL_H_
