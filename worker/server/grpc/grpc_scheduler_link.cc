#include "worker/server/grpc/grpc_scheduler_link.h"

namespace tandem::worker {

GrpcSchedulerLink::GrpcSchedulerLink(v1::WorkerControl::Stub* stub, std::function<void(bool)> on_group)
    : on_group_(std::move(on_group)) {
  context_.set_wait_for_ready(true);
  // The headers go with the first message (the registration): creating the
  // stream does not block until the scheduler is up.
  context_.set_initial_metadata_corked(true);
  stream_ = stub->Session(&context_);
}

void GrpcSchedulerLink::Send(const v1::WorkerMessage& message) {
  absl::MutexLock lock(&write_mu_);
  if (closed_) return;
  // A failed write means the stream is gone: the reader sees it end.
  if (!stream_->Write(message)) closed_ = true;
}

bool GrpcSchedulerLink::Receive(v1::SchedulerMessage* message, std::string* reason) {
  if (stream_->Read(message)) {
    if (!heard_ && on_group_) on_group_(true);
    heard_ = true;
    return true;
  }
  *reason = Finish();
  if (on_group_) on_group_(false);
  return false;
}

std::string GrpcSchedulerLink::Finish() {
  absl::MutexLock lock(&write_mu_);
  if (finished_) return "the stream was shut down";
  closed_ = true;
  finished_ = true;
  const grpc::Status status = stream_->Finish();
  return status.ok() ? "the scheduler closed the stream" : status.error_message();
}

void GrpcSchedulerLink::Shutdown() {
  context_.TryCancel();
  Finish();
}

}  // namespace tandem::worker
