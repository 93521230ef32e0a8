// SchedulerServer: the scheduler process's gRPC server: the worker control
// service and the Generate API on one listening port, with tandem's
// keepalive and message-size settings.
//
// Thread-safe.
#ifndef TANDEM_SCHEDULER_SERVER_GRPC_GRPC_SCHEDULER_SERVER_H_
#define TANDEM_SCHEDULER_SERVER_GRPC_GRPC_SCHEDULER_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "scheduler/wire/worker_group.h"
#include "scheduler/server/serving_engine.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace tandem::scheduler {

class GrpcWorkerService;
class GrpcGenerateService;

class SchedulerServer {
 public:
  // Listens on host:port (0: any free port). The others must outlive it.
  static absl::StatusOr<std::unique_ptr<SchedulerServer>> Start(const std::string& host, int port,
                                                                WorkerGroup* group, ServingEngine* engine,
                                                                const Tokenizer* tokenizer);
  ~SchedulerServer();

  int port() const { return port_; }
  // Stops accepting, ends open streams within a short grace period.
  void Shutdown();

 private:
  SchedulerServer() = default;
  std::unique_ptr<GrpcWorkerService> worker_service_;
  std::unique_ptr<GrpcGenerateService> generate_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_SERVER_GRPC_GRPC_SCHEDULER_SERVER_H_
