// Executor: what the engine loop drives. The forward pass and the sampling of
// a step are separate calls so that a step's forward can start before its
// sampling is allowed to run (structured output, scheduler/README.md §4.7).
//
// Contract, for every step k in scheduling order:
//   Execute(k) ... Sample(k) ... CollectOutput(k)
// and Sample(k) comes before Execute(k+1): step k+1's decode rows take the
// token sampled in step k from the worker's own memory.
//
// Implementations: FakeExecutor (in-memory, deterministic, for tests and
// `tandem trace`), the in-process model runner, and the WorkerGroup, which
// streams steps to worker processes.
//
// Thread-compatible: called from the engine thread only.
#ifndef TANDEM_SCHEDULER_CORE_EXECUTOR_H_
#define TANDEM_SCHEDULER_CORE_EXECUTOR_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "scheduler/core/scheduler_output.h"

namespace tandem::scheduler {

class Executor {
 public:
  virtual ~Executor() = default;

  // Starts the forward pass of `step` without waiting for it.
  virtual absl::Status Execute(const SchedulerOutput& step) = 0;
  // Lets step `step_seq` sample; `grammar` masks its structured-output rows
  // (null when there are none).
  virtual absl::Status Sample(StepSeq step_seq, const GrammarOutput* grammar) = 0;
  // Blocks until step `step_seq`, the oldest uncollected step, has its output.
  virtual absl::StatusOr<ModelRunnerOutput> CollectOutput(StepSeq step_seq) = 0;
};

// An executor whose workers come and go (wire/worker_group.h): the group may not be
// formed yet, and may break.
class ExecutorGroup : public Executor {
 public:
  virtual bool ready() const = 0;
  // Why the group broke (a worker lost, a step failed or timed out), until
  // Reset; OK otherwise. A group can break between steps, while nothing is
  // waiting on it, so the engine polls this too.
  virtual absl::Status failure() const = 0;
  // KV blocks every worker holds; meaningful when ready.
  virtual int32_t pool_blocks() const = 0;
  // After a failed step: forget what was in flight and form again.
  virtual void Reset() = 0;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_CORE_EXECUTOR_H_
