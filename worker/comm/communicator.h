// Communicator: moves bulk data between the workers of one pipeline group,
// worker to worker, never through the scheduler: hidden states from stage r
// to stage r+1, and each step's sampled token ids from the last stage back to
// stage 0 (scheduler/README.md §1, §7).
//
// Contract:
//  * Messages between two ranks arrive in the order they were sent, in each
//    direction independently.
//  * Send returns once the data has been copied out of `data` (the caller may
//    reuse the buffer); delivery continues in the background, so a stage can
//    start its next step while the previous step's activations travel.
//  * Recv blocks until exactly `bytes` bytes of the next message from `peer`
//    are in `data`, or `timeout` passes (DeadlineExceeded), or the peer or the
//    connection is gone (Unavailable). A message's size must match what the
//    receiver expects (both sides derive it from the same step); a mismatch is
//    DataLoss.
//  * `data` is device memory of the backend the communicator was made for
//    (host memory for TcpCommunicator, CUDA memory for NcclCommunicator).
//
// Implementations: TcpCommunicator (CPU workers, CI), NcclCommunicator (GPU
// workers; built when NCCL is present).
//
// Thread-compatible: the worker's compute thread calls Send and Recv; an
// implementation may use its own threads internally.
#ifndef TANDEM_WORKER_COMM_COMMUNICATOR_H_
#define TANDEM_WORKER_COMM_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tandem::worker {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int32_t rank() const = 0;
  virtual int32_t world_size() const = 0;
  virtual absl::Status Send(int32_t peer, const void* data, size_t bytes) = 0;
  virtual absl::Status Recv(int32_t peer, void* data, size_t bytes, absl::Duration timeout) = 0;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_COMM_COMMUNICATOR_H_
