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

#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
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

  absl::Status Execute(const scheduler::SchedulerOutput& step) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Sample(StepSeq step_seq, const scheduler::GrammarOutput* grammar) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<scheduler::ModelRunnerOutput> CollectOutput(StepSeq step_seq) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Command {
    bool is_sample = false;
    v1::SchedulerOutput execute;
    v1::SampleCommand sample;
  };
  struct Stage {
    worker::ModelRunner* runner;
    std::thread thread;
  };
  void Push(size_t stage, Command command) ABSL_LOCKS_EXCLUDED(mu_);
  // A stage's thread.
  void Run(size_t index) ABSL_LOCKS_EXCLUDED(mu_);
  void Fail(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration timeout_;
  worker::LoopbackHub* const hub_;
  absl::Mutex mu_;
  std::vector<Stage> stages_;  // set up by the constructor
  std::vector<std::deque<Command>> queues_ ABSL_GUARDED_BY(mu_);  // by stage
  std::deque<v1::ModelRunnerOutput> outputs_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem::tools

#endif  // TANDEM_TOOLS_IN_PROCESS_PIPELINE_EXECUTOR_H_
