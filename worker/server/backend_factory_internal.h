// What backend_factory.cc needs from the build's variant
// (backend_factory_cuda.cc or backend_factory_cpu.cc). Not for other users.
#ifndef TANDEM_WORKER_SERVER_BACKEND_FACTORY_INTERNAL_H_
#define TANDEM_WORKER_SERVER_BACKEND_FACTORY_INTERNAL_H_

#include "worker/backends/backend.h"
#include "worker/comm/staged_communicator.h"
#include "worker/server/backend_factory.h"

namespace tandem::worker {

// InvalidArgument for an unknown backend or cache type, FailedPrecondition
// for a cache type the backend does not keep: what every build refuses
// alike, before it looks for a device.
absl::Status CheckChoice(const BackendChoice& choice);

// The CPU backend of `choice` (backend "cpu", its kv_cache_dtype valid).
std::unique_ptr<Backend> MakeCpuBackend(const BackendChoice& choice);

// Whether the host cannot read the backend's memory (a GPU).
bool BackendMemoryIsDevice(const Backend& backend);
// Host staging memory for copies to and from the backend: pinned for a GPU.
HostAllocator StagingAllocatorFor(Backend& backend);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_SERVER_BACKEND_FACTORY_INTERNAL_H_
