// GrpcSchedulerLink: the worker's end of its control stream to the
// scheduler, on gRPC's synchronous API. The compute thread reads each message
// itself (Receive: a synchronous Read polls the call's completion queue on the
// calling thread), so a step reaches the thread that runs it without a hop
// through a gRPC callback thread and a wake; Send writes on the sending thread
// (the compute thread or the output thread, one at a time). The call waits for
// the scheduler to come up (wait_for_ready), so workers may start first.
//
// Thread-safe: Send from any thread; Receive from one thread at a time;
// Shutdown once, after the reader has stopped.
#ifndef TANDEM_WORKER_SERVER_GRPC_GRPC_SCHEDULER_LINK_H_
#define TANDEM_WORKER_SERVER_GRPC_GRPC_SCHEDULER_LINK_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "tandem/v1/worker_service.grpc.pb.h"
#include "worker/server/worker_server.h"

namespace tandem::worker {

class GrpcSchedulerLink : public SchedulerLink {
 public:
  // `on_group` (optional, called on the reading thread) hears true at the
  // scheduler's first message on the stream (the group is formed) and false
  // when the stream ends: the health service's state.
  GrpcSchedulerLink(v1::WorkerControl::Stub* stub, std::function<void(bool in_group)> on_group = nullptr);

  void Send(const v1::WorkerMessage& message) override ABSL_LOCKS_EXCLUDED(write_mu_);
  bool pulls() const override { return true; }
  bool Receive(v1::SchedulerMessage* message, std::string* reason) override ABSL_LOCKS_EXCLUDED(write_mu_);
  // Ends the call (if Receive has not seen it end) and waits for its status.
  void Shutdown() ABSL_LOCKS_EXCLUDED(write_mu_);

 private:
  // Stops writes, then takes the call's status: no write is in flight while
  // Finish runs. The reason in words.
  std::string Finish() ABSL_LOCKS_EXCLUDED(write_mu_);

  const std::function<void(bool)> on_group_;
  bool heard_ = false;  // Receive only
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::SchedulerMessage>> stream_;
  absl::Mutex write_mu_;
  bool closed_ ABSL_GUARDED_BY(write_mu_) = false;  // no more writes: finished, or a write failed
  bool finished_ ABSL_GUARDED_BY(write_mu_) = false;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_SERVER_GRPC_GRPC_SCHEDULER_LINK_H_
