#include "worker/comm/staged_communicator.h"

#include <algorithm>

#include "common/status_macros.h"

namespace tandem::worker {
namespace {

class PageableBuffer : public HostBuffer {
 public:
  explicit PageableBuffer(size_t bytes) : data_(new char[bytes]), size_(bytes) {}
  void* data() override { return data_.get(); }
  size_t size() const override { return size_; }

 private:
  std::unique_ptr<char[]> data_;
  size_t size_;
};

// Staging grows by doubling, from 4 KiB, so a slowly growing batch does not
// reallocate every step.
size_t Grown(size_t have, size_t need) { return std::max({need, size_t{4096}, 2 * have}); }

}  // namespace

absl::StatusOr<std::unique_ptr<HostBuffer>> AllocatePageable(size_t bytes) {
  return std::unique_ptr<HostBuffer>(new PageableBuffer(bytes));
}

StagedCommunicator::StagedCommunicator(std::unique_ptr<Communicator> inner, Backend* backend,
                                       HostAllocator allocate_host)
    : inner_(std::move(inner)), backend_(backend), allocate_host_(std::move(allocate_host)) {}

absl::Status StagedCommunicator::EnsureHost(std::unique_ptr<HostBuffer>& buffer, size_t bytes) {
  if (buffer != nullptr && buffer->size() >= bytes) return absl::OkStatus();
  TANDEM_ASSIGN_OR_RETURN(buffer, allocate_host_(Grown(buffer ? buffer->size() : 0, bytes)));
  return absl::OkStatus();
}

absl::Status StagedCommunicator::Send(int32_t peer, const void* data, size_t bytes) {
  TANDEM_RETURN_IF_ERROR(EnsureHost(send_host_, bytes));
  if (bytes > 0) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Event> copied, backend_->DownloadAsync(data, send_host_->data(), bytes));
    TANDEM_RETURN_IF_ERROR(copied->Wait());
  }
  return inner_->Send(peer, send_host_->data(), bytes);  // copies out: the staging buffer is free again
}

absl::Status StagedCommunicator::Recv(int32_t peer, void* data, size_t bytes, absl::Duration timeout) {
  TANDEM_RETURN_IF_ERROR(EnsureHost(recv_host_, bytes));
  TANDEM_RETURN_IF_ERROR(inner_->Recv(peer, recv_host_->data(), bytes, timeout));
  if (bytes == 0) return absl::OkStatus();
  if (recv_device_ == nullptr || recv_device_->size() < bytes) {
    TANDEM_ASSIGN_OR_RETURN(recv_device_, backend_->Allocate(Grown(recv_device_ ? recv_device_->size() : 0, bytes)));
  }
  // Upload copies out of the host buffer before it returns; the device
  // staging buffer is reused only by later, stream-ordered uploads.
  TANDEM_RETURN_IF_ERROR(backend_->Upload(*recv_device_, 0, recv_host_->data(), bytes));
  return backend_->CopyOnDevice(data, recv_device_->data(), bytes);
}

}  // namespace tandem::worker
