// StepTraceWriter: writes every executed SchedulerOutput and every
// ModelRunnerOutput to a file as JSON lines, in protobuf's JSON mapping of the
// wire messages (`tandem-scheduler --trace-steps FILE`), for debugging:
//   {"event":"schedule","step":{...v1.SchedulerOutput...}}
//   {"event":"output","step":{...v1.ModelRunnerOutput...}}
//
// Thread-compatible: an observer on the engine thread.
#ifndef TANDEM_SCHEDULER_WIRE_STEP_TRACE_H_
#define TANDEM_SCHEDULER_WIRE_STEP_TRACE_H_

#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "scheduler/core/engine_core.h"

namespace tandem::scheduler {

class StepTraceWriter : public StepObserver {
 public:
  static absl::StatusOr<std::unique_ptr<StepTraceWriter>> Open(const std::string& path);
  ~StepTraceWriter() override;

  void OnScheduled(const EngineCore& engine, const SchedulerOutput& step) override;
  void OnUpdated(const EngineCore& engine, const SchedulerOutput& step, const ModelRunnerOutput& result,
                 absl::Span<const RequestOutput> outputs) override;

 private:
  explicit StepTraceWriter(std::FILE* file) : file_(file) {}
  std::FILE* const file_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_WIRE_STEP_TRACE_H_
