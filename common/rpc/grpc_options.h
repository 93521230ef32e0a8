// gRPC settings shared by every tandem channel and server, set explicitly
// rather than left to library defaults (scheduler/README.md §1): message size
// limits, and keepalive pings on both sides so a worker that hangs or a
// connection that silently drops is noticed within seconds, not at the next
// TCP timeout. Also the one conversion between absl::Status and grpc::Status.
#ifndef TANDEM_COMMON_RPC_GRPC_OPTIONS_H_
#define TANDEM_COMMON_RPC_GRPC_OPTIONS_H_

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"

namespace tandem::rpc {

struct RpcOptions {
  // A step with a resumed 32k-token request is a few hundred KB; 16 MiB
  // leaves room without hiding a design problem.
  int max_message_bytes = 16 << 20;
  int keepalive_time_ms = 2000;     // ping an idle connection this often
  int keepalive_timeout_ms = 2000;  // and give up if the ping is not answered
};

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, const RpcOptions& options = {});
// The same with these credentials (tls_credentials.h) instead of plaintext.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           std::shared_ptr<grpc::ChannelCredentials> credentials,
                                           const RpcOptions& options = {});
void ConfigureServer(grpc::ServerBuilder* builder, const RpcOptions& options = {});

// Why `path` cannot be a Unix socket gRPC listens on (longer than a
// socket's path may be, its directory missing, or something other than a
// socket there, which a bind would not replace); OK for "". Messages name "the workers' socket"
// (tandem-scheduler --worker-socket, its one use).
absl::Status CheckUnixSocketPath(const std::string& path);
// Removes the socket at `path` if one is there (gRPC replaces an old socket
// when it binds, but leaves it when it stops); anything else stays.
void RemoveUnixSocket(const std::string& path);

absl::Status ToAbsl(const grpc::Status& status);
grpc::Status ToGrpc(const absl::Status& status);

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_RPC_GRPC_OPTIONS_H_
