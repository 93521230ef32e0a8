// WorkerFlags: the flags of tandem-worker that `tandem serve` also takes,
// declared once. The worker's main registers them; `tandem serve` registers
// the same ones, validates them itself and forwards them to each worker it
// starts (ToArgs). A worker's place in the group (--scheduler, --rank,
// --world-size, --comm-host) and the flags it shares with the scheduler
// (--model, --block-size) are set by the launcher.
//
// Thread-compatible; used from main() only.
#ifndef TANDEM_WORKER_SERVER_WORKER_FLAGS_H_
#define TANDEM_WORKER_SERVER_WORKER_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/flags.h"

namespace tandem::worker {

struct WorkerFlags {
  int64_t kv_cache_memory = int64_t{1} << 30;  // bytes
  int64_t threads = 0;                          // 0: every hardware thread
  double peer_timeout = 30;                     // seconds

  // Registers every flag above; the current values are the defaults shown.
  void Register(FlagParser* flags);
  // InvalidArgument naming the flag.
  absl::Status Validate() const;
  // These flags as tandem-worker's arguments ("--name=value").
  std::vector<std::string> ToArgs() const;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_SERVER_WORKER_FLAGS_H_
