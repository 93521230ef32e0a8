#include "worker/server/grpc/scheduler_dial.h"

#include <chrono>
#include <memory>

#include <grpcpp/completion_queue.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tandem::worker {
namespace {

// One Check, failing at once (no wait_for_ready) when the channel cannot
// connect; gRPC puts the last connection error in the message. On a
// completion queue of its own, not the callback API: a callback call starts
// gRPC's callback pollers, which would then poll the control stream's socket
// for the rest of the process and hand every step to the compute thread
// through a wake (grpc_scheduler_link.h reads on the compute thread).
grpc::Status CheckOnce(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice empty;  // an empty HealthCheckRequest: service ""
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  grpc::CompletionQueue queue;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", request, &queue);
  call->StartCall();
  call->Finish(&response, &status, &queue);
  void* tag = nullptr;
  bool ok = false;
  queue.Next(&tag, &ok);  // the deadline bounds it
  queue.Shutdown();
  while (queue.Next(&tag, &ok)) {
  }
  return status;
}

bool IsTlsFailure(const grpc::Status& status) {
  const std::string message = absl::AsciiStrToLower(status.error_message());
  for (const char* sign : {"handshake", "ssl", "tls", "certificate"}) {
    if (absl::StrContains(message, sign)) return true;
  }
  return false;
}

}  // namespace

absl::Status AwaitScheduler(const std::shared_ptr<grpc::Channel>& channel, const std::string& target, bool tls) {
  // Under TLS 1.3 the client's handshake ends before the server checks the
  // client's certificate: a refused worker sees only the socket closed.
  // A scheduler that is going away closes sockets too, once; one that
  // refuses closes every attempt's.
  constexpr int kClosedAttemptsToRefuse = 3;
  int closed = 0;
  for (;;) {
    const grpc::Status status = CheckOnce(channel);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return absl::OkStatus();  // it answered
    const std::string message = status.error_message();
    if (tls && IsTlsFailure(status)) {
      return absl::UnavailableError(absl::StrCat(
          "TLS handshake with the scheduler at ", target, " failed (", message,
          "): this worker's --tls-ca must sign the scheduler's certificate, which must name the host of ", target));
    }
    // A plaintext worker at a TLS scheduler sees the same: the scheduler
    // closes what is not a TLS handshake.
    closed = absl::StrContains(absl::AsciiStrToLower(message), "socket closed") ? closed + 1 : 0;
    if (closed >= kClosedAttemptsToRefuse) {
      return absl::UnavailableError(
          tls ? absl::StrCat("the scheduler at ", target, " closed every TLS handshake (", message,
                             "): it refuses this worker's certificate; the scheduler's --tls-ca must sign --tls-cert")
              : absl::StrCat("the scheduler at ", target, " closed every connection (", message,
                             "): it most likely requires TLS; give this worker --tls-cert, --tls-key and --tls-ca"));
    }
    // Not up yet, or refusing: wait for the channel's next attempt (gRPC's
    // backoff); the bound keeps counting when the state stays put.
    const grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
    if (state != GRPC_CHANNEL_READY) {
      channel->WaitForStateChange(state, std::chrono::system_clock::now() + std::chrono::seconds(1));
    }
  }
}

}  // namespace tandem::worker
