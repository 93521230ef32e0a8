#include "worker/server/worker_flags.h"

#include "absl/strings/str_cat.h"

namespace tandem::worker {

void WorkerFlags::Register(FlagParser* flags) {
  flags->AddBytes("kv-cache-memory", &kv_cache_memory, "KV cache memory of each worker, e.g. 512MiB or 2GiB");
  flags->AddInt("threads", &threads,
                "CPU threads of each worker (0: all of the machine's; tandem serve divides them among its workers)",
                0, 1024);
  flags->AddDouble("peer-timeout", &peer_timeout, "seconds to wait for another worker's data");
}

absl::Status WorkerFlags::Validate() const {
  if (kv_cache_memory <= 0) return absl::InvalidArgumentError("flag --kv-cache-memory must be positive");
  if (!(peer_timeout > 0)) return absl::InvalidArgumentError("flag --peer-timeout must be positive");
  return absl::OkStatus();
}

std::vector<std::string> WorkerFlags::ToArgs() const {
  return {absl::StrCat("--kv-cache-memory=", kv_cache_memory), absl::StrCat("--threads=", threads),
          absl::StrCat("--peer-timeout=", peer_timeout)};
}

}  // namespace tandem::worker
