// Perplexity of a text under a model, computed as llama.cpp's perplexity
// tool does: the tokens are split into chunks of `context` tokens, each chunk
// is evaluated from an empty cache, and the negative log-likelihood of every
// token in the second half of each chunk is averaged (the first half serves as
// context). A text shorter than one chunk is one chunk, scored from its second
// token on.
#ifndef TANDEM_TOOLS_IN_PROCESS_PERPLEXITY_H_
#define TANDEM_TOOLS_IN_PROCESS_PERPLEXITY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tandem::tools {

struct PerplexityResult {
  double perplexity = 0;
  int64_t tokens_scored = 0;
  int32_t chunks = 0;
  double seconds = 0;
};

// On the CPU backend; `kv_cache_dtype` as worker::BackendChoice's.
absl::StatusOr<PerplexityResult> ComputePerplexity(const std::string& model_path, const std::string& text,
                                                   int32_t context, int32_t threads,
                                                   const std::string& kv_cache_dtype = "auto");

}  // namespace tandem::tools

#endif  // TANDEM_TOOLS_IN_PROCESS_PERPLEXITY_H_
