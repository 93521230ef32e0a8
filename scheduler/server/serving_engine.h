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
// waiting ones stay, and the group re-forms. The wait is bounded
// (ServingOptions): a request still queued `queue_timeout` after it arrived
// while the group is not ready fails with UNAVAILABLE, and a Submit past
// `max_queued_requests` queued requests fails at once with RESOURCE_EXHAUSTED.
//
// Aborts name the request by the id Submit returned, resolved when the abort
// is made: a late cancel of a finished request can never reach a newer
// request that reuses its client's name.
//
// Thread-safe: Submit, Abort, Wake and Snapshot from any thread; the rest
// runs on the engine thread, started by Start and joined by Stop.
#ifndef TANDEM_SCHEDULER_SERVER_SERVING_ENGINE_H_
#define TANDEM_SCHEDULER_SERVER_SERVING_ENGINE_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
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
  // The masks of a step's `rows` structured-output rows took `seconds` to build.
  virtual void OnGrammarMasks(int32_t rows, double seconds) {}
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

// Bounds on the queue of requests not yet scheduled.
struct ServingOptions {
  // Seconds a request may wait for a worker group that is not ready before it
  // fails (UNAVAILABLE); 0: no bound. Checked while the group is not ready:
  // a request queued behind others on a ready group is not timed out.
  double queue_timeout_seconds = 60;
  // Requests submitted and not yet scheduled at most; past it Submit fails
  // the request at once (RESOURCE_EXHAUSTED). 0: no limit.
  int64_t max_queued_requests = 0;
  // The engine's clock (tests: a fake one). Default: steady_clock::now.
  std::function<std::chrono::steady_clock::time_point()> clock;
};

class ServingEngine {
 public:
  // `config` is the engine's, except num_kv_blocks (taken from the group)
  // and, when it is 0, max_model_len (the model's context length, capped by
  // what the pool holds). `group` and the observers must outlive the engine.
  ServingEngine(EngineConfig config, ExecutorGroup* group, std::vector<StepObserver*> observers = {},
                int32_t model_context_length = 0, ServingOptions options = {});
  // Optional; set before Start. Must outlive the engine.
  void set_listener(ServingListener* listener) { listener_ = listener; }
  ~ServingEngine();

  void Start();
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Queues a request and returns the id assigned to it (in `spec`), the one
  // to abort it by. `external_id` (unique among live requests, may be empty)
  // is the client's name for it. A request that cannot be queued (a name in
  // use, the queue full) is answered through the sink with an error before
  // this returns; bad requests are answered through the sink later.
  RequestId Submit(std::string external_id, RequestSpec spec, std::shared_ptr<RequestSink> sink)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Aborts request `id` if it is still live; false otherwise.
  bool Abort(RequestId id) ABSL_LOCKS_EXCLUDED(mu_);
  // Aborts the live request that the client named `external_id` now (the
  // Generate API's Abort); false if there is none. A stream that cancels its
  // own request uses Abort(id): the name may since belong to another.
  bool AbortByName(const std::string& external_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The group's readiness may have changed.
  void Wake() ABSL_LOCKS_EXCLUDED(mu_);
  ServingSnapshot Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Submission {
    RequestSpec spec;
    std::shared_ptr<RequestSink> sink;
    std::chrono::steady_clock::time_point arrival;
  };

  // Sees each step as it is scheduled, for the time requests spend queued.
  class QueueTimer : public StepObserver {
   public:
    explicit QueueTimer(ServingEngine* engine) : engine_(engine) {}
    void OnScheduled(const EngineCore& engine, const SchedulerOutput& step) override;
    void OnGrammarMasks(const EngineCore& engine, const SchedulerOutput& step, int32_t rows, double seconds) override {
      if (engine_->listener_ != nullptr) engine_->listener_->OnGrammarMasks(rows, seconds);
    }

   private:
    ServingEngine* const engine_;
  };

  // The engine thread's methods: they take mu_ only briefly, to reach the
  // inbox and the snapshot.
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status EnsureScheduler() ABSL_LOCKS_EXCLUDED(mu_);
  void Admit(Submission submission) ABSL_LOCKS_EXCLUDED(mu_);
  void ApplyAborts(const std::vector<RequestId>& ids) ABSL_LOCKS_EXCLUDED(mu_);
  // Fails the requests that waited longer than queue_timeout for a group
  // that is still not ready.
  void ExpireQueued() ABSL_LOCKS_EXCLUDED(mu_);
  void Dispatch(const std::vector<RequestOutput>& outputs) ABSL_LOCKS_EXCLUDED(mu_);
  // The sink of `id` (null if none), remembered for `position` of a
  // dispatch: what Dispatch does when sink_order_ does not have it.
  RequestSink* FindSink(size_t position, RequestId id);
  void HandleFailure(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends a request the scheduler does not hold (never admitted, or refused).
  void FailWith(RequestId id, const std::shared_ptr<RequestSink>& sink, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Bookkeeping of a request that has left the queue (first scheduled, or
  // ended before that): it no longer counts against max_queued_requests.
  void Dequeued(RequestId id) ABSL_LOCKS_EXCLUDED(mu_);
  // A request has ended: it is no longer live, and neither is its name.
  void Forget(RequestId id) ABSL_LOCKS_EXCLUDED(mu_);
  std::chrono::steady_clock::time_point Now() const;
  void PublishSnapshot() ABSL_LOCKS_EXCLUDED(mu_);

  const EngineConfig config_template_;
  ExecutorGroup* const group_;
  const std::vector<StepObserver*> observers_;
  const int32_t model_context_length_;
  const ServingOptions options_;

  // Inbox, shared with frontend threads.
  mutable absl::Mutex mu_;
  std::vector<Submission> submissions_ ABSL_GUARDED_BY(mu_);
  std::vector<RequestId> aborts_ ABSL_GUARDED_BY(mu_);
  // Every request submitted and not yet ended, with its client's name (may
  // be empty), and the names in use.
  absl::flat_hash_map<RequestId, std::string> live_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, RequestId> live_external_ ABSL_GUARDED_BY(mu_);
  // Live requests not yet scheduled (in the inbox, waiting for the group,
  // or queued in the scheduler): the engine thread's arrival_ plus the inbox.
  int64_t num_queued_ ABSL_GUARDED_BY(mu_) = 0;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  ServingSnapshot snapshot_ ABSL_GUARDED_BY(mu_);
  RequestId next_id_ ABSL_GUARDED_BY(mu_) = 1;

  // Engine thread only.
  ServingListener* listener_ = nullptr;
  QueueTimer queue_timer_{this};
  // Every request taken from the inbox and not yet scheduled: queued.
  absl::flat_hash_map<RequestId, std::chrono::steady_clock::time_point> arrival_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<EngineCore> engine_;
  std::vector<Submission> waiting_for_group_;
  absl::flat_hash_map<RequestId, std::shared_ptr<RequestSink>> sinks_;  // admitted requests
  // The sinks of the last outputs dispatched, by position: a step's outputs
  // come in its rows' order, which stays put from step to step, so a compare
  // replaces most hash lookups. Emptied whenever sinks_ drops or replaces a
  // sink, so it never points at one that is gone.
  std::vector<std::pair<RequestId, RequestSink*>> sink_order_;
  std::thread thread_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_SERVER_SERVING_ENGINE_H_
