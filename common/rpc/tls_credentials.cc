#include "common/rpc/tls_credentials.h"

#include <fstream>
#include <sstream>
#include <tuple>
#include <string>

#include "absl/strings/str_cat.h"

namespace tandem::rpc {
namespace {

absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in || text.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("flag --", flag, ": '", path, "' is not a readable PEM file"));
  }
  return text.str();
}

struct Pems {
  std::string cert, key, ca;
};

absl::StatusOr<Pems> ReadAll(const TlsFiles& tls) {
  if (absl::Status s = tls.Validate(); !s.ok()) return s;
  Pems pems;
  for (auto [flag, path, out] : {std::make_tuple("tls-cert", &tls.cert, &pems.cert),
                                 std::make_tuple("tls-key", &tls.key, &pems.key),
                                 std::make_tuple("tls-ca", &tls.ca, &pems.ca)}) {
    absl::StatusOr<std::string> pem = ReadPem(flag, *path);
    if (!pem.ok()) return pem.status();
    *out = *std::move(pem);
  }
  return pems;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  absl::StatusOr<Pems> pems = ReadAll(tls);
  if (!pems.ok()) return pems.status();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = pems->ca;
  options.pem_key_cert_pairs.push_back({pems->key, pems->cert});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  absl::StatusOr<Pems> pems = ReadAll(tls);
  if (!pems.ok()) return pems.status();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = pems->ca;
  options.pem_private_key = pems->key;
  options.pem_cert_chain = pems->cert;
  return grpc::SslCredentials(options);
}

}  // namespace tandem::rpc
