#include "worker/comm/loopback_communicator.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem::worker {

LoopbackHub::LoopbackHub(int32_t world_size) : world_size_(world_size), queues_(world_size * world_size) {}

// Recv's Await re-evaluates its condition whenever mu_ is released, so Close
// and Send do not signal.
void LoopbackHub::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

absl::Status LoopbackCommunicator::Send(int32_t peer, const void* data, size_t bytes) {
  if (peer < 0 || peer >= world_size() || peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank_, " cannot send to rank ", peer));
  }
  absl::MutexLock lock(&hub_->mu_);
  if (hub_->closed_) return absl::UnavailableError("the pipeline group is closed");
  hub_->At(rank_, peer).emplace_back(static_cast<const char*>(data), bytes);
  return absl::OkStatus();
}

absl::Status LoopbackCommunicator::Recv(int32_t peer, void* data, size_t bytes, absl::Duration timeout) {
  if (peer < 0 || peer >= world_size() || peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank_, " cannot receive from rank ", peer));
  }
  absl::MutexLock lock(&hub_->mu_);
  std::deque<std::string>& queue = hub_->At(peer, rank_);
  auto closed_or_arrived = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(hub_->mu_) { return hub_->closed_ || !queue.empty(); };
  const bool arrived = hub_->mu_.AwaitWithTimeout(absl::Condition(&closed_or_arrived), timeout);
  if (hub_->closed_) return absl::UnavailableError("the pipeline group is closed");
  if (!arrived) {
    return absl::DeadlineExceededError(
        absl::StrCat("rank ", rank_, ": nothing from rank ", peer, " within ", absl::FormatDuration(timeout)));
  }
  const std::string message = std::move(queue.front());
  queue.pop_front();
  if (message.size() != bytes) {
    return absl::DataLossError(absl::StrCat("rank ", rank_, " expected ", bytes, " bytes from rank ", peer,
                                            ", got ", message.size()));
  }
  std::memcpy(data, message.data(), bytes);
  return absl::OkStatus();
}

}  // namespace tandem::worker
