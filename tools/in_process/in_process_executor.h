// InProcessExecutor: the scheduler's Executor over a worker ModelRunner in
// the same process. Every step goes through the wire encoding
// (scheduler/wire/step_codec.h), exactly as it would to a remote worker, so the
// in-process engine exercises the real protocol minus the transport.
//
// Thread-compatible: the engine thread.
#ifndef TANDEM_TOOLS_IN_PROCESS_IN_PROCESS_EXECUTOR_H_
#define TANDEM_TOOLS_IN_PROCESS_IN_PROCESS_EXECUTOR_H_

#include "scheduler/core/executor.h"
#include "worker/runner/model_runner.h"

namespace tandem::tools {

class InProcessExecutor : public scheduler::Executor {
 public:
  // Does not take ownership.
  explicit InProcessExecutor(worker::ModelRunner* runner) : runner_(runner) {}

  absl::Status Execute(const scheduler::SchedulerOutput& step) override;
  absl::Status Sample(StepSeq step_seq, const scheduler::GrammarOutput* grammar) override;
  absl::StatusOr<scheduler::ModelRunnerOutput> CollectOutput(StepSeq step_seq) override;

 private:
  worker::ModelRunner* const runner_;
};

}  // namespace tandem::tools

#endif  // TANDEM_TOOLS_IN_PROCESS_IN_PROCESS_EXECUTOR_H_
