#include "worker/server/worker_flags.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::worker {
namespace {

using ::testing::HasSubstr;

TEST(WorkerFlagsTest, ArgsRoundTripThroughTheParser) {
  WorkerFlags f;
  FlagParser flags("test", "test");
  f.Register(&flags);
  ASSERT_TRUE(flags
                  .Parse({"--kv-cache-memory", "96MiB", "--threads=3", "--peer-timeout=4.5", "--backend=cuda",
                          "--device", "2", "--gpu-memory-utilization=0.45", "--comm=tcp"})
                  .ok());
  EXPECT_EQ(f.kv_cache_memory, int64_t{96} << 20);
  ASSERT_TRUE(f.Validate().ok());
  WorkerFlags again;
  FlagParser reparse("test", "test");
  again.Register(&reparse);
  ASSERT_TRUE(reparse.Parse(f.ToArgs()).ok());
  EXPECT_EQ(again.kv_cache_memory, f.kv_cache_memory);
  EXPECT_EQ(again.threads, 3);
  EXPECT_DOUBLE_EQ(again.peer_timeout, 4.5);
  EXPECT_EQ(again.backend, "cuda");
  EXPECT_EQ(again.device, 2);
  EXPECT_DOUBLE_EQ(again.gpu_memory_utilization, 0.45);
  EXPECT_EQ(again.comm, "tcp");
}

TEST(WorkerFlagsTest, DefaultsAreTheCpuBackendAndVllmsUtilization) {
  WorkerFlags f;
  EXPECT_EQ(f.backend, "cpu");
  EXPECT_EQ(f.device, 0);
  EXPECT_DOUBLE_EQ(f.gpu_memory_utilization, 0.9);
  EXPECT_EQ(f.comm, "auto");
  EXPECT_TRUE(f.Validate().ok());
}

TEST(WorkerFlagsTest, BadValuesNameTheFlag) {
  WorkerFlags f;
  FlagParser flags("test", "test");
  f.Register(&flags);
  EXPECT_THAT(std::string(flags.Parse({"--kv-cache-memory=banana"}).message()), HasSubstr("--kv-cache-memory"));
  f.kv_cache_memory = 0;
  EXPECT_THAT(std::string(f.Validate().message()), HasSubstr("--kv-cache-memory"));
  f = WorkerFlags();
  f.peer_timeout = -1;
  EXPECT_THAT(std::string(f.Validate().message()), HasSubstr("--peer-timeout"));
  f = WorkerFlags();
  f.backend = "tpu";
  EXPECT_THAT(std::string(f.Validate().message()), HasSubstr("flag --backend must be cpu or cuda, got 'tpu'"));
  f = WorkerFlags();
  f.gpu_memory_utilization = 1.5;
  EXPECT_THAT(std::string(f.Validate().message()), HasSubstr("--gpu-memory-utilization"));
  f.gpu_memory_utilization = 0;
  EXPECT_THAT(std::string(f.Validate().message()), HasSubstr("--gpu-memory-utilization"));
  f = WorkerFlags();
  f.comm = "mpi";
  EXPECT_THAT(std::string(f.Validate().message()), HasSubstr("flag --comm must be auto, nccl or tcp"));
  f.comm = "nccl";
  EXPECT_THAT(std::string(f.Validate().message()), HasSubstr("--comm nccl needs --backend cuda"));
  EXPECT_THAT(std::string(flags.Parse({"--device=-1"}).message()), HasSubstr("--device"));
}

}  // namespace
}  // namespace tandem::worker
