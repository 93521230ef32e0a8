// WorkerServer: one worker process's logic, without the transport. It loads
// its pipeline stage's layers at startup, then follows the scheduler's
// control messages on its compute thread (Run):
//   ConfigureGroup  drop every request, size the KV cache, open a
//                   communicator for the new epoch, answer with its address;
//   ConnectGroup    connect to the other ranks, build the runner, answer Ready;
//   Execute/Sample  run the step; the last stage answers with its result.
// Messages arrive from the transport's threads through OnMessage, which only
// enqueues. An error in a step is reported once; the worker then ignores
// steps until the next ConfigureGroup.
//
// The compute thread also measures how long it waits between steps while
// configured (idle) and how long it works (busy), and reports both twice a
// second.
//
// Thread-safe: OnMessage and OnDisconnected from any thread; Run on one.
#ifndef TANDEM_WORKER_SERVER_WORKER_SERVER_H_
#define TANDEM_WORKER_SERVER_WORKER_SERVER_H_

#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/llama_config.h"
#include "tandem/v1/worker_service.pb.h"
#include "worker/backends/cpu/cpu_backend.h"
#include "worker/comm/communicator.h"
#include "worker/model/llama_model.h"
#include "worker/runner/model_runner.h"

namespace tandem::worker {

struct WorkerOptions {
  std::string model_path;
  int32_t rank = 0;
  int32_t world_size = 1;
  int64_t kv_cache_bytes = int64_t{1} << 30;
  int32_t threads = 0;
  int32_t block_size = 16;
  std::string comm_host = "127.0.0.1";  // where the other ranks can reach this one
  absl::Duration peer_timeout = absl::Seconds(30);
};

// The worker's end of the control stream.
class SchedulerLink {
 public:
  virtual ~SchedulerLink() = default;
  virtual void Send(const v1::WorkerMessage& message) = 0;
};

class WorkerServer {
 public:
  // Loads this rank's layers; fails with a message naming what is wrong.
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Create(const WorkerOptions& options);
  ~WorkerServer();

  v1::RegisterWorker Registration() const;

  // --- transport threads ---
  void OnMessage(v1::SchedulerMessage message) ABSL_LOCKS_EXCLUDED(mu_);
  void OnDisconnected(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs until the scheduler goes away; returns why.
  absl::Status Run(SchedulerLink* link) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit WorkerServer(const WorkerOptions& options) : options_(options) {}
  absl::Status Configure(const v1::ConfigureGroup& configure, SchedulerLink* link);
  absl::Status Connect(const v1::ConnectGroup& connect, SchedulerLink* link);
  void Process(const v1::SchedulerMessage& message, SchedulerLink* link);
  void ReportError(uint64_t step_seq, const absl::Status& status, SchedulerLink* link);

  const WorkerOptions options_;
  std::unique_ptr<gguf::GgufFile> file_;
  gguf::LlamaConfig config_;
  LlamaModelStage stage_;
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<LlamaModel> model_;
  int32_t max_kv_blocks_ = 0;

  // Compute thread only.
  int64_t epoch_ = 0;
  int32_t allocated_blocks_ = 0;
  bool broken_ = false;
  std::unique_ptr<Communicator> communicator_;
  std::unique_ptr<ModelRunner> runner_;
  double busy_seconds_ = 0;
  double idle_seconds_ = 0;
  int64_t steps_ = 0;

  // The inbox, shared with the transport threads.
  absl::Mutex mu_;
  std::deque<v1::SchedulerMessage> inbox_ ABSL_GUARDED_BY(mu_);
  bool disconnected_ ABSL_GUARDED_BY(mu_) = false;
  std::string disconnect_reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_SERVER_WORKER_SERVER_H_
