// Scheduler: plans every step (Schedule) and reconciles each step's result
// (UpdateFromOutput), with synchronous and asynchronous behaviour
// (scheduler/README.md §4–§5; vLLM's Scheduler.schedule() and
// update_from_output(), with AsyncScheduler's overrides).
//
//   Schedule()                two passes: running requests in admission order,
//                             then waiting ones (FCFS or priority); token
//                             budget, max_num_seqs, chunked prefill, recompute
//                             preemption; in async mode each sampling row
//                             reserves a placeholder.
//   UpdateFromOutput(so, mro) appends real ids, drops placeholders, checks
//                             stops, caches committed blocks, frees finished
//                             requests behind their fences.
//
// Steps must be updated exactly once each, in the order they were scheduled.
// Pure C++: no gRPC, no model, no GPU, so every path is unit-tested and
// benchmarked in microseconds.
//
// Thread-compatible: owned by the engine thread, which takes no locks.
#ifndef TANDEM_SCHEDULER_CORE_SCHEDULER_H_
#define TANDEM_SCHEDULER_CORE_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "scheduler/core/engine_config.h"
#include "scheduler/core/fault_injection.h"
#include "scheduler/core/kv_cache_manager.h"
#include "scheduler/core/request.h"
#include "scheduler/core/request_queue.h"
#include "scheduler/core/request_table.h"
#include "scheduler/core/scheduler_output.h"

