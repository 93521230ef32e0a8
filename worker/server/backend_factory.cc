// The parts of the factory that do not depend on the build's devices; the
// rest is in backend_factory_cuda.cc or backend_factory_cpu.cc.
#include "worker/server/backend_factory.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

#include "worker/backends/cpu/cpu_backend.h"
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

absl::StatusOr<KvType> KvCacheType(const BackendChoice& choice) {
  const bool cuda = choice.backend == "cuda";
  if (choice.kv_cache_dtype == "auto") return cuda ? KvType::kF32 : KvType::kF16;
  if (choice.kv_cache_dtype == "float32") return KvType::kF32;
  if (choice.kv_cache_dtype == "float16") {
    if (!cuda) return KvType::kF16;
    return absl::FailedPreconditionError(
        "--kv-cache-dtype float16: the CUDA backend's KV cache is float32 (use auto or float32)");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown --kv-cache-dtype '", choice.kv_cache_dtype, "' (auto, float16 or float32)"));
}

absl::StatusOr<bool> ChooseNccl(const std::string& comm_flag, int32_t world_size,
                                const std::vector<std::string>& device_ids, bool have_unique_ids) {
  std::string why_not;
  if (static_cast<int32_t>(device_ids.size()) != world_size) {
    why_not = "the scheduler did not relay every rank's GPU";
  } else {
    std::set<std::string> seen;
    for (int32_t r = 0; r < world_size && why_not.empty(); ++r) {
      if (device_ids[r].empty()) {
        why_not = absl::StrCat("rank ", r, " cannot use NCCL (a CPU worker, --comm tcp, or a build without NCCL)");
      } else if (!seen.insert(device_ids[r]).second) {
        why_not = absl::StrCat("two ranks share the GPU ", device_ids[r], ", which NCCL refuses");
      }
    }
  }
  if (why_not.empty() && !have_unique_ids) why_not = "rank 0 made no NCCL ids";
  if (why_not.empty()) return true;
  if (comm_flag == "nccl") {
    return absl::FailedPreconditionError(absl::StrCat("--comm nccl: ", why_not, "; use --comm tcp"));
  }
  return false;
}

absl::Status CheckChoice(const BackendChoice& choice) {
  if (choice.backend != "cpu" && choice.backend != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("unknown backend '", choice.backend, "' (cpu or cuda)"));
  }
  return KvCacheType(choice).status();
}

std::unique_ptr<Backend> MakeCpuBackend(const BackendChoice& choice) {
  CpuBackendOptions options;
  options.kv_type = KvCacheType(choice).value();
  return std::make_unique<CpuBackend>(choice.threads, options);
}

std::unique_ptr<PipelineTransport> OverHostCommunicator(Backend& backend, std::unique_ptr<Communicator> host) {
  if (!BackendMemoryIsDevice(backend)) return std::make_unique<HostTransport>(std::move(host), "host");
  return std::make_unique<HostTransport>(
      std::make_unique<StagedCommunicator>(std::move(host), &backend, StagingAllocatorFor(backend)),
      "host via pinned staging");
}

}  // namespace tandem::worker
