// The communicator runs in NCCL's non-blocking mode (config.blocking = 0):
// every call returns at once, possibly with ncclInProgress, and we poll
// ncclCommGetAsyncError with our own deadline. That is what lets Create and
// Recv time out and abort instead of hanging on a peer that never comes.
#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_status.h"

namespace tandem::worker {
namespace {

// Polls cheaply at first (a transfer often ends within microseconds), then
// backs off to 1 ms so a long wait does not burn a core.
class Backoff {
 public:
  void Wait() {
    absl::SleepFor(delay_);
    delay_ = std::min(delay_ * 2, absl::Milliseconds(1));
  }

 private:
  absl::Duration delay_ = absl::Microseconds(5);
};

// Waits while `comm` is in progress. OK once it is idle and healthy.
absl::Status WaitForComm(ncclComm_t comm, absl::Time deadline, const char* what) {
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    TANDEM_RETURN_IF_ERROR(
        NcclStatus(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError"));
    if (state != ncclInProgress) return NcclStatus(state, what);
    if (absl::Now() >= deadline)
      return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
    backoff.Wait();
  }
}

}  // namespace

absl::StatusOr<std::string> NcclCommunicator::NewUniqueId() {
  ncclUniqueId id;
  TANDEM_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    int32_t rank, int32_t world_size, const std::string& unique_id, CUstream_st* stream) {
  return Create(rank, world_size, unique_id, stream, Options());
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    int32_t rank, int32_t world_size, const std::string& unique_id, CUstream_st* stream,
    const Options& options) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad rank ", rank, " of world size ", world_size));
  }
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL unique id has ", unique_id.size(),
                                                   " bytes, expected ", sizeof(id.internal)));
  }
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  cudaEvent_t done = nullptr;
  TANDEM_RETURN_IF_ERROR(
      CudaStatus(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate"));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const absl::Time deadline = absl::Now() + options.init_timeout;
  ncclResult_t r = ncclCommInitRankConfig(&comm, world_size, id, rank, &config);
  absl::Status status =
      r == ncclInProgress ? absl::OkStatus() : NcclStatus(r, "ncclCommInitRankConfig");
  if (status.ok()) status = WaitForComm(comm, deadline, "NCCL init (waiting for all ranks)");
  if (!status.ok()) {
    if (comm != nullptr) ncclCommAbort(comm);
    cudaEventDestroy(done);
    return absl::Status(status.code(),
                        absl::StrCat("rank ", rank, " of ", world_size, ": ", status.message()));
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(rank, world_size, stream, done, comm, options));
}

NcclCommunicator::NcclCommunicator(int32_t rank, int32_t world_size, CUstream_st* stream,
                                   CUevent_st* done, ncclComm* comm, const Options& options)
    : rank_(rank),
      world_size_(world_size),
      stream_(stream),
      done_(done),
      comm_(comm),
      options_(options) {}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) {
    // Finalize waits for every rank to quiesce; a dead peer turns that into
    // the bounded wait, then an abort.
    const absl::Time deadline = absl::Now() + options_.close_timeout;
    ncclResult_t r = ncclCommFinalize(comm_);
    if ((r == ncclSuccess || r == ncclInProgress) &&
        WaitForComm(comm_, deadline, "ncclCommFinalize").ok()) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  FreeStaging(send_);
  FreeStaging(recv_);
  for (void* buffer : retired_) cudaFree(buffer);
  if (ready_ != nullptr) cudaEventDestroy(ready_);
  cudaEventDestroy(done_);
}

absl::Status NcclCommunicator::CheckCall(int32_t peer, const void* data, size_t bytes) const {
  if (peer < 0 || peer >= world_size_ || peer == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank_, ": bad peer ", peer));
  }
  if (data == nullptr && bytes > 0) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank_, ": null buffer"));
  }
  return failure_;
}

absl::Status NcclCommunicator::WaitWhileInProgress(absl::Time deadline, const char* what) {
  absl::Status s = WaitForComm(comm_, deadline, what);
  return s.ok() ? s : Abort(s);
}

absl::Status NcclCommunicator::Abort(absl::Status why) {
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
  failure_ = absl::UnavailableError(
      absl::StrCat("rank ", rank_, ": NCCL communicator was aborted: ", why.message()));
  return why;
}

absl::Status NcclCommunicator::Send(int32_t peer, const void* data, size_t bytes) {
  TANDEM_RETURN_IF_ERROR(CheckCall(peer, data, bytes));
  if (options_.compute_stream != nullptr && bytes > 0) return StagedSend(peer, data, bytes);
  ncclResult_t r = ncclSend(data, bytes, ncclUint8, peer, comm_, stream_);
  if (r == ncclInProgress) {
    return WaitWhileInProgress(absl::Now() + options_.send_timeout, "ncclSend");
  }
  absl::Status s = NcclStatus(r, "ncclSend");
  return s.ok() ? s : Abort(s);
}

absl::Status NcclCommunicator::Recv(int32_t peer, void* data, size_t bytes,
                                    absl::Duration timeout) {
  TANDEM_RETURN_IF_ERROR(CheckCall(peer, data, bytes));
  if (options_.compute_stream != nullptr && bytes > 0) return StagedRecv(peer, data, bytes, timeout);
  const absl::Time deadline = absl::Now() + timeout;
  const std::string what = absl::StrCat("rank ", rank_, " receiving ", bytes, " bytes from rank ", peer);
  ncclResult_t r = ncclRecv(data, bytes, ncclUint8, peer, comm_, stream_);
  if (r == ncclInProgress) {
    TANDEM_RETURN_IF_ERROR(WaitWhileInProgress(deadline, "ncclRecv"));
  } else if (r != ncclSuccess) {
    return Abort(NcclStatus(r, what.c_str()));
  }
  return WaitForStream(deadline, what);
}

