// The factory of a build without CUDA: the CPU backend only.
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/server/backend_factory.h"
#include "worker/server/backend_factory_internal.h"

namespace tandem::worker {

bool BuildHasCuda() { return false; }
bool BuildHasNccl() { return false; }

absl::Status BackendAvailable(const BackendChoice& choice) {
  TANDEM_RETURN_IF_ERROR(CheckChoice(choice));
  if (choice.backend == "cpu") return absl::OkStatus();
  return absl::FailedPreconditionError(
      "--backend cuda: this build has no CUDA (configure on a machine with the CUDA toolkit, "
      "with -DTANDEM_ENABLE_CUDA=ON)");
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const BackendChoice& choice) {
  if (absl::Status s = BackendAvailable(choice); !s.ok()) return s;
  return MakeCpuBackend(choice);
}

absl::Status BindThreadToBackend(Backend&) { return absl::OkStatus(); }

std::string DeviceName(const Backend& backend) { return backend.name(); }

absl::StatusOr<DeviceMemory> DeviceMemoryOf(Backend& backend) {
  return absl::UnimplementedError(absl::StrCat("the ", backend.name(), " backend's memory is the host's"));
}

absl::StatusOr<std::string> NcclDeviceIdentity(Backend&) { return std::string(); }

absl::StatusOr<std::string> NewNcclUniqueIds(int32_t) {
  return absl::UnimplementedError("this build has no NCCL");
}

absl::StatusOr<std::unique_ptr<PipelineTransport>> ConnectNccl(Backend&, int32_t, int32_t, const std::string&,
                                                               absl::Duration) {
  return absl::UnimplementedError("this build has no NCCL");
}

bool BackendMemoryIsDevice(const Backend&) { return false; }

HostAllocator StagingAllocatorFor(Backend&) { return AllocatePageable; }

}  // namespace tandem::worker
