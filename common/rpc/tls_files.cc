#include "common/rpc/tls_files.h"

#include <fstream>

#include "absl/strings/str_cat.h"

namespace tandem::rpc {

void TlsFiles::Register(FlagParser* flags, const std::string& peer) {
  flags->AddString("tls-cert", &cert,
                   "PEM certificate this process presents for mutual TLS on the scheduler's gRPC port (workers: "
                   "also to each other; with --tls-key and --tls-ca, or none of them: plaintext)");
  flags->AddString("tls-key", &key, "PEM private key of --tls-cert");
  flags->AddString("tls-ca", &ca, absl::StrCat("PEM CA certificate(s) that must sign the ", peer, " certificates"));
}

std::vector<std::string> TlsFiles::ToArgs() const {
  if (!enabled()) return {};
  return {absl::StrCat("--tls-cert=", cert), absl::StrCat("--tls-key=", key), absl::StrCat("--tls-ca=", ca)};
}

absl::Status TlsFiles::Validate() const {
  return ValidateCertificateFlags({{"tls-cert", &cert}, {"tls-key", &key}, {"tls-ca", &ca}},
                                  "--tls-cert, --tls-key and --tls-ca go together");
}

absl::Status ValidateCertificateFlags(const std::vector<std::pair<const char*, const std::string*>>& files,
                                      const char* together) {
  bool any = false;
  for (const auto& file : files) any = any || !file.second->empty();
  if (!any) return absl::OkStatus();
  // Which one is missing first: that is the mistake, not an unreadable other.
  for (const auto& [name, path] : files) {
    if (path->empty()) return absl::InvalidArgumentError(absl::StrCat("flag --", name, " is missing: ", together));
  }
  for (const auto& [name, path] : files) {
    if (path->find("$(") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("flag --", name, " has an unresolved variable: '", *path, "'"));
    }
    std::ifstream in(*path);
    if (!in || in.peek() == std::ifstream::traits_type::eof()) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", name, ": cannot read '", *path, "' (missing, unreadable or empty)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::rpc