absl::Status NcclCommunicator::WaitForStream(absl::Time deadline, const std::string& what) {
  const absl::Time start = absl::Now();
  absl::Status s = CudaStatus(cudaEventRecord(done_, stream_), "cudaEventRecord");
  if (!s.ok()) return Abort(s);
  Backoff backoff;
  for (;;) {
    cudaError_t e = cudaEventQuery(done_);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) return Abort(CudaStatus(e, what.c_str()));
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state != ncclSuccess && state != ncclInProgress)
      return Abort(NcclStatus(state, what.c_str()));
    if (absl::Now() >= deadline) {
      return Abort(absl::DeadlineExceededError(
          absl::StrCat(what, ": nothing within ", absl::FormatDuration(deadline - start))));
    }
    backoff.Wait();
  }
}

// --- staging (Options::compute_stream) ---

absl::Status NcclCommunicator::EnsureStaging(Staging& staging, int i, size_t bytes) {
  if (staging.free[i] == nullptr) {
    TANDEM_RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&staging.free[i], cudaEventDisableTiming),
                                      "cudaEventCreate (staging)"));
  }
  if (ready_ == nullptr) {
    TANDEM_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate (staging)"));
  }
  if (staging.bytes[i] >= bytes) return absl::OkStatus();
  // Grown by doubling, from 64 KiB, so a growing batch reallocates rarely.
  const size_t grown = std::max({bytes, size_t{64} << 10, 2 * staging.bytes[i]});
  if (staging.buffer[i] != nullptr) {
    // Kept until the communicator goes: cudaFree would wait for the whole
    // device, NCCL transfers that wait for a peer included. The buffers
    // retired this way add up to less than the last one.
    retired_.push_back(staging.buffer[i]);
    staging.buffer[i] = nullptr;
    staging.bytes[i] = 0;
  }
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&staging.buffer[i], grown), "cudaMalloc (staging)"));
  staging.bytes[i] = grown;
  return absl::OkStatus();
}

absl::Status NcclCommunicator::StagedSend(int32_t peer, const void* data, size_t bytes) {
  const int i = send_.next;
  send_.next ^= 1;
  cudaStream_t compute = options_.compute_stream;
  TANDEM_RETURN_IF_ERROR(EnsureStaging(send_, i, bytes));
  // The compute stream copies into buffer i once the send from it (two
  // messages back) is done; the send starts once the copy is done.
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(compute, send_.free[i], 0), "cudaStreamWaitEvent"));
  TANDEM_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(send_.buffer[i], data, bytes, cudaMemcpyDeviceToDevice, compute), "cudaMemcpyAsync (send staging)"));
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(ready_, compute), "cudaEventRecord"));
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent"));
  ncclResult_t r = ncclSend(send_.buffer[i], bytes, ncclUint8, peer, comm_, stream_);
  if (r == ncclInProgress) {
    TANDEM_RETURN_IF_ERROR(WaitWhileInProgress(absl::Now() + options_.send_timeout, "ncclSend"));
  } else if (r != ncclSuccess) {
    return Abort(NcclStatus(r, "ncclSend"));
  }
  absl::Status s = CudaStatus(cudaEventRecord(send_.free[i], stream_), "cudaEventRecord");
  return s.ok() ? s : Abort(s);
}

absl::Status NcclCommunicator::StagedRecv(int32_t peer, void* data, size_t bytes, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const std::string what = absl::StrCat("rank ", rank_, " receiving ", bytes, " bytes from rank ", peer);
  const int i = recv_.next;
  recv_.next ^= 1;
  cudaStream_t compute = options_.compute_stream;
  TANDEM_RETURN_IF_ERROR(EnsureStaging(recv_, i, bytes));
  // Into buffer i once the compute stream copied the message two back out of it.
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(stream_, recv_.free[i], 0), "cudaStreamWaitEvent"));
  ncclResult_t r = ncclRecv(recv_.buffer[i], bytes, ncclUint8, peer, comm_, stream_);
  if (r == ncclInProgress) {
    TANDEM_RETURN_IF_ERROR(WaitWhileInProgress(deadline, "ncclRecv"));
  } else if (r != ncclSuccess) {
    return Abort(NcclStatus(r, what.c_str()));
  }
  TANDEM_RETURN_IF_ERROR(WaitForStream(deadline, what));
  // The message is in buffer i; the compute stream copies it into `data`
  // after whatever it still runs that reads `data`.
  TANDEM_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(data, recv_.buffer[i], bytes, cudaMemcpyDeviceToDevice, compute), "cudaMemcpyAsync (recv staging)"));
  return CudaStatus(cudaEventRecord(recv_.free[i], compute), "cudaEventRecord");
}

void NcclCommunicator::FreeStaging(Staging& staging) {
  for (int i = 0; i < 2; ++i) {
    if (staging.buffer[i] != nullptr) cudaFree(staging.buffer[i]);  // waits for the device
    if (staging.free[i] != nullptr) cudaEventDestroy(staging.free[i]);
  }
}

}  // namespace tandem::worker
