#include "scheduler/server/scheduler_flags.h"

#include <cstdio>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::scheduler {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<SchedulerFlags> Parse(const std::vector<std::string>& args) {
  SchedulerFlags f;
  FlagParser flags("test", "test");
  f.Register(&flags);
  if (absl::Status s = flags.Parse(args); !s.ok()) return s;
  return f;
}

TEST(SchedulerFlagsTest, ArgsRoundTripThroughTheParser) {
  auto f = Parse({"--model", "/m/x.gguf", "--pipeline-parallel-size=3", "--max-num-seqs", "7",
                  "--max-num-batched-tokens=99", "--max-model-len=300", "--block-size=32", "--no-async-scheduling",
                  "--no-enable-prefix-caching", "--scheduling-policy=priority", "--step-timeout=2.5", "--queue-timeout=7.5", "--max-queued-requests=9", "--trace-steps=/t.jsonl", "--api-key=k",
                  "--served-model-name=n", "--http-threads=3", "--http-request-timeout=1.5", "--shutdown-grace=0"});
  ASSERT_TRUE(f.ok()) << f.status();
  auto again = Parse(f->ToArgs());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->model, "/m/x.gguf");
  EXPECT_EQ(again->pipeline_parallel_size, 3);
  EXPECT_EQ(again->max_num_seqs, 7);
  EXPECT_EQ(again->max_num_batched_tokens, 99);
  EXPECT_EQ(again->max_model_len, 300);
  EXPECT_EQ(again->block_size, 32);
  EXPECT_FALSE(again->async_scheduling);
  EXPECT_FALSE(again->enable_prefix_caching);
  EXPECT_EQ(again->scheduling_policy, "priority");
  EXPECT_EQ(again->ToEngineConfig().policy, SchedulingPolicy::kPriority);
  EXPECT_DOUBLE_EQ(again->step_timeout, 2.5);
  EXPECT_DOUBLE_EQ(again->queue_timeout, 7.5);
  EXPECT_EQ(again->max_queued_requests, 9);
  EXPECT_EQ(again->trace_steps, "/t.jsonl");
  EXPECT_EQ(again->api_key, "k");
  EXPECT_EQ(again->served_model_name, "n");
  EXPECT_EQ(again->http_threads, 3);
  EXPECT_DOUBLE_EQ(again->http_request_timeout, 1.5);
  EXPECT_DOUBLE_EQ(again->shutdown_grace, 0);
  EXPECT_EQ(again->ToArgs(), f->ToArgs());
}

TEST(SchedulerFlagsTest, DefaultsGiveTheDefaultEngine) {
  SchedulerFlags f;
  ASSERT_TRUE(f.Validate().ok());
  const EngineConfig config = f.ToEngineConfig();
  EXPECT_EQ(config.block_size, 16);
  EXPECT_EQ(config.max_num_seqs, 128);
  EXPECT_EQ(config.max_num_batched_tokens, 2048);
  EXPECT_TRUE(config.async_scheduling);
  EXPECT_TRUE(config.enable_prefix_caching);
  EXPECT_EQ(config.policy, SchedulingPolicy::kFcfs);
  EXPECT_EQ(config.EffectiveQueueDepth(), 2);
}

TEST(SchedulerFlagsTest, ValidateNamesTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const Case cases[] = {
      {{"--block-size=24"}, "flag --block-size must be a power of two, got 24"},
      {{"--step-timeout=0"}, "flag --step-timeout must be positive"},
      {{"--step-timeout=nan"}, "flag --step-timeout must be positive"},
      {{"--shutdown-grace=-1"}, "flag --shutdown-grace must not be negative"},
      {{"--queue-timeout=-1"}, "flag --queue-timeout must not be negative"},
      {{"--http-request-timeout=0"}, "flag --http-request-timeout must be positive"},
      {{"--scheduling-policy=lifo"}, "flag --scheduling-policy must be fcfs or priority, got 'lifo'"},
  };
  for (const Case& c : cases) {
    auto f = Parse(c.args);
    ASSERT_TRUE(f.ok()) << f.status();
    const absl::Status s = f->Validate();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.args[0];
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.args[0];
  }
  // What the parser knows, it refuses itself.
  EXPECT_THAT(std::string(Parse({"--max-num-seqs=0"}).status().message()), HasSubstr("--max-num-seqs"));
}

TEST(SchedulerFlagsTest, ServedModelNameIsTheFileStemByDefault) {
  SchedulerFlags f;
  f.model = "/a/b/SmolLM2.Q4_1.gguf";
  EXPECT_EQ(f.ServedModelName(), "SmolLM2.Q4_1");
  f.model = "plain";
  EXPECT_EQ(f.ServedModelName(), "plain");
  f.served_model_name = "chosen";
  EXPECT_EQ(f.ServedModelName(), "chosen");
}

// The TLS flags are tandem-scheduler's own: Register (what `tandem serve`
// takes) leaves them out and ToArgs does not forward them.
TEST(SchedulerFlagsTest, TlsFlagsOnlyThroughRegisterTls) {
  EXPECT_FALSE(Parse({"--tls-cert=/c.pem"}).ok());
  SchedulerFlags f;
  FlagParser flags("test", "test");
  f.Register(&flags);
  f.RegisterTls(&flags);
  ASSERT_TRUE(flags.Parse({"--tls-cert=/absent/c.pem"}).ok());
  EXPECT_THAT(std::string(f.Validate().message()), HasSubstr("flag --tls-key is missing"));
  for (const std::string& arg : f.ToArgs()) EXPECT_THAT(arg, ::testing::Not(HasSubstr("tls")));
}

// HTTPS: both files or none, each readable; Register takes them (so `tandem
// serve` does) and ToArgs forwards them to the scheduler it starts.
TEST(SchedulerFlagsTest, HttpsFlagsGoTogetherAndAreForwarded) {
  auto alone = Parse({"--https-cert=/absent/c.pem"});
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_THAT(std::string(alone->Validate().message()), HasSubstr("flag --https-key is missing"));
  auto unreadable = Parse({"--https-cert=/absent/c.pem", "--https-key=/absent/k.pem"});
  ASSERT_TRUE(unreadable.ok());
  EXPECT_THAT(std::string(unreadable->Validate().message()), HasSubstr("flag --https-cert: cannot read"));
  const std::string file = ::testing::TempDir() + "/https.pem";
  FILE* out = std::fopen(file.c_str(), "w");
  ASSERT_NE(out, nullptr);
  std::fputs("-----BEGIN CERTIFICATE-----\n", out);
  std::fclose(out);
  auto both = Parse({"--https-cert=" + file, "--https-key=" + file});
  ASSERT_TRUE(both.ok());
  EXPECT_TRUE(both->Validate().ok()) << both->Validate();
  auto again = Parse(both->ToArgs());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->https_cert, file);
  EXPECT_EQ(again->https_key, file);
}

}  // namespace
}  // namespace tandem::scheduler
