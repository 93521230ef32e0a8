// StagedCommunicator on the CPU backend (whose "device" memory the host can
// read, so the test can look) over loopback: the bytes arrive, they travel
// through the staging buffers rather than the caller's memory, and the
// inner communicator's errors pass through.
#include "worker/comm/staged_communicator.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backends/cpu/cpu_backend.h"
#include "worker/comm/loopback_communicator.h"

namespace tandem::worker {
namespace {

// Records the host pointers the staged communicator hands over.
class RecordingCommunicator : public Communicator {
 public:
  explicit RecordingCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int32_t rank() const override { return inner_->rank(); }
  int32_t world_size() const override { return inner_->world_size(); }
  absl::Status Send(int32_t peer, const void* data, size_t bytes) override {
    sent_from.push_back(data);
    return inner_->Send(peer, data, bytes);
  }
  absl::Status Recv(int32_t peer, void* data, size_t bytes, absl::Duration timeout) override {
    received_into.push_back(data);
    return inner_->Recv(peer, data, bytes, timeout);
  }
  std::vector<const void*> sent_from;
  std::vector<void*> received_into;

 private:
  std::unique_ptr<Communicator> inner_;
};

std::vector<uint8_t> Pattern(size_t bytes, int seed) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(seed * 37 + i * 11);
  return v;
}

class StagedCommunicatorTest : public ::testing::Test {
 protected:
  StagedCommunicatorTest() : hub_(2) {
    for (int32_t r = 0; r < 2; ++r) {
      auto recording = std::make_unique<RecordingCommunicator>(std::make_unique<LoopbackCommunicator>(&hub_, r));
      recording_[r] = recording.get();
      HostAllocator counting = [this](size_t bytes) {
        ++allocations_;
        return AllocatePageable(bytes);
      };
      comms_[r] = std::make_unique<StagedCommunicator>(std::move(recording), &backends_[r], counting);
    }
  }

  // A device buffer of backend `r` holding `bytes`.
  std::unique_ptr<DeviceBuffer> Device(int32_t r, const std::vector<uint8_t>& bytes) {
    auto buffer = backends_[r].Allocate(std::max<size_t>(1, bytes.size()));
    EXPECT_TRUE(buffer.ok());
    if (!bytes.empty()) {
      EXPECT_TRUE(backends_[r].Upload(**buffer, 0, bytes.data(), bytes.size()).ok());
    }
    return std::move(buffer).value();
  }

  LoopbackHub hub_;
  CpuBackend backends_[2] = {CpuBackend(1), CpuBackend(1)};
  RecordingCommunicator* recording_[2];
  std::unique_ptr<StagedCommunicator> comms_[2];
  std::atomic<int> allocations_{0};  // both ranks' threads allocate
};

TEST_F(StagedCommunicatorTest, MessagesArriveInOrderBothWays) {
  const std::vector<size_t> sizes = {1, 100, 4096, 5000, 1 << 20, 17};
  std::thread sender([&] {
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto data = Device(0, Pattern(sizes[i], static_cast<int>(i)));
      ASSERT_TRUE(comms_[0]->Send(1, data->data(), sizes[i]).ok());
    }
  });
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto into = Device(1, std::vector<uint8_t>(sizes[i], 0));
    ASSERT_TRUE(comms_[1]->Recv(0, into->data(), sizes[i], absl::Seconds(5)).ok());
    const uint8_t* got = into->as<uint8_t>();
    EXPECT_EQ(std::vector<uint8_t>(got, got + sizes[i]), Pattern(sizes[i], static_cast<int>(i))) << i;
  }
  sender.join();
  // And back, the sampled ids' direction.
  auto ids = Device(1, Pattern(64, 9));
  ASSERT_TRUE(comms_[1]->Send(0, ids->data(), 64).ok());
  auto into = Device(0, std::vector<uint8_t>(64, 0));
  ASSERT_TRUE(comms_[0]->Recv(1, into->data(), 64, absl::Seconds(5)).ok());
  EXPECT_EQ(std::vector<uint8_t>(into->as<uint8_t>(), into->as<uint8_t>() + 64), Pattern(64, 9));
  // Staging grows by doubling: a handful of allocations, not one a message.
  EXPECT_LE(allocations_.load(), 8);
}

TEST_F(StagedCommunicatorTest, TheInnerCommunicatorSeesOnlyStagingMemory) {
  auto data = Device(0, Pattern(256, 1));
  ASSERT_TRUE(comms_[0]->Send(1, data->data(), 256).ok());
  auto into = Device(1, std::vector<uint8_t>(256, 0));
  ASSERT_TRUE(comms_[1]->Recv(0, into->data(), 256, absl::Seconds(5)).ok());
  ASSERT_EQ(recording_[0]->sent_from.size(), 1u);
  ASSERT_EQ(recording_[1]->received_into.size(), 1u);
  EXPECT_NE(recording_[0]->sent_from[0], data->data());
  EXPECT_NE(recording_[1]->received_into[0], static_cast<void*>(into->data()));
  EXPECT_EQ(std::vector<uint8_t>(into->as<uint8_t>(), into->as<uint8_t>() + 256), Pattern(256, 1));
}

TEST_F(StagedCommunicatorTest, TheInnerErrorsPassThrough) {
  auto into = Device(1, std::vector<uint8_t>(8, 0));
  EXPECT_EQ(comms_[1]->Recv(0, into->data(), 8, absl::Milliseconds(20)).code(), absl::StatusCode::kDeadlineExceeded);
  hub_.Close();
  auto data = Device(0, Pattern(8, 2));
  EXPECT_EQ(comms_[0]->Send(1, data->data(), 8).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem::worker
