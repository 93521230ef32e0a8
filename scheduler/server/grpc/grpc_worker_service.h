// GrpcWorkerService: the WorkerControl service on the scheduler. Each worker's
// Session stream gets a reactor that is its WorkerLink: reads are handed to
// the WorkerGroup, writes are queued and sent one at a time. Reactions only
// enqueue; they never schedule or block.
//
// Thread-safe (gRPC's callback threads).
#ifndef TANDEM_SCHEDULER_SERVER_GRPC_GRPC_WORKER_SERVICE_H_
#define TANDEM_SCHEDULER_SERVER_GRPC_GRPC_WORKER_SERVICE_H_

#include "scheduler/wire/worker_group.h"
#include "tandem/v1/worker_service.grpc.pb.h"

namespace tandem::scheduler {

class GrpcWorkerService final : public v1::WorkerControl::CallbackService {
 public:
  // `group` must outlive the service.
  explicit GrpcWorkerService(WorkerGroup* group) : group_(group) {}

  grpc::ServerBidiReactor<v1::WorkerMessage, v1::SchedulerMessage>* Session(
      grpc::CallbackServerContext* context) override;

 private:
  WorkerGroup* const group_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_SERVER_GRPC_GRPC_WORKER_SERVICE_H_
