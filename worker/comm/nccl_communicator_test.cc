// GPU tests for NcclCommunicator (ctest label "gpu"). Each test skips when
// the machine has fewer CUDA devices than it needs; NCCL puts at most one rank
// of a communicator on a device, so the exchange tests need two.
#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime.h>

#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tandem::worker {
namespace {

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

#define REQUIRE_DEVICES(n)                                                       \
  if (DeviceCount() < (n)) {                                                     \
    GTEST_SKIP() << "needs " << (n) << " CUDA devices, found " << DeviceCount(); \
  }

NcclCommunicator::Options ShortOptions() {
  NcclCommunicator::Options o;
  o.init_timeout = absl::Seconds(30);
  o.close_timeout = absl::Seconds(2);
  return o;
}

TEST(NcclCommunicatorTest, SingleRankAndBadArguments) {
  REQUIRE_DEVICES(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto id = NcclCommunicator::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->size(), 128u);
  EXPECT_TRUE(absl::IsInvalidArgument(NcclCommunicator::Create(0, 1, "short", nullptr).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(NcclCommunicator::Create(1, 1, *id, nullptr).status()));
  auto comm = NcclCommunicator::Create(0, 1, *id, nullptr, ShortOptions());
  ASSERT_TRUE(comm.ok()) << comm.status();
  char* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 16), cudaSuccess);
  EXPECT_TRUE(absl::IsInvalidArgument((*comm)->Send(0, buf, 16)));
  EXPECT_TRUE(absl::IsInvalidArgument((*comm)->Recv(1, buf, 16, absl::Seconds(1))));
  cudaFree(buf);
}

// Rank 0 of two, alone: Create must give up at its deadline, not hang.
TEST(NcclCommunicatorTest, InitTimesOutWhenAPeerNeverJoins) {
  REQUIRE_DEVICES(1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto id = NcclCommunicator::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  NcclCommunicator::Options options = ShortOptions();
  options.init_timeout = absl::Seconds(2);
  absl::Time start = absl::Now();
  auto comm = NcclCommunicator::Create(0, 2, *id, nullptr, options);
  EXPECT_TRUE(absl::IsDeadlineExceeded(comm.status())) << comm.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

// Two ranks on devices 0 and 1: a round trip of 1 MiB with contents checked,
// then a Recv that nobody answers times out and aborts.
TEST(NcclCommunicatorTest, TwoRanksRoundTripThenTimeout) {
  REQUIRE_DEVICES(2);
  auto id = NcclCommunicator::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  constexpr size_t kBytes = size_t{1} << 20;
  auto rank_main = [&](int32_t r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    auto comm = NcclCommunicator::Create(r, 2, *id, stream, ShortOptions());
    ASSERT_TRUE(comm.ok()) << comm.status();
    std::vector<uint8_t> host(kBytes);
    for (size_t i = 0; i < kBytes; ++i) host[i] = static_cast<uint8_t>(i * 7 + 3);
    uint8_t* dev = nullptr;
    ASSERT_EQ(cudaMalloc(&dev, kBytes), cudaSuccess);
    if (r == 0) {
      ASSERT_EQ(cudaMemcpy(dev, host.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_TRUE((*comm)->Send(1, dev, kBytes).ok());
      ASSERT_EQ(cudaMemsetAsync(dev, 0, kBytes, stream), cudaSuccess);
      ASSERT_TRUE((*comm)->Recv(1, dev, kBytes, absl::Seconds(30)).ok());
    } else {
      ASSERT_TRUE((*comm)->Recv(0, dev, kBytes, absl::Seconds(30)).ok());
      ASSERT_TRUE((*comm)->Send(0, dev, kBytes).ok());
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    }
    std::vector<uint8_t> back(kBytes);
    ASSERT_EQ(cudaMemcpy(back.data(), dev, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(back == host) << "rank " << r;
    if (r == 0) {
      absl::Status s = (*comm)->Recv(1, dev, 64, absl::Milliseconds(200));
      EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
      EXPECT_TRUE(absl::IsUnavailable((*comm)->Send(1, dev, 64)));
    }
    comm->reset();
    cudaFree(dev);
    cudaStreamDestroy(stream);
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
}

}  // namespace
}  // namespace tandem::worker
