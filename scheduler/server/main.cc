// tandem-scheduler: the scheduler process. It serves the OpenAI-compatible
// HTTP API, the worker control stream and the gRPC Generate API (on one gRPC
// port), and runs the engine thread over the group of workers that register
// with it.
//
//   tandem-scheduler --model models/SmolLM2-135M-Instruct.Q4_1.gguf --port 50051 --http-port 8000
//       --pipeline-parallel-size 2
//
// The model file gives the tokenizer and the model's limits; the scheduler
// loads no weights. SIGINT or SIGTERM drain the HTTP API and shut it down.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/file_util.h"
#include "common/flags.h"
#include "common/gguf/llama_config.h"
#include "common/gguf/model_file.h"
#include "common/rpc/grpc_options.h"
#include "common/tokenizer/tokenizer.h"
#include "scheduler/server/grpc/grpc_scheduler_server.h"
#include "scheduler/server/http/http_server.h"
#include "scheduler/server/metrics.h"
#include "scheduler/server/openai/chat_template.h"
#include "scheduler/server/openai/openai_frontend.h"
#include "scheduler/server/scheduler_flags.h"
#include "scheduler/server/serving_engine.h"
#include "scheduler/wire/step_trace.h"
#include "scheduler/wire/worker_group.h"

namespace tandem::scheduler {
namespace {

// Where this process listens; a launcher chooses these (SchedulerFlags has
// the rest).
struct ListenFlags {
  std::string host = "127.0.0.1";
  int64_t port = 50051;
  std::string port_file;
  int64_t worker_port = -1;
  std::string worker_port_file;
  std::string worker_socket;
  std::string http_host = "127.0.0.1";
  int64_t http_port = 8000;
  std::string http_port_file;

