#include "scheduler/server/grpc/grpc_scheduler_server.h"

#include <chrono>

#include <grpcpp/grpcpp.h>
#include <grpcpp/ext/health_check_service_server_builder_option.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_options.h"
#include "common/rpc/tls_credentials.h"
#include "scheduler/server/grpc/grpc_generate_service.h"
#include "scheduler/server/grpc/worker_sessions.h"

namespace tandem::scheduler {

absl::StatusOr<std::unique_ptr<SchedulerServer>> SchedulerServer::Start(const std::string& host, int port,
                                                                        WorkerGroup* group, ServingEngine* engine,
                                                                        const Tokenizer* tokenizer,
                                                                        const rpc::TlsFiles& tls, int worker_port) {
  // gRPC binds with SO_REUSEPORT: a second server on the same port would
  // share its connections at random rather than fail.
  if (worker_port != kWorkersOnMainPort && worker_port != 0 && worker_port == port) {
    return absl::InvalidArgumentError(absl::StrCat("the workers' port must differ from the gRPC port (", port, ")"));
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = rpc::MakeServerCredentials(tls);
  if (!credentials.ok()) return credentials.status();
  grpc::EnableDefaultHealthCheckService(true);  // process-wide, before the build
  std::unique_ptr<SchedulerServer> s(new SchedulerServer());
  s->group_ = group;
  s->generate_service_ = std::make_unique<GrpcGenerateService>(engine, tokenizer, group);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(host, ":", port), *credentials, &s->port_);
  rpc::ConfigureServer(&builder);
  builder.RegisterService(s->generate_service_.get());
  if (worker_port == kWorkersOnMainPort) s->workers_ = std::make_unique<WorkerSessions>(group, &builder);
  {
    absl::MutexLock lock(&s->health_mu_);
    s->server_ = builder.BuildAndStart();
    if (s->server_ == nullptr || s->port_ == 0) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port));
    }
    s->worker_port_ = s->port_;
    if (worker_port != kWorkersOnMainPort) {
      // A server of its own, with no callback-API service (not even the
      // default health service): gRPC's callback pollers would poll the
      // workers' connections too, and take their reads from the engine thread.
      grpc::ServerBuilder workers;
      workers.AddListeningPort(absl::StrCat(host, ":", worker_port), *credentials, &s->worker_port_);
      workers.SetOption(std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(nullptr));
      rpc::ConfigureServer(&workers);
      s->workers_ = std::make_unique<WorkerSessions>(group, &workers);
      s->worker_server_ = workers.BuildAndStart();
      if (s->worker_server_ == nullptr || s->worker_port_ == 0) {
        s->server_->Shutdown();
        s->server_.reset();
        return absl::UnavailableError(absl::StrCat("cannot listen for workers on ", host, ":", worker_port));
      }
    }
  }
  s->workers_->Start();
  group->set_poller(s->workers_.get());
  s->PublishHealth();
  return s;
}

SchedulerServer::~SchedulerServer() { Shutdown(); }

void SchedulerServer::PublishHealth() {
  const bool ready = group_->ready();
  absl::MutexLock lock(&health_mu_);
  if (server_ == nullptr) return;
  const int state = (draining_ ? 0 : 1) | (!draining_ && ready ? 2 : 0);
  if (state == published_) return;
  published_ = state;
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus("", (state & 1) != 0);
  health->SetServingStatus("ready", (state & 2) != 0);
}

void SchedulerServer::StartDraining() {
  {
    absl::MutexLock lock(&health_mu_);
    draining_ = true;
  }
  PublishHealth();
}

void SchedulerServer::Shutdown() {
  // Taken out under the lock, shut down outside it: ending the workers'
  // streams reaches PublishHealth through the group.
  std::unique_ptr<grpc::Server> server, worker_server;
  {
    absl::MutexLock lock(&health_mu_);
    server = std::move(server_);
    worker_server = std::move(worker_server_);
  }
  if (server == nullptr) return;
  // The workers' streams never end on their own, so the deadline is always
  // reached: it only lets the last Generate messages go out. Past it every
  // RPC is cancelled and the workers see the scheduler gone.
  const auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(200);
  workers_->BeginShutdown();
  server->Shutdown(deadline);
  if (worker_server != nullptr) worker_server->Shutdown(deadline);
  workers_->Shutdown();
}

}  // namespace tandem::scheduler
