#include "worker/server/grpc/health_server.h"

#include <chrono>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"

namespace tandem::worker {

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(const std::string& host, int port) {
  // Process-wide: every server built from now on carries the service.
  grpc::EnableDefaultHealthCheckService(true);
  std::unique_ptr<HealthServer> s(new HealthServer());
  s->generic_ = std::make_unique<grpc::CallbackGenericService>();
  grpc::ServerBuilder builder;
  builder.RegisterCallbackGenericService(s->generic_.get());
  builder.AddListeningPort(absl::StrCat(host, ":", port), grpc::InsecureServerCredentials(), &s->port_);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port, " (--health-port)"));
  }
  s->SetServing("liveness", true);
  s->SetServing("", false);
  return s;
}

HealthServer::~HealthServer() {
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
}

void HealthServer::SetServing(const std::string& service, bool serving) {
  server_->GetHealthCheckService()->SetServingStatus(service, serving);
}

}  // namespace tandem::worker
