// NcclCommunicator: the Communicator of GPU workers, over ncclSend/ncclRecv
// on the worker's CUDA stream. Built only when the build found NCCL
// (TANDEM_HAVE_NCCL); this header includes no CUDA or NCCL header, so CPU code
// may see it.
//
// Setup: rank 0 calls NewUniqueId() and the scheduler hands the 128 bytes to
// every rank; each rank makes its device current (cudaSetDevice) and calls
// Create with the same id. Create waits for all ranks, up to init_timeout.
//
// Semantics on top of the Communicator contract:
//  * Stream-ordered. Send enqueues the transfer on the stream and returns; the
//    buffer may be reused by work enqueued on the same stream afterwards (the
//    host must not overwrite it before the stream gets there). Recv enqueues
//    the transfer and waits until the stream reaches its end, so it also waits
//    for everything enqueued on the stream before it, earlier Sends included.
//  * NCCL does not frame messages, so a size mismatch between sender and
//    receiver is not reported as DataLoss; it shows up as a timeout or an NCCL
//    error. Both sides must derive sizes from the same step.
//  * A Recv timeout aborts the communicator (ncclCommAbort): an NCCL transfer
//    cannot be resumed. Every later call returns Unavailable and the group
//    must be rebuilt, so pass generous timeouts, not polling ones.
//
// With Options::compute_stream set (the worker's pipeline transport), the
// communicator serves a stream that produces what it sends and consumes what
// it receives, and keeps the Communicator contract in that stream's order:
//  * Send copies `data` into one of two device staging buffers on the compute
//    stream (so the copy sees every kernel enqueued before it), then sends
//    the staging buffer on the communicator's stream once the copy is done.
//    Work enqueued on the compute stream afterwards may overwrite `data`. The
//    compute stream waits only before reusing a staging buffer, for the send
//    from it two messages back: double buffering, guarded by events.
//  * Recv receives into one of two staging buffers on the communicator's
//    stream (after the compute stream finished reading that buffer, two
//    messages back), waits for the transfer on the host as above, and then
//    copies into `data` on the compute stream, after every kernel enqueued
//    before it that may still read `data`.
// Two communicators, each on its own stream, keep the two directions of a
// pipeline independent (hidden states r -> r+1, sampled ids last -> 0).
//
// Thread-compatible: the worker's compute thread makes every call, with the
// communicator's device current.
#ifndef TANDEM_WORKER_COMM_NCCL_COMMUNICATOR_H_
#define TANDEM_WORKER_COMM_NCCL_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"

// The pointees of cudaStream_t, cudaEvent_t and ncclComm_t, declared so that
// this header needs neither cuda_runtime.h nor nccl.h. A cudaStream_t converts
// to CUstream_st* as is.
struct CUstream_st;
struct CUevent_st;
struct ncclComm;

namespace tandem::worker {

class NcclCommunicator : public Communicator {
 public:
  struct Options {
    // How long Create waits for every rank to join.
    absl::Duration init_timeout = absl::Seconds(120);
    // How long Send may wait for NCCL to accept a transfer (first use of a
    // peer sets up its connection).
    absl::Duration send_timeout = absl::Seconds(60);
    // How long the destructor waits for in-flight transfers before aborting.
    absl::Duration close_timeout = absl::Seconds(5);
    // The stream that produces sent data and consumes received data (not
    // owned); null: the caller orders its streams itself, and data is used
    // in place (no staging).
    CUstream_st* compute_stream = nullptr;
  };

  // A fresh ncclUniqueId (NCCL_UNIQUE_ID_BYTES = 128 bytes), made on rank 0.
  static absl::StatusOr<std::string> NewUniqueId();

  // `stream` (not owned; nullptr is the legacy default stream) carries every
  // transfer; it must outlive the communicator.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(int32_t rank, int32_t world_size,
                                                                  const std::string& unique_id,
                                                                  CUstream_st* stream);
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(int32_t rank, int32_t world_size,
                                                                  const std::string& unique_id,
                                                                  CUstream_st* stream,
                                                                  const Options& options);

  // Finalizes for at most close_timeout, then aborts; never hangs on a dead peer.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int32_t rank() const override { return rank_; }
  int32_t world_size() const override { return world_size_; }
  // `data` is device memory on this communicator's device.
  absl::Status Send(int32_t peer, const void* data, size_t bytes) override;
  absl::Status Recv(int32_t peer, void* data, size_t bytes, absl::Duration timeout) override;

 private:
  NcclCommunicator(int32_t rank, int32_t world_size, CUstream_st* stream, CUevent_st* done,
                   ncclComm* comm, const Options& options);
  absl::Status CheckCall(int32_t peer, const void* data, size_t bytes) const;
  // Waits while NCCL reports the communicator in progress (non-blocking mode).
  absl::Status WaitWhileInProgress(absl::Time deadline, const char* what);
  // Aborts the communicator, remembers why, and returns `why`.
  absl::Status Abort(absl::Status why);
  // Waits on the host until `stream_` reaches its end, up to `deadline`.
  absl::Status WaitForStream(absl::Time deadline, const std::string& what);
  // Staging through two buffers per direction (compute_stream set).
  struct Staging {
    void* buffer[2] = {nullptr, nullptr};
    size_t bytes[2] = {0, 0};
    CUevent_st* free[2] = {nullptr, nullptr};  // the buffer's last use is done
    int next = 0;
  };
  // Makes buffer `i` of `staging` hold `bytes` (an outgrown one is retired).
  absl::Status EnsureStaging(Staging& staging, int i, size_t bytes);
  absl::Status StagedSend(int32_t peer, const void* data, size_t bytes);
  absl::Status StagedRecv(int32_t peer, void* data, size_t bytes, absl::Duration timeout);
  void FreeStaging(Staging& staging);

  const int32_t rank_;
  const int32_t world_size_;
  CUstream_st* const stream_;
  CUevent_st* const done_;  // recorded after each Recv, polled for its end
  ncclComm* comm_;          // null once aborted
  const Options options_;
  absl::Status failure_;  // the reason for the abort; OK while usable
  Staging send_, recv_;
  std::vector<void*> retired_;  // staging buffers outgrown, freed with the communicator
  CUevent_st* ready_ = nullptr;  // recorded on one stream for the other to wait on
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_COMM_NCCL_COMMUNICATOR_H_
