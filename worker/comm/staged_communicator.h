// StagedCommunicator: a Communicator for device memory over one that moves
// host memory (TCP between processes, loopback between threads), for GPU
// workers without NCCL between them: GPUs without NCCL peers, and pipeline
// stages that share one GPU (NCCL refuses two ranks on one device).
//
// Send downloads `data` into a host staging buffer (waiting for the device
// to produce it: the copy is stream-ordered after the work enqueued so far),
// then hands it to the inner communicator, which copies it out. Recv receives
// into a host staging buffer, uploads it to a device staging buffer and
// copies that into `data` on the backend's stream, so the copy lands after
// every kernel enqueued before it that may still read `data`. Host staging
// comes from `allocate_host`: pinned memory on a GPU (page-locked, so the
// copies are DMA), plain memory otherwise. Sizes grow to the largest
// message.
//
// The Communicator contract holds as for the inner communicator; Send blocks
// the caller until the device has produced `data` (the price of the
// fallback: the compute thread cannot run ahead of the device here).
//
// Thread-compatible: the compute thread that drives `backend`.
#ifndef TANDEM_WORKER_COMM_STAGED_COMMUNICATOR_H_
#define TANDEM_WORKER_COMM_STAGED_COMMUNICATOR_H_

#include <cstddef>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "worker/backends/backend.h"
#include "worker/comm/communicator.h"

namespace tandem::worker {

// Host memory for staging copies.
class HostBuffer {
 public:
  virtual ~HostBuffer() = default;
  virtual void* data() = 0;
  virtual size_t size() const = 0;
};
using HostAllocator = std::function<absl::StatusOr<std::unique_ptr<HostBuffer>>(size_t bytes)>;
// Pageable memory (operator new).
absl::StatusOr<std::unique_ptr<HostBuffer>> AllocatePageable(size_t bytes);

class StagedCommunicator : public Communicator {
 public:
  // `inner` moves host memory; `backend` (not owned) holds `data`.
  StagedCommunicator(std::unique_ptr<Communicator> inner, Backend* backend,
                     HostAllocator allocate_host = AllocatePageable);

  int32_t rank() const override { return inner_->rank(); }
  int32_t world_size() const override { return inner_->world_size(); }
  absl::Status Send(int32_t peer, const void* data, size_t bytes) override;
  absl::Status Recv(int32_t peer, void* data, size_t bytes, absl::Duration timeout) override;

 private:
  absl::Status EnsureHost(std::unique_ptr<HostBuffer>& buffer, size_t bytes);

  const std::unique_ptr<Communicator> inner_;
  Backend* const backend_;
  const HostAllocator allocate_host_;
  std::unique_ptr<HostBuffer> send_host_, recv_host_;
  std::unique_ptr<DeviceBuffer> recv_device_;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_COMM_STAGED_COMMUNICATOR_H_