  void Register(FlagParser* flags) {
    flags->AddString("host", &host, "address of the gRPC port (the workers and the Generate API)");
    flags->AddInt("port", &port, "the gRPC port (0: any free port)", 0, 65535);
    flags->AddString("port-file", &port_file, "write the gRPC port actually bound here");
    flags->AddInt("worker-port", &worker_port,
                  "a port of their own for the workers, on --host (0: any free port; -1: they dial --port).\n"
                  "Faster: the engine thread then reads their results itself (README, Control plane)",
                  -1, 65535);
    flags->AddString("worker-port-file", &worker_port_file, "write the workers' port actually bound here");
    flags->AddString("worker-socket", &worker_socket,
                     "a Unix socket of their own for workers on this machine (they dial unix:PATH): the fastest\n"
                     "control plane (README, Control plane); with --worker-port, remote workers dial that");
    flags->AddString("http-host", &http_host, "address of the OpenAI-compatible HTTP API");
    flags->AddInt("http-port", &http_port, "port of the HTTP API (0: any free port; -1: no HTTP API)", -1, 65535);
    flags->AddString("http-port-file", &http_port_file, "write the HTTP port actually bound here");
  }
};

// What the scheduler needs of the model: no weights.
struct ModelInfo {
  gguf::LlamaConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
};

// " on port P and unix:PATH" for the startup line: where workers dial when
// not on the gRPC port.
std::string WorkersWhere(const SchedulerServer::WorkerListen& workers, const SchedulerServer& server) {
  std::string where;
  if (workers.port != SchedulerServer::kWorkersOnMainPort) where = absl::StrCat(" on port ", server.worker_port());
  if (!workers.socket.empty()) absl::StrAppend(&where, where.empty() ? " on " : " and ", "unix:", workers.socket);
  return where;
}

absl::StatusOr<ModelInfo> ReadModelInfo(const std::string& path) {
  auto file = gguf::OpenModelFile(path);
  if (!file.ok()) return file.status();
  ModelInfo info;
  auto config = gguf::ReadLlamaConfig(**file);
  if (!config.ok()) return config.status();
  info.config = *std::move(config);
  auto tokenizer_data = ReadTokenizerData(**file);
  if (!tokenizer_data.ok()) return tokenizer_data.status();
  auto tokenizer = Tokenizer::Create(*std::move(tokenizer_data));
  if (!tokenizer.ok()) return tokenizer.status();
  info.tokenizer = *std::move(tokenizer);
  return info;
}

openai::GroupView ViewOf(const WorkerGroup& group) {
  const GroupStatus status = group.Status();
  openai::GroupView view;
  view.ready = status.ready;
  view.description = status.description;
  for (const WorkerStatus& w : status.workers) {
    view.workers.push_back({w.rank, w.connected, w.busy_seconds, w.idle_seconds, w.steps, w.backend, w.device});
  }
  return view;
}

void WritePortFile(const std::string& path, int port) {
  if (!path.empty()) std::ofstream(path) << port << "\n";
}

// The OpenAI-compatible API: the frontend and the server that carries it.
struct HttpApi {
  std::unique_ptr<openai::OpenAiFrontend> frontend;
  std::unique_ptr<http::HttpServer> server;
};

absl::StatusOr<HttpApi> StartHttpApi(const SchedulerFlags& f, const ListenFlags& listen, const ModelInfo& model,
                                     ServingEngine* engine, ServingMetrics* metrics, const WorkerGroup* group) {
  RaiseOpenFileLimit();
  HttpApi api;
  openai::OpenAiFrontendOptions options;
  options.served_model_name = f.ServedModelName();
  options.api_key = f.api_key;
  options.auto_tool_choice = f.enable_auto_tool_choice;
  options.model_context_length = f.max_model_len > 0 ? static_cast<int32_t>(f.max_model_len) : model.config.context_length;
  // The chat template: --chat-template's file, else the GGUF's; a file that does not parse stops the start.
  const Tokenizer& tok = *model.tokenizer;
  openai::ChatTemplateOptions chat_options;
  if (tok.bos_token_id() >= 0) chat_options.bos_token = tok.TokenBytes(tok.bos_token_id());
  if (tok.eos_token_id() >= 0) chat_options.eos_token = tok.TokenBytes(tok.eos_token_id());
  std::string chat_jinja = tok.data().chat_template;
  if (!f.chat_template.empty()) {
    std::ifstream in(f.chat_template);
    chat_jinja.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  absl::StatusOr<openai::ChatTemplate> chat_template = openai::ChatTemplate::Create(chat_jinja, chat_options);
  if (!f.chat_template.empty() && !chat_template.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--chat-template ", f.chat_template, ": ", chat_template.status().message()));
  }
  api.frontend = std::make_unique<openai::OpenAiFrontend>(options, engine, model.tokenizer.get(), std::move(chat_template),
                                                          metrics, [group] { return ViewOf(*group); });
  http::HttpServerOptions http_options;
  http_options.host = listen.http_host;
  http_options.port = static_cast<int>(listen.http_port);
  http_options.threads = static_cast<int>(f.http_threads);
  http_options.request_timeout_seconds = f.http_request_timeout;
  http_options.error_body = &openai::OpenAiFrontend::ErrorBodyOf;
  http_options.tls_cert_file = f.https_cert;
  http_options.tls_key_file = f.https_key;
  openai::OpenAiFrontend* frontend = api.frontend.get();
  auto server = http::HttpServer::Start(
      http_options, [frontend](http::HttpRequest request, std::shared_ptr<http::ResponseWriter> writer) {
        frontend->Handle(std::move(request), std::move(writer));
      });
  if (!server.ok()) return server.status();
  api.server = *std::move(server);
  return api;
}

// SIGINT and SIGTERM, which main() blocks in every thread.
sigset_t TerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}

// Rolling restarts: the load balancer sees /ready fail, new requests get
// 503, and what is in flight finishes within `grace` seconds (a second
// signal cuts it short).
void Drain(HttpApi& api, const ServingEngine& engine, double grace, int signal) {
  std::fprintf(stderr, "tandem-scheduler: draining (signal %d): new requests get 503; waiting up to %g s\n", signal,
               grace);
  api.server->StopAccepting();
  api.frontend->StartDraining();
  const sigset_t signals = TerminationSignals();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace);
  for (;;) {
    const ServingSnapshot s = engine.Snapshot();
    const int64_t in_flight = s.num_running + s.num_waiting + api.server->active_responses();
    if (in_flight == 0) return;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::fprintf(stderr, "tandem-scheduler: %lld request(s) still in flight after --shutdown-grace\n",
                   static_cast<long long>(in_flight));
      return;
    }
    const timespec poll{0, 100 * 1000 * 1000};
    if (sigtimedwait(&signals, nullptr, &poll) > 0) return;
  }
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "tandem-scheduler: %s\n", message.c_str());
  return 1;
}

