// LoopbackCommunicator: the Communicator of a pipeline whose stages are
// threads of one process (the in-process engine with pipeline parallelism,
// and tests). A shared LoopbackHub holds one message queue per ordered pair
// of ranks; Send copies into it, Recv takes from it.
//
// Thread-safe: each rank's communicator is used by its own thread; the hub
// is shared.
#ifndef TANDEM_WORKER_COMM_LOOPBACK_COMMUNICATOR_H_
#define TANDEM_WORKER_COMM_LOOPBACK_COMMUNICATOR_H_

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/comm/communicator.h"

namespace tandem::worker {

class LoopbackHub {
 public:
  explicit LoopbackHub(int32_t world_size);
  int32_t world_size() const { return world_size_; }
  // Makes every Recv fail from now on (a stage died).
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class LoopbackCommunicator;
  std::deque<std::string>& At(int32_t from, int32_t to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queues_[from * world_size_ + to];
  }

  const int32_t world_size_;
  absl::Mutex mu_;
  // One message queue per ordered pair of ranks, by from * world_size + to.
  std::vector<std::deque<std::string>> queues_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class LoopbackCommunicator : public Communicator {
 public:
  // `hub` must outlive the communicator.
  LoopbackCommunicator(LoopbackHub* hub, int32_t rank) : hub_(hub), rank_(rank) {}

  int32_t rank() const override { return rank_; }
  int32_t world_size() const override { return hub_->world_size(); }
  absl::Status Send(int32_t peer, const void* data, size_t bytes) override;
  absl::Status Recv(int32_t peer, void* data, size_t bytes, absl::Duration timeout) override;

 private:
  LoopbackHub* const hub_;
  const int32_t rank_;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_COMM_LOOPBACK_COMMUNICATOR_H_
