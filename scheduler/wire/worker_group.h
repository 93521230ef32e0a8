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

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "scheduler/core/executor.h"
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
  void OnMessage(WorkerLink* link, const v1::WorkerMessage& message);
  // The link is gone; the group forgets it before this returns.
  void OnDisconnect(WorkerLink* link, const std::string& reason);

  // --- any thread ---
  GroupStatus Status() const;
  bool ready() const override;
  absl::Status failure() const override;
  int32_t pool_blocks() const override;

  // --- engine thread ---
  // After a failed step: drops results and the failure, and forms the group
  // again (at once if every rank is still connected).
  void Reset() override;
  absl::Status Execute(const SchedulerOutput& step) override;
  absl::Status Sample(StepSeq step_seq, const GrammarOutput* grammar) override;
  absl::StatusOr<ModelRunnerOutput> CollectOutput(StepSeq step_seq) override;

 private:
  enum class State { kForming, kConfiguring, kConnecting, kReady, kBroken };
  struct Member {
    WorkerLink* link = nullptr;
    v1::RegisterWorker info;
    std::string comm_address;
    std::string nccl_unique_id;
    int64_t configured_epoch = 0;
    int64_t ready_epoch = 0;
    v1::WorkerStats stats;
  };

  void Register(WorkerLink* link, const v1::RegisterWorker& info);
  std::string CheckCompatible(const v1::RegisterWorker& info) const;
  void MaybeConfigure();
  void OnConfigured(int32_t rank, const v1::WorkerConfigured& configured);
  void OnReady(int32_t rank, const v1::WorkerReady& ready);
  void FailLocked(absl::Status status);
  std::optional<int32_t> RankOf(WorkerLink* link) const;
  void Notify();
  std::string DescribeLocked() const;

  const WorkerGroupOptions options_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::vector<std::optional<Member>> members_;  // by rank; guarded by mu_
  State state_ = State::kForming;               // guarded by mu_
  int64_t epoch_ = 0;                           // guarded by mu_
  int32_t pool_blocks_ = 0;                     // guarded by mu_
  std::deque<v1::ModelRunnerOutput> results_;   // guarded by mu_
  absl::Status failure_;                        // guarded by mu_
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_WIRE_WORKER_GROUP_H_
