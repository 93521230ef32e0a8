#include "worker/server/grpc/grpc_scheduler_link.h"

#include <chrono>

#include <grpcpp/channel.h>
#include <grpcpp/completion_queue.h>

namespace tandem::worker {

GrpcSchedulerLink::GrpcSchedulerLink(std::shared_ptr<grpc::Channel> channel, v1::WorkerControl::Stub* stub,
                                     std::function<void(bool)> on_group)
    : on_group_(std::move(on_group)) {
  context_.set_wait_for_ready(true);
  // The headers go with the first message (the registration): creating the
  // stream does not block until the scheduler is up.
  context_.set_initial_metadata_corked(true);
  stream_ = stub->Session(&context_);
  keeper_ = std::thread([this, channel = std::move(channel)]() mutable { KeepPolled(std::move(channel)); });
}

GrpcSchedulerLink::~GrpcSchedulerLink() { StopKeeper(); }

void GrpcSchedulerLink::Send(const v1::WorkerMessage& message) {
  absl::MutexLock lock(&write_mu_);
  if (closed_) return;
  // A failed write means the stream is gone: the reader sees it end.
  if (!stream_->Write(message)) closed_ = true;
}

namespace {
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

bool GrpcSchedulerLink::Receive(v1::SchedulerMessage* message, std::string* reason) {
  reading_.store(true, std::memory_order_relaxed);
  const bool read = stream_->Read(message);
  left_ns_.store(NowNs(), std::memory_order_relaxed);
  reading_.store(false, std::memory_order_relaxed);
  if (read) {
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
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    // A scheduler with --worker-port or --worker-socket serves no workers on
    // its --port.
    return "that port serves no workers: dial the scheduler's --worker-port or --worker-socket";
  }
  return status.ok() ? "the scheduler closed the stream" : status.error_message();
}

void GrpcSchedulerLink::Shutdown() {
  StopKeeper();
  context_.TryCancel();
  Finish();
}

void GrpcSchedulerLink::StopKeeper() {
  {
    absl::MutexLock lock(&keeper_mu_);
    stop_keeper_ = true;
  }
  if (keeper_.joinable()) keeper_.join();
}

bool GrpcSchedulerLink::AwaitReaderAway() {
  for (;;) {
    if (!reading_.load(std::memory_order_relaxed) &&
        NowNs() - left_ns_.load(std::memory_order_relaxed) >= absl::ToInt64Nanoseconds(kAway)) {
      absl::MutexLock lock(&keeper_mu_);
      return !stop_keeper_;
    }
    absl::MutexLock lock(&keeper_mu_);
    keeper_mu_.AwaitWithTimeout(absl::Condition(&stop_keeper_), kTick);
    if (stop_keeper_) return false;
  }
}

void GrpcSchedulerLink::KeepPolled(std::shared_ptr<grpc::Channel> channel) {
  grpc::CompletionQueue queue;
  // A connectivity watch pending on the queue ties its poll set to the
  // channel's sockets (gRPC's poll engine; under epoll1 any poll polls them
  // all). Short deadlines, so that stopping never waits long for it.
  constexpr auto kWatch = std::chrono::milliseconds(200);
  constexpr auto kSlice = std::chrono::milliseconds(100);
  int watch_tag = 0;
  bool watching = false;
  while (AwaitReaderAway()) {
    if (!watching) {
      channel->NotifyOnStateChange(channel->GetState(false), std::chrono::system_clock::now() + kWatch, &queue,
                                   &watch_tag);
      watching = true;
    }
    void* tag = nullptr;
    bool ok = false;
    if (queue.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + kSlice) ==
        grpc::CompletionQueue::GOT_EVENT) {
      watching = false;
    }
  }
  queue.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (queue.Next(&tag, &ok)) {
  }
}

}  // namespace tandem::worker
