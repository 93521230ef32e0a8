#include "scheduler/server/grpc/grpc_scheduler_server.h"

#include <chrono>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_options.h"
#include "common/rpc/tls_credentials.h"
#include "scheduler/server/grpc/grpc_generate_service.h"
#include "scheduler/server/grpc/grpc_worker_service.h"

namespace tandem::scheduler {

absl::StatusOr<std::unique_ptr<SchedulerServer>> SchedulerServer::Start(const std::string& host, int port,
                                                                        WorkerGroup* group, ServingEngine* engine,
                                                                        const Tokenizer* tokenizer,
                                                                        const rpc::TlsFiles& tls) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = rpc::MakeServerCredentials(tls);
  if (!credentials.ok()) return credentials.status();
  grpc::EnableDefaultHealthCheckService(true);  // process-wide, before the build
  std::unique_ptr<SchedulerServer> s(new SchedulerServer());
  s->group_ = group;
  s->worker_service_ = std::make_unique<GrpcWorkerService>(group);
  s->generate_service_ = std::make_unique<GrpcGenerateService>(engine, tokenizer, group);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(host, ":", port), *credentials, &s->port_);
  rpc::ConfigureServer(&builder);
  builder.RegisterService(s->worker_service_.get());
  builder.RegisterService(s->generate_service_.get());
  {
    absl::MutexLock lock(&s->health_mu_);
    s->server_ = builder.BuildAndStart();
    if (s->server_ == nullptr || s->port_ == 0) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port));
    }
  }
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
  std::unique_ptr<grpc::Server> server;
  {
    absl::MutexLock lock(&health_mu_);
    server = std::move(server_);
  }
  if (server == nullptr) return;
  // The workers' streams never end on their own, so the deadline is always
  // reached: it only lets the last Generate messages go out. Past it every
  // RPC is cancelled and the workers see the scheduler gone.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
}

}  // namespace tandem::scheduler
