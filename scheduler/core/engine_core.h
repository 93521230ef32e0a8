// EngineCore: the engine loop with a batch queue (vLLM's
// EngineCore.step_with_batch_queue; scheduler/README.md §2).
// Each Step() call first tries to fill the queue (schedule, Execute, Sample,
// push) and returns at once while the queue has room; once it is full it
// collects the oldest step's output, applies pending aborts and updates the
// scheduler. Depth 1 is the synchronous loop; depth 2 overlaps planning step
// N+1 with running step N; deeper queues serve pipeline stages.
//
// Structured output: a step whose grammar rows must first see a token still
// in flight is executed at once but sampled only when it is the oldest step
// in flight; no new step is executed before that (the next step's decode
// rows need its sample).
//
// Thread-compatible: the engine thread owns it; other threads post aborts and
// requests through the frontend's queue.
#ifndef TANDEM_SCHEDULER_CORE_ENGINE_CORE_H_
#define TANDEM_SCHEDULER_CORE_ENGINE_CORE_H_

#include <deque>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "scheduler/core/executor.h"
#include "scheduler/core/scheduler.h"

namespace tandem::scheduler {

class EngineCore;

// Called on the engine thread at step boundaries (tests: the invariant
// checker; `tandem trace`: printing). Observers must not mutate the engine.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // After Schedule(); `step` is in flight unless it is empty.
  virtual void OnScheduled(const EngineCore& engine, const SchedulerOutput& step) {}
  // After UpdateFromOutput() of `step`, which has left the queue.
  virtual void OnUpdated(const EngineCore& engine, const SchedulerOutput& step,
                         const ModelRunnerOutput& result, absl::Span<const RequestOutput> outputs) {}
  // After the masks of a step's `rows` structured-output rows were built, in `seconds`.
  virtual void OnGrammarMasks(const EngineCore& engine, const SchedulerOutput& step, int32_t rows,
                              double seconds) {}
};

struct EngineStepResult {
  std::vector<RequestOutput> outputs;
  bool executed = false;  // a step was launched in this call
  bool updated = false;   // a step's output was processed in this call
};

class EngineCore {
 public:
  // Does not take ownership; both must outlive the engine.
  EngineCore(Scheduler* scheduler, Executor* executor);

  void AddObserver(StepObserver* observer) { observers_.push_back(observer); }
  absl::Status AddRequest(RequestSpec spec) { return scheduler_->AddRequest(std::move(spec)); }
  // Queues an abort, applied before the next schedule or update.
  void Abort(RequestId id) { pending_aborts_.push_back(id); }

  // One iteration of the loop. An executor failure or an invalid model runner
  // output is returned as an error; the engine must then be torn down.
  absl::StatusOr<EngineStepResult> Step();

  // After the executor failed: forgets every step in flight (the scheduler
  // has failed their requests) so the loop can start over with a new group.
  void DropInFlight() {
    in_flight_.clear();
    awaiting_sample_.reset();
  }

  bool HasWork() const { return scheduler_->HasRequests() || !in_flight_.empty() || !pending_aborts_.empty(); }
  const Scheduler& scheduler() const { return *scheduler_; }
  // Executed steps not yet updated, oldest first.
  const std::deque<SchedulerOutput>& in_flight() const { return in_flight_; }
  int32_t queue_depth() const { return depth_; }
  // Time spent in Schedule() and UpdateFromOutput() so far: the scheduler's
  // own cost, without the executor's.
  double scheduler_seconds() const { return scheduler_seconds_; }

 private:
  absl::Status Launch(SchedulerOutput step);
  absl::Status SampleStep(const SchedulerOutput& step);
  absl::Status CollectOldest(EngineStepResult* result);
  void ApplyAborts(std::vector<RequestOutput>* outputs);

  Scheduler* const scheduler_;
  Executor* const executor_;
  const int32_t depth_;
  std::deque<SchedulerOutput> in_flight_;
  // The in-flight step whose sampling waits for the steps before it.
  std::optional<StepSeq> awaiting_sample_;
  std::vector<RequestId> pending_aborts_;
  std::vector<StepObserver*> observers_;
  double scheduler_seconds_ = 0;
};

// Checks that `result` answers `step`: same step, one row per scheduled
// request in order, one token exactly on the rows that sample.
absl::Status ValidateRunnerOutput(const SchedulerOutput& step, const ModelRunnerOutput& result);

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_CORE_ENGINE_CORE_H_
