#include "scheduler/server/grpc/grpc_scheduler_server.h"

#include <chrono>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_options.h"
#include "scheduler/server/grpc/grpc_generate_service.h"
#include "scheduler/server/grpc/grpc_worker_service.h"

namespace tandem::scheduler {

absl::StatusOr<std::unique_ptr<SchedulerServer>> SchedulerServer::Start(const std::string& host, int port,
                                                                        WorkerGroup* group, ServingEngine* engine,
                                                                        const Tokenizer* tokenizer) {
  std::unique_ptr<SchedulerServer> s(new SchedulerServer());
  s->worker_service_ = std::make_unique<GrpcWorkerService>(group);
  s->generate_service_ = std::make_unique<GrpcGenerateService>(engine, tokenizer, group);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(host, ":", port), grpc::InsecureServerCredentials(), &s->port_);
  rpc::ConfigureServer(&builder);
  builder.RegisterService(s->worker_service_.get());
  builder.RegisterService(s->generate_service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port));
  }
  return s;
}

SchedulerServer::~SchedulerServer() { Shutdown(); }

void SchedulerServer::Shutdown() {
  if (server_ == nullptr) return;
  // The workers' streams never end on their own, so the deadline is always
  // reached: it only lets the last Generate messages go out. Past it every
  // RPC is cancelled and the workers see the scheduler gone.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  server_.reset();
}

}  // namespace tandem::scheduler
