#include "worker/server/worker_flags.h"

#include "absl/strings/str_cat.h"

namespace tandem::worker {

void WorkerFlags::Register(FlagParser* flags) {
  flags->AddBytes("kv-cache-memory", &kv_cache_memory,
                  "KV cache memory of each worker on the CPU backend, e.g. 512MiB or 2GiB");
  flags->AddInt("threads", &threads,
                "CPU threads of each worker (0: all of the machine's; tandem serve divides them among its workers)",
                0, 1024);
  flags->AddDouble("peer-timeout", &peer_timeout, "seconds to wait for another worker's data");
  flags->AddString("backend", &backend, "where the model runs: cpu or cuda");
  flags->AddInt("device", &device, "the CUDA device of each worker (--backend cuda)", 0, 1023);
  flags->AddDouble("gpu-memory-utilization", &gpu_memory_utilization,
                   "fraction of the GPU's memory each worker may use for weights, activations and the KV cache, "
                   "which gets what is left (--backend cuda)");
  flags->AddString("comm", &comm,
                   "transport between pipeline stages: nccl, tcp, or auto (NCCL between CUDA workers on distinct "
                   "GPUs when the build has it, TCP otherwise)");
}

absl::Status WorkerFlags::Validate() const {
  if (kv_cache_memory <= 0) return absl::InvalidArgumentError("flag --kv-cache-memory must be positive");
  if (!(peer_timeout > 0)) return absl::InvalidArgumentError("flag --peer-timeout must be positive");
  if (backend != "cpu" && backend != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("flag --backend must be cpu or cuda, got '", backend, "'"));
  }
  if (!(gpu_memory_utilization > 0 && gpu_memory_utilization <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --gpu-memory-utilization must be in (0, 1], got ", gpu_memory_utilization));
  }
  if (comm != "auto" && comm != "nccl" && comm != "tcp") {
    return absl::InvalidArgumentError(absl::StrCat("flag --comm must be auto, nccl or tcp, got '", comm, "'"));
  }
  if (comm == "nccl" && backend != "cuda") {
    return absl::InvalidArgumentError("flag --comm nccl needs --backend cuda");
  }
  return absl::OkStatus();
}

std::vector<std::string> WorkerFlags::ToArgs() const {
  return {absl::StrCat("--kv-cache-memory=", kv_cache_memory),
          absl::StrCat("--threads=", threads),
          absl::StrCat("--peer-timeout=", peer_timeout),
          absl::StrCat("--backend=", backend),
          absl::StrCat("--device=", device),
          absl::StrCat("--gpu-memory-utilization=", gpu_memory_utilization),
          absl::StrCat("--comm=", comm)};
}

}  // namespace tandem::worker
