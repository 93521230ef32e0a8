#include "scheduler/core/engine_core.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace tandem::scheduler {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

EngineCore::EngineCore(Scheduler* scheduler, Executor* executor)
    : scheduler_(scheduler), executor_(executor), depth_(scheduler->config().EffectiveQueueDepth()) {}

void EngineCore::ApplyAborts(std::vector<RequestOutput>* outputs) {
  if (pending_aborts_.empty()) return;
  scheduler_->AbortRequests(pending_aborts_, outputs);
  pending_aborts_.clear();
}

absl::Status EngineCore::SampleStep(const SchedulerOutput& step) {
  const auto mask_start = std::chrono::steady_clock::now();
  GrammarOutput grammar = scheduler_->GetGrammarBitmask(step);
  if (!grammar.request_ids.empty()) {
    const double seconds = SecondsSince(mask_start);
    const auto rows = static_cast<int32_t>(grammar.request_ids.size());
    for (StepObserver* observer : observers_) observer->OnGrammarMasks(*this, step, rows, seconds);
  }
  return executor_->Sample(step.step_seq, grammar.request_ids.empty() ? nullptr : &grammar);
}

absl::Status EngineCore::Launch(SchedulerOutput step) {
  TANDEM_RETURN_IF_ERROR(executor_->Execute(step));
  const bool defer = step.pending_structured_output_tokens;
  if (!defer) TANDEM_RETURN_IF_ERROR(SampleStep(step));
  in_flight_.push_back(std::move(step));
  if (defer) {
    awaiting_sample_ = in_flight_.back().step_seq;
    if (in_flight_.size() == 1) {  // nothing before it: sample now
      TANDEM_RETURN_IF_ERROR(SampleStep(in_flight_.back()));
      awaiting_sample_.reset();
    }
  }
  return absl::OkStatus();
}

absl::Status EngineCore::CollectOldest(EngineStepResult* result) {
  const SchedulerOutput& step = in_flight_.front();
  TANDEM_ASSIGN_OR_RETURN(ModelRunnerOutput output, executor_->CollectOutput(step.step_seq));
  TANDEM_RETURN_IF_ERROR(ValidateRunnerOutput(step, output));
  // Aborts win over completion: an abort during a request's final step ends it as aborted.
  ApplyAborts(&result->outputs);
  const size_t first = result->outputs.size();
  const auto update_start = std::chrono::steady_clock::now();
  scheduler_->UpdateFromOutput(step, output, &result->outputs);
  scheduler_seconds_ += SecondsSince(update_start);
  result->updated = true;
  SchedulerOutput done = std::move(in_flight_.front());
  in_flight_.pop_front();
  auto outputs = absl::MakeConstSpan(result->outputs).subspan(first);
  for (StepObserver* observer : observers_) observer->OnUpdated(*this, done, output, outputs);
  scheduler_->Recycle(std::move(done));

  if (awaiting_sample_ && !in_flight_.empty() && in_flight_.front().step_seq == *awaiting_sample_) {
    TANDEM_RETURN_IF_ERROR(SampleStep(in_flight_.front()));
    awaiting_sample_.reset();
  }
  return absl::OkStatus();
}

absl::StatusOr<EngineStepResult> EngineCore::Step() {
  TANDEM_CHECK(static_cast<int32_t>(in_flight_.size()) < depth_ || awaiting_sample_)
      << "the batch queue is full at the start of a step";
  EngineStepResult result;
  ApplyAborts(&result.outputs);
  // While a step waits to sample, nothing new is executed: its successor's
  // decode rows need the token it will sample.
  if (!awaiting_sample_ && scheduler_->HasRequests() && static_cast<int32_t>(in_flight_.size()) < depth_) {
    const auto schedule_start = std::chrono::steady_clock::now();
    SchedulerOutput step = scheduler_->Schedule();
    scheduler_seconds_ += SecondsSince(schedule_start);
    const bool executable = !step.empty();
    if (executable) {
      TANDEM_RETURN_IF_ERROR(Launch(std::move(step)));
      result.executed = true;
    }
    const SchedulerOutput& seen = executable ? in_flight_.back() : step;
    for (StepObserver* observer : observers_) observer->OnScheduled(*this, seen);
    // Filling the queue comes before collecting outputs.
    if (executable && !awaiting_sample_ && static_cast<int32_t>(in_flight_.size()) < depth_) {
      return result;
    }
  }
  if (in_flight_.empty()) return result;
  TANDEM_RETURN_IF_ERROR(CollectOldest(&result));
  return result;
}

absl::Status ValidateRunnerOutput(const SchedulerOutput& step, const ModelRunnerOutput& result) {
  if (result.step_seq != step.step_seq) {
    return absl::DataLossError(
        absl::StrCat("model runner answered step ", result.step_seq, " for step ", step.step_seq));
  }
  if (result.request_ids.size() != step.scheduled.size() ||
      result.sampled_offsets.size() != step.scheduled.size() + 1) {
    return absl::DataLossError(absl::StrCat("step ", step.step_seq, ": ", result.request_ids.size(),
                                            " rows for ", step.scheduled.size(), " scheduled requests"));
  }
  for (size_t row = 0; row < step.scheduled.size(); ++row) {
    const ScheduledRequest& expected = step.scheduled[row];
    if (result.request_ids[row] != expected.id) {
      return absl::DataLossError(absl::StrCat("step ", step.step_seq, " row ", row, ": request ",
                                              result.request_ids[row], " where ", expected.id, " was scheduled"));
    }
    const size_t sampled = result.Sampled(row).size();
    if (sampled != (expected.samples ? 1u : 0u)) {
      return absl::DataLossError(absl::StrCat("step ", step.step_seq, " request ", expected.id, ": ", sampled,
                                              " sampled tokens, expected ", expected.samples ? 1 : 0));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::scheduler
