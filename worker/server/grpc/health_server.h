// HealthServer: a gRPC server that carries only the standard health service
// (grpc.health.v1.Health, gRPC's default implementation), for a process
// that has no gRPC port of its own to put it on: the worker, which only
// dials out. Kubernetes probes it natively (a `grpc:` probe with an optional
// service name).
//
// Services the worker reports: "liveness" is SERVING while the process is up;
// "" (the server as a whole) is SERVING only while the worker is in a group
// its scheduler formed, and NOT_SERVING before that and once its scheduler
// is lost.
//
// Thread-safe.
#ifndef TANDEM_WORKER_SERVER_GRPC_HEALTH_SERVER_H_
#define TANDEM_WORKER_SERVER_GRPC_HEALTH_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class CallbackGenericService;
class Server;
}  // namespace grpc

namespace tandem::worker {

class HealthServer {
 public:
  // Listens on host:port (0: any free port); "liveness" SERVING, ""
  // NOT_SERVING.
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(const std::string& host, int port);
  ~HealthServer();

  int port() const { return port_; }
  void SetServing(const std::string& service, bool serving);

 private:
  HealthServer() = default;
  // Refuses every call (UNIMPLEMENTED); without a service of its own a
  // server has nothing to run gRPC's health service on.
  std::unique_ptr<grpc::CallbackGenericService> generic_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_SERVER_GRPC_HEALTH_SERVER_H_
