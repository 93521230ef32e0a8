// WorkerLink: the scheduler's end of one worker's control stream, as the
// WorkerGroup sees it. The gRPC session reactor implements it; tests use an
// in-memory fake.
//
// Thread-safe: Send and Close may be called from any thread; they only
// enqueue (they never block on the network).
#ifndef TANDEM_SCHEDULER_WIRE_WORKER_LINK_H_
#define TANDEM_SCHEDULER_WIRE_WORKER_LINK_H_

#include <string>

#include "absl/time/time.h"
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

// A transport whose events (WorkerGroup::OnMessage, OnDisconnect) the engine
// thread can deliver itself while it waits for a result: a gRPC completion
// queue it drives. Then a result is read, decoded and collected on one
// thread, with no wake-up of another in between (README, Control plane).
class LinkPoller {
 public:
  virtual ~LinkPoller() = default;
  // Delivers events on the calling thread until at least one was delivered
  // or `deadline` passed; may also return early when another thread
  // delivered events meanwhile. False once the transport is shut down (the
  // caller then waits for its events some other way).
  virtual bool Poll(absl::Time deadline) = 0;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_WIRE_WORKER_LINK_H_
