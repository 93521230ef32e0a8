// ReferenceLlama: the Llama forward pass written as plainly as possible, for
// tests: one sequence, contiguous K/V, double-precision accumulation, no
// batching, no paging, no threads, no Backend. The CPU backend's paged,
// batched, chunked forward must match it within a tight tolerance.
//
// Thread-compatible. Test-only.
#ifndef TANDEM_WORKER_TESTING_REFERENCE_LLAMA_H_
#define TANDEM_WORKER_TESTING_REFERENCE_LLAMA_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/llama_config.h"
#include "common/types.h"

namespace tandem::worker::testing {

class ReferenceLlama {
 public:
  static absl::StatusOr<ReferenceLlama> Load(const gguf::GgufFile& file);

  // Logits after each token of `tokens` (row t predicts token t + 1). With
  // `half_kv`, keys (rotated) and values are rounded to half floats before
  // attention reads them, as a half-float KV cache stores them.
  std::vector<std::vector<float>> Logits(absl::Span<const TokenId> tokens, bool half_kv = false) const;
  const gguf::LlamaConfig& config() const { return config_; }

 private:
  struct Matrix {
    int64_t rows = 0;
    int64_t cols = 0;
    std::vector<float> data;
  };
  struct Layer {
    std::vector<float> attn_norm, ffn_norm;
    Matrix wq, wk, wv, wo, gate, up, down;
  };
  static absl::StatusOr<Matrix> LoadMatrix(const gguf::GgufFile& file, const std::string& name);
  static absl::StatusOr<std::vector<float>> LoadVector(const gguf::GgufFile& file, const std::string& name);
  static std::vector<float> MatVec(const Matrix& m, const std::vector<float>& x);
  std::vector<float> RmsNorm(const std::vector<float>& x, const std::vector<float>& w) const;
  void Rope(std::vector<float>& v, int32_t heads, int32_t position) const;

  gguf::LlamaConfig config_;
  Matrix embedding_, output_;
  std::vector<float> output_norm_;
  std::vector<Layer> layers_;
};

}  // namespace tandem::worker::testing

#endif  // TANDEM_WORKER_TESTING_REFERENCE_LLAMA_H_
