// tandem-worker: one pipeline stage. It loads its layers, dials the
// scheduler, registers, and runs the steps the scheduler streams to it.
//
//   tandem-worker --scheduler 127.0.0.1:50051 --rank 0 --world-size 2 --model models/...gguf
//   tandem-worker ... --backend cuda --device 0 --gpu-memory-utilization 0.9
//
// A backend it cannot have (--backend cuda in a build without CUDA, or with
// no usable device) exits with status 1 and the cause.
// When the scheduler goes away the worker exits (status 1, with the reason);
// a supervisor (tandem serve, Kubernetes) starts it again. It waits for a
// scheduler that is not up yet.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/default_model.h"
#include "common/flags.h"
#include "common/rpc/grpc_options.h"
#include "worker/server/grpc/grpc_scheduler_link.h"
#include "worker/server/worker_flags.h"
#include "worker/server/worker_server.h"

int main(int argc, char** argv) {
  using tandem::worker::WorkerOptions;
  WorkerOptions o;
  o.model_path = tandem::DefaultModelPath();
  std::string scheduler = "127.0.0.1:50051";
  int64_t rank = 0, world_size = 1, block_size = o.block_size;
  tandem::worker::WorkerFlags f;
  tandem::FlagParser flags("tandem-worker",
                           "A worker process: holds one pipeline stage of the model and runs the steps the\n"
                           "scheduler streams to it.");
  flags.AddString("scheduler", &scheduler, "the scheduler's HOST:PORT");
  flags.AddInt("rank", &rank, "this worker's pipeline stage", 0, 63);
  flags.AddInt("world-size", &world_size, "pipeline stages in the group", 1, 64);
  flags.AddString("model", &o.model_path, "GGUF model file (the scheduler's)");
  flags.AddInt("block-size", &block_size, "tokens per KV block (the scheduler's)", 1, 1024);
  flags.AddString("comm-host", &o.comm_host, "address the other workers reach this one at");
  f.Register(&flags);
  if (std::optional<int> exit_code = flags.ParseOrExitCode(std::vector<std::string>(argv + 1, argv + argc))) {
    return *exit_code;
  }
  if (absl::Status s = f.Validate(); !s.ok()) {
    std::fprintf(stderr, "tandem-worker: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  o.rank = static_cast<int32_t>(rank);
  o.world_size = static_cast<int32_t>(world_size);
  o.block_size = static_cast<int32_t>(block_size);
  o.threads = static_cast<int32_t>(f.threads);
  o.kv_cache_bytes = f.kv_cache_memory;
  o.peer_timeout = absl::Seconds(f.peer_timeout);
  o.backend = f.backend;
  o.device = static_cast<int32_t>(f.device);
  o.gpu_memory_utilization = f.gpu_memory_utilization;
  o.comm = f.comm;

  auto server = tandem::worker::WorkerServer::Create(o);
  if (!server.ok()) {
    std::fprintf(stderr, "tandem-worker %lld: %s\n", static_cast<long long>(rank),
                 std::string(server.status().message()).c_str());
    return 1;
  }
  const auto registration = (*server)->Registration();
  std::fprintf(stderr, "tandem-worker %d: layers [%d, %d) of %d on %s, room for %d KV blocks; dialing %s\n",
               registration.rank(), registration.first_layer(), registration.end_layer(), registration.num_layers(),
               registration.device().c_str(), registration.max_kv_blocks(), scheduler.c_str());
  auto channel = tandem::rpc::MakeChannel(scheduler);
  auto stub = tandem::v1::WorkerControl::NewStub(channel);
  tandem::worker::GrpcSchedulerLink link(stub.get(), server->get());
  const absl::Status status = (*server)->Run(&link);
  link.Shutdown();
  std::fprintf(stderr, "tandem-worker %lld: the scheduler went away (%s); exiting\n", static_cast<long long>(rank),
               std::string(status.message()).c_str());
  return 1;
}
