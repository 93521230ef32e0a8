// SchedulerServer: the scheduler process's gRPC server: the worker control
// service and the Generate API on one listening port (or the workers on a
// port or a Unix socket of their own, a server of their own: README, Control
// plane), with
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

// Where the workers dial. With a socket or a port set they have a server of
// their own, which the engine thread drives (README, Control plane), and the
// Generate API's port refuses them.
struct WorkerListenOptions {
  // The workers on the Generate API's port.
  static constexpr int kMainPort = -1;
  // host:port (0: any free port); kMainPort: none of their own.
  int port = kMainPort;
  // A Unix socket at this path ("": none), for workers on this machine: no
  // TCP stack under each step (README, Control plane). An old socket there
  // is replaced; the socket is removed at Shutdown.
  std::string socket;
  bool own_server() const { return port != kMainPort || !socket.empty(); }
};

class SchedulerServer {
 public:
  static constexpr int kWorkersOnMainPort = WorkerListenOptions::kMainPort;

  using WorkerListen = WorkerListenOptions;

  // Listens on host:port (0: any free port), and for the workers as
  // `workers` says, with mutual TLS when `tls` is set (every client, workers
  // and Generate callers, then needs a certificate its CA signed). Makes
  // itself the group's poller. The others must outlive it.
  static absl::StatusOr<std::unique_ptr<SchedulerServer>> Start(const std::string& host, int port,
                                                                WorkerGroup* group, ServingEngine* engine,
                                                                const Tokenizer* tokenizer,
                                                                const rpc::TlsFiles& tls = {},
                                                                const WorkerListen& workers = {});
  ~SchedulerServer();

  int port() const { return port_; }
  // The workers' TCP port: port() unless they have a port of their own; 0
  // when they have only a socket.
  int worker_port() const { return worker_port_; }
  // The workers' Unix socket ("" without one); they dial "unix:" + it.
  const std::string& worker_socket() const { return worker_socket_; }
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
  std::string worker_socket_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_SERVER_GRPC_GRPC_SCHEDULER_SERVER_H_
