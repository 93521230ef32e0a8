// ServingEngine: the scheduler process's engine thread (scheduler/README.md §1).
// Frontends (gRPC, HTTP) submit requests and aborts from their own threads;
// they only enqueue. The engine thread owns the Scheduler and the EngineCore,
// takes no locks while it schedules, and hands each request's outputs to the
// RequestSink its frontend gave.
//
// The executor is an ExecutorGroup: the workers may not be ready yet, or may
// fail. Requests wait (queued) until the group is ready; the KV pool is sized
// from what the group reports. When a step fails (a worker died or stopped
// answering), every request that was running fails with that error, the
// waiting ones stay, and the group re-forms.
//
// Thread-safe: Submit, Abort, Wake and Snapshot from any thread; the rest
// runs on the engine thread, started by Start and joined by Stop.
#ifndef TANDEM_SCHEDULER_SERVER_SERVING_ENGINE_H_
#define TANDEM_SCHEDULER_SERVER_SERVING_ENGINE_H_

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "scheduler/core/engine_core.h"
#include "scheduler/core/scheduler.h"

namespace tandem::scheduler {

// Where one request's outputs go. Called on the engine thread: must not block.
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  virtual void OnOutput(const RequestOutput& output) = 0;
};

// Engine-thread events, for metrics. Called on the engine thread: must be
// cheap and must not block.
class ServingListener {
 public:
  virtual ~ServingListener() = default;
  // A request was scheduled for the first time, `seconds` after Submit.
  virtual void OnFirstScheduled(double seconds) {}
  // The scheduler's own time (Schedule and UpdateFromOutput) in one engine
  // iteration that launched or collected a step.
  virtual void OnSchedulerTime(double seconds) {}
};

struct ServingSnapshot {
  bool executor_ready = false;
  int64_t num_running = 0;
  int64_t num_waiting = 0;   // including those waiting for the group
  int64_t num_steps_in_flight = 0;  // executed steps whose results are not yet processed
  SchedulerStats stats;
  // Counters and the pool survive a re-formed group only as far as the
  // scheduler does: they restart with it.
  int64_t prefix_cache_queries = 0;  // prompt tokens looked up
  int64_t prefix_cache_hits = 0;     // of those, found cached
  int32_t kv_blocks_total = 0;       // usable blocks; 0 until the group first formed
  double kv_cache_usage = 0;         // BlockPool::Usage(): the fraction of those not free
  int32_t max_model_len = 0;         // 0 until the group first formed
  double scheduler_seconds = 0;      // time in Schedule and UpdateFromOutput
};

class ServingEngine {
 public:
  // `config` is the engine's, except num_kv_blocks (taken from the group)
  // and, when it is 0, max_model_len (the model's context length, capped by
  // what the pool holds). `group` and the observers must outlive the engine.
  ServingEngine(EngineConfig config, ExecutorGroup* group, std::vector<StepObserver*> observers = {},
                int32_t model_context_length = 0);
  // Optional; set before Start. Must outlive the engine.
  void set_listener(ServingListener* listener) { listener_ = listener; }
  ~ServingEngine();

  void Start();
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Queues a request. The id in `spec` is assigned here; `external_id`
  // (unique among live requests, may be empty) is the client's name for it.
  // Bad requests are answered through the sink with an error.
  void Submit(std::string external_id, RequestSpec spec, std::shared_ptr<RequestSink> sink)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Aborts a live request by its client's name; false if there is none.
  bool Abort(const std::string& external_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The group's readiness may have changed.
  void Wake() ABSL_LOCKS_EXCLUDED(mu_);
  ServingSnapshot Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Submission {
    std::string external_id;
    RequestSpec spec;
    std::shared_ptr<RequestSink> sink;
    std::chrono::steady_clock::time_point arrival;
  };

  // Sees each step as it is scheduled, for the time requests spend queued.
  class QueueTimer : public StepObserver {
   public:
    explicit QueueTimer(ServingEngine* engine) : engine_(engine) {}
    void OnScheduled(const EngineCore& engine, const SchedulerOutput& step) override;

   private:
    ServingEngine* const engine_;
  };

  // The engine thread's methods: they take mu_ only briefly, to reach the
  // inbox and the snapshot.
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status EnsureScheduler() ABSL_LOCKS_EXCLUDED(mu_);
  void Admit(Submission submission) ABSL_LOCKS_EXCLUDED(mu_);
  void Dispatch(const std::vector<RequestOutput>& outputs) ABSL_LOCKS_EXCLUDED(mu_);
  void HandleFailure(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  void FailWith(RequestId id, const std::shared_ptr<RequestSink>& sink, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(mu_);
  void PublishSnapshot() ABSL_LOCKS_EXCLUDED(mu_);

  const EngineConfig config_template_;
  ExecutorGroup* const group_;
  const std::vector<StepObserver*> observers_;
  const int32_t model_context_length_;

  // Inbox, shared with frontend threads.
  mutable absl::Mutex mu_;
  std::vector<Submission> submissions_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> aborts_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, RequestId> live_external_ ABSL_GUARDED_BY(mu_);
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  ServingSnapshot snapshot_ ABSL_GUARDED_BY(mu_);
  RequestId next_id_ ABSL_GUARDED_BY(mu_) = 1;

  // Engine thread only.
  ServingListener* listener_ = nullptr;
  QueueTimer queue_timer_{this};
  absl::flat_hash_map<RequestId, std::chrono::steady_clock::time_point> arrival_;  // until first scheduled
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<EngineCore> engine_;
  std::vector<Submission> waiting_for_group_;
  absl::flat_hash_map<RequestId, std::shared_ptr<RequestSink>> sinks_;
  absl::flat_hash_map<RequestId, std::string> external_of_;
  std::thread thread_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_SERVER_SERVING_ENGINE_H_
