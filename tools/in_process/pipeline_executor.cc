#include "tools/in_process/pipeline_executor.h"

#include "absl/strings/str_cat.h"
#include "scheduler/wire/step_codec.h"

namespace tandem::tools {

PipelineExecutor::PipelineExecutor(std::vector<worker::ModelRunner*> stages, worker::LoopbackHub* hub,
                                   absl::Duration timeout)
    : timeout_(timeout), hub_(hub) {
  stages_.resize(stages.size());
  for (size_t i = 0; i < stages.size(); ++i) stages_[i].runner = stages[i];
  for (size_t i = 0; i < stages_.size(); ++i) stages_[i].thread = std::thread([this, i] { Run(i); });
}

PipelineExecutor::~PipelineExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  changed_.notify_all();
  if (hub_ != nullptr) hub_->Close();  // wakes a stage blocked on a peer
  for (Stage& stage : stages_) stage.thread.join();
}

void PipelineExecutor::Push(size_t stage, Command command) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stages_[stage].queue.push_back(std::move(command));
  }
  changed_.notify_all();
}

void PipelineExecutor::Fail(const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.ok()) failure_ = status;
  }
  changed_.notify_all();
  if (hub_ != nullptr) hub_->Close();
}

void PipelineExecutor::Run(size_t index) {
  Stage& stage = stages_[index];
  for (;;) {
    Command command;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [&] { return stop_ || !failure_.ok() || !stage.queue.empty(); });
      if (stop_ || !failure_.ok()) return;
      command = std::move(stage.queue.front());
      stage.queue.pop_front();
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
    {
      std::lock_guard<std::mutex> lock(mu_);
      outputs_.push_back(std::move(output).value());
    }
    changed_.notify_all();
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
  std::unique_lock<std::mutex> lock(mu_);
  const bool ready = changed_.wait_for(lock, absl::ToChronoNanoseconds(timeout_),
                                       [&] { return !failure_.ok() || !outputs_.empty(); });
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
