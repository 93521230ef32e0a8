#include "scheduler/server/grpc/worker_sessions.h"

#include <deque>
#include <string>
#include <utility>

#include "absl/strings/match.h"

namespace tandem::scheduler {

struct WorkerSessions::Tag {
  enum class Op { kAccept, kRead, kWrite, kFinish, kDone, kAlarm };
  class WorkerSession* session;  // null for the alarm
  Op op;
};

namespace {

using Op = WorkerSessions::Tag::Op;

WorkerSessions::Tag alarm_tag{nullptr, Op::kAlarm};

std::chrono::system_clock::time_point ToChrono(absl::Time t) {
  return t == absl::InfiniteFuture() ? std::chrono::system_clock::time_point::max() : absl::ToChronoTime(t);
}

}  // namespace

// One worker's stream. Its completions arrive on whichever thread drives the
// queue, and Send/Close come from any thread: the state is under mu_, and
// the group is only called without it (the group calls Send and Close under
// its own lock). It deletes itself once every operation it started has
// completed, after telling the group it is gone.
class WorkerSession final : public WorkerLink {
 public:
  WorkerSession(WorkerSessions* owner, WorkerGroup* group, v1::WorkerControl::AsyncService* service,
                grpc::ServerCompletionQueue* cq)
      : owner_(owner), group_(group), stream_(&context_) {
    context_.AsyncNotifyWhenDone(&done_tag_);
    service->RequestSession(&context_, &stream_, cq, cq, &accept_tag_);
  }

  // --- WorkerLink (any thread; the group calls these under its lock) ---
  void Send(const v1::SchedulerMessage& message) override ABSL_LOCKS_EXCLUDED(mu_) { SendOwned(message); }

  void SendOwned(v1::SchedulerMessage message) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (finish_requested_) return;
    out_.push_back(std::move(message));
    if (!writing_) {
      writing_ = true;
      stream_.Write(out_.front(), &write_tag_);
    }
  }

