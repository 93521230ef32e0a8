// What backend_factory.cc needs from the build's variant
// (backend_factory_cuda.cc or backend_factory_cpu.cc). Not for other users.
#ifndef TANDEM_WORKER_SERVER_BACKEND_FACTORY_INTERNAL_H_
#define TANDEM_WORKER_SERVER_BACKEND_FACTORY_INTERNAL_H_

#include "worker/backends/backend.h"
#include "worker/comm/staged_communicator.h"

namespace tandem::worker {

// Whether the host cannot read the backend's memory (a GPU).
bool BackendMemoryIsDevice(const Backend& backend);
// Host staging memory for copies to and from the backend: pinned for a GPU.
HostAllocator StagingAllocatorFor(Backend& backend);

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_SERVER_BACKEND_FACTORY_INTERNAL_H_
