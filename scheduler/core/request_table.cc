#include "scheduler/core/request_table.h"

#include "common/check.h"

namespace tandem::scheduler {

Request* RequestTable::Insert(std::unique_ptr<Request> request) {
  uint32_t index;
  if (free_slots_.empty()) {
    index = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  } else {
    index = free_slots_.back();
    free_slots_.pop_back();
  }
  Slot& slot = slots_[index];
  request->handle = {index, slot.generation};
  TANDEM_CHECK(index_.emplace(request->id(), index).second) << "request " << request->id() << " inserted twice";
  slot.request = std::move(request);
  return slot.request.get();
}

Request* RequestTable::Find(RequestId id) const {
  auto it = index_.find(id);
  return it == index_.end() ? nullptr : slots_[it->second].request.get();
}

void RequestTable::Erase(Request* request) {
  const uint32_t index = request->handle.slot;
  TANDEM_CHECK(Resolve(request->handle) == request) << "request " << request->id() << " is not in the table";
  index_.erase(request->id());
  Slot& slot = slots_[index];
  slot.request.reset();
  ++slot.generation;
  free_slots_.push_back(index);
}

}  // namespace tandem::scheduler
