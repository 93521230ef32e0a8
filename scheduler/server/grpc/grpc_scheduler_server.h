// SchedulerServer: the scheduler process's gRPC server: the worker control
// service and the Generate API on one listening port (or the workers on a
// port of their own, a server of their own: README, Control plane), with
// tandem's keepalive and message-size settings, and the standard health service
// (grpc.health.v1.Health, which Kubernetes' `grpc:` probes ask): "" is
// SERVING until a drain starts; "ready" is SERVING while the worker group is
// ready and no drain has started (HTTP's /health and /ready).
//
// Thread-safe.
#ifndef TANDEM_SCHEDULER_SERVER_GRPC_GRPC_SCHEDULER_SERVER_H_
#define TANDEM_SCHEDULER_SERVER_GRPC_GRPC_SCHEDULER_SERVER_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/tls_files.h"
#include "common/tokenizer/tokenizer.h"
#include "scheduler/wire/worker_group.h"
#include "scheduler/server/serving_engine.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace tandem::scheduler {

class WorkerSessions;
class GrpcGenerateService;

class SchedulerServer {
 public:
  // The workers on the Generate API's port.
  static constexpr int kWorkersOnMainPort = -1;

  // Listens on host:port (0: any free port), and for the workers on
  // host:worker_port (0: any free port; kWorkersOnMainPort: on `port`), with
  // mutual TLS when `tls` is set (every client, workers and Generate
  // callers, then needs a certificate its CA signed). Makes itself the
  // group's poller. The others must outlive it.
  static absl::StatusOr<std::unique_ptr<SchedulerServer>> Start(const std::string& host, int port,
                                                                WorkerGroup* group, ServingEngine* engine,
                                                                const Tokenizer* tokenizer,
                                                                const rpc::TlsFiles& tls = {},
                                                                int worker_port = kWorkersOnMainPort);
  ~SchedulerServer();

  int port() const { return port_; }
  // Where the workers dial: port() unless they have a port of their own.
  int worker_port() const { return worker_port_; }
  // Brings the health service up to date with the group; cheap when nothing
  // changed (the group's on_change calls it on every membership or
  // readiness change, not on step results).
  void PublishHealth() ABSL_LOCKS_EXCLUDED(health_mu_);
  // From now on "" and "ready" are NOT_SERVING.
  void StartDraining() ABSL_LOCKS_EXCLUDED(health_mu_);
  // Stops accepting, ends open streams within a short grace period.
  void Shutdown();

 private:
  SchedulerServer() = default;
  std::unique_ptr<WorkerSessions> workers_;
  std::unique_ptr<GrpcGenerateService> generate_service_;
  WorkerGroup* group_ = nullptr;
  absl::Mutex health_mu_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(health_mu_);
  std::unique_ptr<grpc::Server> worker_server_ ABSL_GUARDED_BY(health_mu_);  // when the workers have a port of their own
  bool draining_ ABSL_GUARDED_BY(health_mu_) = false;
  int published_ ABSL_GUARDED_BY(health_mu_) = -1;  // bit 0: "", bit 1: "ready"; -1: none yet
  int port_ = 0;
  int worker_port_ = 0;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_SERVER_GRPC_GRPC_SCHEDULER_SERVER_H_