int Main(int argc, char** argv) {
  // absl's lock-order graph (on in the distribution's build) costs a hash
  // lookup per lock on the step path; the thread-safety analysis and the
  // tests' own binaries keep checking the locks.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  SchedulerFlags f;
  ListenFlags listen;
  FlagParser flags("tandem-scheduler",
                   "The scheduler process: serves the OpenAI-compatible HTTP API and the gRPC Generate API,\n"
                   "plans every step and streams it to the worker processes that register with it.");
  f.Register(&flags);
  f.RegisterTls(&flags);
  listen.Register(&flags);
  bool check_flags = false;  // a manifest's command line, checked without the model
  flags.AddBool("check-flags", &check_flags, "check every flag and exit (0: accepted) without reading the model");
  if (std::optional<int> exit_code = flags.ParseOrExitCode(std::vector<std::string>(argv + 1, argv + argc))) {
    return *exit_code;
  }
  absl::Status valid = f.Validate();
  if (valid.ok()) valid = rpc::CheckUnixSocketPath(listen.worker_socket);
  if (absl::Status s = valid; !s.ok()) {
    if (!check_flags) return Fail(std::string(s.message()));
    std::fprintf(stderr, "tandem-scheduler: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (check_flags) {
    std::fprintf(stderr, "tandem-scheduler: flags accepted\n");
    return 0;
  }
  SchedulerServer::WorkerListen workers;
  workers.port = static_cast<int>(listen.worker_port);
  workers.socket = listen.worker_socket;
  if (workers.own_server()) {
    // Before gRPC starts: gRPC's default epoll1 engine has one thread poll
    // for the whole process, and hands the workers' reads to it rather than
    // to the engine thread that waits for them (README, Control plane). A
    // GRPC_POLL_STRATEGY set by the user wins.
    setenv("GRPC_POLL_STRATEGY", "poll", /*overwrite=*/0);
  }

  absl::StatusOr<ModelInfo> model = ReadModelInfo(f.model);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  EngineConfig config = f.ToEngineConfig();
  config.vocab_size = model->config.vocab_size;

  std::unique_ptr<StepTraceWriter> trace;
  std::vector<StepObserver*> observers;
  if (!f.trace_steps.empty()) {
    auto writer = StepTraceWriter::Open(f.trace_steps);
    if (!writer.ok()) return Fail(std::string(writer.status().message()));
    trace = *std::move(writer);
    observers.push_back(trace.get());
  }

  std::unique_ptr<ServingEngine> engine;
  WorkerGroupOptions group_options;
  group_options.world_size = config.pipeline_parallel_size;
  group_options.block_size = config.block_size;
  group_options.step_timeout = absl::Seconds(f.step_timeout);
  std::atomic<SchedulerServer*> health{nullptr};  // set while the gRPC server runs
  group_options.on_change = [&engine, &health] {
    if (engine) engine->Wake();
    if (SchedulerServer* server = health.load()) server->PublishHealth();
  };
  WorkerGroup group(group_options);
  ServingMetrics metrics;
  ServingOptions serving;
  serving.queue_timeout_seconds = f.queue_timeout;
  serving.max_queued_requests = f.max_queued_requests;
  engine = std::make_unique<ServingEngine>(config, &group, observers, model->config.context_length, serving);
  engine->set_listener(&metrics);
  auto grpc_server =
      SchedulerServer::Start(listen.host, static_cast<int>(listen.port), &group, engine.get(), model->tokenizer.get(),
                             f.tls, workers);
  if (!grpc_server.ok()) return Fail(std::string(grpc_server.status().message()));
  health.store(grpc_server->get());
  (*grpc_server)->PublishHealth();
  WritePortFile(listen.port_file, (*grpc_server)->port());
  WritePortFile(listen.worker_port_file, (*grpc_server)->worker_port());
  std::fprintf(stderr, "tandem-scheduler: listening on %s:%d%s for %lld worker(s)%s; model %s\n", listen.host.c_str(),
               (*grpc_server)->port(), f.tls.enabled() ? " (mutual TLS)" : "",
               static_cast<long long>(f.pipeline_parallel_size),
               WorkersWhere(workers, **grpc_server).c_str(),
               model->config.name.c_str());
  engine->Start();

  std::optional<HttpApi> http_api;
  if (listen.http_port >= 0) {
    auto started = StartHttpApi(f, listen, *model, engine.get(), &metrics, &group);
    if (!started.ok()) {
      health.store(nullptr);
      (*grpc_server)->Shutdown();
      engine->Stop();
      return Fail(std::string(started.status().message()));
    }
    http_api = *std::move(started);
    WritePortFile(listen.http_port_file, http_api->server->port());
    std::fprintf(stderr, "tandem-scheduler: OpenAI API on %s://%s:%d/v1 as model '%s'\n",
                 f.https_cert.empty() ? "http" : "https", listen.http_host.c_str(), http_api->server->port(),
                 f.ServedModelName().c_str());
  }

  const sigset_t signals = TerminationSignals();
  int signal = 0;
  sigwait(&signals, &signal);
  (*grpc_server)->StartDraining();
  if (http_api && f.shutdown_grace > 0) Drain(*http_api, *engine, f.shutdown_grace, signal);
  std::fprintf(stderr, "tandem-scheduler: shutting down (signal %d)\n", signal);
  // HTTP first (no new requests), then gRPC; the engine releases every
  // response writer before the HTTP server's connections are destroyed.
  if (http_api) http_api->server->Shutdown();
  health.store(nullptr);
  (*grpc_server)->Shutdown();
  engine->Stop();
  engine.reset();
  return 0;
}

}  // namespace
}  // namespace tandem::scheduler

int main(int argc, char** argv) {
  // Block SIGINT/SIGTERM in every thread (gRPC's included) before any start:
  // only Main's sigwait receives them.
  const sigset_t signals = tandem::scheduler::TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return tandem::scheduler::Main(argc, argv);
}
