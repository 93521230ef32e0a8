#include "worker/server/grpc/grpc_scheduler_link.h"

namespace tandem::worker {

GrpcSchedulerLink::GrpcSchedulerLink(v1::WorkerControl::Stub* stub, WorkerServer* server,
                                     std::function<void(bool)> on_group)
    : server_(server), on_group_(std::move(on_group)) {
  context_.set_wait_for_ready(true);
  stub->async()->Session(&context_, this);
  StartRead(&in_);
  StartCall();
}

void GrpcSchedulerLink::Send(const v1::WorkerMessage& message) {
  absl::MutexLock lock(&mu_);
  if (done_) return;
  out_.push_back(message);
  if (!writing_) {
    writing_ = true;
    StartWrite(&out_.front());
  }
}

void GrpcSchedulerLink::OnReadDone(bool ok) {
  if (!ok) return;  // the stream is ending; OnDone follows
  if (!heard_ && on_group_) on_group_(true);
  heard_ = true;
  server_->OnMessage(std::move(in_));
  in_.Clear();
  StartRead(&in_);
}

void GrpcSchedulerLink::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  out_.pop_front();
  if (ok && !out_.empty()) {
    StartWrite(&out_.front());
  } else {
    writing_ = false;
  }
}

void GrpcSchedulerLink::OnDone(const grpc::Status& status) {
  if (on_group_) on_group_(false);
  server_->OnDisconnected(status.ok() ? "the scheduler closed the stream" : status.error_message());
  absl::MutexLock lock(&mu_);
  done_ = true;  // wakes Shutdown's Await
}

void GrpcSchedulerLink::Shutdown() {
  context_.TryCancel();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
}

}  // namespace tandem::worker
