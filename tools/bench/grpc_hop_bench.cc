// grpc_hop_bench: what the scheduler's thread hop around gRPC costs, measured
// without tandem (README, Control plane). One bidi stream over 127.0.0.1: a
// forked client sends a 730-byte message (a 256-row step's result) and waits
// for a 100-byte reply (the next execute); this process answers from an
// "engine" thread in one of two ways:
//   callback  gRPC's callback API, as the scheduler does today: the read
//             completes on one of gRPC's poller threads, which wakes the
//             engine thread, which writes.
//   cq        the stream on a server of its own whose completion queue the
//             engine thread drives: it reads and writes itself.
// Both modes also run an idle callback-API server (the scheduler's public
// Generate and health services). Prints this process's CPU time and context
// switches per round trip, over --round-trips after 2,000 warm-up ones.
//
//   build/bin/grpc_hop_bench --mode callback --poll-strategy epoll1
//   build/bin/grpc_hop_bench --mode cq --poll-strategy poll
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/flags.h"

namespace tandem::tools {
namespace {

constexpr int64_t kWarmUp = 2000;
constexpr size_t kUpBytes = 730;
constexpr size_t kDownBytes = 100;
constexpr char kMethod[] = "/tandem.bench.Hop/Stream";

grpc::ByteBuffer Bytes(size_t n) {
  grpc::Slice slice(std::string(n, 'x'));
  return grpc::ByteBuffer(&slice, 1);
}

// This process's CPU time and context switches between round trip kWarmUp
// and kWarmUp + round_trips; prints them per round trip at the end.
class Meter {
 public:
  explicit Meter(int64_t round_trips) : round_trips_(round_trips) {}
  // Called by the engine thread with the count of messages it has answered.
  void Count(int64_t answered) {
    if (answered == kWarmUp) start_ = Now();
    if (answered != kWarmUp + round_trips_) return;
    const Usage end = Now();
    std::printf("%.1f us CPU, %.2f context switches per round trip (%lld round trips)\n",
                (end.cpu_us - start_.cpu_us) / static_cast<double>(round_trips_),
                static_cast<double>(end.switches - start_.switches) / static_cast<double>(round_trips_),
                static_cast<long long>(round_trips_));
    std::fflush(stdout);
  }

 private:
  struct Usage {
    double cpu_us;
    long switches;
  };
  static Usage Now() {
    rusage r{};
    getrusage(RUSAGE_SELF, &r);
    return {(r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1e6 + static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec),
            r.ru_nvcsw + r.ru_nivcsw};
  }
  const int64_t round_trips_;
  Usage start_{};
};

// The callback mode's stream: reads complete on gRPC's pollers and wake the
// engine thread, which queues the reply (as scheduler/server/grpc's
// SessionReactor and WorkerGroup do).
class HopReactor : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit HopReactor(Meter* meter) : meter_(meter), engine_([this] { Engine(); }) { StartRead(&in_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      ++unanswered_;
    }
    StartRead(&in_);
  }
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    out_.pop_front();
    writing_ = ok && !out_.empty();
    if (writing_) StartWrite(&out_.front());
  }
  void OnDone() override {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    engine_.join();
    delete this;
  }

 private:
  void Engine() {
    for (int64_t answered = 1;; ++answered) {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](HopReactor* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) { return r->unanswered_ > 0 || r->done_; }, this));
      if (done_) return;
      --unanswered_;
      meter_->Count(answered);
      out_.push_back(Bytes(kDownBytes));
      if (!writing_) {
        writing_ = true;
        StartWrite(&out_.front());
      }
    }
  }

  Meter* const meter_;
  grpc::ByteBuffer in_;
  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> out_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  int64_t unanswered_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread engine_;
};

class HopService : public grpc::CallbackGenericService {
 public:
  explicit HopService(Meter* meter) : meter_(meter) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new HopReactor(meter_);
  }

 private:
  Meter* const meter_;
};

