// WorkerLink: the scheduler's end of one worker's control stream, as the
// WorkerGroup sees it. The gRPC session reactor implements it; tests use an
// in-memory fake.
//
// Thread-safe: Send and Close may be called from any thread; they only
// enqueue (they never block on the network).
#ifndef TANDEM_SCHEDULER_WIRE_WORKER_LINK_H_
#define TANDEM_SCHEDULER_WIRE_WORKER_LINK_H_

#include <string>

#include "tandem/v1/worker_service.pb.h"

namespace tandem::scheduler {

class WorkerLink {
 public:
  virtual ~WorkerLink() = default;
  virtual void Send(const v1::SchedulerMessage& message) = 0;
  // Send for a message the caller no longer needs: a link that queues it
  // takes it without a copy (a step's execute is the largest message).
  virtual void SendOwned(v1::SchedulerMessage message) { Send(message); }
  // Ends the stream; the worker sees `reason`.
  virtual void Close(const std::string& reason) = 0;
  // The peer's address, for messages.
  virtual std::string peer() const = 0;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_WIRE_WORKER_LINK_H_
