// GrpcSchedulerLink: the worker's end of its control stream to the
// scheduler, a ClientBidiReactor. Reads go to the WorkerServer's inbox;
// Send queues writes and sends them one at a time. The call waits for the
// scheduler to come up (wait_for_ready), so workers may start first.
//
// Thread-safe: Send from any thread; reactions only enqueue.
#ifndef TANDEM_WORKER_SERVER_GRPC_GRPC_SCHEDULER_LINK_H_
#define TANDEM_WORKER_SERVER_GRPC_GRPC_SCHEDULER_LINK_H_

#include <condition_variable>
#include <deque>
#include <mutex>

#include "tandem/v1/worker_service.grpc.pb.h"
#include "worker/server/worker_server.h"

namespace tandem::worker {

class GrpcSchedulerLink : public grpc::ClientBidiReactor<v1::WorkerMessage, v1::SchedulerMessage>,
                          public SchedulerLink {
 public:
  // `server` must outlive the link.
  GrpcSchedulerLink(v1::WorkerControl::Stub* stub, WorkerServer* server);

  void Send(const v1::WorkerMessage& message) override;
  // Ends the call and waits until gRPC is done with this reactor.
  void Shutdown();

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  WorkerServer* const server_;
  grpc::ClientContext context_;
  v1::SchedulerMessage in_;
  std::mutex mu_;
  std::condition_variable done_cv_;
  std::deque<v1::WorkerMessage> out_;  // guarded by mu_; front is being written
  bool writing_ = false;               // guarded by mu_
  bool done_ = false;                  // guarded by mu_
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_SERVER_GRPC_GRPC_SCHEDULER_LINK_H_
