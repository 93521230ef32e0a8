// The backend factory in whichever build runs it: the CPU backend always;
// --backend cuda refused with its cause where this build or machine cannot
// run it (exit status 1 in tandem-worker), made where it can.
#include "worker/server/backend_factory.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/loopback_communicator.h"

namespace tandem::worker {
namespace {

using ::testing::HasSubstr;

TEST(BackendFactoryTest, TheCpuBackendAlways) {
  auto backend = MakeBackend({"cpu", 0, 1});
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->name(), "cpu");
  EXPECT_EQ(DeviceName(**backend), "cpu");
  EXPECT_TRUE(BindThreadToBackend(**backend).ok());
  EXPECT_EQ(DeviceMemoryOf(**backend).status().code(), absl::StatusCode::kUnimplemented);
  auto identity = NcclDeviceIdentity(**backend);
  ASSERT_TRUE(identity.ok());
  EXPECT_EQ(*identity, "");  // a CPU worker never offers NCCL
}

TEST(BackendFactoryTest, TheKvCacheDtypeChoosesTheCpuCache) {
  EXPECT_EQ(MakeBackend({"cpu", 0, 1})->get()->kv_type(), KvType::kF16);  // auto: half, as llama.cpp's
  EXPECT_EQ(MakeBackend({"cpu", 0, 1, "float16"})->get()->kv_type(), KvType::kF16);
  EXPECT_EQ(MakeBackend({"cpu", 0, 1, "float32"})->get()->kv_type(), KvType::kF32);
  auto unknown = MakeBackend({"cpu", 0, 1, "fp8"});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("unknown --kv-cache-dtype 'fp8'"));
}

TEST(BackendFactoryTest, TheCudaCacheIsFloat32Only) {
  EXPECT_EQ(*KvCacheType({"cuda", 0, 0}), KvType::kF32);
  EXPECT_EQ(*KvCacheType({"cuda", 0, 0, "float32"}), KvType::kF32);
  // Refused before a device is looked for, whatever this machine has.
  const absl::Status half = BackendAvailable({"cuda", 0, 0, "float16"});
  EXPECT_EQ(half.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(half.message()), HasSubstr("the CUDA backend's KV cache is float32"));
}

TEST(BackendFactoryTest, AnUnknownBackendIsInvalid) {
  EXPECT_EQ(MakeBackend({"tpu", 0, 1}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BackendFactoryTest, CudaIsMadeOrRefusedWithTheCause) {
  auto backend = MakeBackend({"cuda", 0, 0});
  EXPECT_EQ(BackendAvailable({"cuda", 0, 0}).ok(), backend.ok());  // the same answer, without a context
  if (!BuildHasCuda()) {
    ASSERT_FALSE(backend.ok());
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(backend.status().message()), HasSubstr("this build has no CUDA"));
    return;
  }
  if (!backend.ok()) {
    // No usable device here: the cause, from CudaDeviceUsable.
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition) << backend.status();
    EXPECT_THAT(std::string(backend.status().message()), HasSubstr("--backend cuda --device 0: "));
    GTEST_SKIP() << backend.status();
  }
  EXPECT_EQ((*backend)->name(), "cuda");
  EXPECT_EQ(DeviceName(**backend), "cuda:0");
  auto memory = DeviceMemoryOf(**backend);
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_GT(memory->total_bytes, memory->free_bytes / 2);
  if (BuildHasNccl()) {
    auto identity = NcclDeviceIdentity(**backend);
    ASSERT_TRUE(identity.ok()) << identity.status();
    EXPECT_THAT(*identity, HasSubstr("/"));
  }
}

TEST(BackendFactoryTest, AHostTransportUsesOneCommunicatorBothWays) {
  auto backend = MakeBackend({"cpu", 0, 1});
  ASSERT_TRUE(backend.ok());
  LoopbackHub hub(2);
  auto transport = OverHostCommunicator(**backend, std::make_unique<LoopbackCommunicator>(&hub, 1));
  EXPECT_EQ(transport->name(), "host");
  EXPECT_EQ(transport->hidden(), transport->tokens());
  EXPECT_EQ(transport->hidden()->rank(), 1);
}

TEST(BackendFactoryTest, NcclOnlyWhenEveryRankHasAGpuOfItsOwn) {
  EXPECT_EQ(*ChooseNccl("auto", 2, {"h/0000:01:00.0", "h/0000:02:00.0"}, true), true);
  EXPECT_EQ(*ChooseNccl("nccl", 2, {"h/0000:01:00.0", "g/0000:01:00.0"}, true), true);  // another host's bus 1
  // PP on one GPU, a CPU rank, an older scheduler, no ids: TCP, or a refusal
  // naming why under --comm nccl.
  EXPECT_EQ(*ChooseNccl("auto", 2, {"h/0000:01:00.0", "h/0000:01:00.0"}, true), false);
  EXPECT_EQ(*ChooseNccl("auto", 2, {"h/0000:01:00.0", ""}, true), false);
  EXPECT_EQ(*ChooseNccl("auto", 2, {}, true), false);
  EXPECT_EQ(*ChooseNccl("auto", 2, {"h/0000:01:00.0", "h/0000:02:00.0"}, false), false);
  EXPECT_EQ(*ChooseNccl("tcp", 2, {"", ""}, false), false);
  auto shared = ChooseNccl("nccl", 2, {"h/0000:01:00.0", "h/0000:01:00.0"}, true);
  ASSERT_FALSE(shared.ok());
  EXPECT_EQ(shared.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(shared.status().message()),
              HasSubstr("--comm nccl: two ranks share the GPU h/0000:01:00.0, which NCCL refuses; use --comm tcp"));
  EXPECT_THAT(std::string(ChooseNccl("nccl", 2, {"h/0000:01:00.0", ""}, true).status().message()),
              HasSubstr("rank 1 cannot use NCCL"));
}

TEST(BackendFactoryTest, NcclIdsExistExactlyWhenTheBuildHasNccl) {
  auto ids = NewNcclUniqueIds(2);
  if (!BuildHasNccl()) {
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kUnimplemented);
    return;
  }
  // ncclGetUniqueId needs no GPU, but NCCL may still refuse without a driver.
  if (!ids.ok()) GTEST_SKIP() << ids.status();
  EXPECT_EQ(ids->size(), 256u);
}

}  // namespace
}  // namespace tandem::worker
