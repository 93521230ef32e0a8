// TlsContext: the OpenSSL settings of the worker-to-worker channel with TLS
// on, made once from the worker's --tls-cert/--tls-key/--tls-ca (the files
// that also secure its gRPC stream) and shared by every connection.
//
// What a connection gets: TLS 1.3 only, both ends present their certificate
// and each must be signed by --tls-ca (a peer without one, or with one from
// another CA, fails the handshake). Group membership is the CA: no host name
// is checked, since pod IPs come and go and the certificates cannot name them;
// the handshake's hello (rank, world size, group epoch) then checks the peer
// belongs to this group. A certificate with an extendedKeyUsage needs both
// serverAuth and clientAuth, since each worker accepts and dials.
//
// No session tickets and no resumption: connections are few and long-lived,
// and a ticket is a post-handshake message a blocked reader would have to
// process.
//
// Thread-safe after Load (OpenSSL contexts are shared read-only).
#ifndef TANDEM_WORKER_COMM_TLS_CONTEXT_H_
#define TANDEM_WORKER_COMM_TLS_CONTEXT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX; OpenSSL stays out of this header

namespace tandem::worker {

class TlsContext {
 public:
  // InvalidArgument naming the flag and OpenSSL's reason when a file is
  // unreadable, not PEM, or the key does not match the certificate.
  static absl::StatusOr<std::shared_ptr<const TlsContext>> Load(const std::string& cert_file,
                                                                const std::string& key_file,
                                                                const std::string& ca_file);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  ssl_ctx_st* ctx() const { return ctx_; }

 private:
  explicit TlsContext(ssl_ctx_st* ctx) : ctx_(ctx) {}
  ssl_ctx_st* const ctx_;
};

// OpenSSL's queued errors of this thread, drained, as one line.
std::string DrainTlsErrors();

}  // namespace tandem::worker

#endif  // TANDEM_WORKER_COMM_TLS_CONTEXT_H_
