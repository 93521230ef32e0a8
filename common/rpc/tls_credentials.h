// gRPC credentials from TlsFiles: plaintext when TLS is off, else mutual
// TLS (the server requires and verifies a client certificate against the
// CA). Reads the PEM files once, at start; a renewed Secret takes effect
// when the process restarts.
#ifndef TANDEM_COMMON_RPC_TLS_CREDENTIALS_H_
#define TANDEM_COMMON_RPC_TLS_CREDENTIALS_H_

#include <memory>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"
#include "common/rpc/tls_files.h"

namespace tandem::rpc {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsFiles& tls);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const TlsFiles& tls);

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_RPC_TLS_CREDENTIALS_H_
