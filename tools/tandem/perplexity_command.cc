// `tandem perplexity`: the perplexity of a text file under a model
// (tools/in_process/perplexity.h says how it is computed).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/flags.h"
#include "tools/in_process/in_process_engine.h"
#include "tools/in_process/perplexity.h"
#include "tools/tandem/commands.h"
#include "worker/server/backend_factory.h"

namespace tandem::tools {

int RunPerplexity(const std::vector<std::string>& args) {
  std::string model = DefaultModelPath();
  std::string path;
  int64_t context = 512, threads = 0;
  FlagParser flags("tandem perplexity",
                   "Prints the perplexity of a text file under a model, computed like llama.cpp's tool:\n"
                   "chunks of --context tokens, scoring the second half of each.");
  flags.AddString("model", &model, "GGUF model file (default: the SmolLM2 model fetched by tools/setup.sh)");
  flags.AddString("file", &path, "text file to score");
  flags.AddInt("context", &context, "tokens per chunk", 2, 1 << 20);
  flags.AddInt("threads", &threads, "CPU threads (0 = all)", 0, 1024);
  std::string kv_cache_dtype = "auto";
  flags.AddString("kv-cache-dtype", &kv_cache_dtype, "KV cache element type: float16, float32, or auto (float16)");
  if (std::optional<int> exit_code = flags.ParseOrExitCode(args)) return *exit_code;
  if (absl::Status s = worker::KvCacheType({"cpu", 0, 0, kv_cache_dtype}).status(); !s.ok()) {
    std::fprintf(stderr, "tandem perplexity: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  std::ifstream in(path, std::ios::binary);
  if (path.empty() || !in) {
    std::fprintf(stderr, "tandem perplexity: cannot read --file '%s'\n", path.c_str());
    return 2;
  }
  std::stringstream text;
  text << in.rdbuf();
  auto result = ComputePerplexity(model, text.str(), static_cast<int32_t>(context), static_cast<int32_t>(threads),
                                  kv_cache_dtype);
  if (!result.ok()) {
    std::fprintf(stderr, "tandem perplexity: %s\n", std::string(result.status().message()).c_str());
    return 1;
  }
  std::printf("perplexity: %.4f over %lld tokens in %d chunk(s) (%.2f s)\n", result->perplexity,
              static_cast<long long>(result->tokens_scored), result->chunks, result->seconds);
  return 0;
}

}  // namespace tandem::tools
