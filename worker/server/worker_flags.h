// WorkerFlags: the flags of tandem-worker that `tandem serve` also takes,
// declared once. The worker's main registers them; `tandem serve` registers
// the same ones, validates them itself and forwards them to each worker it
// starts (ToArgs). A worker's place in the group (--scheduler, --rank,
// --world-size, --comm-host) and the flags it shares with the scheduler
// (--model, --block-size) are set by the launcher.
//
// The device flags follow vLLM where the meaning is the same:
//   --backend cpu|cuda            where the model runs
//   --device N                    the CUDA device of every worker
//   --gpu-memory-utilization F    the fraction of the device's total memory
//                                 this worker may use for weights,
//                                 activations and KV cache (cuda; the CPU
//                                 backend's KV cache is --kv-cache-memory)
//   --kv-cache-dtype auto|float16|float32
//                                 how the KV cache holds keys and values:
//                                 auto is half floats on the CPU (as
//                                 llama.cpp's cache; twice the tokens of
//                                 float32) and float32 on CUDA, the only type
//                                 the CUDA backend keeps
//   --comm auto|nccl|tcp          how pipeline stages pass hidden states and
//                                 sampled ids: auto is NCCL between CUDA
//                                 workers on distinct GPUs when the build has
//                                 NCCL, TCP otherwise
//
// Thread-compatible; used from main() only.
#ifndef TANDEM_WORKER_SERVER_WORKER_FLAGS_H_
#define TANDEM_WORKER_SERVER_WORKER_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/flags.h"
#include "common/rpc/tls_files.h"

namespace tandem::worker {

struct WorkerFlags {
  int64_t kv_cache_memory = int64_t{1} << 30;  // bytes
  int64_t threads = 0;                          // 0: every hardware thread
  double peer_timeout = 30;                     // seconds
  std::string backend = "cpu";                  // cpu | cuda
  int64_t device = 0;                           // CUDA device index
  double gpu_memory_utilization = 0.9;          // fraction of the device's total memory
  std::string comm = "auto";                    // auto | nccl | tcp
  std::string kv_cache_dtype = "auto";          // auto | float16 | float32
  bool enforce_eager = false;                   // cuda: no CUDA graphs

  // Registers every flag above; the current values are the defaults shown.
  void Register(FlagParser* flags);
  // InvalidArgument naming the flag. Checks values only: whether this build
  // and machine can run --backend cuda is the backend factory's question
  // (worker/server/backend_factory.h).
  absl::Status Validate() const;
  // These flags as tandem-worker's arguments ("--name=value").
  std::vector<std::string> ToArgs() const;
};

// Where one worker sits in its group and where it listens: what a launcher
// (tandem serve, a Kubernetes manifest) gives each worker itself, so never
// forwarded by ToArgs. Every flag also takes the "--name=value" form, which
// is what a Kubernetes manifest writes with $(VAR) expansion:
// "--rank=$(LWS_WORKER_INDEX)". A variable Kubernetes could not resolve is
// left as the text "$(NAME)", which the parser refuses naming the flag.
//   --comm-port N     the worker-to-worker listener's port (0: any free
//                     port; a NetworkPolicy needs a fixed one)
//   --health-port N   the standard gRPC health service (grpc.health.v1,
//                     Kubernetes' grpc probes) on 0.0.0.0:N; -1: none
//   --tls-cert/--tls-key/--tls-ca  mutual TLS to the scheduler (a Secret's
//                     files): this worker's certificate and key, and the CA
//                     that signs the scheduler's (tls_files.h)
struct WorkerPlacementFlags {
  std::string scheduler = "127.0.0.1:50051";
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t block_size = 16;
  std::string comm_host = "127.0.0.1";
  int64_t comm_port = 0;
  int64_t health_port = -1;
  rpc::TlsFiles tls;
  // Parse and validate every flag, then exit (0, or 2 with the message)
  // without reading the model: checks a manifest's command line.
  bool check_flags = false;

  void Register(FlagParser* flags);
  // InvalidArgument naming the flag: the rank within the world size, a
  // HOST:PORT scheduler address, the TLS files (all three or none, readable).
  absl::Status Validate() const;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_SERVER_WORKER_FLAGS_H_
