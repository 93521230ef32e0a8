#include "worker/comm/tls_context.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "absl/strings/str_cat.h"

namespace tandem::worker {

std::string DrainTlsErrors() {
  std::string text;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&text, text.empty() ? "" : "; ", buf);
  }
  return text.empty() ? "no OpenSSL reason" : text;
}

absl::StatusOr<std::shared_ptr<const TlsContext>> TlsContext::Load(const std::string& cert_file,
                                                                   const std::string& key_file,
                                                                   const std::string& ca_file) {
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  if (ctx == nullptr) return absl::InternalError(absl::StrCat("TLS: ", DrainTlsErrors()));
  auto fail = [ctx](const char* flag, const std::string& path) {
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(absl::StrCat("flag --", flag, ": '", path,
                                                   "' unusable for the worker channel's TLS: ",
                                                   DrainTlsErrors()));
  };
  if (SSL_CTX_use_certificate_chain_file(ctx, cert_file.c_str()) != 1) return fail("tls-cert", cert_file);
  if (SSL_CTX_use_PrivateKey_file(ctx, key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    return fail("tls-key", key_file);
  }
  if (SSL_CTX_load_verify_locations(ctx, ca_file.c_str(), nullptr) != 1) return fail("tls-ca", ca_file);
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  // A peer that closes without close_notify is a closed connection, as in
  // plaintext, not a protocol error.
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_TICKET);
  // Writes resume after a partial write from the same (unmoved) frame.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  return std::shared_ptr<const TlsContext>(new TlsContext(ctx));
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

}  // namespace tandem::worker
