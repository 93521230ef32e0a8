// TlsFiles: the PEM files of mutual TLS on the scheduler<->worker gRPC port
// (--tls-cert, --tls-key, --tls-ca), what a Kubernetes Secret mounts. The
// scheduler serves with its certificate and requires a client certificate
// that --tls-ca signed; a worker presents its certificate and accepts only a
// scheduler certificate that --tls-ca signed, naming the host it dials (a
// subjectAltName). All three or none: none is plaintext, as before.
// No gRPC here: the flag structs include it; tls_credentials.h turns it into
// gRPC credentials.
//
// Thread-compatible; used from main() only.
#ifndef TANDEM_COMMON_RPC_TLS_FILES_H_
#define TANDEM_COMMON_RPC_TLS_FILES_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/flags.h"

namespace tandem::rpc {

struct TlsFiles {
  std::string cert;  // PEM: this process's certificate (chain)
  std::string key;   // PEM: its private key
  std::string ca;    // PEM: the CA that signs the other side's certificates

  // --tls-cert, --tls-key, --tls-ca; `peer` says whose certificates --tls-ca
  // checks ("workers'", "the scheduler's").
  void Register(FlagParser* flags, const std::string& peer);
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
  // The flags again ("--tls-cert=...", ...), for a launcher's children;
  // empty when not enabled.
  std::vector<std::string> ToArgs() const;
  // InvalidArgument naming the flag: all three or none, each a readable file.
  absl::Status Validate() const;
};

// Files that certificate flags name, all or none: OK when every path is
// empty; otherwise InvalidArgument naming the first flag that is missing
// (`together` lists the flags in the message), then the first with an
// unresolved $(VAR) or a file that cannot be read or is empty.
absl::Status ValidateCertificateFlags(const std::vector<std::pair<const char*, const std::string*>>& files,
                                      const char* together);

}  // namespace tandem::rpc

#endif  // TANDEM_COMMON_RPC_TLS_FILES_H_
