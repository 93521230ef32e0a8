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
                                                                        const rpc::TlsFiles& tls,
                                                                        const WorkerListen& workers) {
  // gRPC binds with SO_REUSEPORT: a second server on the same port would
  // share its connections at random rather than fail.
  if (workers.port != kWorkersOnMainPort && workers.port != 0 && workers.port == port) {
    return absl::InvalidArgumentError(absl::StrCat("the workers' port must differ from the gRPC port (", port, ")"));
  }
  if (absl::Status s = rpc::CheckUnixSocketPath(workers.socket); !s.ok()) return s;
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
  if (!workers.own_server()) s->workers_ = std::make_unique<WorkerSessions>(group, &builder);
  {
    absl::MutexLock lock(&s->health_mu_);
    s->server_ = builder.BuildAndStart();
    if (s->server_ == nullptr || s->port_ == 0) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port));
    }
    s->worker_port_ = workers.own_server() ? 0 : s->port_;
    if (workers.own_server()) {
      // A server of its own, with no callback-API service (not even the
      // default health service): gRPC's callback pollers would poll the
      // workers' connections too, and take their reads from the engine thread.
      grpc::ServerBuilder builder;
      std::string where;
      if (workers.port != kWorkersOnMainPort) {
        builder.AddListeningPort(absl::StrCat(host, ":", workers.port), *credentials, &s->worker_port_);
        where = absl::StrCat(host, ":", workers.port);
      }
      int socket_bound = 0;
      if (!workers.socket.empty()) {
        builder.AddListeningPort("unix:" + workers.socket, *credentials, &socket_bound);
        absl::StrAppend(&where, where.empty() ? "" : " and ", "unix:", workers.socket);
      }
      builder.SetOption(std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(nullptr));
      rpc::ConfigureServer(&builder);
      s->workers_ = std::make_unique<WorkerSessions>(group, &builder);
      s->worker_server_ = builder.BuildAndStart();
      const bool port_bound = workers.port == kWorkersOnMainPort || s->worker_port_ != 0;
      if (s->worker_server_ == nullptr || !port_bound || (!workers.socket.empty() && socket_bound == 0)) {
        s->server_->Shutdown();
        s->server_.reset();
        return absl::UnavailableError(absl::StrCat("cannot listen for workers on ", where));
      }
      s->worker_socket_ = workers.socket;
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
  rpc::RemoveUnixSocket(worker_socket_);
}

}  // namespace tandem::scheduler
