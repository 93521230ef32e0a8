#include "common/rpc/grpc_options.h"

#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <optional>

#include "absl/strings/str_cat.h"

namespace tandem::rpc {

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, const RpcOptions& options) {
  return MakeChannel(target, grpc::InsecureChannelCredentials(), options);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           std::shared_ptr<grpc::ChannelCredentials> credentials,
                                           const RpcOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return grpc::CreateCustomChannel(target, std::move(credentials), args);
}

void ConfigureServer(grpc::ServerBuilder* builder, const RpcOptions& options) {
  builder->SetMaxReceiveMessageSize(options.max_message_bytes);
  builder->SetMaxSendMessageSize(options.max_message_bytes);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Workers ping as often as we ask them to: do not treat it as abuse.
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, options.keepalive_time_ms / 2);
}

namespace {

// Whether a socket is at `path`; nullopt when nothing is.
std::optional<bool> SocketAt(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return std::nullopt;
  return S_ISSOCK(st.st_mode);
}

}  // namespace

void RemoveUnixSocket(const std::string& path) {
  if (!path.empty() && SocketAt(path).value_or(false)) unlink(path.c_str());
}

absl::Status CheckUnixSocketPath(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  // sockaddr_un's sun_path, with its terminating NUL.
  constexpr size_t kMaxPath = sizeof(sockaddr_un{}.sun_path) - 1;
  if (path.size() > kMaxPath) {
    return absl::InvalidArgumentError(absl::StrCat("the workers' socket path is ", path.size(),
                                                   " bytes; a Unix socket's is at most ", kMaxPath, ": ", path));
  }
  const std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/') + 1);
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("no directory ", dir, " for the workers' socket ", path));
  }
  if (!SocketAt(path).value_or(true)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " exists and is not a socket: not replacing it"));
  }
  return absl::OkStatus();
}

absl::Status ToAbsl(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace tandem::rpc
