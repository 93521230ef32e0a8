// tandem-scheduler: the scheduler process. It serves the worker control
// stream and the Generate API on one gRPC port, the OpenAI-compatible HTTP
// API on another, and runs the engine thread over the group of workers that
// register with it.
//
//   tandem-scheduler --model models/SmolLM2-135M-Instruct.Q4_1.gguf --port 50051 --http-port 8000 \
//       --pipeline-parallel-size 2
//
// The model file gives the tokenizer and the model's limits; the scheduler
// loads no weights. SIGINT or SIGTERM shut it down cleanly.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/default_model.h"
#include "common/file_util.h"
#include "common/flags.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/llama_config.h"
#include "common/tokenizer/tokenizer.h"
#include "scheduler/server/openai/chat_template.h"
#include "scheduler/server/metrics.h"
#include "scheduler/server/http/http_server.h"
#include "scheduler/server/openai/openai_frontend.h"
#include "scheduler/server/grpc/grpc_scheduler_server.h"
#include "scheduler/wire/worker_group.h"
#include "scheduler/server/serving_engine.h"
#include "scheduler/wire/step_trace.h"

namespace tandem::scheduler {
namespace {

struct Flags {
  std::string model = DefaultModelPath();
  std::string host = "127.0.0.1";
  int64_t port = 50051;
  std::string port_file;
  int64_t pipeline_parallel_size = 1;
  int64_t max_num_seqs = 128;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 0;
  int64_t block_size = 16;
  bool async_scheduling = true;
  bool enable_prefix_caching = true;
  double step_timeout = 30.0;
  std::string trace_steps;
  std::string http_host = "127.0.0.1";
  int64_t http_port = 8000;
  std::string http_port_file;
  int64_t http_threads = 2;
  std::string api_key;
  std::string served_model_name;
  double shutdown_grace = 30;
};

// The model file's name without its directory and ".gguf".
std::string ModelFileStem(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0) name.resize(name.size() - 5);
  return name;
}

openai::GroupView ViewOf(const WorkerGroup& group) {
  const GroupStatus status = group.Status();
  openai::GroupView view;
  view.ready = status.ready;
  view.description = status.description;
  for (const WorkerStatus& w : status.workers) {
    view.workers.push_back({w.rank, w.connected, w.busy_seconds, w.idle_seconds, w.steps});
  }
  return view;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "tandem-scheduler: %s\n", message.c_str());
  return 1;
}

