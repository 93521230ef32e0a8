#include "tools/in_process/pipeline_executor.h"

#include "absl/strings/str_cat.h"
#include "scheduler/wire/step_codec.h"

namespace tandem::tools {

PipelineExecutor::PipelineExecutor(std::vector<worker::ModelRunner*> stages, worker::LoopbackHub* hub,
                                   absl::Duration timeout)
    : timeout_(timeout), hub_(hub), queues_(stages.size()) {
  stages_.resize(stages.size());
  for (size_t i = 0; i < stages.size(); ++i) stages_[i].runner = stages[i];
  for (size_t i = 0; i < stages_.size(); ++i) stages_[i].thread = std::thread([this, i] { Run(i); });
}

PipelineExecutor::~PipelineExecutor() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (hub_ != nullptr) hub_->Close();  // wakes a stage blocked on a peer
  for (Stage& stage : stages_) stage.thread.join();
}

// The waits are Awaits on conditions over the guarded state: every release of
// mu_ re-evaluates them, so writers do not signal.
void PipelineExecutor::Push(size_t stage, Command command) {
  absl::MutexLock lock(&mu_);
  queues_[stage].push_back(std::move(command));
}

void PipelineExecutor::Fail(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (failure_.ok()) failure_ = status;
  }
  if (hub_ != nullptr) hub_->Close();
}

void PipelineExecutor::Run(size_t index) {
  Stage& stage = stages_[index];
  auto woken = [this, index]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || !failure_.ok() || !queues_[index].empty();
  };
  for (;;) {
    Command command;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&woken));
      if (stop_ || !failure_.ok()) return;
      command = std::move(queues_[index].front());
      queues_[index].pop_front();
    }
    if (!command.is_sample) {
      if (absl::Status s = stage.runner->Execute(command.execute); !s.ok()) {
        return Fail(absl::Status(s.code(), absl::StrCat("stage ", index, ": ", s.message())));
      }
      continue;
    }
    absl::Status s = stage.runner->Sample(command.sample);
    absl::StatusOr<v1::ModelRunnerOutput> output =
        s.ok() ? stage.runner->CollectOutput(command.sample.step_seq()) : absl::StatusOr<v1::ModelRunnerOutput>(s);
    if (!output.ok()) {
      return Fail(absl::Status(output.status().code(), absl::StrCat("stage ", index, ": ", output.status().message())));
    }
    absl::MutexLock lock(&mu_);
    outputs_.push_back(std::move(output).value());
  }
}

absl::Status PipelineExecutor::Execute(const scheduler::SchedulerOutput& step) {
  Command command;
  scheduler::EncodeSchedulerOutput(step, &command.execute);
  for (size_t i = 0; i + 1 < stages_.size(); ++i) Push(i, command);
  Push(stages_.size() - 1, std::move(command));
  return absl::OkStatus();
}

absl::Status PipelineExecutor::Sample(StepSeq step_seq, const scheduler::GrammarOutput* grammar) {
  Command command;
  command.is_sample = true;
  scheduler::EncodeSampleCommand(step_seq, grammar, &command.sample);
  Push(stages_.size() - 1, std::move(command));
  return absl::OkStatus();
}

absl::StatusOr<scheduler::ModelRunnerOutput> PipelineExecutor::CollectOutput(StepSeq step_seq) {
  absl::MutexLock lock(&mu_);
  auto ready_or_failed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !failure_.ok() || !outputs_.empty(); };
  const bool ready = mu_.AwaitWithTimeout(absl::Condition(&ready_or_failed), timeout_);
  if (!failure_.ok()) return failure_;
  if (!ready) {
    return absl::DeadlineExceededError(
        absl::StrCat("step ", step_seq, " had no output within ", absl::FormatDuration(timeout_)));
  }
  v1::ModelRunnerOutput output = std::move(outputs_.front());
  outputs_.pop_front();
  return scheduler::DecodeRunnerOutput(output);
}

}  // namespace tandem::tools
