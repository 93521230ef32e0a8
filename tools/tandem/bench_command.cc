// `tandem bench`: a serving benchmark against any OpenAI-compatible HTTP
// endpoint, like `vllm bench serve` with its random dataset: same flags, same
// metric definitions, same result table and result-file keys.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/default_model.h"
#include "common/flags.h"
#include "common/file_util.h"
#include "common/tokenizer/tokenizer.h"
#include "tools/bench/serve_bench.h"
#include "tools/tandem/commands.h"

namespace tandem::tools {
namespace {

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "tandem bench: %s\n", message.c_str());
  return code;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path) {
  auto tokenizer = LoadTokenizerFile(path);
  if (!tokenizer.ok() && absl::IsNotFound(tokenizer.status())) {
    return absl::NotFoundError(absl::StrCat("--tokenizer: ", tokenizer.status().message()));
  }
  return tokenizer;
}

// "\r[=========>          ] 37/100" on stderr.
void DrawProgress(int64_t finished, int64_t total) {
  constexpr int kWidth = 40;
  const int filled = static_cast<int>(kWidth * finished / std::max<int64_t>(total, 1));
  std::string bar(kWidth, ' ');
  std::fill(bar.begin(), bar.begin() + filled, '=');
  if (filled < kWidth && filled > 0) bar[filled - 1] = '>';
  std::fprintf(stderr, "\r[%s] %lld/%lld", bar.c_str(), static_cast<long long>(finished),
               static_cast<long long>(total));
  if (finished == total) std::fputs("\n", stderr);
  std::fflush(stderr);
}

// Prints the failures, the table and the result file; the exit code.
int Report(const bench::BenchmarkConfig& config, const bench::BenchmarkRun& run, const std::string& result_file) {
  int failed = 0;
  for (const bench::RequestOutput& output : run.outputs) {
    if (output.success) continue;
    if (failed++ < 5) std::fprintf(stderr, "tandem bench: request failed: %s\n", output.error.c_str());
  }
  if (failed > 5) std::fprintf(stderr, "tandem bench: ... and %d more failed requests\n", failed - 5);
  const bench::BenchmarkMetrics metrics = bench::CalculateMetrics(run.outputs, run.duration_s);
  std::fputs(bench::FormatMetricsTable(config, metrics).c_str(), stdout);
  std::fflush(stdout);
  if (!result_file.empty()) {
    std::ofstream out(result_file, std::ios::binary | std::ios::trunc);
    out << bench::ResultJson(config, metrics, run.outputs) << "\n";
    out.close();
    if (!out) return Fail(1, absl::StrCat("cannot write --result-file ", result_file));
  }
  if (metrics.completed == 0) return Fail(1, "no request completed; see the errors above");
  return 0;
}

}  // namespace

