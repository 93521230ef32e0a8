// tandem-worker: one pipeline stage. It loads its layers, dials the
// scheduler, registers, and runs the steps the scheduler streams to it.
//
//   tandem-worker --scheduler 127.0.0.1:50051 --rank 0 --world-size 2 --model models/...gguf
//   tandem-worker ... --backend cuda --device 0 --gpu-memory-utilization 0.9
//
// In Kubernetes: --comm-port fixes the worker-to-worker port, --health-port
// serves grpc.health.v1 for the kubelet's probes, and --check-flags checks a
// manifest's command line without starting (worker_flags.h).
// --fake-model (benchmarks only) replaces the model by one that costs nothing
// (worker/server/fake_stage_runner.h): tools/bench/control_plane_bench.
// A backend it cannot have (--backend cuda in a build without CUDA, or with
// no usable device) exits with status 1 and the cause.
// When the scheduler goes away the worker exits (status 1, with the reason);
// a supervisor (tandem serve, Kubernetes) starts it again. It waits for a
// scheduler that is not up yet.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/default_model.h"
#include "common/flags.h"
#include "common/rpc/grpc_options.h"
#include "common/rpc/tls_credentials.h"
#include "worker/comm/tls_context.h"
#include "worker/server/backend_factory.h"
#include "worker/server/grpc/grpc_scheduler_link.h"
#include "worker/server/grpc/health_server.h"
#include "worker/server/grpc/scheduler_dial.h"
#include "worker/server/worker_flags.h"
#include "worker/server/worker_server.h"

int main(int argc, char** argv) {
  // absl's lock-order graph (on in the distribution's build) costs a hash
  // lookup per lock on the step path; the thread-safety analysis and the
  // tests' own binaries keep checking the locks.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // gRPC's "poll" engine, unless the environment picks one: under the default
  // (epoll1) every polling thread of the process, the health server's
  // included, takes any socket's events, so a step read by the compute thread
  // (grpc_scheduler_link.h) often arrives through another thread and a wake.
  // With "poll" each completion queue polls its own calls' sockets. At 256
  // running, PP 1 (control_plane_bench): 117-127 -> 97-107 us of worker CPU a
  // step, and 150-180 -> 107 with --health-port.
  setenv("GRPC_POLL_STRATEGY", "poll", /*overwrite=*/0);
  using tandem::worker::WorkerOptions;
  WorkerOptions o;
  o.model_path = tandem::DefaultModelPath();
  tandem::worker::WorkerPlacementFlags p;
  tandem::worker::WorkerFlags f;
  tandem::FlagParser flags("tandem-worker",
                           "A worker process: holds one pipeline stage of the model and runs the steps the\n"
                           "scheduler streams to it.");
  flags.AddString("model", &o.model_path, "GGUF model file (the scheduler's)");
  p.Register(&flags);
  f.Register(&flags);
  flags.AddBool("fake-model", &o.fake_model,
                "FOR BENCHMARKS ONLY: load no weights and run every step on a model that costs nothing\n"
                "(tokens derived from a digest of each request's context), so that what is measured is\n"
                "the control plane: scheduler -> gRPC -> worker -> back, and the worker-to-worker channel.\n"
                "The model file gives only its shape; the tokens are not the model's");
  if (std::optional<int> exit_code = flags.ParseOrExitCode(std::vector<std::string>(argv + 1, argv + argc))) {
    return *exit_code;
  }
  absl::Status valid = p.Validate();
  if (valid.ok()) valid = f.Validate();
  // The cache type against the backend too, so that --check-flags refuses
  // what the backend would.
  if (valid.ok()) valid = tandem::worker::KvCacheType({f.backend, 0, 0, f.kv_cache_dtype}).status();
  if (!valid.ok()) {
    std::fprintf(stderr, "tandem-worker: %s\n", std::string(valid.message()).c_str());
    return 2;
  }
  if (p.check_flags) {
    std::fprintf(stderr, "tandem-worker: flags accepted\n");
    return 0;
  }
  const std::string& scheduler = p.scheduler;
  const int64_t rank = p.rank;
  o.rank = static_cast<int32_t>(p.rank);
  o.world_size = static_cast<int32_t>(p.world_size);
  o.block_size = static_cast<int32_t>(p.block_size);
  o.comm_host = p.comm_host;
  o.comm_port = static_cast<int32_t>(p.comm_port);
  o.threads = static_cast<int32_t>(f.threads);
  o.kv_cache_bytes = f.kv_cache_memory;
  o.peer_timeout = absl::Seconds(f.peer_timeout);
  o.backend = f.backend;
  o.device = static_cast<int32_t>(f.device);
  o.gpu_memory_utilization = f.gpu_memory_utilization;
  o.comm = f.comm;
  o.kv_cache_dtype = f.kv_cache_dtype;
  o.enforce_eager = f.enforce_eager;
  if (p.tls.enabled()) {  // the same files secure the worker-to-worker channel
    auto comm_tls = tandem::worker::TlsContext::Load(p.tls.cert, p.tls.key, p.tls.ca);
    if (!comm_tls.ok()) {
      std::fprintf(stderr, "tandem-worker %lld: %s\n", static_cast<long long>(p.rank),
                   std::string(comm_tls.status().message()).c_str());
      return 1;
    }
    o.comm_tls = *std::move(comm_tls);
    std::fprintf(stderr, "tandem-worker %lld: worker channel: mutual TLS 1.3 (--tls-*)\n",
                 static_cast<long long>(p.rank));
  }

  // Up before the model loads, so a liveness probe sees the process at once;
  // "" is SERVING only while the worker is in a group its scheduler formed.
  std::unique_ptr<tandem::worker::HealthServer> health;
  if (p.health_port >= 0) {
    auto started = tandem::worker::HealthServer::Start("0.0.0.0", static_cast<int>(p.health_port));
    if (!started.ok()) {
      std::fprintf(stderr, "tandem-worker %lld: %s\n", static_cast<long long>(rank),
                   std::string(started.status().message()).c_str());
      return 1;
    }
    health = *std::move(started);
  }

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
  auto credentials = tandem::rpc::MakeChannelCredentials(p.tls);
  if (!credentials.ok()) {
    std::fprintf(stderr, "tandem-worker %lld: %s\n", static_cast<long long>(rank),
                 std::string(credentials.status().message()).c_str());
    return 1;
  }
  auto channel = tandem::rpc::MakeChannel(scheduler, *credentials);
  // A scheduler that refuses this worker's certificate (or whose own this
  // worker refuses) would leave the stream below waiting for ever.
  if (absl::Status dial = tandem::worker::AwaitScheduler(channel, scheduler, p.tls.enabled()); !dial.ok()) {
    std::fprintf(stderr, "tandem-worker %lld: %s; exiting\n", static_cast<long long>(rank),
                 std::string(dial.message()).c_str());
    return 1;
  }
  auto stub = tandem::v1::WorkerControl::NewStub(channel);
  tandem::worker::GrpcSchedulerLink link(channel, stub.get(), [&health](bool in_group) {
    if (health) health->SetServing("", in_group);
  });
  const absl::Status status = (*server)->Run(&link);
  link.Shutdown();
  std::fprintf(stderr, "tandem-worker %lld: the scheduler went away (%s); exiting\n", static_cast<long long>(rank),
               std::string(status.message()).c_str());
  return 1;
}
