// Private to the CUDA backend's own files: the state behind CudaBackend
// (CudaBackend::Impl) and the facilities it is made of. cuda_backend.cc
// implements them; cuda_sampling.cc (CudaBackend::Sample) includes this
// header to use them. Includes CUDA headers: never include it from CPU code.
//
// What the sampling code may rely on (stable; ask before changing):
//   impl_->device                 the device index (already current when a
//                                 CudaBackend method runs: they call
//                                 MakeCurrent() first; Sample should too)
//   impl_->compute()              the compute stream (cudaStream_t); every
//                                 kernel of a step goes on it
//   impl_->copy()                 the copy stream (device-to-host only)
//   impl_->MakeCurrent()          makes `device` current on the calling thread
//   impl_->UploadAsync(dst, src, bytes)
//                                 host bytes to device memory through the
//                                 pinned staging ring, ordered on the compute
//                                 stream; `src` may be reused on return
//   impl_->sampling_scratch[i]    kSamplingScratchSlots grow-only device
//                                 buffers reserved for sampling, i in
//                                 [0, kSamplingScratchSlots); Ensure(bytes)
//                                 returns the device address (contents are
//                                 not kept across a growth)
//   DeviceScratch                 the grow-only buffer type, if more are needed
// The backend's own scratch (matmul_input, attention_workspace) is not for
// sampling: a launch may grow it.
//
// Thread-compatible, like CudaBackend: the compute thread drives all of it,
// except PinnedPool, which download events (Event::Wait on the output
// thread) share and which locks.
#ifndef TANDEM_WORKER_BACKENDS_CUDA_CUDA_BACKEND_IMPL_H_
#define TANDEM_WORKER_BACKENDS_CUDA_CUDA_BACKEND_IMPL_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/backends/cuda/cuda_backend.h"
#include "worker/backends/cuda/cuda_graphs.h"

namespace tandem::worker {

// The device's two streams, shared by the backend and every buffer it
// allocated, so that a buffer released after the backend still has a stream
// to free itself on. Destroyed (after draining both streams) with the last
// owner.
struct CudaStreams {
  int32_t device = 0;
  cudaStream_t compute = nullptr;
  cudaStream_t copy = nullptr;
  ~CudaStreams();
};

// A grow-only device buffer, allocated and freed in stream order on the
// compute stream (cudaMallocAsync/cudaFreeAsync): work enqueued before a
// growth still sees the old buffer, work after it the new one.
class DeviceScratch {
 public:
  DeviceScratch() = default;
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  ~DeviceScratch();

  // Binds the buffer to its stream; called once by Impl::Init. When
  // `generation` is given, each growth increments it (recorded graphs that
  // hold the old address are then stale: cuda_graphs.h).
  void Bind(cudaStream_t stream, uint64_t* generation = nullptr) {
    stream_ = stream;
    generation_ = generation;
  }
  // A device buffer of at least `bytes` (grown by at least half when it
  // grows, so a slowly rising size reallocates rarely). FailedPrecondition
  // when it would grow while the stream is being captured into a graph.
  absl::StatusOr<void*> Ensure(size_t bytes);
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  cudaStream_t stream_ = nullptr;
  uint64_t* generation_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Host-to-device copies through pinned memory: kSlots slots of kSlotBytes.
// Copy packs the caller's bytes into the current slot (64-byte aligned) and
// enqueues cudaMemcpyAsync from there on the stream; a full slot is closed by
// recording an event on the stream behind its copies, and a slot is written
// again only after its event completed (the host waits, which bounds how far
// uploads run ahead of the device to the ring's size). Larger copies go
// through in slot-sized pieces.
class StagingRing {
 public:
  static constexpr size_t kSlotBytes = size_t{8} << 20;
  static constexpr int kSlots = 8;

  StagingRing() = default;
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;
  ~StagingRing();

  absl::Status Init(cudaStream_t stream);
  // Copies `bytes` from host `src` to device `dst`, ordered on the stream.
  absl::Status Copy(void* dst, const void* src, size_t bytes);
  // Slots closed so far (tests: the ring wrapped around).
  int64_t slots_closed() const { return slots_closed_; }

 private:
  struct Slot {
    char* host = nullptr;
    cudaEvent_t done = nullptr;  // recorded behind the slot's last copy
    bool pending = false;        // `done` recorded and not yet waited for
  };
  // Closes the current slot and moves to the next, waiting for it.
  absl::Status Advance();

  cudaStream_t stream_ = nullptr;
  std::vector<Slot> slots_;
  int current_ = 0;
  size_t used_ = 0;  // bytes of the current slot in use
  int64_t slots_closed_ = 0;
};

// Pinned bounce buffers and completion events for device-to-host copies,
// reused across downloads. A download event holds its buffer and event until
// it is destroyed, possibly on another thread (the output thread), hence the
// lock.
class PinnedPool {
 public:
  PinnedPool() = default;
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;
  ~PinnedPool();

  // A pinned buffer of at least `bytes` (its capacity in *capacity: a power
  // of two, at least 4 KiB) and a timing-free event of the current device.
  absl::StatusOr<void*> TakeBuffer(size_t bytes, size_t* capacity);
  absl::StatusOr<cudaEvent_t> TakeEvent();
  void GiveBuffer(void* buffer, size_t capacity);
  void GiveEvent(cudaEvent_t event);

 private:
  absl::Mutex mu_;
  std::vector<std::pair<size_t, void*>> buffers_ ABSL_GUARDED_BY(mu_);  // (capacity, buffer)
  std::vector<cudaEvent_t> events_ ABSL_GUARDED_BY(mu_);
};

class CudaBackend::Impl {
 public:
  static constexpr int kSamplingScratchSlots = 4;
  // cuBLAS's workspace (NVIDIA recommends 32 MiB on Hopper).
  static constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
  // Recorded passes kept: a serving worker sees a few dozen decode shapes
  // (batch sizes, and each 256 tokens of context); a graph costs host
  // memory only.
  static constexpr size_t kGraphCapacity = 64;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl();

  // Creates the streams, the cuBLAS handle, the staging ring; on error the
  // destructor releases what was made.
  absl::Status Init(int32_t device_index);
  absl::Status MakeCurrent() const;
  absl::Status UploadAsync(void* dst, const void* src, size_t bytes) { return staging.Copy(dst, src, bytes); }
  cudaStream_t compute() const { return streams->compute; }
  cudaStream_t copy() const { return streams->copy; }

  int32_t device = 0;
  std::shared_ptr<CudaStreams> streams;
  cublasHandle_t cublas = nullptr;  // bound to the compute stream
  void* cublas_workspace = nullptr;
  cudaMemPool_t pool = nullptr;      // the device's default pool (cudaMallocAsync)
  cudaEvent_t compute_ready = nullptr;  // recorded per download, waited on by the copy stream
  StagingRing staging;
  std::shared_ptr<PinnedPool> pinned = std::make_shared<PinnedPool>();

  // Recorded forward passes (RunRecorded), and the generation of the
  // scratch they use (matmul_input, attention_workspace).
  std::unique_ptr<GraphCache> graphs;
  uint64_t scratch_generation = 0;
  DeviceScratch matmul_input;         // x cast to bf16 for bf16 GEMMs
  DeviceScratch attention_workspace;  // PagedAttentionWorkspaceBytes
  DeviceScratch sampling_scratch[kSamplingScratchSlots];

  int64_t weight_bytes = 0;  // LoadWeight and LoadVector, as stored on the device
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_BACKENDS_CUDA_CUDA_BACKEND_IMPL_H_
