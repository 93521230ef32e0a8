// LlamaConfig: the hyperparameters of a Llama-family decoder, read from a
// GGUF file's metadata ("llama.*" keys). The scheduler uses it for the model's
// limits without loading weights; the worker uses it to build the model.
#ifndef TANDEM_COMMON_GGUF_LLAMA_CONFIG_H_
#define TANDEM_COMMON_GGUF_LLAMA_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"

namespace tandem::gguf {

enum class RopeScaling { kNone, kLinear, kYarn, kLlama3 };

struct LlamaConfig {
  std::string architecture = "llama";
  std::string name;              // general.name, for messages
  int32_t num_layers = 0;        // llama.block_count
  int32_t hidden_size = 0;       // llama.embedding_length
  int32_t intermediate_size = 0; // llama.feed_forward_length
  int32_t num_heads = 0;         // llama.attention.head_count
  int32_t num_kv_heads = 0;      // llama.attention.head_count_kv (defaults to num_heads)
  int32_t head_dim = 0;          // llama.attention.key_length, else hidden_size / num_heads
  int32_t rope_dim = 0;          // llama.rope.dimension_count, else head_dim
  int32_t vocab_size = 0;        // llama.vocab_size, else the tokenizer's token count
  int32_t context_length = 0;    // llama.context_length
  float rope_freq_base = 10000.0f;
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_scaling_factor = 1.0f;
  int32_t rope_original_context_length = 0;
  float rms_norm_eps = 1e-5f;
  // No output.weight tensor: the output projection reuses token_embd.weight.
  bool tied_embeddings = false;
};

// Reads and validates the config (positive sizes, heads divide evenly, the
// tensors the model needs exist with the shapes the config implies). Errors
// name the key or tensor.
absl::StatusOr<LlamaConfig> ReadLlamaConfig(const GgufFile& file);

}  // namespace tandem::gguf

#endif  // TANDEM_COMMON_GGUF_LLAMA_CONFIG_H_