namespace tandem::scheduler {

struct SchedulerStats {
  int64_t num_steps = 0;              // executed (non-empty) steps
  int64_t num_scheduled_tokens = 0;
  int64_t num_preemptions = 0;
  // Rows whose output was discarded because the request had already finished
  // (the price of planning ahead: a stop token wastes the steps behind it).
  int64_t num_wasted_rows = 0;
  int64_t num_stale_tokens_delivered = 0;
  int64_t num_finished[5] = {};       // indexed by FinishReason
};

// Blocks of a finished or preempted request that a step in flight may still
// touch; returned to the pool once processed_step_seq reaches `fence`.
struct DeferredFree {
  StepSeq fence = 0;
  std::vector<BlockId> blocks;
};

class Scheduler {
 public:
  // Validates `config`; the error names the bad field.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const EngineConfig& config);

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Validates and queues a request. A bad request returns InvalidArgument (or
  // AlreadyExists for a duplicate id) and changes nothing.
  absl::Status AddRequest(RequestSpec spec);

  // Finishes the given unfinished requests as aborted, frees their blocks
  // (behind their fences) and appends one output per aborted request. Unknown
  // or finished ids are ignored. The engine calls this right before
  // UpdateFromOutput, so an abort during a request's final step wins.
  void AbortRequests(absl::Span<const RequestId> ids, std::vector<RequestOutput>* outputs);

  // After the executor failed (a worker died, a step timed out): every step
  // in flight is lost. Finishes every request that has run, is running or
  // has output in flight with kFinishedError and `error`, returns all blocks,
  // forgets the prefix cache (the workers' KV is gone) and appends one output
  // per failed request. Requests that never ran stay queued.
  void FailStartedRequests(const absl::Status& error, std::vector<RequestOutput>* outputs);

  // Plans the next step. An output with no scheduled tokens is not to be
  // executed; what it would have told the workers waits for the next step.
  SchedulerOutput Schedule();

  // Reconciles step `step` with its result and appends the outputs to report.
  // REQUIRES: `step` is the oldest executed step not yet updated, and
  // `result` has one row per scheduled request in scheduling order.
  void UpdateFromOutput(const SchedulerOutput& step, const ModelRunnerOutput& result,
                        std::vector<RequestOutput>* outputs);

  // Hands back a step whose update is done, so its buffers serve a later
  // step instead of being allocated again (optional; saves time per step).
  void Recycle(SchedulerOutput&& step);

  // Masks for the structured-output rows of `step`, from each grammar's
  // current state (which must have seen every earlier token).
  GrammarOutput GetGrammarBitmask(const SchedulerOutput& step) const;

  // Unfinished requests exist (waiting, running or preempted).
  bool HasRequests() const { return !requests_.empty(); }
  size_t num_requests() const { return requests_.size(); }
  size_t num_running() const { return running_.size(); }
  size_t num_waiting() const { return waiting_.size() + skipped_waiting_.size(); }

  // Test builds only (fault_injection.h); no effect elsewhere.
  void InjectFaultForTest(SchedulerFault fault) {
    fault_ = fault;
    kv_.mutable_pool().InjectFaultForTest(fault);
  }

  // --- introspection (tests, tracing, metrics, the invariant checker) ---
  const EngineConfig& config() const { return config_; }
  const Request* FindRequest(RequestId id) const;
  std::vector<const Request*> AllRequests() const;
  const std::vector<Request*>& running() const { return running_; }
  std::vector<Request*> WaitingSnapshot() const;
  const KvCacheManager& kv_cache() const { return kv_; }
  const std::deque<DeferredFree>& deferred_frees() const { return deferred_frees_; }
  StepSeq sched_step_seq() const { return sched_step_seq_; }
  StepSeq processed_step_seq() const { return processed_step_seq_; }
  bool defers_block_free() const { return defer_block_free_; }
  const SchedulerStats& stats() const { return stats_; }

 private:
  // One request scheduled in the step being built.
  struct Planned {
    Request* request;
    int32_t num_tokens;
    enum class Kind { kRunning, kNew, kResumed } kind;
    int32_t first_new_block;  // index into request->blocks
  };

  explicit Scheduler(const EngineConfig& config);

  absl::Status ValidateRequest(const RequestSpec& spec) const;
  // Pass 1: running requests; sets *pool_exhausted if one could not get the
  // blocks it needed (it preempted in vain, or waits for fenced blocks).
  void ScheduleRunning(int32_t* token_budget, std::vector<Planned>* planned, bool* pool_exhausted);
  // Reserves the slots for `n` tokens of `r` (at *index in running_),
  // preempting victims while that frees blocks now. False if `r` is left
  // without them (it may have been its own victim).
  bool AllocateOrPreempt(Request* r, int32_t n, size_t* index, int32_t* token_budget,
                         std::vector<Planned>* planned);
  void ScheduleWaiting(int32_t* token_budget, std::vector<Planned>* planned);
  // Picks and preempts a victim so that `current` (at *index in running_)
  // may allocate; FCFS takes the newest admission, priority the least
  // important (rolling it back if already planned in this step). Sets
  // *victim and returns whether its blocks went back to the pool now.
  bool PreemptOne(Request* current, size_t* index, int32_t* token_budget,
                  std::vector<Planned>* planned, const Request** victim);
  int32_t CapTokens(const Request& request, int32_t gap, int32_t token_budget) const;
  RequestQueue& SelectWaitingQueue();
  // Writes the planned requests into `out` (new, cached and scheduled lists)
  // and advances their counters: C, IF, the fence, and in async mode a
  // placeholder for each sampling row.
  void EmitStep(const std::vector<Planned>& planned, SchedulerOutput* out);
  static void AddCachedEntry(const Request& r, absl::Span<const BlockId> new_blocks, bool resumed,
                             CachedRequestData* cached);
  void AdvanceScheduled(Request* r, int32_t num_tokens, SchedulerOutput* out);

  void Preempt(Request* request);
  // Whether the request's blocks would return to the pool now.
  bool CanFreeBlocksNow(const Request& request) const;
  void FreeRequestBlocks(Request* request);
  void DrainDeferredFrees();
  // Marks `request` finished with `status`, frees its blocks and reports its
  // id to the workers. The caller removes it from the queues and the table.
  void FinishRequest(Request* request, RequestStatus status);
  // Applies stop conditions after one appended token; sets status if so.
  bool CheckStop(Request* request) const;
  // Commits `sampled` to a request and fills `out`. Returns true if the
  // request finished.
  bool AppendDelivered(Request* request, absl::Span<const TokenId> sampled, bool stale,
                       RequestOutput* out);
  // Drops requests finished by an update from the queues and the table.
  void RemoveFinished(const std::vector<std::pair<Request*, RequestStatus>>& finished);

  const EngineConfig config_;
  const int32_t decode_cadence_;
  const bool defer_block_free_;
  KvCacheManager kv_;

  RequestTable requests_;              // every unfinished request
  std::vector<Request*> running_;       // admission order
  RequestQueue waiting_;
  RequestQueue skipped_waiting_;        // skipped in a waiting pass, tried first
  std::vector<RequestId> finished_ids_;   // since the last executed step
  std::vector<RequestId> preempted_ids_;  // since the last executed step
  std::deque<DeferredFree> deferred_frees_;  // fences ascending

  int64_t current_step_ = 0;
  StepSeq sched_step_seq_ = 0;
  StepSeq processed_step_seq_ = 0;
  uint64_t next_arrival_seq_ = 0;
  SchedulerStats stats_;
  SchedulerFault fault_ = SchedulerFault::kNone;
  std::vector<BlockId> hit_scratch_;
  std::vector<Planned> planned_scratch_;
  std::vector<SchedulerOutput> spare_outputs_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_CORE_SCHEDULER_H_
