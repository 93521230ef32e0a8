// The parts of the factory that do not depend on the build's devices; the
// rest is in backend_factory_cuda.cc or backend_factory_cpu.cc.
#include "worker/server/backend_factory.h"

#include <utility>

#include "worker/comm/staged_communicator.h"
#include "worker/server/backend_factory_internal.h"

namespace tandem::worker {
namespace {

// One host-memory communicator carries both directions: TCP and loopback
// keep each direction of each pair of ranks independent, so a send never
// waits behind a receive.
class HostTransport : public PipelineTransport {
 public:
  HostTransport(std::unique_ptr<Communicator> comm, std::string name)
      : comm_(std::move(comm)), name_(std::move(name)) {}
  Communicator* hidden() override { return comm_.get(); }
  Communicator* tokens() override { return comm_.get(); }
  std::string name() const override { return name_; }

 private:
  const std::unique_ptr<Communicator> comm_;
  const std::string name_;
};

}  // namespace

std::unique_ptr<PipelineTransport> OverHostCommunicator(Backend& backend, std::unique_ptr<Communicator> host) {
  if (!BackendMemoryIsDevice(backend)) return std::make_unique<HostTransport>(std::move(host), "host");
  return std::make_unique<HostTransport>(
      std::make_unique<StagedCommunicator>(std::move(host), &backend, StagingAllocatorFor(backend)),
      "host via pinned staging");
}

}  // namespace tandem::worker
