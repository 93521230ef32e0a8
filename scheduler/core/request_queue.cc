#include "scheduler/core/request_queue.h"

#include <algorithm>

#include "common/check.h"

namespace tandem::scheduler {

bool ComesBefore(const Request& a, const Request& b) {
  if (a.priority() != b.priority()) return a.priority() < b.priority();
  return a.arrival_seq() < b.arrival_seq();
}

Request* RequestQueue::Peek() const {
  TANDEM_DCHECK(!empty());
  return policy_ == SchedulingPolicy::kFcfs ? fcfs_.front() : *ordered_.begin();
}

Request* RequestQueue::Pop() {
  Request* request = Peek();
  if (policy_ == SchedulingPolicy::kFcfs) {
    fcfs_.pop_front();
  } else {
    ordered_.erase(ordered_.begin());
  }
  return request;
}

void RequestQueue::Add(Request* request) {
  if (policy_ == SchedulingPolicy::kFcfs) {
    fcfs_.push_back(request);
  } else {
    ordered_.insert(request);
  }
}

void RequestQueue::Prepend(Request* request) {
  if (policy_ == SchedulingPolicy::kFcfs) {
    fcfs_.push_front(request);
  } else {
    ordered_.insert(request);
  }
}

void RequestQueue::PrependAll(absl::Span<Request* const> requests) {
  for (auto it = requests.rbegin(); it != requests.rend(); ++it) Prepend(*it);
}

bool RequestQueue::Remove(Request* request) {
  if (policy_ == SchedulingPolicy::kFcfs) {
    auto it = std::find(fcfs_.begin(), fcfs_.end(), request);
    if (it == fcfs_.end()) return false;
    fcfs_.erase(it);
    return true;
  }
  return ordered_.erase(request) > 0;
}

std::vector<Request*> RequestQueue::Snapshot() const {
  if (policy_ == SchedulingPolicy::kFcfs) return {fcfs_.begin(), fcfs_.end()};
  return {ordered_.begin(), ordered_.end()};
}

}  // namespace tandem::scheduler
