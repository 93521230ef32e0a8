#include "worker/server/worker_flags.h"

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
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
  flags->AddString("kv-cache-dtype", &kv_cache_dtype,
                   "how the KV cache holds keys and values: float16, float32, or auto (float16 on the CPU, float32 "
                   "on CUDA, whose cache is float32 only)");
  flags->AddBool("enforce-eager", &enforce_eager,
                 "--backend cuda: launch every forward pass's kernels one by one instead of replaying recorded CUDA "
                 "graphs (slower at small batches; for debugging)");
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
  if (kv_cache_dtype != "auto" && kv_cache_dtype != "float16" && kv_cache_dtype != "float32") {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --kv-cache-dtype must be auto, float16 or float32, got '", kv_cache_dtype, "'"));
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
          absl::StrCat("--comm=", comm),
          absl::StrCat("--kv-cache-dtype=", kv_cache_dtype),
          absl::StrCat("--enforce-eager=", enforce_eager ? "true" : "false")};
}

void WorkerPlacementFlags::Register(FlagParser* flags) {
  flags->AddString("scheduler", &scheduler,
                   "the scheduler's HOST:PORT, or unix:PATH (its --worker-socket, on this machine)");
  flags->AddInt("rank", &rank, "this worker's pipeline stage", 0, 63);
  flags->AddInt("world-size", &world_size, "pipeline stages in the group", 1, 64);
  flags->AddInt("block-size", &block_size, "tokens per KV block (the scheduler's)", 1, 1024);
  flags->AddString("comm-host", &comm_host, "address the other workers reach this one at");
  flags->AddInt("comm-port", &comm_port,
                "port of the listener the other workers dial (0: any free port; a NetworkPolicy needs a fixed one)",
                0, 65535);
  flags->AddInt("health-port", &health_port,
                "serve the standard gRPC health service (grpc.health.v1) on 0.0.0.0:PORT for Kubernetes' grpc "
                "probes (-1: none)",
                -1, 65535);
  tls.Register(flags, "scheduler's");
  flags->AddBool("check-flags", &check_flags, "check every flag and exit (0: accepted) without reading the model");
}

namespace {

// HOST:PORT, or unix:PATH (the scheduler's --worker-socket; gRPC reads it).
absl::Status ValidateSchedulerAddress(const std::string& scheduler) {
  if (absl::StartsWith(scheduler, "unix:")) {
    if (scheduler.size() > 5) return absl::OkStatus();
    return absl::InvalidArgumentError("flag --scheduler: unix: needs the path of the scheduler's --worker-socket");
  }
  const size_t colon = scheduler.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(scheduler.substr(colon + 1), &port) ||
      port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --scheduler expects HOST:PORT or unix:PATH, got '", scheduler, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WorkerPlacementFlags::Validate() const {
  if (rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --rank must be below --world-size (", world_size, "), got ", rank));
  }
  if (scheduler.find("$(") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --scheduler has an unresolved variable: '", scheduler, "'"));
  }
  if (absl::Status s = ValidateSchedulerAddress(scheduler); !s.ok()) return s;
  if (comm_host.empty() || comm_host.find("$(") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("flag --comm-host expects an address, got '", comm_host, "'"));
  }
  if (comm_port != 0 && comm_port == health_port) {
    return absl::InvalidArgumentError("flags --comm-port and --health-port must differ");
  }
  return tls.Validate();
}

}  // namespace tandem::worker
