#include "worker/server/worker_flags.h"

#include <fstream>

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
                          "--device", "2", "--gpu-memory-utilization=0.45", "--comm=tcp",
                          "--kv-cache-dtype=float32", "--enforce-eager"})
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
  EXPECT_EQ(again.kv_cache_dtype, "float32");
  EXPECT_TRUE(again.enforce_eager);
}

TEST(WorkerFlagsTest, DefaultsAreTheCpuBackendAndVllmsUtilization) {
  WorkerFlags f;
  EXPECT_EQ(f.backend, "cpu");
  EXPECT_EQ(f.device, 0);
  EXPECT_DOUBLE_EQ(f.gpu_memory_utilization, 0.9);
  EXPECT_EQ(f.comm, "auto");
  EXPECT_EQ(f.kv_cache_dtype, "auto");
  EXPECT_FALSE(f.enforce_eager);  // CUDA graphs on, as vLLM's default
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
  f = WorkerFlags();
  f.kv_cache_dtype = "fp8";
  EXPECT_THAT(std::string(f.Validate().message()),
              HasSubstr("flag --kv-cache-dtype must be auto, float16 or float32, got 'fp8'"));
  EXPECT_THAT(std::string(flags.Parse({"--device=-1"}).message()), HasSubstr("--device"));
}

// What a Kubernetes manifest gives a worker, after $(VAR) expansion.
TEST(WorkerPlacementFlagsTest, ManifestFormsParse) {
  WorkerPlacementFlags p;
  FlagParser flags("test", "test");
  p.Register(&flags);
  ASSERT_TRUE(flags
                  .Parse({"--scheduler=tandem-0.tandem.default:50051", "--rank=2", "--world-size=3",
                          "--comm-host=10.1.2.3", "--comm-port=50100", "--health-port=50052", "--check-flags"})
                  .ok());
  ASSERT_TRUE(p.Validate().ok()) << p.Validate();
  EXPECT_EQ(p.scheduler, "tandem-0.tandem.default:50051");
  EXPECT_EQ(p.rank, 2);
  EXPECT_EQ(p.world_size, 3);
  EXPECT_EQ(p.comm_host, "10.1.2.3");
  EXPECT_EQ(p.comm_port, 50100);
  EXPECT_EQ(p.health_port, 50052);
  EXPECT_TRUE(p.check_flags);
}

TEST(WorkerPlacementFlagsTest, DefaultsListenOnAnyPortAndServeNoHealth) {
  WorkerPlacementFlags p;
  EXPECT_EQ(p.comm_port, 0);
  EXPECT_EQ(p.health_port, -1);
  EXPECT_FALSE(p.check_flags);
  EXPECT_TRUE(p.Validate().ok());
}

TEST(WorkerPlacementFlagsTest, UnresolvedVariablesAndBadValuesNameTheFlag) {
  auto parse = [](std::vector<std::string> args) {
    WorkerPlacementFlags p;
    FlagParser flags("test", "test");
    p.Register(&flags);
    absl::Status status = flags.Parse(args);
    if (status.ok()) status = p.Validate();
    return std::string(status.message());
  };
  // Kubernetes leaves $(NAME) as it is when NAME is not defined.
  EXPECT_THAT(parse({"--rank=$(LWS_WORKER_INDEX)"}), HasSubstr("flag --rank expects an integer, got '$(LWS_WORKER_INDEX)'"));
  EXPECT_THAT(parse({"--scheduler=$(LWS_LEADER_ADDRESS):50051"}),
              HasSubstr("flag --scheduler has an unresolved variable"));
  EXPECT_THAT(parse({"--comm-host=$(POD_IP)"}), HasSubstr("flag --comm-host expects an address"));
  EXPECT_THAT(parse({"--scheduler=tandem-0"}), HasSubstr("flag --scheduler expects HOST:PORT or unix:PATH"));
  EXPECT_THAT(parse({"--scheduler=unix:"}), HasSubstr("unix: needs the path of the scheduler's --worker-socket"));
  EXPECT_EQ(parse({"--scheduler=unix:/run/tandem/workers.sock"}), "");  // the scheduler's --worker-socket
  EXPECT_THAT(parse({"--rank=2", "--world-size=2"}), HasSubstr("flag --rank must be below --world-size (2), got 2"));
  EXPECT_THAT(parse({"--comm-port=70000"}), HasSubstr("flag --comm-port must be in [0, 65535]"));
  EXPECT_THAT(parse({"--health-port=-2"}), HasSubstr("flag --health-port must be in [-1, 65535]"));
  EXPECT_THAT(parse({"--comm-port=5000", "--health-port=5000"}), HasSubstr("--comm-port and --health-port must differ"));
}

// --tls-*: all three or none, each a readable file; the message names the flag.
TEST(WorkerPlacementFlagsTest, TlsFilesGoTogetherAndMustBeReadable) {
  const std::string dir = ::testing::TempDir();
  const std::string pem = dir + "/tls_flags_test.pem";
  const std::string empty = dir + "/tls_flags_test_empty.pem";
  { std::ofstream(pem) << "-----BEGIN CERTIFICATE-----\n"; }
  { std::ofstream(empty) << ""; }
  auto parse = [](std::vector<std::string> args) {
    WorkerPlacementFlags p;
    FlagParser flags("test", "test");
    p.Register(&flags);
    absl::Status status = flags.Parse(args);
    if (status.ok()) status = p.Validate();
    return status;
  };
  EXPECT_TRUE(parse({}).ok());
  EXPECT_TRUE(parse({"--tls-cert=" + pem, "--tls-key=" + pem, "--tls-ca=" + pem}).ok());
  EXPECT_THAT(std::string(parse({"--tls-cert=" + pem, "--tls-key=" + pem}).message()),
              HasSubstr("flag --tls-ca is missing"));
  EXPECT_THAT(std::string(parse({"--tls-ca=" + pem}).message()), HasSubstr("flag --tls-cert is missing"));
  EXPECT_THAT(std::string(parse({"--tls-cert=" + pem, "--tls-key=" + dir + "/absent", "--tls-ca=" + pem}).message()),
              HasSubstr("flag --tls-key: cannot read"));
  EXPECT_THAT(std::string(parse({"--tls-cert=" + pem, "--tls-key=" + pem, "--tls-ca=" + empty}).message()),
              HasSubstr("flag --tls-ca: cannot read"));
  EXPECT_THAT(std::string(parse({"--tls-cert=$(CERT)", "--tls-key=" + pem, "--tls-ca=" + pem}).message()),
              HasSubstr("flag --tls-cert has an unresolved variable"));
}

}  // namespace
}  // namespace tandem::worker
