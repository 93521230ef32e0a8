// InvariantChecker: asserts the contract of scheduler/README.md §4 at every
// step boundary. Tests attach it to every engine they run; it crashes with a
// description of the first violation, or (kRecord, for tools that report a
// reproducer and go on) records the first one and checks nothing after it.
//
// What it checks, after every schedule and every update:
//  * counters: 0 <= ph, 0 <= ST <= IF, ph == 0 without async scheduling;
//    a running decode has C == N + ph - 1, a prefill chunk C < N + ph;
//    committed outputs + ph <= max_tokens (nothing scheduled past the end);
//    N + ph <= max_model_len;
//  * in-flight bookkeeping against the engine's queue: IF is the sum of the
//    request's rows in flight, ph the number of its sampling rows in flight
//    (0 while stale output drains, when ST == IF);
//  * queues: running iff RUNNING, queued iff WAITING/PREEMPTED, each once;
//    a running request owns exactly ceil(C / B) blocks, a waiting one none;
//  * block accounting: every block's ref count equals the block tables and
//    deferred frees holding it, free iff ref 0, free + referenced = total;
//    cached blocks carry their request's chain hash and lie within C;
//  * fences: processed <= scheduled, deferred fences ascending and pending;
//    a block newly handed out was not written by a step still in flight.
//
// Thread-compatible: engine thread only.
#ifndef TANDEM_SCHEDULER_TESTING_INVARIANT_CHECKER_H_
#define TANDEM_SCHEDULER_TESTING_INVARIANT_CHECKER_H_

#include <deque>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "scheduler/core/engine_core.h"
#include "scheduler/core/scheduler.h"

namespace tandem::scheduler {

class InvariantChecker : public StepObserver {
 public:
  enum class OnViolation { kCrash, kRecord };

  explicit InvariantChecker(OnViolation on_violation = OnViolation::kCrash) : on_violation_(on_violation) {}

  void OnScheduled(const EngineCore& engine, const SchedulerOutput& step) override;
  void OnUpdated(const EngineCore& engine, const SchedulerOutput& step, const ModelRunnerOutput& result,
                 absl::Span<const RequestOutput> outputs) override;

  // The stateless checks; OK or the first violation.
  static absl::Status Check(const Scheduler& scheduler, const std::deque<SchedulerOutput>& in_flight);

  int64_t num_checks() const { return num_checks_; }
  // OK, or the first violation (kRecord only).
  const absl::Status& violation() const { return violation_; }

 private:
  // Fence check: fresh blocks of `step` must not have been written by a step
  // that is still in flight; then records `step` as their writer.
  absl::Status CheckFreshBlocks(const Scheduler& scheduler, const SchedulerOutput& step);

  void Report(absl::Status status);

  const OnViolation on_violation_;
  std::vector<StepSeq> last_writer_;  // per block: newest step that wrote it
  int64_t num_checks_ = 0;
  absl::Status violation_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_TESTING_INVARIANT_CHECKER_H_
