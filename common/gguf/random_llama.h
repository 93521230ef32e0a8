// MakeRandomLlama: a small random-weight Llama model as a GGUF v3 image, laid
// out as llama.cpp lays out SmolLM2 (tensor names, ggml-order shapes,
// llama.* metadata), with a byte-vocabulary GPT-2 tokenizer (one token per
// byte, no merges) and a ChatML template. `tandem make-model` writes it to a
// file; tests build it in memory. The same options and seed give the same
// bytes with any standard library.
#ifndef TANDEM_COMMON_GGUF_RANDOM_LLAMA_H_
#define TANDEM_COMMON_GGUF_RANDOM_LLAMA_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/gguf/ggml_types.h"
#include "common/gguf/gguf_file.h"

namespace tandem::gguf {

struct RandomLlamaOptions {
  std::string name = "tandem-random-llama";
  int64_t layers = 2;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t intermediate = 128;
  int64_t context = 256;
  int64_t vocab = 0;  // 0: the byte vocabulary's size (kByteVocabSize)
  GgmlType type = GgmlType::kF32;  // matrices; norms are always F32
  uint64_t seed = 1;
  bool tied_embeddings = true;
  double rope_base = 10000.0;
  double rms_eps = 1e-5;
  // Standard deviation of the matrix weights. Small keeps activations tame;
  // tests raise it so that outputs depend on the whole context rather than
  // echo the last token (with tied embeddings a near-identity network does).
  double weight_scale = 0.02;
};

// 256 byte tokens, then <|endoftext|> (BOS and EOS), <|im_start|>, <|im_end|>.
inline constexpr int64_t kByteVocabSize = 259;

// Checks relations between the options; the message names the option as the
// `tandem make-model` flag ("--hidden ...").
absl::Status ValidateRandomLlama(const RandomLlamaOptions& options);

// The file image. `parameters`, if set, receives the parameter count.
absl::StatusOr<std::string> MakeRandomLlama(const RandomLlamaOptions& options, int64_t* parameters = nullptr);

// The image opened in memory, as tests use it.
absl::StatusOr<std::unique_ptr<GgufFile>> MakeRandomLlamaFile(const RandomLlamaOptions& options);

}  // namespace tandem::gguf

#endif  // TANDEM_COMMON_GGUF_RANDOM_LLAMA_H_
