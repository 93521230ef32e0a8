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
#include "common/flags.h"
#include "common/gguf/llama_config.h"
#include "common/gguf/model_file.h"
#include "tools/cluster/local_cluster.h"
#include "tools/tandem/commands.h"
#include "worker/server/backend_factory.h"

namespace tandem::tools {

// Tokens per step for a CPU group when --max-num-batched-tokens is not given:
// about 1 s of prefill on two cores, which bounds a decode's wait for it.
constexpr int64_t kCpuMaxNumBatchedTokens = 256;

// The parent checks what the children would: a bad flag or model file is
// reported once, at once, not by a child after the others started.
absl::Status Validate(const LocalClusterOptions& o) {
  if (absl::Status s = o.scheduler.Validate(); !s.ok()) return s;
  if (absl::Status s = o.worker.Validate(); !s.ok()) return s;
  auto file = gguf::OpenModelFile(o.scheduler.model);
  if (!file.ok()) return file.status();
  auto config = gguf::ReadLlamaConfig(**file);
  if (!config.ok()) return config.status();
  if (o.scheduler.pipeline_parallel_size > config->num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("flag --pipeline-parallel-size: the model has ",
                                                   config->num_layers, " layers, fewer than ",
                                                   o.scheduler.pipeline_parallel_size, " stages"));
  }
  return absl::OkStatus();
}

int RunServe(const std::vector<std::string>& args) {
  LocalClusterOptions o;
  o.port = 50051;
  o.http_port = 8000;
  o.inherit_output = true;
  int64_t grpc_port = o.port, http_port = o.http_port;
  FlagParser flags("tandem serve",
                   "Starts a tandem-scheduler and --pipeline-parallel-size tandem-workers on this machine and\n"
                   "supervises them. The scheduler serves the OpenAI-compatible API on http://--host:--port/v1\n"
                   "and the gRPC Generate API on --host:--grpc-port (the workers dial a free port of their own).");
  flags.AddString("host", &o.host, "address to listen on (0.0.0.0 for every interface)");
  flags.AddInt("port", &http_port, "port of the OpenAI-compatible HTTP API (0: any free port)", 0, 65535);
  flags.AddInt("grpc-port", &grpc_port, "port of the gRPC Generate API (0: any free port)", 0, 65535);
  o.scheduler.Register(&flags);
  // One set of --tls-* files for the scheduler and every worker (and this
  // launcher's health checks): the certificate must name --host (127.0.0.1
  // by default), since the workers dial the scheduler there.
  o.scheduler.RegisterTls(&flags);
  o.worker.Register(&flags);
  if (std::optional<int> exit_code = flags.ParseOrExitCode(args)) return *exit_code;
  // The scheduler's 2048 tokens per step fill a GPU's batch; on a CPU such a
  // step is seconds of prefill that every running decode waits behind (README,
  // "Chunked prefill on the CPU"), so a CPU group gets a smaller budget.
  if (o.worker.backend == "cpu" && !flags.WasSet("max-num-batched-tokens")) {
    o.scheduler.max_num_batched_tokens = kCpuMaxNumBatchedTokens;
  }
  o.port = static_cast<int32_t>(grpc_port);
  o.http_port = static_cast<int32_t>(http_port);
  if (absl::Status s = Validate(o); !s.ok()) {
    std::fprintf(stderr, "tandem serve: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  // A backend the workers cannot have (no CUDA in this build, no usable
  // device) is said once, here, before any child starts.
  if (absl::Status s = worker::BackendAvailable(
          {o.worker.backend, static_cast<int32_t>(o.worker.device), 1, o.worker.kv_cache_dtype});
      !s.ok()) {
    std::fprintf(stderr, "tandem serve: %s\n", std::string(s.message()).c_str());
    return 1;
  }

  // Signals are taken synchronously below; children get an empty mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);  // the terminal went away: the children are in their own process groups
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::fprintf(stderr, "tandem serve: starting the scheduler and %lld worker(s) for %s\n",
               static_cast<long long>(o.scheduler.pipeline_parallel_size), o.scheduler.model.c_str());
  auto cluster = LocalCluster::Start(o);
  if (!cluster.ok()) {
    std::fprintf(stderr, "tandem serve: %s\n", std::string(cluster.status().message()).c_str());
    return 1;
  }
  const std::string base = absl::StrCat(o.scheduler.https_cert.empty() ? "http://" : "https://",
                                       o.host == "0.0.0.0" ? "127.0.0.1" : o.host, ":", (*cluster)->http_port());
  const std::string auth =
      o.scheduler.api_key.empty() ? "" : absl::StrCat(" -H 'Authorization: Bearer ", o.scheduler.api_key, "'");
  std::fprintf(stderr,
               "tandem serve: ready: OpenAI API on %s/v1, gRPC on %s%s\n"
               "  try: curl %s/v1/chat/completions%s -H 'Content-Type: application/json' \\\n"
               "         -d '{\"messages\": [{\"role\": \"user\", \"content\": \"What is the capital of France?\"}], "
               "\"max_tokens\": 32, \"temperature\": 0}'\n",
               base.c_str(), (*cluster)->target().c_str(),
               o.scheduler.tls.enabled() ? " (mutual TLS, the workers' channel too)" : "", base.c_str(), auth.c_str());
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
