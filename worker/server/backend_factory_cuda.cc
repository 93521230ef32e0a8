// The factory of a build with CUDA: the CPU backend, the CUDA backend, and
// with NCCL, the NCCL transport between pipeline stages.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/backends/cuda/cuda_backend.h"
#include "worker/backends/cuda/cuda_status.h"
#include "worker/server/backend_factory.h"
#include "worker/server/backend_factory_internal.h"
#if TANDEM_HAVE_NCCL
#include "worker/comm/nccl_communicator.h"
#endif

namespace tandem::worker {
namespace {

CudaBackend* AsCuda(Backend& backend) { return dynamic_cast<CudaBackend*>(&backend); }
const CudaBackend* AsCuda(const Backend& backend) { return dynamic_cast<const CudaBackend*>(&backend); }

// Page-locked host memory: copies to and from it are DMA, asynchronous to
// the host.
class PinnedBuffer : public HostBuffer {
 public:
  PinnedBuffer(void* data, size_t size) : data_(data), size_(size) {}
  ~PinnedBuffer() override { cudaFreeHost(data_); }
  void* data() override { return data_; }
  size_t size() const override { return size_; }

 private:
  void* const data_;
  const size_t size_;
};

absl::StatusOr<std::unique_ptr<HostBuffer>> AllocatePinned(size_t bytes) {
  void* data = nullptr;
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(&data, bytes, cudaHostAllocDefault), "cudaHostAlloc (staging)"));
  return std::unique_ptr<HostBuffer>(new PinnedBuffer(data, bytes));
}

#if TANDEM_HAVE_NCCL
// Two NCCL communicators, each on a stream of its own, both ordered after the
// backend's compute stream (NcclCommunicator::Options::compute_stream).
class NcclTransport : public PipelineTransport {
 public:
  NcclTransport() = default;
  ~NcclTransport() override {
    hidden_.reset();  // the communicators use the streams: they go first
    tokens_.reset();
    if (hidden_stream_ != nullptr) cudaStreamDestroy(hidden_stream_);
    if (tokens_stream_ != nullptr) cudaStreamDestroy(tokens_stream_);
  }
  Communicator* hidden() override { return hidden_.get(); }
  Communicator* tokens() override { return tokens_.get(); }
  std::string name() const override { return "nccl"; }

  cudaStream_t hidden_stream_ = nullptr;
  cudaStream_t tokens_stream_ = nullptr;
  std::unique_ptr<NcclCommunicator> hidden_, tokens_;
};
#endif

}  // namespace

bool BuildHasCuda() { return true; }
bool BuildHasNccl() { return TANDEM_HAVE_NCCL; }

namespace {

absl::Status Prefixed(const BackendChoice& choice, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("--backend cuda --device ", choice.device, ": ", s.message()));
}

}  // namespace

absl::Status BackendAvailable(const BackendChoice& choice) {
  TANDEM_RETURN_IF_ERROR(CheckChoice(choice));
  if (choice.backend == "cpu") return absl::OkStatus();
  absl::Status usable = CudaDeviceUsable(choice.device);
  return usable.ok() ? usable : Prefixed(choice, usable);
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const BackendChoice& choice) {
  TANDEM_RETURN_IF_ERROR(BackendAvailable(choice));
  if (choice.backend == "cpu") return MakeCpuBackend(choice);
  CudaBackendOptions options;
  options.device = choice.device;
  options.graphs = !choice.enforce_eager;
  auto backend = CudaBackend::Create(options);
  if (!backend.ok()) return Prefixed(choice, backend.status());
  return std::unique_ptr<Backend>(std::move(backend).value());
}

absl::Status BindThreadToBackend(Backend& backend) {
  CudaBackend* cuda = AsCuda(backend);
  return cuda == nullptr ? absl::OkStatus() : CudaStatus(cudaSetDevice(cuda->device()), "cudaSetDevice");
}

std::string DeviceName(const Backend& backend) {
  const CudaBackend* cuda = AsCuda(backend);
  return cuda == nullptr ? backend.name() : absl::StrCat("cuda:", cuda->device());
}

absl::StatusOr<DeviceMemory> DeviceMemoryOf(Backend& backend) {
  CudaBackend* cuda = AsCuda(backend);
  if (cuda == nullptr) {
    return absl::UnimplementedError(absl::StrCat("the ", backend.name(), " backend's memory is the host's"));
  }
  TANDEM_ASSIGN_OR_RETURN(CudaMemoryInfo info, cuda->MemoryInfo());
  return DeviceMemory{info.free_bytes, info.total_bytes};
}

absl::StatusOr<std::string> NcclDeviceIdentity(Backend& backend) {
  CudaBackend* cuda = AsCuda(backend);
  if (cuda == nullptr || !BuildHasNccl()) return std::string();
  char bus[64] = {};
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaDeviceGetPCIBusId(bus, sizeof(bus), cuda->device()), "cudaDeviceGetPCIBusId"));
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, "/", bus);
}

absl::StatusOr<std::string> NewNcclUniqueIds(int32_t count) {
#if TANDEM_HAVE_NCCL
  std::string ids;
  for (int32_t i = 0; i < count; ++i) {
    TANDEM_ASSIGN_OR_RETURN(std::string id, NcclCommunicator::NewUniqueId());
    ids += id;
  }
  return ids;
#else
  return absl::UnimplementedError("this build has no NCCL");
#endif
}

absl::StatusOr<std::unique_ptr<PipelineTransport>> ConnectNccl(Backend& backend, int32_t rank, int32_t world_size,
                                                               const std::string& unique_ids, absl::Duration timeout) {
#if TANDEM_HAVE_NCCL
  CudaBackend* cuda = AsCuda(backend);
  if (cuda == nullptr) return absl::FailedPreconditionError("NCCL needs the cuda backend");
  const size_t id_bytes = unique_ids.size() / 2;
  if (unique_ids.empty() || unique_ids.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("expected two NCCL unique ids, got ", unique_ids.size(), " bytes"));
  }
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(cuda->device()), "cudaSetDevice"));
  auto transport = std::make_unique<NcclTransport>();
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&transport->hidden_stream_, cudaStreamNonBlocking),
                                    "cudaStreamCreate (hidden states)"));
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&transport->tokens_stream_, cudaStreamNonBlocking),
                                    "cudaStreamCreate (sampled ids)"));
  NcclCommunicator::Options options;
  options.init_timeout = timeout;
  options.compute_stream = cuda->compute_stream();
  // Every rank creates them in the same order: init is collective.
  TANDEM_ASSIGN_OR_RETURN(transport->hidden_,
                          NcclCommunicator::Create(rank, world_size, unique_ids.substr(0, id_bytes),
                                                   transport->hidden_stream_, options));
  TANDEM_ASSIGN_OR_RETURN(transport->tokens_,
                          NcclCommunicator::Create(rank, world_size, unique_ids.substr(id_bytes, id_bytes),
                                                   transport->tokens_stream_, options));
  return std::unique_ptr<PipelineTransport>(std::move(transport));
#else
  return absl::UnimplementedError("this build has no NCCL");
#endif
}

bool BackendMemoryIsDevice(const Backend& backend) { return AsCuda(backend) != nullptr; }

HostAllocator StagingAllocatorFor(Backend& backend) {
  return AsCuda(backend) != nullptr ? HostAllocator(AllocatePinned) : HostAllocator(AllocatePageable);
}

}  // namespace tandem::worker
