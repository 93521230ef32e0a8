// WorkerSessions through a real SchedulerServer on 127.0.0.1, with the
// workers on the Generate API's port, on a port of their own and on a Unix
// socket of their own: a fake worker
// (a gRPC client in this process) registers and answers steps; this test's
// thread plays the engine (Execute, Sample, CollectOutput drive the queue).
#include "scheduler/server/grpc/worker_sessions.h"

#include <grpcpp/grpcpp.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_options.h"
#include "scheduler/server/grpc/grpc_scheduler_server.h"
#include "scheduler/server/serving_engine.h"
#include "tandem/v1/worker_service.grpc.pb.h"

namespace tandem::scheduler {
namespace {

// Polls `done` every 5 ms for up to 10 s.
bool WaitFor(const std::function<bool()>& done) {
  for (int i = 0; i < 2000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

// One rank of a world of one: registers, goes through formation, answers
// every step with an empty result.
class FakeWorker {
 public:
  explicit FakeWorker(const std::string& target)
      : stub_(v1::WorkerControl::NewStub(rpc::MakeChannel(target))),
        stream_(stub_->Session(&context_)),
        thread_([this] { Run(); }) {}
  ~FakeWorker() {
    context_.TryCancel();
    thread_.join();
  }
  // The stream's end as the worker saw it (after the thread ended).
  bool ended() const { return ended_.load(); }
  grpc::StatusCode code() const { return code_; }
  std::string message() const { return message_; }
  void Leave() { context_.TryCancel(); }

 private:
  void Run() {
    v1::WorkerMessage hello;
    v1::RegisterWorker* r = hello.mutable_register_();
    r->set_rank(0);
    r->set_world_size(1);
    r->set_model_name("fake");
    r->set_num_layers(2);
    r->set_end_layer(2);
    r->set_block_size(16);
    r->set_max_kv_blocks(64);
    r->set_vocab_size(100);
    stream_->Write(hello);
    v1::SchedulerMessage in;
    while (stream_->Read(&in)) {
      v1::WorkerMessage out;
      if (in.has_configure()) {
        out.mutable_configured()->set_epoch(in.configure().epoch());
        epoch_ = in.configure().epoch();
      } else if (in.has_connect()) {
        out.mutable_ready()->set_epoch(in.connect().epoch());
      } else if (in.has_execute_and_sample()) {
        out.mutable_result()->set_epoch(epoch_);
        out.mutable_result()->mutable_output()->set_step_seq(in.execute_and_sample().execute().step_seq());
      } else if (in.has_sample()) {
        out.mutable_result()->set_epoch(epoch_);
        out.mutable_result()->mutable_output()->set_step_seq(in.sample().step_seq());
      } else {
        continue;
      }
      stream_->Write(out);
    }
    const grpc::Status status = stream_->Finish();
    code_ = status.error_code();
    message_ = status.error_message();
    ended_ = true;
  }

  std::unique_ptr<v1::WorkerControl::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::SchedulerMessage>> stream_;
  int64_t epoch_ = 0;
  std::atomic<bool> ended_{false};
  grpc::StatusCode code_ = grpc::StatusCode::OK;
  std::string message_;
  std::thread thread_;  // last: starts after everything it uses
};

// Where the workers dial.
enum class Listen { kGenerateApiPort, kOwnPort, kSocket };

class WorkerSessionsTest : public ::testing::TestWithParam<Listen> {
 protected:
  WorkerSessionsTest() : group_(Options()) {
    EngineConfig config;
    config.vocab_size = 100;
    engine_ = std::make_unique<ServingEngine>(config, &group_);  // never started: the test steps the group
    if (GetParam() == Listen::kOwnPort) listen_.port = 0;
    if (GetParam() == Listen::kSocket) listen_.socket = SocketPath();
    auto server = SchedulerServer::Start("127.0.0.1", 0, &group_, engine_.get(), nullptr, {}, listen_);
    EXPECT_TRUE(server.ok()) << server.status();
    if (server.ok()) server_ = *std::move(server);
  }

  static std::string SocketPath() { return absl::StrCat("/tmp/worker_sessions_test_", getpid(), ".sock"); }

  // What a worker dials.
  std::string WorkerTarget() const {
    if (!listen_.socket.empty()) return "unix:" + listen_.socket;
    return absl::StrCat("127.0.0.1:", server_->worker_port());
  }

  static WorkerGroupOptions Options() {
    WorkerGroupOptions o;
    o.world_size = 1;
    o.block_size = 16;
    o.step_timeout = absl::Seconds(10);
    return o;
  }

  // One step, the test's thread acting as the engine.
  absl::StatusOr<ModelRunnerOutput> Step() {
    SchedulerOutput step;
    step.step_seq = ++step_seq_;
    if (absl::Status s = group_.Execute(step); !s.ok()) return s;
    if (absl::Status s = group_.Sample(step.step_seq, nullptr); !s.ok()) return s;
    return group_.CollectOutput(step.step_seq);
  }

  bool Connected() { return group_.Status().workers[0].connected; }

  WorkerGroup group_;
  std::unique_ptr<ServingEngine> engine_;
  SchedulerServer::WorkerListen listen_;
  std::unique_ptr<SchedulerServer> server_;
  StepSeq step_seq_ = 0;
};

TEST_P(WorkerSessionsTest, StepsRunAndEachAnswerIsTheOldestStepsInOrder) {
  ASSERT_NE(server_, nullptr);
  EXPECT_EQ(server_->worker_port() == server_->port(), GetParam() == Listen::kGenerateApiPort);
  EXPECT_EQ(server_->worker_socket(), listen_.socket);
  FakeWorker worker(WorkerTarget());
  ASSERT_TRUE(WaitFor([&] { return group_.ready(); })) << group_.Status().description;
  for (StepSeq expected = 1; expected <= 20; ++expected) {
    auto result = Step();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->step_seq, expected);
  }
  // Two in flight (async scheduling), collected oldest first.
  SchedulerOutput a, b;
  a.step_seq = ++step_seq_;
  b.step_seq = ++step_seq_;
  ASSERT_TRUE(group_.Execute(a).ok());
  ASSERT_TRUE(group_.Sample(a.step_seq, nullptr).ok());
  ASSERT_TRUE(group_.Execute(b).ok());
  ASSERT_TRUE(group_.Sample(b.step_seq, nullptr).ok());
  auto first = group_.CollectOutput(a.step_seq);
  auto second = group_.CollectOutput(b.step_seq);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->step_seq, a.step_seq);
  EXPECT_EQ(second->step_seq, b.step_seq);
}

TEST_P(WorkerSessionsTest, OnlyTheWorkersPortServesWorkers) {
  ASSERT_NE(server_, nullptr);
  if (GetParam() == Listen::kGenerateApiPort) GTEST_SKIP() << "one port serves both";
  FakeWorker stray(absl::StrCat("127.0.0.1:", server_->port()));  // the Generate API's port
  ASSERT_TRUE(WaitFor([&] { return stray.ended(); }));
  EXPECT_EQ(stray.code(), grpc::StatusCode::UNIMPLEMENTED) << stray.message();
  EXPECT_FALSE(Connected());
}

// With no step running nobody calls CollectOutput: our idle thread drives the
// queue, so a lost worker is noticed and a new one forms the group; the next
// step takes the queue back for the engine.
TEST_P(WorkerSessionsTest, WhileTheEngineIsIdleWorkersComeAndGoAndTheNextStepRuns) {
  ASSERT_NE(server_, nullptr);
  {
    FakeWorker worker(WorkerTarget());
    ASSERT_TRUE(WaitFor([&] { return group_.ready(); })) << group_.Status().description;
    ASSERT_TRUE(Step().ok());
    worker.Leave();
    ASSERT_TRUE(WaitFor([&] { return !Connected(); })) << group_.Status().description;
  }
  EXPECT_FALSE(group_.failure().ok());  // the group failed: the engine resets it
  group_.Reset();
  // Formed with nobody in CollectOutput: on the idle thread, which holds
  // the queue now; the steps take it back.
  FakeWorker second(WorkerTarget());
  ASSERT_TRUE(WaitFor([&] { return group_.ready(); })) << group_.Status().description;
  for (int i = 0; i < 3; ++i) {
    auto result = Step();
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->step_seq, step_seq_);
  }
}

TEST_P(WorkerSessionsTest, ShutdownEndsTheWorkersStreamsAndStepsFailCleanly) {
  ASSERT_NE(server_, nullptr);
  FakeWorker worker(WorkerTarget());
  ASSERT_TRUE(WaitFor([&] { return group_.ready(); })) << group_.Status().description;
  ASSERT_TRUE(Step().ok());
  server_->Shutdown();
  EXPECT_TRUE(WaitFor([&] { return worker.ended(); }));
  EXPECT_FALSE(Connected());
  EXPECT_FALSE(Step().ok());  // no worker: an error, not a hang
  if (GetParam() == Listen::kSocket) {
    EXPECT_FALSE(std::filesystem::exists(listen_.socket)) << "the socket outlived the server";
  }
}

// A socket left by a scheduler that did not stop cleanly is replaced; a file
// that is not a socket is refused, not removed.
TEST(WorkerSocketTest, AnOldSocketIsReplacedAndAnythingElseRefused) {
  const std::string path = absl::StrCat("/tmp/worker_socket_test_", getpid(), ".sock");
  {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", path.c_str());
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0) << std::strerror(errno);
    close(fd);  // the socket file stays, as after a crash
  }
  EXPECT_TRUE(rpc::CheckUnixSocketPath(path).ok());
  WorkerGroupOptions options;
  options.world_size = 1;
  options.block_size = 16;
  WorkerGroup group(options);
  EngineConfig config;
  config.vocab_size = 100;
  ServingEngine engine(config, &group);
  SchedulerServer::WorkerListen listen;
  listen.socket = path;
  {
    auto server = SchedulerServer::Start("127.0.0.1", 0, &group, &engine, nullptr, {}, listen);
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_EQ((*server)->worker_port(), 0);  // a socket only
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  { std::ofstream(path) << "not a socket"; }
  auto refused = SchedulerServer::Start("127.0.0.1", 0, &group, &engine, nullptr, {}, listen);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_TRUE(std::filesystem::exists(path));
  std::filesystem::remove(path);
  listen.socket = "/tmp/" + std::string(120, 'd') + "/w.sock";
  EXPECT_THAT(std::string(rpc::CheckUnixSocketPath(listen.socket).message()),
              ::testing::HasSubstr("a Unix socket's is at most 107"));
}

INSTANTIATE_TEST_SUITE_P(Listens, WorkerSessionsTest,
                         ::testing::Values(Listen::kGenerateApiPort, Listen::kOwnPort, Listen::kSocket),
                         [](const auto& info) {
                           switch (info.param) {
                             case Listen::kGenerateApiPort:
                               return "GenerateApiPort";
                             case Listen::kOwnPort:
                               return "OwnPort";
                             case Listen::kSocket:
                               return "Socket";
                           }
                           return "?";
                         });

}  // namespace
}  // namespace tandem::scheduler
