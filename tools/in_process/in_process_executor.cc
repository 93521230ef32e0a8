#include "tools/in_process/in_process_executor.h"

#include "common/status_macros.h"
#include "scheduler/wire/step_codec.h"

namespace tandem::tools {

absl::Status InProcessExecutor::Execute(const scheduler::SchedulerOutput& step) {
  v1::SchedulerOutput message;
  scheduler::EncodeSchedulerOutput(step, &message);
  return runner_->Execute(message);
}

absl::Status InProcessExecutor::Sample(StepSeq step_seq, const scheduler::GrammarOutput* grammar) {
  v1::SampleCommand command;
  scheduler::EncodeSampleCommand(step_seq, grammar, &command);
  return runner_->Sample(command);
}

absl::StatusOr<scheduler::ModelRunnerOutput> InProcessExecutor::CollectOutput(StepSeq step_seq) {
  TANDEM_ASSIGN_OR_RETURN(v1::ModelRunnerOutput message, runner_->CollectOutput(step_seq));
  return scheduler::DecodeRunnerOutput(message);
}

}  // namespace tandem::tools
