// GrpcSchedulerLink: the worker's end of its control stream to the
// scheduler, on gRPC's synchronous API. The compute thread reads each message
// itself (Receive: a synchronous Read polls on the calling thread), so a step
// reaches the thread that runs it without a hop through a gRPC callback
// thread and a wake; Send writes on the sending thread (the compute thread or
// the output thread, one at a time). The call waits for the scheduler to come
// up (wait_for_ready), so workers may start first.
//
// Nobody reads while the compute thread runs a step, and a step may outlast
// the keepalive pings both ends send (common/rpc/grpc_options.h: answered
// within 2 s, or the connection is dropped). So a keeper thread polls the
// channel's sockets (answering pings, taking in data) whenever the reader has
// been away from the stream for kAway; short steps never wake it, so it takes
// no reads from the compute thread.
//
// Thread-safe: Send from any thread; Receive from one thread at a time;
// Shutdown once, after the reader has stopped.
#ifndef TANDEM_WORKER_SERVER_GRPC_GRPC_SCHEDULER_LINK_H_
#define TANDEM_WORKER_SERVER_GRPC_GRPC_SCHEDULER_LINK_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tandem/v1/worker_service.grpc.pb.h"
#include "worker/server/worker_server.h"

namespace tandem::worker {

class GrpcSchedulerLink : public SchedulerLink {
 public:
  // Polling starts this long after the reader left the stream: far below
  // the 2 s ping timeout, far above a step the control plane should run.
  static constexpr absl::Duration kAway = absl::Milliseconds(250);
  static constexpr absl::Duration kTick = absl::Milliseconds(100);

  // `stub` is on `channel`. `on_group` (optional, called on the reading
  // thread) hears true at the scheduler's first message on the stream (the
  // group is formed) and false when the stream ends: the health service's
  // state.
  GrpcSchedulerLink(std::shared_ptr<grpc::Channel> channel, v1::WorkerControl::Stub* stub,
                    std::function<void(bool in_group)> on_group = nullptr);
  ~GrpcSchedulerLink() override;

  void Send(const v1::WorkerMessage& message) override ABSL_LOCKS_EXCLUDED(write_mu_);
  bool pulls() const override { return true; }
  bool Receive(v1::SchedulerMessage* message, std::string* reason) override ABSL_LOCKS_EXCLUDED(write_mu_);
  // Ends the call (if Receive has not seen it end) and waits for its status.
  void Shutdown() ABSL_LOCKS_EXCLUDED(write_mu_, keeper_mu_);

 private:
  // Stops writes, then takes the call's status: no write is in flight while
  // Finish runs. The reason in words.
  std::string Finish() ABSL_LOCKS_EXCLUDED(write_mu_);
  // The keeper thread's loop, and its wait for the reader to stay away.
  void KeepPolled(std::shared_ptr<grpc::Channel> channel) ABSL_LOCKS_EXCLUDED(keeper_mu_);
  // Waits until the reader has been away from the stream kAway (true) or
  // the link stops (false).
  bool AwaitReaderAway() ABSL_LOCKS_EXCLUDED(keeper_mu_);
  void StopKeeper() ABSL_LOCKS_EXCLUDED(keeper_mu_);

  const std::function<void(bool)> on_group_;
  bool heard_ = false;  // Receive only
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::SchedulerMessage>> stream_;
  absl::Mutex write_mu_;
  bool closed_ ABSL_GUARDED_BY(write_mu_) = false;  // no more writes: finished, or a write failed
  bool finished_ ABSL_GUARDED_BY(write_mu_) = false;

  // Where the reader is, for the keeper, which looks every kTick: atomics,
  // so that a step's read wakes nobody.
  std::atomic<bool> reading_{false};
  std::atomic<int64_t> left_ns_{0};  // steady clock, when the reader last left the stream
  absl::Mutex keeper_mu_;
  bool stop_keeper_ ABSL_GUARDED_BY(keeper_mu_) = false;
  std::thread keeper_;
};

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_SERVER_GRPC_GRPC_SCHEDULER_LINK_H_