int Main(int argc, char** argv) {
  Flags f;
  FlagParser flags("tandem-scheduler",
                   "The scheduler process: plans every step and streams it to the worker processes that\n"
                   "register with it; serves the Generate API.");
  flags.AddString("model", &f.model, "GGUF model (for the tokenizer and limits; no weights are loaded)");
  flags.AddString("host", &f.host, "address to listen on");
  flags.AddInt("port", &f.port, "port to listen on (0: any free port)", 0, 65535);
  flags.AddString("port-file", &f.port_file, "write the port actually bound here");
  flags.AddInt("pipeline-parallel-size", &f.pipeline_parallel_size, "worker processes (pipeline stages)", 1, 64);
  flags.AddInt("max-num-seqs", &f.max_num_seqs, "running requests at most", 1, 1 << 20);
  flags.AddInt("max-num-batched-tokens", &f.max_num_batched_tokens, "tokens per step", 1, 1 << 24);
  flags.AddInt("max-model-len", &f.max_model_len, "positions per request (0: the model's, capped by the KV cache)",
               0, 1 << 24);
  flags.AddInt("block-size", &f.block_size, "tokens per KV block", 1, 1024);
  flags.AddBool("async-scheduling", &f.async_scheduling, "plan step N+1 while step N runs");
  flags.AddBool("enable-prefix-caching", &f.enable_prefix_caching, "reuse KV blocks of shared prefixes");
  flags.AddDouble("step-timeout", &f.step_timeout, "seconds to wait for a step's result before failing it");
  flags.AddString("trace-steps", &f.trace_steps, "write every step and result to this file as JSON lines");
  flags.AddString("http-host", &f.http_host, "address of the OpenAI-compatible HTTP API");
  flags.AddInt("http-port", &f.http_port, "port of the HTTP API (0: any free port; -1: no HTTP API)", -1, 65535);
  flags.AddString("http-port-file", &f.http_port_file, "write the HTTP port actually bound here");
  flags.AddInt("http-threads", &f.http_threads, "threads that serve every HTTP connection", 1, 256);
  flags.AddString("api-key", &f.api_key, "require 'Authorization: Bearer KEY' on /v1/ (default: none)");
  flags.AddString("served-model-name", &f.served_model_name, "the model's name in the API (default: the file's name)");
  flags.AddDouble("shutdown-grace", &f.shutdown_grace,
                  "on SIGTERM, seconds to let requests in flight finish while refusing new ones (0: stop at once)");
  if (std::optional<int> exit_code = flags.ParseOrExitCode(std::vector<std::string>(argv + 1, argv + argc))) {
    return *exit_code;
  }
  if (f.step_timeout <= 0) return Fail("flag --step-timeout must be positive");
  if (f.shutdown_grace < 0) return Fail("flag --shutdown-grace must not be negative");

  auto file = gguf::GgufFile::Open(f.model);
  if (!file.ok()) return Fail(absl::StrCat("cannot open --model ", f.model, ": ", file.status().message()));
  auto model = gguf::ReadLlamaConfig(**file);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  auto tokenizer_data = ReadTokenizerData(**file);
  if (!tokenizer_data.ok()) return Fail(std::string(tokenizer_data.status().message()));
  auto tokenizer = Tokenizer::Create(std::move(tokenizer_data).value());
  if (!tokenizer.ok()) return Fail(std::string(tokenizer.status().message()));

  EngineConfig config;
  config.block_size = static_cast<int32_t>(f.block_size);
  config.max_num_seqs = static_cast<int32_t>(f.max_num_seqs);
  config.max_num_batched_tokens = static_cast<int32_t>(f.max_num_batched_tokens);
  config.max_model_len = static_cast<int32_t>(f.max_model_len);  // 0: derived once the pool is known
  config.enable_prefix_caching = f.enable_prefix_caching;
  config.async_scheduling = f.async_scheduling;
  config.pipeline_parallel_size = static_cast<int32_t>(f.pipeline_parallel_size);
  config.vocab_size = model->vocab_size;
  {
    // Everything but the pool size can be checked now.
    EngineConfig probe = config;
    probe.max_model_len = config.max_model_len > 0 ? config.max_model_len : 2;
    probe.num_kv_blocks = 1 << 30;
    if (absl::Status s = probe.Validate(); !s.ok()) return Fail(std::string(s.message()));
  }

  std::unique_ptr<StepTraceWriter> trace;
  std::vector<StepObserver*> observers;
  if (!f.trace_steps.empty()) {
    auto writer = StepTraceWriter::Open(f.trace_steps);
    if (!writer.ok()) return Fail(std::string(writer.status().message()));
    trace = std::move(writer).value();
    observers.push_back(trace.get());
  }

  std::unique_ptr<ServingEngine> engine;
  WorkerGroupOptions group_options;
  group_options.world_size = config.pipeline_parallel_size;
  group_options.block_size = config.block_size;
  group_options.step_timeout = absl::Seconds(f.step_timeout);
  group_options.on_change = [&engine] {
    if (engine) engine->Wake();
  };
  WorkerGroup group(group_options);
  ServingMetrics metrics;
  engine = std::make_unique<ServingEngine>(config, &group, observers, model->context_length);
  engine->set_listener(&metrics);
  auto server = SchedulerServer::Start(f.host, static_cast<int>(f.port), &group, engine.get(), tokenizer->get());
  if (!server.ok()) return Fail(std::string(server.status().message()));
  const int bound_port = (*server)->port();
  if (!f.port_file.empty()) std::ofstream(f.port_file) << bound_port << "\n";
  std::fprintf(stderr, "tandem-scheduler: listening on %s:%d for %lld worker(s); model %s\n", f.host.c_str(),
               bound_port, static_cast<long long>(f.pipeline_parallel_size), model->name.c_str());
  engine->Start();

  std::unique_ptr<openai::OpenAiFrontend> frontend;
  std::unique_ptr<http::HttpServer> http_server;
  if (f.http_port >= 0) {
    RaiseOpenFileLimit();
    openai::OpenAiFrontendOptions options;
    options.served_model_name = f.served_model_name.empty() ? ModelFileStem(f.model) : f.served_model_name;
    options.api_key = f.api_key;
    options.model_context_length = f.max_model_len > 0 ? static_cast<int32_t>(f.max_model_len) : model->context_length;
    frontend = std::make_unique<openai::OpenAiFrontend>(options, engine.get(), tokenizer->get(),
                                                      openai::ChatTemplate::Create((*tokenizer)->data().chat_template),
                                                      &metrics, [&group] { return ViewOf(group); });
    http::HttpServerOptions http_options;
    http_options.host = f.http_host;
    http_options.port = static_cast<int>(f.http_port);
    http_options.threads = static_cast<int>(f.http_threads);
    http_options.error_body = &openai::OpenAiFrontend::ErrorBodyOf;
    auto started = http::HttpServer::Start(http_options, [&frontend](http::HttpRequest request,
                                                                      std::shared_ptr<http::ResponseWriter> writer) {
      frontend->Handle(std::move(request), std::move(writer));
    });
    if (!started.ok()) {
      (*server)->Shutdown();
      engine->Stop();
      return Fail(std::string(started.status().message()));
    }
    http_server = std::move(started).value();
    if (!f.http_port_file.empty()) std::ofstream(f.http_port_file) << http_server->port() << "\n";
    std::fprintf(stderr, "tandem-scheduler: OpenAI API on http://%s:%d/v1 as model '%s'\n", f.http_host.c_str(),
                 http_server->port(), options.served_model_name.c_str());
  }

  // Block the termination signals here and wait for one.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  int signal = 0;
  sigwait(&signals, &signal);
  if (http_server && f.shutdown_grace > 0) {
    // Rolling restarts: the load balancer sees /ready fail, new requests get
    // 503, and what is in flight finishes (a second signal cuts it short).
    std::fprintf(stderr, "tandem-scheduler: draining (signal %d): new requests get 503; waiting up to %g s\n", signal,
                 f.shutdown_grace);
    http_server->StopAccepting();
    frontend->StartDraining();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(f.shutdown_grace);
    for (;;) {
      const ServingSnapshot s = engine->Snapshot();
      const int64_t in_flight = s.num_running + s.num_waiting + http_server->active_responses();
      if (in_flight == 0) break;
      if (std::chrono::steady_clock::now() >= deadline) {
        std::fprintf(stderr, "tandem-scheduler: %lld request(s) still in flight after --shutdown-grace\n",
                     static_cast<long long>(in_flight));
        break;
      }
      const timespec poll{0, 100 * 1000 * 1000};
      if (sigtimedwait(&signals, nullptr, &poll) > 0) break;
    }
  }
  std::fprintf(stderr, "tandem-scheduler: shutting down (signal %d)\n", signal);
  // HTTP first (no new requests), then gRPC; the engine releases every
  // response writer before the HTTP server's connections are destroyed.
  if (http_server) http_server->Shutdown();
  (*server)->Shutdown();
  engine->Stop();
  engine.reset();
  return 0;
}

}  // namespace
}  // namespace tandem::scheduler

int main(int argc, char** argv) {
  // Block SIGINT/SIGTERM in every thread (gRPC's included) before any start:
  // only Main's sigwait receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return tandem::scheduler::Main(argc, argv);
}
