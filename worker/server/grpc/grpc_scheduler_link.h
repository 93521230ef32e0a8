// GrpcSchedulerLink: the worker's end of its control stream to the
// scheduler, a ClientBidiReactor. Reads go to the WorkerServer's inbox;
// Send queues writes and sends them one at a time. The call waits for the
// scheduler to come up (wait_for_ready), so workers may start first.
//
// Thread-safe: Send from any thread; reactions only enqueue.
#ifndef TANDEM_WORKER_SERVER_GRPC_GRPC_SCHEDULER_LINK_H_
#define TANDEM_WORKER_SERVER_GRPC_GRPC_SCHEDULER_LINK_H_

#include <deque>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "tandem/v1/worker_service.grpc.pb.h"
#include "worker/server/worker_server.h"

namespace tandem::worker {

class GrpcSchedulerLink : public grpc::ClientBidiReactor<v1::WorkerMessage, v1::SchedulerMessage>,
                          public SchedulerLink {
 public:
  // `server` must outlive the link. `on_group` (optional, called on gRPC's
  // threads) hears true at the scheduler's first message on the stream (the
  // group is formed) and false when the stream ends: the health service's
  // state.
  GrpcSchedulerLink(v1::WorkerControl::Stub* stub, WorkerServer* server,
                    std::function<void(bool in_group)> on_group = nullptr);

  void Send(const v1::WorkerMessage& message) override ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the call and waits until gRPC is done with this reactor.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_);
  void OnDone(const grpc::Status& status) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  WorkerServer* const server_;
  const std::function<void(bool)> on_group_;
  bool heard_ = false;  // reads are sequential: only OnReadDone touches it
  grpc::ClientContext context_;
  v1::SchedulerMessage in_;
  absl::Mutex mu_;
  std::deque<v1::WorkerMessage> out_ ABSL_GUARDED_BY(mu_);  // front is being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_SERVER_GRPC_GRPC_SCHEDULER_LINK_H_
