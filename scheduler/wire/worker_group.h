// WorkerGroup: the pipeline group of worker processes as one Executor.
//
// Membership (transport threads call OnMessage / OnDisconnect): workers
// register with their rank; when every rank has, the group configures them
// with the pool size (the minimum over ranks of the KV blocks that fit),
// collects their communicator addresses, tells each the others', and is ready
// when every rank says so. Each formation is an epoch; results from an older
// epoch are ignored.
//
// Execution (the engine thread): Execute goes to every rank, Sample to the
// last, and CollectOutput waits for the last rank's result of the oldest step,
// for at most the step timeout. A worker that disconnects, reports an error or
// does not answer in time fails the step with a Status naming the rank; the
// engine then fails the requests in flight and calls Reset, and the group
// re-forms (with the same workers, or once the lost one registers again).
//
// Thread-safe: one mutex guards the membership; links are only called with it
// held, and a link is forgotten (under it) before it is destroyed.
#ifndef TANDEM_SCHEDULER_WIRE_WORKER_GROUP_H_
#define TANDEM_SCHEDULER_WIRE_WORKER_GROUP_H_

#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "scheduler/core/executor.h"
#include "proto/diff/step_diff.h"
#include "scheduler/wire/compact_step.h"
#include "scheduler/wire/worker_link.h"

namespace tandem::scheduler {

struct WorkerGroupOptions {
  int32_t world_size = 1;
  int32_t block_size = 16;
  absl::Duration step_timeout = absl::Seconds(30);
  // Called (from any thread, without locks held) when readiness changes.
  std::function<void()> on_change;
};

struct WorkerStatus {
  int32_t rank = 0;
  bool connected = false;
  std::string peer;
  double busy_seconds = 0;
  double idle_seconds = 0;
  int64_t steps = 0;
  std::string backend;  // as the worker registered: "cpu", "cuda"
  std::string device;   // "cpu", "cuda:0"
};

struct GroupStatus {
  bool ready = false;
  std::string description;  // what the group waits for, in words
  int64_t epoch = 0;
  int32_t pool_blocks = 0;
  int32_t vocab_size = 0;
  std::vector<WorkerStatus> workers;
};

class WorkerGroup : public ExecutorGroup {
 public:
  explicit WorkerGroup(WorkerGroupOptions options);

  // --- transport threads ---
  void OnMessage(WorkerLink* link, const v1::WorkerMessage& message) ABSL_LOCKS_EXCLUDED(mu_);
  // The link is gone; the group forgets it before this returns.
  void OnDisconnect(WorkerLink* link, const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);

  // Before the engine starts: CollectOutput then waits by polling it
  // (WorkerLink's LinkPoller) instead of sleeping until a transport thread
  // delivers the result. It must outlive the engine's calls on the group.
  void set_poller(LinkPoller* poller) { poller_ = poller; }

  // --- any thread ---
  GroupStatus Status() const ABSL_LOCKS_EXCLUDED(mu_);
  bool ready() const override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status failure() const override ABSL_LOCKS_EXCLUDED(mu_);
  int32_t pool_blocks() const override ABSL_LOCKS_EXCLUDED(mu_);

  // --- engine thread ---
  // After a failed step: drops results and the failure, and forms the group
  // again (at once if every rank is still connected).
  void Reset() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Execute(const SchedulerOutput& step) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Sample(StepSeq step_seq, const GrammarOutput* grammar) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<ModelRunnerOutput> CollectOutput(StepSeq step_seq) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class State { kForming, kConfiguring, kConnecting, kReady, kBroken };
  struct Member {
    WorkerLink* link = nullptr;
    v1::RegisterWorker info;
    std::string comm_address;
    std::string nccl_unique_id;
    std::string device_id;
    int64_t configured_epoch = 0;
    int64_t ready_epoch = 0;
    v1::WorkerStats stats;
  };

  void Register(WorkerLink* link, const v1::RegisterWorker& info) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string CheckCompatible(const v1::RegisterWorker& info) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeConfigure() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnConfigured(int32_t rank, const v1::WorkerConfigured& configured) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnReady(int32_t rank, const v1::WorkerReady& ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the last rank's held execute command, if any.
  void FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<int32_t> RankOf(WorkerLink* link) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells on_change; called without the lock.
  void Notify() ABSL_LOCKS_EXCLUDED(mu_);
  std::string DescribeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WorkerGroupOptions options_;
  LinkPoller* poller_ = nullptr;  // set before the engine starts
  mutable absl::Mutex mu_;
  std::vector<std::optional<Member>> members_ ABSL_GUARDED_BY(mu_);  // by rank
  State state_ ABSL_GUARDED_BY(mu_) = State::kForming;
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t pool_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<v1::StepResult> results_ ABSL_GUARDED_BY(mu_);
  // The steps sent this epoch, for the compact form: executes go out as
  // diffs against them and results come back without their rows
  // (proto/diff/step_diff.h). Every rank receives every execute, so one
  // state stands for all of them.
  CompactStepEncoder encoder_ ABSL_GUARDED_BY(mu_);
  // The scheduled request ids of each step sent and not yet collected,
  // oldest first: a compact result's rows (as deep as the engine's queue).
  std::deque<std::pair<StepSeq, std::vector<RequestId>>> in_flight_rows_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<RequestId>> spare_rows_ ABSL_GUARDED_BY(mu_);  // their buffers, for reuse
  // The last rank's execute command of the newest step, held until Sample
  // (sent together as one ExecuteAndSample: a message, a write and a wake
  // fewer per step) or until any other call on the group, whichever first.
  // So the last stage starts a step whose sampling is deferred (§4.7) at the
  // engine's next call on the group, never later than its next wait.
  std::optional<v1::SchedulerMessage> held_execute_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_WIRE_WORKER_GROUP_H_
