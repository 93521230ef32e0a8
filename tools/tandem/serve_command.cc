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
#include "tools/engine/process_group.h"
#include "tools/tandem/commands.h"

namespace tandem::tools {

int RunServe(const std::vector<std::string>& args) {
  ClusterOptions o;
  o.model_path = DefaultModelPath();
  o.port = 50051;
  o.inherit_output = true;
  o.kv_cache_memory = "1GiB";
  int64_t stages = 1, port = o.port, max_num_seqs = 128, max_tokens = 2048, max_model_len = 0, threads = 0;
  bool async_scheduling = true;
  FlagParser flags("tandem serve",
                   "Starts a tandem-scheduler and --pipeline-parallel-size tandem-workers on this machine and\n"
                   "supervises them. The scheduler serves the gRPC Generate API on --host:--port.");
  flags.AddString("model", &o.model_path, "GGUF model file (default: the SmolLM2 model fetched by tools/setup.sh)");
  flags.AddString("host", &o.host, "address to listen on");
  flags.AddInt("port", &port, "gRPC port (0: any free port)", 0, 65535);
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
  if (std::optional<int> exit_code = flags.ParseOrExitCode(args)) return *exit_code;
  o.port = static_cast<int32_t>(port);
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
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::fprintf(stderr, "tandem serve: starting the scheduler and %d worker(s) for %s\n", o.pipeline_parallel_size,
               o.model_path.c_str());
  auto cluster = Cluster::Start(o);
  if (!cluster.ok()) {
    std::fprintf(stderr, "tandem serve: %s\n", std::string(cluster.status().message()).c_str());
    return 1;
  }
  std::fprintf(stderr,
               "tandem serve: ready on %s (gRPC Generate API)\n"
               "  try: build/bin/tandem generate --connect %s --prompt \"The capital of France is\"\n",
               (*cluster)->target().c_str(), (*cluster)->target().c_str());
  int received = 0;
  const std::string exited = (*cluster)->WaitForExit([&] {
    timespec zero{0, 0};
    const int s = sigtimedwait(&signals, nullptr, &zero);
    if (s > 0) received = s;
    return received != 0;
  });
  if (!exited.empty()) {
    std::fprintf(stderr, "tandem serve: %s; stopping the group\n", exited.c_str());
    (*cluster)->Stop();
    return 1;
  }
  std::fprintf(stderr, "tandem serve: shutting down (signal %d)\n", received);
  (*cluster)->Stop();
  return 0;
}

}  // namespace tandem::tools