int RunBench(const std::vector<std::string>& args) {
  std::string base_url = "http://127.0.0.1:8000", tokenizer_path = DefaultModelPath(), result_file;
  bench::ClientOptions client;
  bench::RandomDatasetOptions dataset;
  int64_t seed = 0;
  bool disable_progress_bar = false;
  FlagParser flags("tandem bench",
                   "Benchmarks an OpenAI-compatible server with vLLM's random dataset, as `vllm bench serve`:\n"
                   "streamed requests, TTFT / TPOT / ITL / E2EL (mean, median, P99, std) and throughput.\n"
                   "Prints the result table to stdout; --result-file saves every figure as JSON.");
  flags.AddString("base-url", &base_url, "the server, http://HOST:PORT[/PREFIX]");
  flags.AddString("endpoint", &client.endpoint, "/v1/completions or /v1/chat/completions");
  flags.AddString("model", &client.model, "model name sent in requests (default: the first id of GET /v1/models)");
  flags.AddString("tokenizer", &tokenizer_path,
                  "GGUF file whose tokenizer builds the prompts (default: the SmolLM2 model)");
  flags.AddInt("num-prompts", &dataset.num_prompts, "requests to send", 1, 10'000'000);
  flags.AddInt("random-input-len", &dataset.input_len, "prompt tokens per request", 1, 1 << 24);
  flags.AddInt("random-output-len", &dataset.output_len, "max_tokens per request", 1, 1 << 24);
  flags.AddDouble("random-range-ratio", &dataset.range_ratio,
                  "lengths uniform in [len * (1 - r), len * (1 + r)], r in [0, 1)");
  flags.AddBool("ignore-eos", &client.ignore_eos, "send \"ignore_eos\": true so every request generates max_tokens");
  flags.AddInt("max-concurrency", &client.max_concurrency, "requests in flight at most (0: unlimited)", 0, 1 << 24);
  flags.AddDouble("request-rate", &client.request_rate, "requests per second, Poisson arrivals (inf: all at once)");
  flags.AddInt("num-warmups", &client.num_warmups, "requests sent and awaited before measuring", 0, 1 << 24);
  flags.AddInt("seed", &seed, "seed of the dataset and the arrival times", 0);
  flags.AddString("result-file", &result_file, "write the figures and per-request arrays here as JSON");
  flags.AddString("api-key", &client.api_key, "sent as Authorization: Bearer KEY");
  flags.AddDouble("temperature", &client.temperature, "sampling temperature of the requests");
  flags.AddBool("disable-progress-bar", &disable_progress_bar, "no progress line on stderr");
  if (std::optional<int> exit_code = flags.ParseOrExitCode(args)) return *exit_code;

  dataset.seed = client.seed = static_cast<uint64_t>(seed);
  if (absl::Status s = bench::ValidateRandomDatasetOptions(dataset); !s.ok()) return Fail(2, std::string(s.message()));
  if (!(client.request_rate > 0)) return Fail(2, "--request-rate must be positive (inf: all at once)");
  if (!(client.temperature >= 0)) return Fail(2, "--temperature must be >= 0");
  if (client.endpoint.empty() || client.endpoint.front() != '/') {
    return Fail(2, "--endpoint must be a path such as /v1/completions or /v1/chat/completions");
  }
  absl::StatusOr<bench::ServerAddress> server = bench::ParseBaseUrl(base_url);
  if (!server.ok()) return Fail(2, std::string(server.status().message()));
  client.server = *server;

  if (client.model.empty()) {
    absl::StatusOr<std::string> model = bench::FetchFirstModelId(client.server, client.api_key);
    if (!model.ok()) return Fail(1, std::string(model.status().message()));
    client.model = *model;
  }
  auto tokenizer = LoadTokenizer(tokenizer_path);
  if (!tokenizer.ok()) return Fail(1, std::string(tokenizer.status().message()));
  const std::vector<bench::BenchRequest> requests = bench::SampleRandomRequests(**tokenizer, dataset);

  RaiseOpenFileLimit();
  if (!disable_progress_bar && isatty(STDERR_FILENO)) client.on_progress = DrawProgress;
  std::printf("Model: %s at %s%s\n", client.model.c_str(), base_url.c_str(), client.endpoint.c_str());
  std::printf("Traffic request rate: %s\n",
              std::isinf(client.request_rate) ? "inf" : absl::StrCat(client.request_rate).c_str());
  std::printf("Burstiness factor: 1.0 (Poisson process)\n");
  std::printf("Maximum request concurrency: %s\n",
              client.max_concurrency > 0 ? absl::StrCat(client.max_concurrency).c_str() : "None");
  if (client.num_warmups > 0) {
    std::printf("Warming up with %lld requests...\n", static_cast<long long>(client.num_warmups));
  }
  std::fflush(stdout);

  absl::StatusOr<bench::BenchmarkRun> run = bench::RunBenchmark(client, requests);
  if (!run.ok()) return Fail(1, std::string(run.status().message()));

  bench::BenchmarkConfig config;
  config.backend = bench::IsChatEndpoint(client.endpoint) ? "openai-chat" : "openai";
  config.base_url = base_url;
  config.endpoint = client.endpoint;
  config.model = client.model;
  config.tokenizer = tokenizer_path;
  config.num_prompts = dataset.num_prompts;
  config.request_rate = client.request_rate;
  config.max_concurrency = client.max_concurrency;
  return Report(config, *run, result_file);
}

}  // namespace tandem::tools
