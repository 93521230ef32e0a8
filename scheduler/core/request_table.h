// RequestTable: owns the scheduler's unfinished requests. Besides lookup by
// id, it hands out a RequestHandle (slot + generation) that a step keeps for
// each of its rows, so reconciling a step resolves each row with an array
// index instead of a hash lookup, and a handle to a request that finished
// meanwhile resolves to null (the generation has moved on).
//
// Thread-compatible: owned by the Scheduler on the engine thread.
#ifndef TANDEM_SCHEDULER_CORE_REQUEST_TABLE_H_
#define TANDEM_SCHEDULER_CORE_REQUEST_TABLE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "scheduler/core/request.h"

namespace tandem::scheduler {

class RequestTable {
 public:
  bool contains(RequestId id) const { return index_.contains(id); }
  bool empty() const { return index_.empty(); }
  size_t size() const { return index_.size(); }

  // Takes ownership and stamps the request's handle. REQUIRES: id unused.
  Request* Insert(std::unique_ptr<Request> request);
  Request* Find(RequestId id) const;
  // The request `handle` was stamped on, or null if it has left the table.
  Request* Resolve(RequestHandle handle) const {
    if (handle.slot >= slots_.size()) return nullptr;
    const Slot& slot = slots_[handle.slot];
    return slot.generation == handle.generation ? slot.request.get() : nullptr;
  }
  // Destroys `request`. REQUIRES: it is in the table.
  void Erase(Request* request);

  template <typename F>
  void ForEach(F&& f) const {
    for (const Slot& slot : slots_) {
      if (slot.request != nullptr) f(*slot.request);
    }
  }

 private:
  struct Slot {
    std::unique_ptr<Request> request;
    uint32_t generation = 1;  // handles start at 1, so a zero handle never resolves
  };
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  absl::flat_hash_map<RequestId, uint32_t> index_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_CORE_REQUEST_TABLE_H_
