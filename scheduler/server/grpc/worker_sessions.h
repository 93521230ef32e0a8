// WorkerSessions: the WorkerControl service on the scheduler, through gRPC's
// asynchronous API on a completion queue of its own. Each worker's Session
// stream is a WorkerLink: reads go to the WorkerGroup, writes are queued and
// sent one at a time.
//
// Who drives the queue (README, Control plane): while the engine runs steps,
// the engine thread itself, from WorkerGroup::CollectOutput (this is the
// group's LinkPoller), so a result is read, decoded and collected with no
// thread hop; gRPC's callback API cost four context switches and ~60 us of
// the scheduler's CPU per step more (tools/bench/grpc_hop_bench.cc). When the
// engine has not polled for kIdleHandoff (no requests; an engine blocked
// elsewhere), a thread of ours takes over, so registrations, disconnects and
// keepalive pings are still answered; the engine takes the queue back with
// an alarm that wakes that thread.
//
// Thread-safe.
#ifndef TANDEM_SCHEDULER_SERVER_GRPC_WORKER_SESSIONS_H_
#define TANDEM_SCHEDULER_SERVER_GRPC_WORKER_SESSIONS_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "scheduler/wire/worker_group.h"
#include "scheduler/wire/worker_link.h"
#include "tandem/v1/worker_service.grpc.pb.h"

namespace tandem::scheduler {

class WorkerSession;

class WorkerSessions final : public LinkPoller {
 public:
  // How long the engine may leave the queue alone before our thread drives it.
  static constexpr absl::Duration kIdleHandoff = absl::Milliseconds(20);

  // Registers the service and its completion queue on `builder`; Start once
  // the server is built. `group` must outlive this.
  WorkerSessions(WorkerGroup* group, grpc::ServerBuilder* builder);
  ~WorkerSessions() override;

  // Accepts sessions from now on.
  void Start();
  // Before the server's Shutdown: from now on our thread drives the queue
  // (the server waits for every call to end, which takes someone polling),
  // and Poll returns false at once.
  void BeginShutdown() ABSL_LOCKS_EXCLUDED(mu_);
  // After the server's Shutdown returned: ends the queue, delivers what is
  // left (every open session's disconnect) and stops our thread.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // LinkPoller, for the engine thread.
  bool Poll(absl::Time deadline) override ABSL_LOCKS_EXCLUDED(mu_);

  // A completion queue event's tag: what completed, and for which session.
  struct Tag;

 private:
  enum class Driver { kNone, kEngine, kIdleThread };
  // Delivers one event, or posts the reads that wait (below); false when
  // the queue is shut down and drained.
  bool Next(std::chrono::system_clock::time_point deadline);
  bool NextEvent(std::chrono::system_clock::time_point deadline);
  // A session's next read is posted by whoever drives the queue next, after
  // one look at the queue without waiting: gRPC 1.51 answers data that
  // arrives for a stream with a read pending by a WINDOW_UPDATE of its own
  // (a write and a wake-up of the worker a step); data that arrived before
  // the read is announced with the next write, the next step. Over TCP only
  // (see WorkerSession).
  void DeferRead(WorkerSession* session) ABSL_LOCKS_EXCLUDED(mu_);
  void Dispatch(void* tag, bool ok);
  // Requests the next worker's session.
  void Accept() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  friend class WorkerSession;
  void Ended() ABSL_LOCKS_EXCLUDED(mu_);  // a session deleted itself
  void IdleLoop() ABSL_LOCKS_EXCLUDED(mu_);

  WorkerGroup* const group_;
  v1::WorkerControl::AsyncService service_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::unique_ptr<grpc::Alarm> alarm_ ABSL_GUARDED_BY(mu_);  // set only while the idle thread drives
  absl::Mutex mu_;
  Driver driver_ ABSL_GUARDED_BY(mu_) = Driver::kNone;
  bool handoff_ ABSL_GUARDED_BY(mu_) = false;  // the alarm is set: the idle thread, give the queue back
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  bool cq_shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool accepting_ ABSL_GUARDED_BY(mu_) = false;  // a request for the next session is out
  int sessions_ ABSL_GUARDED_BY(mu_) = 0;        // accepted, not yet ended
  absl::Time engine_polled_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::vector<WorkerSession*> deferred_reads_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> reads_deferred_{false};  // deferred_reads_ is not empty
  std::thread idle_thread_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_SERVER_GRPC_WORKER_SESSIONS_H_
