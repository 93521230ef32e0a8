// LoopbackCommunicator: the Communicator of a pipeline whose stages are
// threads of one process (the in-process engine with pipeline parallelism,
// and tests). A shared LoopbackHub holds one message queue per ordered pair
// of ranks; Send copies into it, Recv takes from it.
//
// Thread-safe: each rank's communicator is used by its own thread; the hub
// is shared.
#ifndef TANDEM_WORKER_COMM_LOOPBACK_COMMUNICATOR_H_
#define TANDEM_WORKER_COMM_LOOPBACK_COMMUNICATOR_H_

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"

namespace tandem::worker {

class LoopbackHub {
 public:
  explicit LoopbackHub(int32_t world_size);
  int32_t world_size() const { return world_size_; }
  // Makes every Recv fail from now on (a stage died).
  void Close();

 private:
  friend class LoopbackCommunicator;
  struct Queue {
    std::deque<std::string> messages;  // guarded by LoopbackHub::mu_
  };
  Queue& At(int32_t from, int32_t to) { return queues_[from * world_size_ + to]; }

  const int32_t world_size_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<Queue> queues_;
  bool closed_ = false;  // guarded by mu_
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
