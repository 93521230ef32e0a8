// PipelineExecutor: the scheduler's Executor over the stages of a pipeline
// that run as threads of this process, one ModelRunner per stage, connected
// by LoopbackCommunicators. Every stage gets every Execute; the last stage
// gets the Sample commands and answers. Commands reach each stage in the
// order the engine issued them, through the wire encoding, exactly as they
// would reach worker processes; the stages overlap as they would there.
//
// Thread-safe for the engine thread; owns one thread per stage.
#ifndef TANDEM_TOOLS_IN_PROCESS_PIPELINE_EXECUTOR_H_
#define TANDEM_TOOLS_IN_PROCESS_PIPELINE_EXECUTOR_H_

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "scheduler/core/executor.h"
#include "tandem/v1/step.pb.h"
#include "worker/comm/loopback_communicator.h"
#include "worker/runner/model_runner.h"

namespace tandem::tools {

class PipelineExecutor : public scheduler::Executor {
 public:
  // `stages` (not owned) in stage order; `hub` (not owned) connects them.
  PipelineExecutor(std::vector<worker::ModelRunner*> stages, worker::LoopbackHub* hub, absl::Duration timeout);
  ~PipelineExecutor() override;

  absl::Status Execute(const scheduler::SchedulerOutput& step) override;
  absl::Status Sample(StepSeq step_seq, const scheduler::GrammarOutput* grammar) override;
  absl::StatusOr<scheduler::ModelRunnerOutput> CollectOutput(StepSeq step_seq) override;

 private:
  struct Command {
    bool is_sample = false;
    v1::SchedulerOutput execute;
    v1::SampleCommand sample;
  };
  struct Stage {
    worker::ModelRunner* runner;
    std::deque<Command> queue;  // guarded by mu_
    std::thread thread;
  };
  void Push(size_t stage, Command command);
  void Run(size_t index);
  void Fail(const absl::Status& status);

  const absl::Duration timeout_;
  worker::LoopbackHub* const hub_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<Stage> stages_;
  std::deque<v1::ModelRunnerOutput> outputs_;  // guarded by mu_
  absl::Status failure_;                       // guarded by mu_
  bool stop_ = false;                          // guarded by mu_
};

}  // namespace tandem::tools

#endif  // TANDEM_TOOLS_IN_PROCESS_PIPELINE_EXECUTOR_H_
