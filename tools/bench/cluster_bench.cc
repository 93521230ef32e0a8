// cluster_bench: the distributed engine under load. For each configuration
// (pipeline stages x async scheduling on/off) it starts a tandem-scheduler
// and its tandem-workers, sends --requests concurrent requests through the
// gRPC API (random prompts, fixed output length, EOS ignored), and reports
// output tokens/s and each worker's idle fraction: the time its compute
// thread spent waiting between steps, as the worker measures and exports it,
// over the wall time of the run.
//
//   build/bin/cluster_bench --model models/SmolLM2-135M-Instruct.Q4_1.gguf --stages 1,2
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/gguf/model_file.h"
#include "common/gguf/llama_config.h"
#include "tools/client/grpc_generate_client.h"
#include "tools/cluster/local_cluster.h"

namespace tandem::tools {
namespace {

struct Result {
  double tokens_per_second = 0;
  double seconds = 0;
  int64_t tokens = 0;
  std::vector<double> idle_fraction;  // per worker
  int64_t failures = 0;
};

absl::StatusOr<Result> RunOne(const LocalClusterOptions& options, int32_t vocab, int64_t requests, int64_t prompt_tokens,
                              int64_t output_tokens) {
  auto cluster = LocalCluster::Start(options);
  if (!cluster.ok()) return cluster.status();
  const std::string target = (*cluster)->target();
  std::mt19937 rng(1);
  auto prompt = [&] {
    std::vector<TokenId> ids;
    for (int64_t i = 0; i < prompt_tokens; ++i) ids.push_back(static_cast<TokenId>(rng() % vocab));
    return ids;
  };
  scheduler::SamplingParams sampling;
  sampling.temperature = 0.0f;
  sampling.ignore_eos = true;
  sampling.max_tokens = static_cast<int32_t>(output_tokens);
  {
    scheduler::SamplingParams warm = sampling;
    warm.max_tokens = 4;
    auto w = GenerateRemotely(target, "", warm, nullptr, prompt());
    if (!w.ok()) return w.status();
  }
  std::vector<std::vector<TokenId>> prompts;
  for (int64_t i = 0; i < requests; ++i) prompts.push_back(prompt());
  auto before = QueryHealth(target);
  if (!before.ok()) return before.status();
  Result result;
  std::vector<int64_t> counts(requests, 0);
  std::mutex error_mu;
  std::string first_error;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (int64_t i = 0; i < requests; ++i) {
    clients.emplace_back([&, i] {
      auto g = GenerateRemotely(target, "", sampling, nullptr, prompts[i]);
      counts[i] = g.ok() ? static_cast<int64_t>(g->tokens.size()) : -1;
      if (!g.ok()) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (first_error.empty()) first_error = g.status().ToString();
      }
    });
  }
  for (std::thread& t : clients) t.join();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Stats arrive twice a second; wait for the last ones.
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  auto after = QueryHealth(target);
  if (!after.ok()) return after.status();
  for (int64_t c : counts) {
    if (c < 0) {
      ++result.failures;
    } else {
      result.tokens += c;
    }
  }
  result.tokens_per_second = result.tokens / result.seconds;
  if (!first_error.empty()) std::fprintf(stderr, "cluster_bench: a request failed: %s\n", first_error.c_str());
  for (size_t w = 0; w < after->workers.size() && w < before->workers.size(); ++w) {
    const double idle = after->workers[w].idle_seconds - before->workers[w].idle_seconds;
    result.idle_fraction.push_back(idle / result.seconds);
  }
  return result;
}

int Main(int argc, char** argv) {
  LocalClusterOptions base;
  base.scheduler.shutdown_grace = 0;  // nothing to drain between runs
  std::string stages_list = "1,2";
  int64_t requests = 64, prompt_tokens = 64, output_tokens = 64;
  FlagParser flags("cluster_bench", "Throughput and worker idle time of tandem's processes, async on and off.");
  flags.AddString("model", &base.scheduler.model, "GGUF model");
  flags.AddString("stages", &stages_list, "pipeline sizes to run, comma-separated");
  flags.AddInt("requests", &requests, "concurrent requests", 1, 100000);
  flags.AddInt("prompt-tokens", &prompt_tokens, "prompt length", 1, 1 << 20);
  flags.AddInt("output-tokens", &output_tokens, "tokens generated per request", 1, 1 << 20);
  flags.AddInt("threads", &base.worker.threads, "CPU threads per worker (0: the machine's divided among workers)", 0,
               1024);
  flags.AddBytes("kv-cache-memory", &base.worker.kv_cache_memory, "KV memory per worker");
  std::string log_dir;
  flags.AddString("log-dir", &log_dir, "keep the processes' logs under this folder (one subfolder per run)");
  if (std::optional<int> exit_code = flags.ParseOrExitCode(std::vector<std::string>(argv + 1, argv + argc))) {
    return *exit_code;
  }
  auto file = gguf::OpenModelFile(base.scheduler.model);
  if (!file.ok()) {
    std::fprintf(stderr, "cluster_bench: %s\n", std::string(file.status().message()).c_str());
    return 1;
  }
  const auto config = gguf::ReadLlamaConfig(**file);
  base.scheduler.max_num_seqs = std::max<int64_t>(requests, 1);
  std::printf("%s: %lld concurrent requests, %lld prompt + %lld output tokens each\n", config->name.c_str(),
              static_cast<long long>(requests), static_cast<long long>(prompt_tokens),
              static_cast<long long>(output_tokens));
  std::printf("| stages | async | output tokens/s | wall s | worker idle (of wall time) | failures |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (absl::string_view s : absl::StrSplit(stages_list, ',')) {
    int32_t stages = 0;
    if (!absl::SimpleAtoi(s, &stages) || stages < 1) {
      std::fprintf(stderr, "cluster_bench: bad --stages entry '%s'\n", std::string(s).c_str());
      return 2;
    }
    double async_rate = 0;
    for (bool async : {true, false}) {
      LocalClusterOptions o = base;
      o.scheduler.pipeline_parallel_size = stages;
      o.scheduler.async_scheduling = async;
      if (!log_dir.empty()) o.directory = absl::StrCat(log_dir, "/pp", stages, async ? "_async" : "_sync");
      auto r = RunOne(o, config->vocab_size, requests, prompt_tokens, output_tokens);
      if (!r.ok()) {
        std::fprintf(stderr, "cluster_bench: %s\n", std::string(r.status().message()).c_str());
        return 1;
      }
      std::string idle;
      for (size_t w = 0; w < r->idle_fraction.size(); ++w) {
        char buf[48];
        std::snprintf(buf, sizeof(buf), "%srank %zu: %.1f%%", w ? ", " : "", w, 100 * r->idle_fraction[w]);
        idle += buf;
      }
      std::printf("| %d | %s | %.1f | %.2f | %s | %lld |\n", stages, async ? "on" : "off", r->tokens_per_second,
                  r->seconds, idle.c_str(), static_cast<long long>(r->failures));
      std::fflush(stdout);
      if (async) {
        async_rate = r->tokens_per_second;
      } else {
        std::printf("|   | async/sync | %.2fx | | | |\n", async_rate / r->tokens_per_second);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem::tools

int main(int argc, char** argv) { return tandem::tools::Main(argc, argv); }
