// `tandem generate`: one prompt through the in-process engine (scheduler,
// async engine loop, model runners on the CPU or a GPU, one per pipeline
// stage); prints the generated text.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/flags.h"
#include "common/rpc/tls_files.h"
#include "nlohmann/json.hpp"
#include "tools/client/grpc_generate_client.h"
#include "tools/in_process/in_process_engine.h"
#include "tools/tandem/commands.h"

namespace tandem::tools {
namespace {

using Json = nlohmann::json;

// One line of JSON; text that is not valid UTF-8 (a model may stop inside a
// character) gets U+FFFD rather than an exception.
void PrintJson(const Json& json) {
  std::printf("%s\n", json.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
}

// Streams the request through a scheduler's Generate API.
int GenerateRemote(const std::string& target, const std::string& prompt, const scheduler::SamplingParams& sampling,
                   bool json, const rpc::TlsFiles& tls) {
  const auto start = std::chrono::steady_clock::now();
  auto result = GenerateRemotely(
      target, prompt, sampling,
      [json](const std::string& text) {
        if (json) return;
        std::fputs(text.c_str(), stdout);
        std::fflush(stdout);
      },
      {}, "", tls);
  if (!json) std::fputs("\n", stdout);
  if (!result.ok()) {
    std::fprintf(stderr, "tandem generate: %s\n", std::string(result.status().message()).c_str());
    return 1;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (json) {
    PrintJson({{"ids", result->tokens}, {"text", result->text}, {"finish_reason", result->finish_reason}});
  }
  std::fprintf(stderr, "[%d prompt tokens, %zu generated (%s) in %.2f s, %.1f tokens/s; via %s]\n",
               result->num_prompt_tokens, result->tokens.size(), result->finish_reason.c_str(), seconds,
               result->tokens.size() / std::max(seconds, 1e-9), target.c_str());
  return 0;
}

}  // namespace

int RunGenerate(const std::vector<std::string>& args) {
  std::string model = DefaultModelPath();
  std::string prompt;
  int64_t max_tokens = 32, threads = 0, top_k = 0, seed = -1;
  double temperature = 0.0, top_p = 1.0, min_p = 0.0;
  int64_t kv_cache_memory = int64_t{1} << 30;
  int64_t device = 0, pipeline_parallel_size = 1;
  bool async_scheduling = true, ignore_eos = false, json = false, enforce_eager = false;
  std::string connect, backend = "cpu", kv_cache_dtype = "auto";
  FlagParser flags("tandem generate",
                   "Generates a continuation of --prompt with the in-process engine and prints it.\n"
                   "Greedy unless --temperature is above 0.");
  flags.AddString("model", &model, "GGUF model file (default: the SmolLM2 model fetched by tools/setup.sh)");
  flags.AddString("prompt", &prompt, "text to continue");
  flags.AddString("connect", &connect, "a tandem-scheduler's HOST:PORT: generate there instead of in this process");
  flags.AddInt("max-tokens", &max_tokens, "tokens to generate at most", 1, 1 << 20);
  flags.AddDouble("temperature", &temperature, "sampling temperature; 0 = greedy");
  flags.AddDouble("top-p", &top_p, "nucleus sampling mass");
  flags.AddInt("top-k", &top_k, "keep the k most likely tokens (0 = off)", 0, 1 << 20);
  flags.AddDouble("min-p", &min_p, "drop tokens below min-p times the most likely one");
  flags.AddInt("seed", &seed, "seed of the random draws (-1 = none)", -1);
  flags.AddBool("ignore-eos", &ignore_eos, "keep going after the end-of-sequence token");
  flags.AddInt("threads", &threads, "CPU threads (0 = all)", 0, 1024);
  flags.AddBytes("kv-cache-memory", &kv_cache_memory, "KV cache budget of each pipeline stage");
  flags.AddString("backend", &backend, "where the model runs: cpu or cuda");
  flags.AddInt("device", &device, "the CUDA device (--backend cuda); every stage runs on it", 0, 1023);
  flags.AddString("kv-cache-dtype", &kv_cache_dtype,
                  "KV cache element type: float16, float32, or auto (float16 on the CPU, float32 on CUDA)");
  flags.AddBool("enforce-eager", &enforce_eager, "--backend cuda: record no CUDA graphs (launch every kernel)");
  flags.AddInt("pipeline-parallel-size", &pipeline_parallel_size, "pipeline stages, as threads of this process", 1,
               64);
  flags.AddBool("async-scheduling", &async_scheduling, "plan step N+1 while step N runs");
  flags.AddBool("json", &json, "print one JSON object with the prompt's and the output's token ids");
  rpc::TlsFiles tls;  // --connect to a scheduler that requires client certificates
  tls.Register(&flags, "scheduler's");
  if (std::optional<int> exit_code = flags.ParseOrExitCode(args)) return *exit_code;
  if (absl::Status s = tls.Validate(); !s.ok()) {
    std::fprintf(stderr, "tandem generate: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (prompt.empty()) {
    std::fprintf(stderr, "tandem generate: --prompt is required\n");
    return 2;
  }
  if (backend != "cpu" && backend != "cuda") {
    std::fprintf(stderr, "tandem generate: flag --backend must be cpu or cuda, got '%s'\n", backend.c_str());
    return 2;
  }
  if (absl::Status s = worker::KvCacheType({backend, 0, 0, kv_cache_dtype}).status(); !s.ok()) {
    std::fprintf(stderr, "tandem generate: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (temperature < 0 || top_p <= 0 || top_p > 1 || min_p < 0 || min_p > 1) {
    std::fprintf(stderr, "tandem generate: --temperature must be >= 0, --top-p in (0, 1], --min-p in [0, 1]\n");
    return 2;
  }
  scheduler::SamplingParams sampling;
  sampling.max_tokens = static_cast<int32_t>(max_tokens);
  sampling.temperature = static_cast<float>(temperature);
  sampling.top_p = static_cast<float>(top_p);
  sampling.top_k = static_cast<int32_t>(top_k);
  sampling.min_p = static_cast<float>(min_p);
  sampling.ignore_eos = ignore_eos;
  if (seed >= 0) sampling.seed = static_cast<uint64_t>(seed);
  if (!connect.empty()) return GenerateRemote(connect, prompt, sampling, json, tls);

  InProcessEngineOptions options;
  options.model_path = model;
  options.threads = static_cast<int32_t>(threads);
  options.kv_cache_bytes = kv_cache_memory;
  options.async_scheduling = async_scheduling;
  options.backend = backend;
  options.device = static_cast<int32_t>(device);
  options.kv_cache_dtype = kv_cache_dtype;
  options.enforce_eager = enforce_eager;
  options.pipeline_parallel_size = static_cast<int32_t>(pipeline_parallel_size);
  const auto load_start = std::chrono::steady_clock::now();
  auto engine = InProcessEngine::Create(options);
  if (!engine.ok()) {
    std::fprintf(stderr, "tandem generate: %s\n", std::string(engine.status().message()).c_str());
    return 1;
  }
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  const std::vector<TokenId> ids = (*engine)->tokenizer().Encode(prompt);
  const auto start = std::chrono::steady_clock::now();
  auto result = (*engine)->Generate(ids, sampling);
  if (!result.ok()) {
    std::fprintf(stderr, "tandem generate: %s\n", std::string(result.status().message()).c_str());
    return 1;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string text = (*engine)->tokenizer().Decode(result->tokens, /*skip_special=*/true);
  if (json) {
    PrintJson({{"prompt_ids", ids},
               {"ids", result->tokens},
               {"text", text},
               {"finish_reason", scheduler::FinishReasonName(result->finish)}});
  } else {
    std::printf("%s\n", text.c_str());
  }
  std::fprintf(stderr, "[%zu prompt tokens, %zu generated (%s) in %.2f s, %.1f tokens/s; model loaded in %.2f s]\n",
               ids.size(), result->tokens.size(), scheduler::FinishReasonName(result->finish), seconds,
               result->tokens.size() / std::max(seconds, 1e-9), load_seconds);
  return 0;
}

}  // namespace tandem::tools
