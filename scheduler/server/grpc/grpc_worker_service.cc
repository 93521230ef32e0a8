#include "scheduler/server/grpc/grpc_worker_service.h"

#include <deque>
#include <utility>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem::scheduler {
namespace {

class SessionReactor : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::SchedulerMessage>, public WorkerLink {
 public:
  SessionReactor(WorkerGroup* group, grpc::CallbackServerContext* context)
      : group_(group), peer_(context->peer()) {
    StartRead(&in_);
  }

  // --- WorkerLink (any thread; the group calls these under its lock) ---
  void Send(const v1::SchedulerMessage& message) override ABSL_LOCKS_EXCLUDED(mu_) { SendOwned(message); }

  void SendOwned(v1::SchedulerMessage message) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    out_.push_back(std::move(message));
    if (!writing_) {
      writing_ = true;
      StartWrite(&out_.front());
    }
  }

  void Close(const std::string& reason) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, reason));
  }

  std::string peer() const override { return peer_; }

  // --- reactions ---
  void OnReadDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    if (!ok) {  // the worker closed its side, or the connection is gone
      absl::MutexLock lock(&mu_);
      FinishLocked(grpc::Status::OK);
      return;
    }
    group_->OnMessage(this, in_);
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    out_.pop_front();
    if (!ok) {
      writing_ = false;
      FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed"));
      return;
    }
    if (!out_.empty() && !finished_) {
      StartWrite(&out_.front());
    } else {
      writing_ = false;
    }
  }

  void OnCancel() override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    reason_ = "cancelled (connection lost or keepalive expired)";
  }

  void OnDone() override ABSL_LOCKS_EXCLUDED(mu_) {
    std::string reason;
    {
      absl::MutexLock lock(&mu_);
      reason = reason_;
    }
    // Forget this link before it disappears: the group never calls it again.
    // Not under mu_: the group calls Send and Close under its own lock.
    group_->OnDisconnect(this, reason);
    delete this;
  }

 private:
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    if (reason_.empty()) reason_ = status.ok() ? "stream closed" : status.error_message();
    Finish(status);
  }

  WorkerGroup* const group_;
  const std::string peer_;
  v1::WorkerMessage in_;
  absl::Mutex mu_;
  std::deque<v1::SchedulerMessage> out_ ABSL_GUARDED_BY(mu_);  // front is being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::string reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerBidiReactor<v1::WorkerMessage, v1::SchedulerMessage>* GrpcWorkerService::Session(
    grpc::CallbackServerContext* context) {
  return new SessionReactor(group_, context);
}

}  // namespace tandem::scheduler
