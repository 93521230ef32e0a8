// The worker's backend and pipeline transport, made from the command line's
// choices. One header; two implementations, chosen by the build:
// backend_factory_cuda.cc (a build with CUDA, NCCL when found) and
// backend_factory_cpu.cc (without). The worker server and the in-process
// engine are written once against this.
//
// Thread-compatible: called from the thread that drives the backend (the
// worker's compute thread, or main before it starts).
#ifndef TANDEM_WORKER_SERVER_BACKEND_FACTORY_H_
#define TANDEM_WORKER_SERVER_BACKEND_FACTORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/backends/backend.h"
#include "worker/comm/communicator.h"

namespace tandem::worker {

struct BackendChoice {
  std::string backend = "cpu";  // cpu | cuda
  int32_t device = 0;           // cuda
  int32_t threads = 0;          // cpu: 0 is every hardware thread
  // How the KV cache holds keys and values (vLLM's --kv-cache-dtype): auto
  // (the backend's default: half floats on the CPU, float32 on CUDA),
  // float16 (the CPU only) or float32.
  std::string kv_cache_dtype = "auto";
  // cuda: run every forward pass eagerly, recording no CUDA graphs (vLLM's
  // --enforce-eager; for debugging, or to measure what the graphs save).
  bool enforce_eager = false;
};

// The KV cache's element type for `choice`: InvalidArgument for an unknown
// kv_cache_dtype, FailedPrecondition for one its backend does not keep.
absl::StatusOr<KvType> KvCacheType(const BackendChoice& choice);

bool BuildHasCuda();
bool BuildHasNccl();

// OK when MakeBackend(choice) can work, without making it (no CUDA context
// is created): for `tandem serve` to refuse before it starts any worker.
absl::Status BackendAvailable(const BackendChoice& choice);

// The backend, or FailedPrecondition naming why it cannot be had: "this
// build has no CUDA", or CudaDeviceUsable's cause (no driver, no device, the
// index out of range). InvalidArgument for an unknown backend name.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const BackendChoice& choice);

// Makes the calling thread use the backend's device (a thread other than the
// one that made the backend, like the worker's output thread, would
// otherwise start a context on device 0 at its first CUDA call). No-op for
// the CPU.
absl::Status BindThreadToBackend(Backend& backend);

// What the metrics and logs call the device: "cpu", "cuda:0".
std::string DeviceName(const Backend& backend);

struct DeviceMemory {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};
// Free and total memory of the backend's device now; Unimplemented for a
// backend whose memory is the host's.
absl::StatusOr<DeviceMemory> DeviceMemoryOf(Backend& backend);

// The identity of the backend's GPU for NCCL ("host/PCI bus id"), or "" when
// this rank cannot use NCCL (the CPU backend, a build without NCCL). Two
// ranks with the same identity share a GPU, which NCCL refuses.
absl::StatusOr<std::string> NcclDeviceIdentity(Backend& backend);

// `count` fresh NCCL unique ids, concatenated (rank 0 makes them; the
// scheduler relays them as they are). Unimplemented without NCCL.
absl::StatusOr<std::string> NewNcclUniqueIds(int32_t count);

// How the stages of a pipeline group pass data: hidden states rank r -> r+1
// over hidden(), each step's sampled ids last rank -> rank 0 over tokens().
// With NCCL these are two communicators on two streams (one communicator on
// one stream deadlocks at PP=2: each rank's send waits behind the other's
// receive); over TCP both may be the same communicator.
class PipelineTransport {
 public:
  virtual ~PipelineTransport() = default;
  virtual Communicator* hidden() = 0;
  virtual Communicator* tokens() = 0;
  virtual std::string name() const = 0;  // "nccl", "tcp", "tcp+staging"
};

// Whether a pipeline group passes data over NCCL: every rank offered its
// GPU's identity (NcclDeviceIdentity, relayed by the scheduler in rank
// order), no two the same, and rank 0 made the ids. Every rank decides alike
// from the same inputs. Otherwise false (TCP), or FailedPrecondition naming
// why when `comm_flag` is "nccl".
absl::StatusOr<bool> ChooseNccl(const std::string& comm_flag, int32_t world_size,
                                const std::vector<std::string>& device_ids, bool have_unique_ids);

// Joins the NCCL group of `world_size` ranks: two communicators from the two
// ids of NewNcclUniqueIds(2) (the same bytes on every rank), each on its own
// stream, ordered after the backend's compute stream. Waits for every rank
// up to `timeout`.
absl::StatusOr<std::unique_ptr<PipelineTransport>> ConnectNccl(Backend& backend, int32_t rank, int32_t world_size,
                                                               const std::string& unique_ids, absl::Duration timeout);

// A transport over `host`, a communicator of host memory (TCP, loopback): as
// it is for a backend whose memory is the host's; through pinned staging
// copies (StagedCommunicator) for a GPU.
std::unique_ptr<PipelineTransport> OverHostCommunicator(Backend& backend, std::unique_ptr<Communicator> host);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_SERVER_BACKEND_FACTORY_H_
