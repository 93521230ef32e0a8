// GrpcSchedulerLink against a real gRPC server with tandem's settings in
// another process, as the scheduler is: the compute thread reads the stream
// itself, so while it runs a long step it does not read; the connection must
// still answer keepalive pings.
#include "worker/server/grpc/grpc_scheduler_link.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_options.h"
#include "gtest/gtest.h"
#include "tandem/v1/generate_service.grpc.pb.h"

namespace tandem::worker {
namespace {

// Pings every second, each to be answered within a second, on both sides.
rpc::RpcOptions FastKeepalive() {
  rpc::RpcOptions options;
  options.keepalive_time_ms = 1000;
  options.keepalive_timeout_ms = 1000;
  return options;
}

// Answers every message of a worker's stream with one of its own.
class EchoService : public v1::WorkerControl::Service {
 public:
  grpc::Status Session(grpc::ServerContext* context,
                       grpc::ServerReaderWriter<v1::SchedulerMessage, v1::WorkerMessage>* stream) override {
    v1::WorkerMessage in;
    for (int64_t n = 1; stream->Read(&in); ++n) {
      v1::SchedulerMessage out;
      out.mutable_configure()->set_epoch(n);
      stream->Write(out);
    }
    return grpc::Status::OK;
  }
};

// Runs the echo server in a child process and returns its port; the child
// is killed by the caller. Forked before this process uses gRPC.
int StartEchoServer(pid_t* child) {
  int fds[2];
  if (pipe(fds) != 0) return 0;
  *child = fork();
  if (*child == 0) {
    close(fds[0]);
    EchoService service;
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    rpc::ConfigureServer(&builder, FastKeepalive());
    builder.RegisterService(&service);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    if (write(fds[1], &port, sizeof port) != sizeof port) _exit(1);
    server->Wait();
    _exit(0);
  }
  close(fds[1]);
  int port = 0;
  if (read(fds[0], &port, sizeof port) != sizeof port) port = 0;
  close(fds[0]);
  return port;
}

TEST(GrpcSchedulerLinkTest, AnswersKeepalivePingsWhileTheComputeThreadIsAwayFromTheStream) {
  pid_t child = 0;
  const int port = StartEchoServer(&child);
  ASSERT_GT(port, 0);
  {
    auto channel = rpc::MakeChannel(absl::StrCat("127.0.0.1:", port), FastKeepalive());
    auto stub = v1::WorkerControl::NewStub(channel);
    GrpcSchedulerLink link(channel, stub.get());
    v1::SchedulerMessage answer;
    std::string reason;
    link.Send(v1::WorkerMessage());
    ASSERT_TRUE(link.Receive(&answer, &reason)) << reason;
    EXPECT_EQ(answer.configure().epoch(), 1);
    // The long step itself, not a wait for a state: the reader stays away from
    // the stream through more than a ping and its timeout (without the keeper
    // the server drops the connection after one round), as a real step would.
    const rpc::RpcOptions keepalive = FastKeepalive();
    std::this_thread::sleep_for(std::chrono::milliseconds(
        keepalive.keepalive_time_ms + keepalive.keepalive_timeout_ms + 1500));
    link.Send(v1::WorkerMessage());
    EXPECT_TRUE(link.Receive(&answer, &reason)) << "the stream ended during the step: " << reason;
    EXPECT_EQ(answer.configure().epoch(), 2);
    link.Shutdown();
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
}

// A scheduler started with --worker-port serves no workers on its --port: a
// worker that dials that one is told which port to dial, not just that the
// stream ended. (In this process: the test above forks before gRPC starts.)
TEST(GrpcSchedulerLinkTest, APortThatServesNoWorkersSaysSo) {
  v1::Generate::Service generate;  // a server with a service, but not WorkerControl
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&generate);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_GT(port, 0);
  auto channel = rpc::MakeChannel(absl::StrCat("127.0.0.1:", port));
  auto stub = v1::WorkerControl::NewStub(channel);
  GrpcSchedulerLink link(channel, stub.get());
  link.Send(v1::WorkerMessage());
  v1::SchedulerMessage answer;
  std::string reason;
  EXPECT_FALSE(link.Receive(&answer, &reason));
  EXPECT_EQ(reason, "that port serves no workers: dial the scheduler's --worker-port or --worker-socket");
  link.Shutdown();
  server->Shutdown();
}

}  // namespace
}  // namespace tandem::worker
