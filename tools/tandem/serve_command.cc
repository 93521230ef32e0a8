// `tandem serve`: the one-command local launch. It starts tandem-scheduler
// and one tandem-worker per pipeline stage as child processes, waits until
// the group is ready, and supervises: Ctrl-C or SIGTERM stops every child;
// a child that dies is reported and the rest are stopped too (exit status 1).
// A cluster runs the separate executables instead (deploy/).
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/default_model.h"
#include "common/flags.h"
#include "tools/cluster/local_cluster.h"
#include "tools/tandem/commands.h"

namespace tandem::tools {

int RunServe(const std::vector<std::string>& args) {
  LocalClusterOptions o;
  o.model_path = DefaultModelPath();
  o.port = 50051;
  o.http_port = 8000;
  o.inherit_output = true;
  o.kv_cache_memory = "1GiB";
  int64_t stages = 1, grpc_port = o.port, http_port = o.http_port, max_num_seqs = 128, max_tokens = 2048, max_model_len = 0, threads = 0;
  bool async_scheduling = true;
  FlagParser flags("tandem serve",
                   "Starts a tandem-scheduler and --pipeline-parallel-size tandem-workers on this machine and\n"
                   "supervises them. The scheduler serves the OpenAI-compatible API on http://--host:--port/v1\n"
                   "and the gRPC Generate API (and the workers) on --host:--grpc-port.");
  flags.AddString("model", &o.model_path, "GGUF model file (default: the SmolLM2 model fetched by tools/setup.sh)");
  flags.AddString("host", &o.host, "address to listen on (0.0.0.0 for every interface)");
  flags.AddInt("port", &http_port, "port of the OpenAI-compatible HTTP API (0: any free port)", 0, 65535);
  flags.AddInt("grpc-port", &grpc_port, "port of the gRPC Generate API and the workers (0: any free port)", 0, 65535);
  flags.AddString("api-key", &o.api_key, "require 'Authorization: Bearer KEY' on /v1/ (default: none)");
  flags.AddString("served-model-name", &o.served_model_name, "the model's name in the API (default: the file's name)");
  flags.AddInt("pipeline-parallel-size", &stages, "worker processes (pipeline stages)", 1, 64);
  flags.AddString("kv-cache-memory", &o.kv_cache_memory, "KV cache memory of each worker, e.g. 1GiB");
  flags.AddInt("threads", &threads, "CPU threads per worker (0: the machine's threads divided among the workers)", 0,
               1024);
  flags.AddInt("max-num-seqs", &max_num_seqs, "running requests at most", 1, 1 << 20);
  flags.AddInt("max-num-batched-tokens", &max_tokens, "tokens per step", 1, 1 << 24);
  flags.AddInt("max-model-len", &max_model_len, "positions per request (0: the model's, capped by the KV cache)", 0,
               1 << 24);
  flags.AddBool("async-scheduling", &async_scheduling, "plan step N+1 while step N runs");
  flags.AddDouble("step-timeout", &o.step_timeout_seconds, "seconds to wait for a step before failing it");
  flags.AddString("trace-steps", &o.trace_steps_path, "write every step and result to this file as JSON lines");
  o.shutdown_grace_seconds = 30;
  flags.AddDouble("shutdown-grace", &o.shutdown_grace_seconds,
                  "on Ctrl-C or SIGTERM, seconds to let requests in flight finish (a second signal stops at once)");
  if (std::optional<int> exit_code = flags.ParseOrExitCode(args)) return *exit_code;
  o.port = static_cast<int32_t>(grpc_port);
  o.http_port = static_cast<int32_t>(http_port);
  o.pipeline_parallel_size = static_cast<int32_t>(stages);
  o.max_num_seqs = static_cast<int32_t>(max_num_seqs);
  o.max_num_batched_tokens = static_cast<int32_t>(max_tokens);
  o.max_model_len = static_cast<int32_t>(max_model_len);
  o.async_scheduling = async_scheduling;
  o.worker_threads = static_cast<int32_t>(threads);

  // Signals are taken synchronously below; children get an empty mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);  // the terminal went away: the children are in their own process groups
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::fprintf(stderr, "tandem serve: starting the scheduler and %d worker(s) for %s\n", o.pipeline_parallel_size,
               o.model_path.c_str());
  auto cluster = LocalCluster::Start(o);
  if (!cluster.ok()) {
    std::fprintf(stderr, "tandem serve: %s\n", std::string(cluster.status().message()).c_str());
    return 1;
  }
  const std::string base = absl::StrCat("http://", o.host == "0.0.0.0" ? "127.0.0.1" : o.host, ":", (*cluster)->http_port());
  const std::string auth = o.api_key.empty() ? "" : absl::StrCat(" -H 'Authorization: Bearer ", o.api_key, "'");
  std::fprintf(stderr,
               "tandem serve: ready: OpenAI API on %s/v1, gRPC on %s\n"
               "  try: curl %s/v1/chat/completions%s -H 'Content-Type: application/json' \\\n"
               "         -d '{\"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of France?\"}], "
               "\"max_tokens\": 32, \"temperature\": 0}'\n",
               base.c_str(), (*cluster)->target().c_str(), base.c_str(), auth.c_str());
  int received = 0;
  const std::string exited = (*cluster)->WaitForExit([&] {
    timespec zero{0, 0};
    const int s = sigtimedwait(&signals, nullptr, &zero);
    if (s > 0) received = s;
    return received != 0;
  });
  if (!exited.empty()) {
    std::fprintf(stderr, "tandem serve: %s; stopping the group\n", exited.c_str());
    (*cluster)->Stop([] { return true; });  // the group is broken: nothing to drain
    return 1;
  }
  std::fprintf(stderr, "tandem serve: shutting down (signal %d); again to stop at once\n", received);
  (*cluster)->Stop([&] {
    timespec zero{0, 0};
    return sigtimedwait(&signals, nullptr, &zero) > 0;
  });
  return 0;
}

}  // namespace tandem::tools