  void Close(const std::string& reason) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, reason));
  }

  std::string peer() const override { return peer_; }

  // A completion of this session's. False when the accept failed (the
  // server is shutting down): nothing started, the caller deletes it.
  bool Proceed(Op op, bool ok) ABSL_LOCKS_EXCLUDED(mu_) {
    switch (op) {
      case Op::kAccept: {
        if (!ok) return false;
        peer_ = context_.peer();
        // Over TCP the deferred read saves a write and a wake-up a step;
        // over a Unix socket those are cheap and the extra look at the queue
        // (a poll and a read that finds nothing) is not: measured slower.
        defer_reads_ = !absl::StartsWith(peer_, "unix:");
        absl::MutexLock lock(&mu_);
        accepted_ = true;
        reading_ = true;
        stream_.Read(&in_, &read_tag_);
        return true;
      }
      case Op::kRead: {
        // Not under mu_: in_ is only touched by the one read in flight.
        if (ok) group_->OnMessage(this, in_);
        bool defer = false;
        {
          absl::MutexLock lock(&mu_);
          if (ok && !finish_requested_) {
            // Deferred, reading_ stays set: the session lives until it is posted.
            defer = defer_reads_;
            if (!defer) stream_.Read(&in_, &read_tag_);
          } else {
            reading_ = false;
            // The worker closed its side, or the connection is gone.
            FinishLocked(grpc::Status::OK);
          }
        }
        if (defer) {
          owner_->DeferRead(this);
          return true;
        }
        break;
      }
      case Op::kWrite: {
        absl::MutexLock lock(&mu_);
        out_.pop_front();
        writing_ = false;
        if (!ok) {
          FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed"));
        } else if (!out_.empty() && !finish_requested_) {
          writing_ = true;
          stream_.Write(out_.front(), &write_tag_);
        }
        if (!writing_ && finish_requested_ && !finish_started_) StartFinishLocked();
        break;
      }
      case Op::kFinish: {
        absl::MutexLock lock(&mu_);
        finish_done_ = true;
        break;
      }
      case Op::kDone: {
        absl::MutexLock lock(&mu_);
        done_ = true;
        if (context_.IsCancelled()) reason_ = "cancelled (connection lost or keepalive expired)";
        break;
      }
      case Op::kAlarm:
        break;
    }
    MaybeEnd();
    return true;
  }

  // The read DeferRead held back.
  void PostRead() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (!finish_requested_) {
        stream_.Read(&in_, &read_tag_);
        return;
      }
      reading_ = false;
    }
    MaybeEnd();
  }

  WorkerSessions::Tag accept_tag_{this, Op::kAccept};

 private:
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finish_requested_) return;
    finish_requested_ = true;
    if (reason_.empty()) reason_ = status.ok() ? "stream closed" : status.error_message();
    finish_status_ = status;
    // One write-like operation at a time: after the write in flight.
    if (!writing_) StartFinishLocked();
  }

  void StartFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finish_started_ = true;
    out_.clear();
    stream_.Finish(finish_status_, &finish_tag_);
  }

  // Deletes this once nothing it started is pending.
  void MaybeEnd() ABSL_LOCKS_EXCLUDED(mu_) {
    std::string reason;
    {
      absl::MutexLock lock(&mu_);
      if (!accepted_ || !done_ || reading_ || writing_ || !finish_done_ || ended_) return;
      ended_ = true;
      reason = reason_;
    }
    // Forget this link before it disappears: the group never calls it again.
    group_->OnDisconnect(this, reason);
    WorkerSessions* owner = owner_;
    delete this;
    owner->Ended();
  }

  WorkerSessions* const owner_;
  WorkerGroup* const group_;
  grpc::ServerContext context_;
  grpc::ServerAsyncReaderWriter<v1::SchedulerMessage, v1::WorkerMessage> stream_;
  std::string peer_;  // set before the first read, constant after
  bool defer_reads_ = false;  // likewise: post each next read late (WorkerSessions::DeferRead)
  v1::WorkerMessage in_;
  WorkerSessions::Tag read_tag_{this, Op::kRead};
  WorkerSessions::Tag write_tag_{this, Op::kWrite};
  WorkerSessions::Tag finish_tag_{this, Op::kFinish};
  WorkerSessions::Tag done_tag_{this, Op::kDone};
  absl::Mutex mu_;
  std::deque<v1::SchedulerMessage> out_ ABSL_GUARDED_BY(mu_);  // front is being written
  bool accepted_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_done_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
  std::string reason_ ABSL_GUARDED_BY(mu_);
};

WorkerSessions::WorkerSessions(WorkerGroup* group, grpc::ServerBuilder* builder)
    : group_(group), cq_(builder->AddCompletionQueue()) {
  builder->RegisterService(&service_);
}

WorkerSessions::~WorkerSessions() { Shutdown(); }

void WorkerSessions::Start() {
  {
    absl::MutexLock lock(&mu_);
    Accept();
  }
  idle_thread_ = std::thread([this] { IdleLoop(); });
}

void WorkerSessions::Accept() {
  accepting_ = true;
  new WorkerSession(this, group_, &service_, cq_.get());
}

void WorkerSessions::Ended() {
  absl::MutexLock lock(&mu_);
  --sessions_;
}

void WorkerSessions::BeginShutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

void WorkerSessions::Shutdown() {
  BeginShutdown();
  {
    absl::MutexLock lock(&mu_);
    if (cq_shut_down_) return;
    cq_shut_down_ = true;
    // Every call over first (the server's shutdown fails the request for
    // the next worker and cancels the sessions; the idle thread delivers
    // that): gRPC asserts if a call it matched is taken from the queue after
    // the queue's shutdown.
    if (idle_thread_.joinable()) {
      mu_.Await(absl::Condition(
          +[](WorkerSessions* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return !s->accepting_ && s->sessions_ == 0; },
          this));
    }
  }
  cq_->Shutdown();
  if (idle_thread_.joinable()) idle_thread_.join();
}