// The cq mode: the engine thread reads, answers and reads again on its own
// completion queue until the client closes the stream.
void ServeOnOwnQueue(const std::string& address, Meter* meter) {
  grpc::AsyncGenericService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.RegisterAsyncGenericService(&service);
  std::unique_ptr<grpc::ServerCompletionQueue> cq = builder.AddCompletionQueue();
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  grpc::GenericServerContext context;
  grpc::GenericServerAsyncReaderWriter stream(&context);
  void* tag = nullptr;
  bool ok = false;
  service.RequestCall(&context, &stream, cq.get(), cq.get(), &context);
  if (!cq->Next(&tag, &ok) || !ok) return;
  grpc::ByteBuffer in;
  const grpc::ByteBuffer out = Bytes(kDownBytes);
  for (int64_t answered = 1;; ++answered) {
    stream.Read(&in, &in);
    if (!cq->Next(&tag, &ok) || !ok) break;
    meter->Count(answered);
    stream.Write(out, &stream);
    if (!cq->Next(&tag, &ok) || !ok) break;
  }
  stream.Finish(grpc::Status::OK, &context);
  cq->Next(&tag, &ok);
  server->Shutdown();
  cq->Shutdown();
  while (cq->Next(&tag, &ok)) {
  }
}

// The forked client: waits for the server, then round trips until done.
int RunClient(const std::string& address, int64_t round_trips) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) return 1;
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(&context, kMethod, &cq);
  void* tag = nullptr;
  bool ok = false;
  call->StartCall(&context);
  if (!cq.Next(&tag, &ok) || !ok) return 1;
  const grpc::ByteBuffer out = Bytes(kUpBytes);
  grpc::ByteBuffer in;
  for (int64_t i = 0; i < kWarmUp + round_trips; ++i) {
    call->Write(out, &context);
    if (!cq.Next(&tag, &ok) || !ok) return 1;
    call->Read(&in, &in);
    if (!cq.Next(&tag, &ok) || !ok) return 1;
  }
  call->WritesDone(&context);
  cq.Next(&tag, &ok);
  grpc::Status status;
  call->Finish(&status, &status);
  cq.Next(&tag, &ok);
  return 0;
}

// A free port on 127.0.0.1, found before gRPC starts (the client is forked
// before either side initializes gRPC).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

int Main(int argc, char** argv) {
  std::string mode = "callback", poll_strategy = "epoll1";
  int64_t round_trips = 20000;
  FlagParser flags("grpc_hop_bench",
                   "CPU time and context switches per round trip of one gRPC bidi stream, answered through\n"
                   "gRPC's callback API and an engine thread (callback) or by an engine thread driving the\n"
                   "stream's completion queue on a server of its own (cq).");
  flags.AddString("mode", &mode, "callback or cq");
  flags.AddString("poll-strategy", &poll_strategy, "GRPC_POLL_STRATEGY for this process: epoll1 or poll");
  flags.AddInt("round-trips", &round_trips, "round trips measured after 2,000 warm-up ones", 1);
  if (std::optional<int> code = flags.ParseOrExitCode(std::vector<std::string>(argv + 1, argv + argc))) return *code;
  if ((mode != "callback" && mode != "cq") || (poll_strategy != "epoll1" && poll_strategy != "poll")) {
    std::fprintf(stderr, "grpc_hop_bench: --mode: callback or cq; --poll-strategy: epoll1 or poll\n");
    return 2;
  }
  const int port = FreePort(), public_port = FreePort();
  if (port < 0 || public_port < 0) {
    std::fprintf(stderr, "grpc_hop_bench: no free port on 127.0.0.1\n");
    return 1;
  }
  const std::string address = "127.0.0.1:" + std::to_string(port);
  const pid_t client = fork();
  if (client == 0) {
    setenv("GRPC_POLL_STRATEGY", "poll", 1);  // as tandem-worker runs
    _exit(RunClient(address, round_trips));
  }
  setenv("GRPC_POLL_STRATEGY", poll_strategy.c_str(), 1);
  Meter meter(round_trips);
  HopService hop(&meter);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:" + std::to_string(public_port), grpc::InsecureServerCredentials());
  if (mode == "callback") builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.RegisterCallbackGenericService(&hop);  // in cq mode: the idle public server
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (mode == "cq") {
    ServeOnOwnQueue(address, &meter);
  }
  int status = 0;
  waitpid(client, &status, 0);
  server->Shutdown();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "grpc_hop_bench: the client failed\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tandem::tools

int main(int argc, char** argv) { return tandem::tools::Main(argc, argv); }
