// RequestQueue: the waiting queue of one scheduling policy (vLLM's
// Scheduler.waiting and skipped_waiting).
//  * FCFS: arrival order; a preempted request is put back at the front.
//  * Priority: ordered by (priority, arrival), lower first, whatever the
//    insertion call; Prepend and Add are the same.
// Requests are not owned.
//
// Thread-compatible: owned by the Scheduler on the engine thread.
#ifndef TANDEM_SCHEDULER_CORE_REQUEST_QUEUE_H_
#define TANDEM_SCHEDULER_CORE_REQUEST_QUEUE_H_

#include <deque>
#include <set>
#include <vector>

#include "absl/types/span.h"
#include "scheduler/core/engine_config.h"
#include "scheduler/core/request.h"

namespace tandem::scheduler {

// Strict weak order of the priority policy: more important first.
bool ComesBefore(const Request& a, const Request& b);

class RequestQueue {
 public:
  explicit RequestQueue(SchedulingPolicy policy) : policy_(policy) {}

  bool empty() const { return size() == 0; }
  size_t size() const { return policy_ == SchedulingPolicy::kFcfs ? fcfs_.size() : ordered_.size(); }
  // REQUIRES: !empty().
  Request* Peek() const;
  Request* Pop();
  void Add(Request* request);
  void Prepend(Request* request);
  // Puts `requests` at the front, keeping their relative order.
  void PrependAll(absl::Span<Request* const> requests);
  // Returns false if `request` is not queued.
  bool Remove(Request* request);
  std::vector<Request*> Snapshot() const;

 private:
  struct Order {
    bool operator()(const Request* a, const Request* b) const { return ComesBefore(*a, *b); }
  };
  const SchedulingPolicy policy_;
  std::deque<Request*> fcfs_;
  std::set<Request*, Order> ordered_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_CORE_REQUEST_QUEUE_H_
