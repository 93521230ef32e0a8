// WorkerServer: one worker process's logic, without the transport. It makes
// its backend and loads its pipeline stage's layers at startup, then follows
// the scheduler's control messages on its compute thread (Run):
//   ConfigureGroup  drop every request, size the KV cache, listen for the
//                   other ranks, answer with its address (and, for NCCL, its
//                   GPU's identity; rank 0 adds the NCCL ids);
//   ConnectGroup    connect to the other ranks (NCCL between CUDA workers on
//                   distinct GPUs, TCP otherwise), build the runner, answer
//                   Ready;
//   Execute/Sample  run the step (ExecuteAndSample: both, in one message);
//                   the last stage's results go out through the output
//                   thread, or at once when nothing waits (below).
// Messages arrive from the transport's threads through OnMessage, which only
// enqueues. An error in a step is reported once; the worker then ignores
// steps until the next ConfigureGroup.
//
// The output thread (scheduler/README.md §1, §6): after Sample(k) the compute
// thread hands the step's StepOutput to the output thread and goes on to step
// k+1 while the device copies step k's ids to the host. The output thread
// waits for the copy, serializes the result and sends it. A result whose
// copy is already done (the CPU backend, --fake-model) is sent by the compute
// thread itself when the outbox is empty and the output thread is not
// sending: a thread hop fewer, the order kept. Step results and step errors
// (from either thread) otherwise leave through it in step order; an error
// on the output thread fails the step exactly as one on the compute thread
// (a WorkerError with the step's sequence number; later steps of the epoch
// are ignored). Runner state stays on the compute thread (model_runner.h).
//
// The compute thread also measures how long it waits between steps while
// configured (idle) and how long it works (busy); the output thread reports
// both twice a second (the compute thread may be blocked in a read).
//
// Thread-safe: OnMessage and OnDisconnected from any thread; Run on one.
#ifndef TANDEM_WORKER_SERVER_WORKER_SERVER_H_
#define TANDEM_WORKER_SERVER_WORKER_SERVER_H_

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/llama_config.h"
#include "proto/diff/step_diff.h"
#include "tandem/v1/worker_service.pb.h"
#include "worker/backends/backend.h"
#include "worker/comm/tcp_communicator.h"
#include "worker/model/llama_model.h"
#include "worker/runner/model_runner.h"
#include "worker/server/backend_factory.h"
#include "worker/server/fake_stage_runner.h"

namespace tandem::worker {

using Clock = std::chrono::steady_clock;

struct WorkerOptions {
  std::string model_path;
  int32_t rank = 0;
  int32_t world_size = 1;
  int32_t threads = 0;
  int32_t block_size = 16;
  std::string comm_host = "127.0.0.1";  // where the other ranks can reach this one
  int32_t comm_port = 0;                 // its listener's port; 0: any free port
  // TLS on the worker-to-worker channel (the --tls-* files); null: plaintext.
  std::shared_ptr<const TlsContext> comm_tls;
  absl::Duration peer_timeout = absl::Seconds(30);
  // The device (worker_flags.h).
  std::string backend = "cpu";
  int32_t device = 0;
  // KV cache: the CPU backend's budget, and the GPU's fraction of memory.
  int64_t kv_cache_bytes = int64_t{1} << 30;
  double gpu_memory_utilization = 0.9;
  // The largest step the GPU's activation peak is measured with (the
  // scheduler's default --max-num-batched-tokens and --max-num-seqs).
  int32_t profile_tokens = 2048;
  int32_t profile_rows = 128;
  std::string comm = "auto";  // auto | nccl | tcp
  std::string kv_cache_dtype = "auto";  // BackendChoice::kv_cache_dtype
  bool enforce_eager = false;           // BackendChoice::enforce_eager
  // Benchmarks only (tandem-worker --fake-model): no backend and no weights;
  // steps run on FakeStageRunner, whose model costs nothing, so what is
  // measured is the control plane. The model file gives only its shape.
  bool fake_model = false;
};

// The worker's end of the control stream. Send must be thread-safe (the
// compute thread and the output thread both send). A link either pushes what
// arrives through WorkerServer::OnMessage (from its own threads), or pulls:
// Run's thread reads each message itself with Receive, which blocks until one
// arrives (true) or the stream ends (false, with the reason): no hop to
// another thread between the socket and the step (gRPC's synchronous API).
class SchedulerLink {
 public:
  virtual ~SchedulerLink() = default;
  virtual void Send(const v1::WorkerMessage& message) = 0;
  virtual bool pulls() const { return false; }
  virtual bool Receive(v1::SchedulerMessage* message, std::string* reason) { return false; }
};

class WorkerServer {
 public:
  // Makes the backend and loads this rank's layers; fails with a message
  // naming what is wrong (FailedPrecondition when the backend cannot be had).
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Create(const WorkerOptions& options);
  // The same on a given backend (tests wrap one to control its events).
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Create(const WorkerOptions& options,
                                                              std::unique_ptr<Backend> backend);
  ~WorkerServer();

  v1::RegisterWorker Registration() const;