void WorkerSessions::DeferRead(WorkerSession* session) {
  absl::MutexLock lock(&mu_);
  deferred_reads_.push_back(session);
  reads_deferred_.store(true, std::memory_order_relaxed);
}

bool WorkerSessions::Next(std::chrono::system_clock::time_point deadline) {
  if (!reads_deferred_.load(std::memory_order_relaxed)) return NextEvent(deadline);
  // What has arrived is read into the transport with no read pending for it.
  if (!NextEvent(std::chrono::system_clock::now())) return false;
  std::vector<WorkerSession*> sessions;
  {
    absl::MutexLock lock(&mu_);
    sessions.swap(deferred_reads_);
    reads_deferred_.store(false, std::memory_order_relaxed);
  }
  for (WorkerSession* session : sessions) session->PostRead();
  return true;
}

bool WorkerSessions::NextEvent(std::chrono::system_clock::time_point deadline) {
  void* tag = nullptr;
  bool ok = false;
  switch (cq_->AsyncNext(&tag, &ok, deadline)) {
    case grpc::CompletionQueue::SHUTDOWN:
      return false;
    case grpc::CompletionQueue::TIMEOUT:
      return true;
    case grpc::CompletionQueue::GOT_EVENT:
      break;
  }
  Dispatch(tag, ok);
  return true;
}

void WorkerSessions::Dispatch(void* raw, bool ok) {
  Tag* tag = static_cast<Tag*>(raw);
  if (tag->op == Op::kAlarm) {
    absl::MutexLock lock(&mu_);
    handoff_ = false;
    if (driver_ == Driver::kIdleThread) driver_ = Driver::kNone;
    engine_polled_ = absl::Now();  // the engine polls next: not ours again before it went idle
    return;
  }
  WorkerSession* session = tag->session;
  if (tag->op == Op::kAccept) {
    absl::MutexLock lock(&mu_);
    accepting_ = false;
    if (ok) ++sessions_;
    // A request for the next worker; none once shutting down.
    if (!shutdown_) Accept();
  }
  if (!session->Proceed(tag->op, ok)) delete session;  // an accept the shutdown ended
}

bool WorkerSessions::Poll(absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return false;
    if (driver_ == Driver::kIdleThread) {
      if (!handoff_) {
        handoff_ = true;
        // A fresh alarm each time: gRPC's is not meant to be set twice.
        alarm_ = std::make_unique<grpc::Alarm>();
        alarm_->Set(cq_.get(), std::chrono::system_clock::now(), &alarm_tag);
      }
      mu_.Await(absl::Condition(
          +[](WorkerSessions* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
            return s->driver_ != Driver::kIdleThread || s->shutdown_;
          },
          this));
      // The idle thread may have delivered what the caller waits for.
      return !shutdown_;
    }
    driver_ = Driver::kEngine;
  }
  const bool open = Next(ToChrono(deadline));
  absl::MutexLock lock(&mu_);
  driver_ = Driver::kNone;
  engine_polled_ = absl::Now();
  return open && !shutdown_;
}

void WorkerSessions::IdleLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      // Ours once the engine has left the queue alone for kIdleHandoff;
      // shared with it (and drained) once shutting down.
      while (!shutdown_ && !(driver_ == Driver::kNone && absl::Now() - engine_polled_ >= kIdleHandoff)) {
        mu_.AwaitWithTimeout(absl::Condition(&shutdown_), kIdleHandoff);
      }
      if (!shutdown_) driver_ = Driver::kIdleThread;
    }
    for (;;) {
      if (!Next(std::chrono::system_clock::now() + std::chrono::seconds(1))) return;  // shut down and drained
      absl::MutexLock lock(&mu_);
      if (!shutdown_ && driver_ != Driver::kIdleThread) break;  // the engine took it back
    }
  }
}

}  // namespace tandem::scheduler
