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
  ASSERT_TRUE(flags.Parse({"--kv-cache-memory", "96MiB", "--threads=3", "--peer-timeout=4.5"}).ok());
  EXPECT_EQ(f.kv_cache_memory, int64_t{96} << 20);
  ASSERT_TRUE(f.Validate().ok());
  WorkerFlags again;
  FlagParser reparse("test", "test");
  again.Register(&reparse);
  ASSERT_TRUE(reparse.Parse(f.ToArgs()).ok());
  EXPECT_EQ(again.kv_cache_memory, f.kv_cache_memory);
  EXPECT_EQ(again.threads, 3);
  EXPECT_DOUBLE_EQ(again.peer_timeout, 4.5);
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
}

}  // namespace
}  // namespace tandem::worker