  // --- transport threads ---
  void OnMessage(v1::SchedulerMessage message) ABSL_LOCKS_EXCLUDED(mu_);
  void OnDisconnected(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs until the scheduler goes away; returns why. Starts the output
  // thread and stops it before returning.
  absl::Status Run(SchedulerLink* link) ABSL_LOCKS_EXCLUDED(mu_, out_mu_);

 private:
  // What the output thread sends: a step's output, or an error.
  struct Outgoing {
    int64_t epoch = 0;
    uint64_t step_seq = 0;
    std::shared_ptr<StepOutput> output;  // null: `ready` or `error`
    absl::Status error;
    std::optional<v1::ModelRunnerOutput> ready;  // the fake model's, already built
  };

  explicit WorkerServer(const WorkerOptions& options) : options_(options) {}
  absl::Status SizeKvCache(const DeviceMemory* at_start);
  // The runner of the current epoch (real or fake) exists.
  bool running() const { return runner_ != nullptr || fake_ != nullptr; }
  absl::Status Configure(const v1::ConfigureGroup& configure, SchedulerLink* link);
  absl::Status Connect(const v1::ConnectGroup& connect);
  // --fake-model: no backend, no weights (WorkerOptions::fake_model).
  static absl::StatusOr<std::unique_ptr<WorkerServer>> CreateFake(std::unique_ptr<WorkerServer> w);
  // Opens the model file, reads its config and picks this rank's layers.
  absl::Status OpenModelStage();
  absl::Status ConnectFake(const v1::ConnectGroup& connect);
  int64_t KvBytesPerBlock(const WorkerOptions& options) const;
  // Rebuilds a compact execute's rows in place (proto/diff/step_diff.h).
  void Process(v1::SchedulerMessage& message, SchedulerLink* link) ABSL_LOCKS_EXCLUDED(out_mu_);
  absl::Status ExpandExecute(v1::SchedulerMessage& message);
  // Whether this epoch still runs steps (not broken here or on the output thread).
  bool StepsAllowed() ABSL_LOCKS_EXCLUDED(out_mu_);
  void ExecuteStep(const v1::SchedulerOutput& step) ABSL_LOCKS_EXCLUDED(out_mu_);
  void SampleStep(const v1::SampleCommand& command, SchedulerLink* link) ABSL_LOCKS_EXCLUDED(out_mu_);
  void ReportError(uint64_t step_seq, const absl::Status& status) ABSL_LOCKS_EXCLUDED(out_mu_);
  void Post(Outgoing outgoing) ABSL_LOCKS_EXCLUDED(out_mu_);
  // A result whose ids are on the host: sent from the compute thread when
  // nothing waits ahead of it in the outbox, posted otherwise.
  void SendOrPost(SchedulerLink* link, uint64_t step_seq, v1::ModelRunnerOutput output)
      ABSL_LOCKS_EXCLUDED(out_mu_);
  // The output thread: serializes one item and sends it.
  void Send(SchedulerLink* link, Outgoing item) ABSL_LOCKS_EXCLUDED(out_mu_);
  // The output thread's loop; returns once stop_output_ is set.
  void OutputLoop(SchedulerLink* link) ABSL_LOCKS_EXCLUDED(out_mu_);
  // The next message from the inbox (a pushing link), or false with the reason
  // the scheduler went away.
  bool Pop(v1::SchedulerMessage* message, std::string* gone) ABSL_LOCKS_EXCLUDED(mu_);
  // The compute thread's accounting around a wait and a message's work.
  void BeginWait() ABSL_LOCKS_EXCLUDED(stats_mu_);
  void EndWait() ABSL_LOCKS_EXCLUDED(stats_mu_);
  void AddBusy(Clock::time_point work_start) ABSL_LOCKS_EXCLUDED(stats_mu_);
  v1::WorkerMessage StatsMessage() ABSL_LOCKS_EXCLUDED(stats_mu_);
  void SendError(SchedulerLink* link, int64_t epoch, uint64_t step_seq, const absl::Status& status);

  const WorkerOptions options_;
  std::unique_ptr<gguf::GgufFile> file_;
  gguf::LlamaConfig config_;
  LlamaModelStage stage_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LlamaModel> model_;
  int32_t max_kv_blocks_ = 0;
  std::string nccl_identity_;  // "" when this rank does not offer NCCL

  // Compute thread only.
  int64_t epoch_ = 0;
  int32_t allocated_blocks_ = 0;
  bool broken_ = false;
  std::unique_ptr<TcpCommunicator> tcp_;  // between Configure and Connect
  std::unique_ptr<PipelineTransport> transport_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<FakeStageRunner> fake_;  // instead of runner_ with --fake-model
  wire::StepDiffState diff_;  // the executes of this epoch
  int64_t steps_ = 0;

  // Busy and idle time, kept by the compute thread, reported by the output thread.
  absl::Mutex stats_mu_;
  double busy_seconds_ ABSL_GUARDED_BY(stats_mu_) = 0;
  double idle_seconds_ ABSL_GUARDED_BY(stats_mu_) = 0;
  int64_t reported_steps_ ABSL_GUARDED_BY(stats_mu_) = 0;
  // When the compute thread began waiting for a message while configured.
  std::optional<Clock::time_point> waiting_since_ ABSL_GUARDED_BY(stats_mu_);

  // The inbox, shared with the transport threads.
  absl::Mutex mu_;
  std::deque<v1::SchedulerMessage> inbox_ ABSL_GUARDED_BY(mu_);
  bool disconnected_ ABSL_GUARDED_BY(mu_) = false;
  std::string disconnect_reason_ ABSL_GUARDED_BY(mu_);

  // The outbox, shared with the output thread.
  absl::Mutex out_mu_;
  std::deque<Outgoing> outbox_ ABSL_GUARDED_BY(out_mu_);
  bool stop_output_ ABSL_GUARDED_BY(out_mu_) = false;
  // The output thread is sending an item it took from the outbox.
  bool output_sending_ ABSL_GUARDED_BY(out_mu_) = false;
  // The epoch in which a step failed (0: none): its later steps are dropped.
  int64_t failed_epoch_ ABSL_GUARDED_BY(out_mu_) = 0;
  std::thread output_thread_;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_SERVER_WORKER_SERVER_H_
